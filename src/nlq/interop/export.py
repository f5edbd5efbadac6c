"""`nlq export RUN_DIR|CKPT --to hf OUT_DIR`: a directory that transformers' Auto classes load.

- A linear-query decoder with GPT-2's architecture becomes a plain GPT2LMHeadModel (no custom code).
- Every other model (nonlinear or other projections, encoders, QK-norm, RoPE, GQA) becomes a custom model:
  config.json with an auto_map, modeling_nlq.py and nlq's own model code beside it (loaded with
  trust_remote_code=True), so it computes exactly what nlq computes. Encoders load as AutoModelForMaskedLM.
- A projection of your own (NLQ_IMPORT) is shipped too: its module, imports made relative, as nlq_plugin.py,
  imported by modeling_nlq.py so that it registers itself (its file's sha256 in config.json, nlq_plugin). It may
  import torch, nlq's shipped modules and the standard library only: what else it needs, the loading side may lack.
- Weights in safetensors; the run's tokenizer as tokenizer.json (+ tokenizer_config.json), so the directory
  works with AutoTokenizer and lm-evaluation-harness's HF backend.
Written into a temporary directory beside OUT_DIR and renamed into place when complete. OUT_DIR is marked
(nlq_export.json), and --overwrite replaces only an earlier export, never a run, a dataset or another folder.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import sys
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import atomic_directory, is_empty_dir, overlaps, remove_stale, stale_siblings, write_json
from nlq.interop.load import gpt2_state
from nlq.lock import directory_lock
from nlq.projections import BUILT_IN, own_sources
from nlq.runs.checkpoint import resolve_checkpoint
from nlq.runs.rundir import load_model, run_dir_of, tokenizer_folder

SHIPPED_SOURCES = {"nlq_errors.py": "errors.py", "nlq_fields.py": "fields.py", "nlq_config.py": "config.py",
                   "nlq_projections.py": "projections.py", "nlq_components.py": "components.py",
                   "nlq_model.py": "model.py"}
EXPORT_MARK = "nlq_export.json"  # what makes a directory an nlq export, which --overwrite may replace
EOT = "<|endoftext|>"
MASK = "<|mask|>"


def is_plain_gpt2(cfg) -> bool:
    """Whether GPT2LMHeadModel computes exactly this model."""
    return (cfg.causal and cfg.position == "learned" and not cfg.qk_norm and cfg.kv_heads == cfg.n_head
            and set(cfg.placements.values()) == {"linear"} and cfg.attn_gate == "none"
            and cfg.attention == "softmax" and not cfg.attn_out_norm
            and (cfg.attn_scale is None or math.isclose(cfg.attn_scale, cfg.head_size ** -0.5)))


def export_hf(source: str | Path, out_dir: str | Path, overwrite: bool = False) -> str:
    """Export a run (its latest checkpoint) or a checkpoint file; returns a one-line description."""
    out = Path(out_dir)
    check_export_target(out, source, overwrite)
    lock = directory_lock(out, f"export directory {out}")
    with lock:
        try:
            remove_stale(out.parent, stale_siblings(out))  # a killed export's temporary directory
            model, config, payload = load_model(source)  # refuses a plugin file changed since the run
            if config.model.classes:
                raise UserError(f"{source} is an encoder classifier (model.classes={config.model.classes}); an export "
                                f"ships language models (causal or masked) only")
            plugin = shipped_plugin(config.model)
            with atomic_directory(out) as tmp:
                kind = write_export(model, config, plugin, tmp)
                tokenizer_note = write_tokenizer(Path(payload["path"]), tmp, masked=not config.model.causal)
                write_json(tmp / EXPORT_MARK, {"source": str(Path(payload["path"]).resolve()),
                                               "step": payload["step"]})
        except BaseException:
            if not out.exists():  # nothing was exported: leave nothing behind, the lock file included
                lock.path.unlink(missing_ok=True)
            raise
    return f"exported step {payload['step']} of {payload['path']} to {out} as {kind}; {tokenizer_note}"


def write_export(model, config, plugin: dict | None, out: Path) -> str:
    """The model's weights, config and code into `out`; a file system that refuses the write (a full disk) is one
    line (safetensors raises its own error for it, not an OSError)."""
    from safetensors import SafetensorError

    try:
        if is_plain_gpt2(config.model):
            return _write_gpt2(model, config.model, out)
        return _write_custom(model, config.model, out, plugin)
    except SafetensorError as e:
        full = "StorageFull" in str(e) or "No space" in str(e)
        reason = "no space left on device" if full else str(e).splitlines()[0][:200]
        raise UserError(f"could not write the export's weights ({reason}); free space or choose another directory, "
                        f"then run nlq export again") from None


def check_export_target(out: Path, source: str | Path, overwrite: bool) -> None:
    """OUT must not be, contain or lie inside the run it exports; an existing, non-empty OUT is replaced only with
    --overwrite and only when it is an earlier export."""
    source = Path(source)
    run = run_dir_of(resolve_checkpoint(source)) if source.exists() else source
    for what, path in (("the run", run), ("the checkpoint", source)):
        if path.exists() and overlaps(out, path if path.is_dir() else path.parent):
            raise UserError(f"{out} is, contains or lies inside {what} being exported ({path}); choose an output "
                            f"directory outside it")
    if not out.exists() or is_empty_dir(out):
        return
    if not (out / EXPORT_MARK).is_file():
        raise UserError(f"{out} exists and is not an nlq export (no {EXPORT_MARK}); nlq replaces only its own exports, "
                        f"even with --overwrite: choose a new or empty directory")
    if not overwrite:
        raise UserError(f"{out} holds an earlier export; pass --overwrite to replace it or choose another directory")


def _write_gpt2(model, cfg, out: Path) -> str:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                           n_layer=cfg.n_layer,
                           n_head=cfg.n_head, n_inner=cfg.mlp_hidden, layer_norm_epsilon=cfg.norm_eps,
                           activation_function="gelu_new" if cfg.mlp_activation == "gelu_tanh" else "gelu",
                           resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                           tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None, eos_token_id=None)
    hf_model = GPT2LMHeadModel(hf_config)
    missing, unexpected = hf_model.load_state_dict(gpt2_state(model.state_dict(), cfg), strict=False)
    if unexpected or any(not k.endswith("attn.bias") and not k.endswith("masked_bias") for k in missing):
        raise RuntimeError(f"GPT-2 conversion mismatch: missing {missing}, unexpected {unexpected}")
    transformers.utils.logging.disable_progress_bar()  # a one-file model needs no "Writing model shards" bar
    hf_model.save_pretrained(out, safe_serialization=True)
    return "GPT2LMHeadModel (plain transformers, no custom code)"


SHIPPABLE = {"torch", "nlq", "__future__"}  # what a shipped projection of one's own may import, beside the stdlib
PLUGIN_FILE = "nlq_plugin.py"


def shipped_plugin(cfg) -> dict | None:
    """The module of the projections of one's own this model uses ({"file", "sha256", "projections"}), checked to be
    one module that imports torch, nlq's shipped modules and the standard library only; None for nlq's own."""
    own = own_sources(set(cfg.placements.values()) - BUILT_IN)
    if not own:
        return None
    files = sorted({source["file"] for source in own.values()})
    if len(files) != 1 or not files[0] or not Path(files[0]).is_file():
        raise UserError(f"model.query or model.projections uses {', '.join(own)} from {', '.join(map(str, files))}; "
                        f"an export ships one module of your own, a .py file: put them in one")
    path = Path(files[0])
    shipped = {Path(name).stem for name in SHIPPED_SOURCES.values()}
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        if isinstance(node, ast.Import) and any(n.split(".")[0] == "nlq" for n in names):
            raise UserError(f"{path} imports nlq as `import {names[0]}`; an export rewrites `from nlq.MODULE import "
                            f"NAME` to the shipped copy: write the import that way")
        for name in names:
            top, *rest = name.split(".")
            nlq_ok = top != "nlq" or (rest and rest[0] in shipped)
            if not nlq_ok or top not in SHIPPABLE | set(sys.stdlib_module_names):
                raise UserError(f"{path} imports {name}: an export ships it beside nlq's model code, and a module it "
                                f"imports beyond torch, nlq.{{{', '.join(sorted(shipped))}}} and the standard library "
                                f"may be missing where the export is loaded; keep the projection to those")
    return {"file": PLUGIN_FILE, "source": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "projections": sorted(own)}


def _relative(source: str) -> str:
    """nlq imports made relative to the export directory, where nlq's modules are shipped as nlq_*.py."""
    return re.sub(r"from nlq\.(\w+) import", r"from .nlq_\1 import", source)


def _write_custom(model, cfg, out: Path, plugin: dict | None = None) -> str:
    import transformers
    from safetensors.torch import save_file

    remote = resources.files("nlq.interop") / "remote"
    configuration = (remote / "configuration_nlq.py").read_text()
    if plugin:  # transformers maps one config class to one model class per process: theirs must differ from nlq's own
        configuration += f"\n# this export ships a projection of its own: nlq_plugin.py, sha256 {plugin['sha256']}\n"
    (out / "configuration_nlq.py").write_text(configuration)
    modeling = (remote / "modeling_nlq.py").read_text()
    if plugin:  # imported by modeling_nlq itself, so that transformers copies it and it registers its projections
        modeling = modeling.replace("from .nlq_projections import build_projection  # noqa: F401\n",
                                    "from .nlq_projections import build_projection  # noqa: F401\n"
                                    "from .nlq_plugin import __doc__ as _plugin_doc  # noqa: F401 (registers)\n")
        (out / PLUGIN_FILE).write_text(_relative(Path(plugin["source"]).read_text()))
    (out / "modeling_nlq.py").write_text(modeling)
    package = resources.files("nlq")
    for shipped, original in SHIPPED_SOURCES.items():  # nlq's own model code, imports made relative
        (out / shipped).write_text(_relative((package / original).read_text()))
    architecture = "NlqForCausalLM" if cfg.causal else "NlqForMaskedLM"
    auto = "AutoModelForCausalLM" if cfg.causal else "AutoModelForMaskedLM"
    hf_config = {"architectures": [architecture], "model_type": "nlq", "nlq_model": asdict(cfg),
                 "auto_map": {"AutoConfig": "configuration_nlq.NlqConfig", auto: f"modeling_nlq.{architecture}"},
                 "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32", "dtype": "float32",
                 "transformers_version": transformers.__version__}
    if plugin:
        hf_config["nlq_plugin"] = {k: plugin[k] for k in ("file", "sha256", "projections")} | {"from": plugin["source"]}
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    state = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        del state["model.lm_head.weight"]  # the same tensor as the token embedding; tied again on load
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return f"{architecture} (custom code, load with trust_remote_code=True)"


# ---- the tokenizer -----------------------------------------------------------------------------------------

def write_tokenizer(checkpoint: Path, out: Path, masked: bool = False) -> str:
    """The run's tokenizer as a transformers fast tokenizer (tokenizer.json + tokenizer_config.json): from the run
    directory, or from the files a checkpoint carries when it was copied out of its run."""
    from transformers import PreTrainedTokenizerFast

    found = tokenizer_folder(checkpoint)
    if found is None:
        return f"no tokenizer written ({checkpoint} has no data_meta.json beside it and carries no tokenizer)"
    folder, name = found
    backend = _backend_tokenizer(folder, name)
    if backend is None:
        return f"no tokenizer written (tokenizer {name}: GPT-2's vocab.bpe and encoder.json are not in {folder})"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOT, bos_token=EOT, pad_token=EOT,
                                        model_max_length=10**9)
    if masked:
        tokenizer.add_special_tokens({"mask_token": MASK})  # id = the data's vocabulary size, nlq's mask id
    tokenizer.save_pretrained(out)
    return f"tokenizer {name} written as tokenizer.json"


def _backend_tokenizer(run_dir: Path, name: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    kind = name.partition(":")[0]
    if kind == "bpe":
        return Tokenizer.from_file(str(run_dir / "tokenizer.json"))
    if kind == "byte":  # ids 0-255 are the bytes themselves, 256 end-of-text: a BPE with no merges
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        byte_to_char = _byte_level_chars()
        vocab = {byte_to_char[b]: b for b in range(256)}
        assert set(vocab) == set(alphabet)
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([EOT])
        return tokenizer
    if kind == "gpt2":
        if not all((run_dir / f).is_file() for f in ("vocab.bpe", "encoder.json")):
            return None
        merges = [tuple(line.split()) for line in (run_dir / "vocab.bpe").read_text().splitlines()[1:] if line.strip()]
        tokenizer = Tokenizer(models.BPE(vocab=json.loads((run_dir / "encoder.json").read_text()), merges=merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([EOT])
        return tokenizer
    raise UserError(f"unknown tokenizer {name!r} in {run_dir}")


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer applies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars



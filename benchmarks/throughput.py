"""Step time and tokens/s of model variants on the same shape and batch, alternating in one process.

    python benchmarks/throughput.py [--preset small] [--variants linear,nonlinear,linear:unfused]
                                    [--nanogpt PATH/TO/nanoGPT/model.py] [--rounds 15] [--steps 2]
                                    [--batch-size 8] [--vocab-size 8192] [--dtype float32|bfloat16] [--compile]

A variant is a query projection name, optionally with options after colons: `unfused` computes q and
k/v with separate matmuls (nlq 0.1), `mlp4.75` sets model.mlp_ratio=4.75. `--nanogpt PATH` adds
karpathy/nanoGPT's GPT (loaded from that file, never copied into this repository) at the same shape
(no biases, dropout 0, tied embeddings) with its own optimizer setup (`configure_optimizers`: on CPU, the
default non-fused AdamW).

Each round runs `--steps` full training steps (forward, backward, clip 1.0, AdamW) of every variant in
turn, so machine noise hits all variants alike. Reported: the median step time over rounds, and the
median over rounds of each variant's step-time ratio to the first variant (paired within a round; the
steadier of the two numbers on a noisy machine). Random tokens: a step's cost does not depend on the data.
"""

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

from nlq.model import Attention, Transformer
from nlq.presets import get_preset, with_model
from nlq.training.trainer import make_optimizer, tune_allocator


def make_step(model, optimizer, x, y, dtype):
    def step():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def nlq_variant(spec: str, base, changes: dict):
    query, *options = spec.split(":")
    model_changes = dict(changes, query=query)
    for option in options:
        if option.startswith("mlp"):
            model_changes["mlp_ratio"] = float(option[3:])
        elif option != "unfused":
            raise SystemExit(f"unknown variant option {option!r} in {spec!r}; options: unfused, mlpR")
    cfg = with_model(base, **model_changes).model
    model = Transformer(cfg, seed=0)
    for module in model.modules():
        if isinstance(module, Attention):
            module.fused_input = "unfused" not in options
    optimizer = make_optimizer(model, base.train, torch.device("cpu"), sharded=False)
    return cfg, model, optimizer, f"{model.num_parameters():,} non-embedding parameters, {model.flops_per_token():,} FLOPs/token"


def nanogpt_variant(path: str, cfg, train):
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gpt_config = module.GPTConfig(block_size=cfg.block_size, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer,
                                  n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=0.0, bias=False)
    model = module.GPT(gpt_config)
    optimizer = model.configure_optimizers(train.weight_decay, train.lr, (train.beta1, train.beta2), "cpu")
    return model, optimizer, f"{model.get_num_params():,} parameters (nanoGPT's count), its own AdamW setup"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--variants", default="linear,nonlinear")
    parser.add_argument("--nanogpt", help="path to karpathy/nanoGPT's model.py: adds a 'nanogpt' variant")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--no-allocator-tuning", action="store_true", help="leave glibc malloc at its defaults")
    args = parser.parse_args()

    if not args.no_allocator_tuning:
        tune_allocator()
    base = get_preset(args.preset)
    changes = {k: v for k, v in (("block_size", args.block_size), ("vocab_size", args.vocab_size)) if v}
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    specs = args.variants.split(",") + (["nanogpt"] if args.nanogpt else [])
    steps, cfg = {}, with_model(base, **changes).model
    for spec in specs:
        torch.manual_seed(0)
        if spec == "nanogpt":
            model, optimizer, about = nanogpt_variant(args.nanogpt, cfg, base.train)
        else:
            cfg, model, optimizer, about = nlq_variant(spec, base, changes)
        x = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.block_size))
        step = make_step(torch.compile(model) if args.compile else model, optimizer, x, x, dtype)
        step()  # warm up (and compile)
        steps[spec] = step
        print(f"{spec:>16}: {about}")
    tokens = args.batch_size * cfg.block_size
    print(f"preset {args.preset} {changes or ''}, batch {args.batch_size} x {cfg.block_size}, {args.dtype}"
          f"{' compiled' if args.compile else ''}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds x {args.steps} steps, allocator {'default' if args.no_allocator_tuning else 'tuned'}")
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - start) / args.steps)
    first = specs[0]
    for name, values in times.items():
        median = statistics.median(values)
        paired = statistics.median(v / f for v, f in zip(values, times[first]))
        print(f"{name:>16}: {median * 1000:8.1f} ms/step  {tokens / median:9,.0f} tokens/s  "
              f"step time x{paired:.3f} vs {first} (median of per-round ratios)")


if __name__ == "__main__":
    main()

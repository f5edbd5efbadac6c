"""Step time and tokens/s of query variants on the same preset and batch, alternating in one process.

    python benchmarks/throughput.py [--preset small] [--variants linear,nonlinear] [--rounds 7] [--steps 5]
                                    [--batch-size 8] [--vocab-size 8192] [--dtype float32|bfloat16] [--compile]

Each round times `--steps` full training steps (forward, backward, clip 1.0, fused AdamW) of every variant in
turn, so machine noise hits all variants alike; the report is the median over rounds and the ratio to the
first variant. Random tokens: the cost of a step does not depend on the data.
"""

import argparse
import statistics
import time

import torch

from nlq.presets import get_preset, with_model
from nlq.model import Transformer
from nlq.training.trainer import make_optimizer


def make_step(model, optimizer, x, y, dtype):
    def step():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--variants", default="linear,nonlinear")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    base = get_preset(args.preset)
    changes = {k: v for k, v in (("block_size", args.block_size), ("vocab_size", args.vocab_size)) if v}
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    steps, tokens = {}, None
    for name in args.variants.split(","):
        torch.manual_seed(0)
        cfg = with_model(base, query=name, **changes).model
        model = Transformer(cfg)
        optimizer = make_optimizer(model, base.train, torch.device("cpu"), sharded=False)
        x = torch.randint(0, cfg.vocab_size, (args.batch_size, cfg.block_size))
        step = make_step(torch.compile(model) if args.compile else model, optimizer, x, x, dtype)
        step()  # warm up (and compile)
        steps[name] = step
        tokens = args.batch_size * cfg.block_size
        print(f"{name:>10}: {model.num_parameters():,} non-embedding parameters, {model.flops_per_token():,} FLOPs/token")
    print(f"preset {args.preset} {changes or ''}, batch {args.batch_size} x {cfg.block_size}, {args.dtype}"
          f"{' compiled' if args.compile else ''}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds x {args.steps} steps")
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - start) / args.steps)
    first = next(iter(times))
    reference = statistics.median(times[first])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>10}: {median * 1000:8.1f} ms/step  {tokens / median:9,.0f} tokens/s  "
              f"step time x{median / reference:.3f} vs {first}")


if __name__ == "__main__":
    main()

"""Tokens/s of `nlq sample` (nlq.generate) with and without the KV cache, alternating in one process.

    python benchmarks/sampling.py [--preset small] [--query nonlinear] [--prompt 64] [--new 128] [--rounds 5]
                                  [--threads 1] [--json FILE]

Random weights and a random prompt (the cost of a step does not depend on them), batch 1, greedy. Each round
generates --new tokens after a --prompt token prompt both ways; reported: the median time per new token over
rounds and the median of the per-round ratio (uncached / cached). Both ways must draw the same tokens.
"""

import argparse
import json
import statistics
import time

import torch

from nlq.generate import generate
from nlq.model import Transformer
from nlq.presets import get_preset, with_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--query", default="nonlinear")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = with_model(get_preset(args.preset), query=args.query).model
    if args.prompt + args.new > cfg.block_size:
        parser.error(f"--prompt + --new = {args.prompt + args.new} must fit model.block_size={cfg.block_size}")
    model = Transformer(cfg, seed=0).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    times = {True: [], False: []}
    for _ in range(args.rounds):
        out = {}
        for use_cache in (True, False):
            start = time.perf_counter()
            out[use_cache] = generate(model, prompt, args.new, temperature=0, use_cache=use_cache)
            times[use_cache].append((time.perf_counter() - start) / args.new)
        assert torch.equal(out[True], out[False]), "the cached and uncached paths drew different tokens"
    ratios = [u / c for u, c in zip(times[False], times[True])]
    result = {"preset": args.preset, "query": args.query, "n_layer": cfg.n_layer, "n_embd": cfg.n_embd,
              "prompt": args.prompt, "new": args.new, "threads": args.threads, "torch": torch.__version__,
              "ms_per_token_cached": 1e3 * statistics.median(times[True]),
              "ms_per_token_uncached": 1e3 * statistics.median(times[False]),
              "speedup": statistics.median(ratios), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    print(f"{args.preset} ({cfg.n_layer} x {cfg.n_embd}, {args.query}), prompt {args.prompt} + {args.new} new, "
          f"{args.threads} thread(s): cached {result['ms_per_token_cached']:.2f} ms/token, uncached "
          f"{result['ms_per_token_uncached']:.2f}: x{result['speedup']:.2f} (median of {args.rounds} paired rounds)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

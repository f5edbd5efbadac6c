"""Tokens/s of `nlq sample` (nlq.generate) with and without the KV cache, alternating in one process.

    python benchmarks/sampling.py [--preset small] [--query nonlinear] [--prompt 64] [--new 128] [--rounds 5]
                                  [--threads 1] [--hf] [--json FILE]

Random weights and a random prompt (the cost of a step does not depend on them), batch 1, greedy. Each round
generates --new tokens after a --prompt token prompt both ways; reported: the median time per new token over
rounds and the median of the per-round ratio (uncached / cached). Both ways must draw the same tokens.
--hf times the same model exported for Hugging Face transformers (nlq's custom-code export, loaded with
trust_remote_code) through transformers' own `generate(use_cache=True / False)` instead.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

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
    parser.add_argument("--hf", action="store_true", help="through the Hugging Face export and transformers' generate")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = with_model(get_preset(args.preset), query=args.query).model
    if args.prompt + args.new > cfg.block_size:
        parser.error(f"--prompt + --new = {args.prompt + args.new} must fit model.block_size={cfg.block_size}")
    model = Transformer(cfg, seed=0).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    draw = lambda use_cache: generate(model, prompt, args.new, temperature=0, use_cache=use_cache)  # noqa: E731
    if args.hf:
        draw = hf_generate(model, cfg, prompt, args.new)
    times = {True: [], False: []}
    for _ in range(args.rounds):
        out = {}
        for use_cache in (True, False):
            start = time.perf_counter()
            out[use_cache] = draw(use_cache)
            times[use_cache].append((time.perf_counter() - start) / args.new)
        assert torch.equal(out[True], out[False]), "the cached and uncached paths drew different tokens"
    ratios = [u / c for u, c in zip(times[False], times[True])]
    result = {"path": "transformers generate" if args.hf else "nlq", "preset": args.preset, "query": args.query,
              "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "prompt": args.prompt, "new": args.new,
              "threads": args.threads, "torch": torch.__version__,
              "ms_per_token_cached": 1e3 * statistics.median(times[True]),
              "ms_per_token_uncached": 1e3 * statistics.median(times[False]),
              "speedup": statistics.median(ratios), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    if args.hf:
        import transformers

        result["transformers"] = transformers.__version__
    print(f"{result['path']}: {args.preset} ({cfg.n_layer} x {cfg.n_embd}, {args.query}), "
          f"prompt {args.prompt} + {args.new} new, "
          f"{args.threads} thread(s): cached {result['ms_per_token_cached']:.2f} ms/token, uncached "
          f"{result['ms_per_token_uncached']:.2f}: x{result['speedup']:.2f} (median of {args.rounds} paired rounds)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def hf_generate(model, cfg, prompt, new):
    """model written as nlq's custom-code Hugging Face export and loaded back; a function of use_cache that
    generates with transformers' own generate."""
    import transformers

    from nlq.interop.export import _write_custom

    out = tempfile.mkdtemp(prefix="nlq-hf-bench-")
    _write_custom(model, cfg, Path(out))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()

    def draw(use_cache):
        with torch.no_grad():
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, use_cache=use_cache, pad_token_id=0)
    return draw


if __name__ == "__main__":
    main()

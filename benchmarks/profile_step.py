"""Where a training step's time goes: torch.profiler's op table for nlq and, optionally, nanoGPT at one shape.

    python benchmarks/profile_step.py [--preset small] [--query linear] [--nanogpt PATH/TO/nanoGPT/model.py]
                                      [--steps 2] [--rows 12]

Each model runs one warm-up step, then `--steps` profiled full steps (forward, backward, clip, optimizer);
the table sorts ops by their own CPU time. Set OMP_NUM_THREADS to profile with fewer threads.
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--query", default="linear")
    parser.add_argument("--nanogpt", help="path to karpathy/nanoGPT's model.py (kept outside this repository)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py, beside this file
    from nlq.presets import get_preset
    from throughput import make_step, nanogpt_variant, nlq_variant

    base = get_preset(args.preset)
    cfg, model, optimizer, _ = nlq_variant(args.query, base, {}, torch.device("cpu"))
    models = {f"nlq {args.query}": (model, optimizer)}
    if args.nanogpt:
        ng_model, ng_optimizer, _ = nanogpt_variant(args.nanogpt, cfg, base.train, torch.device("cpu"))
        models["nanogpt"] = (ng_model, ng_optimizer)
    x = torch.randint(0, cfg.vocab_size, (base.train.batch_size, cfg.block_size))
    for name, (m, opt) in models.items():
        step = make_step(m, opt, x, x, None)
        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        print(f"===== {name}: {args.steps} steps, {torch.get_num_threads()} threads")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=40))


if __name__ == "__main__":
    main()

"""What the induction diagnostics cost a run: training steps and measurements side by side in one process.

    OMP_NUM_THREADS=1 python benchmarks/diagnostics.py [--rounds 40] [--every 100] [--json FILE]

At the decision shape (d 64, 2 layers, 4 heads, vocabulary 2048, context 128, batch 16; AdamW, clip 1.0, the chunked
loss as the studies train; the linear and the nonlinear query, and differential attention), each round times
`--every` training steps in a row and then one measurement of the diagnostics (training/diagnostics.py: a forward
of its 8 x 128 synthetic batch with the explicit softmax kept, then the scores), alternating the variants. Reported
per variant: the median step and measurement times, and the cost as a share of a run's time, the median over
rounds of measurement / (every x step) (the studies' default cadence: every 100 steps). Every number depends on the
CPU and its load: name the machine beside it.
"""

import argparse
import json
import statistics
import time

import torch

from nlq.config import ModelConfig, TrainConfig
from nlq.model import Transformer
from nlq.provenance import utc_now
from nlq.training.diagnostics import InductionProbe
from nlq.training.hardware import tune_allocator
from nlq.training.trainer import make_optimizer

SHAPE = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=2048, block_size=128)
BATCH = 16
VARIANTS = {"linear": {}, "nonlinear": {"query": "nonlinear"}, "differential": {"attention": "differential"}}


def variant(changes: dict, every: int):
    model = Transformer(ModelConfig(**SHAPE, **changes), seed=0)
    optimizer = make_optimizer(model, TrainConfig(lr=2e-3), torch.device("cpu"), sharded=False)
    probe = InductionProbe(SHAPE["vocab_size"], SHAPE["block_size"], every, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"]), generator=generator) for _ in "xy")

    def steps(n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            _, loss = model(x, y, loss_impl="chunked")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - started) / n

    def measure() -> float:
        started = time.perf_counter()
        probe.measure(model, 0)
        return time.perf_counter() - started

    return steps, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--every", type=int, default=100, help="training steps per measurement (the cadence)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    tune_allocator()
    variants = {name: variant(changes, args.every) for name, changes in VARIANTS.items()}
    for steps, measure in variants.values():  # warm up
        steps(5), measure()
    times = {name: {"step": [], "measure": [], "share": []} for name in variants}
    for _ in range(args.rounds):
        for name, (steps, measure) in variants.items():
            step = steps(args.every)
            took = measure()
            times[name]["step"].append(step)
            times[name]["measure"].append(took)
            times[name]["share"].append(took / (args.every * step))
    out = {"date": utc_now(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "rounds": args.rounds, "every": args.every, "variants": {}}
    for name, t in times.items():
        row = {"step_ms": 1e3 * statistics.median(t["step"]), "measure_ms": 1e3 * statistics.median(t["measure"]),
               "share": statistics.median(t["share"]), "share_max": max(t["share"])}
        out["variants"][name] = row
        print(f"{name:>12}: step {row['step_ms']:.1f} ms, diagnostics {row['measure_ms']:.1f} ms, every "
              f"{args.every} steps: {100 * row['share']:.2f}% of a run's time "
              f"(largest round {100 * row['share_max']:.2f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

"""Threads beside other work: what a training process gets from 1 or 2 threads, from the OpenMP wait policy and from
nlq's default (train.threads=0: chosen by the step's size and the machine's load), on an idle machine and beside a
process that keeps one core busy.

    python benchmarks/threads_load.py [--shapes tiny,2x64,2x128] [--steps 30] [--json FILE]

Shapes: `tiny` is the nano model on a small task's batch (2 layers, d 64, vocabulary 128, batch 32 x 16: the
MQAR smoke run of a new user); `LxD` is L layers of width D, 4 heads, vocabulary 2048, batch 16 x 128 (the scaling
study's models). Every cell is a fresh process started without OMP_NUM_THREADS (as a user's shell starts it), timing
full training steps (forward, backward, fused AdamW); reported: the median ms per step after warmup and tokens/s.
The busy process is a one-thread Python loop. Run it on an otherwise idle machine: it measures the load itself.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from threads import median_step  # benchmarks/threads.py, beside this script

CELLS = [  # (label, threads: "auto" | N, OMP_WAIT_POLICY or None, beside a busy core)
    ("idle, 1 thread", "1", None, False),
    ("idle, 2 threads", "2", None, False),
    ("idle, default", "auto", None, False),
    ("busy core, 1 thread", "1", None, True),
    ("busy core, 2 threads", "2", None, True),
    ("busy core, 2 threads, OMP_WAIT_POLICY=PASSIVE", "2", "PASSIVE", True),
    ("busy core, default", "auto", None, True),
]


def shape_config(shape: str):
    from nlq.config import update
    from nlq.presets import get_preset

    if shape == "tiny":
        return update(get_preset("nano"), {"model": {"vocab_size": 128, "block_size": 16},
                                           "train": {"batch_size": 32}})
    layers, width = (int(v) for v in shape.split("x"))
    return update(get_preset("micro"), {"model": {"n_layer": layers, "n_embd": width, "n_head": 4,
                                                  "vocab_size": 2048, "block_size": 128},
                                        "train": {"batch_size": 16}})


def worker(shape: str, threads: str, steps: int) -> None:
    """One cell, in this process: print the chosen threads and the median seconds per step."""
    import torch

    from nlq.config import update
    from nlq.model import Transformer
    from nlq.training.hardware import set_threads, tune_allocator

    tune_allocator()
    config = shape_config(shape)
    chosen = set_threads(update(config, {"train": {"threads": 0 if threads == "auto" else int(threads)}}))
    model = Transformer(config.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    batch, block, vocab = config.train.batch_size, config.model.block_size, config.model.vocab_size
    x, y = torch.randint(0, vocab, (batch, block)), torch.randint(0, vocab, (batch, block))
    print(json.dumps({"threads": chosen, "seconds": median_step(model, optimizer, x, y, steps)}))


def cell(shape: str, threads: str, policy: str | None, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, __file__, "--worker", shape, threads, "--steps", str(steps)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="tiny,2x64,2x128")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--worker", nargs=2, metavar=("SHAPE", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker, args.steps)
    print(f"{os.cpu_count()} CPUs; median ms per training step (threads used) and tokens/s; the default's ratio to "
          "one thread on the idle machine in the last column")
    print("| shape | " + " | ".join(label for label, *_ in CELLS) + " | default beside a busy core / idle 1 thread |")
    print("|---|" + "---|" * (len(CELLS) + 1))
    rows = []
    for shape in args.shapes.split(","):
        config = shape_config(shape)
        tokens = config.train.batch_size * config.model.block_size
        results = {}
        for label, threads, policy, beside in CELLS:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if beside else None
            try:
                if busy:
                    time.sleep(1.0)  # the busy loop is running before the cell starts
                results[label] = cell(shape, threads, policy, args.steps)
            finally:
                if busy:
                    busy.kill()
                    busy.wait()
        ratio = results["idle, 1 thread"]["seconds"] / results["busy core, default"]["seconds"]
        print(f"| {shape} | " + " | ".join(f"{r['seconds'] * 1e3:.1f} ms ({r['threads']}; {tokens / r['seconds']:,.0f})"
                                           for r in results.values()) + f" | x{ratio:.2f} |", flush=True)
        rows.append({"shape": shape, "tokens_per_step": tokens, "cells": results, "default_busy_vs_idle_1": ratio})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()

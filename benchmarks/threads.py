"""How to spend 2 cores on small models: one process with 2 threads, or 2 one-thread processes (study shards).

    python benchmarks/threads.py [--shapes 2x64,2x128,4x128] [--steps 25] [--json FILE]

For each shape (layers x width; 4 heads, vocabulary 2048, context 128, batch 16: the scaling study's models)
it times full training steps (forward, backward, fused AdamW) three ways: one process with 1 thread, one
with 2 threads, and 2 one-thread processes at once (each on its own random model, as two shards of
`nlq study --shard` would run). Reported: median ms/step after warmup and the machine's aggregate tokens/s.
Run it on an otherwise idle machine.
"""

import argparse
import json
import multiprocessing as mp
import statistics
import time

BATCH, BLOCK, VOCAB = 16, 128, 2048


def time_steps(layers: int, width: int, threads: int, steps: int, start=None) -> float:
    """Median seconds per training step of a fresh model (start: a barrier to begin together)."""
    import torch

    from nlq.model import Transformer
    from nlq.presets import get_preset, with_model
    from nlq.training.hardware import tune_allocator

    tune_allocator()
    torch.set_num_threads(threads)
    config = with_model(get_preset("micro"), n_layer=layers, n_embd=width, n_head=4, vocab_size=VOCAB,
                        block_size=BLOCK).model
    model = Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x, y = torch.randint(0, VOCAB, (BATCH, BLOCK)), torch.randint(0, VOCAB, (BATCH, BLOCK))
    if start is not None:
        start.wait()
    return median_step(model, optimizer, x, y, steps)


def median_step(model, optimizer, x, y, steps: int) -> float:
    """Median seconds of a full training step (forward, backward, optimizer) after the first few (warmup)."""
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times[min(5, steps // 2):])


def _worker(layers, width, steps, start, results):
    results.put(time_steps(layers, width, 1, steps, start))


def two_processes(layers: int, width: int, steps: int) -> list[float]:
    context = mp.get_context("spawn")
    start, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_worker, args=(layers, width, steps, start, results)) for _ in range(2)]
    for w in workers:
        w.start()
    out = [results.get() for _ in workers]
    for w in workers:
        w.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="2x64,2x128,4x128", help="layers x width, comma-separated")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    tokens = BATCH * BLOCK
    rows = []
    print(f"batch {BATCH} x context {BLOCK}, vocabulary {VOCAB}; median ms/step; aggregate tokens/s of the machine")
    print("| shape | 1 process, 1 thread | 1 process, 2 threads | 2 processes, 1 thread each | best |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        layers, width = (int(v) for v in shape.split("x"))
        one = time_steps(layers, width, 1, args.steps)
        two = time_steps(layers, width, 2, args.steps)
        pair = two_processes(layers, width, args.steps)
        rates = {"1 thread": tokens / one, "2 threads": tokens / two, "2 processes": sum(tokens / t for t in pair)}
        best = max(rates, key=rates.get)
        print(f"| {layers} x {width} | {one * 1e3:.1f} ms ({rates['1 thread']:,.0f} tok/s) | {two * 1e3:.1f} ms "
              f"({rates['2 threads']:,.0f} tok/s) | {max(pair) * 1e3:.1f} ms ({rates['2 processes']:,.0f} tok/s) | "
              f"{best} |", flush=True)
        rows.append({"shape": shape, "ms_1thread": one * 1e3, "ms_2threads": two * 1e3,
                     "ms_2processes": [t * 1e3 for t in pair], "tokens_per_s": rates})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()

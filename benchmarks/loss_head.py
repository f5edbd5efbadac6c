"""The LM head's loss, plain against chunked (PyTorch's F.linear_cross_entropy), measured side by side in one process.

    OMP_NUM_THREADS=1 python benchmarks/loss_head.py [--rounds 30] [--chunk 512] [--json FILE]
    python benchmarks/loss_head.py --device cuda [--rows 12288] [--json FILE]     (benchmarks/gpu_check.py runs it)

1. Training steps at the decision shape (d 64, 2 layers, 4 heads, vocabulary 2048, batch 16 x 128; AdamW, clip
   1.0; the linear and the nonlinear query), plain and chunked alternating step by step, in three conditions: one
   thread, two threads, and one thread while this script runs a second training process of the same shape on one
   thread beside it (how a sharded study runs on 2 cores). Reported: the median step time of each, and the median
   over rounds of the paired ratio plain / chunked (> 1: chunked is faster).
2. The head alone (2048 x 64 @ 64 x 2048 with its cross-entropy, forward and backward, one thread) against its
   FLOP limit: 3 matmuls of 2 N d V FLOPs at the fp32 matmul peak measured here on one thread.
3. The loss's peak memory at the GPT-3-small head (4096 rows, d 768, vocabulary 50,304, fp32, 2 threads), each
   in a fresh process: the rise of the peak resident set over what the inputs already hold, and its time.

Every number depends on the CPU and its load: run it on an otherwise idle machine, name the machine beside it.

With --device cuda: the GPT-3-small head (--rows rows, the paper's micro-batch of 12 x 1024 by default, d 768,
vocabulary 50,304) in fp32 and under bf16 autocast, plain, chunked and Liger-Kernel's fused kernel (when
liger-kernel is installed): the time of forward and backward, the peak memory allocated above the inputs, and the
loss and gradient differences from the plain fp32 loss.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from nlq.config import ModelConfig, TrainConfig
from nlq.model import Transformer
from nlq.training.hardware import tune_allocator
from nlq.training.trainer import make_optimizer

SHAPE = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=2048, block_size=128)
BATCH = 16


def training_step(query: str, impl: str, chunk: int, seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**SHAPE, query=query), seed=seed)
    optimizer = make_optimizer(model, TrainConfig(lr=2e-3), torch.device("cpu"), sharded=False)
    x = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"]))
    y = torch.randint(0, SHAPE["vocab_size"], (BATCH, SHAPE["block_size"]))

    def step() -> float:
        started = time.perf_counter()
        _, loss = model(x, y, loss_impl=impl, loss_chunk=chunk)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started
    return step


def compare_steps(rounds: int, chunk: int) -> dict:
    out = {}
    for query in ("linear", "nonlinear"):
        plain, chunked = training_step(query, "plain", chunk), training_step(query, "chunked", chunk)
        for _ in range(5):  # warm-up
            plain(), chunked()
        times = {"plain": [], "chunked": []}
        for i in range(rounds):  # alternate which goes first
            first, second = ("plain", "chunked") if i % 2 == 0 else ("chunked", "plain")
            for name in (first, second):
                times[name].append((plain if name == "plain" else chunked)())
        ratios = [p / c for p, c in zip(times["plain"], times["chunked"])]
        out[query] = {"plain_ms": 1e3 * statistics.median(times["plain"]),
                      "chunked_ms": 1e3 * statistics.median(times["chunked"]), "speedup": statistics.median(ratios)}
    return out


def companion() -> None:
    """A second training process (the --companion mode of this script): trains until killed."""
    torch.set_num_threads(1)
    step = training_step("linear", "plain", 512, seed=1)
    while True:
        step()


def matmul_peak() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    started, n = time.perf_counter(), 20
    for _ in range(n):
        a @ b
    return n * 2 * 1024 ** 3 / (time.perf_counter() - started)


def head_alone(chunk: int, rounds: int) -> dict:
    rows, d, vocab = BATCH * SHAPE["block_size"], SHAPE["n_embd"], SHAPE["vocab_size"]
    h = torch.randn(rows, d, requires_grad=True)
    w = (0.02 * torch.randn(vocab, d)).requires_grad_()
    y = torch.randint(0, vocab, (rows,))
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk)
    calls = {"plain": lambda: F.cross_entropy(h @ w.T, y),
             "chunked": lambda: F.linear_cross_entropy(h, w, y, options=options)}
    times = {name: [] for name in calls}
    for i in range(rounds + 3):
        for name, call in calls.items():
            started = time.perf_counter()
            call().backward()
            if i >= 3:
                times[name].append(time.perf_counter() - started)
            h.grad = w.grad = None
    flops = 3 * 2 * rows * d * vocab
    peak = matmul_peak()
    return {"flops": flops, "matmul_peak_gflops": peak / 1e9, "limit_ms": 1e3 * flops / peak,
            **{f"{name}_ms": 1e3 * statistics.median(t) for name, t in times.items()}}


def memory_probe(impl: str, chunk: int) -> None:
    """The --memory mode: one GPT-3-small head loss, forward and backward, in this fresh process."""
    torch.set_num_threads(2)
    rows, d, vocab = 4096, 768, 50304
    h = torch.randn(rows, d, requires_grad=True)
    w = (0.02 * torch.randn(vocab, d)).requires_grad_()
    y = torch.randint(0, vocab, (rows,))
    w.grad = torch.zeros_like(w)  # the gradients' own memory is there in training too: counted before the peak
    h.grad = torch.zeros_like(h)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    if impl == "plain":
        loss = F.cross_entropy(h @ w.T, y)
    else:
        loss = F.linear_cross_entropy(h, w, y, options=torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk))
    loss.backward()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"extra_peak_mb": (peak - before) / 1024, "seconds": seconds}))


def memory(chunk: int) -> dict:
    out = {}
    for impl in ("plain", "chunked"):
        result = subprocess.run([sys.executable, __file__, "--memory", impl, "--chunk", str(chunk)],
                                capture_output=True,
                                text=True, check=True)
        out[impl] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def cuda_head(rows: int, chunk: int, rounds: int) -> dict:
    """Plain, chunked and liger at the GPT-3-small head on the GPU, fp32 and bf16 autocast."""
    from nlq.components import head_loss

    device = torch.device("cuda")
    d, vocab = 768, 50304
    h = torch.randn(rows, d, device=device, requires_grad=True)
    w = (0.02 * torch.randn(vocab, d, device=device)).requires_grad_()
    y = torch.randint(0, vocab, (rows,), device=device)
    impls = ["plain", "chunked"]
    try:
        import liger_kernel  # noqa: F401

        impls.append("liger")
    except ImportError:
        pass

    def loss_of(impl: str):
        if impl == "plain":
            return F.cross_entropy((h @ w.T).float(), y)
        return head_loss(h, w, y, -100, impl, chunk)

    out, reference = {}, None
    for dtype in (torch.float32, torch.bfloat16):
        for impl in impls:
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is torch.bfloat16):
                h.grad = w.grad = None
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                loss = loss_of(impl)
                loss.backward()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                grads = (h.grad.float().clone(), w.grad.float().clone())
                if reference is None:
                    reference = (loss.item(), grads)
                times = []
                for _ in range(rounds):
                    h.grad = w.grad = None
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    loss_of(impl).backward()
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end))
            out[f"{impl}/{str(dtype).split('.')[-1]}"] = {
                "ms": statistics.median(times), "extra_peak_mb": peak / 2**20,
                "loss_diff": abs(loss.item() - reference[0]),
                "grad_diff": max((a - b).abs().max().item() for a, b in zip(grads, reference[1]))}
    return {"rows": rows, "d": d, "vocab": vocab, "chunk": chunk, "impls": out,
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rows", type=int, default=12 * 1024, help="--device cuda: rows of the head's input")
    parser.add_argument("--companion", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--memory", choices=["plain", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    tune_allocator()  # as nlq train does (glibc malloc's trim and mmap thresholds)
    if args.companion:
        return companion()
    if args.memory:
        return memory_probe(args.memory, args.chunk)
    if args.device == "cuda":
        results = cuda_head(args.rows, args.chunk, args.rounds)
        for name, row in results["impls"].items():
            print(f"{name}: {row['ms']:.2f} ms, +{row['extra_peak_mb']:,.0f} MB peak, loss diff "
                  f"{row['loss_diff']:.2e}, "
                  f"grad diff {row['grad_diff']:.2e}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        return

    results = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "chunk": args.chunk, "rounds": args.rounds, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    torch.set_num_threads(1)
    results["one_thread"] = compare_steps(args.rounds, args.chunk)
    results["head_alone_one_thread"] = head_alone(args.chunk, args.rounds)
    torch.set_num_threads(2)
    results["two_threads"] = compare_steps(args.rounds, args.chunk)
    torch.set_num_threads(1)
    other = subprocess.Popen([sys.executable, __file__, "--companion"], env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        time.sleep(3)  # let it start training
        results["one_thread_beside_a_training_process"] = compare_steps(args.rounds, args.chunk)
    finally:
        other.kill()
        other.wait()
    results["gpt3_small_head_memory"] = memory(args.chunk)
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def report(r: dict) -> str:
    lines = [f"torch {r['torch']}, CPU capability {r['cpu_capability']}, chunk {r['chunk']} rows, {r['rounds']} "
             "rounds, "
             f"{r['date_utc']} UTC", "",
             "| condition | query | plain ms/step | chunked ms/step | speed-up (median paired ratio) |",
             "|---|---|---|---|---|"]
    for key in ("one_thread", "two_threads", "one_thread_beside_a_training_process"):
        for query, row in r[key].items():
            lines.append(f"| {key.replace('_', ' ')} | {query} | {row['plain_ms']:.1f} | {row['chunked_ms']:.1f} | "
                         f"x{row['speedup']:.3f} |")
    head = r["head_alone_one_thread"]
    lines += ["", "Head alone (2048 x 64 @ 64 x 2048, forward and backward, one thread): "
              f"plain {head['plain_ms']:.1f} ms, chunked {head['chunked_ms']:.1f} ms; "
              f"FLOP limit {head['limit_ms']:.1f} ms ({head['flops'] / 1e9:.2f} GFLOP at the measured "
              f"{head['matmul_peak_gflops']:.0f} GFLOP/s one-thread matmul peak)."]
    mem = r["gpt3_small_head_memory"]
    lines += ["GPT-3-small head loss (4096 x 768 @ 768 x 50,304, fp32, 2 threads): plain "
              f"+{mem['plain']['extra_peak_mb']:,.0f} "
              f"MB peak in {mem['plain']['seconds']:.1f} s, chunked +{mem['chunked']['extra_peak_mb']:,.0f} MB in "
              f"{mem['chunked']['seconds']:.1f} s "
              f"({mem['plain']['extra_peak_mb'] / max(1.0, mem['chunked']['extra_peak_mb']):.1f}x "
              "less memory)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

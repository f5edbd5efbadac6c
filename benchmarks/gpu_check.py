"""All GPU checks in one command (at most about 10 minutes on one H100/H200), results in files it names.

    python benchmarks/gpu_check.py --out OUT_DIR [--data DATA_DIR] [--dry-run]

1. the environment (GPU, driver, torch and CUDA versions)                        -> OUT/env.txt
2. the GPU-marked tests (tests/test_gpu.py: bf16 vs fp32, compile vs eager, fused SDPA kernel, fused AdamW,
   DDP and FSDP2 in one process, checkpoints between GPU and CPU)              -> OUT/gpu_tests.txt
3. GPT-3 small (bf16, compiled, context 1024, the largest micro-batch that fits): tokens/s, MFU and peak
   memory of linear, nonlinear and linear-mlp4.75, alternating in one process -> OUT/throughput.json/.txt
3b. the LM head's loss at GPT-3 small (12 x 1024 rows, d 768, vocabulary 50,304): plain, chunked (PyTorch's
   F.linear_cross_entropy) and liger (when liger-kernel is installed), fp32 and bf16, time and peak memory
                                                                              -> OUT/loss_head.json/.txt
4. a short real training (GPT-3 small shape, 300 steps, bf16, compiled) on DATA_DIR (prepared on the CPU
   machine and carried along), or on python-stdlib prepared there           -> OUT/train_metrics.jsonl
5. the verdict studies' shape on one GPU (d 64, 2 layers, batch 16 x 128, fp32) as `nlq study ... --shards 14`
   runs it: 14 `nlq train` processes at once, 300 steps each, on the same data (its vocabulary, 8192, is 4x
   the studies' 2048): the summed tokens/s, and from it the hours verdict-lr's 3.67G tokens would take
                                                                              -> OUT/shared_gpu.json
Then OUT/summary.json and OUT/summary.md. --dry-run runs the same steps on the CPU with tiny shapes (the
GPU tests skip), to check the script itself.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(command: list[str], log: Path, timeout: int) -> tuple[int, float]:
    """Run a command with the repository's src on the path; its output goes to the console and to log."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PYTHONUNBUFFERED="1")
    print(f"$ {' '.join(command)}", flush=True)
    start = time.perf_counter()
    with open(log, "w") as f:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        try:
            for line in process.stdout:
                print(line, end="", flush=True)
                f.write(line)
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = 124
    return code, time.perf_counter() - start


def environment() -> str:
    import torch

    lines = [f"date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", f"python: {sys.version.split()[0]}",
             f"torch: {torch.__version__}", f"cuda (torch): {torch.version.cuda}",
             f"cudnn: {torch.backends.cudnn.version() if torch.cuda.is_available() else None}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines += [f"gpu: {props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, "
                  f"capability {props.major}.{props.minor}"]
        try:
            lines.append(subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv"],
                                        capture_output=True, text=True, timeout=30).stdout.strip())
        except (OSError, subprocess.TimeoutExpired):
            lines.append("nvidia-smi: not available")
    else:
        lines.append("gpu: none (dry run on the CPU)")
    return "\n".join(lines)


def shared_gpu(py: str, data: str, out: Path, processes: int, dry_run: bool) -> dict:
    """`processes` nlq train runs of the d-64 study shape at once on this machine's device (as --shards does):
    their summed median tokens/s over the steps after the first 50 (compilation and start-up left out)."""
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"nlq-gpu-shared-{os.getpid()}"
    device = "cpu" if dry_run else "cuda"
    steps = 60 if dry_run else 300
    command = [py, "-m", "nlq", "train", "--data", data, "--preset", "micro", "--model.n_layer=2",
               "--model.n_embd=64", "--model.n_head=4", "--model.vocab_size=8192", "--train.batch_size=16",
               f"--train.max_steps={steps}", f"--train.eval_every={steps}", "--data.eval_windows=16",
               "--train.log_every=1", f"--train.device={device}", "--train.dtype=float32"]
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1")
    start = time.perf_counter()
    with open(out / "shared_gpu.txt", "w") as log:
        children = [subprocess.Popen([*command, "--out", str(root / f"p{k}")], cwd=ROOT, env=env, stdout=log,
                                     stderr=subprocess.STDOUT) for k in range(processes)]
        try:
            codes = [child.wait(timeout=240) for child in children]
        except subprocess.TimeoutExpired:
            for child in children:
                child.kill()
            codes = [124]
    rates = []
    for k in range(processes):
        metrics = root / f"p{k}" / "metrics.jsonl"
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        steady = sorted(r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r["step"] > 50)
        rates.append(steady[len(steady) // 2] if steady else 0.0)
    total = sum(rates)
    result = {"exit_code": max(codes), "seconds": round(time.perf_counter() - start, 1), "processes": processes,
              "steps": steps, "tokens_per_s_each": [round(r) for r in rates], "tokens_per_s": round(total),
              "verdict_lr_hours": round(3.67e9 / total / 3600, 2) if total else None}
    (out / "shared_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--data", help="a prepared data directory (nlq prepare) to train on")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: checks the script")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    summary: dict = {"dry_run": args.dry_run}

    env_text = environment()
    (out / "env.txt").write_text(env_text + "\n")
    print(env_text, flush=True)

    code, seconds = run([py, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py", "-rs"], out / "gpu_tests.txt", 240)
    summary["gpu_tests"] = {"exit_code": code, "seconds": round(seconds, 1),
                            "last_line": ((out / "gpu_tests.txt").read_text().strip().splitlines() or [""])[-1]}

    shape = (["--preset", "nano", "--device", "cpu", "--rounds", "2", "--steps", "1", "--batch-size", "4"]
             if args.dry_run
             else ["--preset", "gpt3-small", "--device", "cuda", "--dtype", "bfloat16", "--compile", "--batch-size",
                   "auto", "--rounds", "8", "--steps", "3"])
    code, seconds = run([py, "benchmarks/throughput.py", "--variants", "linear,nonlinear,linear:mlp4.75", *shape,
                         "--json", str(out / "throughput.json")], out / "throughput.txt", 300)
    summary["throughput"] = {"exit_code": code, "seconds": round(seconds, 1)}
    if (out / "throughput.json").is_file():
        summary["throughput"] |= json.loads((out / "throughput.json").read_text())

    if args.dry_run:  # the CPU side of loss_head.py is its own benchmark (minutes); the dry run checks the rest
        code, seconds = 0, 0.0
    else:
        code, seconds = run([py, "benchmarks/loss_head.py", "--device", "cuda", "--rounds", "10", "--json",
                             str(out / "loss_head.json")], out / "loss_head.txt", 240)
    summary["loss_head"] = {"exit_code": code, "seconds": round(seconds, 1)}
    if (out / "loss_head.json").is_file():
        summary["loss_head"] |= json.loads((out / "loss_head.json").read_text())

    data = args.data
    if not data:
        data = str(out.parent / "gpu_check_data")
        run([py, "-m", "nlq", "prepare", "--source", "python-stdlib", "--tokenizer", "bpe:8192", "--out", data],
            out / "prepare.txt", 180)
    run_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"nlq-gpu-check-{os.getpid()}"
    training = (["--preset", "nano", "--train.max_steps=20", "--train.device=cpu", "--train.eval_every=10"]
                if args.dry_run
                else ["--preset", "gpt3-small", "--train.max_steps=300", "--train.warmup_steps=30",
                      "--train.batch_tokens=98304", "--train.batch_size=24", "--train.eval_every=100",
                      "--train.compile=true", "--train.lr=1e-3", "--train.min_lr=1e-4", "--data.eval_windows=96"])
    code, seconds = run([py, "-m", "nlq", "train", "--data", data, "--out", str(run_dir), "--model.vocab_size=8192",
                         "--model.query=nonlinear", "--train.log_every=25", *training], out / "train.txt", 300)
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    (out / "train_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    summary["training"] = {"exit_code": code, "seconds": round(seconds, 1), "steps": len(losses),
                           "first_train_loss": losses[0] if losses else None,
                           "last_train_loss": losses[-1] if losses else None,
                           "val_losses": vals, "all_finite": all(v is not None and math.isfinite(v)
                                                                 for v in losses + vals),
                           "median_tokens_per_s": sorted(r["tokens_per_s"] for r in records
                                                         if "tokens_per_s" in r)[len(losses) // 2] if losses else None,
                           "mfu": [r["mfu"] for r in records if "mfu" in r][-1:] or None}
    summary["shared_gpu"] = shared_gpu(py, data, out, processes=2 if args.dry_run else 14, dry_run=args.dry_run)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = ["# GPU check", "", "```", env_text, "```", "", f"- tests: {summary['gpu_tests']['last_line']}"]
    for name, result in (summary["throughput"].get("variants") or {}).items():
        mfu = f", MFU {result['mfu']:.1%}" if result.get("mfu") else ""
        mem = f", peak {result['peak_memory_gib']:.1f} GiB" if result.get("peak_memory_gib") else ""
        lines.append(f"- {name}: {result['tokens_per_s']:,.0f} tokens/s, "
                     f"step x{result['ratio_to_first']:.3f}{mfu}{mem}")
    t = summary["training"]
    lines.append(f"- training: {t['steps']} steps, train loss {t['first_train_loss']} -> {t['last_train_loss']}, "
                 f"val {t['val_losses']}, all finite: {t['all_finite']}")
    for name, row in (summary["loss_head"].get("impls") or {}).items():
        lines.append(f"- loss head {name}: {row['ms']:.2f} ms, +{row['extra_peak_mb']:,.0f} MB peak")
    g = summary["shared_gpu"]
    lines.append(f"- {g['processes']} processes of the d-64 study shape sharing the device: "
                 f"{g['tokens_per_s']:,.0f} tokens/s in all; verdict-lr's 3.67G tokens in about "
                 f"{g['verdict_lr_hours']} h")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    failed = [k for k in ("gpu_tests", "throughput", "loss_head", "training", "shared_gpu")
              if summary[k]["exit_code"] not in (0, 5)]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""What the host offers a run: CPU threads (chosen by the work's size and the machine's load), memory (refuse a step
that cannot fit, before allocating), the allocator, bf16 support and autocast, and peak FLOP/s for the MFU estimate."""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from nlq.config import ModelConfig, RunConfig, TrainConfig
from nlq.errors import UserError

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


# Below this much training work per step (6 x parameters x tokens, in FLOPs) a second thread costs more in
# start-up and synchronisation than it saves (benchmarks/threads.py, docs/PERFORMANCE.md): one thread.
SMALL_STEP_FLOPS = 1e9


def busy_elsewhere(samples: int = 7, interval_s: float = 0.02, loadavg: Path = Path("/proc/loadavg")) -> float:
    """About how many cores other work keeps busy now: the runnable tasks of the whole machine (the first number of
    /proc/loadavg's fourth field) less this process, the median of a few samples; 0.0 where /proc is not there.
    Instantaneous, unlike the load averages, which take a minute to see a job that has just started."""
    counts = []
    for i in range(samples):
        try:
            running = int(loadavg.read_text().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0.0
        counts.append(max(0, running - 1))
        if i + 1 < samples:
            time.sleep(interval_s)
    return float(statistics.median(counts))


def cpu_cores() -> int:
    """The cores this process may run on (its affinity mask, as taskset and cgroups set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose_threads(requested: int, step_flops: float, cores: int, busy: float, processes: int = 1) -> int:
    """Threads for one training process: `requested` when it is > 0; otherwise one for a step under
    SMALL_STEP_FLOPS, else this process's share of the cores that other work leaves free (processes: how many
    processes of this run share the machine), at least one."""
    if requested > 0:
        return requested
    if step_flops < SMALL_STEP_FLOPS:
        return 1
    free = cores - round(busy)
    return max(1, min(cores, free) // max(1, processes))


def set_threads(config: RunConfig) -> int:
    """Set torch's intra-op threads for this run on a CPU and return them: train.threads when > 0; the user's
    OMP_NUM_THREADS (what torch started with) when set; else choose_threads by the work and the machine's load."""
    requested = config.train.threads
    if requested == 0 and os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    tokens = config.train.batch_tokens or config.train.batch_size * config.model.block_size
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    threads = choose_threads(requested, 6.0 * config.model.approx_parameters() * tokens, cpu_cores(),
                             busy_elsewhere() if requested == 0 else 0.0, processes)
    torch.set_num_threads(threads)
    return threads


def tune_allocator() -> bool:
    """Keep freed tensor memory in glibc's heap instead of returning it to the OS. By default glibc serves
    large blocks with mmap and unmaps them on free, so every training step faults the same pages in again
    (about 90k minor page faults and 0.17 s of system time per step of the `small` preset on 2 cores;
    docs/PERFORMANCE.md). With mmap off and no trimming the heap keeps its high-water mark and reuses it.
    A no-op (False) where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # glibc's mallopt parameter numbers (malloc.h)
        never_trim = 2**31 - 1  # int max
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, never_trim))
    except (OSError, AttributeError):
        return False


def memory_estimate(model: ModelConfig, micro_rows: int) -> dict[str, float]:
    """Rough bytes a training step needs, from the config alone (nothing is allocated): fp32 weights,
    gradients and AdamW's two moments, and the activations of one micro-batch kept for the backward pass."""
    d, L, T, V = model.n_embd, model.n_layer, model.block_size, model.vocab_size
    activations = micro_rows * T * (L * (16 * d + 2 * model.mlp_hidden) + 3 * V)
    return {"parameters": 16.0 * model.approx_parameters(), "activations": 4.0 * activations}


def available_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_memory(config: RunConfig, micro_rows: int, device: torch.device) -> None:
    """Refuse, before allocating anything, a step that cannot fit: a one-line error naming what to lower."""
    need = memory_estimate(config.model, micro_rows)
    have = available_memory(device)
    if sum(need.values()) <= have:
        return
    m = config.model
    lower = ("model.n_layer, model.n_embd, model.vocab_size or model.block_size" if need["parameters"] > have / 2
             else "train.batch_size (the micro-batch), model.block_size or the model size")
    gib = {key: value / 2**30 for key, value in need.items()}
    raise UserError(f"this run needs about {sum(gib.values()):,.1f} GiB ({gib['parameters']:,.1f} for weights and "
                    f"optimizer state, {gib['activations']:,.1f} for activations of {micro_rows} x {m.block_size} "
                    f"tokens) and {device} has {have / 2**30:,.1f} GiB; lower {lower}")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls in hardware (AVX-512 with bf16, or AMX). Elsewhere (AVX2) torch
    emulates them: measured on an AVX2 EPYC, 0.3 GFLOP/s against 145 in fp32 (docs/PERFORMANCE.md)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX", "AVX512_AMX")


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda"):
        if device.type == "cpu" and not cpu_has_native_bf16():
            raise UserError(f"train.dtype=bfloat16 on this CPU ({torch.backends.cpu.get_cpu_capability()}, no native "
                            f"bf16) runs about 100x slower than float32; use --train.dtype=float32")
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def peak_flops(cfg: TrainConfig, device: torch.device, dtype: torch.dtype | None) -> float | None:
    """Peak FLOP/s of one device for the MFU estimate: train.peak_tflops, or known GPUs in bf16."""
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if device.type == "cuda" and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        return next((tf * 1e12 for key, tf in PEAK_BF16_TFLOPS.items() if key in name), None)
    return None

"""What the host offers a run: memory (refuse a step that cannot fit, before allocating), the allocator, bf16
support and autocast, and peak FLOP/s for the MFU estimate."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

import torch

from nlq.config import ModelConfig, RunConfig, TrainConfig
from nlq.errors import UserError

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


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

"""Sampling text from a trained model (runs/rundir.py loads one; training/evaluate.py scores text)."""

from __future__ import annotations

import os

import torch

from nlq.components import KVCache
from nlq.errors import UserError
from nlq.model import Transformer


def check_sampling_memory(model: Transformer, rows: int, prompt: int, new: int) -> None:
    """Refuse, before allocating, a sampling request that cannot fit in this machine's memory: the weights, every
    layer's keys and values and the logits of a full window for each of `rows` samples, and the tokens themselves.
    A rough upper estimate, like training's (training/hardware.py)."""
    cfg = model.cfg
    window = min(cfg.block_size, prompt + new)
    per_row = window * (2 * cfg.n_layer * cfg.kv_heads * cfg.head_size + cfg.vocab_size + 16 * cfg.n_embd) * 4.0
    per_row += 8.0 * (prompt + new)  # the tokens
    weights = 4.0 * sum(p.numel() for p in model.parameters())
    have = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if weights + rows * per_row > have:
        fits = max(0, int((have - weights) // per_row))
        raise UserError(f"{rows:,} samples of {prompt} + {new:,} tokens need about "
                        f"{(weights + rows * per_row) / 2**30:,.1f} GiB and this machine has {have / 2**30:,.1f} GiB; "
                        f"at most {fits:,} such samples fit: lower --num-samples or --max-new-tokens")


@torch.no_grad()
def generate(model: Transformer, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             vocab_limit: int | None = None, use_cache: bool = True) -> torch.Tensor:
    """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy. vocab_limit: draw only
    ids below it (the tokenizer's vocabulary when the model's is padded). The model sees the last block_size
    tokens. use_cache: keep each layer's keys and values (KVCache), so a step feeds the new token alone, not the
    whole context; once the context outgrows block_size every position shifts, and each step reads the whole
    window again, as without a cache. Either way the same tokens, up to float rounding in the logits."""
    block = model.cfg.block_size
    cache = KVCache(len(model.blocks)) if use_cache and model.cfg.causal else None
    for _ in range(max_new_tokens):
        if cache is not None and idx.size(1) > block:
            cache = KVCache(len(model.blocks))  # the window slid: every position moved, start it afresh
        context = idx[:, cache.length:] if cache is not None and cache.length else idx[:, -block:]
        logits = model(context, cache=cache)[0][:, -1, :vocab_limit]  # (B, V)
        if temperature == 0:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_id = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
        idx = torch.cat([idx, next_id], dim=1)
    return idx

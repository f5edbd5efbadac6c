"""Sampling text from a trained model (runs/rundir.py loads one; training/evaluate.py scores text)."""

from __future__ import annotations

import torch

from nlq.model import Transformer


@torch.no_grad()
def generate(model: Transformer, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             vocab_limit: int | None = None) -> torch.Tensor:
    """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy. vocab_limit: draw only
    ids below it (the tokenizer's vocabulary when the model's is padded)."""
    for _ in range(max_new_tokens):
        context = idx[:, -model.cfg.block_size:]
        logits = model(context)[0][:, -1, :vocab_limit]  # (B, V)
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

"""Retrofit a transformers model with the nonlinear query, in one call:

    from nlq.interop.hf import apply_nonlinear_query
    model = AutoModelForCausalLM.from_pretrained(...)
    replaced = apply_nonlinear_query(model)          # then train or fine-tune it with the usual tools

Supported: every attention module with its own square query projection `q_proj` (Llama, Mistral, Qwen2,
Qwen3, Gemma with head_dim * heads == hidden, Phi-3 style models that keep q_proj, ...) and GPT-2's fused
`c_attn` (split: the query part becomes the nonlinear query, keys and values keep their trained weights).
Each W_Q is replaced by NonlinearQuery (Q = (X + f(X)) / 2, fresh weights, the formula's 1/2 included, so
the model's own softmax scale stays right). Anything else is refused with a one-line error, and so is a model
with cross-attention (BART's encoder_attn, GPT-2 with add_cross_attention): every module is checked before any
is changed, so a refused model is left as it was. A trained q_proj bias (Qwen2) is not carried over: the nonlinear
query starts fresh, with a bias only if bias=True; a warning says how many were dropped.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from nlq.errors import UserError
from nlq.projections import NonlinearQuery


class GPT2QueryKeyValue(nn.Module):
    """Stands in for GPT-2's fused c_attn (X -> [Q | K | V]): the query from `query`, keys and values from the
    original c_attn's K and V columns."""

    def __init__(self, c_attn: nn.Module, query: nn.Module):
        super().__init__()
        d = c_attn.weight.shape[0]  # Conv1D stores (in, out) = (d, 3d)
        self.query = query
        self.kv = nn.Linear(d, 2 * d, bias=c_attn.bias is not None, device=c_attn.weight.device,
                            dtype=c_attn.weight.dtype)
        with torch.no_grad():
            self.kv.weight.copy_(c_attn.weight[:, d:].T)
            if c_attn.bias is not None:
                self.kv.bias.copy_(c_attn.bias[d:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.query(x), self.kv(x)], dim=-1)  # (B, T, 3d), as c_attn returned


def _new_query(dim: int, like: torch.Tensor, rank, activation, init_std, bias) -> NonlinearQuery:
    query = NonlinearQuery(dim, rank=rank, activation=activation, bias=bias)
    for layer in (query.up, query.down):
        nn.init.normal_(layer.weight, std=init_std)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    return query.to(device=like.device, dtype=like.dtype)


CROSS_ATTENTION_NAMES = ("encoder_attn", "crossattention", "cross_attn", "cross_attention", "encoder_decoder_attention")


def _is_cross_attention(name: str, module: nn.Module) -> bool:
    return bool(getattr(module, "is_cross_attention", False)) or name.rpartition(".")[2] in CROSS_ATTENTION_NAMES


def _targets(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, attention module, "q_proj" or "c_attn") of every query projection to replace; refuses, before
    anything changes, a model with cross-attention or a query projection that is not square."""
    targets = []
    for name, module in model.named_modules():
        q_proj = getattr(module, "q_proj", None)
        gpt2 = type(module).__name__.startswith("GPT2") and hasattr(module, "c_attn") and hasattr(module, "split_size")
        if not (isinstance(q_proj, nn.Linear) or gpt2):
            continue
        if _is_cross_attention(name, module):
            raise UserError(f"{name} is cross-attention; apply_nonlinear_query supports self-attention only and "
                            f"changed nothing (a model with cross-attention is refused as a whole)")
        if isinstance(q_proj, nn.Linear):
            if q_proj.in_features != q_proj.out_features:
                raise UserError(f"{name}.q_proj maps {q_proj.in_features} -> {q_proj.out_features} features; the "
                                f"nonlinear query Q = (X + f(X)) / 2 needs a square query projection; nothing changed")
            targets.append((name, module, "q_proj"))
        else:
            targets.append((name, module, "c_attn"))
    return targets


def apply_nonlinear_query(model: nn.Module, rank: int | None = None, activation: str = "gelu",
                          init_std: float | None = None, bias: bool = False) -> list[str]:
    """Replace every attention query projection of a transformers model in place; returns the replaced
    module names. rank: bottleneck r (default d/2, parameter parity with W_Q); init_std: std of W1 and W2
    (default the model's config.initializer_range, else 0.02). Refuses (changing nothing) what it cannot convert."""
    config = getattr(model, "config", None)
    std = init_std if init_std is not None else getattr(config, "initializer_range", 0.02)
    targets = _targets(model)
    if not targets:
        raise UserError(f"{type(model).__name__}: no supported attention found; supported are attention modules "
                        f"with a square q_proj (Llama, Mistral, Qwen2, ...) and GPT-2's c_attn")
    dropped = sum(kind == "q_proj" and module.q_proj.bias is not None for _, module, kind in targets)
    if dropped and not bias:
        warnings.warn(f"{dropped} trained q_proj biases are not carried over: the nonlinear query starts fresh "
                      f"without a bias (pass bias=True for a fresh one)", stacklevel=2)
    replaced = []
    for name, module, kind in targets:
        if kind == "q_proj":
            q_proj = module.q_proj
            module.q_proj = _new_query(q_proj.in_features, q_proj.weight, rank, activation, std, bias)
        else:
            d = module.c_attn.weight.shape[0]
            module.c_attn = GPT2QueryKeyValue(module.c_attn,
                                              _new_query(d, module.c_attn.weight, rank, activation, std, bias))
        replaced.append(f"{name}.{kind}")
    return replaced

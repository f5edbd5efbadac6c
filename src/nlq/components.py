"""The parts around the Transformer's blocks, kept beside model.py so that it stays one readable Transformer: for an
encoder classifier (model.classes > 0) a patch stem that turns a signal or an image into tokens and a class head that
turns the tokens into class logits (ViT's recipe, for 1-D signals such as MNIST-1D and 2-D images such as digits
or CIFAR); for a language model the LM head's loss without the logits (chunked or Liger-Kernel's fused kernel)
and the KV cache of incremental decoding.
"""

from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn

from nlq.config import ModelConfig
from nlq.errors import UserError


def lambda_init(layer: int) -> float:
    """Differential attention's lambda_init at block `layer` (from 0): 0.8 - 0.6 exp(-0.3 layer), the paper's
    0.8 - 0.6 exp(-0.3 (l - 1)) for l from 1, as transformers' DiffLlama computes it."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DifferentialLambda(nn.Module):
    """lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init: one scalar per block, from
    four learned vectors of the head size (drawn N(0, 0.1), as the paper's code and DiffLlama draw them)."""

    STD = 0.1

    def __init__(self, head_size: int, layer: int):
        super().__init__()
        self.init = lambda_init(layer)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(head_size)))
        self.reset()

    def reset(self, generator: torch.Generator | None = None) -> None:
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=self.STD, generator=generator)

    def forward(self) -> torch.Tensor:
        dtype = torch.promote_types(self.lambda_q1.dtype, torch.float32)  # at least fp32, as DiffLlama sums
        one = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dtype=dtype))
        two = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dtype=dtype))
        return one - two + self.init  # () scalar


def differential_heads(attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor,
                       init: float, eps: float) -> torch.Tensor:
    """Differential attention on q, k, v of (B, nh, T, hs) (k and v already expanded to nh heads): head j and head
    j + nh/2 share the value [v_j | v_(j + nh/2)] of width 2 hs; (softmax_1 - lambda softmax_2) of it, each head
    RMS-normalised over its 2 hs (no weights) and scaled by 1 - lambda_init. attend(q, k, v) is the softmax
    attention. Returns (B, nh/2, T, 2 hs)."""
    half = q.size(1) // 2
    value = torch.cat([v[:, :half], v[:, half:]], dim=-1)  # (B, nh/2, T, 2 hs)
    y = attend(q[:, :half], k[:, :half], value) - lam.to(q.dtype) * attend(q[:, half:], k[:, half:], value)
    return (1 - init) * F.rms_norm(y, (y.size(-1),), eps=eps)


class PatchStem(nn.Module):
    """(B, length, channels) signals or (B, channels, side, side) images -> (B, tokens, d): each non-overlapping
    patch (patch_size samples, or patch_size x patch_size pixels, all channels) is one token, a linear map of its
    values; learned positions are added; with pool="cls" a learned class token comes first."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dims, self.patch, self.channels = cfg.input_dims, cfg.patch_size, cfg.in_channels
        self.proj = nn.Linear(cfg.in_channels * cfg.patch_size ** cfg.input_dims, cfg.n_embd, bias=True)
        self.pos = nn.Embedding(cfg.stem_tokens, cfg.n_embd)  # an Embedding: drawn per name like every weight
        self.cls = nn.Embedding(1, cfg.n_embd) if cfg.pool == "cls" else None

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_patches, values per patch), patches in reading order."""
        B, p = x.size(0), self.patch
        if self.dims == 1:  # (B, L, C) -> (B, L / p, p * C)
            return x.reshape(B, x.size(1) // p, p * self.channels)
        C, H, W = x.shape[1:]  # (B, C, H, W) -> (B, H/p * W/p, C * p * p)
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(B, (H // p) * (W // p), C * p * p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(self.patches(x))  # (B, n_patches, d)
        if self.cls is not None:
            tokens = torch.cat([self.cls.weight.expand(x.size(0), 1, -1), tokens], dim=1)  # (B, 1 + n_patches, d)
        return tokens + self.pos.weight  # (B, T, d)


class ClassHead(nn.Module):
    """(B, T, d) normalised tokens -> (B, classes): the class token's state, or the mean over the tokens, mapped
    linearly to the classes."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pool = cfg.pool
        self.proj = nn.Linear(cfg.n_embd, cfg.classes, bias=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        pooled = h[:, 0] if self.pool == "cls" else h.mean(dim=1)  # (B, d)
        return self.proj(pooled)  # (B, classes)


def check_input(x: torch.Tensor, cfg: ModelConfig) -> None:
    """The classifier's input must have the shape its config says; a clear error otherwise."""
    side = cfg.input_size
    expected = (side, cfg.in_channels) if cfg.input_dims == 1 else (cfg.in_channels, side, side)
    if x.dim() != len(expected) + 1 or tuple(x.shape[1:]) != expected or not x.is_floating_point():
        raise ValueError(f"a classifier of model.input_dims={cfg.input_dims} takes float inputs (batch, "
                         f"{', '.join(map(str, expected))}); got {x.dtype} {tuple(x.shape)}")


def check_loss_impl(impl: str, device: torch.device) -> None:
    """A one-line error where the loss impl cannot run on this device with this install (plain always can)."""
    if impl == "chunked" and not hasattr(F, "linear_cross_entropy"):
        raise UserError(f"train.loss_impl=chunked needs torch >= 2.13 (F.linear_cross_entropy); this is torch "
                        f"{torch.__version__}: upgrade torch or use train.loss_impl=plain")
    if impl == "liger" and device.type != "cuda":
        raise UserError(f"train.loss_impl=liger is Liger-Kernel's CUDA kernel and this run is on {device.type}; use "
                        f"train.loss_impl=chunked (PyTorch's own) there")
    if impl == "liger" and importlib.util.find_spec("liger_kernel") is None:
        raise UserError("train.loss_impl=liger needs Liger-Kernel: pip install 'nlq[liger]' (or liger-kernel)")


def head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, impl: str,
              chunk: int) -> torch.Tensor:
    """Mean cross-entropy of hidden (N, C) @ weight (V, C).T against targets (N,), without storing the (N, V)
    logits: "chunked" is PyTorch's own F.linear_cross_entropy over chunks of rows; "liger" is Liger-Kernel's fused
    kernel (CUDA only; pip install liger-kernel)."""
    check_loss_impl(impl, hidden.device)
    if impl == "chunked":
        return F.linear_cross_entropy(hidden, weight, targets, ignore_index=ignore_index,
                                      options=torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk))
    if impl == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        return LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index)(weight, hidden, targets)
    raise ValueError(f"loss_impl={impl!r} is not one of plain, chunked, liger")


class LayerCache:
    """One layer's keys and values (B, n_kv_head, T, hs) of the tokens seen so far, after QK-norm and rotary."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new tokens' keys and values; returns all of them."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Keys and values of every layer for incremental decoding (generate.py): Transformer.forward(idx, cache=c)
    reads the tokens before idx from c, appends idx's own, and places idx at the positions after them."""

    def __init__(self, n_layer: int):
        self.layers = [LayerCache() for _ in range(n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length

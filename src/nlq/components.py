"""The parts an encoder classifier puts around the Transformer's blocks (model.classes > 0), kept beside model.py so
that it stays one readable Transformer: a patch stem that turns a signal or an image into tokens, and a class head
that turns the tokens into class logits. ViT's recipe, for 1-D signals (MNIST-1D) and 2-D images (digits, CIFAR).
"""

from __future__ import annotations

import torch
from torch import nn

from nlq.config import ModelConfig


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

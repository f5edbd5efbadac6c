"""The research axis: how attention projects its input into queries (and keys, values, output).

Every projection is a small nn.Module mapping (B, T, d) -> (B, T, d) with two class attributes:
- `output_scale`: the factor that turns forward()'s output into the formula's value. The paper computes
  Q = (X + f(X)) / 2 by keeping X + f(X) and halving the softmax scale, 1 / (2 sqrt(hs)); the two are the
  same computation, and folding the 1/2 into the scale saves an elementwise pass. Attention folds it
  into the scale for q and k, and multiplies it in for v and o.
- `query_scale`: an extra softmax-scale factor when the projection computes the query. Only identity
  has one (1/2): the predecessor paper halves the attention scale when it drops W_Q.

Adding a variant = one class + one PROJECTIONS entry + one case in tests/test_projections.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nlq.config import ModelConfig


class ReLU2(nn.Module):
    """Squared ReLU (Primer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


ACTIVATION_MODULES = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "relu2": ReLU2}


class LinearProjection(nn.Module):
    """Q = X W_Q: the standard baseline."""

    output_scale, query_scale = 1.0, 1.0

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight_proj(x)


class IdentityProjection(nn.Module):
    """Q = X, no weights (Karbevski & Mijoski): W_Q is absorbed by the layers that write X.
    The predecessor paper halves the attention scale for this variant."""

    output_scale, query_scale = 1.0, 0.5

    def __init__(self, cfg: ModelConfig):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ResidualProjection(nn.Module):
    """Q = (X + X W_Q) / 2: still linear, a control for the residual form of the method."""

    output_scale, query_scale = 0.5, 1.0

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight_proj(x)


class NonlinearProjection(nn.Module):
    """Q = (X + f(X)) / 2 with f(X) = LayerNorm(act(RMSNorm(X) W1) W2), W1: d x r, W2: r x d.
    With r = d/2 the two matrices hold d^2 weights, the same as W_Q (parameter parity)."""

    output_scale, query_scale = 0.5, 1.0

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, r = cfg.n_embd, cfg.rank
        self.eps = cfg.norm_eps
        self.in_norm_weight = nn.Parameter(torch.ones(d)) if cfg.query_in_norm else None  # RMSNorm's gain g
        self.up = nn.Linear(d, r, bias=cfg.bias)  # W1
        self.act = ACTIVATION_MODULES[cfg.query_activation]()
        self.down = nn.Linear(r, d, bias=cfg.bias)  # W2
        self.out_norm = nn.LayerNorm(d, eps=cfg.norm_eps, bias=False) if cfg.query_out_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_norm_weight is None:
            h = self.up(x)  # (B, T, r)
        else:
            # RMSNorm(X) W1 = (X diag(g) W1) / rms(X): the same numbers without a normalised (B, T, d) copy of X,
            # scaling the r-wide output instead. In eager mode on CPU nn.RMSNorm made the step ~10% slower.
            inv_rms = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.eps)  # (B, T, 1)
            h = F.linear(x, self.up.weight * self.in_norm_weight) * inv_rms  # (B, T, r)
            if self.up.bias is not None:
                h = h + self.up.bias
        f = self.out_norm(self.down(self.act(h)))  # (B, T, d)
        return x + f


PROJECTIONS: dict[str, type[nn.Module]] = {
    "linear": LinearProjection,
    "identity": IdentityProjection,
    "residual": ResidualProjection,
    "nonlinear": NonlinearProjection,
}


def build_projection(name: str, cfg: ModelConfig) -> nn.Module:
    if name not in PROJECTIONS:
        raise ValueError(f"unknown projection {name!r}; valid names: {', '.join(PROJECTIONS)}")
    return PROJECTIONS[name](cfg)

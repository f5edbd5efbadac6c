"""The research axis: how attention projects its input into queries (and keys, values, output).

The projections are plain nn.Modules built from plain arguments (no nlq config needed), so they drop into
any model: `from nlq import NonlinearQuery`. Each maps (..., d) -> (..., d) and has

- `output_scale`: the factor that turns forward()'s output into the formula's value. 1 by default. With
  `fold_half=True` the residual forms return X + f(X) and output_scale is 1/2: the caller folds the 1/2 into
  the softmax scale (1 / (2 sqrt(hs)), as the paper's code does) and saves an elementwise pass. nlq's own
  model builds them that way; attention folds the factor into the scale for q and k and multiplies it in
  for v and o.
- `query_scale`: an extra softmax-scale factor when the projection computes the query. Only identity has
  one (1/2): the predecessor paper halves the attention scale when it drops W_Q.
- `input_weight()` and `finish(x, h)`: the projection split at its first matmul, h = x @ input_weight().T,
  so attention can compute q, k and v with one matmul (X [W_q | W_k | W_v]) and let each projection
  finish its slice. forward(x) == finish(x, x @ input_weight().T) exactly; identity has no weight (None).

Adding a variant to nlq = one class (with `from_config`) + one PROJECTIONS entry + one case in
tests/test_projections.py. A variant of your own, outside nlq: subclass `Projection` (forward and from_config
are all it needs), call `register_projection("name", YourClass)` in a module of yours, and name that module
in NLQ_IMPORT or in a plan's `imports` (nlq.plugins); then `--model.query=name` trains it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
import types
import typing
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nlq.errors import UserError


class ReLU2(nn.Module):
    """Squared ReLU (Primer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


ACTIVATION_MODULES = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "relu2": ReLU2}


def _add_bias(h: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return h if bias is None else h + bias


class Projection(nn.Module):
    """What attention asks of a projection, with defaults for a variant of your own: define forward(x),
    (..., d) -> (..., d), and from_config(cfg) if its constructor takes more than the width d.

    The defaults: output_scale and query_scale 1; no first matmul to share (input_weight() is None), so attention
    calls finish(x, None), which is forward(x).

    Initial weights: by default a projection keeps what its constructor made (a zero-initialised up-projection stays
    zero); the model builds it under torch's generator seeded by (train.seed, its place in the model, e.g.
    blocks.0.attn.q_proj), so a run's start is reproducible and the same on every rank. `default_init = True` asks
    for nlq's init instead: every nn.Linear in it N(0, 0.02), drawn per parameter name from (seed, name), so a
    parameter named like one of the baseline's (LinearProjection's weight_proj.weight) starts equal to it. Both at
    once: `nlq_init = ("weight_proj",)` keeps the projection's own init for everything but these submodules, which get
    nlq's (so its W_Q starts equal to the baseline's while, say, a zero-initialised W_b stays zero)."""

    output_scale, query_scale = 1.0, 1.0
    default_init = False
    nlq_init: tuple[str, ...] = ()  # with default_init False: submodules that get nlq's init all the same
    Options = None  # a dataclass of the keyword arguments model.options may set (--model.options.NAME=VALUE)

    @classmethod
    def from_config(cls, cfg) -> Projection:
        return cls(cfg.n_embd, **cls.read_options(getattr(cfg, "options", None) or {}))

    @classmethod
    def read_options(cls, options: dict) -> dict:
        """model.options as this projection's keyword arguments, each converted to its Options field's type (a
        command line gives text); an unknown name or a bad value is a one-line error naming the valid ones."""
        fields = {f.name: f for f in dataclasses.fields(cls.Options)} if cls.Options else {}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            valid = ", ".join(f"{f.name} ({_type_name(f.type)})" for f in fields.values()) or "none"
            raise UserError(f"model.options.{unknown[0]}: {cls.__qualname__} has no such option; its options: {valid}")
        hints = typing.get_type_hints(cls.Options) if cls.Options else {}
        values = {name: _option_value(f"model.options.{name}", value, hints[name]) for name, value in options.items()}
        if cls.Options:
            try:
                cls.Options(**values)  # the dataclass's own checks (__post_init__), if it has any
            except (TypeError, ValueError) as e:
                raise UserError(f"model.options for {cls.__qualname__}: {str(e).splitlines()[0]}") from None
        return values

    def input_weight(self) -> torch.Tensor | None:
        return None

    def finish(self, x: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        return self(x)


class LinearProjection(Projection):
    """Q = X W_Q: the standard baseline."""

    default_init = True

    def __init__(self, dim: int, bias: bool = False):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=bias)

    @classmethod
    def from_config(cls, cfg) -> LinearProjection:
        return cls(cfg.n_embd, bias=cfg.bias)

    def input_weight(self) -> torch.Tensor:
        return self.weight_proj.weight

    def finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return _add_bias(h, self.weight_proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight_proj(x)


class IdentityProjection(Projection):
    """Q = X, no weights (Karbevski & Mijoski): W_Q is absorbed by the layers that write X.
    The predecessor paper halves the attention scale for this variant."""

    query_scale, default_init = 0.5, True

    @classmethod
    def from_config(cls, cfg) -> IdentityProjection:
        return cls()

    def finish(self, x: torch.Tensor, h: None) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ResidualProjection(Projection):
    """Q = (X + X W_Q) / 2: still linear, a control for the residual form of the method."""

    default_init = True

    def __init__(self, dim: int, bias: bool = False, fold_half: bool = False):
        super().__init__()
        self.weight_proj = nn.Linear(dim, dim, bias=bias)
        self.fold_half = fold_half
        self.output_scale = 0.5 if fold_half else 1.0

    @classmethod
    def from_config(cls, cfg) -> ResidualProjection:
        return cls(cfg.n_embd, bias=cfg.bias, fold_half=True)

    def input_weight(self) -> torch.Tensor:
        return self.weight_proj.weight

    def finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        out = x + _add_bias(h, self.weight_proj.bias)
        return out if self.fold_half else 0.5 * out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, F.linear(x, self.weight_proj.weight))


class NonlinearQuery(Projection):
    """Q = (X + f(X)) / 2 with f(X) = LayerNorm(act(RMSNorm(X) W1) W2), W1: d x r, W2: r x d (Karbevski 2026).

    With r = d/2 (the default) the two matrices hold d^2 weights, the same as the W_Q they replace.
    dim: model width d; rank: bottleneck r; activation: gelu, relu, silu or relu2; in_norm / out_norm:
    RMSNorm before W1 (with a gain) and LayerNorm after W2 (weight, no bias); bias: biases on W1 and W2;
    eps: both norms' epsilon. fold_half=True returns X + f(X) and sets output_scale = 1/2, for callers that
    fold the 1/2 into the softmax scale (multiply their attention scale by output_scale).

    Drop-in use, in place of a query projection q_proj = nn.Linear(d, d, bias=False):
        q_proj = NonlinearQuery(d)              # forward returns (X + f(X)) / 2
    """

    default_init = True

    def __init__(self, dim: int, rank: int | None = None, activation: str = "gelu", in_norm: bool = True,
                 out_norm: bool = True, bias: bool = False, eps: float = 1e-5, fold_half: bool = False):
        super().__init__()
        rank = dim // 2 if rank is None else rank
        if dim < 1 or rank < 1:
            raise ValueError(f"NonlinearQuery needs dim >= 1 and rank >= 1 (got dim={dim}, rank={rank})")
        if activation not in ACTIVATION_MODULES:
            raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATION_MODULES)}")
        self.dim, self.rank, self.eps, self.fold_half = dim, rank, eps, fold_half
        self.output_scale = 0.5 if fold_half else 1.0
        self.in_norm_weight = nn.Parameter(torch.ones(dim)) if in_norm else None  # RMSNorm's gain g
        self.up = nn.Linear(dim, rank, bias=bias)  # W1
        self.act = ACTIVATION_MODULES[activation]()
        self.down = nn.Linear(rank, dim, bias=bias)  # W2
        self.out_norm = nn.LayerNorm(dim, eps=eps, bias=False) if out_norm else nn.Identity()

    @classmethod
    def from_config(cls, cfg) -> NonlinearQuery:
        return cls(cfg.n_embd, cfg.rank, cfg.nonlinear_activation, cfg.nonlinear_in_norm, cfg.nonlinear_out_norm,
                   cfg.bias, cfg.norm_eps, fold_half=True)

    def input_weight(self) -> torch.Tensor:
        # RMSNorm(X) W1 = (X diag(g) W1) / rms(X): the same numbers without a normalised (B, T, d) copy of X;
        # finish() scales the r-wide output instead. In eager mode on CPU nn.RMSNorm made the step ~10% slower.
        return self.up.weight if self.in_norm_weight is None else self.up.weight * self.in_norm_weight  # (r, d)

    def finish(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.in_norm_weight is not None:
            # (B, T, r) / rms(X); the norm is one pass over X with no (B, T, d) temporary, unlike square().mean()
            h = h * torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() / self.dim + self.eps)
        f = self.out_norm(self.down(self.act(_add_bias(h, self.up.bias))))  # (B, T, d)
        return x + f if self.fold_half else 0.5 * (x + f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.finish(x, F.linear(x, self.input_weight()))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, rank={self.rank}, fold_half={self.fold_half}"


PROJECTIONS: dict[str, type[nn.Module]] = {
    "linear": LinearProjection,
    "identity": IdentityProjection,
    "residual": ResidualProjection,
    "nonlinear": NonlinearQuery,
}
BUILT_IN = frozenset(PROJECTIONS)  # nlq's own: what an export ships and what a name of yours may not replace
OWN_HINT = "a projection of your own is registered by a module named in NLQ_IMPORT or in a plan's imports"


def register_projection(name: str, cls: type[nn.Module] | None = None):
    """Make cls trainable as model.query=name (and model.projections.k/v/o=name); without cls, a class decorator
    that does it (`@register_projection("mine")`). Registering a name again replaces the earlier class (a module
    imported twice); nlq's own names cannot be replaced."""
    if cls is None:
        def decorate(cls: type[nn.Module]) -> type[nn.Module]:
            register_projection(name, cls)
            return cls
        return decorate
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
        raise ValueError(f"projection name {name!r}: use lower-case letters, digits, '_' or '-', starting with a "
                         f"letter")
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is one of nlq's own projections ({', '.join(sorted(BUILT_IN))}); register "
                         f"yours under another name")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and callable(getattr(cls, "from_config", None))):
        raise TypeError(f"register_projection({name!r}, ...) needs an nn.Module class with from_config(cfg); "
                        f"subclass nlq.projections.Projection")
    PROJECTIONS[name] = cls


def own_sources(names) -> dict[str, dict]:
    """For each name of a projection of the user's own (not nlq's): its class, file and the file's sha256."""
    out = {}
    for name in sorted(set(names) - BUILT_IN):
        cls = PROJECTIONS[name]
        file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file and Path(file).is_file() else None
        out[name] = {"class": f"{cls.__module__}.{cls.__qualname__}", "file": file, "sha256": digest}
    return out


def _type_name(kind) -> str:
    if _optional_of(kind) is not None:
        return f"{_type_name(_optional_of(kind))} | None"
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def _optional_of(kind):
    """T for `T | None` or `Optional[T]`, else None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return None


def _option_value(key: str, value, kind):
    """value (text from a command line, or a TOML/YAML scalar) as kind: int, float, bool or str, or one of them or
    None (`int | None`, `Optional[int]`: "none" or "null" is None)."""
    inner = _optional_of(kind)
    if inner is not None:
        if value is None or isinstance(value, str) and value.strip().lower() in ("none", "null"):
            return None
        try:
            return _option_value(key, value, inner)
        except UserError:
            raise UserError(f"{key}={value!r} is not a valid {_type_name(kind)} ({inner.__name__} or none)") from None
    if kind is bool and isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    try:
        if kind in (int, float) and not isinstance(value, bool):
            number = kind(value)
            if kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return number
        if kind is str and isinstance(value, str) or kind is bool and isinstance(value, bool):
            return value
    except (TypeError, ValueError):
        pass
    raise UserError(f"{key}={value!r} is not a valid {_type_name(kind)}")


def check_own_code(recorded: dict | None, where: str) -> None:
    """The projections of one's own that `where` was made with ({name: {class, file, sha256}}, as own_sources records
    them) must be the code imported now: a one-line refusal naming the file and both hashes otherwise, since the same
    weights under other code compute something else."""
    for name, before in sorted((recorded or {}).items()):
        if name not in PROJECTIONS or not isinstance(before, dict) or not before.get("sha256"):
            continue  # not imported (a one-line error where it is used) or recorded without a hash
        now = own_sources([name])[name]
        if now["sha256"] != before["sha256"]:
            raise UserError(f"{where} was made with projection {name} from {before.get('file')} (sha256 "
                            f"{before['sha256'][:16]}), and the code imported now, {now['file']}, has sha256 "
                            f"{(now['sha256'] or 'unreadable')[:16]}: restore the file it was made with")


def describe_own() -> list[str]:
    """One line per registered projection of one's own: its name, class and options (for --help)."""
    lines = []
    for name in sorted(set(PROJECTIONS) - BUILT_IN):
        cls = PROJECTIONS[name]
        options = getattr(cls, "Options", None)
        fields = [f"{f.name}: {_type_name(f.type)} = {f.default!r}" for f in dataclasses.fields(options)] if options \
            else []
        lines.append(f"  {name} ({cls.__module__}.{cls.__qualname__}): options " + (", ".join(fields) or "none"))
    return lines


def build_projection(name: str, cfg) -> nn.Module:
    """The projection `name` sized by a ModelConfig (n_embd, bias, norm_eps and the nonlinear_* options). One of the
    user's own is tried on a tiny input at once, so that a wrong one fails here (nlq info, a dry run), not deep in
    training."""
    if name not in PROJECTIONS:
        raise ValueError(f"unknown projection {name!r}; valid names: {', '.join(PROJECTIONS)} ({OWN_HINT})")
    projection = PROJECTIONS[name].from_config(cfg)
    if name not in BUILT_IN:
        check_projection(name, projection, cfg.n_embd)
    return projection


def check_projection(name: str, projection: nn.Module, dim: int) -> None:
    """A projection of the user's own must map (..., dim) to (..., dim) in the input's dtype: a one-line UserError
    naming it and what it returned otherwise."""
    cls = type(projection).__qualname__
    weights = next(projection.parameters(), None)
    x = torch.zeros(1, 2, dim, device=weights.device if weights is not None else None)  # (B, T, C)
    try:
        with torch.no_grad():
            out = projection(x)
    except Exception as e:
        first = str(e).splitlines()[0][:160] if str(e) else ""
        raise UserError(f"projection {name!r} ({cls}) fails on a (1, 2, {dim}) input: {type(e).__name__}: "
                         f"{first}") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, 2, dim) or out.dtype != x.dtype:
        got = f"shape {tuple(out.shape)}, {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"projection {name!r} ({cls}) maps a (1, 2, {dim}) float32 input to {got}; a projection "
                         f"must return (..., n_embd) = (..., {dim}) in its input's dtype")

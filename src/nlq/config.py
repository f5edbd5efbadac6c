"""Typed, validated configuration.

A run is described by four sections (model, data, train, dist). Each is a dataclass validated in
__post_init__, so a bad value fails when the config is built, not deep inside forward(). Every field can be
set from the command line as --section.field=value, or from a YAML/TOML file with the same nesting.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from nlq.errors import UserError


class ConfigError(UserError):
    """A bad config key, type or value."""


ACTIVATIONS = ("gelu", "relu", "silu", "relu2")
MLP_ACTIVATIONS = ("gelu", "gelu_tanh")
ATTN_IMPLS = ("sdpa", "math")
POSITIONS = ("learned", "rope")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(section: str, name: str, value: Any, choices: tuple) -> None:
    _check(value in choices, f"{section}.{name}={value!r} is not valid; choose one of {', '.join(map(str, choices))}")


@dataclass
class ProjectionsConfig:
    """Which projection (projections.py) computes each of Q, K, V and the attention output.
    q=None means model.query, the shorthand for the query."""

    q: str | None = None
    k: str = "linear"
    v: str = "linear"
    o: str = "linear"

    def __post_init__(self) -> None:
        from nlq.projections import PROJECTIONS

        for name in ("q", "k", "v", "o"):
            value = getattr(self, name)
            if value is not None or name != "q":
                _one_of("model.projections", name, value, tuple(PROJECTIONS))


@dataclass
class ModelConfig:
    vocab_size: int = 50304
    block_size: int = 1024  # context length in tokens
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    mlp_ratio: float = 4.0  # MLP hidden width = round(mlp_ratio * n_embd)
    mlp_activation: str = "gelu"  # "gelu" (exact, the paper's) or "gelu_tanh" (GPT-2's approximation)
    causal: bool = True  # True: decoder (GPT); False: bidirectional encoder
    bias: bool = False
    dropout: float = 0.0
    tie_embeddings: bool = True
    # The research axis: how the attention query is projected (see projections.py).
    query: str = "linear"
    query_rank: int | None = None  # bottleneck r of the nonlinear query; None means n_embd // 2
    query_activation: str = "gelu"
    query_in_norm: bool = True  # RMSNorm before W1
    query_out_norm: bool = True  # LayerNorm after W2
    projections: ProjectionsConfig = field(default_factory=ProjectionsConfig)  # per-placement choice (q, k, v, o)
    attn_scale: float | None = None  # explicit softmax scale; None: see Attention in model.py
    attn_impl: str = "sdpa"  # "sdpa" (fused kernels) or "math" (explicit softmax(QK^T)V)
    norm_eps: float = 1e-5
    # LLaMA-style options, usable with any projection
    qk_norm: bool = False  # per-head RMSNorm on q and k before the dot product
    position: str = "learned"  # "learned" absolute positions or "rope" (rotary, no position embedding)
    rope_theta: float = 10000.0
    n_kv_head: int | None = None  # grouped-query attention: key/value heads; None means n_head

    def __post_init__(self) -> None:
        from nlq.projections import PROJECTIONS

        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            _check(value > 0, f"model.{name}={value} must be a positive integer")
        _check(
            self.n_embd % self.n_head == 0,
            f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; "
            f"pick n_embd a multiple of n_head",
        )
        _check(self.mlp_ratio > 0 and self.mlp_hidden >= 1,
               f"model.mlp_ratio={self.mlp_ratio} gives an MLP of {self.mlp_hidden} hidden units at n_embd={self.n_embd}; "
               f"use a ratio of at least {1 / self.n_embd:.3g}")
        _one_of("model", "mlp_activation", self.mlp_activation, MLP_ACTIVATIONS)
        _check(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout} must be in [0, 1)")
        _one_of("model", "query", self.query, tuple(PROJECTIONS))
        _check(self.query_rank is None or self.query_rank > 0, f"model.query_rank={self.query_rank} must be > 0")
        _one_of("model", "query_activation", self.query_activation, ACTIVATIONS)
        _check(self.attn_scale is None or self.attn_scale > 0, f"model.attn_scale={self.attn_scale} must be > 0")
        _one_of("model", "attn_impl", self.attn_impl, ATTN_IMPLS)
        _check(self.norm_eps > 0, f"model.norm_eps={self.norm_eps} must be > 0")
        _one_of("model", "position", self.position, POSITIONS)
        _check(self.rope_theta > 0, f"model.rope_theta={self.rope_theta} must be > 0 (RoPE's base wavelength, e.g. 10000)")
        _check(self.position != "rope" or self.head_size % 2 == 0,
               f"model.position=rope needs an even head size (n_embd / n_head = {self.head_size})")
        kv = self.kv_heads
        _check(kv > 0 and self.n_head % kv == 0,
               f"model.n_kv_head={self.n_kv_head} must divide model.n_head={self.n_head}")
        _check(kv == self.n_head or (self.projections.k == "linear" and self.projections.v == "linear"),
               f"model.n_kv_head={self.n_kv_head} (grouped-query attention) needs linear key and value projections")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_hidden(self) -> int:
        return int(round(self.mlp_ratio * self.n_embd))

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head if self.n_kv_head is not None else self.n_head

    @property
    def placements(self) -> dict[str, str]:
        """The projection name of each placement, with model.query standing for q."""
        p = self.projections
        return {"q": p.q or self.query, "k": p.k, "v": p.v, "o": p.o}

    @property
    def rank(self) -> int:
        return self.query_rank if self.query_rank is not None else self.n_embd // 2


@dataclass
class DataConfig:
    dir: str = ""  # prepared data directory (nlq prepare); --data sets it
    batch_mode: str = "random"  # "random": windows with replacement (the paper); "epoch": shuffled, non-overlapping
    eval_windows: int = 64  # size of the fixed eval set, in context windows
    eval_seed: int = 2357  # the eval windows depend on this alone, so every run sees the same ones
    # "full": the final step is also scored on the whole val split (every non-overlapping window), recorded as
    # full_val_loss (and full_val_bpb, full_val_tokens) beside the fixed windows' val_loss
    final_eval: str = "windows"
    # A synthetic task generated on the fly instead of token shards (data/tasks.py): mqar, lookup, selective-copy
    task: str = ""
    task_vocab: int = 64  # keys and values each (mqar, lookup: a square), or data tokens (selective-copy)
    task_pairs: int = 8  # stored key-value pairs, or tokens to copy

    def __post_init__(self) -> None:
        _one_of("data", "batch_mode", self.batch_mode, ("random", "epoch"))
        _one_of("data", "task", self.task, ("", "mqar", "lookup", "selective-copy"))
        _check(self.eval_windows > 0, f"data.eval_windows={self.eval_windows} must be > 0")
        _one_of("data", "final_eval", self.final_eval, ("windows", "full"))
        _check(not (self.task and self.final_eval == "full"),
               f"data.final_eval=full scores a prepared val split, and data.task={self.task} has none; use windows")


@dataclass
class TrainConfig:
    seed: int = 1337  # model init, dropout and the training batch plan
    max_steps: int = 1000
    batch_size: int = 8  # micro-batch rows per process and forward pass
    batch_tokens: int | None = None  # global batch in tokens; None: batch_size * block_size (no accumulation)
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_steps: int = 100
    schedule: str = "cosine"  # "cosine" or "wsd" (warmup-stable-decay); training/schedule.py
    decay_steps: int | None = None  # step at which the schedule reaches min_lr; None: max_steps
    cooldown_fraction: float = 0.2  # wsd: share of decay_steps spent cooling down (1 - sqrt) to min_lr
    resume_from: str | None = None  # start a new run from another run's checkpoint (weights, optimizer, step)
    init_from: str | None = None  # start from weights only (an nlq run or checkpoint, or a Hugging Face GPT-2
    # directory); a fresh optimizer at step 0. Projections that differ from the source's start fresh.
    weight_decay: float = 0.1  # applied to >= 2-D parameters only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    eval_every: int = 100
    checkpoint_every: int = 0  # 0: only at the end
    keep_checkpoints: int = 2
    log_every: int = 10
    device: str = "auto"  # auto: cuda when present, else cpu
    dtype: str = "auto"  # auto: bfloat16 autocast on cuda, float32 on cpu
    compile: bool = False
    peak_tflops: float | None = None  # for the MFU estimate; None: known GPUs only
    tensorboard: bool = False
    wandb: bool = False
    objective: str = "clm"  # "clm": next-token prediction (causal); "mlm": BERT-style masked LM (encoder)
    mask_prob: float = 0.15  # mlm: share of positions chosen (80% mask token, 10% random, 10% unchanged)

    def __post_init__(self) -> None:
        _one_of("train", "objective", self.objective, ("clm", "mlm"))
        _check(0 < self.mask_prob < 1, f"train.mask_prob={self.mask_prob} must be in (0, 1)")
        _check(0 <= self.seed < 2**63, f"train.seed={self.seed} must be a non-negative integer")
        for name in ("max_steps", "batch_size", "eval_every", "log_every", "keep_checkpoints"):
            value = getattr(self, name)
            _check(value > 0, f"train.{name}={value} must be a positive integer")
        _check(self.batch_tokens is None or self.batch_tokens > 0, f"train.batch_tokens={self.batch_tokens} must be > 0")
        _check(self.lr > 0, f"train.lr={self.lr} must be > 0")
        _check(0 <= self.min_lr <= self.lr, f"train.min_lr={self.min_lr} must be in [0, train.lr={self.lr}]")
        _check(self.warmup_steps >= 0, f"train.warmup_steps={self.warmup_steps} must be >= 0")
        _check(self.decay_steps is None or self.decay_steps > 0, f"train.decay_steps={self.decay_steps} must be > 0")
        _one_of("train", "schedule", self.schedule, ("cosine", "wsd"))
        _check(0 < self.cooldown_fraction <= 1, f"train.cooldown_fraction={self.cooldown_fraction} must be in (0, 1]")
        _check(self.weight_decay >= 0, f"train.weight_decay={self.weight_decay} must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "train.beta1/beta2 must be in [0, 1)")
        _check(self.grad_clip >= 0, f"train.grad_clip={self.grad_clip} must be >= 0")
        _check(self.checkpoint_every >= 0, f"train.checkpoint_every={self.checkpoint_every} must be >= 0")
        _check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
            f"train.device={self.device!r} is not valid; use auto, cpu, cuda or cuda:N",
        )
        _one_of("train", "dtype", self.dtype, ("auto", "float32", "bfloat16"))


@dataclass
class DistConfig:
    strategy: str = "ddp"  # used when torchrun starts more than one process: ddp or fsdp (FSDP2 fully_shard)
    nproc: int = 1  # studies: start each run with torchrun --nproc_per_node=nproc
    backend: str = "auto"  # auto: nccl on cuda, gloo on cpu
    timeout_s: int = 300  # a collective that waits longer fails instead of hanging

    def __post_init__(self) -> None:
        _one_of("dist", "strategy", self.strategy, ("ddp", "fsdp"))
        _check(self.nproc > 0, f"dist.nproc={self.nproc} must be > 0")
        _one_of("dist", "backend", self.backend, ("auto", "gloo", "nccl"))
        _check(self.timeout_s > 0, f"dist.timeout_s={self.timeout_s} must be > 0")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def __post_init__(self) -> None:
        if self.train.objective == "mlm" and self.model.causal:
            raise ConfigError("train.objective=mlm needs a bidirectional encoder: set --model.causal=false")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> RunConfig:
        return update(cls(), raw)

    def save(self, path: Path) -> None:
        tmp = Path(path).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Read a config from .json, .yaml/.yml or .toml; nested as {section: {field: value}}."""
        return cls.from_dict(read_config_file(path))


def read_config_file(path: str | Path) -> dict:
    """The raw {section: {field: value}} of a .json, .yaml/.yml or .toml file: only the fields it sets, so it
    layers over a preset (or a run's own config) without resetting anything else."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(f"config file {path} must end in .yaml, .yml, .toml or .json")
    except ConfigError:
        raise
    except Exception as e:  # a parse error in the user's file
        raise ConfigError(f"cannot parse config file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections (model, data, train, dist)")
    return raw


SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))


def field_choices() -> dict[str, tuple]:
    """The fixed choices of fields that have them, for help texts."""
    from nlq.projections import PROJECTIONS

    names = tuple(PROJECTIONS)
    return {"model.query": names, "model.projections.q": names, "model.projections.k": names,
            "model.projections.v": names, "model.projections.o": names, "model.query_activation": ACTIVATIONS,
            "model.mlp_activation": MLP_ACTIVATIONS, "model.attn_impl": ATTN_IMPLS, "model.position": POSITIONS,
            "data.batch_mode": ("random", "epoch"), "data.task": ("", "mqar", "lookup", "selective-copy"),
            "train.dtype": ("auto", "float32", "bfloat16"),
            "train.objective": ("clm", "mlm"), "train.schedule": ("cosine", "wsd"), "dist.strategy": ("ddp", "fsdp"),
            "dist.backend": ("auto", "gloo", "nccl")}


def describe_fields(config: RunConfig | None = None) -> list[str]:
    """One line per config field: --section.field=TYPE, its default (or the given config's value), choices."""
    config = config or RunConfig()
    choices, lines = field_choices(), []

    def visit(obj, prefix: str) -> None:
        hints = _field_types(type(obj))
        for f in dataclasses.fields(obj):
            key, value = f"{prefix}.{f.name}", getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                visit(value, key)
                continue
            kind = " | ".join(a.__name__ for a in typing.get_args(hints[f.name])) or hints[f.name].__name__
            extra = f"; choices: {', '.join(map(str, choices[key]))}" if key in choices else ""
            lines.append(f"  --{key}={kind.upper().replace('NONETYPE', 'none')}  (default {value!r}{extra})")

    for section in SECTIONS:
        visit(getattr(config, section), section)
    return lines


def _field_types(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def _convert(key: str, value: Any, annotation: Any) -> Any:
    """Convert a raw value (a command-line string, or a YAML/TOML scalar) to the field's declared type."""
    args = typing.get_args(annotation)
    optional = (typing.get_origin(annotation) in (typing.Union, types.UnionType)) and type(None) in args
    if optional:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        annotation = next(a for a in args if a is not type(None))
    expected = annotation.__name__
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                try:  # allow 1e6 when it is a whole number
                    number = float(value)
                    if number.is_integer():
                        return int(number)
                except ValueError:
                    pass
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)  # YAML's .inf and .nan are as wrong as the command line's
        if isinstance(value, str):
            try:
                number = float(value)
                if math.isfinite(number):
                    return number
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{key}={value!r} is not a valid {expected}")


def _update_section(current: Any, values: dict, prefix: str) -> Any:
    """A copy of one config dataclass with values applied; nested dataclasses (model.projections) recurse."""
    if not isinstance(values, dict):
        raise ConfigError(f"config section {prefix!r} must be a mapping of field: value")
    types_ = _field_types(type(current))
    changes = {}
    for name, value in values.items():
        if name not in types_:
            raise ConfigError(f"unknown config key {prefix}.{name}; valid keys in {prefix}: {', '.join(types_)}")
        if dataclasses.is_dataclass(types_[name]):
            changes[name] = _update_section(getattr(current, name), value, f"{prefix}.{name}")
        else:
            changes[name] = _convert(f"{prefix}.{name}", value, types_[name])
    return dataclasses.replace(current, **changes)


def update(config: RunConfig, raw: dict) -> RunConfig:
    """A copy of config with the nested {section: {field: value}} values applied and validated."""
    sections = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r}; valid sections: {', '.join(SECTIONS)}")
        sections[section] = _update_section(getattr(config, section), values, section)
    return dataclasses.replace(config, **sections)


def parse_overrides(args: list[str]) -> dict:
    """Turn ["--train.lr=1e-3", "--model.projections.k=nonlinear"] into
    {"train": {"lr": "1e-3"}, "model": {"projections": {"k": "nonlinear"}}}."""
    raw: dict = {}
    for arg in args:
        body = arg[2:] if arg.startswith("--") else arg
        key, sep, value = body.partition("=")
        path = key.split(".")
        if not arg.startswith("--") or not sep or len(path) < 2 or not all(path):
            raise ConfigError(f"cannot read argument {arg!r}; overrides look like --section.field=value")
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"argument {arg!r} sets a field inside {'.'.join(path[:-1])}, which is a value")
        node[path[-1]] = value
    return raw


def apply_overrides(config: RunConfig, args: list[str]) -> RunConfig:
    return update(config, parse_overrides(args))

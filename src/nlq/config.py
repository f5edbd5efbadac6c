"""Typed, validated configuration.

A run is described by four sections (model, data, train, dist). Each is a dataclass validated in
__post_init__, so a bad value fails when the config is built, not deep inside forward(). A field with a fixed
set of values declares it once, as its Literal type; the projection and activation names come from the
registries in projections.py. `update` applies nested {section: {field: value}} values with type conversion;
overrides.py reads them from files and from --section.field=value arguments. Every field carries its help text
(`setting`), which `nlq train --help` prints.

The machinery of a typed field (its help, choices, conversion) is fields.py. A renamed field's old name is still
read (fields.RENAMED). lines: every section's fields and checks stay in this one file, which an export ships beside the
model (nlq_config.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from nlq.errors import ConfigError, UserError
from nlq.fields import RENAMED, convert_value, field_types, literal_choices, renamed, setting, short_repr
from nlq.projections import ACTIVATION_MODULES, BUILT_IN, OWN_HINT, PROJECTIONS

BUILT_IN_SORTED = sorted(BUILT_IN)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _one_of(section: str, name: str, value: Any, choices: tuple, hint: str = "") -> None:
    _check(value in choices, f"{section}.{name}={value!r} is not valid; choose one of {', '.join(map(str, choices))}"
                             + (f" ({hint})" if hint else ""))


def _check_literals(section: Any, prefix: str) -> None:
    """Every Literal-typed field of a section holds one of its values."""
    hints = field_types(type(section))
    for f in dataclasses.fields(section):
        choices = literal_choices(hints[f.name])
        if choices is not None:
            _one_of(prefix, f.name, getattr(section, f.name), choices)


@dataclass
class ProjectionsConfig:
    """Which projection (projections.py) computes Q, K, V and the output; q is model.query's other name (read into
    it)."""

    q: str | None = setting(None, "the query's projection: model.query's other name, read into it")
    k: str = setting("linear", "the key projection (projections.py)")
    v: str = setting("linear", "the value projection")
    o: str = setting("linear", "the attention output projection")

    def __post_init__(self) -> None:
        for name in ("q", "k", "v", "o"):
            value = getattr(self, name)
            if value is not None or name != "q":
                _one_of("model.projections", name, value, tuple(PROJECTIONS), OWN_HINT)


@dataclass
class ModelConfig:
    vocab_size: int = setting(50304, "token embeddings and LM-head rows; at least the tokenizer's vocabulary")
    block_size: int = setting(1024, "context length in tokens")
    n_layer: int = setting(12, "transformer blocks")
    n_head: int = setting(12, "attention heads (query heads with n_kv_head)")
    n_embd: int = setting(768, "model width d")
    mlp_ratio: float = setting(4.0, "MLP hidden width = round(mlp_ratio * n_embd)")
    mlp_activation: Literal["gelu", "gelu_tanh"] = setting("gelu", "exact GELU (the paper's) or GPT-2's tanh form")
    causal: bool = setting(True, "True: decoder (GPT); False: bidirectional encoder")
    bias: bool = setting(False, "biases in the attention, MLP and LayerNorm layers")
    dropout: float = setting(0.0, "dropout on attention weights, residual branches and embeddings")
    tie_embeddings: bool = setting(True, "the LM head shares the token embedding matrix")
    # The research axis: how the attention query is projected (projections.py, docs/PROJECTIONS.md).
    query: str = setting("linear", "the query projection: linear (X W_Q), identity, residual, nonlinear ((X + f(X))/2)")
    # nlq's nonlinear projection, wherever it sits (q, k, v or o); formerly model.query_* (RENAMED)
    nonlinear_rank: int | None = setting(None, "bottleneck r of the nonlinear projection; None: n_embd // 2 (d^2 "
                                               "parameters)")
    nonlinear_activation: str = setting("gelu", "the nonlinear projection's activation")
    nonlinear_in_norm: bool = setting(True, "nonlinear projection: RMSNorm before W1")
    nonlinear_out_norm: bool = setting(True, "nonlinear projection: LayerNorm after W2")
    options: dict = setting(dict, "options of a projection of your own, e.g. --model.options.rank=4 (its Options "
                                  "dataclass says which; docs/PROJECTIONS.md)")
    projections: ProjectionsConfig = setting(ProjectionsConfig, "per-placement projections (q, k, v, o)")
    attn_scale: float | None = setting(None, "explicit softmax scale; None: 1/sqrt(head size) (Attention in model.py)")
    attn_impl: Literal["sdpa", "math"] = setting("sdpa", "fused SDPA kernels, or the explicit softmax(QK^T)V")
    norm_eps: float = setting(1e-5, "epsilon of every LayerNorm/RMSNorm")
    qk_norm: bool = setting(False, "per-head RMSNorm on q and k before the dot product (LLaMA-style option)")
    position: Literal["learned", "rope"] = setting("learned", "learned absolute positions, or rotary (RoPE)")
    rope_theta: float = setting(10000.0, "RoPE's base wavelength")
    n_kv_head: int | None = setting(None, "grouped-query attention: key/value heads; None: n_head")
    classes: int = setting(0, "0: a language model (tokens in, next or masked token out); N > 0: an encoder "
                              "classifier of N classes on signals or images (a patch stem in, a class head out)")
    input_dims: Literal[1, 2] = setting(1, "classifier input: 1, signals (length, channels); 2, square images "
                                           "(channels, side, side)")
    input_size: int = setting(40, "classifier input: the signal length, or the image side")
    in_channels: int = setting(1, "classifier input: channels per sample or pixel")
    patch_size: int = setting(4, "classifier stem: samples (or pixels per side) per patch; one token per patch")
    pool: Literal["cls", "mean"] = setting("cls", "classifier head reads a class token, or the mean of the tokens")
    attn_gate: Literal["none", "elementwise", "headwise"] = setting(
        "none", "output gate (Qiu et al. 2025, Qwen3-Next): the attention output times sigmoid(X W_g) before W_O, X "
                "the block's normalised input; elementwise: W_g d x d, headwise: d x n_head (one gate per head)")
    attention: Literal["softmax", "differential"] = setting(
        "softmax", "differential (Ye et al. 2025): heads h and h + n_head/2 form one head, softmax_1 - lambda "
                   "softmax_2 over values of twice the width, RMS-normalised and scaled by 1 - lambda_init")
    attn_out_norm: bool = setting(False, "the differential head's norm on ordinary softmax attention: each head's "
                                         "output RMS-normalised and scaled by 1 - lambda_init (a control)")

    def __post_init__(self) -> None:
        if not isinstance(self.projections, ProjectionsConfig):  # ModelConfig(**config_json["model"]): a plain dict
            raise ConfigError("model.projections is a dict, not a ProjectionsConfig: build a run's config from its "
                              "config.json with RunConfig.from_dict(json.load(f)) (its .model is the ModelConfig)")
        if self.projections.q is not None:  # one name per field: model.projections.q is read as model.query
            self.query, self.projections = self.projections.q, dataclasses.replace(self.projections, q=None)
        _check_literals(self, "model")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            _check(value > 0, f"model.{name}={value} must be a positive integer")
        _check(
            self.n_embd % self.n_head == 0,
            f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; "
            f"pick n_embd a multiple of n_head",
        )
        _check(self.mlp_ratio > 0 and self.mlp_hidden >= 1,
               f"model.mlp_ratio={self.mlp_ratio} gives an MLP of {self.mlp_hidden} hidden units at "
               f"n_embd={self.n_embd}; "
               f"use a ratio of at least {1 / self.n_embd:.3g}")
        _check(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout} must be in [0, 1)")
        _one_of("model", "query", self.query, tuple(PROJECTIONS), OWN_HINT)
        if self.classes:
            self._check_classifier()
        own = sorted(set(self.placements.values()) - BUILT_IN)
        _check(not self.options or own, f"model.options={short_repr(self.options)} sets options of a projection of "
                                        f"your own, and this model uses nlq's own only ({', '.join(BUILT_IN_SORTED)})")
        if self.options and own and hasattr(PROJECTIONS[own[0]], "read_options"):  # typed as its Options declares
            try:  # them, so that config.json records 4, not '4'
                self.options = PROJECTIONS[own[0]].read_options(self.options)
            except UserError as e:
                raise ConfigError(str(e)) from None
        _check(self.nonlinear_rank is None or self.nonlinear_rank > 0,
               f"model.nonlinear_rank={self.nonlinear_rank} must be > 0")
        _check(self.nonlinear_rank is None or "nonlinear" in self.placements.values(),
               f"model.nonlinear_rank={self.nonlinear_rank} sizes nlq's nonlinear projection, which this model does "
               f"not use ({', '.join(f'{k}={v}' for k, v in self.placements.items())}); a projection of your own takes "
               f"its options as --model.options.NAME=VALUE")
        _one_of("model", "nonlinear_activation", self.nonlinear_activation, tuple(ACTIVATION_MODULES))
        _check(self.attn_scale is None or self.attn_scale > 0, f"model.attn_scale={self.attn_scale} must be > 0")
        _check(self.norm_eps > 0, f"model.norm_eps={self.norm_eps} must be > 0")
        _check(self.rope_theta > 0,
               f"model.rope_theta={self.rope_theta} must be > 0 (RoPE's base wavelength, e.g. 10000)")
        _check(self.position != "rope" or self.head_size % 2 == 0,
               f"model.position=rope needs an even head size (n_embd / n_head = {self.head_size})")
        kv = self.kv_heads
        _check(kv > 0 and self.n_head % kv == 0,
               f"model.n_kv_head={self.n_kv_head} must divide model.n_head={self.n_head}")
        _check(kv == self.n_head or (self.projections.k == "linear" and self.projections.v == "linear"),
               f"model.n_kv_head={self.n_kv_head} (grouped-query attention) needs linear key and value projections")
        if self.attention == "differential":
            _check(self.n_head % 2 == 0 and kv % 2 == 0, "model.attention=differential pairs heads h and h + "
                   f"n_head/2: it needs an even n_head and n_kv_head (got {self.n_head} and {kv})")
            _check(self.attn_gate == "none" and not self.attn_out_norm, "model.attention=differential has its own "
                   "output norm; leave model.attn_gate=none and model.attn_out_norm=false")

    def _check_classifier(self) -> None:
        _check(self.classes > 1, f"model.classes={self.classes}: a classifier needs at least 2 classes (0: a language "
                                 f"model)")
        _check(not self.causal, "model.classes > 0 is an encoder classifier: set --model.causal=false")
        for name in ("input_size", "in_channels", "patch_size"):
            _check(getattr(self, name) > 0, f"model.{name}={getattr(self, name)} must be a positive integer")
        _check(self.input_size % self.patch_size == 0,
               f"model.input_size={self.input_size} is not a multiple of model.patch_size={self.patch_size}")
        _check(self.block_size == self.stem_tokens,
               f"model.block_size={self.block_size}, and the stem makes {self.stem_tokens} tokens "
               f"({self.input_size // self.patch_size}^{self.input_dims} patches"
               + (" + a class token" if self.pool == "cls" else "") + f"): set --model.block_size={self.stem_tokens}")

    @property
    def stem_tokens(self) -> int:
        """The tokens a classifier's patch stem makes: one per patch, and the class token."""
        return (self.input_size // self.patch_size) ** self.input_dims + (self.pool == "cls")

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
        return self.nonlinear_rank if self.nonlinear_rank is not None else self.n_embd // 2

    def approx_parameters(self) -> int:
        """About how many parameters the model has, in closed form (nothing is built): embeddings, and per block
        four d x d attention projections (a nonlinear one of any rank counted as d x 2r) and the MLP."""
        d = self.n_embd
        positions = self.block_size * d if self.position == "learned" else 0
        embeddings = self.vocab_size * d * (1 if self.tie_embeddings else 2) + positions
        attention = 3 * d * d + max(d * d, 2 * d * self.rank) + d * self.gate_width
        attention += 4 * self.head_size * (self.attention == "differential")  # the lambda vectors
        return embeddings + self.n_layer * (attention + 2 * d * self.mlp_hidden)

    @property
    def gate_width(self) -> int:
        """Output units of the attention output gate's W_g: d (elementwise), n_head (headwise), 0 (none)."""
        return {"none": 0, "elementwise": self.n_embd, "headwise": self.n_head}[self.attn_gate]


@dataclass
class DataConfig:
    dir: str = setting("", "prepared data directory (nlq prepare); --data sets it")
    batch_mode: Literal["random", "epoch"] = setting("random", "windows drawn with replacement (the paper's), or "
                                                               "shuffled epochs")
    eval_windows: int = setting(64, "size of the fixed eval set, in context windows")
    eval_seed: int = setting(2357, "the eval windows depend on this alone, so every run sees the same ones")
    final_eval: Literal["windows", "full"] = setting("windows", "full: the final step is also scored on the whole val "
                                                     "split, recorded as full_val_loss")
    task: Literal["", "mqar", "lookup", "selective-copy"] = setting("", "a synthetic task generated on the fly "
                                                                    "(data/tasks.py) instead of token shards")
    task_vocab: int = setting(64, "task keys and values each (mqar, lookup), or data tokens (selective-copy)")
    task_pairs: int = setting(8, "task: stored key-value pairs, or tokens to copy")
    split: Literal["fixed", "seed"] = setting("fixed", "labelled examples: the prepared train/test split, or seed: "
                                                       "all of them split again, stratified, by train.seed (the arms "
                                                       "of a pair share it; summary.json records its hash)")

    def __post_init__(self) -> None:
        _check_literals(self, "data")
        _check(self.eval_windows > 0, f"data.eval_windows={self.eval_windows} must be > 0")
        _check(not (self.task and self.split == "seed"),
               f"data.split=seed re-splits prepared labelled examples, and data.task={self.task} has none; use fixed")
        _check(not (self.task and self.final_eval == "full"),
               f"data.final_eval=full scores a prepared val split, and data.task={self.task} has none; use windows")


@dataclass
class TrainConfig:
    seed: int = setting(1337, "model init (per parameter name), dropout and the training batch plan")
    max_steps: int = setting(1000, "optimizer steps")
    batch_size: int = setting(8, "micro-batch rows per process and forward pass")
    batch_tokens: int | None = setting(None, "global batch in tokens; None: batch_size * block_size (no accumulation)")
    lr: float = setting(6e-4, "peak learning rate")
    min_lr: float = setting(6e-5, "learning rate at the end of the decay")
    warmup_steps: int = setting(100, "linear warmup steps from 0 to lr")
    schedule: Literal["cosine", "wsd"] = setting("cosine",
                                                 "cosine decay, or warmup-stable-decay (schedule.py)")
    decay_steps: int | None = setting(None, "step at which the schedule reaches min_lr; None: max_steps")
    cooldown_fraction: float = setting(0.2, "wsd: share of decay_steps spent cooling down (1 - sqrt) to min_lr")
    resume_from: str | None = setting(None, "start a new run from another run's checkpoint (weights, optimizer, step)")
    init_from: str | None = setting(None, "start from weights only (an nlq run or checkpoint, or a Hugging Face GPT-2 "
                                          "directory) with a fresh optimizer; differing projections start fresh")
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay, on >= 2-D parameters only")
    beta1: float = setting(0.9, "AdamW beta1")
    beta2: float = setting(0.95, "AdamW beta2")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this; 0 disables clipping")
    eval_every: int = setting(100, "steps between evaluations on the fixed val windows")
    checkpoint_every: int = setting(0, "steps between checkpoints; 0: only at the end")
    checkpoint_at_start: bool = setting(False, "also write a checkpoint of the initial weights (step 0), e.g. to "
                                               "check a projection's init against the baseline's")
    keep_checkpoints: int = setting(2, "newest checkpoints kept in the run directory")
    log_every: int = setting(10, "steps between train-loss lines in metrics.jsonl")
    diagnostics_every: int = setting(100, "language models: steps between induction diagnostics in metrics.jsonl "
                                          "(training/diagnostics.py; they never change training); 0: off")
    device: str = setting("auto", "auto (cuda when present, else cpu), cpu, cuda, cuda:N or mps")
    dtype: Literal["auto", "float32", "bfloat16"] = setting("auto", "auto: bfloat16 autocast on cuda, float32 on cpu")
    compile: bool = setting(False, "torch.compile the model")
    threads: int = setting(0, "CPU threads: 0 picks them by the step's size and the machine's load (training/"
                              "hardware.py; OMP_NUM_THREADS, when set, is kept), N > 0 exactly N")
    peak_tflops: float | None = setting(None, "peak TFLOP/s for the MFU estimate; None: known GPUs only")
    tensorboard: bool = setting(False, "also log to TensorBoard (RUN/tensorboard)")
    wandb: bool = setting(False, "also log to Weights & Biases")
    objective: Literal["clm", "mlm", "classify"] = setting("clm", "next-token prediction (causal), BERT-style masked "
                                                                  "LM, or one class per example (model.classes)")
    mask_prob: float = setting(0.15, "mlm: share of positions chosen (80% mask token, 10% random, 10% unchanged)")
    loss_impl: Literal["auto", "plain", "chunked", "liger"] = setting(
        "auto", "the LM head's training loss: plain (builds the logits), chunked (F.linear_cross_entropy), liger "
                "(Liger-Kernel, CUDA), auto (chunked on CPU; plain on GPUs and for tasks)")
    loss_chunk: int = setting(512, "chunked: rows of the (batch x context) hidden states per chunk")

    def __post_init__(self) -> None:
        _check_literals(self, "train")
        _check(0 < self.mask_prob < 1, f"train.mask_prob={self.mask_prob} must be in (0, 1)")
        _check(0 <= self.seed < 2**63, f"train.seed={self.seed} must be a non-negative integer")
        for name in ("max_steps", "batch_size", "eval_every", "log_every", "keep_checkpoints", "loss_chunk"):
            value = getattr(self, name)
            _check(value > 0, f"train.{name}={value} must be a positive integer")
        _check(self.batch_tokens is None or self.batch_tokens > 0,
               f"train.batch_tokens={self.batch_tokens} must be > 0")
        _check(self.lr > 0, f"train.lr={self.lr} must be > 0")
        _check(0 <= self.min_lr <= self.lr, f"train.min_lr={self.min_lr} must be in [0, train.lr={self.lr}]")
        _check(self.warmup_steps >= 0, f"train.warmup_steps={self.warmup_steps} must be >= 0")
        _check(self.decay_steps is None or self.decay_steps > 0, f"train.decay_steps={self.decay_steps} must be > 0")
        _check(0 < self.cooldown_fraction <= 1, f"train.cooldown_fraction={self.cooldown_fraction} must be in (0, 1]")
        _check(self.weight_decay >= 0, f"train.weight_decay={self.weight_decay} must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "train.beta1/beta2 must be in [0, 1)")
        _check(self.grad_clip >= 0, f"train.grad_clip={self.grad_clip} must be >= 0")
        _check(self.diagnostics_every >= 0, f"train.diagnostics_every={self.diagnostics_every} must be >= 0 (0: off)")
        _check(self.checkpoint_every >= 0, f"train.checkpoint_every={self.checkpoint_every} must be >= 0")
        _check(self.threads >= 0, f"train.threads={self.threads} must be >= 0 (0: chosen by the work and the load)")
        _check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda", "mps"),
            f"train.device={self.device!r} is not valid; use auto, cpu, cuda or cuda:N",
        )


@dataclass
class DistConfig:
    strategy: Literal["ddp", "fsdp"] = setting("ddp", "when torchrun starts more than one process: DDP, or FSDP2 "
                                                      "fully_shard")
    nproc: int = setting(1, "studies: start each run with torchrun --nproc_per_node=nproc")
    backend: Literal["auto", "gloo", "nccl"] = setting("auto", "process-group backend; auto: nccl on cuda, gloo on cpu")
    timeout_s: int = setting(300, "a collective that waits longer fails instead of hanging")

    def __post_init__(self) -> None:
        _check_literals(self, "dist")
        _check(self.nproc > 0, f"dist.nproc={self.nproc} must be > 0")
        _check(self.timeout_s > 0, f"dist.timeout_s={self.timeout_s} must be > 0")


@dataclass
class RunConfig:
    model: ModelConfig = setting(ModelConfig, "the network")
    data: DataConfig = setting(DataConfig, "what it reads")
    train: TrainConfig = setting(TrainConfig, "the optimizer, schedule, loop and logging")
    dist: DistConfig = setting(DistConfig, "multi-process training (torchrun)")

    def __post_init__(self) -> None:
        if self.train.objective == "mlm" and self.model.causal:
            raise ConfigError("train.objective=mlm needs a bidirectional encoder: set --model.causal=false")
        if (self.train.objective == "classify") != (self.model.classes > 0):
            raise ConfigError(f"train.objective={self.train.objective} and model.classes={self.model.classes}: a "
                              f"classifier is --train.objective=classify with --model.classes=N (N > 1), a language "
                              f"model neither")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> RunConfig:
        return update(cls(), raw)


SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))

def _update_section(current: Any, values: dict, prefix: str) -> Any:
    """A copy of one config dataclass with values applied; nested dataclasses (model.projections) recurse."""
    if not isinstance(values, dict):
        raise ConfigError(f"config section {prefix!r} must be a mapping of field: value")
    types_ = field_types(type(current))
    changes = {}
    for name, value in renamed(values, prefix).items():
        if name not in types_:
            raise ConfigError(f"unknown config key {prefix}.{name}; valid keys in {prefix}: {', '.join(types_)}")
        if dataclasses.is_dataclass(types_[name]):
            changes[name] = _update_section(getattr(current, name), value, f"{prefix}.{name}")
        else:
            changes[name] = convert_value(f"{prefix}.{name}", value, types_[name])
    try:
        return dataclasses.replace(current, **changes)
    except ConfigError as e:  # a value given under an old name: say which name it was read as
        old = [f"{prefix}.{name} is read as {prefix}.{RENAMED[prefix][name]}" for name in values
               if name in RENAMED.get(prefix, {})]
        if not old:
            raise
        raise ConfigError(f"{e} ({'; '.join(old)})") from None


def update(config: RunConfig, raw: dict) -> RunConfig:
    """A copy of config with the nested {section: {field: value}} values applied and validated."""
    sections = {}
    for section, values in raw.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section {section!r}; valid sections: {', '.join(SECTIONS)}")
        sections[section] = _update_section(getattr(config, section), values, section)
    return dataclasses.replace(config, **sections)

"""Token budgets as warmup-stable-decay branches: one stable run per (arm, seed), in segments that end where
each budget's cooldown starts, and from each segment's last checkpoint that budget's cooldown. A budget then
costs only its cooldown beyond the longest stable run; tests/test_training.py checks that a branch equals a
straight run of the same budget bitwise."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from pathlib import Path

import torch

from nlq.config import RunConfig, update
from nlq.errors import UserError
from nlq.model import Transformer
from nlq.overrides import merge_changes
from nlq.schedule import cooldown_start
from nlq.studies.definition.design import Arm, Run, Study


def non_embedding_parameters(config: RunConfig) -> int:
    return _non_embedding_parameters(json.dumps(asdict(config.model), sort_keys=True))


@functools.lru_cache(maxsize=64)
def _non_embedding_parameters(model: str) -> int:  # keyed by the model config as JSON: studies ask the same often
    with torch.device("meta"):
        return Transformer(_model_config(model)).num_parameters()


def flops_per_token(config: RunConfig) -> int:
    return _flops_per_token(json.dumps(asdict(config.model), sort_keys=True))


@functools.lru_cache(maxsize=64)
def _flops_per_token(model: str) -> int:
    with torch.device("meta"):
        return Transformer(_model_config(model)).flops_per_token()


def _model_config(model: str):
    """The model config of its JSON (a classifier's with the objective a classifier is trained with)."""
    fields = json.loads(model)
    train = {"objective": "classify"} if fields.get("classes") else {}
    return RunConfig.from_dict({"model": fields, "train": train}).model


def budget_steps(config: RunConfig, shape: dict, tpp: float) -> int:
    """Steps for tpp tokens per non-embedding parameter of the linear model of this shape (every arm of a
    shape gets the same tokens)."""
    linear = update(config, {"model": dict(shape, query="linear", mlp_ratio=4.0)})
    return max(1, round(tpp * non_embedding_parameters(linear) / step_tokens(config)))


def step_tokens(config: RunConfig) -> int:
    """Training tokens per optimizer step: train.batch_tokens where set (gradient accumulation), else one batch."""
    return config.train.batch_tokens or config.train.batch_size * config.model.block_size


def wsd_chain(study: Study, arm: Arm, seed: int, study_dir: Path, *, width: str, shape: dict,
              budgets_tpp: list[float], lr: float, min_lr: float, branch: dict | None = None,
              lr_in_name: bool = False) -> list[list[Run]]:
    """The runs of one (arm, seed), level by level: a level is the stable segment up to a budget's cooldown
    (none for a budget too short to have one) and that budget's branch; the levels must run in order, in one
    process (the runs share the chain of the stable run). branch: more changes for the branches. lr_in_name:
    the runs' names carry the lr (for studies with chains of one variant and seed at several lrs)."""
    steps = [budget_steps(study.base, shape, tpp) for tpp in budgets_tpp]
    if sorted(set(steps)) != steps:  # each level continues the stable run where the one before stopped
        raise UserError(f"design.budgets_tpp {budgets_tpp} give the step counts {steps} at this batch; each budget "
                        f"must end at a later step than the one before: set the budgets further apart")
    longest = max(steps)
    at = {"min_lr": min_lr, "lr_in_name": lr_in_name}  # every run of the chain: this lr and min lr
    stable = Run(study, arm, seed, lr, tag=width, suffix="-stable", **at)  # for its name
    stable_dir = (study_dir / "runs" / stable.name).resolve()
    common = {"model": dict(shape)}
    levels = []
    for tpp, budget in zip(budgets_tpp, steps):
        level = []
        start = cooldown_start(update(study.base, {"train": {"max_steps": budget}}).train)
        if start > 0:
            level.append(Run(study, arm, seed, lr, merge_changes(common, {"train": {
                "max_steps": start, "decay_steps": longest, "eval_every": max(1, longest // 8),
                "checkpoint_every": 1000, "keep_checkpoints": 2}}), tag=width, suffix="-stable",
                labels={"stage": "stable", "width": width}, chain_name=stable.name, **at))
        changes = {"max_steps": budget, "eval_every": budget}
        if start > 0:
            changes["resume_from"] = str(stable_dir / "checkpoints" / f"step_{start:07d}.pt")
        level.append(Run(study, arm, seed, lr, merge_changes(common, {"train": changes}, branch or {}),
                         tag=f"{width}-tpp{tpp:g}", labels={"stage": "budget", "width": width, "tpp": tpp,
                                                            "steps": budget},
                         chain_name=stable.name, **at))
        levels.append(level)
    return levels


def chain_tokens(config: RunConfig, shape: dict, budgets_tpp: list[float]) -> int:
    """Training tokens of one chain: the longest stable run plus every budget's cooldown."""
    ends = [budget_steps(config, shape, t) for t in budgets_tpp]
    starts = [cooldown_start(update(config, {"train": {"max_steps": e}}).train) for e in ends]
    return (max(starts) + sum(e - s for s, e in zip(starts, ends))) * step_tokens(config)

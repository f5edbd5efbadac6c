"""`nlq study verdict`: a pre-registered, powered test of the nonlinear query at 300 tokens per parameter.

The design is fixed before any run (docs/RESULTS.md, "Pre-registration"): d 64, 2 layers, the `pypkg`
corpus with bpe:2048, 300 tokens per non-embedding parameter of linear; linear and nonlinear at one peak
lr and one schedule (the same min lr); 14 pairs (seeds 101-114), each pair on identical batches with shared
initial weights; every budget's final model scored on the whole validation split. The 100-tokens-per-parameter
budget is a WSD branch of the same chains. Secondary, run only after the primary arms: the identity query
at the same lr and seeds. The settings are the study's `settings`, written to study.json; the report reads
them from there, so it tests what was registered even if this file changes.
"""

from __future__ import annotations

import math
from pathlib import Path

from nlq.config import RunConfig, update
from nlq.scaling import base as scaling_base
from nlq.scaling import non_embedding_parameters, update_nested
from nlq.study import DataSpec, Run, Study, Variant
from nlq.training.schedule import cooldown_start

SETTINGS = {
    "width": "d64",
    "shape": {"n_layer": 2, "n_head": 4, "n_embd": 64},
    "lr": 2e-3,
    "min_lr": 2e-4,
    "budgets_tpp": [100, 300],  # tokens per non-embedding parameter of linear; the primary one is primary_tpp
    "primary_tpp": 300,
    "seeds": list(range(101, 115)),  # 14 pairs: the power computation is in docs/RESULTS.md
    "primary": ["linear", "nonlinear"],
    "secondary": ["identity"],
    "endpoint": "full_val_loss",  # the final model on the whole val split
    "confidence": 0.95,  # the paired t interval
    "margin": 0.037,  # equivalence margin (nats): the paper's smallest claimed effect at this loss
    "alpha": 0.05,  # each one-sided test of the equivalence test (TOST)
    "planning_sd": 0.045,  # the paired sd the number of pairs was chosen for
}

VARIANTS = [
    Variant("linear", {"model": {"query": "linear"}}, "baseline: Q = X W_Q"),
    Variant("nonlinear", {"model": {"query": "nonlinear"}}, "the method: Q = (X + f(X)) / 2"),
    Variant("identity", {"model": {"query": "identity"}}, "secondary: Q = X, no W_Q"),
]
DATA = DataSpec("pypkg", "bpe:2048")


def budget_steps(config: RunConfig, shape: dict, tpp: float) -> int:
    """Steps for tpp tokens per non-embedding parameter of the linear model of this shape."""
    linear = update(config, {"model": dict(shape, query="linear", mlp_ratio=4.0)})
    tokens_per_step = config.train.batch_size * config.model.block_size
    return max(1, round(tpp * non_embedding_parameters(linear) / tokens_per_step))


def wsd_chain(study: Study, variant: Variant, seed: int, study_dir: Path, *, width: str, shape: dict,
              budgets_tpp: list[float], lr: float, min_lr: float, branch: dict | None = None) -> list[Run]:
    """One stable WSD run in segments, each ending where a budget's cooldown starts, and from each segment's
    last checkpoint that budget's cooldown branch; in the order they must run. branch: extra train/data
    changes of the branches (e.g. the final full-split eval)."""
    steps = [budget_steps(study.base, shape, tpp) for tpp in budgets_tpp]
    longest = max(steps)
    stable = Run(study, variant, seed, None, tag=width, suffix="-stable")  # for its name
    stable_dir = (study_dir / "runs" / stable.name).resolve()
    common = {"model": dict(shape), "train": {"lr": lr, "min_lr": min_lr}}
    chain = []
    for tpp, budget in zip(budgets_tpp, steps):
        start = cooldown_start(update(study.base, {"train": {"max_steps": budget}}).train)
        if start > 0:
            chain.append(Run(study, variant, seed, None, update_nested(common, {"train": {
                "max_steps": start, "decay_steps": longest, "eval_every": max(1, longest // 8),
                "checkpoint_every": 1000, "keep_checkpoints": 2}}), tag=width, suffix="-stable",
                labels={"stage": "stable", "width": width}, group=stable.name))
        changes = update_nested(common, {"train": {"max_steps": budget, "eval_every": budget}})
        if start > 0:
            changes["train"]["resume_from"] = str(stable_dir / "checkpoints" / f"step_{start:07d}.pt")
        for section, values in (branch or {}).items():
            changes.setdefault(section, {}).update(values)
        chain.append(Run(study, variant, seed, None, changes, tag=f"{width}-tpp{tpp:g}",
                         labels={"stage": "budget", "width": width, "tpp": tpp, "steps": budget}, group=stable.name))
    return chain


def arm_runs(study: Study, study_dir: Path, names: list[str]) -> list[Run]:
    """The chains of these variants, seed by seed. Within a seed the variants' order alternates, so that
    N shards dealing chains round-robin each get every variant and a pair finishes at about the same time."""
    s = study.settings
    variants = [v for v in study.variants if v.name in names]
    runs = []
    for i, seed in enumerate(s["seeds"]):
        for variant in (variants if i % 2 == 0 else variants[::-1]):
            runs += wsd_chain(study, variant, seed, study_dir, width=s["width"], shape=s["shape"],
                              budgets_tpp=s["budgets_tpp"], lr=s["lr"], min_lr=s["min_lr"],
                              branch={"data": {"final_eval": "full"}})
    return runs


def verdict() -> Study:
    s = SETTINGS
    study = Study("verdict", f"pre-registered test at {s['primary_tpp']} tokens per parameter: {len(s['seeds'])} pairs "
                  f"of linear and nonlinear at one lr ({s['lr']:g}), whole-val-split eval; identity as a secondary arm",
                  scaling_base(), VARIANTS, seeds=s["seeds"], data=DATA, report="verdict", settings=dict(s))

    def stages(study_dir: Path):
        yield arm_runs(study, study_dir, s["primary"])  # the primary arms finish before the secondary starts
        yield arm_runs(study, study_dir, s["secondary"])

    study.stages = stages
    return study


def planned_tokens(settings: dict = SETTINGS) -> int:
    """Training tokens of one chain (the longest stable run plus every budget's cooldown)."""
    config = scaling_base()
    ends = [budget_steps(config, settings["shape"], t) for t in settings["budgets_tpp"]]
    starts = [cooldown_start(update(config, {"train": {"max_steps": e}}).train) for e in ends]
    steps = max(starts) + sum(e - s for s, e in zip(starts, ends))
    return steps * config.train.batch_size * config.model.block_size


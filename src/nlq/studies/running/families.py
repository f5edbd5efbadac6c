"""The runs of an exploratory plan (plan_explore.py: [design] kind = "comparison", "scaling" or "probes"), stage by
stage, through the one runner every plan has (study.py: the freeze, sharding, resume; dry_run.py: the costs).

- comparison: every (seed, lr, arm) on the base recipe, seed-major, so an interrupted study has whole seeds.
- scaling: stage 1 sweeps each (width, arm) over the width's lrs on the sweep seed at sweep_tpp; stage 2 trains per
  (width, seed, arm) a WSD chain (wsd.py) at the arm's swept best, budget-major (every chain reaches a budget before
  any goes on), so a study cut short has every seed and arm of its smaller budgets. With one `lr`, stage 2 alone.
- probes: per task and width every (seed, arm), the task generated on the fly (data/tasks.py), n_head = width / 16.
"""

from __future__ import annotations

from pathlib import Path

from nlq.fileio import read_json
from nlq.overrides import merge_changes
from nlq.studies.definition.design import Run, Study
from nlq.studies.definition.plan import Plan
from nlq.studies.inference.selection import lowest
from nlq.studies.running.wsd import budget_steps, wsd_chain


def family_study(plan: Plan) -> Study:
    """The study of an exploratory plan: its arms on its base recipe, its report the kind's (plan_report.FLOWS)."""
    d = plan.design
    study = Study(plan.name, plan.description, plan.base, plan.arms, seeds=list(d.seeds), data=plan.data,
                  lrs=d.lrs, baseline=d.baseline, width_family=list(d.width_family or []),
                  min_lr_ratio=d.min_lr_ratio, report=d.kind, design=d, plan=plan.raw)
    study.stages, study.planned_stages = STAGES[d.kind](study)
    return study


def comparison_stages(study: Study):
    def stages(study_dir: Path):
        yield study.runs()
    return stages, None


def scaling_stages(study: Study):
    widths = study.design["widths"]
    budgets = {width: spec["budgets"] for width, spec in widths.items()}
    if study.design.lr is not None:  # one lr for every arm: no sweep
        def one_lr(study_dir: Path):
            yield budget_runs(study, study_dir, {(w, v.name): study.design.lr for w in widths for v in study.arms},
                              budgets)
        return one_lr, None

    def stages(study_dir: Path):
        sweep = sweep_runs(study)
        yield sweep
        yield budget_runs(study, study_dir, best_lrs(study_dir, sweep), budgets)

    def planned(study_dir: Path):  # the chains at the first swept lr: a chain's tokens do not depend on its lr
        yield sweep_runs(study)
        yield budget_runs(study, study_dir, {(w, v.name): spec["lrs"][0] for w, spec in widths.items()
                                             for v in study.arms}, budgets)
    return stages, planned


def probes_stages(study: Study):
    def stages(study_dir: Path):
        yield probe_runs(study)
    return stages, None


STAGES = {"comparison": comparison_stages, "scaling": scaling_stages, "probes": probes_stages}


def sweep_runs(study: Study) -> list[Run]:
    runs = []
    for width, spec in study.design["widths"].items():
        steps = budget_steps(study.base, spec["shape"], spec["sweep_tpp"])
        changes = merge_changes({"model": dict(spec["shape"])}, {"train": {"max_steps": steps, "eval_every": steps}})
        for lr in spec["lrs"]:
            for arm in study.arms:
                runs.append(Run(study, arm, study.design["sweep_seed"], lr, changes, tag=f"sweep-{width}",
                                labels={"stage": "lr-sweep", "width": width, "tpp": spec["sweep_tpp"]}))
    return runs


def best_lrs(study_dir: Path, runs: list[Run]) -> dict[tuple[str, str], float]:
    """(width, arm) -> the swept lr with the lowest final val loss (one seed; selection.lowest)."""
    losses: dict[tuple[str, str], dict[float, float]] = {}
    for run in runs:
        summary = read_json(study_dir / "runs" / run.name / "summary.json", "a run summary")
        losses.setdefault((run.labels["width"], run.arm.name), {})[run.lr] = summary["val_loss"]
    return {key: lowest(by_lr) for key, by_lr in losses.items()}


def budget_runs(study: Study, study_dir: Path, lrs: dict[tuple[str, str], float],
                budgets_by_width: dict[str, list[float]]) -> list[Run]:
    """Per (width, seed, arm) a WSD chain, budget-major (each chain's runs stay in order)."""
    chains = []
    for width, budgets in budgets_by_width.items():
        shape = study.design["widths"][width]["shape"]
        for seed in study.seeds:
            for arm in study.arms:
                lr = lrs[(width, arm.name)]
                chains.append(wsd_chain(study, arm, seed, study_dir, width=width, shape=shape, budgets_tpp=budgets,
                                        lr=lr, min_lr=lr * study.min_lr_ratio))
    return [run for level in range(max(map(len, chains))) for chain in chains if level < len(chain)
            for run in chain[level]]


def probe_runs(study: Study) -> list[Run]:
    runs = []
    for task_name, spec in study.design["tasks"].items():
        for width in spec["widths"]:
            changes = {"model": {"n_embd": width, "n_head": max(1, width // 16), "block_size": spec["block"]},
                       "data": {"task": spec["task"], "task_vocab": spec["vocab"], "task_pairs": spec["pairs"]}}
            for seed in study.seeds:
                for arm in study.arms:
                    runs.append(Run(study, arm, seed, None, changes, tag=f"{task_name}-d{width}",
                                    labels={"stage": "probe", "task": task_name, "width": width}))
    return runs

"""The rules that select a learning rate, in one place for every study family: an lr's mean endpoint over seeds,
the lowest mean (a tie goes to the lower lr; an lr with a diverged run is out), and a plan's grid step with its edge
rule. engine.py (plans), scaling.py (its one-seed sweep) and tables.py (cpu-lr and the other comparisons) use them.
"""

from __future__ import annotations

import math


def lowest(means: dict[float, float | None]) -> float | None:
    """The lr with the lowest mean endpoint (lr -> mean; None: a diverged lr, out); a tie goes to the lower lr; None
    if every lr is out."""
    eligible = sorted((m, lr) for lr, m in means.items() if m is not None)
    return eligible[0][1] if eligible else None


def two_best(means: dict[float, float | None]) -> list[float]:
    """The two lrs with the lowest means (lr -> mean; None: out), in increasing lr: the firmer selection's
    candidates (one, or none, where fewer ended finite)."""
    eligible = sorted((m, lr) for lr, m in means.items() if m is not None)
    return sorted(lr for _, lr in eligible[:2])


def lr_means(ended: dict[tuple[str, float, int], float | None], arm: str,
             seeds: list[int]) -> dict[float, float | None]:
    """Each lr an arm has tried on these seeds -> its mean endpoint, None where a run diverged (that lr is out);
    only lrs whose runs have all ended."""
    tried = sorted({lr for (a, lr, seed) in ended if a == arm and seed in seeds})
    means = {}
    for lr in tried:
        if all((arm, lr, seed) in ended for seed in seeds):
            values = [ended[(arm, lr, seed)] for seed in seeds]
            means[lr] = None if any(v is None or not math.isfinite(v) for v in values) else sum(values) / len(values)
    return means


def grid_step(means: dict[float, float | None], s: dict) -> dict:
    """The edge rule on one arm's selection so far (lr -> mean, None: out). Returns {"lr": the best lr (the lowest
    mean; a tie goes to the lower lr; None if every lr is out), "next": the lr to try next (None: this arm's
    selection is over), "edge": whether the best sits at an edge of what was tried}. A best at the lowest (highest)
    lr tried asks for that lr / factor (x factor), unless max_extensions were made that way already; a diverged
    lr counts as tried, so an extension that diverges leaves the best inside and ends the search."""
    best = lowest(means)
    if best is None:
        return {"lr": None, "next": None, "edge": False}
    tried, grid = sorted(means), s.lrs
    at_low, at_high = best == tried[0], best == tried[-1]
    step = None
    if at_low and sum(lr < grid[0] for lr in tried) < s.max_extensions:
        step = best / s.edge_factor
    elif at_high and sum(lr > grid[-1] for lr in tried) < s.max_extensions:
        step = best * s.edge_factor
    return {"lr": best, "next": step, "edge": at_low or at_high}


def selection(ended: dict[tuple[str, float, int], float | None], s: dict, arms: list[str]) -> dict:
    """Per arm, once its selection is over (every grid and extension run ended, no extension asked for): its lr
    means, the selected lr and whether it stayed at an edge. Arms still selecting are absent."""
    out = {}
    for arm in arms:
        means = lr_means(ended, arm, s.selection_seeds)
        if any(lr not in means for lr in s.lrs):
            continue
        step = grid_step(means, s)
        if step["next"] is None:
            out[arm] = {"means": means, "lr": step["lr"], "edge": step["edge"]}
    return out

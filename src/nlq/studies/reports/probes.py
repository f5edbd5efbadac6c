"""The report of a probe plan ([design] kind = "probes": plans/probes.toml): where can a nonlinear query matter, on
synthetic recall and algorithmic tasks (data/tasks.py) across widths and difficulty. Held-out accuracy on the answer
positions (and loss) per (task, width), the first step that reaches the design's threshold, paired differences vs
the baseline with 95% intervals, accuracy against width per arm; the tasks and threshold read from study.json.
"""

from __future__ import annotations

import math
from pathlib import Path

from scipy.stats import binomtest

from nlq.runs.metrics import read_metrics
from nlq.studies.definition.tables import load_summaries, markdown_table, write_runs_csv
from nlq.studies.inference.stats import holm, holm_verdicts, mean_std, median, paired_difference
from nlq.studies.reports.plots import plot_probe_accuracy, plot_probe_curves

THRESHOLD = 0.9  # "solved", for a study.json that recorded no threshold (before nlq 0.3)


def held_out_curve(run_dir: Path) -> dict[int, float]:
    """step -> held-out accuracy at each evaluation of a run ({} without metrics)."""
    return {int(r["step"]): r["val_acc"] for r in read_metrics(run_dir / "metrics.jsonl")
            if r.get("val_acc") is not None}


def steps_to_solve(run_dir: Path, threshold: float = THRESHOLD, curve: dict[int, float] | None = None) -> int | None:
    """The first evaluated step whose held-out accuracy reaches threshold; None if none did."""
    curve = held_out_curve(run_dir) if curve is None else curve
    return next((step for step, acc in sorted(curve.items()) if acc >= threshold), None)


def build_probes_report(study_dir: Path, study: dict) -> tuple[list[str], dict]:
    """The report's lines (per task and width: held-out accuracy, the step each seed first reaches the threshold,
    paired differences to linear with 95% intervals) and numbers (result.json); writes results.csv,
    probes_accuracy.png and probes_curves.png."""
    threshold = (study.get("design") or {}).get("threshold", THRESHOLD)  # studies before nlq 0.3 recorded none
    runs = [r for r in load_summaries(study_dir, study) if r.get("stage") == "probe"]
    for r in runs:
        r["curve"] = held_out_curve(study_dir / "runs" / r["name"])
        r["steps_to_solve"] = steps_to_solve(study_dir / "runs" / r["name"], threshold, curve=r["curve"])
    arms = [v["name"] for v in study["arms"]]
    lines = [f"# Study `{study['name']}`", "", study.get("description", ""), "",
             f"Held-out accuracy on the answer positions at the end of training (mean ± std over seeds); the step at "
             f"which each seed's held-out accuracy first reached {threshold:.0%} (`-`: never, within the run); and "
             "the paired difference of each variant to `linear` (same seed: same examples, shared initial weights) "
             "with its 95% interval, in final accuracy and in final loss.", ""]
    cells, rows, keys = {}, [], []
    for task in dict.fromkeys(r["task"] for r in runs):
        for width in sorted({r["width"] for r in runs if r["task"] == task}):
            cell = [r for r in runs if r["task"] == task and r["width"] == width]
            base = {r["seed"]: r for r in cell if r["arm"] == "linear"}
            for arm in arms:
                mine = sorted((r for r in cell if r["arm"] == arm), key=lambda r: r["seed"])
                if mine:
                    cells[(task, width, arm)] = [r["val_acc"] for r in mine]
                    rows.append(_probe_row(task, width, arm, mine, base))
                    keys.append({"task": task, "width": width, "arm": arm,
                                 "accuracy": cells[(task, width, arm)],
                                 "steps_to_solve": [r["steps_to_solve"] for r in mine]})
    tests = holm_verdicts([loss for _, loss in rows if loss is not None])
    table = []
    for (row, loss), key in zip(rows, keys):
        if loss is None:
            table.append(row + [None] * (13 - len(row)))
            continue
        loss = tests.pop(0)
        key["loss_vs_linear"] = loss
        table.append(row + [f"{loss['mean']:+.4f}", f"{loss['p']:.3g}", f"{loss['p_holm']:.3g}", loss["verdict"]])
    lines += markdown_table(["task", "width", "variant", "seeds", "accuracy", "solved",
                             f"step reaching {threshold:.0%} (per seed)", "Δ accuracy vs linear", "95% interval",
                             "Δ loss vs linear", "p (loss)", "Holm p", "verdict (loss, Holm)"], table)
    lines[4] += (f" Loss verdicts are Holm-adjusted over the {sum(loss is not None for _, loss in rows)} cells with "
                 "pairs (one family); the intervals are unadjusted.")
    lines += ["", "## Solved or not, pooled over widths (paired by task, width and seed)", "",
              "Final accuracy is nearly all-or-nothing (a run either forms the recall mechanism or stays on the "
              "plateau), so a 3-seed t interval per cell says little. Pooled over a task's widths (and over all "
              "tasks), each variant's runs are paired with `linear`'s of the same task, width and seed: how often one "
              f"solved it (held-out accuracy >= {threshold:.0%} at some evaluation) and the other did not, with an "
              "exact two-sided sign test on those discordant pairs.", ""]
    pooled = [row for scope in [*dict.fromkeys(r["task"] for r in runs), "all"]
              for row in pooled_solve_rows(scope, [r for r in runs if scope == "all" or r["task"] == scope], arms)]
    lines += markdown_table(["tasks", "variant", "runs solved", "solved, linear not", "linear solved, variant not",
                             "sign test p", "Holm p", "median step reaching it (solved runs)"], pooled_cells(pooled))
    tests = sum(r['p'] is not None for r in pooled)
    lines += ["", f"Sign-test p values are Holm-adjusted over the {tests} tests of this "
              "table (one family, though the 'all' rows pool the task rows). The median of an even count is the mean "
              "of the middle two.", "",
              "Plots: `probes_accuracy.png` (final held-out accuracy against width: a line per variant through the "
              "mean, each seed a dot; variants are drawn side by side, so none hides another); `probes_curves.png` "
              "(held-out accuracy over training steps, each seed its own line, a panel per task and width).", ""]
    plot_probe_accuracy(study_dir / "probes_accuracy.png", cells, arms)
    plot_probe_curves(study_dir / "probes_curves.png", runs, arms, threshold)
    write_runs_csv(study_dir / "results.csv", runs,
                   ["name", "task", "width", "arm", "seed", "val_acc", "val_loss", "steps_to_solve"])
    return lines, {"study": study["name"], "threshold": threshold, "cells": keys, "pooled": pooled}


def _probe_row(task: str, width: int, arm: str, mine: list[dict], base: dict) -> tuple[list, dict | None]:
    """A cell's table row up to its accuracy difference, and its paired loss difference (None for linear)."""
    mean, sd = mean_std([r["val_acc"] for r in mine])
    spread = f" ± {sd:.3f}" if len(mine) > 1 else ""
    solved = [r["steps_to_solve"] for r in mine]
    steps = ", ".join("-" if s is None else f"{s:,}" for s in solved)
    row = [task, width, arm, len(mine), f"{mean:.3f}{spread}", f"{sum(s is not None for s in solved)}/{len(solved)}",
           steps]
    pairs = [(r, base[r["seed"]]) for r in mine if r["seed"] in base]
    if arm == "linear" or not pairs:
        return row, None
    acc = paired_difference([a["val_acc"] for a, _ in pairs], [b["val_acc"] for _, b in pairs])
    loss = paired_difference([a["val_loss"] for a, _ in pairs], [b["val_loss"] for _, b in pairs])
    interval = f"[{acc['low']:+.3f}, {acc['high']:+.3f}]" if not math.isnan(acc["low"]) else "n/a"
    return row + [f"{acc['mean']:+.3f}", interval], loss


def pooled_solve_rows(scope: str, runs: list[dict], arms: list[str]) -> list[dict]:
    """Per variant: runs solved, and against linear's run of the same task, width and seed the discordant pairs
    (solved where linear did not, and the reverse) with an exact two-sided sign test; the median solving step."""
    solved = {(r["task"], r["width"], r["seed"], r["arm"]): r["steps_to_solve"] is not None for r in runs}
    rows = []
    for arm in arms:
        mine = [key for key in solved if key[3] == arm]
        if not mine:
            continue
        steps = [r["steps_to_solve"] for r in runs if r["arm"] == arm and r["steps_to_solve"] is not None]
        row = {"scope": scope, "arm": arm, "solved": sum(solved[k] for k in mine), "runs": len(mine),
               "median": median(steps) if steps else None, "wins": None, "losses": None, "p": None}
        pairs = [(solved[k], solved[(*k[:3], "linear")]) for k in mine if (*k[:3], "linear") in solved]
        if arm != "linear" and pairs:
            wins, losses = sum(a and not b for a, b in pairs), sum(b and not a for a, b in pairs)
            row |= {"wins": wins, "losses": losses,
                    "p": binomtest(wins, wins + losses).pvalue if wins + losses else 1.0}
        rows.append(row)
    return rows


def pooled_cells(rows: list[dict]) -> list[list]:
    """The pooled table's rows, each sign test with its Holm-adjusted p over all the rows' tests."""
    tested = [r for r in rows if r["p"] is not None]
    adjusted = dict(zip(map(id, tested), holm([r["p"] for r in tested])))
    return [[r["scope"], r["arm"], f"{r['solved']}/{r['runs']}"]
            + ([None] * 4 if r["p"] is None else [r["wins"], r["losses"], f"{r['p']:.3g}", f"{adjusted[id(r)]:.3g}"])
            + ["-" if r["median"] is None else f"{r['median']:,.0f}"] for r in rows]

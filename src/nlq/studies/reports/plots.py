"""Matplotlib for the reports, headless (Agg) and written atomically, and the plots of the family reports
(comparison.py, scaling.py, probes.py; a plan report's are in plan_plots.py)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # reports are written on machines without a display
import matplotlib.pyplot as plt  # noqa: E402

from nlq.fileio import atomic_write  # noqa: E402
from nlq.studies.definition.tables import RunResult  # noqa: E402
from nlq.studies.inference.stats import paired_difference  # noqa: E402


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def plot_val_curves(path: Path, by_arm: dict[str, list[RunResult]], title: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, runs in by_arm.items():
        steps = sorted(set.intersection(*(set(s for s, _ in r.curve) for r in runs)) - {0})
        values = np.array([[dict(r.curve)[s] for s in steps] for r in runs])  # (seeds, steps)
        line, = ax.plot(steps, values.mean(0), label=arm, marker=".")
        ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
    ax.set(xlabel="step", ylabel="val loss (nats/token)", title=f"{title}: validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def paired_curve(runs: list[RunResult], base_runs: list[RunResult]) -> list[tuple[int, dict]]:
    """(step, paired difference arm - baseline over the seeds both have at that eval step)."""
    base = {r.seed: dict(r.curve) for r in base_runs}
    mine = {r.seed: dict(r.curve) for r in runs if r.seed in base}
    steps = sorted(set.intersection(*(set(c) & set(base[s]) for s, c in mine.items()))) if mine else []
    return [(step, paired_difference([mine[s][step] for s in mine], [base[s][step] for s in mine])) for step in steps]


def plot_paired_curves(path: Path, by_arm: dict[str, list[RunResult]], baseline: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, runs in by_arm.items():
        if arm == baseline:
            continue
        points = paired_curve(runs, by_arm[baseline])
        if not points:
            continue
        steps = [s for s, _ in points]
        line, = ax.plot(steps, [p["mean"] for _, p in points], marker=".", label=arm)
        if not any(math.isnan(p["low"]) for _, p in points):
            ax.fill_between(steps, [p["low"] for _, p in points], [p["high"] for _, p in points],
                            color=line.get_color(),
                            alpha=0.15)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set(xlabel="step", ylabel=f"val loss - {baseline} (nats; < 0 is better)",
           title=f"{title}: paired difference to {baseline}, 95% interval")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_loss_vs_params(path: Path, rows: list[dict], family: list[str], fit) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        marker = "o" if r["arm"] in family else "*"
        std = 0.0 if math.isnan(r["val_loss_std"]) else r["val_loss_std"]  # the seed spread, often larger than the gaps
        ax.errorbar(r["params"], r["val_loss"], yerr=std, fmt=marker, markersize=7 if marker == "o" else 11, capsize=4)
        ax.annotate(r["arm"], (r["params"], r["val_loss"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    if fit is not None:
        ns = np.linspace(min(r["params"] for r in rows) * 0.95, max(r["params"] for r in rows) * 1.05, 50)
        ax.plot(ns, fit[0] + fit[1] * np.log(ns), "k--", lw=1, label="fit over the width family")
        ax.legend()
    ax.set(xlabel="non-embedding parameters", ylabel="final val loss (mean ± std over seeds)",
           title="loss vs parameters")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_scaling_deltas(path: Path, deltas: dict, lrs: dict, title: str) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for (width, arm) in dict.fromkeys((w, v) for w, v, _ in deltas):
        points = sorted((tpp, p) for (w, v, tpp), p in deltas.items() if (w, v) == (width, arm))
        x = [tpp for tpp, _ in points]
        style = "-" if arm == "nonlinear" else "--"
        pairs = sorted({p["n"] for _, p in points})
        n = f"n={pairs[0]}" if len(pairs) == 1 else f"n={pairs[0]}-{pairs[-1]}"
        lr = f"lr {lrs[(width, arm)]:g}, linear's {lrs[(width, 'linear')]:g}" if (width, "linear") in lrs else ""
        line, = ax.plot(x, [p["mean"] for _, p in points], style, marker="o", label=f"{arm}, {width} ({lr}, {n})")
        for tpp, p in points:  # each seed's Δ
            ax.scatter([tpp] * len(p["deltas"]), p["deltas"], s=10, color=line.get_color(), alpha=0.5, zorder=1)
        banded = [(tpp, p) for tpp, p in points if not math.isnan(p["low"])]  # one-seed points have no band
        if banded:
            ax.fill_between([t for t, _ in banded], [p["low"] for _, p in banded], [p["high"] for _, p in banded],
                            color=line.get_color(), alpha=0.15)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.minorticks_off()
    budgets = sorted({tpp for _, _, tpp in deltas})
    ax.set_xticks(budgets, labels=[f"{t:g}" for t in budgets])
    ax.set(xlabel="training tokens per non-embedding parameter",
           ylabel="Δ val loss vs linear (nats; < 0 is better)", title=f"{title}: paired Δ, seeds and 95% interval")
    ax.grid(alpha=0.3)
    if deltas:
        ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_probe_curves(path: Path, runs: list[dict], arms: list[str], threshold: float) -> None:
    """Held-out accuracy over training, a panel per (task, width), each seed its own line: a run either leaves the
    plateau or not, and a mean over seeds would draw a partial curve no run followed."""
    panels = list(dict.fromkeys((r["task"], r["width"]) for r in runs))
    if not panels:
        return
    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.9 * rows), squeeze=False)
    colors = {v: f"C{i}" for i, v in enumerate(arms)}
    for ax, (task, width) in zip(axes.flat, panels):
        for arm in arms:
            mine = [r for r in runs if (r["task"], r["width"], r["arm"]) == (task, width, arm)]
            for i, r in enumerate(sorted(mine, key=lambda r: r["seed"])):
                steps = sorted(r["curve"])
                ax.plot(steps, [r["curve"][s] for s in steps], color=colors[arm], lw=0.9, alpha=0.75,
                        label=arm if i == 0 else None)
        ax.axhline(threshold, color="grey", lw=0.6, ls=":")
        ax.set(title=f"{task}, d {width}", xlabel="step", ylabel="held-out accuracy", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path)


def plot_probe_accuracy(path: Path, cells: dict, arms: list[str]) -> None:
    """Final held-out accuracy against width, a panel per task; the arms sit side by side around each width
    (a small offset on the log axis) with their own marker and line style, each seed a dot."""
    tasks = list(dict.fromkeys(t for t, _, _ in cells))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4 * max(1, len(tasks)), 3.6), squeeze=False)
    markers, styles = "osD^v", ["-", "--", "-.", ":", "-"]
    for ax, task in zip(axes[0], tasks):
        for i, arm in enumerate(arms):
            points = sorted((w, accs) for (t, w, v), accs in cells.items() if t == task and v == arm)
            if not points:
                continue
            shift = 2 ** (0.07 * (i - (len(arms) - 1) / 2))
            x = [w * shift for w, _ in points]
            line, = ax.plot(x, [sum(a) / len(a) for _, a in points], marker=markers[i % 5], ls=styles[i % 5],
                            label=arm, markersize=6, mfc="none")
            for xi, (_, accs) in zip(x, points):
                ax.scatter([xi] * len(accs), accs, s=9, color=line.get_color(), alpha=0.6)
        widths = sorted({w for t, w, _ in cells if t == task})
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set(xlabel="width d", ylabel="held-out accuracy", title=task, ylim=(-0.02, 1.04),
               xlim=(min(widths) / 1.4, max(widths) * 1.4))
        ax.set_xticks(widths, labels=[str(w) for w in widths])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    save_figure(fig, path)

"""The plots of a plan's report: the Δ of every test pair (one lr for every arm), the lr curve of the selection
and the test's Δs beside the declared secondary comparisons (an lr grid)."""

from __future__ import annotations

from pathlib import Path

from nlq.studies.inference.stats import paired_difference
from nlq.studies.reports.plan_sections import pairs_of
from nlq.studies.reports.plots import plt, save_figure


def plot_one_lr(path: Path, loss: dict, s: dict, baseline: str, name: str) -> None:
    cells = [(v, tpp) for v in [s.primary[1], *s.secondary] for tpp in sorted(s.budgets_tpp, reverse=True)]
    cells = [(v, tpp, pairs_of(loss, baseline, v, s.seeds, tpp, s.endpoint)) for v, tpp in cells]
    cells = [(v, tpp, pairs) for v, tpp, pairs in cells if len(pairs) == len(s.seeds)]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for x, (arm, tpp, pairs) in enumerate(cells):
        deltas = [v - b for _, b, v in pairs]
        p = paired_difference(deltas, [0.0] * len(deltas), s.confidence)
        ax.scatter([x + 0.12 * (i / max(1, len(deltas) - 1) - 0.5) for i in range(len(deltas))], deltas, s=12,
                   color="grey", alpha=0.7, zorder=2)
        ax.errorbar([x + 0.25], [p["mean"]], yerr=[[p["mean"] - p["low"]], [p["high"] - p["mean"]]], fmt="o",
                    color="C0" if (arm, tpp) == (s.primary[1], s.primary_tpp) else "C1", capsize=4, zorder=3)
    ax.axhline(0.0, color="k", lw=0.8)
    for sign in (-1, 1):
        ax.axhline(sign * s.margin, color="C3", lw=0.8, ls="--")
    ax.set_xticks(range(len(cells)), labels=[f"{v}\n{tpp:g} tok/param\nn={len(pairs)}" for v, tpp, pairs in cells],
                  fontsize=8)
    ax.set(ylabel=f"Δ {s.endpoint} vs {baseline} ({s.units.name}; < 0 is {s.units.lower})",
           title=f"{name}: per-seed Δ, mean with {s.confidence:.0%} interval; dashed: ±{s.margin:g} "
                 f"(lr {s.lr:g} for every variant)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


# ---- a plan with an lr grid: the selection, then the test ------------------------------------------------------

def plot_curve(path: Path, picked: dict, curve: dict, chosen: dict, s: dict, arms: list[str], name: str) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, arm in enumerate(arms):
        nudge = 1 + 0.03 * (i - (len(arms) - 1) / 2)
        rows = curve.get(arm, [])
        points = [(row["lr"], v) for row in rows for v in row["values"] if v is not None]
        ax.scatter([lr * nudge for lr, _ in points], [v for _, v in points], s=10, color=f"C{i}", alpha=0.45)
        means = [row for row in rows if "mean" in row]
        ax.errorbar([row["lr"] * nudge for row in means], [row["mean"] for row in means],
                    yerr=[[row["mean"] - row["low"] for row in means], [row["high"] - row["mean"] for row in means]],
                    marker="o", ms=4, capsize=3, color=f"C{i}", label=arm)
        if arm in chosen and chosen[arm]["lr"] is not None:
            best = next(row for row in rows if row["lr"] == chosen[arm]["lr"])
            ax.scatter([best["lr"] * nudge], [best["mean"]], s=120, facecolors="none", edgecolors=f"C{i}", lw=1.5)
    lrs = sorted({row["lr"] for rows in curve.values() for row in rows})
    ax.set(xscale="log", xlabel=f"peak lr (min lr = peak / {1 / s.min_lr_ratio:g})",
           ylabel=f"{s.endpoint} ({s.units.name})",
           title=f"{name} selection: seeds {', '.join(map(str, s.selection_seeds))}, per-seed points, "
                 f"means with {s.confidence:.0%} intervals")
    ax.set_xticks(lrs, labels=[f"{lr:g}" for lr in lrs], fontsize=8)
    ax.minorticks_off()
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_test(path: Path, pairs: list[tuple], family: list[dict], s: dict, baseline: str, method: str,
              name: str) -> None:
    deltas = [v - b for _, b, v in pairs]
    cells = [(f"{method} - {baseline}\n(the test)", deltas)]
    fig, ax = plt.subplots(figsize=(7.5 if family else 5.5, 4.2))  # 5.5: the title fits without a family
    p = paired_difference(deltas, [0.0] * len(deltas), s.confidence)
    intervals = [p] + family
    labels = [cells[0][0]] + [row["comparison"].replace(" - ", " -\n", 1) for row in family]
    for x, (label, row) in enumerate(zip(labels, intervals)):
        if x == 0:
            ax.scatter([x + 0.1 * (i / max(1, len(deltas) - 1) - 0.5) for i in range(len(deltas))], deltas, s=12,
                       color="grey", alpha=0.7)
        ax.errorbar([x + 0.2], [row["mean"]], yerr=[[row["mean"] - row["low"]], [row["high"] - row["mean"]]], fmt="o",
                    capsize=4, color="C0" if x == 0 else "C1")
    ax.axhline(0.0, color="k", lw=0.8)
    for sign in (-1, 1):
        ax.axhline(sign * s.margin, color="C3", lw=0.8, ls="--")
    ax.set_xticks(range(len(labels)), labels=labels, fontsize=7)
    ax.set(ylabel=f"Δ ({s.units.name}; positive: the first-named arm is {s.units.higher})",
           title=f"{name} test: {len(pairs)} pairs, each arm at its selected lr")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)

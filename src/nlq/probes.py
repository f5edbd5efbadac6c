"""`nlq study probes`: where can a nonlinear query matter? Synthetic recall and algorithmic tasks (data/tasks.py),
generated on the fly, across widths and difficulty: linear, nonlinear, identity and the +12.5% MLP baseline,
3 seeds, 2-layer models. The report gives held-out accuracy on the answer positions (and loss) per
(task, width), paired differences vs linear with 95% intervals, and accuracy against width per variant.
"""

from __future__ import annotations

import math
from pathlib import Path

from nlq.config import RunConfig, update
from nlq.presets import get_preset
from nlq.study import DataSpec, Run, Study, Variant

VARIANTS = [
    Variant("linear", {"model": {"query": "linear"}}, "baseline: Q = X W_Q"),
    Variant("nonlinear", {"model": {"query": "nonlinear"}}, "the method: Q = (X + f(X)) / 2"),
    Variant("identity", {"model": {"query": "identity"}}, "Q = X, no W_Q"),
    Variant("linear-mlp4.75", {"model": {"mlp_ratio": 4.75}}, "baseline, MLP 4.75x (+12.5%)"),
]
# name -> (task, task_vocab, task_pairs, block_size): difficulty grows with the pairs to hold
TASKS = {
    "mqar-4": ("mqar", 64, 4, 64),
    "mqar-16": ("mqar", 64, 16, 64),
    "lookup-8": ("lookup", 64, 8, 64),
    "copy-8": ("selective-copy", 16, 8, 64),
}
WIDTHS = [32, 64, 128]
SEEDS = [1, 2, 3]


def base() -> RunConfig:
    return update(get_preset("nano"), {
        "model": {"n_layer": 2, "vocab_size": 256, "block_size": 64},
        "train": {"batch_size": 32, "max_steps": 3000, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 100,
                  "weight_decay": 0.0, "eval_every": 500, "log_every": 500, "checkpoint_every": 0, "keep_checkpoints": 1},
        "data": {"eval_windows": 512},
    })


def probe_runs(study: Study) -> list[Run]:
    runs = []
    for task_name, (task, vocab, pairs, block) in TASKS.items():
        for width in WIDTHS:
            changes = {"model": {"n_embd": width, "n_head": max(1, width // 16), "block_size": block},
                       "data": {"task": task, "task_vocab": vocab, "task_pairs": pairs}}
            for seed in SEEDS:
                for variant in study.variants:
                    runs.append(Run(study, variant, seed, None, changes, tag=f"{task_name}-d{width}",
                                    labels={"stage": "probe", "task": task_name, "width": width}))
    return runs


def probes() -> Study:
    study = Study("probes", "mechanism probes: MQAR, lookup recall, selective copy; 4 variants x 3 widths x 3 seeds",
                  base(), VARIANTS, seeds=SEEDS, data=DataSpec("task", "none"), report="probes")
    study.stages = lambda study_dir: iter([probe_runs(study)])
    return study


def build_probes_report(study_dir: Path, study: dict) -> str:
    from nlq.report import _atomic_write, load_summaries, paired_difference, write_runs_csv

    runs = [r for r in load_summaries(study_dir, study) if r.get("stage") == "probe"]
    variants = [v["name"] for v in study["variants"]]
    lines = [f"# Study `{study['name']}`", "", study.get("description", ""), "",
             "Held-out accuracy on the answer positions (mean ± std over seeds), and the paired difference of each "
             "variant to `linear` (same seed: same examples, shared initial weights) with its 95% interval.", "",
             "| task | width | variant | seeds | accuracy | Δ accuracy vs linear | 95% interval | Δ loss vs linear | verdict (loss) |",
             "|---|---|---|---|---|---|---|---|---|"]
    cells = {}
    for task in dict.fromkeys(r["task"] for r in runs):
        for width in sorted({r["width"] for r in runs if r["task"] == task}):
            cell = [r for r in runs if r["task"] == task and r["width"] == width]
            base = {r["seed"]: r for r in cell if r["variant"] == "linear"}
            for variant in variants:
                mine = sorted((r for r in cell if r["variant"] == variant), key=lambda r: r["seed"])
                if not mine:
                    continue
                accs = [r["val_acc"] for r in mine]
                cells[(task, width, variant)] = accs
                mean = sum(accs) / len(accs)
                std = math.sqrt(sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) if len(accs) > 1 else math.nan
                row = f"| {task} | {width} | {variant} | {len(mine)} | {mean:.3f}" + (f" ± {std:.3f}" if len(accs) > 1 else "")
                pairs = [(r, base[r["seed"]]) for r in mine if r["seed"] in base]
                if variant != "linear" and pairs:
                    acc = paired_difference([a["val_acc"] for a, _ in pairs], [b["val_acc"] for _, b in pairs])
                    loss = paired_difference([a["val_loss"] for a, _ in pairs], [b["val_loss"] for _, b in pairs])
                    interval = f"[{acc['low']:+.3f}, {acc['high']:+.3f}]" if not math.isnan(acc["low"]) else "n/a"
                    row += f" | {acc['mean']:+.3f} | {interval} | {loss['mean']:+.4f} | {loss['verdict']} |"
                else:
                    row += " | | | | |"
                lines.append(row)
    lines += ["", "Plot: `probes_accuracy.png` (accuracy against width, a line per variant, band = min..max over seeds).", ""]
    _plot_accuracy(study_dir / "probes_accuracy.png", cells, variants)
    write_runs_csv(study_dir / "results.csv", runs, ["name", "task", "width", "variant", "seed", "val_acc", "val_loss"])
    markdown = "\n".join(lines)
    _atomic_write(study_dir / "report.md", markdown)
    return markdown


def _plot_accuracy(path: Path, cells: dict, variants: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nlq.report import _save_figure

    tasks = list(dict.fromkeys(t for t, _, _ in cells))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4 * max(1, len(tasks)), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for variant in variants:
            points = sorted((w, accs) for (t, w, v), accs in cells.items() if t == task and v == variant)
            if not points:
                continue
            widths = [w for w, _ in points]
            line, = ax.plot(widths, [sum(a) / len(a) for _, a in points], marker="o", label=variant)
            ax.fill_between(widths, [min(a) for _, a in points], [max(a) for _, a in points], color=line.get_color(), alpha=0.15)
        ax.set(xscale="log", xlabel="width d", ylabel="held-out accuracy", title=task, ylim=(0, 1.02))
        ax.set_xticks(sorted({w for t, w, _ in cells if t == task}), labels=[str(w) for w in sorted({w for t, w, _ in cells if t == task})])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _save_figure(fig, path)

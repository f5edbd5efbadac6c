"""The induction transition in retrained runs (docs/RESULTS.md, "The induction transition"): committed chains retrained
with the diagnostics on (scripts/reuse_check.py writes them and says whether every training number is bitwise the
committed one), each drawn as one plot, train loss and prefix-matching score on one step axis, with the step each
rule times (docs/METHOD.md, section 8).

    python analysis/the_induction_transition.py RETRAINED_DIR [RETRAINED_DIR ...] --out results/transition-mechanism

Writes OUT/runs/NAME (config.json, summary.json and metrics.jsonl thinned to its evaluations, its diagnostics and
every 100th training step: what `nlq report --collect` keeps), OUT/NAME.png per run and OUT/mechanism.json: per run
the induction rule's step, the train-loss rule's at 3.45, 3.5 and 3.55 nats, the largest prefix-matching score and
in-context score reached in the constant-lr phase, and the reuse check's largest difference from the committed run.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nlq.runs.metrics import read_metrics  # noqa: E402
from nlq.runs.paths import scrubbed_text  # noqa: E402
from nlq.runs.transitions import PREFIX_KEY, PREFIX_LEVEL, induction_transition, loss_curve, moving_mean  # noqa: E402
from nlq.studies.reports.plan_transitions import LOSS_LEVEL, LOSS_LEVELS, peak_phase, run_timing  # noqa: E402
from nlq.studies.running.collect import thin  # noqa: E402


def reading(run: Path, records: list[dict], checks: dict) -> dict:
    """One retrained run's transition by each rule, and what its diagnostics reached."""
    phase = peak_phase(records)
    timing = run_timing(records)
    induction = induction_transition(records)
    diagnostics = [r for r in phase if PREFIX_KEY in r]
    return {"run": run.name, "induction_step": induction.step if induction else None,
            "induction_censored": induction.censored if induction else None,
            "loss_steps": {level: t["step"] if not t["censored"] else None for level, t in timing["levels"].items()},
            "prefix_matching_max": max((r[PREFIX_KEY] for r in diagnostics), default=None),
            "icl_score_min": min((r["icl_score"] for r in diagnostics), default=None),
            "reuse_check": checks.get(run.name)}


def plot(run: Path, records: list[dict], row: dict, out: Path) -> None:
    phase = peak_phase(records)
    curve = loss_curve(records)
    smooth = moving_mean(loss_curve(phase), 9)
    diagnostics = [r for r in records if PREFIX_KEY in r]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot([s for s, _ in curve], [v for _, v in curve], color="0.75", lw=0.8, label="train loss (every 100 steps)")
    top.plot([s for s, _ in smooth], [v for _, v in smooth], color="C0", label="centred 9-point mean (peak lr)")
    top.axhline(LOSS_LEVEL, color="C0", ls=":", lw=0.8)
    top.set(ylabel="train loss (nats)", ylim=(2.8, 4.6), title=run.name)
    steps = [r["step"] for r in diagnostics]
    bottom.plot(steps, [r[PREFIX_KEY] for r in diagnostics], color="C3", label="largest prefix-matching score")
    bottom.axhline(PREFIX_LEVEL, color="C3", ls=":", lw=0.8)
    twin = bottom.twinx()
    twin.plot(steps, [r["icl_score"] for r in diagnostics], color="C2", lw=0.8, label="in-context score (nats)")
    twin.set(ylabel="in-context score (nats)")
    bottom.set(xlabel="step", ylabel="prefix matching", ylim=(0, 1))
    for ax in (top, bottom):
        if row["induction_step"] is not None and not row["induction_censored"]:
            ax.axvline(row["induction_step"], color="C3", ls="--", lw=0.8)
        if row["loss_steps"].get(f"{LOSS_LEVEL:g}") is not None:
            ax.axvline(row["loss_steps"][f"{LOSS_LEVEL:g}"], color="C0", ls="--", lw=0.8)
    top.legend(loc="upper right", fontsize=8)
    bottom.legend(loc="upper left", fontsize=8)
    twin.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("retrained", nargs="+", help="a reuse check's --out (runs/ and reuse_check.json)")
    parser.add_argument("--out", required=True, help="where the thinned runs, plots and mechanism.json go")
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    rows = []
    for folder in map(Path, args.retrained):
        check = folder / "reuse_check.json"
        checks = {r["run"]: r["largest_difference"] for r in json.loads(check.read_text())["runs"]} \
            if check.is_file() else {}
        for run in sorted(p.parent for p in (folder / "runs").glob("*/summary.json")):
            records = read_metrics(run / "metrics.jsonl")
            if not any(PREFIX_KEY in r for r in records):
                continue
            row = reading(run, records, checks)
            target = out / "runs" / run.name
            target.mkdir(exist_ok=True)
            shutil.copy2(run / "summary.json", target / "summary.json")
            (target / "config.json").write_text(scrubbed_text((run / "config.json").read_text()))  # no absolute path
            (target / "metrics.jsonl").write_text(thin(run / "metrics.jsonl", 100))
            plot(target, records, row, out / f"{run.name}.png")
            rows.append(row)
            levels = ", ".join(f"{k}: {v}" for k, v in row["loss_steps"].items())
            print(f"{run.name}: induction rule {row['induction_step']}"
                  f"{' (censored)' if row['induction_censored'] else ''}; train-loss rule {levels}; largest prefix "
                  f"matching {row['prefix_matching_max']:.3f}, in-context score down to {row['icl_score_min']:+.2f}; "
                  f"reuse check: {row['reuse_check']}")
    rows.sort(key=lambda row: row["run"])
    (out / "mechanism.json").write_text(json.dumps({"levels": list(LOSS_LEVELS), "prefix_level": PREFIX_LEVEL,
                                                    "runs": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()

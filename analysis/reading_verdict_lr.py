"""Exploratory readings of verdict-lr's primary test, after it (docs/RESULTS.md, "Reading verdict-lr"). Nothing
here was registered in advance and nothing is adjusted for multiplicity: these are the questions the outcome
raises, with intervals to size them, not further tests.

1. When the gap opens at the selected lrs: Δ = nonlinear - linear on the 128 fixed eval windows at each
   evaluation of the test seeds' shared stable runs, then the cooldown's end on the whole validation split.
2. What the lr did: each variant at its selected lr in verdict-lr's test seeds against the same variant at the
   one shared lr (2e-3) of the verdict study: same shape, data, schedule shape and budget, other seeds (unpaired,
   Welch intervals); and the gap Δ itself, verdict-lr's per-seed Δ against the verdict's.
3. How robust the test's mean is to its largest pair: the seeds where nonlinear is worse, the median Δ with the
   Wilcoxon signed-rank test, and the mean Δ without the seed of the largest |Δ| (chosen after looking: a size,
   not a test).

    python analysis/reading_verdict_lr.py [--results results]
"""

import argparse
from pathlib import Path

import numpy as np
from reading_the_verdict import by_seed, gap_over_training, interval, paired, row, runs_of, welch
from scipy import stats

from nlq.runs.metrics import read_metrics
from nlq.studies.tables import read_study

ROOT = Path(__file__).resolve().parent.parent
TPP = 300


def on_test_seeds(study_dir: Path) -> list[dict]:
    """verdict-lr's runs on its test seeds (the primary arms at their selected lrs: the only lrs tried there)."""
    seeds = set(read_study(study_dir)["settings"]["seeds"])
    return [r for r in runs_of(study_dir) if r["seed"] in seeds]


def what_the_lr_did(runs: list[dict], verdict: list[dict]) -> list[str]:
    lines = [row("comparison (whole val split, 300 tokens/param)", "runs", "mean difference [Welch 95%]", "p"),
             row(*["---"] * 4)]
    where = {"stage": "budget", "tpp": TPP}
    own, shared = {}, {}
    shared_lr = min({r["lr"] for r in verdict if r.get("stage") == "budget"})
    for variant in ("linear", "nonlinear"):
        own[variant] = by_seed(runs, "full_val_loss", variant=variant, **where)
        shared[variant] = by_seed(verdict, "full_val_loss", variant=variant, **where)
        lr = {r["lr"] for r in runs if r["variant"] == variant and r.get("stage") == "budget"}
        w = welch(list(own[variant].values()), list(shared[variant].values()))
        label = f"{variant} at its selected lr {min(lr):g} (verdict-lr) - {variant} at {shared_lr:g} (verdict)"
        lines.append(row(label,
                         f"{w['n'][0]} vs {w['n'][1]}", interval(w), f"{w['p']:.2g}"))
    gaps = [{s: d["nonlinear"][s] - d["linear"][s] for s in d["nonlinear"].keys() & d["linear"].keys()}
            for d in (own, shared)]
    w = welch(list(gaps[0].values()), list(gaps[1].values()))
    label = f"Δ nonlinear - linear, each at its own lr (verdict-lr) - Δ at the shared {shared_lr:g} (verdict)"
    lines.append(row(label,
                     f"{w['n'][0]} vs {w['n'][1]} pairs", interval(w), f"{w['p']:.2g}"))
    return lines


def robustness(study_dir: Path, runs: list[dict]) -> list[str]:
    where = {"stage": "budget", "tpp": TPP}
    lin = by_seed(runs, "full_val_loss", variant="linear", **where)
    non = by_seed(runs, "full_val_loss", variant="nonlinear", **where)
    delta = {s: non[s] - lin[s] for s in sorted(lin.keys() & non.keys())}
    if len(delta) < 2:
        return []
    worst = max(delta, key=lambda s: abs(delta[s]))
    rest = [s for s in delta if s != worst]
    p = paired({s: non[s] for s in rest}, {s: lin[s] for s in rest})
    wilcoxon = stats.wilcoxon(list(delta.values()))
    stable = {}
    for r in runs:
        if r.get("stage") == "stable" and r["seed"] == worst and r["variant"] in ("linear", "nonlinear"):
            records = [m for m in read_metrics(study_dir / "runs" / r["name"] / "metrics.jsonl") if "val_loss" in m]
            stable[r["variant"]] = ", ".join(f"{m['val_loss']:.3f}" for m in records[1:])
    return [f"nonlinear worse on {sum(d > 0 for d in delta.values())} of {len(delta)} seeds; median Δ "
            f"{np.median(list(delta.values())):+.4f} (Wilcoxon signed-rank p = {wilcoxon.pvalue:.2g})",
            f"the largest |Δ|: seed {worst}, Δ {delta[worst]:+.4f} (linear {lin[worst]:.4f}, nonlinear "
            f"{non[worst]:.4f}); without it: {interval(p)} ({p['n']} pairs, p = {p['p']:.2g})",
            *(f"seed {worst}'s {v} stable run, 128 fixed windows at each evaluation after step 0: {stable[v]}"
              for v in sorted(stable))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    study_dir = args.results / "verdict-lr"
    runs = on_test_seeds(study_dir)
    print("1. When the gap opens, each variant at its selected lr (paired, the test seeds)\n")
    print("\n".join(gap_over_training(study_dir, runs, budgets=(TPP,))))
    print("\n2. What the lr did (unpaired, other seeds)\n")
    print("\n".join(what_the_lr_did(runs, runs_of(args.results / "verdict"))))
    print("\n3. How robust the mean is to its largest pair\n")
    print("\n".join(robustness(study_dir, runs)))


if __name__ == "__main__":
    main()

"""Exploratory readings of the verdict study, after its pre-registered test (docs/RESULTS.md, "Reading the
verdict"). Nothing here was registered in advance and nothing here is adjusted for multiplicity: these are
the questions the outcome raises, with intervals to size them, not further tests.

1. When the gap opens: Δ = nonlinear - linear on the 128 fixed eval windows at each evaluation of the shared
   stable runs (14 pairs), then each cooldown's end on the whole validation split.
2. Whether it grows with tokens: per seed, Δ at 300 minus Δ at 100 tokens per parameter (whole val split).
3. Δ against tokens per parameter at the one shared lr (2e-3): results/scaling-shared-lr (2-20 tokens per
   parameter, 3 pairs) beside the verdict (100 and 300, 14 pairs), on the 128 fixed windows every study shares.
4. The learning rate: the scaling study trained the nonlinear query at its swept lr 8e-3 on the same data,
   schedule shape and eval windows. Unpaired (other seeds), Welch intervals, 3 runs against 14.

    python analysis/reading_the_verdict.py [--results results]
"""

import argparse
from pathlib import Path

import numpy as np
from scipy import stats

from nlq.runs.metrics import read_metrics
from nlq.studies.definition.design import read_study
from nlq.studies.definition.tables import load_summaries
from nlq.studies.inference.stats import paired_difference

ROOT = Path(__file__).resolve().parent.parent


def runs_of(study_dir: Path) -> list[dict]:
    return load_summaries(study_dir, read_study(study_dir))


def by_seed(runs: list[dict], key: str, **where) -> dict[int, float]:
    return {r["seed"]: r[key] for r in runs if all(r.get(k) == v for k, v in where.items())}


def paired(variant: dict[int, float], baseline: dict[int, float]) -> dict:
    seeds = sorted(variant.keys() & baseline.keys())
    return paired_difference([variant[s] for s in seeds], [baseline[s] for s in seeds])


def welch(a: list[float], b: list[float]) -> dict:
    """mean(a) - mean(b) with Welch's 95% interval."""
    test = stats.ttest_ind(a, b, equal_var=False)
    ci = test.confidence_interval(0.95)
    return {"mean": float(np.mean(a) - np.mean(b)), "low": float(ci.low), "high": float(ci.high),
            "p": float(test.pvalue), "n": (len(a), len(b))}


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def interval(p: dict) -> str:
    return f"{p['mean']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}]"


def gap_over_training(study_dir: Path, runs: list[dict], budgets: tuple = (100, 300)) -> list[str]:
    curves = {}
    for r in runs:
        if r.get("stage") == "stable":
            records = read_metrics(study_dir / "runs" / r["name"] / "metrics.jsonl")
            curves[(r["arm"], r["seed"])] = {m["step"]: m["val_loss"] for m in records if "val_loss" in m}
    seeds = sorted({s for v, s in curves if v == "nonlinear"} & {s for v, s in curves if v == "linear"})
    steps = sorted(set.intersection(*(set(curves[(v, s)]) for v in ("linear", "nonlinear") for s in seeds)))
    lines = [row("step", "phase", "pairs", "linear (mean)", "Δ nonlinear - linear [95%]"), row(*["---"] * 5)]
    for step in steps:
        lin = {s: curves[("linear", s)][step] for s in seeds}
        non = {s: curves[("nonlinear", s)][step] for s in seeds}
        p = paired(non, lin)
        lines.append(row(f"{step:,}", "stable (128 windows)", p["n"], f"{np.mean(list(lin.values())):.4f}",
                         interval(p)))
    for tpp in budgets:
        lin = by_seed(runs, "full_val_loss", stage="budget", tpp=tpp, arm="linear")
        non = by_seed(runs, "full_val_loss", stage="budget", tpp=tpp, arm="nonlinear")
        p = paired(non, lin)
        step = next(r["final_step"] for r in runs if r.get("stage") == "budget" and r.get("tpp") == tpp)
        lines.append(row(f"{step:,}", f"end of the {tpp} tokens/param cooldown (whole split)", p["n"],
                         f"{np.mean(list(lin.values())):.4f}", interval(p)))
    return lines


def growth(runs: list[dict]) -> str:
    delta = {}
    for tpp in (100, 300):
        lin = by_seed(runs, "full_val_loss", stage="budget", tpp=tpp, arm="linear")
        non = by_seed(runs, "full_val_loss", stage="budget", tpp=tpp, arm="nonlinear")
        delta[tpp] = {s: non[s] - lin[s] for s in lin.keys() & non.keys()}
    p = paired(delta[300], delta[100])
    return f"Δ at 300 minus Δ at 100 tokens per parameter, per seed: {interval(p)} ({p['n']} seeds, p = {p['p']:.2g})"


def shared_lr_trend(results: Path, verdict_runs: list[dict]) -> list[str]:
    shared = runs_of(results / "scaling-shared-lr")
    lines = [row("tokens/param", "study", "pairs", "Δ nonlinear - linear [95%], 128 fixed windows"), row(*["---"] * 4)]
    for name, runs, budgets in (("scaling-shared-lr", shared, (2, 5, 10, 20)), ("verdict", verdict_runs, (100, 300))):
        for tpp in budgets:
            where = {"stage": "budget", "tpp": tpp, "width": "d64"}
            p = paired(by_seed(runs, "val_loss", arm="nonlinear", **where),
                       by_seed(runs, "val_loss", arm="linear", **where))
            lines.append(row(tpp, name, p["n"], interval(p)))
    return lines


def learning_rate(results: Path, verdict_runs: list[dict]) -> list[str]:
    scaling = runs_of(results / "scaling")
    lines = [row("tokens/param", "comparison (128 fixed windows)", "runs", "mean difference [Welch 95%]", "p"),
             row(*["---"] * 5)]
    for tpp in (100, 300):
        where = {"stage": "budget", "tpp": tpp, "width": "d64"}
        own = list(by_seed(scaling, "val_loss", arm="nonlinear", **where).values())
        own_lr = {r["lr"] for r in scaling if r["arm"] == "nonlinear"
                  and all(r.get(k) == v for k, v in where.items())}
        for other in ("nonlinear", "linear"):
            shared = list(by_seed(verdict_runs, "val_loss", arm=other, **where).values())
            w = welch(own, shared)
            lines.append(row(tpp, f"nonlinear at lr {min(own_lr):g} (scaling) - {other} at 0.002 (verdict)",
                             f"{w['n'][0]} vs {w['n'][1]}", interval(w), f"{w['p']:.2g}"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    verdict_dir = args.results / "verdict"
    runs = runs_of(verdict_dir)
    print("1. When the gap opens (paired, 14 seeds)\n")
    print("\n".join(gap_over_training(verdict_dir, runs)))
    print("\n2. " + growth(runs))
    print("\n3. Δ against tokens per parameter, both variants at lr 0.002\n")
    print("\n".join(shared_lr_trend(args.results, runs)))
    print("\n4. The nonlinear query at its own swept lr (unpaired, other seeds)\n")
    print("\n".join(learning_rate(args.results, runs)))


if __name__ == "__main__":
    main()

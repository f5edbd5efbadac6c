"""Exploratory readings of verdict-lr's primary test, after it (docs/RESULTS.md, "Reading verdict-lr"). Nothing
here was registered in advance and nothing is adjusted for multiplicity: these are the questions the outcome
raises, with intervals to size them, not further tests.

1. When the gap opens at the selected lrs: Δ = nonlinear - linear on the 128 fixed eval windows at each
   evaluation of the test seeds' shared stable runs, then the cooldown's end on the whole validation split.
2. What the lr did: each variant at its selected lr in verdict-lr's test seeds against the same variant at the
   one shared lr (2e-3) of the verdict study: same shape, data, schedule shape and budget, other seeds (unpaired,
   Welch intervals); and the gap Δ itself, verdict-lr's per-seed Δ against the verdict's.
3. How robust the test's mean is to its largest pair: the seeds where nonlinear is worse (with the two-sided sign
   test), the median Δ with the Wilcoxon signed-rank test, and the mean Δ without the seed of the largest |Δ|
   (chosen after looking: a size, not a test).
4. The 2 x 2 beside its declared family, once every test seed has all four arms: each arm's mean endpoint with its
   interval, and each declared comparison read as 3 reads the primary one (signs, median with Wilcoxon, without
   the primary test's largest-|Δ| seed: the same seed for every comparison), then that seed's stable runs in all
   four arms.

    python analysis/reading_verdict_lr.py [--results results]
"""

import argparse
from pathlib import Path

import numpy as np
from reading_the_verdict import by_seed, gap_over_training, interval, paired, row, runs_of, welch
from scipy import stats

from nlq.runs.metrics import read_metrics
from nlq.studies.definition.design import read_study
from nlq.studies.inference.stats import paired_difference

ROOT = Path(__file__).resolve().parent.parent
TPP = 300


def on_test_seeds(study_dir: Path) -> list[dict]:
    """verdict-lr's runs on its test seeds (the primary arms at their selected lrs: the only lrs tried there)."""
    seeds = set(read_study(study_dir)["design"].seeds)
    return [r for r in runs_of(study_dir) if r["seed"] in seeds]


def what_the_lr_did(runs: list[dict], verdict: list[dict]) -> list[str]:
    lines = [row("comparison (whole val split, 300 tokens/param)", "runs", "mean difference [Welch 95%]", "p"),
             row(*["---"] * 4)]
    where = {"stage": "budget", "tpp": TPP}
    own, shared = {}, {}
    shared_lr = min({r["lr"] for r in verdict if r.get("stage") == "budget"})
    for variant in ("linear", "nonlinear"):
        own[variant] = by_seed(runs, "full_val_loss", arm=variant, **where)
        shared[variant] = by_seed(verdict, "full_val_loss", arm=variant, **where)
        lr = {r["lr"] for r in runs if r["arm"] == variant and r.get("stage") == "budget"}
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
    lin = by_seed(runs, "full_val_loss", arm="linear", **where)
    non = by_seed(runs, "full_val_loss", arm="nonlinear", **where)
    delta = {s: non[s] - lin[s] for s in sorted(lin.keys() & non.keys())}
    if len(delta) < 2:
        return []
    worst = max(delta, key=lambda s: abs(delta[s]))
    rest = [s for s in delta if s != worst]
    p = paired({s: non[s] for s in rest}, {s: lin[s] for s in rest})
    wilcoxon = stats.wilcoxon(list(delta.values()))
    worse = sum(d > 0 for d in delta.values())
    sign = stats.binomtest(worse, sum(d != 0 for d in delta.values())).pvalue  # two-sided, ties left out
    stable = {}
    for r in runs:
        if r.get("stage") == "stable" and r["seed"] == worst and r["arm"] in ("linear", "nonlinear"):
            records = [m for m in read_metrics(study_dir / "runs" / r["name"] / "metrics.jsonl") if "val_loss" in m]
            stable[r["arm"]] = ", ".join(f"{m['val_loss']:.3f}" for m in records[1:])
    return [f"nonlinear worse on {worse} of {len(delta)} seeds (sign test p = {sign:.2g}); median Δ "
            f"{np.median(list(delta.values())):+.4f} (Wilcoxon signed-rank p = {wilcoxon.pvalue:.2g})",
            f"the largest |Δ|: seed {worst}, Δ {delta[worst]:+.4f} (linear {lin[worst]:.4f}, nonlinear "
            f"{non[worst]:.4f}); without it: {interval(p)} ({p['n']} pairs, p = {p['p']:.2g})",
            *(f"seed {worst}'s {v} stable run, 128 fixed windows at each evaluation after step 0: {stable[v]}"
              for v in sorted(stable))]


def two_by_two(study_dir: Path, runs: list[dict]) -> list[str]:
    s = read_study(study_dir)["design"]
    arms = s.primary + s.secondary
    where = {"stage": "budget", "tpp": TPP}
    loss = {arm: by_seed(runs, "full_val_loss", arm=arm, **where) for arm in arms}
    seeds = sorted(set(s.seeds).intersection(*(loss[arm].keys() for arm in arms)))
    if len(seeds) < len(s.seeds):
        return [f"{len(seeds)} of {len(s.seeds)} test seeds have all four arms; read once all have."]
    lines = [row("arm (whole val split, 300 tokens/param)", "seeds", "mean [95%]"), row(*["---"] * 3)]
    for arm in arms:
        p = paired_difference([loss[arm][seed] for seed in seeds], [0.0] * len(seeds))
        lines.append(row(arm, p["n"], f"{p['mean']:.4f} [{p['low']:.4f}, {p['high']:.4f}]"))
    primary = {seed: loss[s.primary[1]][seed] - loss[s.primary[0]][seed] for seed in seeds}
    worst = max(primary, key=lambda seed: abs(primary[seed]))
    lines += ["", row("declared comparison", "first arm worse on", "median Δ (Wilcoxon p)",
                      f"mean Δ [95%] without seed {worst}"), row(*["---"] * 4)]
    for member in s.secondary_family or []:
        if member == "interaction":
            (nq, lq), (n, ln) = s.secondary[::-1], s.primary[::-1]
            delta = {seed: (loss[nq][seed] - loss[lq][seed]) - (loss[n][seed] - loss[ln][seed]) for seed in seeds}
            label = f"interaction: ({nq} - {lq}) - ({n} - {ln})"
        else:
            variant, baseline = member
            delta = {seed: loss[variant][seed] - loss[baseline][seed] for seed in seeds}
            label = f"{variant} - {baseline}"
        rest = [delta[seed] for seed in seeds if seed != worst]
        p = paired_difference(rest, [0.0] * len(rest))
        lines.append(row(label, f"{sum(d > 0 for d in delta.values())} of {len(delta)}",
                         f"{np.median(list(delta.values())):+.4f} ({stats.wilcoxon(list(delta.values())).pvalue:.2g})",
                         f"{interval(p)} ({p['n']} seeds)"))
    lines.append("")
    for arm in arms:
        for r in runs:
            if r.get("stage") == "stable" and r["seed"] == worst and r["arm"] == arm:
                records = [m for m in read_metrics(study_dir / "runs" / r["name"] / "metrics.jsonl") if "val_loss" in m]
                lines.append(f"seed {worst}'s {arm} stable run, 128 fixed windows at each evaluation after step 0: "
                             + ", ".join(f"{m['val_loss']:.3f}" for m in records[1:]))
    return lines


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
    print("\n4. The 2 x 2 beside its declared family (the test seeds)\n")
    print("\n".join(two_by_two(study_dir, runs)))


if __name__ == "__main__":
    main()

"""Exploratory readings of gate-lr's primary test, after it (docs/RESULTS.md, "Reading gate-lr"). Nothing here was
registered in advance and nothing is adjusted for multiplicity: these are the questions the outcome raises, with
intervals to size them, not further tests.

1. Each arm on the test seeds (the borrowed arms read from results/verdict-lr): its lr, mean endpoint and the spread
   of its endpoints over the seeds (sd, with its 95% chi-square interval).
2. How robust the primary mean is: the seeds where gate-qknorm is worse (two-sided sign test), the median Δ with the
   Wilcoxon signed-rank test, and the mean Δ without each of the two largest positive pairs.
3. Where the mean difference comes from: Δ on the seeds where linear-qknorm ended highest against the rest, the
   correlation of Δ with linear-qknorm's endpoint, and whether gate-qknorm's endpoints spread less than
   linear-qknorm's on the same seeds (the Pitman-Morgan test for paired variances: the correlation of the pairs'
   sums with their differences). Then every other arm's spread against linear-qknorm's the same way, once it has
   every test seed (mlp4.5-qknorm and identity-gate-qknorm ran at gate-qknorm's lr, 4e-3), with its mean Δ against
   linear-qknorm on the same two groups of seeds.

    python analysis/reading_gate_lr.py [--results results]
"""

import argparse
from pathlib import Path

import numpy as np
from reading_the_verdict import interval, paired, row
from scipy import stats

from nlq.studies.definition.design import read_study
from nlq.studies.definition.tables import load_summaries
from nlq.studies.running.engine import run_records

ROOT = Path(__file__).resolve().parent.parent
BASELINE, GATE = "linear-qknorm", "gate-qknorm"
HIGHEST = 5  # how many of linear-qknorm's highest endpoints section 3 sets apart (chosen after looking)


def test_endpoints(study_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, float]]:
    """arm -> seed -> full_val_loss on the test seeds (borrowed arms included), and each arm's lr there."""
    study = read_study(study_dir)
    seeds = set(study["design"].seeds)
    ends, lrs = {}, {}
    for r in load_summaries(study_dir, {"runs": run_records(study_dir, study)}):
        if r.get("stage") == "budget" and r["seed"] in seeds:
            ends.setdefault(r["arm"], {})[r["seed"]] = r["full_val_loss"]
            lrs[r["arm"]] = r["lr"]
    return ends, lrs


def sd_interval(values: list[float]) -> str:
    n, sd = len(values), float(np.std(values, ddof=1))
    low, high = (sd * np.sqrt((n - 1) / stats.chi2.ppf(q, n - 1)) for q in (0.975, 0.025))
    return f"{sd:.4f} [{low:.4f}, {high:.4f}]"


def spreads(ends: dict, lrs: dict, seeds: int) -> list[str]:
    lines = [row("arm", "lr", "test seeds", "mean full_val_loss", "sd over seeds [95%]"), row(*["---"] * 5)]
    for arm, by_seed in ends.items():
        values = list(by_seed.values())
        lines.append(row(arm, f"{lrs[arm]:g}", f"{len(values)} of {seeds}", f"{np.mean(values):.4f}",
                         sd_interval(values) if len(values) > 2 else ""))
    return lines


def robustness(gate: dict, base: dict) -> list[str]:
    seeds = sorted(gate.keys() & base.keys())
    delta = {s: gate[s] - base[s] for s in seeds}
    worse = sum(d > 0 for d in delta.values())
    sign = stats.binomtest(worse, sum(d != 0 for d in delta.values())).pvalue
    wilcoxon = stats.wilcoxon(list(delta.values()))
    lines = [f"{GATE} worse on {worse} of {len(seeds)} seeds (sign test p {sign:.2g}); median Δ "
             f"{np.median(list(delta.values())):+.4f} (Wilcoxon p {wilcoxon.pvalue:.2g})"]
    for seed in sorted(delta, key=lambda s: -delta[s])[:2]:
        rest = [s for s in seeds if s != seed]
        p = paired({s: gate[s] for s in rest}, {s: base[s] for s in rest})
        lines.append(f"without seed {seed} (Δ {delta[seed]:+.4f}): {interval(p)} over {p['n']} pairs")
    return lines


def where_it_comes_from(ends: dict) -> list[str]:
    base, gate = ends[BASELINE], ends[GATE]
    seeds = sorted(gate.keys() & base.keys())
    high = sorted(seeds, key=lambda s: -base[s])[:HIGHEST]
    rest = [s for s in seeds if s not in high]
    lines = []
    for label, group in ((f"the {HIGHEST} seeds where {BASELINE} ended highest", high), ("the other seeds", rest)):
        lows = [base[s] for s in group]
        deltas = [gate[s] - base[s] for s in group]
        lines.append(f"{label} ({', '.join(map(str, sorted(group)))}): {BASELINE} {min(lows):.4f} to {max(lows):.4f}; "
                     f"Δ {min(deltas):+.4f} to {max(deltas):+.4f}, mean {np.mean(deltas):+.4f}")
    r = stats.pearsonr([base[s] for s in seeds], [gate[s] - base[s] for s in seeds])
    lines.append(f"correlation of Δ with {BASELINE}'s endpoint over {len(seeds)} seeds: r {r.statistic:+.2f} "
                 f"(p {r.pvalue:.2g})")
    lines.append("")
    lines.append(row("arm (same seeds as linear-qknorm)", "seeds", f"sd arm / sd {BASELINE}",
                     "Pitman-Morgan r", "p", f"mean Δ on the {HIGHEST} highest", "mean Δ on the rest"))
    lines.append(row(*["---"] * 7))
    for arm, by_seed in ends.items():
        common = sorted(by_seed.keys() & base.keys())
        if arm == BASELINE or len(common) < len(base):
            continue  # a spread compared on fewer seeds than the baseline has would not be the same comparison
        a, b = np.array([by_seed[s] for s in common]), np.array([base[s] for s in common])
        test = stats.pearsonr(a + b, a - b)  # equal variances <=> the sums and differences are uncorrelated
        gap = {s: by_seed[s] - base[s] for s in common}
        lines.append(row(arm, len(common), f"{np.std(a, ddof=1) / np.std(b, ddof=1):.2f}",
                         f"{test.statistic:+.2f}", f"{test.pvalue:.2g}", f"{np.mean([gap[s] for s in high]):+.4f}",
                         f"{np.mean([gap[s] for s in rest]):+.4f}"))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    study_dir = args.results / "gate-lr"
    ends, lrs = test_endpoints(study_dir)
    seeds = len(read_study(study_dir)["design"].seeds)
    print("## 1. Each arm on the test seeds\n")
    print("\n".join(spreads(ends, lrs, seeds)))
    print(f"\n## 2. How robust the primary mean is ({GATE} - {BASELINE})\n")
    print("\n".join(robustness(ends[GATE], ends[BASELINE])))
    print("\n## 3. Where the mean difference comes from\n")
    print("\n".join(where_it_comes_from(ends)))


if __name__ == "__main__":
    main()

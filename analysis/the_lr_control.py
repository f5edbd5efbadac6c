"""The lr control in numbers (docs/RESULTS.md, "The lr control"): the trend of Δ (nonlinear - linear) per doubling
of tokens per parameter at d 64 over the budgets both studies share (2 to 20 tokens per parameter), at the
nonlinear query's own swept lr (results/scaling) and at the shared lr (results/scaling-shared-lr), and the
per-seed difference of the two slopes with its 95% t interval.

    python analysis/the_lr_control.py
"""

from pathlib import Path

from nlq.studies.definition.design import read_study
from nlq.studies.definition.tables import load_summaries
from nlq.studies.inference.stats import paired_difference
from nlq.studies.reports.scaling import tpp_trends

RESULTS = Path(__file__).resolve().parent.parent / "results"


def slopes(name: str, budgets: set) -> dict:
    study_dir = RESULTS / name
    runs = [r for r in load_summaries(study_dir, read_study(study_dir))
            if r.get("stage") == "budget" and r["width"] == "d64" and r["tpp"] in budgets]
    trends = {}
    for seed in sorted({r["seed"] for r in runs}):
        trend = tpp_trends([r for r in runs if r["seed"] == seed], ["linear", "nonlinear"])[("d64", "nonlinear")]
        trends[seed] = trend["mean"]
    return trends


def main() -> None:
    budgets = {2, 5, 10, 20}
    own, shared = slopes("scaling", budgets), slopes("scaling-shared-lr", budgets)
    for name, per_seed in (("own lr (scaling)", own), ("shared lr (scaling-shared-lr)", shared)):
        p = paired_difference(list(per_seed.values()), [0.0] * len(per_seed))
        print(f"{name}: Δ per doubling over 2-20 tokens/param {p['mean']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}] "
              f"({p['n']} seeds)")
    seeds = sorted(own.keys() & shared.keys())
    p = paired_difference([own[s] for s in seeds], [shared[s] for s in seeds])
    print(f"own minus shared, per seed: {p['mean']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}] ({p['n']} seeds)")


if __name__ == "__main__":
    main()

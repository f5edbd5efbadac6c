"""Readings of digits-controls after its outcome (docs/RESULTS.md, "Reading digits-controls"). The registration asked
for accuracy beside the endpoint for the same pairs; the report prints it for the primary pair only, so here it is for
every registered comparison (unadjusted, a reading beside the Holm-adjusted loss), and then, exploratory, how the
outcome compares with digits-lr's on its fixed split:

1. Per registered comparison (the primary, then the declared family in its order): the pairs, Δ test loss and Δ test
   accuracy (first - second; accuracy positive: the first more accurate), each with its 95% paired t interval.
2. Each arm on the test seeds: its lr, mean test loss and accuracy, and how many of its seeds' test splits it saw.
3. digits-lr beside it: linear and nonlinear there (one fixed split, linear at 1e-3, nonlinear at 2.5e-4) and here
   (a split drawn per seed, linear at 2.5e-4, nonlinear at 5e-4), by arm (Welch intervals: the seeds and splits
   differ between the studies).

    python analysis/reading_digits_controls.py [--results results]
"""

import argparse
from pathlib import Path

import numpy as np
from reading_the_verdict import interval, paired, row, welch

from nlq.studies.definition.design import read_study
from nlq.studies.definition.tables import load_summaries
from nlq.studies.reports.plan_sections import family_members

ROOT = Path(__file__).resolve().parent.parent


def test_runs(study_dir: Path) -> tuple[dict, dict, dict]:
    """arm -> seed -> (test loss, test accuracy, split hash) at the arm's tested lr on the test seeds, each arm's lr."""
    study = read_study(study_dir)
    seeds = set(study["design"].seeds)
    loss, acc, splits, lrs = {}, {}, {}, {}
    for r in load_summaries(study_dir, study):
        if r.get("stage") == "budget" and r["seed"] in seeds:
            loss.setdefault(r["arm"], {})[r["seed"]] = r["full_val_loss"]
            acc.setdefault(r["arm"], {})[r["seed"]] = r["test_accuracy"]
            splits.setdefault(r["arm"], {})[r["seed"]] = (r.get("split") or {}).get("hash")
            lrs[r["arm"]] = r["lr"]
    return {"loss": loss, "acc": acc, "split": splits}, lrs, study


def comparisons(values: dict, study: dict) -> list[str]:
    s = study["design"]
    members = [s.primary[::-1]] + [m for m in family_members(s) if m != "interaction"]
    lines = [row("comparison", "pairs", "Δ test loss [95%]", "Δ test accuracy, points [95%]", "same split per pair"),
             row(*["---"] * 5)]
    for first, second in members:
        loss = paired(values["loss"][first], values["loss"][second])
        acc = paired({k: 100 * v for k, v in values["acc"][first].items()},
                     {k: 100 * v for k, v in values["acc"][second].items()})
        seeds = values["split"][first].keys() & values["split"][second].keys()
        same = sum(values["split"][first][k] == values["split"][second][k] for k in seeds)
        lines.append(row(f"{first} - {second}", loss["n"], interval(loss), interval(acc), f"{same} of {len(seeds)}"))
    return lines


def arms(values: dict, lrs: dict) -> list[str]:
    lines = [row("arm", "lr", "test seeds", "mean test loss", "mean test accuracy", "distinct splits"),
             row(*["---"] * 6)]
    for arm, by_seed in values["loss"].items():
        lines.append(row(arm, f"{lrs[arm]:g}", len(by_seed), f"{np.mean(list(by_seed.values())):.4f}",
                         f"{100 * np.mean(list(values['acc'][arm].values())):.2f}%",
                         len(set(values["split"][arm].values()))))
    return lines


def beside_digits_lr(here: dict, there: dict, lrs_here: dict, lrs_there: dict) -> list[str]:
    lines = [row("arm", "digits-lr (fixed split): lr, mean loss", "digits-controls (split per seed): lr, mean loss",
                 "here - there [95% Welch]"), row(*["---"] * 4)]
    for arm in ("linear", "nonlinear"):
        a, b = list(here["loss"][arm].values()), list(there["loss"][arm].values())
        lines.append(row(arm, f"{lrs_there[arm]:g}, {np.mean(b):.4f}", f"{lrs_here[arm]:g}, {np.mean(a):.4f}",
                         interval(welch(a, b))))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    values, lrs, study = test_runs(args.results / "digits-controls")
    there, lrs_there, _ = test_runs(args.results / "digits-lr")
    print("## Every registered comparison, loss and accuracy (unadjusted)\n")
    print("\n".join(comparisons(values, study)))
    print("\n## Each arm on the test seeds\n")
    print("\n".join(arms(values, lrs)))
    print("\n## Beside digits-lr (exploratory)\n")
    print("\n".join(beside_digits_lr(values, there, lrs, lrs_there)))


if __name__ == "__main__":
    main()

"""The power computation behind `nlq study verdict`'s number of pairs (docs/RESULTS.md, "Pre-registration").

First the planning sd: the paired sd of nonlinear - linear pooled over the budgets of results/scaling-shared-lr
(both at lr 2e-3, the verdict's design at smaller budgets), with the upper one-sided 80% confidence bound.

For each paired sd and number of pairs: the power of the two-sided paired t test (95%) to find a true
difference of the margin, and the power of the equivalence test (TOST, alpha 0.05 each side, +-margin) to
show equivalence when the true difference is 0.

With --study verdict-lr (as amended on 2026-12-01): the paired sd the verdict measured at 300 tokens per
parameter (results/verdict) with its upper one-sided 80% bound; then the power of the paired t test to find a
true difference of 0.02 nats (verdict-lr's planning difference) and of the equivalence test at the margin, for
several sds and numbers of pairs, and the fewest pairs with at least 70% power at the planning sd 0.03.

With --pace N: the time verdict-lr's first N chains took (a chain: a stable run and its cooldown branch; from
the start and end each run's summary.json records in results/verdict-lr), and what the rest of the study takes
at that pace as two shards (the amendment's record of its cost); once all its chains have ended, their
recorded run time in all.

With --study gate-lr: the paired sds verdict-lr measured on its 16 test seeds for each declared comparison (the
QK-norm pairs are the ones gate-lr's arms resemble), with the upper one-sided 80% bound of the QK-norm pair's; then
the power table at gate-lr's planning difference and margin. With --pace N it reads gate-lr's chains (93 to train:
its borrowed arms are verdict-lr's).

With --study mnist1d-lr: the paired sd of the pilot (results/mnist1d-pilot: linear and nonlinear at one lr on 8
seeds that mnist1d-lr never uses) with its upper one-sided 80% bound, and the power table at mnist1d-lr's planning
difference and margin.

    python analysis/pre_registration.py [--study verdict-lr|gate-lr|mnist1d-lr] [--pace N]
"""

import argparse
import csv
import datetime
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats

from nlq.studies.definition.design import read_study
from nlq.studies.definition.plan import SHIPPED, load_plan
from nlq.studies.inference.stats import pairs_needed, power_equivalence, power_paired_t

RESULTS = Path(__file__).resolve().parent.parent / "results"
SHARED_LR = RESULTS / "scaling-shared-lr" / "results.csv"


def pooled_paired_sd(path: Path) -> tuple[float, int]:
    """Pooled sd of the per-seed differences nonlinear - linear over every budget, and its degrees of freedom."""
    losses = defaultdict(dict)
    for row in csv.DictReader(path.open()):
        if row["stage"] == "budget":
            losses[(row["width"], row["tpp"])].setdefault(row["seed"], {})[row["variant"]] = float(row["val_loss"])
    squares, df = 0.0, 0
    for cell in losses.values():
        d = [v["nonlinear"] - v["linear"] for v in cell.values() if {"linear", "nonlinear"} <= set(v)]
        if len(d) > 1:
            mean = sum(d) / len(d)
            squares += sum((x - mean) ** 2 for x in d)
            df += len(d) - 1
    return math.sqrt(squares / df), df


def chain_minutes(study_dir: Path) -> list[tuple[str, float, bool]]:
    """(start, minutes, resumed) of every finished chain of a WSD study, in the order they started: the stable run's
    and its branch's wall time (end - start of the process that finished each) added up; resumed: a run of the chain
    was resumed from a checkpoint, so its record holds only the time after the resume."""
    runs = read_study(study_dir)["runs"]
    chains = defaultdict(list)
    for run in runs:
        path = study_dir / "runs" / run["name"] / "summary.json"
        record = json.loads(path.read_text())["record"] if path.is_file() else None
        chains[(run["arm"], run["seed"], run["lr"], run.get("width"))].append(record)
    out = []
    for records in chains.values():
        if all(records):
            times = [(datetime.datetime.fromisoformat(r["started_utc"].replace("Z", "+00:00")),
                      datetime.datetime.fromisoformat(r["ended_utc"].replace("Z", "+00:00"))) for r in records]
            out.append((min(t[0] for t in times).isoformat(),
                        sum((end - start).total_seconds() for start, end in times) / 60,
                        any(r.get("resumed_at_step") for r in records)))
    return sorted(out)


def chains_to_train(study: str) -> int:
    """A grid plan's chains without edge extensions: every arm it trains (not borrowed) at every grid lr on every
    selection seed, and on every test seed."""
    design = load_plan(SHIPPED / f"{study}.toml").design
    arms = len(design.primary) + len(design.secondary) - len(design.borrowed or {})
    return arms * (len(design.lrs) * len(design.selection_seeds) + len(design.seeds))


def pace(n: int, study_dir: Path = RESULTS / "verdict-lr", total_chains: int = 124, shards: int = 2) -> None:
    first = chain_minutes(study_dir)[:n]
    if len(first) < n:
        raise SystemExit(f"only {len(first)} chains of {study_dir} have finished")
    minutes = sorted(m for _, m, resumed in first if not resumed)
    resumed = n - len(minutes)
    waited = [m for m in minutes if m > 60]  # a chain whose shard was paused for another job
    ran = [m for m in minutes if m <= 60]
    fastest = ran[: max(1, len(ran) // 3)]
    left = total_chains - n
    print(f"first {n} chains: {len(ran)} ran {min(ran):.1f} to {max(ran):.1f} min per chain per shard (median "
          f"{statistics.median(ran):.1f}; the fastest third {min(fastest):.1f} to {max(fastest):.1f}, mean "
          f"{statistics.mean(fastest):.1f}); {len(waited)} waited on a paused shard "
          f"({', '.join(f'{m:.1f}' for m in waited)})"
          + (f"; {resumed} resumed from a checkpoint, left out (their records hold only the time after the resume)"
             if resumed else ""))
    if left == 0:
        hours = sum(m for _, m, _ in first) / 60
        print(f"all {n} chains ended: their records' run time adds up to {hours:.1f} h, {hours / shards:.1f} h per "
              f"shard as {shards} shards (a lower bound: a resumed chain's record holds only the time after its "
              "resume)")
        return
    for label, per_chain in (("fastest third", statistics.mean(fastest)), ("median", statistics.median(ran))):
        print(f"the {left} chains left as {shards} shards at the {label} pace: {left * per_chain / shards / 60:.1f} h")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--study", choices=["verdict", "verdict-lr", "gate-lr", "mnist1d-lr"], default="verdict")
    parser.add_argument("--pace", type=int, metavar="N", help="the pace of the study's first N chains (verdict-lr "
                                                              "unless --study gate-lr or mnist1d-lr), then exit")
    args = parser.parse_args()
    if args.pace:
        study = args.study if args.study in ("gate-lr", "mnist1d-lr") else "verdict-lr"
        return pace(args.pace, RESULTS / study, chains_to_train(study))
    if args.study == "gate-lr":
        family = json.loads((RESULTS / "verdict-lr" / "verdict.json").read_text())["secondary_family"]
        for row in family:
            print(f"verdict-lr, {row['comparison']}: paired sd {row['sd']:.4f} on {row['n'] - 1} df")
        row = next(r for r in family if r["comparison"] == "nonlinear-qknorm - linear-qknorm")
        sd, df = row["sd"], row["n"] - 1
        source, pairs, sds = "paired sd of verdict-lr's QK-norm pair", [12, 14, 16, 18, 20], (0.02, 0.025, 0.03, 0.04)
    elif args.study == "mnist1d-lr":
        interval = json.loads((RESULTS / "mnist1d-pilot" / "verdict.json").read_text())["decision"]["interval"]
        sd, df = interval["sd"], interval["n"] - 1
        source, pairs, sds = "paired sd of the mnist1d pilot", [24, 32, 40, 48, 64], (0.01, 0.015, 0.02, 0.025, 0.03)
    elif args.study == "verdict":
        sd, df = pooled_paired_sd(SHARED_LR)
        source, pairs, sds = f"pooled paired sd of {SHARED_LR.parent.name}", [10, 12, 14, 16], (0.03, 0.04, 0.045, 0.05)
    else:
        interval = json.loads((RESULTS / "verdict" / "verdict.json").read_text())["decision"]["interval"]
        sd, df = interval["sd"], interval["n"] - 1
        source, pairs, sds = "paired sd of verdict at 300 tokens/param", [12, 14, 16, 18, 20], (0.02, 0.025, 0.03, 0.04)
    upper = sd * math.sqrt(df / stats.chi2.ppf(0.2, df))
    print(f"{source}: {sd:.4f} on {df} df; upper one-sided 80% bound {upper:.4f}")
    design = load_plan(SHIPPED / f"{args.study}.toml").design
    margin, alpha, confidence = design.margin, design.alpha, design.confidence
    effect = design.effect
    print(f"true difference {effect} nats for the t test ({confidence:.0%} two-sided); equivalence margin {margin} "
          f"nats (TOST alpha {alpha} per side, true difference 0)")
    print("| paired sd | " + " | ".join(f"{n} pairs: t test / TOST" for n in pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    for sd in sds:
        cells = [f"{power_paired_t(effect, sd, n, confidence):.0%} / {power_equivalence(0.0, sd, n, margin, alpha):.0%}"
                 for n in pairs]
        print(f"| {sd:g} | " + " | ".join(cells) + " |")
    if design.planning_power is not None:
        n = pairs_needed(effect, design.planning_sd, design.planning_power, confidence)
        print(f"fewest pairs with >= {design.planning_power:.0%} power to find {effect} nats at sd "
              f"{design.planning_sd}: {n} (registered: {len(design.seeds)})")


if __name__ == "__main__":
    main()

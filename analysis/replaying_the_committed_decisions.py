"""Replaying the committed decisions as group-sequential designs (docs/RESULTS.md, "Replaying the committed decisions
as group-sequential designs").

Looks fixed before this replay read any pair: `verdict` after 6, 10 and 14 of its 14 pairs; `verdict-lr` after 6,
10 and 16 of its 16, for its primary comparison and each member of its declared family; two-sided alpha 0.05 spent
by the Lan-DeMets O'Brien-Fleming-type function (src/nlq/studies/sequential.py). The pairs enter in each study's
registered seed order. At look k with n_k pairs: stop for a difference when the paired t test's p is at most the
look's nominal level p_k = 2 (1 - Phi(c_k)) (c_k the spending bound; with few pairs the t distribution, not the
normal, turns the bound into a p); stop for equivalence (non-binding: the efficacy bounds keep their alpha whether
or not it is used) when the repeated confidence interval, mean ± t_{1 - p_k / 2, n_k - 1} sd / sqrt(n_k), lies inside
±margin. At the last look the decision is the registered rule's words read off that interval.

Then a Monte Carlo (20,000 studies a cell, seed 0): paired differences normal with the paired sds the studies
observed, and two heavy-tailed cases (t with 3 degrees of freedom scaled to the same sd; a normal with an
occasional stall like verdict-lr's seed 217), at no difference (type I error) and at the planning difference 0.02
nats, for the fixed design (one t test after the last pair) and the sequential one, stopping only for a difference
or also for equivalence; the expected number of pairs beside each.

    python analysis/replaying_the_committed_decisions.py [--sims 20000]   (--sims 0: the replay alone)
"""

import argparse
import csv
import datetime
import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from nlq.studies.inference.sequential import look, nominal_levels, spending_bounds

RESULTS = Path(__file__).resolve().parent.parent / "results"
ALPHA, SPENDING, MARGIN = 0.05, "obf", 0.037


def nominal(looks: list[int]) -> list[float]:
    return nominal_levels(looks, ALPHA, SPENDING)


def words(low: float, high: float, margin: float) -> str:
    if high < 0:
        return "better"
    if low > 0:
        return "worse"
    return "no effect beyond the margin" if -margin < low and high < margin else "inconclusive"


def sequential(deltas: list[float], looks: list[int], margin: float) -> dict:
    """Where a design with these looks stops on these pairs (in order), and its words there."""
    for k in range(len(looks)):
        at = look(deltas, k, looks, ALPHA, SPENDING, margin, stop_for_equivalence=True)
        if at["action"] != "continue":
            low, high = at["repeated"]
            return at | {"low": low, "high": high, "words": words(low, high, margin)}


def fixed(deltas: list[float], margin: float) -> str:
    d = np.asarray(deltas)
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return words(float(d.mean()) - half, float(d.mean()) + half, margin)


def endpoints(study: str) -> dict[tuple[str, int], float]:
    """(arm, seed) -> full_val_loss of the test runs at 300 tokens per parameter (each arm at its selected lr)."""
    selected = json.loads((RESULTS / study / "verdict.json").read_text()).get("selected_lrs")
    out = {}
    for row in csv.DictReader((RESULTS / study / "results.csv").open()):
        if float(row["tpp"]) == 300 and (selected is None or float(row["lr"]) == selected[row["variant"]]):
            out[(row["variant"], int(row["seed"]))] = float(row["full_val_loss"])
    return out


def chain_hours(study: str, arms: list[str], seeds: list[int]) -> float | None:
    """Recorded run time (end - start of each run's record) of these arms' test chains on these seeds, in hours (an
    arm named by its query and QK-norm, as the studies name them); None where those runs record no times (the
    verdict's ran before runs recorded them)."""
    total, missing = 0.0, 0
    for path in (RESULTS / study / "runs").glob("*/summary.json"):
        model, train = (json.loads((path.parent / "config.json").read_text())[k] for k in ("model", "train"))
        arm = model["query"] + ("-qknorm" if model.get("qk_norm") else "")
        record = json.loads(path.read_text()).get("record") or {}
        if arm not in arms or train["seed"] not in seeds:
            continue
        if "ended_utc" not in record:
            missing += 1
            continue
        start, end = (datetime.datetime.fromisoformat(record[k].replace("Z", "+00:00"))
                      for k in ("started_utc", "ended_utc"))
        total += (end - start).total_seconds() / 3600
    return None if missing else total


def replay_rows() -> list[dict]:
    rows = []
    verdict = endpoints("verdict")
    seeds = list(range(101, 115))
    comparisons = [("verdict", "nonlinear - linear", ("nonlinear", "linear"), seeds, [6, 10, 14])]
    lr = endpoints("verdict-lr")
    lr_seeds = list(range(211, 227))
    for variant, base in (("nonlinear", "linear"), ("nonlinear-qknorm", "linear-qknorm"),
                          ("linear-qknorm", "linear"), ("linear-qknorm", "nonlinear")):
        comparisons.append(("verdict-lr", f"{variant} - {base}", (variant, base), lr_seeds, [6, 10, 16]))
    comparisons.append(("verdict-lr", "interaction", None, lr_seeds, [6, 10, 16]))
    for study, name, pair, order, looks in comparisons:
        data = verdict if study == "verdict" else lr
        if pair:
            deltas = [data[(pair[0], s)] - data[(pair[1], s)] for s in order]
        else:
            deltas = [(data[("nonlinear-qknorm", s)] - data[("linear-qknorm", s)])
                      - (data[("nonlinear", s)] - data[("linear", s)]) for s in order]
        stop = sequential(deltas, looks, MARGIN)
        arms = list(pair) if pair else ["nonlinear-qknorm", "linear-qknorm", "nonlinear", "linear"]
        saved_seeds = order[stop["pairs"]:]
        rows.append({"study": study, "comparison": name, "looks": looks, **stop, "fixed": fixed(deltas, MARGIN),
                     "chains_saved": len(arms) * len(saved_seeds),
                     "hours_saved": chain_hours(study, arms, saved_seeds)})
    return rows


def simulate(sd: float, looks: list[int], delta: float, noise: str, sims: int, rng) -> dict:
    """Rejection rates of the fixed design and of the sequential one (with and without stopping for equivalence) and
    the sequential designs' expected pairs. noise: normal; t3 (scaled to sd); stall (normal, and each pair with
    probability 1/16 shifted by 0.16 nats either way, like seed 217 of verdict-lr)."""
    n = looks[-1]
    if noise == "t3":
        d = stats.t.rvs(3, size=(sims, n), random_state=rng) * sd / math.sqrt(3.0)  # t3 has variance 3
    else:
        d = rng.normal(0.0, sd, size=(sims, n))
    if noise == "stall":
        d += (rng.random((sims, n)) < 1 / 16) * rng.choice([-0.16, 0.16], size=(sims, n))
    d += delta
    out = {}
    for rule in ("efficacy", "with equivalence"):
        stopped, reject = np.zeros(sims, dtype=bool), np.zeros(sims, dtype=bool)
        pairs = np.full(sims, float(n))
        for n_k, p_k in zip(looks, nominal(looks)):
            x = d[:, :n_k]
            se = x.std(1, ddof=1) / math.sqrt(n_k)
            hit = ~stopped & (2 * stats.t.sf(np.abs(x.mean(1)) / se, n_k - 1) <= p_k)
            equivalent = (np.abs(x.mean(1)) + stats.t.ppf(1 - p_k / 2, n_k - 1) * se < MARGIN
                          if rule == "with equivalence" else np.zeros(sims, dtype=bool))
            ends = ~stopped & (hit | equivalent)
            reject |= hit
            pairs[ends] = n_k
            stopped |= ends
        out[rule] = (float(reject.mean()), float(pairs.mean()))
    t_fixed = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    out["fixed"] = float((2 * stats.t.sf(np.abs(t_fixed), n - 1) <= ALPHA).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sims", type=int, default=20000)
    args = parser.parse_args()
    for looks in ([6, 10, 14], [6, 10, 16]):
        bounds = spending_bounds(looks, ALPHA, SPENDING)
        print(f"looks {looks}: bounds {', '.join(f'{c:.4f}' for c in bounds)}; nominal p "
              f"{', '.join(f'{p:.5f}' for p in nominal(looks))}")
    print("\n| study | comparison | stops at look (pairs) | mean Δ | repeated interval | decision there | fixed-n "
          "decision | chains saved | recorded hours saved |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in replay_rows():
        hours = "not recorded" if r["hours_saved"] is None else f"{r['hours_saved']:.1f}"
        print(f"| {r['study']} | {r['comparison']} | {r['look']} ({r['pairs']}) | {r['mean']:+.4f} | "
              f"[{r['low']:+.4f}, {r['high']:+.4f}] | {r['words']} | {r['fixed']} | {r['chains_saved']} | {hours} |")
    if args.sims == 0:  # the replay alone
        return
    rng = np.random.default_rng(0)
    print(f"\nMonte Carlo, {args.sims:,} studies a cell: the rate of a 'better'/'worse' decision (fixed n; "
          "sequential stopping only for a difference; sequential stopping also for equivalence within ±0.037) and "
          "the sequential designs' expected pairs")
    print("| paired sd | pairs (looks) | noise | Δ = 0: fixed / efficacy / with equivalence | expected pairs | "
          "Δ = 0.02: fixed / efficacy / with equivalence | expected pairs |")
    print("|---|---|---|---|---|---|---|")
    for sd, looks in ((0.019, [6, 10, 14]), (0.029, [6, 10, 16]), (0.049, [6, 10, 16])):
        for noise in ("normal", "t3", "stall"):
            cells = []
            for delta in (0.0, 0.02):
                r = simulate(sd, looks, delta, noise, args.sims, rng)
                cells += [f"{r['fixed']:.3f} / {r['efficacy'][0]:.3f} / {r['with equivalence'][0]:.3f}",
                          f"{r['efficacy'][1]:.1f} / {r['with equivalence'][1]:.1f}"]
            print(f"| {sd} | {looks[-1]} ({', '.join(map(str, looks))}) | {noise} | " + " | ".join(cells) + " |")
    print(f"(Monte Carlo standard error at a rate of 0.05: {math.sqrt(0.05 * 0.95 / args.sims):.4f})")


if __name__ == "__main__":
    main()

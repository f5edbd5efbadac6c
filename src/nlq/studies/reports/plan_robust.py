"""Exploratory readings a plan's report prints beside its registered tests: how each arm's test runs tail (runs far
above the arm's median, a robust rule), a robust paired estimate beside each t interval (Hodges-Lehmann with its
exact interval), and, for an lr grid, each arm's lr sensitivity on the selection seeds (Wortsman et al. 2023). None
of it changes a decision; each says in its heading that it is a reading."""

from __future__ import annotations

import math

from nlq.studies.definition.tables import interval_text, markdown_table
from nlq.studies.inference.stats import (
    equivalence_test,
    far_above,
    hodges_lehmann,
    hodges_lehmann_pairs,
    mean_std,
    median,
    paired_difference,
)
from nlq.studies.reports.plan_sections import family_members, member_diffs

MADS = 3.0  # a run is "far above" its arm's median beyond this many scaled MADs (MAD x 1.4826)


def robust_section(loss: dict, s: dict, arms: list[str], seeds: list[int], pairs: list[tuple]) -> tuple[list, dict]:
    """Tails per arm on the test seeds and the Hodges-Lehmann estimate of the primary Δ and of each declared
    comparison (once every arm of a seed is in), beside the t interval."""
    tpp, key, u = s.primary_tpp, s.endpoint, s.units
    value = {(arm, seed): loss[(arm, seed, tpp)][key] for arm in arms for seed in seeds
             if isinstance((loss.get((arm, seed, tpp)) or {}).get(key), (int, float))
             and math.isfinite(loss[(arm, seed, tpp)][key])}
    lines = ["", "## Tails and a robust estimate (exploratory: readings, not tests)", "",
             f"Runs far above their arm's median: more than {MADS:g} scaled MADs (the median absolute deviation "
             "x 1.4826, the sd of a normal sample) above it, on the test seeds at each arm's tested lr.", ""]
    tails, rows = {}, []
    for arm in arms:
        seeds_of = [seed for seed in seeds if (arm, seed) in value]
        values = [value[(arm, seed)] for seed in seeds_of]
        if len(values) < 3:
            continue
        far = [seeds_of[i] for i in far_above(values, MADS)]
        middle = median(values)
        mad = 1.4826 * median([abs(v - middle) for v in values])
        tails[arm] = {"runs": len(values), "median": middle, "scaled_mad": mad, "sd": mean_std(values)[1],
                      "far_above": far}
        rows.append([arm, len(values), u(middle, False), u(mad, False), u(mean_std(values)[1], False),
                     ", ".join(map(str, far)) or "none"])
    lines += markdown_table(["arm", "runs", "median", "scaled MAD", "sd", "seeds far above"], rows)
    comparisons = [(f"{s.primary[1]} - {s.primary[0]} (the primary Δ)", [v - b for _, b, v in pairs])]
    complete = [seed for seed in seeds if all((arm, seed) in value for arm in arms)]
    if s.secondary and len(complete) == len(seeds):
        comparisons += [member_diffs(member, value, complete, s) for member in family_members(s)]
    estimates, table = {}, []
    for label, diffs in comparisons:
        if len(diffs) < 2:
            continue
        t_interval = paired_difference(diffs, [0.0] * len(diffs), s.confidence)
        hl = hodges_lehmann(diffs, s.confidence)
        estimates[label] = hl | {"t_mean": t_interval["mean"], "t_low": t_interval["low"],
                                 "t_high": t_interval["high"]}
        robust = (f"n/a (needs at least {hodges_lehmann_pairs(s.confidence)} pairs)" if math.isnan(hl["low"])
                  else f"[{u(hl['low'])}, {u(hl['high'])}]")
        tost = equivalence_test(diffs, s.margin, s.alpha)
        estimates[label] |= {"tost_p": tost["p"], "equivalent": tost["equivalent"]}
        table.append([label, len(diffs), u(t_interval["mean"]), interval_text(t_interval, u.digits),
                      u(hl["estimate"]), robust, "n/a" if math.isnan(hl["level"]) else f"{hl['level']:.3f}",
                      f"{tost['p']:.3g} ({'shown' if tost['equivalent'] else 'not shown'})"])
    if table:
        lines += ["", "Beside each t interval, the Hodges-Lehmann estimate (the median of the Walsh averages of the "
                  "per-seed Δ) with its exact distribution-free interval (signed-rank; its level at least "
                  f"{s.confidence:.0%}, the achieved one given), which a few pairs far off move less than the mean; "
                  f"and each Δ's equivalence within ±{s.margin:g} {u.name} (two one-sided t tests at {s.alpha:g}, the "
                  "primary rule's; for a declared comparison a reading, not part of its registered words); "
                  "unadjusted.", ""]
        lines += markdown_table(["Δ", "pairs", "mean", f"{s.confidence:.0%} t interval", "Hodges-Lehmann",
                                 "its interval", "level", f"equivalence ±{s.margin:g}: TOST p"], table)
    return lines, {"tails": tails, "hodges_lehmann": estimates}


def lr_sensitivity(picked: dict, s: dict, arms: list[str], cap: float) -> tuple[list[str], dict]:
    """Each arm's lr sensitivity on the selection seeds (Wortsman et al. 2023, arXiv 2309.14322): the mean over the
    registered grid's lrs (design.lrs, the same for every arm) of the endpoint minus the endpoint at the arm's best
    lr of that grid (the lowest mean), per selection seed, then averaged over the seeds; a diverged run or a
    non-finite endpoint counts as `cap` (the loss of a uniform prediction: Wortsman et al. count one as the loss at
    initialisation), and every endpoint is capped there. Paired against the baseline by seed. Arms whose grid runs
    have not all ended, and pinned arms, are left out."""
    seeds, grid = s.selection_seeds, s.lrs

    def at(arm, lr, seed):
        v = picked.get((arm, lr, seed))
        return cap if v is None or not math.isfinite(v) else min(v, cap)

    per_seed, rows = {}, {}
    for arm in arms:
        if not all((arm, lr, seed) in picked for lr in grid for seed in seeds):
            continue
        means = {lr: sum(at(arm, lr, seed) for seed in seeds) / len(seeds) for lr in grid}
        best = min(grid, key=lambda lr: (means[lr], lr))
        per_seed[arm] = [sum(at(arm, lr, seed) for lr in grid) / len(grid) - at(arm, best, seed) for seed in seeds]
        p = paired_difference(per_seed[arm], [0.0] * len(seeds), s.confidence)
        rows[arm] = {"best_lr": best, "sensitivity": p["mean"], "low": p["low"], "high": p["high"],
                     "excess": {f"{lr:g}": means[lr] - means[best] for lr in grid}}
    if not rows:
        return [], {}
    lines = ["", "### Lr sensitivity (a reading of the selection stage, not a test)", "",
             f"Per arm, the mean over the grid's {len(grid)} lrs ({', '.join(f'{lr:g}' for lr in grid)}, the same "
             f"for every arm) of its {s.endpoint} minus that at its best lr of the grid, on each of the "
             f"{len(seeds)} selection seeds, then averaged (Wortsman et al. 2023's lr sensitivity; lower: the loss "
             f"depends less on the lr); a diverged run counts as {cap:.4f} nats (a uniform prediction), every "
             f"endpoint is capped there. The columns per lr are the mean excess over the best (the lr curve); "
             f"intervals are {s.confidence:.0%} t intervals over the selection seeds (few: wide).", ""]
    lines += markdown_table(["arm", "best lr in the grid", "lr sensitivity", f"{s.confidence:.0%} interval"]
                            + [f"+ at {lr:g}" for lr in grid],
                            [[arm, f"{r['best_lr']:g}", f"{r['sensitivity']:.4f}", interval_text(r)]
                             + [f"{r['excess'][f'{lr:g}']:.4f}" for lr in grid] for arm, r in rows.items()])
    baseline = s.primary[0]
    if baseline in per_seed and len(per_seed) > 1:
        paired = []
        for arm in per_seed:
            if arm == baseline:
                continue
            p = paired_difference(per_seed[arm], per_seed[baseline], s.confidence)
            rows[arm]["vs_baseline"] = {k: p[k] for k in ("mean", "low", "high")}
            paired.append([f"{arm} vs {baseline}", p["n"], f"{p['mean']:+.4f}", interval_text(p)])
        lines += ["", f"Paired by selection seed against {baseline} (Δ = the arm's sensitivity - {baseline}'s; "
                  "positive: the arm more sensitive; unadjusted):", ""]
        lines += markdown_table(["lr sensitivity", "seeds", "mean Δ", f"{s.confidence:.0%} interval"], paired)
    return lines, rows


"""The test part of a plan's report: the decision and what it rests on (power as realised, any one pair that
decides its words, the same pairs on a second measure), and the declared secondary comparisons, Holm-adjusted as
one family. Sign convention: Δ = variant - baseline in nats (positive = worse)."""

from __future__ import annotations

import math
from pathlib import Path

from nlq.fileio import read_json
from nlq.runs.rundir import DIVERGED
from nlq.studies.definition.plan import reference_of
from nlq.studies.definition.plan_design import LOSS_UNITS, Units
from nlq.studies.definition.tables import interval_text, markdown_table
from nlq.studies.inference.sequential import repeated_interval
from nlq.studies.inference.stats import (
    decide,
    holm,
    mean_std,
    paired_difference,
    pairs_needed,
    power_paired_t,
    sd_interval,
)
from nlq.studies.reports.plan_sequential import directions, sequential_lines, sequential_words
from nlq.studies.running.engine import run_dir_of


def primary_facts(pairs: list[tuple], s: dict, method: str, no_effect_words: str, end: dict | None = None) -> dict:
    """What the decision rests on, for the report and verdict.json: how many pairs have the method worse (Δ > 0), and
    (exploratory) each pair whose removal alone would change the decision's words under the registered rule: a
    fixed design's, or a sequential test's read off the repeated interval at the level of the look where it ended
    (end: decision["sequential"])."""
    deltas = [v - b for _, b, v in pairs]

    def words_of(d: list[float]) -> str:
        if end is not None:
            return sequential_words(*repeated_interval(d, end["level"]), s, method, no_effect_words)
        return decide(d, s.margin, s.confidence, s.alpha, method, no_effect_words, directions(s))["words"]

    return {"worse_pairs": sum(d > 0 for d in deltas),
            "one_pair": one_pair_decides([seed for seed, _, _ in pairs], deltas, s.confidence, words_of)}


def primary_section(pairs: list[tuple], decision: dict, loss: dict, s: dict, baseline: str, method: str,
                    study_dir: Path, facts: dict) -> list[str]:
    interval, tost, u = decision["interval"], decision["tost"], s.units
    base_mean, base_sd = mean_std([b for _, b, _ in pairs])
    spread = (f"{u(base_mean, False)} ± {u(base_sd, False)} nats on the whole {split_name(loss)} split "
              f"({len(pairs)} seeds)") if u.name == "nats" else \
        f"mean {u(base_mean, False)} ± {u(base_sd, False)} {u.name} over its {len(pairs)} seeds"
    lines = [f"**Verdict: {decision['words']}.**", "",
             f"- mean Δ {u(interval['mean'])} {u.name} ({interval['mean'] / base_mean:+.2%} of {baseline}'s "
             f"{u.what}; positive: {method} {u.higher}), {s.confidence:.0%} interval "
             f"{interval_text(interval, u.digits)}, paired sd {u(interval['sd'], False)} (planned for "
             f"{s.planning_sd:g}), p = {interval['p']:.3g};",
             f"- equivalence test: p = {tost['p_lower']:.3g} against Δ <= -{s.margin:g} and "
             f"p = {tost['p_upper']:.3g} against Δ >= +{s.margin:g}; {1 - 2 * s.alpha:.0%} interval "
             f"[{u(tost['low'])}, {u(tost['high'])}] "
             + ("inside" if tost["equivalent"] else "not inside") + f" ±{s.margin:g};",
             f"- {baseline}: {spread};",
             realised_power(interval, s)]
    if "sequential" in decision:
        lines += sequential_lines(decision["sequential"], s)
    lines += one_pair_lines(facts["one_pair"], "the decision", u)
    if decision["verdict"] == "inconclusive":
        needed = pairs_needed(s.margin, interval["sd"])
        lines.append("- What would settle it: at the observed paired sd, a new study of "
                     f"{needed or 'more than 10,000'} pairs has 80% power to find a difference of {s.margin:g} "
                     f"{u.name} (seeds are not added to this one).")
    lines += ["", beside_endpoint(pairs, loss, s, baseline, method, study_dir), ""]
    return lines + markdown_table(["seed", baseline, method, "Δ"],
                                  [[seed, u(b, False), u(v, False), u(v - b)] for seed, b, v in pairs])


def is_classifier(loss: dict) -> bool:
    return any(r.get("objective") == "classify" for r in loss.values())


def split_name(loss: dict) -> str:
    return "test" if is_classifier(loss) else "val"


def beside_endpoint(pairs: list[tuple], loss: dict, s: dict, baseline: str, method: str, study_dir: Path) -> str:
    """The same pairs on a second measure, not the endpoint: a language model's fixed eval windows; a classifier's
    test accuracy (the whole test split)."""
    tpp = s.primary_tpp
    key = "test_accuracy" if is_classifier(loss) else "val_loss"
    confidence = s.confidence if key == "test_accuracy" else 0.95
    diff = paired_difference([loss[(method, seed, tpp)][key] for seed, _, _ in pairs],
                             [loss[(baseline, seed, tpp)][key] for seed, _, _ in pairs], confidence)
    if key == "test_accuracy":
        means = {arm: mean_std([loss[(arm, seed, tpp)][key] for seed, _, _ in pairs])[0] for arm in (baseline, method)}
        return (f"Test accuracy of the same pairs (not the endpoint): {baseline} {means[baseline]:.2%}, {method} "
                f"{means[method]:.2%}; Δ {diff['mean']:+.2%} (positive: {method} more accurate), "
                f"{s.confidence:.0%} interval [{diff['low']:+.2%}, {diff['high']:+.2%}].")
    first = run_dir_of(study_dir, loss[(baseline, pairs[0][0], tpp)])
    return f"The same pairs on the {fixed_windows(first)}: Δ {diff['mean']:+.4f} {interval_text(diff)}."


def realised_power(interval: dict, s: dict) -> str:
    """The power the test had at the paired sd it observed (with that sd's interval) beside the power planned, and
    which sizes of effect its interval excludes."""
    n, sd, confidence, u = interval["n"], interval["sd"], s.confidence, s.units
    effect = s.effect
    low, high = sd_interval(sd, n, confidence)
    kept = [f"{e:+g}" for e in (-effect, effect) if interval["low"] < e < interval["high"]]
    planned = power_paired_t(effect, s.planning_sd, n, confidence)
    return (f"- power as realised: at the observed paired sd {u(sd, False)} ({confidence:.0%} interval "
            f"{u(low, False)} to {u(high, False)}) the {n} pairs find a true Δ of {effect:g} with probability "
            f"{power_paired_t(effect, sd, n, confidence):.2f} (planned: {planned:.2f} at sd {s.planning_sd:g}); "
            f"the interval excludes a true Δ below {u(interval['low'])} or above "
            f"{u(interval['high'])}" + (f"; it does not exclude a true Δ of {' or '.join(kept)}." if kept else "."))


def one_pair_decides(seeds: list[int], deltas: list[float], confidence: float, words_of) -> list[dict]:
    """Each pair whose removal alone would change the words of a decision or reading (words_of(deltas)), the most
    influential first (at most 3): its seed, Δ, share of the mean, rank by influence (|Δ - mean|), and the estimate
    and words without it. Exploratory: such a pair is found after looking."""
    words, total = words_of(deltas), sum(deltas)
    mean = total / len(deltas)
    order = sorted(range(len(deltas)), key=lambda i: -abs(deltas[i] - mean))
    rows = []
    for rank, i in enumerate(order, start=1):
        rest = deltas[:i] + deltas[i + 1:]
        if len(rest) < 2 or words_of(rest) == words:
            continue
        rows.append({"seed": seeds[i], "delta": deltas[i], "share": deltas[i] / total if total else None, "rank": rank,
                     "without": paired_difference(rest, [0.0] * len(rest), confidence), "words": words,
                     "words_without": words_of(rest)})
    return rows[:3]


def one_pair_lines(rows: list[dict], what: str, u: Units = LOSS_UNITS) -> list[str]:
    lines = []
    for row in rows:
        share = (f"its share of the summed Δ of all {row['without']['n'] + 1} pairs: {row['share']:+.0%}"
                 if row["share"] is not None else "the summed Δ is 0")
        which = "the most influential pair" if row["rank"] == 1 else f"the {ordinal(row['rank'])} most influential"
        p = row["without"]
        lines.append(f"- exploratory (a pair found after looking): {what} rests on one pair. Seed {row['seed']}, "
                     f"{which}, has Δ {u(row['delta'])} ({share}); without it Δ is {u(p['mean'])} "
                     f"{interval_text(p, u.digits)} over {p['n']} pairs, which would read "
                     f"\"{row['words_without']}\" instead of \"{row['words']}\".")
    return lines


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def fixed_windows(run_dir: Path) -> str:
    """What a run's val_loss was scored on, in words: its fixed eval windows and their tokens."""
    config = read_json(run_dir / "config.json", "a run's config") if (run_dir / "config.json").is_file() else {}
    n, block = (config.get("data") or {}).get("eval_windows"), (config.get("model") or {}).get("block_size")
    if not (isinstance(n, int) and isinstance(block, int)):
        return "fixed eval windows used during training (not the endpoint)"
    return f"{n} fixed eval windows used during training ({n * block:,} tokens; not the endpoint)"


def one_lr_secondaries(loss: dict, s: dict, baseline: str, method: str) -> list[str]:
    """The declared secondary comparisons, one Holm family: every (variant, budget) but the primary one."""
    family = [(v, tpp) for v in [method, *s.secondary] for tpp in s.budgets_tpp
              if (v, tpp) != (method, s.primary_tpp)]
    rows = []
    for arm, tpp in family:
        pairs = pairs_of(loss, baseline, arm, s.seeds, tpp, s.endpoint)
        if len(pairs) == len(s.seeds):
            rows.append((arm, tpp, paired_difference([v for _, _, v in pairs], [b for _, b, _ in pairs],
                                                         s.confidence)))
    lines = ["", "## Secondary comparisons (declared in advance; not part of the decision)", ""]
    if not family:
        return lines + ["None declared (no secondary arm, one budget)."]
    if not rows:
        return lines + ["None has all its pairs yet (the secondary arms run after the primary arms)."]
    # Holm over the whole declared family: a comparison whose pairs are not all in counts with p = 1 until they
    # are, which can only make the others' adjusted p larger (never smaller) than the family's final adjustment.
    adjusted = holm([p["p"] for _, _, p in rows] + [1.0] * (len(family) - len(rows)))[:len(rows)]
    pending = "" if len(rows) == len(family) else (f"; the {len(family) - len(rows)} whose pairs are not all in yet "
                                                   "count with p = 1 until they are, which keeps the adjustment "
                                                   "conservative")
    lines += [f"Holm-adjusted over the {len(family)} declared comparisons as one family{pending}.", ""]
    lines += markdown_table(
        ["variant", "tokens/param", "pairs", f"mean Δ vs {baseline}", "95% interval", "p", "Holm p", "reading"],
        [[arm, f"{tpp:g}", p["n"], s.units(p["mean"]), interval_text(p, s.units.digits), f"{p['p']:.3g}",
          f"{p_holm:.3g}",
          reading(p, p_holm, s)] for (arm, tpp, p), p_holm in zip(rows, adjusted)])
    members = []
    for arm, tpp, _ in rows:
        pairs = pairs_of(loss, baseline, arm, s.seeds, tpp, s.endpoint)
        members.append((f"the reading of {arm} at {tpp:g} tokens/param", [seed for seed, _, _ in pairs],
                        [v - b for _, b, v in pairs]))
    return lines + fragile_lines(members, fragile_members(members, [p["p"] for _, _, p in rows],
                                                          len(family) - len(rows), s), s.units)


def reading(p: dict, p_holm: float, s: dict) -> str:
    if not p_holm < 1 - s.confidence:
        return "within noise"
    return s.units.lower_reading if p["mean"] < 0 else s.units.higher_reading


def secondary_family(loss: dict, s: dict, arms: list[str]) -> tuple[list[str], list[dict]]:
    """The declared secondary family on the test seeds (design.secondary_family; without it, each secondary arm
    against the baseline), Holm-adjusted together once every test seed has all its arms: [arm, baseline] pairs
    and "interaction": with two secondary arms [baseline', method'] beside the primary [baseline, method],
    (method' - baseline') - (method - baseline); in verdict-lr, the query effect with QK-norm minus without."""
    if not s.secondary:
        return [], []
    tpp, key = s.primary_tpp, s.endpoint
    complete = [seed for seed in s.seeds if all((arm, seed, tpp) in loss for arm in arms)]
    lines = ["", f"## Secondary arms: {', '.join(s.secondary)} (declared comparisons on the test seeds; not part of "
             "the decision)", ""]
    if len(complete) < len(s.seeds) or len(arms) < len(s.primary) + len(s.secondary):
        return lines + [f"{len(complete)} of {len(s.seeds)} test seeds have every arm's endpoint; the family is "
                        "computed once all have."], []
    value = {(arm, seed): loss[(arm, seed, tpp)][key] for arm in arms for seed in complete}
    rows, per_seed = [], []
    for member in family_members(s):
        label, diffs = member_diffs(member, value, complete, s)
        if member == "interaction":
            p, base = paired_difference(diffs, [0.0] * len(diffs), s.confidence), None
        else:
            arm, baseline = member
            p = paired_difference([value[(arm, seed)] for seed in complete],
                                  [value[(baseline, seed)] for seed in complete], s.confidence)
            base = mean_std([value[(baseline, seed)] for seed in complete])[0]
        rows.append({"comparison": label, "member": member, "baseline_mean": base, **p})
        per_seed.append(diffs)
    members = [(f"the reading of {row['comparison']}", complete, diffs) for row, diffs in zip(rows, per_seed)]
    fragile = fragile_members(members, [r["p"] for r in rows], 0, s)
    for row, p_holm, pairs in zip(rows, holm([r["p"] for r in rows]), fragile):
        row["holm_p"], row["one_pair"] = p_holm, pairs  # one_pair: kept for the decisions table and the status line
    higher = "has the higher loss" if s.units.name == "nats" else f"is {s.units.higher}"
    lines += [f"Holm-adjusted over the {len(rows)} declared comparisons as one family; Δ positive: the first-named "
              f"arm {higher}.", ""]
    lines += markdown_table(
        ["comparison", "pairs", "mean Δ", "% of the baseline", f"{s.confidence:.0%} interval", "p", "Holm p",
         "reading"],
        [[row["comparison"], row["n"], s.units(row["mean"]),
          f"{row['mean'] / row['baseline_mean']:+.2%}" if row["baseline_mean"] else "n/a",
          interval_text(row, s.units.digits),
          f"{row['p']:.3g}", f"{row['holm_p']:.3g}", reading(row, row["holm_p"], s)] for row in rows])
    return lines + fragile_lines(members, fragile, s.units), rows


def fragile_members(members: list[tuple], p_values: list[float], pending: int, s: dict) -> list[list[dict]]:
    """For each member (what it reads, its seeds, its per-seed Δ) of a Holm family with these p values (and `pending`
    members not in yet, at p = 1): each pair whose removal alone would change its reading, the others' p as they
    are (one_pair_decides' rows; exploratory: found after looking)."""
    found = []
    for index, (_, seeds, diffs) in enumerate(members):
        def words_of(d: list[float], index=index) -> str:
            p = paired_difference(d, [0.0] * len(d), s.confidence)
            return reading(p, holm(p_values[:index] + [p["p"]] + p_values[index + 1:] + [1.0] * pending)[index], s)
        found.append(one_pair_decides(seeds, diffs, s.confidence, words_of))
    return found


def fragile_lines(members: list[tuple], found: list[list[dict]], u: Units = LOSS_UNITS) -> list[str]:
    """The report's lines for fragile_members' rows (nothing where no reading rests on one pair)."""
    lines = [line for (label, _, _), rows in zip(members, found) for line in one_pair_lines(rows, label, u)]
    return [""] + lines if lines else []


def family_members(s: dict) -> list:
    """The declared family: design.secondary_family, or each secondary arm against the baseline."""
    return s.secondary_family or [[arm, s.primary[0]] for arm in s.secondary]


def member_diffs(member, value: dict, seeds: list[int], s: dict) -> tuple[str, list[float]]:
    """A family member's label and per-seed Δ (value: (arm, seed) -> endpoint): [arm, baseline] is arm - baseline;
    "interaction", with two secondary arms [baseline', method'] beside the primary [baseline, method], is
    (method' - baseline') - (method - baseline)."""
    if member == "interaction":
        (nq, lq), (n, ln) = s.secondary[::-1], s.primary[::-1]  # [baseline, method] of each pair
        return (f"interaction: ({nq} - {lq}) - ({n} - {ln})",
                [(value[(nq, seed)] - value[(lq, seed)]) - (value[(n, seed)] - value[(ln, seed)]) for seed in seeds])
    arm, baseline = member
    return f"{arm} - {baseline}", [value[(arm, seed)] - value[(baseline, seed)] for seed in seeds]


def no_effect(study: dict) -> str:
    """The words of the decision rule for equivalence shown: the plan's [reference] no_effect_words where it has them
    (the shipped verdict plans: their margin stood for the paper's claimed gain), else the margin itself."""
    words = reference_of(study).get("no_effect_words")
    return words or f"no effect beyond ±{study['design'].margin:g} {study['design'].units.name}"


def pairs_of(loss: dict, baseline: str, arm: str, seeds: list[int], tpp: float, endpoint: str) -> list[tuple]:
    """(seed, baseline's endpoint, variant's endpoint) for the seeds where both finished with a finite endpoint (a
    summary without one, or with null or inf, counts as not ended)."""
    def value(arm: str, seed: int):
        v = loss.get((arm, seed, tpp), {}).get(endpoint)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    return [(seed, value(baseline, seed), value(arm, seed)) for seed in seeds
            if value(baseline, seed) is not None and value(arm, seed) is not None]


def lost_endpoints(study_dir: Path, records: list[dict], s: dict) -> list[str]:
    """The runs at the primary budget whose summary.json exists but holds no endpoint (missing or null) and that did
    not diverge: counted as not finished, and named by the report so that none goes missing unseen."""
    lost = []
    for r in records:
        if r.get("stage") != "budget" or r.get("tpp") != s.primary_tpp:
            continue
        run_dir = run_dir_of(study_dir, r)
        path = run_dir / "summary.json"
        if path.is_file() and not (run_dir / DIVERGED).is_file():
            summary = read_json(path, "a run summary")
            if not isinstance(summary, dict) or summary.get(s.endpoint) is None:
                lost.append(r["name"])
    return lost


def lost_lines(lost: list[str], s: dict) -> list[str]:
    if not lost:
        return []
    return [f"Counted as not finished: {len(lost)} run{'s' * (len(lost) > 1)} whose summary.json holds no "
            f"{s.endpoint} (missing or null): {', '.join(lost)}. Train {'them' if len(lost) > 1 else 'it'} again "
            "(delete the summary and run the study again) or restore the file.", ""]

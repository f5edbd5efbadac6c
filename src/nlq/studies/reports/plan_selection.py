"""The selection part of an lr-grid plan's report: the design in words, the lr curve and its table, how firm each
selection is, the declared illustrations on the selection seeds (and the paper's protocol where declared), and
which arms are borrowed."""

from __future__ import annotations

import math

from nlq.studies.definition.tables import interval_text, markdown_table
from nlq.studies.inference.selection import lowest, lr_means
from nlq.studies.inference.stats import holm, mean_std, paired_difference
from nlq.studies.reports.plan_sections import no_effect, reading
from nlq.studies.running.borrow import borrowed_arms


def borrowed_text(s: dict) -> list[str]:
    """Beside the selection table: which arms are another committed study's runs, and the commit they ran at."""
    borrowed = borrowed_arms(s)
    if not borrowed:
        return []
    by_source: dict[tuple, list[str]] = {}
    for arm, borrow in borrowed.items():
        by_source.setdefault((borrow["study"], borrow["commit"]), []).append(arm)
    return ["", "Borrowed arms (not trained in this study; their selection and test runs are another committed "
            "study's, read from its directory beside this one): " + "; ".join(
                f"{', '.join(arms)} from study `{study}` at commit `{commit[:12]}`"
                for (study, commit), arms in by_source.items()) + "."]


def design_text(study: dict) -> str:
    s = study["design"]
    baseline, method = s.primary
    rule = (f"Selection: the arms {', '.join(s.primary + s.secondary)} at peak lr "
            f"{', '.join(f'{lr:g}' for lr in s.lrs)} (min lr = peak x {s.min_lr_ratio:g}) on seeds "
            f"{', '.join(map(str, s.selection_seeds))}; each arm's lr is the one with the lowest mean "
            f"{s.endpoint} "
            f"at {s.primary_tpp:g} tokens per parameter (an lr with a diverged run is out; a tie goes to the lower "
            f"lr); a best lr at an edge of what was tried extends the grid by x{s.edge_factor:g} that way (at most "
            f"{s.max_extensions} times), until the best is inside or the next lr diverges.")
    if not s.selected_arms(s.primary + s.secondary):
        rule = "No selection: every arm is held at an lr of its own."
    return (rule + _pinned_text(s) + " Test: every arm at its "
            f"selected lr on {len(s.seeds)} seeds ({s.seeds[0]}-{s.seeds[-1]}), the primary arms first; "
            f"Δ = {s.endpoint}({method}) - {s.endpoint}({baseline}) per seed (positive: {method} "
            f"{s.units.higher}); the mean Δ with its {s.confidence:.0%} paired t interval and the equivalence test "
            f"(two one-sided t tests at {s.alpha:g}, margin ±{s.margin:g} {s.units.name}). Decision rule: the "
            f"interval below 0: {method} {s.units.lower}; above 0: {method} {s.units.higher}; otherwise equivalence "
            f"shown: {no_effect(study)}; otherwise inconclusive. A test pair with a diverged run leaves the test and "
            "is listed.")


def _pinned_text(s: dict) -> str:
    """The arms held at an lr of their own and the firmer selection, in words (empty for a plan with neither)."""
    text = ""
    if s.pinned_lrs:
        text += " Held at an lr of their own, not selected: " + ", ".join(
            f"{arm} at {lr:g} (min lr {s.min_lr_at(lr):g})" for arm, lr in s.pinned_lrs.items()) + "."
    if s.refine_seeds:
        text += (f" The firmer selection: the two best lrs of {', '.join(s.refined_arms)} also train on seeds "
                 f"{', '.join(map(str, s.refine_seeds))}, and the lowest mean over every selection seed "
                 + ("selects the lr tested." if s.refine_selects else "is read beside the test (it changes no "
                                                                      "test)."))
    return text


def lr_curve(picked: dict, s: dict, arms: list[str]) -> dict:
    """arm -> [{lr, values (per selection seed, None: diverged), mean, low, high}] for every lr it has tried, from
    the runs' summaries; mean and interval only where every seed ended finite."""
    curve = {}
    for arm in arms:
        rows = []
        for lr in sorted({lr for (a, lr, _) in picked if a == arm}):
            values = [picked.get((arm, lr, seed), math.nan) for seed in s.selection_seeds]
            row = {"lr": lr, "values": [None if v is None or not math.isfinite(v) else v for v in values],
                   "ended": sum((arm, lr, seed) in picked for seed in s.selection_seeds),
                   "diverged": sum(picked.get((arm, lr, seed), 0.0) is None for seed in s.selection_seeds)}
            finite = [v for v in row["values"] if v is not None]
            if len(finite) == len(values):
                p = paired_difference(finite, [0.0] * len(finite), s.confidence)
                row |= {"mean": p["mean"], "low": p["low"], "high": p["high"]}
            rows.append(row)
        if rows:
            curve[arm] = rows
    return curve


def selection_table(curve: dict, chosen: dict, s: dict, arms: list[str]) -> list[str]:
    rows = []
    for arm in arms:
        for row in curve.get(arm, []):
            marks = ["extension"] * (row["lr"] not in s.lrs)
            marks += ["selected"] * (arm in chosen and chosen[arm]["lr"] == row["lr"])
            mark = f" ({', '.join(marks)})" if marks else ""
            mean = f"{row['mean']:.4f}" if "mean" in row else "n/a"
            interval = f"[{row['low']:.4f}, {row['high']:.4f}]" if "mean" in row else "n/a"
            rows.append([arm, f"{row['lr']:g}{mark}", f"{row['ended']} of {len(s.selection_seeds)}", mean, interval,
                         row["diverged"]])
    if not rows and not s.selected_arms(arms):
        return []  # nothing is selected: no table of selection runs
    return markdown_table(["arm", "peak lr", "runs ended", f"mean {s.endpoint}", f"{s.confidence:.0%} interval",
                           "diverged"], rows)


def firmness(picked: dict, arm: str, best: float | None, seeds: list[int]) -> dict | None:
    """How firm one arm's selection of `best` is on these seeds: the runner-up lr (the next lowest mean among the lrs
    whose runs on every seed ended finite), the margin (runner-up - selected, mean over the seeds) with the paired sd
    of that difference, and on how many seeds the selected lr was the best of those lrs. None without a runner-up."""
    means = {lr: m for lr, m in lr_means(picked, arm, seeds).items() if m is not None}
    runner_up = min((lr for lr in means if lr != best), key=lambda lr: (means[lr], lr), default=None)
    if best is None or runner_up is None:
        return None
    d = [picked[(arm, runner_up, seed)] - picked[(arm, best, seed)] for seed in seeds]
    won = sum(all(picked[(arm, best, seed)] <= picked[(arm, lr, seed)] for lr in means) for seed in seeds)
    return {"lr": best, "runner_up": runner_up, "margin": sum(d) / len(d), "sd": mean_std(d)[1], "won": won}


def firmness_table(rows: dict, seeds: int) -> list[str]:
    return markdown_table(["arm", "selected", "runner-up", "margin", "paired sd",
                           "selection seeds where the selected lr was best"],
                          [[arm, f"{r['lr']:g}", f"{r['runner_up']:g}", f"{r['margin']:+.4f}", f"{r['sd']:.4f}",
                            f"{r['won']} of {seeds}"] for arm, r in rows.items()])


def selection_margins(picked: dict, chosen: dict, s: dict, arms: list[str]) -> tuple[list[str], dict]:
    """How firm each selection is (firmness on the selection seeds). A close call: not best on every seed."""
    seeds = s.selection_seeds
    rows = {arm: row for arm in arms if arm in chosen and (row := firmness(picked, arm, chosen[arm]["lr"], seeds))}
    if not rows:
        return [], rows
    lines = ["", "How firm each selection is (the runner-up: the lr with the next lowest mean; margin = its mean - the "
             f"selected lr's, with the paired sd of that difference over the {len(seeds)} selection seeds):", ""]
    lines += firmness_table(rows, len(seeds))
    close = [f"{arm} ({r['won']} of {len(seeds)})" for arm, r in rows.items() if r["won"] < len(seeds)]
    if close:
        lines += ["", f"Close calls (the selected lr not the best on every selection seed): {', '.join(close)}. "
                  "Another draw of selection seeds could have selected another lr for them; the test holds each arm "
                  "at the lr selected, as registered."]
    return lines, rows


def refinement(picked: dict, refined: dict, chosen: dict, s: dict) -> tuple[list[str], dict]:
    """The firmer selection (design.refine_seeds): each refined arm's two best grid lrs on the selection seeds and the
    refine seeds together (refined: its endpoints on the refine seeds), the lr of the lowest pooled mean and how firm
    it is, beside the grid's selection on the selection seeds alone; whether the test used it."""
    seeds = s.selection_seeds + s.refine_seeds
    pooled = picked | refined
    rows, before = {}, {}
    for arm in s.refined_arms:
        means = {lr: m for lr, m in lr_means(pooled, arm, seeds).items() if m is not None}
        if arm not in chosen or not means or not all((arm, lr, seed) in refined for lr in means
                                                     for seed in s.refine_seeds):
            continue
        rows[arm] = firmness(pooled, arm, lowest(means), seeds) or {"lr": lowest(means)}
        before[arm] = firmness(picked, arm, chosen[arm]["lr"], s.selection_seeds)
    if not rows:
        if s.refined_arms:
            return ["", f"The firmer selection ({', '.join(s.refined_arms)} on seeds "
                    f"{', '.join(map(str, s.refine_seeds))}) has not ended yet."], {}
        return [], {}
    used = "the test used it" if s.refine_selects else ("a reading: the test keeps the grid's selection "
                                                         "(refine_selects = false)")
    lines = ["", f"The firmer selection ({used}): each refined arm's two best grid lrs trained on seeds "
             f"{', '.join(map(str, s.refine_seeds))} too; the lr with the lowest mean over all {len(seeds)} seeds "
             f"is selected. Before: the grid's selection on the {len(s.selection_seeds)} selection seeds; after: on "
             f"all {len(seeds)}.", ""]
    table = []
    for arm, after in rows.items():
        for label, r, n in (("before", before[arm], len(s.selection_seeds)), ("after", after, len(seeds))):
            if r and "runner_up" in r:
                table.append([arm, label, f"{r['lr']:g}", f"{r['runner_up']:g}", f"{r['margin']:+.4f}",
                              f"{r['sd']:.4f}", f"{r['won']} of {n}"])
    lines += markdown_table(["arm", "selection", "selected", "runner-up", "margin", "paired sd",
                             "seeds where the selected lr was best"], table)
    changed = [f"{arm} ({chosen[arm]['lr']:g} -> {r['lr']:g})" for arm, r in rows.items()
               if r["lr"] != chosen[arm]["lr"]]
    lines += ["", "The firmer selection changes " + (", ".join(changed) if changed else "no arm's lr") + "."]
    return lines, {arm: {"before": before[arm], "after": r} for arm, r in rows.items()}


def paper_protocol_lr(method_lr: float, baseline_lrs: list[float], ratio: float) -> float:
    """The baseline's lr nearest (on a log scale) to method_lr / ratio; a tie goes to the lower lr."""
    target = math.log(method_lr / ratio)
    return min(sorted(baseline_lrs), key=lambda lr: abs(math.log(lr) - target))


def selection_comparisons(picked: dict, chosen: dict, s: dict, baseline: str, method: str,
                          claim: str | None = None) -> list[str]:
    """Declared illustrations on the selection seeds (paired by seed, not tests): method - baseline at every lr both
    tried (one Holm family), and the paper's protocol (the method at its selected lr, the baseline at the lr nearest
    to 1/ratio of it)."""
    seeds = s.selection_seeds

    def pair(a: tuple, b: tuple) -> dict:
        both = [seed for seed in seeds if picked.get((*a, seed)) is not None and picked.get((*b, seed)) is not None]
        return paired_difference([picked[(*a, seed)] for seed in both], [picked[(*b, seed)] for seed in both],
                                 s.confidence)

    shared = sorted({lr for (a, lr, _) in picked if a == method} & {lr for (a, lr, _) in picked if a == baseline})
    if not shared:  # a pinned arm has no grid to compare at
        return []
    rows = [(lr, pair((method, lr), (baseline, lr))) for lr in shared]
    adjusted = holm([p["p"] if math.isfinite(p["p"]) else 1.0 for _, p in rows])
    lines = ["", f"Illustrations on the selection seeds (declared; not tests): {method} - {baseline} at each lr both "
             f"tried, Holm-adjusted over the {len(rows)} lrs as one family.", ""]
    lines += markdown_table(["peak lr", "pairs", "mean Δ", f"{s.confidence:.0%} interval", "p", "Holm p", "reading"],
                            [[f"{lr:g}", p["n"], f"{p['mean']:+.4f}", interval_text(p), f"{p['p']:.3g}",
                              f"{p_holm:.3g}", reading(p, p_holm, s)] for (lr, p), p_holm in zip(rows, adjusted)])
    method_lr = chosen[method]["lr"]
    finite = [row["lr"] for row in lr_means_rows(picked, baseline, seeds)]
    if method_lr is None or not finite or s.paper_lr_ratio is None:  # the paper's protocol: declared by verdict-lr
        return lines
    base_lr = paper_protocol_lr(method_lr, finite, s.paper_lr_ratio)
    p = pair((method, method_lr), (baseline, base_lr))
    base_mean = mean_std([picked[(baseline, base_lr, seed)] for seed in seeds])[0]
    lines += ["", f"The paper's protocol at this scale: {method} at its selected lr {method_lr:g} - {baseline} at "
              f"{base_lr:g} (the lr it tried nearest to 1/{s.paper_lr_ratio:g} of it): Δ {p['mean']:+.4f} nats "
              f"({p['mean'] / base_mean:+.2%} of {baseline}'s {base_mean:.4f}), {s.confidence:.0%} interval "
              f"{interval_text(p)}, {p['n']} pairs." + (f" The paper reports {claim} in this sign (negative: lower "
                                                         "loss)." if claim else "")]
    return lines


def lr_means_rows(picked: dict, arm: str, seeds: list[int]) -> list[dict]:
    """The lrs where every selection run of the arm ended finite, as rows {lr, mean}."""
    return [{"lr": lr, "mean": m} for lr, m in lr_means(picked, arm, seeds).items() if m is not None]

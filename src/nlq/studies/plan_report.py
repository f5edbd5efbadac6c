"""The report of a pre-registered plan (`nlq report STUDY` on a study of plans/*.toml; engine.py runs it): the
design in words, for an lr-grid plan the selection (every arm at every lr tried, the lr curve) and its declared
illustrations, then the pre-registered test once every registered pair has ended (never an endpoint before), the
declared secondary comparisons Holm-adjusted as one family, the plots, results.csv and verdict.json. Sign convention
everywhere: Δ = variant - baseline in nats (positive = worse), and a percentage beside it is Δ / baseline's loss,
with the same sign.

lines: one module holds the one report of both plan kinds, so that a change to the test or its wording is made
once; its two flows share the header, the test section, the readings and the outcome file.
"""

from __future__ import annotations

import math
from pathlib import Path

from nlq.config import RunConfig
from nlq.errors import UserError
from nlq.fileio import atomic_write, read_json, write_json
from nlq.studies.borrow import borrowed_arms
from nlq.studies.engine import endpoints, has_grid, run_dir_of, run_records
from nlq.studies.plan import check_settings
from nlq.studies.plots import plt, save_figure
from nlq.studies.selection import lr_means, selection
from nlq.studies.stats import decide, holm, mean_std, paired_difference, pairs_needed, power_paired_t, sd_interval
from nlq.studies.tables import interval_text, load_summaries, write_runs_csv
from nlq.studies.wsd import flops_per_token


def build_plan_report(study_dir: Path, study: dict) -> str:
    """report.md, results.csv, verdict.json and the plots of a plan's study, from what is on disk; the design is
    read from study.json (as registered), so the report tests what was registered even if the plan file changes."""
    check_settings(study.get("settings"), f"{study_dir / 'study.json'} settings")
    variants = {v.get("name") for v in study.get("variants", []) if isinstance(v, dict)}
    named = study["settings"]["primary"] + (study["settings"].get("secondary") or [])
    if variants and not set(named) <= variants:
        missing = sorted(set(named) - variants)
        raise UserError(f"{study_dir / 'study.json'}: its design names arm {missing[0]!r}, which is none of its arms "
                        f"({', '.join(sorted(variants))}); run the study again from its plan to rewrite it")
    study = study | {"settings": {"secondary": []} | study["settings"]}  # a design may declare no secondary arms
    return grid_report(study_dir, study) if has_grid(study["settings"]) else one_lr_report(study_dir, study)


REGISTERED_WORDS = {"verdict", "verdict-lr"}  # their pre-registrations (docs/RESULTS.md) named the margin so


def no_effect(study: dict) -> str:
    """The words of the decision rule for equivalence shown: the margin stood for the paper's claimed gain in the
    shipped pre-registrations; a plan of one's own says the margin itself."""
    if study["name"] in REGISTERED_WORDS:
        return "no effect of the paper's size"
    return f"no effect beyond ±{study['settings']['margin']:g} nats"


# ---- a plan with one lr for every arm ---------------------------------------------------------------------------

def one_lr_report(study_dir: Path, study: dict) -> str:
    """report.md: the pre-registered test and its outcome in the words of the decision rule (only once every
    registered pair has finished), then the declared secondary comparisons, Holm-adjusted as one family;
    results.csv; verdict_deltas.png (per-seed Δ, mean and interval, the equivalence margins); verdict.json (the
    finished pairs of each arm and, once all are in, the decision: interval, equivalence test, verdict)."""
    s = study["settings"]
    runs = [r for r in load_summaries(study_dir, study) if r.get("stage") == "budget"]
    loss = {(r["variant"], r["seed"], r["tpp"]): r for r in runs}
    seeds, primary_tpp = s["seeds"], s["primary_tpp"]
    baseline, method = s["primary"]
    lines = header(study) + ["## The pre-registered test", "",
             f"Δ = {s['endpoint']}({method}) - {s['endpoint']}({baseline}) per seed at {primary_tpp:g} tokens per "
             f"parameter, {s['width']} {s['shape']}, both at peak lr {s['lr']:g} and min lr {s['min_lr']:g}; "
             f"{len(seeds)} pairs (seeds {seeds[0]}-{seeds[-1]}), fixed in advance. Analysis: the mean Δ with its "
             f"{s['confidence']:.0%} paired t interval; the equivalence test (two one-sided t tests at "
             f"{s['alpha']:g}, margin ±{s['margin']:g} nats). Decision rule: the interval below 0: {method} better; "
             f"above 0: {method} worse; otherwise equivalence shown: {no_effect(study)}; otherwise "
             f"inconclusive."] + arms_table(study_dir, runs, s) + [""]
    pairs = pairs_of(loss, baseline, method, seeds, primary_tpp, s["endpoint"])
    finished = {method: len(pairs)}  # the primary variant first: scripts/publish_verdict.py reads it so
    finished |= {v: len(pairs_of(loss, baseline, v, seeds, primary_tpp, s["endpoint"])) for v in s["secondary"]}
    outcome = {"registered_pairs": len(seeds), "finished_pairs": finished}
    if len(pairs) < len(seeds):
        lines += [f"{len(pairs)} of {len(seeds)} pre-registered pairs have finished. The test is computed once all "
                  "have: no endpoint is shown before, so that no one can stop or extend the study on what it "
                  "shows.", ""]
        return write_outcome(study_dir, lines, outcome)
    decision = decide([v - b for _, b, v in pairs], s["margin"], s["confidence"], s["alpha"], method,
                      no_effect(study))
    outcome |= {"decision": decision, "baseline": baseline, "variant": method, "endpoint": s["endpoint"],
                "tokens_per_parameter": primary_tpp, "margin": s["margin"],
                "baseline_mean": mean_std([b for _, b, _ in pairs])[0]}
    facts = primary_facts(pairs, s, method, no_effect(study))
    outcome |= facts
    lines += primary_section(pairs, decision, loss, s, baseline, method, study_dir, facts)
    lines += one_lr_secondaries(loss, s, baseline, method)
    lines += ["", "Plot: `verdict_deltas.png` (each seed's Δ, the mean with its 95% interval, the equivalence "
              "margins).", ""]
    plot_one_lr(study_dir / "verdict_deltas.png", loss, s, baseline, study["name"])
    write_runs_csv(study_dir / "results.csv", runs, csv_columns(runs))
    return write_outcome(study_dir, lines, outcome)


def header(study: dict) -> list[str]:
    """The report's title, description, corpus (with its content hash) and the code commits that ran it."""
    meta = study.get("data_meta") or {}
    code = ", ".join(f"`{c[:12]}{'+dirty' if c.endswith('+dirty') else ''}`" for c in study.get("code") or [])
    return [f"# Study `{study['name']}`", "", study.get("description", ""), "",
            f"{'Examples' if meta.get('content_hash') else 'Corpus'}: `{meta.get('source')}`, content hash "
            f"`{str(meta.get('source_hash') or meta.get('content_hash'))[:16]}`. Code: "
            f"{code or 'not recorded'}.", ""]


def write_outcome(study_dir: Path, lines: list[str], outcome: dict) -> str:
    markdown = "\n".join(lines)
    write_json(study_dir / "verdict.json", outcome)
    atomic_write(study_dir / "report.md", markdown)
    return markdown


def pairs_of(loss: dict, baseline: str, variant: str, seeds: list[int], tpp: float, endpoint: str) -> list[tuple]:
    """(seed, baseline's endpoint, variant's endpoint) for the seeds where both finished with a finite endpoint (a
    summary without one, or with null or inf, counts as not ended)."""
    def value(arm: str, seed: int):
        v = loss.get((arm, seed, tpp), {}).get(endpoint)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    return [(seed, value(baseline, seed), value(variant, seed)) for seed in seeds
            if value(baseline, seed) is not None and value(variant, seed) is not None]


def primary_facts(pairs: list[tuple], s: dict, method: str, no_effect_words: str) -> dict:
    """What the decision rests on, for the report and verdict.json: how many pairs have the method worse (Δ > 0), and
    (exploratory) each pair whose removal alone would change the decision's words."""
    deltas = [v - b for _, b, v in pairs]
    return {"worse_pairs": sum(d > 0 for d in deltas), "one_pair": one_pair_decides(
        [seed for seed, _, _ in pairs], deltas, s["confidence"], lambda d: decide(
            d, s["margin"], s["confidence"], s["alpha"], method, no_effect_words)["words"])}


def primary_section(pairs: list[tuple], decision: dict, loss: dict, s: dict, baseline: str, method: str,
                    study_dir: Path, facts: dict) -> list[str]:
    interval, tost = decision["interval"], decision["tost"]
    base_mean, base_sd = mean_std([b for _, b, _ in pairs])
    lines = [f"**Verdict: {decision['words']}.**", "",
             f"- mean Δ {interval['mean']:+.4f} nats ({interval['mean'] / base_mean:+.2%} of {baseline}'s loss; "
             f"positive: {method} worse), {s['confidence']:.0%} interval {interval_text(interval)}, "
             f"paired sd {interval['sd']:.4f} (planned for {s['planning_sd']:g}), p = {interval['p']:.3g};",
             f"- equivalence test: p = {tost['p_lower']:.3g} against Δ <= -{s['margin']:g} and "
             f"p = {tost['p_upper']:.3g} against Δ >= +{s['margin']:g}; {1 - 2 * s['alpha']:.0%} interval "
             f"[{tost['low']:+.4f}, {tost['high']:+.4f}] "
             + ("inside" if tost["equivalent"] else "not inside") + f" ±{s['margin']:g};",
             f"- {baseline}: {base_mean:.4f} ± {base_sd:.4f} nats on the whole {split_name(loss)} split "
             f"({len(pairs)} seeds);",
             realised_power(interval, s)]
    lines += one_pair_lines(facts["one_pair"], "the decision")
    if decision["verdict"] == "inconclusive":
        needed = pairs_needed(s["margin"], interval["sd"])
        lines.append("- What would settle it: at the observed paired sd, a new study of "
                     f"{needed or 'more than 10,000'} pairs has 80% power to find a difference of {s['margin']:g} "
                     "nats (seeds are not added to this one).")
    lines += ["", beside_endpoint(pairs, loss, s, baseline, method, study_dir), "",
              f"| seed | {baseline} | {method} | Δ |", "|---|---|---|---|"]
    lines += [f"| {seed} | {b:.4f} | {v:.4f} | {v - b:+.4f} |" for seed, b, v in pairs]
    return lines


def is_classifier(loss: dict) -> bool:
    return any(r.get("objective") == "classify" for r in loss.values())


def split_name(loss: dict) -> str:
    return "test" if is_classifier(loss) else "val"


def beside_endpoint(pairs: list[tuple], loss: dict, s: dict, baseline: str, method: str, study_dir: Path) -> str:
    """The same pairs on a second measure, not the endpoint: a language model's fixed eval windows; a classifier's
    test accuracy (the whole test split)."""
    tpp = s["primary_tpp"]
    key = "test_accuracy" if is_classifier(loss) else "val_loss"
    confidence = s["confidence"] if key == "test_accuracy" else 0.95
    diff = paired_difference([loss[(method, seed, tpp)][key] for seed, _, _ in pairs],
                             [loss[(baseline, seed, tpp)][key] for seed, _, _ in pairs], confidence)
    if key == "test_accuracy":
        means = {arm: mean_std([loss[(arm, seed, tpp)][key] for seed, _, _ in pairs])[0] for arm in (baseline, method)}
        return (f"Test accuracy of the same pairs (not the endpoint): {baseline} {means[baseline]:.2%}, {method} "
                f"{means[method]:.2%}; Δ {diff['mean']:+.2%} (positive: {method} more accurate), "
                f"{s['confidence']:.0%} interval [{diff['low']:+.2%}, {diff['high']:+.2%}].")
    first = run_dir_of(study_dir, loss[(baseline, pairs[0][0], tpp)])
    return f"The same pairs on the {fixed_windows(first)}: Δ {diff['mean']:+.4f} {interval_text(diff)}."


def csv_columns(runs: list[dict]) -> list[str]:
    accuracy = ["full_val_acc"] if any(r.get("objective") == "classify" for r in runs) else []
    return ["name", "tpp", "variant", "lr", "seed", "tokens", "non_embedding_parameters", "val_loss",
            "full_val_loss"] + accuracy


def realised_power(interval: dict, s: dict) -> str:
    """The power the test had at the paired sd it observed (with that sd's interval) beside the power planned, and
    which sizes of effect its interval excludes."""
    n, sd, confidence = interval["n"], interval["sd"], s["confidence"]
    effect = s.get("planning_difference", s["margin"])
    low, high = sd_interval(sd, n, confidence)
    kept = [f"{e:+g}" for e in (-effect, effect) if interval["low"] < e < interval["high"]]
    planned = power_paired_t(effect, s["planning_sd"], n, confidence)
    return (f"- power as realised: at the observed paired sd {sd:.4f} ({confidence:.0%} interval {low:.4f} to "
            f"{high:.4f}) the {n} pairs find a true Δ of {effect:g} with probability "
            f"{power_paired_t(effect, sd, n, confidence):.2f} (planned: {planned:.2f} at sd {s['planning_sd']:g}); "
            f"the interval excludes a true Δ below {interval['low']:+.4f} or above "
            f"{interval['high']:+.4f}" + (f"; it does not exclude a true Δ of {' or '.join(kept)}." if kept else "."))


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


def one_pair_lines(rows: list[dict], what: str) -> list[str]:
    lines = []
    for row in rows:
        share = f"{row['share']:+.0%} of the mean" if row["share"] is not None else "the mean is 0"
        which = "the most influential pair" if row["rank"] == 1 else f"the {ordinal(row['rank'])} most influential"
        p = row["without"]
        lines.append(f"- exploratory (a pair found after looking): {what} rests on one pair. Seed {row['seed']}, "
                     f"{which}, has Δ {row['delta']:+.4f} ({share}); without it Δ is {p['mean']:+.4f} "
                     f"{interval_text(p)} over {p['n']} pairs, which would read \"{row['words_without']}\" instead of "
                     f"\"{row['words']}\".")
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
    family = [(v, tpp) for v in [method, *s["secondary"]] for tpp in s["budgets_tpp"]
              if (v, tpp) != (method, s["primary_tpp"])]
    rows = []
    for variant, tpp in family:
        pairs = pairs_of(loss, baseline, variant, s["seeds"], tpp, s["endpoint"])
        if len(pairs) == len(s["seeds"]):
            rows.append((variant, tpp, paired_difference([v for _, _, v in pairs], [b for _, b, _ in pairs],
                                                         s["confidence"])))
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
    lines += [f"Holm-adjusted over the {len(family)} declared comparisons as one family{pending}.", "",
              f"| variant | tokens/param | pairs | mean Δ vs {baseline} | 95% interval | p | Holm p | reading |",
              "|---|---|---|---|---|---|---|---|"]
    for (variant, tpp, p), p_holm in zip(rows, adjusted):
        lines.append(f"| {variant} | {tpp:g} | {p['n']} | {p['mean']:+.4f} | {interval_text(p)} | {p['p']:.3g} | "
                     f"{p_holm:.3g} | {reading(p, p_holm, s)} |")
    fragile = []
    for index, (variant, tpp, _) in enumerate(rows):
        pairs = pairs_of(loss, baseline, variant, s["seeds"], tpp, s["endpoint"])

        def words_of(d: list[float], index=index) -> str:  # this comparison's reading, the others' p as they are
            p = paired_difference(d, [0.0] * len(d), s["confidence"])
            others = [r[2]["p"] for r in rows]
            return reading(p, holm(others[:index] + [p["p"]] + others[index + 1:] + [1.0] * (len(family) - len(rows)))[
                index], s)
        fragile += one_pair_lines(one_pair_decides([seed for seed, _, _ in pairs], [v - b for _, b, v in pairs],
                                                   s["confidence"], words_of),
                                  f"the reading of {variant} at {tpp:g} tokens/param")
    return lines + ([""] + fragile if fragile else [])


def plot_one_lr(path: Path, loss: dict, s: dict, baseline: str, name: str) -> None:
    cells = [(v, tpp) for v in [s["primary"][1], *s["secondary"]] for tpp in sorted(s["budgets_tpp"], reverse=True)]
    cells = [(v, tpp, pairs_of(loss, baseline, v, s["seeds"], tpp, s["endpoint"])) for v, tpp in cells]
    cells = [(v, tpp, pairs) for v, tpp, pairs in cells if len(pairs) == len(s["seeds"])]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for x, (variant, tpp, pairs) in enumerate(cells):
        deltas = [v - b for _, b, v in pairs]
        p = paired_difference(deltas, [0.0] * len(deltas), s["confidence"])
        ax.scatter([x + 0.12 * (i / max(1, len(deltas) - 1) - 0.5) for i in range(len(deltas))], deltas, s=12,
                   color="grey", alpha=0.7, zorder=2)
        ax.errorbar([x + 0.25], [p["mean"]], yerr=[[p["mean"] - p["low"]], [p["high"] - p["mean"]]], fmt="o",
                    color="C0" if (variant, tpp) == (s["primary"][1], s["primary_tpp"]) else "C1", capsize=4, zorder=3)
    ax.axhline(0.0, color="k", lw=0.8)
    for sign in (-1, 1):
        ax.axhline(sign * s["margin"], color="C3", lw=0.8, ls="--")
    ax.set_xticks(range(len(cells)), labels=[f"{v}\n{tpp:g} tok/param\nn={len(pairs)}" for v, tpp, pairs in cells],
                  fontsize=8)
    ax.set(ylabel=f"Δ {s['endpoint']} vs {baseline} (nats; < 0 is better)",
           title=f"{name}: per-seed Δ, mean with {s['confidence']:.0%} interval; dashed: ±{s['margin']:g} "
                 f"(lr {s['lr']:g} for every variant)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


# ---- a plan with an lr grid: the selection, then the test ------------------------------------------------------

def grid_report(study_dir: Path, study: dict) -> str:
    """report.md, verdict.json (selected lrs, the lr curve, ended pairs and, once in, the decision and the secondary
    family), results.csv, verdict_lr_curve.png (the selection) and verdict_lr_test.png (the test's Δs)."""
    s = study["settings"]
    arms = s["primary"] + s["secondary"]
    baseline, method = s["primary"]
    budget_runs = [r for r in load_summaries(study_dir, {"runs": run_records(study_dir, study)})
                   if r.get("stage") == "budget"]
    lines = header(study) + ["## The pre-registered test", "", design_text(study)]
    lines += arms_table(study_dir, budget_runs, s) + ["", "## Selection", ""]
    picked = endpoints(study_dir, study, s["selection_seeds"])
    chosen = selection(picked, s, arms)
    curve = lr_curve(picked, s, arms)
    lines += selection_table(curve, chosen, s, arms) + borrowed_text(s)
    outcome = {"registered_pairs": len(s["seeds"]), "finished_pairs": {method: 0},
               "selected_lrs": {arm: chosen[arm]["lr"] for arm in chosen} or None,
               "at_edge": {arm: chosen[arm]["edge"] for arm in chosen}, "lr_curve": curve}
    if curve:
        plot_curve(study_dir / "verdict_lr_curve.png", picked, curve, chosen, s, arms, study["name"])
        lines += ["", "Plot: `verdict_lr_curve.png` (each run's endpoint against its peak lr, each arm's mean with its "
                  f"{s['confidence']:.0%} interval over the selection seeds; the selected lrs circled)."]
    if any(arm not in chosen for arm in arms):
        lines += ["", "The selection has not ended yet; the test runs after it."]
        return write_outcome(study_dir, lines, outcome)
    out = [arm for arm in arms if chosen[arm]["lr"] is None]
    lines += ["", "Selected: " + ", ".join(f"{arm} {chosen[arm]['lr']:g}" + (" (at an edge after every extension)"
                                                                           if chosen[arm]["edge"] else "")
                                           for arm in arms if arm not in out) + "."]
    if out:
        lines.append(f"Out (every lr diverged): {', '.join(out)}; their comparisons are not made.")
    margin_lines, outcome["selection_margins"] = selection_margins(picked, chosen, s, arms)
    lines += margin_lines + selection_comparisons(picked, chosen, s, baseline, method)

    runs = budget_runs
    loss = {(r["variant"], r["seed"], r["tpp"]): r for r in runs
            if r["seed"] in s["seeds"] and chosen[r["variant"]]["lr"] is not None
            and r["lr"] == chosen[r["variant"]]["lr"]}
    tested = endpoints(study_dir, study, s["seeds"])
    pairs = pairs_of(loss, baseline, method, s["seeds"], s["primary_tpp"], s["endpoint"])
    diverged = sorted({seed for (arm, lr, seed), value in tested.items()
                       if value is None and arm in s["primary"] and lr == chosen[arm]["lr"]})
    outcome["finished_pairs"] = {method: len(pairs)}
    lines += ["", "## The test", ""]
    if len(pairs) + len(diverged) < len(s["seeds"]):
        lines += [f"{len(pairs) + len(diverged)} of {len(s['seeds'])} test pairs have ended. The test is computed once "
                  "all have: no endpoint is shown before."]
        return write_outcome(study_dir, lines, outcome)
    decision = decide([v - b for _, b, v in pairs], s["margin"], s["confidence"], s["alpha"], method,
                      no_effect(study))
    outcome |= {"decision": decision, "baseline": baseline, "variant": method, "endpoint": s["endpoint"],
                "tokens_per_parameter": s["primary_tpp"], "margin": s["margin"],
                "baseline_mean": mean_std([b for _, b, _ in pairs])[0], "diverged_pairs": diverged}
    if diverged:
        lines += [f"Pairs with a diverged run, left out of the test: seeds {', '.join(map(str, diverged))}.", ""]
    facts = primary_facts(pairs, s, method, no_effect(study))
    outcome |= facts
    lines += primary_section(pairs, decision, loss, s, baseline, method, study_dir, facts)
    family_lines, family = secondary_family(loss, s, [arm for arm in arms if arm not in out])
    lines += family_lines
    outcome["secondary_family"] = family
    if s.get("secondary"):  # how far the family's runs are, for a status written before it is in
        kept = [arm for arm in arms if arm not in out]
        outcome["seeds_with_every_arm"] = sum(all((arm, seed, s["primary_tpp"]) in loss for arm in kept)
                                              for seed in s["seeds"])
    plot_test(study_dir / "verdict_lr_test.png", pairs, family, s, baseline, method, study["name"])
    lines += ["", "Plot: `verdict_lr_test.png` (each test seed's Δ, the mean with its interval, the equivalence "
              "margins; beside it the secondary comparisons once they are in)."]
    write_runs_csv(study_dir / "results.csv", runs, csv_columns(runs))
    return write_outcome(study_dir, lines, outcome)


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


def arms_table(study_dir: Path, runs: list[dict], s: dict) -> list[str]:
    """Per arm, from its first finished run at the primary budget: non-embedding parameters, training tokens per its
    own parameter (every arm trains on the same tokens, set by the baseline's count) and training FLOPs per token."""
    first = {}
    for r in runs:
        if r.get("tpp") == s["primary_tpp"]:
            first.setdefault(r["variant"], r)
    arms = [arm for arm in s["primary"] + (s.get("secondary") or []) if arm in first]
    if not arms:
        return []
    lines = ["", f"| arm | non-embedding parameters | tokens per own parameter at {s['primary_tpp']:g} | training "
             "FLOPs per token |", "|---|---|---|---|"]
    for arm in arms:
        r = first[arm]
        config = run_dir_of(study_dir, r) / "config.json"
        try:
            flops = f"{flops_per_token(RunConfig.from_dict(read_json(config, 'a run config'))):,}"
        except (UserError, ValueError, KeyError, OSError):  # no config, or a projection of one's own not imported
            flops = "n/a"
        params, tokens = r.get("non_embedding_parameters"), r.get("tokens")
        own = f"{tokens / params:.0f}" if params and tokens else "n/a"
        lines.append(f"| {arm} | {f'{params:,}' if params else 'n/a'} | {own} | {flops} |")
    return lines


def design_text(study: dict) -> str:
    s = study["settings"]
    baseline, method = s["primary"]
    return (f"Selection: the arms {', '.join(s['primary'] + s['secondary'])} at peak lr "
            f"{', '.join(f'{lr:g}' for lr in s['lrs'])} (min lr = peak x {s['min_lr_ratio']:g}) on seeds "
            f"{', '.join(map(str, s['selection_seeds']))}; each arm's lr is the one with the lowest mean "
            f"{s['endpoint']} "
            f"at {s['primary_tpp']:g} tokens per parameter (an lr with a diverged run is out; a tie goes to the lower "
            f"lr); a best lr at an edge of what was tried extends the grid by x{s['edge_factor']:g} that way (at most "
            f"{s['max_extensions']} times), until the best is inside or the next lr diverges. Test: every arm at its "
            f"selected lr on {len(s['seeds'])} seeds ({s['seeds'][0]}-{s['seeds'][-1]}), the primary arms first; "
            f"Δ = {s['endpoint']}({method}) - {s['endpoint']}({baseline}) per seed (positive: {method} worse); the "
            f"mean Δ with its {s['confidence']:.0%} paired t interval and the equivalence test (two one-sided t tests "
            f"at {s['alpha']:g}, margin ±{s['margin']:g} nats). Decision rule: the interval below 0: {method} better; "
            f"above 0: {method} worse; otherwise equivalence shown: {no_effect(study)}; otherwise "
            f"inconclusive. A test pair with a diverged run leaves the test and is listed.")


def lr_curve(picked: dict, s: dict, arms: list[str]) -> dict:
    """arm -> [{lr, values (per selection seed, None: diverged), mean, low, high}] for every lr it has tried, from
    the runs' summaries; mean and interval only where every seed ended finite."""
    curve = {}
    for arm in arms:
        rows = []
        for lr in sorted({lr for (a, lr, _) in picked if a == arm}):
            values = [picked.get((arm, lr, seed), math.nan) for seed in s["selection_seeds"]]
            row = {"lr": lr, "values": [None if v is None or not math.isfinite(v) else v for v in values],
                   "ended": sum((arm, lr, seed) in picked for seed in s["selection_seeds"]),
                   "diverged": sum(picked.get((arm, lr, seed), 0.0) is None for seed in s["selection_seeds"])}
            finite = [v for v in row["values"] if v is not None]
            if len(finite) == len(values):
                p = paired_difference(finite, [0.0] * len(finite), s["confidence"])
                row |= {"mean": p["mean"], "low": p["low"], "high": p["high"]}
            rows.append(row)
        if rows:
            curve[arm] = rows
    return curve


def selection_table(curve: dict, chosen: dict, s: dict, arms: list[str]) -> list[str]:
    lines = [f"| arm | peak lr | runs ended | mean {s['endpoint']} | {s['confidence']:.0%} interval | diverged |",
             "|---|---|---|---|---|---|"]
    for arm in arms:
        for row in curve.get(arm, []):
            marks = ["extension"] * (row["lr"] not in s["lrs"])
            marks += ["selected"] * (arm in chosen and chosen[arm]["lr"] == row["lr"])
            mark = f" ({', '.join(marks)})" if marks else ""
            mean = f"{row['mean']:.4f}" if "mean" in row else "n/a"
            interval = f"[{row['low']:.4f}, {row['high']:.4f}]" if "mean" in row else "n/a"
            lines.append(f"| {arm} | {row['lr']:g}{mark} | {row['ended']} of {len(s['selection_seeds'])} | {mean} | "
                         f"{interval} | {row['diverged']} |")
    return lines


def selection_margins(picked: dict, chosen: dict, s: dict, arms: list[str]) -> tuple[list[str], dict]:
    """How firm each selection is: the runner-up lr (the next lowest mean), the margin (runner-up - selected, mean over
    the selection seeds) with the paired sd of that difference, and on how many selection seeds the selected lr was
    the best of every lr the arm tried with finite runs. A close call: not best on every seed."""
    seeds, rows = s["selection_seeds"], {}
    for arm in arms:
        best = chosen[arm]["lr"]
        means = {lr: m for lr, m in lr_means(picked, arm, seeds).items() if m is not None}
        runner_up = min((lr for lr in means if lr != best), key=lambda lr: (means[lr], lr), default=None)
        if best is None or runner_up is None:
            continue
        d = [picked[(arm, runner_up, seed)] - picked[(arm, best, seed)] for seed in seeds]
        won = sum(all(picked[(arm, best, seed)] <= picked[(arm, lr, seed)] for lr in means) for seed in seeds)
        rows[arm] = {"lr": best, "runner_up": runner_up, "margin": sum(d) / len(d), "sd": mean_std(d)[1], "won": won}
    if not rows:
        return [], rows
    lines = ["", "How firm each selection is (the runner-up: the lr with the next lowest mean; margin = its mean - the "
             f"selected lr's, with the paired sd of that difference over the {len(seeds)} selection seeds):", "",
             "| arm | selected | runner-up | margin | paired sd | selection seeds where the selected lr was best |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {arm} | {r['lr']:g} | {r['runner_up']:g} | {r['margin']:+.4f} | {r['sd']:.4f} | {r['won']} of "
              f"{len(seeds)} |" for arm, r in rows.items()]
    close = [f"{arm} ({r['won']} of {len(seeds)})" for arm, r in rows.items() if r["won"] < len(seeds)]
    if close:
        lines += ["", f"Close calls (the selected lr not the best on every selection seed): {', '.join(close)}. "
                  "Another draw of selection seeds could have selected another lr for them; the test holds each arm "
                  "at the lr selected, as registered."]
    return lines, rows


def paper_protocol_lr(method_lr: float, baseline_lrs: list[float], ratio: float) -> float:
    """The baseline's lr nearest (on a log scale) to method_lr / ratio; a tie goes to the lower lr."""
    target = math.log(method_lr / ratio)
    return min(sorted(baseline_lrs), key=lambda lr: abs(math.log(lr) - target))


def selection_comparisons(picked: dict, chosen: dict, s: dict, baseline: str, method: str) -> list[str]:
    """Declared illustrations on the selection seeds (paired by seed, not tests): method - baseline at every lr both
    tried (one Holm family), and the paper's protocol (the method at its selected lr, the baseline at the lr nearest
    to 1/ratio of it)."""
    seeds = s["selection_seeds"]

    def pair(a: tuple, b: tuple) -> dict:
        both = [seed for seed in seeds if picked.get((*a, seed)) is not None and picked.get((*b, seed)) is not None]
        return paired_difference([picked[(*a, seed)] for seed in both], [picked[(*b, seed)] for seed in both],
                                 s["confidence"])

    shared = sorted({lr for (a, lr, _) in picked if a == method} & {lr for (a, lr, _) in picked if a == baseline})
    rows = [(lr, pair((method, lr), (baseline, lr))) for lr in shared]
    adjusted = holm([p["p"] if math.isfinite(p["p"]) else 1.0 for _, p in rows])
    lines = ["", f"Illustrations on the selection seeds (declared; not tests): {method} - {baseline} at each lr both "
             f"tried, Holm-adjusted over the {len(rows)} lrs as one family.", "",
             f"| peak lr | pairs | mean Δ | {s['confidence']:.0%} interval | p | Holm p | reading |",
             "|---|---|---|---|---|---|---|"]
    for (lr, p), p_holm in zip(rows, adjusted):
        lines.append(f"| {lr:g} | {p['n']} | {p['mean']:+.4f} | {interval_text(p)} | {p['p']:.3g} | {p_holm:.3g} | "
                     f"{reading(p, p_holm, s)} |")
    method_lr = chosen[method]["lr"]
    finite = [row["lr"] for row in lr_means_rows(picked, baseline, seeds)]
    if method_lr is None or not finite or "paper_lr_ratio" not in s:  # the paper's protocol: declared by verdict-lr
        return lines
    base_lr = paper_protocol_lr(method_lr, finite, s["paper_lr_ratio"])
    p = pair((method, method_lr), (baseline, base_lr))
    base_mean = mean_std([picked[(baseline, base_lr, seed)] for seed in seeds])[0]
    lines += ["", f"The paper's protocol at this scale: {method} at its selected lr {method_lr:g} - {baseline} at "
              f"{base_lr:g} (the lr it tried nearest to 1/{s['paper_lr_ratio']:g} of it): Δ {p['mean']:+.4f} nats "
              f"({p['mean'] / base_mean:+.2%} of {baseline}'s {base_mean:.4f}), {s['confidence']:.0%} interval "
              f"{interval_text(p)}, {p['n']} pairs. The paper reports -1.24% to -2.40% in this sign (negative: lower "
              "loss)."]
    return lines


def lr_means_rows(picked: dict, arm: str, seeds: list[int]) -> list[dict]:
    """The lrs where every selection run of the arm ended finite, as rows {lr, mean}."""
    return [{"lr": lr, "mean": m} for lr, m in lr_means(picked, arm, seeds).items() if m is not None]


def reading(p: dict, p_holm: float, s: dict) -> str:
    if not p_holm < 1 - s["confidence"]:
        return "within noise"
    return "lower loss" if p["mean"] < 0 else "higher loss"


def secondary_family(loss: dict, s: dict, arms: list[str]) -> tuple[list[str], list[dict]]:
    """The declared secondary family on the test seeds (design.secondary_family; without it, each secondary arm
    against the baseline), Holm-adjusted together once every test seed has all its arms: [variant, baseline] pairs
    and "interaction": with two secondary arms [baseline', method'] beside the primary [baseline, method],
    (method' - baseline') - (method - baseline); in verdict-lr, the query effect with QK-norm minus without."""
    if not s.get("secondary"):
        return [], []
    tpp, key = s["primary_tpp"], s["endpoint"]
    complete = [seed for seed in s["seeds"] if all((arm, seed, tpp) in loss for arm in arms)]
    lines = ["", f"## Secondary arms: {', '.join(s['secondary'])} (declared comparisons on the test seeds; not part of "
             "the decision)", ""]
    if len(complete) < len(s["seeds"]) or len(arms) < len(s["primary"]) + len(s["secondary"]):
        return lines + [f"{len(complete)} of {len(s['seeds'])} test seeds have every arm's endpoint; the family is "
                        "computed once all have."], []
    value = {(arm, seed): loss[(arm, seed, tpp)][key] for arm in arms for seed in complete}
    rows, per_seed = [], []
    for member in s.get("secondary_family") or [[arm, s["primary"][0]] for arm in s["secondary"]]:
        if member == "interaction":
            (nq, lq), (n, ln) = s["secondary"][::-1], s["primary"][::-1]  # [baseline, method] of each pair
            diffs = [(value[(nq, seed)] - value[(lq, seed)]) - (value[(n, seed)] - value[(ln, seed)])
                     for seed in complete]
            label = f"interaction: ({nq} - {lq}) - ({n} - {ln})"
            p, base = paired_difference(diffs, [0.0] * len(diffs), s["confidence"]), None
        else:
            variant, baseline = member
            label = f"{variant} - {baseline}"
            diffs = [value[(variant, seed)] - value[(baseline, seed)] for seed in complete]
            p = paired_difference([value[(variant, seed)] for seed in complete],
                                  [value[(baseline, seed)] for seed in complete], s["confidence"])
            base = mean_std([value[(baseline, seed)] for seed in complete])[0]
        rows.append({"comparison": label, "member": member, "baseline_mean": base, **p})
        per_seed.append(diffs)
    adjusted = holm([r["p"] for r in rows])
    lines += [f"Holm-adjusted over the {len(rows)} declared comparisons as one family; Δ positive: the first-named "
              "arm has the higher loss.", "",
              f"| comparison | pairs | mean Δ | % of the baseline | {s['confidence']:.0%} interval | p | Holm p | "
              "reading |",
              "|---|---|---|---|---|---|---|---|"]
    for row, p_holm in zip(rows, adjusted):
        row["holm_p"] = p_holm
        share = f"{row['mean'] / row['baseline_mean']:+.2%}" if row["baseline_mean"] else "n/a"
        lines.append(f"| {row['comparison']} | {row['n']} | {row['mean']:+.4f} | {share} | {interval_text(row)} | "
                     f"{row['p']:.3g} | {p_holm:.3g} | {reading(row, p_holm, s)} |")
    fragile = []
    for index, (row, diffs) in enumerate(zip(rows, per_seed)):
        def words_of(d: list[float], index=index) -> str:  # this member's reading, the others' p as they are
            p = paired_difference(d, [0.0] * len(d), s["confidence"])
            return reading(p, holm([r["p"] for r in rows[:index]] + [p["p"]] + [r["p"] for r in rows[index + 1:]])[
                index], s)
        fragile += one_pair_lines(one_pair_decides(complete, diffs, s["confidence"], words_of),
                                  f"the reading of {row['comparison']}")
    return lines + ([""] + fragile if fragile else []), rows


def plot_curve(path: Path, picked: dict, curve: dict, chosen: dict, s: dict, arms: list[str], name: str) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, arm in enumerate(arms):
        nudge = 1 + 0.03 * (i - (len(arms) - 1) / 2)
        rows = curve.get(arm, [])
        points = [(row["lr"], v) for row in rows for v in row["values"] if v is not None]
        ax.scatter([lr * nudge for lr, _ in points], [v for _, v in points], s=10, color=f"C{i}", alpha=0.45)
        means = [row for row in rows if "mean" in row]
        ax.errorbar([row["lr"] * nudge for row in means], [row["mean"] for row in means],
                    yerr=[[row["mean"] - row["low"] for row in means], [row["high"] - row["mean"] for row in means]],
                    marker="o", ms=4, capsize=3, color=f"C{i}", label=arm)
        if arm in chosen and chosen[arm]["lr"] is not None:
            best = next(row for row in rows if row["lr"] == chosen[arm]["lr"])
            ax.scatter([best["lr"] * nudge], [best["mean"]], s=120, facecolors="none", edgecolors=f"C{i}", lw=1.5)
    lrs = sorted({row["lr"] for rows in curve.values() for row in rows})
    ax.set(xscale="log", xlabel=f"peak lr (min lr = peak / {1 / s['min_lr_ratio']:g})",
           ylabel=f"{s['endpoint']} (nats)",
           title=f"{name} selection: seeds {', '.join(map(str, s['selection_seeds']))}, per-seed points, "
                 f"means with {s['confidence']:.0%} intervals")
    ax.set_xticks(lrs, labels=[f"{lr:g}" for lr in lrs], fontsize=8)
    ax.minorticks_off()
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_test(path: Path, pairs: list[tuple], family: list[dict], s: dict, baseline: str, method: str,
              name: str) -> None:
    deltas = [v - b for _, b, v in pairs]
    cells = [(f"{method} - {baseline}\n(the test)", deltas)]
    fig, ax = plt.subplots(figsize=(7.5 if family else 5.5, 4.2))  # 5.5: the title fits without a family
    p = paired_difference(deltas, [0.0] * len(deltas), s["confidence"])
    intervals = [p] + family
    labels = [cells[0][0]] + [row["comparison"].replace(" - ", " -\n", 1) for row in family]
    for x, (label, row) in enumerate(zip(labels, intervals)):
        if x == 0:
            ax.scatter([x + 0.1 * (i / max(1, len(deltas) - 1) - 0.5) for i in range(len(deltas))], deltas, s=12,
                       color="grey", alpha=0.7)
        ax.errorbar([x + 0.2], [row["mean"]], yerr=[[row["mean"] - row["low"]], [row["high"] - row["mean"]]], fmt="o",
                    capsize=4, color="C0" if x == 0 else "C1")
    ax.axhline(0.0, color="k", lw=0.8)
    for sign in (-1, 1):
        ax.axhline(sign * s["margin"], color="C3", lw=0.8, ls="--")
    ax.set_xticks(range(len(labels)), labels=labels, fontsize=7)
    ax.set(ylabel="Δ (nats; positive: the first-named arm is worse)",
           title=f"{name} test: {len(pairs)} pairs, each arm at its selected lr")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)

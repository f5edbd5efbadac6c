"""The one report flow of every study (`nlq report STUDY`; every study is a plan): build_plan_report reads the study
as registered, its kind's sections (FLOWS) give the report's lines and numbers and write results.csv and the plots,
and write_report writes report.md and result.json (a decision's verdict.json too). A decision's sections are here:
the design in words, for an lr-grid plan the selection (every arm at every lr tried, the lr curve) and its declared
illustrations, then the pre-registered test once every registered pair has ended (never an endpoint before) and the
declared secondary comparisons Holm-adjusted as one family; their parts are plan_selection.py (the selection),
plan_sections.py (the test and its family) and plan_plots.py (the plots). An exploratory plan's sections are
comparison.py, scaling.py and probes.py. Sign convention everywhere: Δ = variant - baseline in nats (positive =
worse), and a percentage beside it is Δ / baseline's loss, with the same sign.
"""

from __future__ import annotations

import math
from pathlib import Path

from nlq.config import RunConfig
from nlq.fileio import atomic_write, read_json, write_json
from nlq.studies.definition.design import PLAN_REPORTS, checked_plan_study, upgraded_study
from nlq.studies.definition.plan import reference_of
from nlq.studies.definition.plan_design import Design
from nlq.studies.definition.tables import load_summaries, markdown_table, write_result, write_runs_csv
from nlq.studies.inference.selection import selection
from nlq.studies.inference.stats import decide, mean_std
from nlq.studies.reports.comparison import build_comparison_report
from nlq.studies.reports.plan_plots import plot_curve, plot_one_lr, plot_test
from nlq.studies.reports.plan_robust import lr_sensitivity, robust_section
from nlq.studies.reports.plan_sections import (
    lost_endpoints,
    lost_lines,
    no_effect,
    one_lr_secondaries,
    pairs_of,
    primary_facts,
    primary_section,
    secondary_family,
)
from nlq.studies.reports.plan_selection import (
    borrowed_text,
    design_text,
    lr_curve,
    refinement,
    selection_comparisons,
    selection_margins,
    selection_table,
)
from nlq.studies.reports.plan_sequential import directions, sequential_decision, sequential_end, test_seeds
from nlq.studies.reports.plan_transitions import transitions_section
from nlq.studies.reports.probes import build_probes_report
from nlq.studies.reports.scaling import build_scaling_report
from nlq.studies.running.engine import LR_RULES, endpoints, run_dir_of, run_records
from nlq.studies.running.wsd import flops_per_token


def build_plan_report(study_dir: Path, study: dict) -> str:
    """Every study's report, one flow: the study as registered (a decision's design read from study.json and checked
    as design.read_study checks it, so the report tests what was registered even if the plan file changes), its kind's
    sections (FLOWS: each returns its lines and numbers, and writes results.csv and its plots), then report.md and its
    numbers written in one place (write_report)."""
    study = upgraded_study(study)
    kind = study.get("report", "comparison")
    if kind in PLAN_REPORTS:
        if not isinstance(study.get("design"), Design):  # a study.json read by another reader than read_study
            study = checked_plan_study(study, Path(study_dir))
        kind = study["design"].kind
    lines, numbers = FLOWS[kind](study_dir, study)
    return write_report(study_dir, lines, numbers, decision=kind in LR_RULES)  # a decision: verdict.json too


# ---- a plan with one lr for every arm ---------------------------------------------------------------------------

def one_lr_report(study_dir: Path, study: dict) -> tuple[list[str], dict]:
    """The report's lines: the pre-registered test and its outcome in the words of the decision rule (only once every
    registered pair has finished), then the declared secondary comparisons, Holm-adjusted as one family;
    and its numbers (verdict.json: the finished pairs of each arm and, once all are in, the decision: interval,
    equivalence test, verdict); writes results.csv and verdict_deltas.png (per-seed Δ, mean and interval, the
    equivalence margins)."""
    s = study["design"]
    runs = [r for r in load_summaries(study_dir, study) if r.get("stage") == "budget"]
    loss = {(r["arm"], r["seed"], r["tpp"]): r for r in runs}
    seeds, primary_tpp = s.seeds, s.primary_tpp
    baseline, method = s.primary
    lines = header(study) + ["## The pre-registered test", "",
             f"Δ = {s.endpoint}({method}) - {s.endpoint}({baseline}) per seed at {primary_tpp:g} tokens per "
             f"parameter, {s.width} {s.shape}, both at peak lr {s.lr:g} and min lr {s.min_lr:g}; "
             f"{len(seeds)} pairs (seeds {seeds[0]}-{seeds[-1]}), fixed in advance. Analysis: the mean Δ with its "
             f"{s.confidence:.0%} paired t interval; the equivalence test (two one-sided t tests at "
             f"{s.alpha:g}, margin ±{s.margin:g} {s.units.name}). Decision rule: the interval below 0: {method} "
             f"{s.units.lower}; above 0: {method} {s.units.higher}; otherwise equivalence shown: {no_effect(study)}; "
             f"otherwise "
             f"inconclusive."] + looks_text(s) + arms_table(study_dir, runs, s) + [""]
    ended = test_seeds(study_dir, s)  # a sequential test: the seeds up to the look where it ended (None: running)
    tested = ended or seeds
    pairs = pairs_of(loss, baseline, method, tested, primary_tpp, s.endpoint)
    finished = {method: len(pairs)}  # the primary arm first: scripts/publish_verdict.py reads it so
    finished |= {v: len(pairs_of(loss, baseline, v, seeds, primary_tpp, s.endpoint)) for v in s.secondary}
    outcome = {"registered_pairs": len(seeds), "finished_pairs": finished}
    if ended is None:
        lines += [running_text(study_dir, s), ""]
        return lines, outcome
    if len(pairs) < len(tested):
        lines += [f"{len(pairs)} of {len(seeds)} pre-registered pairs have finished. The test is computed once all "
                  "have: no endpoint is shown before, so that no one can stop or extend the study on what it "
                  "shows.", ""] + lost_lines(lost_endpoints(study_dir, study["runs"], s), s)
        return lines, outcome
    outcome |= decided(study, study_dir, pairs)
    decision = outcome["decision"]
    facts = primary_facts(pairs, s, method, no_effect(study), decision.get("sequential"))
    outcome |= facts
    lines += primary_section(pairs, decision, loss, s, baseline, method, study_dir, facts)
    lines += one_lr_secondaries(loss, s, baseline, method)
    robust_lines, outcome["robust"] = robust_section(loss, s, s.primary + s.secondary, tested, pairs)
    lines += robust_lines
    lines += ["", "Plot: `verdict_deltas.png` (each seed's Δ, the mean with its 95% interval, the equivalence "
              "margins).", ""]
    plot_one_lr(study_dir / "verdict_deltas.png", loss, s, baseline, study["name"])
    write_runs_csv(study_dir / "results.csv", runs, csv_columns(runs))
    return with_transitions(lines, outcome, study_dir, study, loss, s.primary + s.secondary, tested)


def header(study: dict) -> list[str]:
    """The report's title, description, corpus (with its content hash) and the code commits that ran it."""
    meta = study.get("data_meta") or {}
    code = ", ".join(f"`{c[:12]}{'+dirty' if c.endswith('+dirty') else ''}`" for c in study.get("code") or [])
    return [f"# Study `{study['name']}`", "", study.get("description", ""), "",
            f"{'Examples' if meta.get('content_hash') else 'Corpus'}: `{meta.get('source')}`, content hash "
            f"`{str(meta.get('source_hash') or meta.get('content_hash'))[:16]}`. Code: "
            f"{code or 'not recorded'}.", ""]


def looks_text(s: dict) -> list[str]:
    """For a sequential test, its looks in words (nothing for a fixed design)."""
    if s.looks is None:
        return []
    equivalence = (" or when its repeated interval lies inside the margin (non-binding)"
                   if s.stop_for_equivalence else "")
    return ["", f"Sequential: the primary pairs are looked at after {', '.join(map(str, s.looks))} of them, in the "
                f"registered seed order, with {s.spending} spending of the two-sided "
                f"{1 - s.confidence:g}; the test stops when the paired t test's p is at most the look's nominal "
                f"level{equivalence}, and no further test chain is trained; the decision is the rule above read off "
                "the repeated confidence interval where it ended."]


def running_text(study_dir: Path, s: dict) -> str:
    path = study_dir / "sequential.json"
    done = len(read_json(path, "the sequential test's record").get("looks") or []) if path.is_file() else 0
    return (f"{done} of {len(s.looks)} looks of the sequential test have been computed and none has ended it. "
            "Nothing of the test is shown before it ends.")


def write_report(study_dir: Path, lines: list[str], numbers: dict, decision: bool) -> str:
    """report.md and its numbers as result.json, as every report writes them; a decision's also as verdict.json (the
    name the committed plan studies and scripts/publish_verdict.py read), after a line naming any finished run that
    vanished since its last report."""
    markdown = "\n".join(lines + (vanished_lines(study_dir, numbers) if decision else []))
    if decision:
        write_json(study_dir / "verdict.json", numbers)
    write_result(study_dir / "result.json", numbers)
    atomic_write(study_dir / "report.md", markdown)
    return markdown


def vanished_lines(study_dir: Path, outcome: dict) -> list[str]:
    """Where the last report counted more finished pairs of an arm than there are now, the runs recorded in study.json
    whose directories are gone: a finished run that vanished is named, not silently counted as not finished."""
    path = study_dir / "result.json"
    before = read_json(path, "the last report's numbers").get("finished_pairs") or {} if path.is_file() else {}
    fewer = {arm: (n, (outcome.get("finished_pairs") or {}).get(arm, 0)) for arm, n in before.items()
             if isinstance(n, int) and n > (outcome.get("finished_pairs") or {}).get(arm, 0)}
    if not fewer:
        return []
    records = read_json(study_dir / "study.json", "the study's description").get("runs", [])
    gone = [r["name"] for r in records if r.get("stage") == "budget" and not (study_dir / "runs" / r["name"]).exists()]
    counts = "; ".join(f"{arm} {then} then, {now} now" for arm, (then, now) in fewer.items())
    return ["", f"Vanished: the last report counted more finished pairs than there are now ({counts}); run directories "
            f"recorded in study.json and gone: {', '.join(gone) or 'none (their summaries lost their endpoint)'}. "
            "Restore them, or run the study again to train them anew."]


def csv_columns(runs: list[dict]) -> list[str]:
    accuracy = ["full_val_acc"] if any(r.get("objective") == "classify" for r in runs) else []
    return ["name", "tpp", "arm", "lr", "seed", "tokens", "non_embedding_parameters", "val_loss",
            "full_val_loss"] + accuracy


def decided(study: dict, study_dir: Path, pairs: list[tuple]) -> dict:
    """The primary test's decision by the registered rule (a sequential test's read off its repeated interval), with
    what verdict.json records beside it."""
    s = study["design"]
    baseline, method = s.primary
    decision = decide([v - b for _, b, v in pairs], s.margin, s.confidence, s.alpha, method,
                      no_effect(study), directions(s))
    if s.looks is not None:
        decision = sequential_decision(decision, sequential_end(study_dir, s), s, method, no_effect(study))
    return {"decision": decision, "baseline": baseline, "variant": method, "endpoint": s.endpoint,
            "tokens_per_parameter": s.primary_tpp, "margin": s.margin,
            "baseline_mean": mean_std([b for _, b, _ in pairs])[0]}


def grid_report(study_dir: Path, study: dict) -> tuple[list[str], dict]:
    """The report's lines and numbers (verdict.json: selected lrs, the lr curve, ended pairs and, once in, the
    decision and the secondary family); writes results.csv, verdict_lr_curve.png (the selection) and
    verdict_lr_test.png (the test's Δs)."""
    s = study["design"]
    arms = s.primary + s.secondary
    baseline, method = s.primary
    budget_runs = [r for r in load_summaries(study_dir, {"runs": run_records(study_dir, study)})
                   if r.get("stage") == "budget"]
    lines = header(study) + ["## The pre-registered test", "", design_text(study)]
    lines += arms_table(study_dir, budget_runs, s) + ["", "## Selection", ""]
    picked = endpoints(study_dir, study, s.selection_seeds)
    chosen = selection(picked, s, s.selected_arms(arms)) | {
        arm: {"means": {}, "lr": lr, "edge": False} for arm, lr in (s.pinned_lrs or {}).items()}
    curve = lr_curve(picked, s, arms)
    lines += selection_table(curve, chosen, s, arms) + borrowed_text(s)
    outcome = {"registered_pairs": len(s.seeds), "finished_pairs": {method: 0},
               "selected_lrs": {arm: chosen[arm]["lr"] for arm in chosen} or None,
               "at_edge": {arm: chosen[arm]["edge"] for arm in chosen}, "lr_curve": curve}
    if curve:
        plot_curve(study_dir / "verdict_lr_curve.png", picked, curve, chosen, s, s.selected_arms(arms), study["name"])
        lines += ["", "Plot: `verdict_lr_curve.png` (each run's endpoint against its peak lr, each arm's mean with its "
                  f"{s.confidence:.0%} interval over the selection seeds; the selected lrs circled)."]
    if any(arm not in chosen for arm in arms):
        lines += ["", "The selection has not ended yet; the test runs after it."]
        return lines, outcome
    out = [arm for arm in arms if chosen[arm]["lr"] is None]
    lines += ["", "Selected: " + ", ".join(f"{arm} {chosen[arm]['lr']:g}" + (" (at an edge after every extension)"
                                                                           if chosen[arm]["edge"] else "")
                                           + (" (held there, not selected)" if arm in (s.pinned_lrs or {}) else "")
                                           for arm in arms if arm not in out) + "."]
    if out:
        lines.append(f"Out (every lr diverged): {', '.join(out)}; their comparisons are not made.")
    margin_lines, outcome["selection_margins"] = selection_margins(picked, chosen, s, arms)
    lines += margin_lines
    if s.refine_seeds:
        refine_lines, outcome["refinement"] = refinement(picked, endpoints(study_dir, study, s.refine_seeds), chosen, s)
        lines += refine_lines
        if s.refine_selects:  # the test ran at the firmer selection's lrs
            for arm, read in outcome["refinement"].items():
                chosen[arm] = chosen[arm] | {"lr": read["after"]["lr"]}
                outcome["selected_lrs"][arm] = read["after"]["lr"]
    sensitivity_lines, outcome["lr_sensitivity"] = lr_sensitivity(picked, s, arms, uniform_loss(study_dir, study))
    lines += sensitivity_lines
    lines += selection_comparisons(picked, chosen, s, baseline, method, reference_of(study).get("paper_claim"))

    runs = budget_runs
    loss = {(r["arm"], r["seed"], r["tpp"]): r for r in runs
            if r["seed"] in s.seeds and chosen[r["arm"]]["lr"] is not None
            and r["lr"] == chosen[r["arm"]]["lr"]}
    tested = endpoints(study_dir, study, s.seeds)
    ended = test_seeds(study_dir, s)  # a sequential test: the seeds up to the look where it ended (None: running)
    seeds = ended or s.seeds
    pairs = pairs_of(loss, baseline, method, seeds, s.primary_tpp, s.endpoint)
    diverged = sorted({seed for (arm, lr, seed), value in tested.items()
                       if value is None and arm in s.primary and lr == chosen[arm]["lr"] and seed in seeds})
    outcome["finished_pairs"] = {method: len(pairs)}
    lines += ["", "## The test", ""] + looks_text(s)
    if ended is None:
        lines.append(running_text(study_dir, s))
        return lines, outcome
    if len(pairs) + len(diverged) < len(seeds):
        lines += [f"{len(pairs) + len(diverged)} of {len(s.seeds)} test pairs have ended. The test is computed once "
                  "all have: no endpoint is shown before."]
        lost = lost_endpoints(study_dir, run_records(study_dir, study), s)
        lines += [""] + lost_lines(lost, s)[:1] if lost else []
        return lines, outcome
    outcome |= decided(study, study_dir, pairs) | {"diverged_pairs": diverged}
    decision = outcome["decision"]
    if diverged:
        lines += [f"Pairs with a diverged run, left out of the test: seeds {', '.join(map(str, diverged))}.", ""]
    facts = primary_facts(pairs, s, method, no_effect(study), decision.get("sequential"))
    outcome |= facts
    lines += primary_section(pairs, decision, loss, s, baseline, method, study_dir, facts)
    family_lines, family = secondary_family(loss, s, [arm for arm in arms if arm not in out])
    lines += family_lines
    outcome["secondary_family"] = family
    if s.secondary:  # how far the family's runs are, for a status written before it is in
        kept = [arm for arm in arms if arm not in out]
        outcome["seeds_with_every_arm"] = sum(all((arm, seed, s.primary_tpp) in loss for arm in kept)
                                              for seed in s.seeds)
    robust_lines, outcome["robust"] = robust_section(loss, s, [arm for arm in arms if arm not in out], seeds, pairs)
    lines += robust_lines
    plot_test(study_dir / "verdict_lr_test.png", pairs, family, s, baseline, method, study["name"])
    lines += ["", "Plot: `verdict_lr_test.png` (each test seed's Δ, the mean with its interval, the equivalence "
              "margins; beside it the secondary comparisons once they are in)."]
    write_runs_csv(study_dir / "results.csv", runs, csv_columns(runs))
    return with_transitions(lines, outcome, study_dir, study, loss, [arm for arm in arms if arm not in out], seeds)


def with_transitions(lines: list[str], outcome: dict, study_dir: Path, study: dict, loss: dict, arms: list[str],
                     seeds: list[int]) -> tuple[list[str], dict]:
    """A decided language-model test's report with its transitions section (plan_transitions.py) at the end."""
    section, numbers = transitions_section(study_dir, study["design"], loss, arms, seeds, study["name"])
    if numbers:
        outcome["transitions"] = numbers
    return lines + section, outcome


def uniform_loss(study_dir: Path, study: dict) -> float:
    """The loss of a uniform prediction, ln(vocabulary) (ln(classes) for a classifier), from a run's config.json:
    where the lr sensitivity caps an endpoint and counts a diverged run."""
    for record in run_records(study_dir, study):
        path = run_dir_of(study_dir, record) / "config.json"
        if path.is_file():
            model = read_json(path, "a run's config").get("model", {})
            return math.log(model.get("classes") or model.get("vocab_size") or 2)
    return math.nan


def arms_table(study_dir: Path, runs: list[dict], s: dict) -> list[str]:
    """Per arm, from its first finished run at the primary budget: non-embedding parameters, training tokens per its
    own parameter (every arm trains on the same tokens, set by the baseline's count) and training FLOPs per token."""
    first = {}
    for r in runs:
        if r.get("tpp") == s.primary_tpp:
            first.setdefault(r["arm"], r)
    arms = [arm for arm in s.primary + s.secondary if arm in first]
    if not arms:
        return []
    rows = []
    for arm in arms:
        r = first[arm]
        config = run_dir_of(study_dir, r) / "config.json"
        # a projection of one's own is imported from the study's record first (registry.build_report): a config
        # that cannot be built is an error, not an empty cell; only a run without its config.json shows n/a
        flops = f"{flops_per_token(RunConfig.from_dict(read_json(config, 'a run config'))):,}" if config.is_file() \
            else "n/a"
        params, tokens = r.get("non_embedding_parameters"), r.get("tokens")
        own = f"{tokens / params:.0f}" if params and tokens else "n/a"
        rows.append([arm, f"{params:,}" if params else "n/a", own, flops])
    header = ["arm", "non-embedding parameters", f"tokens per own parameter at {s.primary_tpp:g}",
              "training FLOPs per token"]
    return [""] + markdown_table(header, rows)


# a plan's report by its kind: a decision's (Design.kind; engine.LR_RULES), then an exploratory plan's (families.py)
FLOWS = {"fixed-lr": one_lr_report, "lr-grid": grid_report, "comparison": build_comparison_report,
         "scaling": build_scaling_report, "probes": build_probes_report}

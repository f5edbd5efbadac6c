"""`nlq study verdict-lr`: the verdict's question with each variant at its own peak lr, chosen in advance.

`nlq study verdict` compared the queries at one shared lr (2e-3, linear's best swept lr) and found the nonlinear
query worse at 300 tokens per parameter; the paper tuned each variant's lr. Here (docs/RESULTS.md,
"Pre-registration: `nlq study verdict-lr`") both variants first train at each of three peak lrs on three
selection seeds; each variant's lr is the one with the lowest mean endpoint there; then both train at their
selected lrs on twelve fresh test seeds, and the verdict's analysis and decision rule are applied to those
pairs. Selecting on other seeds than the test keeps the lr choice from leaning on the noise it is tested on.
"""

from __future__ import annotations

import math
from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import read_json
from nlq.studies.plots import plt, save_figure
from nlq.studies.scaling import base as scaling_base
from nlq.studies.stats import decide, holm, mean_std, paired_difference
from nlq.runs.rundir import DIVERGED
from nlq.studies.study import LINEAR, NONLINEAR, Run, Study
from nlq.studies.tables import interval_text, load_summaries, write_runs_csv
from nlq.studies.verdict import DATA, header, pairs_of, primary_section, write_outcome
from nlq.studies.wsd import chain_tokens, wsd_chain

SETTINGS = {
    "width": "d64",
    "shape": {"n_layer": 2, "n_head": 4, "n_embd": 64},
    "lrs": [2e-3, 4e-3, 8e-3],  # peak lrs tried in the selection
    "min_lr_ratio": 0.1,  # min lr = peak / 10 for every run (at 2e-3: the verdict's schedule)
    "budgets_tpp": [300],
    "primary_tpp": 300,
    "selection_seeds": [201, 202, 203],
    "seeds": list(range(211, 223)),  # 12 test pairs: the power computation is in docs/RESULTS.md
    "primary": ["linear", "nonlinear"],
    "secondary": [],
    "endpoint": "full_val_loss",
    "confidence": 0.95,
    "margin": 0.037,
    "alpha": 0.05,
    "planning_sd": 0.03,
}


def chains(study: Study, study_dir: Path, seeds: list[int], lrs: dict[str, list[float]]) -> list[Run]:
    """One WSD chain per (seed, variant, lr), named with its lr; within a seed the variants' order alternates so
    that shards dealing chains round-robin each get both variants."""
    s = study.settings
    runs = []
    for i, seed in enumerate(seeds):
        variants = study.variants if i % 2 == 0 else study.variants[::-1]
        for lr in sorted({lr for v in variants for lr in lrs[v.name]}):
            for variant in (v for v in variants if lr in lrs[v.name]):
                levels = wsd_chain(study, variant, seed, study_dir, width=s["width"], shape=s["shape"],
                                   budgets_tpp=s["budgets_tpp"], lr=lr, min_lr=lr * s["min_lr_ratio"],
                                   branch={"data": {"final_eval": "full"}}, lr_in_name=True)
                runs += [run for level in levels for run in level]
    return runs


def selection(ended: dict[tuple[str, float, int], float | None], s: dict) -> dict:
    """From the selection runs' endpoints ((variant, lr, seed) -> value; None: diverged), per variant: each lr's
    mean (None where a run diverged: that lr is out) and the selected lr (the lowest mean; a tie goes to the
    lower lr). Empty until every selection run has ended."""
    keys = [(v, lr, seed) for v in s["primary"] for lr in s["lrs"] for seed in s["selection_seeds"]]
    if any(k not in ended for k in keys):
        return {}
    out = {}
    for variant in s["primary"]:
        means = {}
        for lr in s["lrs"]:
            values = [ended[(variant, lr, seed)] for seed in s["selection_seeds"]]
            means[lr] = None if any(v is None or not math.isfinite(v) for v in values) else sum(values) / len(values)
        eligible = [(m, lr) for lr, m in means.items() if m is not None]
        out[variant] = {"means": means, "lr": min(eligible)[1] if eligible else None}
    return out


def endpoints(study_dir: Path, study: dict, seeds: list[int]) -> dict[tuple[str, float, int], float | None]:
    """(variant, lr, seed) -> the endpoint of its primary-budget run, or None if it (or its chain) diverged; runs
    still to come are absent."""
    s = study["settings"]
    out = {}
    for r in study.get("runs", []):
        if r.get("stage") != "budget" or r.get("tpp") != s["primary_tpp"] or r["seed"] not in seeds:
            continue
        run_dir = study_dir / "runs" / r["name"]
        if (run_dir / DIVERGED).is_file():
            out[(r["variant"], r["lr"], r["seed"])] = None
        elif (run_dir / "summary.json").is_file():
            out[(r["variant"], r["lr"], r["seed"])] = read_json(run_dir / "summary.json", "a run summary").get(s["endpoint"])
    return out


def verdict_lr() -> Study:
    s = SETTINGS
    study = Study("verdict-lr", f"the verdict with each variant at its own peak lr, selected from "
                  f"{', '.join(f'{lr:g}' for lr in s['lrs'])} on {len(s['selection_seeds'])} seeds, then "
                  f"{len(s['seeds'])} test pairs at {s['primary_tpp']} tokens per parameter", scaling_base(),
                  [LINEAR, NONLINEAR], seeds=s["seeds"], data=DATA, report="verdict-lr", settings=dict(s))

    def stages(study_dir: Path):
        every = {v: s["lrs"] for v in s["primary"]}
        yield chains(study, study_dir, s["selection_seeds"], every)
        chosen = selection(endpoints(study_dir, read_json(study_dir / "study.json", "the study's description"),
                                     s["selection_seeds"]), s)
        if not chosen:
            raise UserError(f"the selection runs of {study.name} have not all ended; run the study again to finish them")
        if any(chosen[v]["lr"] is None for v in s["primary"]):
            out = [v for v in s["primary"] if chosen[v]["lr"] is None]
            raise UserError(f"every lr of {', '.join(out)} diverged in the selection; the test cannot run (the "
                            "pre-registration says so); nlq report shows the selection")
        yield chains(study, study_dir, s["seeds"], {v: [chosen[v]["lr"]] for v in s["primary"]})

    study.stages = stages
    return study


def planned_tokens(settings: dict = SETTINGS) -> int:
    one = chain_tokens(scaling_base(), settings["shape"], settings["budgets_tpp"])
    return one * len(settings["primary"]) * (len(settings["lrs"]) * len(settings["selection_seeds"]) + len(settings["seeds"]))


# ---- the report ------------------------------------------------------------------------------------------

def build_verdict_lr_report(study_dir: Path, study: dict) -> str:
    """report.md: the selection (every variant x lr, the selected lrs), then the pre-registered test on the test
    seeds (only once every test pair has ended) with the verdict's analysis and decision rule, then the declared
    secondary comparisons (nonlinear - linear at each lr on the selection seeds, one Holm family); results.csv,
    verdict_lr.png and verdict.json (the selected lrs, the ended pairs and, once all are in, the decision)."""
    s = study["settings"]
    baseline, method = s["primary"]
    lines = header(study) + ["## The pre-registered test", "",
             f"Selection: {baseline} and {method} at peak lr {', '.join(f'{lr:g}' for lr in s['lrs'])} (min lr = peak x "
             f"{s['min_lr_ratio']:g}) on seeds {', '.join(map(str, s['selection_seeds']))}; each variant's lr is the one "
             f"with the lowest mean {s['endpoint']} at {s['primary_tpp']:g} tokens per parameter (an lr with a diverged "
             f"run is out; a tie goes to the lower lr). Test: both at their selected lrs, {len(s['seeds'])} pairs (seeds "
             f"{s['seeds'][0]}-{s['seeds'][-1]}); Δ = {s['endpoint']}({method}) - {s['endpoint']}({baseline}) per seed; "
             f"the mean Δ with its {s['confidence']:.0%} paired t interval and the equivalence test (two one-sided t "
             f"tests at {s['alpha']:g}, margin ±{s['margin']:g} nats). Decision rule: the interval below 0: nonlinear "
             f"better; above 0: nonlinear worse; otherwise equivalence shown: no effect of the paper's size; otherwise "
             f"inconclusive. A test pair with a diverged run leaves the test and is listed.", "",
             "## Selection", ""]
    picked = endpoints(study_dir, study, s["selection_seeds"])
    chosen = selection(picked, s)
    lines += [f"| variant | peak lr | runs ended | mean {s['endpoint']} | sd | diverged |", "|---|---|---|---|---|---|"]
    for variant in s["primary"]:
        for lr in s["lrs"]:
            values = [picked[(variant, lr, seed)] for seed in s["selection_seeds"] if (variant, lr, seed) in picked]
            finite = [v for v in values if v is not None]
            mean, sd = mean_std(finite) if finite else (math.nan, math.nan)
            mark = " (selected)" if chosen and chosen[variant]["lr"] == lr else ""
            lines.append(f"| {variant} | {lr:g}{mark} | {len(values)} of {len(s['selection_seeds'])} | {mean:.4f} | "
                         f"{sd:.4f} | {len(values) - len(finite)} |")
    outcome = {"registered_pairs": len(s["seeds"]), "finished_pairs": {method: 0},
               "selected_lrs": {v: chosen[v]["lr"] for v in chosen} if chosen else None}
    if not chosen:
        lines += ["", "The selection has not ended yet; the test runs after it."]
        return write_outcome(study_dir, lines, outcome)
    lines += ["", "Selected: " + ", ".join(f"{v} {chosen[v]['lr']:g}" for v in s["primary"]) + "."]
    lines += _selection_comparisons(picked, s, baseline, method)

    tested = endpoints(study_dir, study, s["seeds"])
    runs = [r for r in load_summaries(study_dir, study) if r.get("stage") == "budget"]
    loss = {(r["variant"], r["seed"], r["tpp"]): r for r in runs
            if r["seed"] in s["seeds"] and r["lr"] == chosen[r["variant"]]["lr"]}
    pairs = pairs_of(loss, baseline, method, s["seeds"], s["primary_tpp"], s["endpoint"])
    diverged = sorted({seed for (v, lr, seed), value in tested.items() if value is None and lr == chosen[v]["lr"]})
    outcome["finished_pairs"] = {method: len(pairs)}
    lines += ["", "## The test", ""]
    if len(pairs) + len(diverged) < len(s["seeds"]):
        lines += [f"{len(pairs) + len(diverged)} of {len(s['seeds'])} test pairs have ended. The test is computed once "
                  "all have: no endpoint is shown before."]
        return write_outcome(study_dir, lines, outcome)
    decision = decide([v - b for _, b, v in pairs], s["margin"], s["confidence"], s["alpha"])
    outcome |= {"decision": decision, "baseline": baseline, "variant": method, "endpoint": s["endpoint"],
                "tokens_per_parameter": s["primary_tpp"], "margin": s["margin"],
                "baseline_mean": mean_std([b for _, b, _ in pairs])[0], "diverged_pairs": diverged}
    if diverged:
        lines += [f"Pairs with a diverged run, left out of the test: seeds {', '.join(map(str, diverged))}.", ""]
    lines += primary_section(pairs, decision, loss, s, baseline, method)
    _plot(study_dir / "verdict_lr.png", picked, chosen, pairs, s, baseline, method)
    write_runs_csv(study_dir / "results.csv", runs, ["name", "tpp", "variant", "lr", "seed", "tokens",
                                                      "non_embedding_parameters", "val_loss", "full_val_loss"])
    lines += ["", "Plot: `verdict_lr.png` (the selection: each run's endpoint against the lr; the test: each seed's Δ, "
              "the mean with its interval, the equivalence margins)."]
    return write_outcome(study_dir, lines, outcome)


def _selection_comparisons(picked: dict, s: dict, baseline: str, method: str) -> list[str]:
    """Secondary, declared: nonlinear - linear at each lr on the selection seeds, one Holm family over the lrs."""
    rows = []
    for lr in s["lrs"]:
        seeds = [seed for seed in s["selection_seeds"]
                 if picked.get((baseline, lr, seed)) is not None and picked.get((method, lr, seed)) is not None]
        rows.append((lr, paired_difference([picked[(method, lr, seed)] for seed in seeds],
                                           [picked[(baseline, lr, seed)] for seed in seeds], s["confidence"])))
    adjusted = holm([p["p"] if math.isfinite(p["p"]) else 1.0 for _, p in rows])
    lines = ["", f"Secondary (declared; not part of the decision): {method} - {baseline} at each lr on the selection "
             f"seeds, Holm-adjusted over the {len(rows)} lrs as one family.", "",
             f"| peak lr | pairs | mean Δ | {s['confidence']:.0%} interval | p | Holm p | reading |",
             "|---|---|---|---|---|---|---|"]
    for (lr, p), p_holm in zip(rows, adjusted):
        reading = "within noise" if not p_holm < 1 - s["confidence"] else ("lower loss" if p["mean"] < 0 else "higher loss")
        lines.append(f"| {lr:g} | {p['n']} | {p['mean']:+.4f} | {interval_text(p)} | {p['p']:.3g} | {p_holm:.3g} | "
                     f"{reading} |")
    return lines


def _plot(path: Path, picked: dict, chosen: dict, pairs: list[tuple], s: dict, baseline: str, method: str) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 4.0), width_ratios=[3, 2])
    for i, variant in enumerate(s["primary"]):
        points = [(lr, v) for (var, lr, _), v in picked.items() if var == variant and v is not None]
        left.scatter([lr * (1.04 if i else 0.96) for lr, _ in points], [v for _, v in points], s=12, color=f"C{i}",
                     alpha=0.6)
        means = chosen[variant]["means"]
        lrs = [lr for lr in s["lrs"] if means[lr] is not None]
        left.plot(lrs, [means[lr] for lr in lrs], marker="o", color=f"C{i}",
                  label=f"{variant} (selected {chosen[variant]['lr']:g})")
    left.set(xscale="log", xlabel="peak lr", ylabel=f"{s['endpoint']} (nats)",
             title=f"selection: seeds {s['selection_seeds'][0]}-{s['selection_seeds'][-1]}")
    left.set_xticks(s["lrs"], labels=[f"{lr:g}" for lr in s["lrs"]])
    left.legend(fontsize=8)
    deltas = [v - b for _, b, v in pairs]
    p = paired_difference(deltas, [0.0] * len(deltas), s["confidence"])
    right.scatter([0.1 * (i / max(1, len(deltas) - 1) - 0.5) for i in range(len(deltas))], deltas, s=12, color="grey")
    right.errorbar([0.2], [p["mean"]], yerr=[[p["mean"] - p["low"]], [p["high"] - p["mean"]]], fmt="o", capsize=4)
    right.axhline(0.0, color="k", lw=0.8)
    for sign in (-1, 1):
        right.axhline(sign * s["margin"], color="C3", lw=0.8, ls="--")
    right.set(xticks=[], xlim=(-0.3, 0.4), ylabel=f"Δ {method} - {baseline} (nats; < 0 is better)",
              title=f"test: {len(pairs)} pairs at the selected lrs")
    for ax in (left, right):
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
    save_figure(fig, path)

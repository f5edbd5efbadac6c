"""`nlq study verdict`: a pre-registered, powered test of the nonlinear query at 300 tokens per parameter.

The design is fixed before any run (docs/RESULTS.md, "Pre-registration"): d 64, 2 layers, the `pypkg`
corpus with bpe:2048, 300 tokens per non-embedding parameter of linear; linear and nonlinear at one peak
lr and one schedule (the same min lr); 14 pairs (seeds 101-114), each pair on identical batches with shared
initial weights; every budget's final model scored on the whole validation split. The 100-tokens-per-parameter
budget is a WSD branch of the same chains. Secondary, run only after the primary arms: the identity query
at the same lr and seeds. The settings are the study's `settings`, written to study.json; the report reads
them from there, so it tests what was registered even if this file changes.
"""

from __future__ import annotations

from pathlib import Path

from nlq.fileio import atomic_write, write_json
from nlq.studies.plan import SHIPPED, load_plan
from nlq.studies.plots import plt, save_figure
from nlq.studies.scaling import base as scaling_base
from nlq.studies.stats import decide, holm, mean_std, paired_difference, pairs_needed
from nlq.studies.study import Run, Study
from nlq.studies.tables import interval_text, load_summaries, write_runs_csv
from nlq.studies.wsd import chain_tokens, wsd_chain

SETTINGS = load_plan(SHIPPED / "verdict.toml").design  # the design as registered: plans/verdict.toml


def arm_runs(study: Study, study_dir: Path, names: list[str]) -> list[Run]:
    """The chains of these variants, seed by seed. Within a seed the variants' order alternates, so that
    N shards dealing chains round-robin each get every variant and a pair finishes at about the same time."""
    s = study.settings
    variants = [v for v in study.variants if v.name in names]
    runs = []
    for i, seed in enumerate(s["seeds"]):
        for variant in (variants if i % 2 == 0 else variants[::-1]):
            levels = wsd_chain(study, variant, seed, study_dir, width=s["width"], shape=s["shape"],
                               budgets_tpp=s["budgets_tpp"], lr=s["lr"], min_lr=s["min_lr"],
                               branch={"data": {"final_eval": "full"}})
            runs += [run for level in levels for run in level]
    return runs


def fixed_lr_study(plan) -> Study:
    """The study of a plan with one lr for every arm: per seed one WSD chain of each arm over every budget; the
    primary arms' chains first, then the secondary arms'."""
    s = plan.design
    study = Study(plan.name, plan.description, plan.base, plan.arms, seeds=s["seeds"], data=plan.data,
                  report="verdict", settings=dict(s), plan=plan.raw)

    def stages(study_dir: Path):
        yield arm_runs(study, study_dir, s["primary"])  # the primary arms finish before the secondary start
        if s.get("secondary"):
            yield arm_runs(study, study_dir, s["secondary"])

    study.stages = stages
    return study


def planned_tokens(settings: dict = SETTINGS) -> int:
    """Training tokens of one chain (the longest stable run plus every budget's cooldown)."""
    return chain_tokens(scaling_base(), settings["shape"], settings["budgets_tpp"])


# ---- the report ------------------------------------------------------------------------------------------

def build_verdict_report(study_dir: Path, study: dict) -> str:
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
             f"above 0: {method} worse; otherwise equivalence shown: no effect of the paper's size; otherwise "
             f"inconclusive.", ""]
    pairs = pairs_of(loss, baseline, method, seeds, primary_tpp, s["endpoint"])
    finished = {method: len(pairs)}  # the primary variant first: scripts/publish_verdict.py reads it so
    finished |= {v: len(pairs_of(loss, baseline, v, seeds, primary_tpp, s["endpoint"])) for v in s["secondary"]}
    outcome = {"registered_pairs": len(seeds), "finished_pairs": finished}
    if len(pairs) < len(seeds):
        lines += [f"{len(pairs)} of {len(seeds)} pre-registered pairs have finished. The test is computed once all "
                  "have: no endpoint is shown before, so that no one can stop or extend the study on what it "
                  "shows.", ""]
        return write_outcome(study_dir, lines, outcome)
    decision = decide([v - b for _, b, v in pairs], s["margin"], s["confidence"], s["alpha"], method)
    outcome |= {"decision": decision, "baseline": baseline, "variant": method, "endpoint": s["endpoint"],
                "tokens_per_parameter": primary_tpp, "margin": s["margin"],
                "baseline_mean": mean_std([b for _, b, _ in pairs])[0]}
    lines += primary_section(pairs, decision, loss, s, baseline, method)
    lines += _secondary_section(loss, s, baseline, method)
    lines += ["", "Plot: `verdict_deltas.png` (each seed's Δ, the mean with its 95% interval, the equivalence "
              "margins).", ""]
    _plot(study_dir / "verdict_deltas.png", loss, s, baseline)
    write_runs_csv(study_dir / "results.csv", runs, ["name", "tpp", "variant", "lr", "seed", "tokens",
                                                      "non_embedding_parameters", "val_loss", "full_val_loss"])
    return write_outcome(study_dir, lines, outcome)


def header(study: dict) -> list[str]:
    """The report's title, description, corpus (with its content hash) and the code commits that ran it."""
    meta = study.get("data_meta") or {}
    code = ", ".join(f"`{c[:12]}{'+dirty' if c.endswith('+dirty') else ''}`" for c in study.get("code") or [])
    return [f"# Study `{study['name']}`", "", study.get("description", ""), "",
            f"Corpus: `{meta.get('source')}`, content hash `{str(meta.get('source_hash'))[:16]}`. Code: "
            f"{code or 'not recorded'}.", ""]


def write_outcome(study_dir: Path, lines: list[str], outcome: dict) -> str:
    markdown = "\n".join(lines)
    write_json(study_dir / "verdict.json", outcome)
    atomic_write(study_dir / "report.md", markdown)
    return markdown


def pairs_of(loss: dict, baseline: str, variant: str, seeds: list[int], tpp: float, endpoint: str) -> list[tuple]:
    """(seed, baseline's endpoint, variant's endpoint) for the seeds where both finished."""
    return [(seed, loss[(baseline, seed, tpp)][endpoint], loss[(variant, seed, tpp)][endpoint]) for seed in seeds
            if (baseline, seed, tpp) in loss and (variant, seed, tpp) in loss]


def primary_section(pairs: list[tuple], decision: dict, loss: dict, s: dict, baseline: str, method: str) -> list[str]:
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
             f"- {baseline}: {base_mean:.4f} ± {base_sd:.4f} nats on the whole val split ({len(pairs)} seeds)."]
    if decision["verdict"] == "inconclusive":
        needed = pairs_needed(s["margin"], interval["sd"])
        lines.append("- What would settle it: at the observed paired sd, a new study of "
                     f"{needed or 'more than 10,000'} pairs has 80% power to find a difference of {s['margin']:g} "
                     "nats (seeds are not added to this one).")
    windows = paired_difference([loss[(method, seed, s["primary_tpp"])]["val_loss"] for seed, _, _ in pairs],
                                [loss[(baseline, seed, s["primary_tpp"])]["val_loss"] for seed, _, _ in pairs])
    lines += ["", f"The same pairs on the 128 fixed eval windows used during training (16,384 tokens; not the "
              f"endpoint): Δ {windows['mean']:+.4f} {interval_text(windows)}.", "",
              f"| seed | {baseline} | {method} | Δ |", "|---|---|---|---|"]
    lines += [f"| {seed} | {b:.4f} | {v:.4f} | {v - b:+.4f} |" for seed, b, v in pairs]
    return lines


def _secondary_section(loss: dict, s: dict, baseline: str, method: str) -> list[str]:
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
    if not rows:
        return lines + ["None has all its pairs yet (the identity arm runs after the primary arms)."]
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
        significant = p_holm < 1 - s["confidence"]
        reading = ("lower loss" if p["mean"] < 0 else "higher loss") if significant else "within noise"
        lines.append(f"| {variant} | {tpp:g} | {p['n']} | {p['mean']:+.4f} | {interval_text(p)} | {p['p']:.3g} | "
                     f"{p_holm:.3g} | {reading} |")
    return lines


def _plot(path: Path, loss: dict, s: dict, baseline: str) -> None:
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
           title=f"verdict: per-seed Δ, mean with {s['confidence']:.0%} interval; dashed: ±{s['margin']:g} "
                 f"(lr {s['lr']:g} for every variant)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)

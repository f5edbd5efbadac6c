"""The transitions section of a language-model decision's report: when each test run's induction transition came
(runs/transitions.py), per arm (median, and the Kaplan-Meier median where runs are censored) and per declared
comparison (the paired difference in steps, t and Hodges-Lehmann intervals, censored pairs named), and the final
endpoint's Δ beside the loss a fixed distance after each run's own transition. Runs with diagnostics are timed by the
induction rule; runs without them (studies trained before the diagnostics) by the train-loss rule, read in the
constant-lr phase only (a cooldown lowers the loss whatever attention does), at LOSS_LEVEL with LOSS_LEVELS beside
it. Shown only once a decision's pairs have all ended, like every endpoint."""

from __future__ import annotations

import math
from pathlib import Path

from nlq.runs.metrics import read_metrics
from nlq.runs.transitions import PREFIX_LEVEL, induction_transition, loss_transition, mean_loss_after
from nlq.studies.definition.tables import interval_text, markdown_table
from nlq.studies.inference.stats import hodges_lehmann, hodges_lehmann_pairs, median, paired_difference
from nlq.studies.reports.plots import plt, save_figure
from nlq.studies.running.engine import run_dir_of

LOSS_LEVEL, LOSS_LEVELS = 3.5, (3.45, 3.5, 3.55)  # nats; the d64 pypkg shape's plateau lies near 3.7-3.9
AFTER = (1500, 2500)  # the post-transition loss: the mean logged train loss this many steps after its own transition


def peak_phase(records: list[dict]) -> list[dict]:
    """The records of the constant-lr phase (lr at its peak; warmup and cooldown cut) and the diagnostics among them."""
    lrs = [r["lr"] for r in records if r.get("lr") is not None]
    if not lrs:
        return records
    peak = max(lrs)
    steps = [r["step"] for r in records if r.get("lr") == peak]
    first, last = min(steps), max(steps)
    return [r for r in records if first <= r["step"] <= last]


def run_timing(records: list[dict]) -> dict:
    """One run's transition (its rule, step, censored), its step under each of LOSS_LEVELS and its post-transition
    loss (None where it did not train far enough at peak lr, or never crossed)."""
    phase = peak_phase(records)
    induction = induction_transition(records)
    by_level = {level: loss_transition(phase, level) for level in LOSS_LEVELS}
    transition, rule = (induction, "induction") if induction is not None else (by_level[LOSS_LEVEL], "train loss")
    after = None if transition.censored else mean_loss_after(phase, transition.step, *AFTER)
    return {"rule": rule, "step": transition.step, "censored": transition.censored, "after": after,
            "levels": {f"{level:g}": t.to_dict() for level, t in by_level.items()}}


def kaplan_meier(timings: list[dict]) -> list[tuple[int, float]]:
    """The Kaplan-Meier estimate of the share of runs transitioned by each step at which one did: (step, share); a
    censored run leaves the runs at risk at its last step without counting as transitioned."""
    survival, at_risk, curve = 1.0, len(timings), []
    for step in sorted({t["step"] for t in timings if t["step"] is not None}):
        events = sum(1 for t in timings if t["step"] == step and not t["censored"])
        if events:
            survival *= 1 - events / at_risk
            curve.append((step, 1 - survival))
        at_risk -= sum(1 for t in timings if t["step"] == step)
    return curve


def kaplan_meier_median(timings: list[dict]) -> float | None:
    """The step by which half the runs have transitioned, censoring counted (None: not reached)."""
    return next((step for step, share in kaplan_meier(timings) if share >= 0.5), None)


def plot_transitions(path: Path, timing: dict, title: str) -> None:
    """Per arm, the Kaplan-Meier share of runs transitioned by each step."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, by_seed in timing.items():
        curve = kaplan_meier(list(by_seed.values()))
        steps = [0] + [step for step, _ in curve]
        shares = [0.0] + [share for _, share in curve]
        ax.step(steps, shares, where="post", label=f"{arm} ({len(by_seed)} runs)")
    ax.set(xlabel="step", ylabel="share of runs transitioned (Kaplan-Meier)", ylim=(0, 1.02), title=title)
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def compare(timing: dict, first: str, second: str, seeds: list[int], loss: dict, key: str) -> dict:
    """Δ = first - second in transition steps over the seeds where neither is censored, the censored pairs named,
    and the endpoint's Δ beside the post-transition Δ (paired over the seeds where both have it)."""
    both = [s for s in seeds if s in timing.get(first, {}) and s in timing.get(second, {})]
    ok = [s for s in both if not timing[first][s]["censored"] and not timing[second][s]["censored"]]
    steps = [timing[first][s]["step"] - timing[second][s]["step"] for s in ok]
    censored = [f"{s} ({', '.join(a for a in (first, second) if timing[a][s]['censored'])})"
                for s in both if s not in ok]
    post = [s for s in ok if timing[first][s]["after"] is not None and timing[second][s]["after"] is not None]
    final = [s for s in both if loss[(first, s)].get(key) is not None and loss[(second, s)].get(key) is not None]
    out = {"comparison": f"{first} - {second}", "n": len(ok), "censored": censored,
           "later": sum(d > 0 for d in steps), "steps": _interval(steps),
           "steps_hl": hodges_lehmann(steps) if len(steps) >= 2 else None,
           "final": _interval([loss[(first, s)][key] - loss[(second, s)][key] for s in final]),
           "post": _interval([timing[first][s]["after"] - timing[second][s]["after"] for s in post])}
    return out


def _interval(deltas: list[float]) -> dict:
    return paired_difference(deltas, [0.0] * len(deltas)) if deltas else {"n": 0, "mean": math.nan,
                                                                           "low": math.nan, "high": math.nan}


def transitions_section(study_dir: Path, s, loss: dict, arms: list[str], seeds: list[int],
                        name: str) -> tuple[list[str], dict]:
    """The section's lines and numbers for the test runs in loss ((arm, seed, tpp) -> run record)."""
    tpp = s.primary_tpp
    if any(r.get("objective") == "classify" for r in loss.values()):
        return [], {}  # a classifier has no induction transition to time
    arms = [arm for arm in arms if all((arm, seed, tpp) in loss for seed in seeds)]  # an arm is shown once every
    timing = {arm: {} for arm in arms}  # test run of it has ended, as every endpoint is
    for (arm, seed, at), record in loss.items():
        if at == tpp and arm in timing and seed in seeds:
            timing[arm][seed] = run_timing(read_metrics(run_dir_of(study_dir, record) / "metrics.jsonl"))
    rules = sorted({t["rule"] for by_seed in timing.values() for t in by_seed.values()})
    if not rules:
        return [], {}
    key = "full_val_loss" if s.endpoint == "transition_step" else s.endpoint
    by_arm = {(arm, seed): loss[(arm, seed, tpp)] for arm in arms for seed in timing[arm]}
    pairs = [m for m in [s.primary[::-1]] + [m for m in (s.secondary_family or []) if isinstance(m, list)]
             if m[0] in timing and m[1] in timing]
    comparisons = [compare(timing, a, b, seeds, by_arm, key) for a, b in pairs]
    lines = ["", "## Transitions", "", rule_text(rules), ""]
    lines += markdown_table(["arm", "runs", "transitioned", "median step", "Kaplan-Meier median"] + [
        f"median at {level:g}" for level in LOSS_LEVELS if "train loss" in rules],
        [arm_row(arm, timing[arm], "train loss" in rules) for arm in arms if timing[arm]])
    lines += ["", f"Δ = first - second, paired by seed (positive: the first transitions later); steps over the pairs "
              f"where neither run is censored; the final {key} and the post-transition loss (the mean train loss "
              f"{AFTER[0]:,}-{AFTER[1]:,} steps after each run's own transition, at peak lr) over the pairs that "
              f"have them; 95% t intervals, not adjusted for the family (exploratory where the plan's endpoint is a "
              f"loss):", ""]
    lines += markdown_table(["comparison", "pairs", "Δ steps", "t interval", "Hodges-Lehmann", "first later",
                             "censored pairs", f"Δ {key}", "Δ post-transition loss"],
                            [comparison_row(c) for c in comparisons])
    plot_transitions(study_dir / "transitions.png", timing, f"{name}: when each test run's induction "
                     f"transition came ({' and '.join(rules)} rule)")
    lines += ["", "Plot: `transitions.png` (per arm the share of test runs transitioned by each step, Kaplan-Meier: a "
              "censored run leaves the count at its last step)."]
    declared = None
    if s.endpoint == "transition_step":  # a study of the transition registers the primary pair's post-transition Δ
        post = comparisons[0]["post"]
        declared = {"comparison": comparisons[0]["comparison"], **post, "reading": post_reading(post)}
        lines += ["", f"Declared secondary, the post-transition loss ({declared['comparison']}, registered; one "
                  f"comparison, unadjusted): Δ {_delta(post)} pairs: **{declared['reading']}**."]
    numbers = {"rules": rules, "loss_level": LOSS_LEVEL, "prefix_level": PREFIX_LEVEL, "after": list(AFTER),
               "arms": {arm: {str(seed): t for seed, t in by_seed.items()} for arm, by_seed in timing.items()},
               "comparisons": comparisons} | ({"post_transition": declared} if declared else {})
    return lines, numbers


def post_reading(p: dict) -> str:
    """The registered words of a post-transition Δ: its interval below 0, above 0, or around it."""
    if not p["n"] or math.isnan(p["low"]):
        return "not computed (too few pairs)"
    return "lower" if p["high"] < 0 else "higher" if p["low"] > 0 else "within noise"


def rule_text(rules: list[str]) -> str:
    text = []
    if "induction" in rules:
        text.append(f"induction rule (runs with diagnostics): the first diagnostic step at which one head's prefix-"
                    f"matching score reaches {PREFIX_LEVEL:g}; censored at the run's last step")
    if "train loss" in rules:
        text.append(f"train-loss rule (runs without diagnostics): the first logged step of the constant-lr phase at "
                    f"which the centred 9-point moving mean of the logged train loss falls to {LOSS_LEVEL:g} nats "
                    f"(beside it {' and '.join(f'{v:g}' for v in LOSS_LEVELS if v != LOSS_LEVEL)}); censored at "
                    f"the phase's last step")
    return "When each test run's induction transition came (docs/METHOD.md, section 8): " + "; ".join(text) + "."


def arm_row(arm: str, timings: dict, levels: bool) -> list:
    runs = list(timings.values())
    crossed = [t["step"] for t in runs if not t["censored"]]
    km = kaplan_meier_median(runs)
    row = [arm, len(runs), len(crossed), f"{median(crossed):,.0f}" if crossed else "none",
           f"{km:,}" if km is not None else "not reached"]
    if levels:
        for level in LOSS_LEVELS:
            steps = [t["levels"][f"{level:g}"] for t in runs]
            done = [t["step"] for t in steps if not t["censored"]]
            row.append(f"{median(done):,.0f} ({len(steps) - len(done)} censored)" if done else "none")
    return row


def comparison_row(c: dict) -> list:
    steps, hl = c["steps"], c["steps_hl"]
    hl_text = (f"{hl['estimate']:+,.0f} [{hl['low']:+,.0f}, {hl['high']:+,.0f}]" if hl and not math.isnan(hl["low"])
               else f"n/a (needs at least {hodges_lehmann_pairs()} pairs)")
    return [c["comparison"], c["n"], f"{steps['mean']:+,.0f}" if steps["n"] else "n/a",
            f"[{steps['low']:+,.0f}, {steps['high']:+,.0f}]" if steps["n"] > 1 else "n/a", hl_text,
            f"{c['later']} of {c['n']}", ", ".join(c["censored"]) or "none",
            _delta(c["final"]), _delta(c["post"])]


def _delta(p: dict) -> str:
    return f"{p['mean']:+.4f} {interval_text(p)} ({p['n']})" if p["n"] else "n/a"

"""What a plan costs and can find, before it runs (`nlq study PLAN --dry-run`, after the runs it lists): each arm's
exact non-embedding parameters, the shared start, the whole plan's chains and tokens in every stage (the edge rule's
worst case included), its hours at the pace its finished runs measured here, the GPU-hours on paper, and the power
of its test (a sequential test's bounds). An exploratory plan (families.py) gives its arms and whole-study tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from scipy import stats

from nlq.config import update
from nlq.fileio import read_json
from nlq.model import Transformer
from nlq.studies.definition.design import Study
from nlq.studies.definition.tables import duration_text, tokens_text
from nlq.studies.inference.sequential import operating, spending_bounds
from nlq.studies.inference.stats import pairs_needed, power_equivalence, power_paired_t
from nlq.studies.running.borrow import borrowed_arms
from nlq.studies.running.wsd import chain_tokens, flops_per_token, non_embedding_parameters


def arms_text(study: Study) -> str:
    """Each arm's exact non-embedding parameter count at the design's shape, against the baseline's (for --dry-run),
    and where an arm is borrowed from."""
    s = study.design
    counts = {v.name: non_embedding_parameters(update(update(study.base, v.changes), {"model": s.shape}))
              for v in study.arms}
    baseline = s.primary[0]
    lines = []
    for arm, count in counts.items():
        extra = count - counts[baseline]
        share = f" ({extra:+,}, {extra / counts[baseline]:+.1%} vs {baseline})" if arm != baseline else " (baseline)"
        borrow = borrowed_arms(s).get(arm)
        lent = f"; borrowed from study {borrow['study']} at commit {borrow['commit'][:12]}" if borrow else ""
        lines.append(f"arm {arm}: {count:,} non-embedding parameters at {s.width}{share}{lent}")
    return "\n".join(lines)


def bounds_text(study: Study, study_dir: Path | None = None, shards: int = 1) -> str:
    """What the whole plan can cost, every stage included (--dry-run, before anything runs): the chains (a stable run
    and its branches) and training tokens of the selection, of the worst case of the edge rule (every trained arm
    extended max_extensions times each way) and of the test; borrowed arms cost nothing here. Hours only at a pace
    measured here: the median tokens/s of the study's own finished runs, once there are some."""
    s = study.design
    arms = [v for v in study.arms if v.name not in borrowed_arms(s)]
    per_chain = chain_tokens(update(study.base, {"model": s.shape}), s.shape, s.budgets_tpp)
    stages = (s.selection_chains(len(s.selected_arms([v.name for v in arms]))) +
              [("test", len(arms) * len(s.seeds))])
    chains = sum(n for _, n in stages)
    parts = "; ".join(f"{name} {n} chains ({tokens_text(n * per_chain)} tokens)" for name, n in stages)
    text = (f"whole plan, every stage: {parts}; at most {chains} chains, {tokens_text(chains * per_chain)} tokens "
            f"({per_chain:,} per chain)")
    if s.mfu is not None:
        text += "\n" + gpu_hours_text(study, per_chain, stages)
    return text + hours_text(chains * per_chain, study_dir, shards, "at most")


def hours_text(tokens: int, study_dir: Path | None, shards: int, bound: str) -> str:
    """'; hours: ...' for these tokens at the median tokens/s of the study's own finished runs, once there are some."""
    rates = sorted(r for r in _finished_rates(study_dir) if r > 0)
    if not rates:
        return "; hours: estimated once a run of it has finished here (its tokens/s)"
    pace = rates[len(rates) // 2]
    return (f"; at the median {pace:,.0f} tokens/s of its {len(rates)} finished runs, {bound} "
            f"{duration_text(tokens / pace / shards / 3600)} as {shards} shard{'s' if shards > 1 else ''}")


def gpu_hours_text(study: Study, per_chain: int, stages: list[tuple[str, int]]) -> str:
    """The plan's cost on paper (design.gpu, gpu_peak_tflops, mfu): GPU-hours of each stage at that MFU from the
    training FLOPs per token of its arms at the design's shape, and for a sequential test the expected test chains
    with no difference and at the planning difference (normal approximation; the secondary arms train the seeds
    the test used)."""
    s = study.design
    arms = [v for v in study.arms if v.name not in borrowed_arms(s)]
    flops = sum(flops_per_token(update(update(study.base, v.changes), {"model": s.shape})) for v in arms) / len(arms)
    hours = per_chain * flops / (s.mfu * s.gpu_peak_tflops * 1e12) / 3600  # one chain
    parts = [f"{name} {n * hours:,.0f}" for name, n in stages]
    text = (f"cost on paper: {flops:,.0f} training FLOPs per token, {hours:,.1f} GPU-hours a chain on a {s.gpu} at "
            f"{s.mfu:.0%} of {s.gpu_peak_tflops:g} TFLOP/s; GPU-hours: " + ", ".join(parts)
            + f"; at most {sum(n for _, n in stages) * hours:,.0f}")
    if s.looks is not None:
        test = dict(stages)["test"]
        effect = s.effect
        bounds = spending_bounds(s.looks, 1 - s.confidence, s.spending)
        share = [operating(s.looks, bounds, theta).expected_pairs / s.looks[-1]
                 for theta in (0.0, effect / s.planning_sd)]
        text += (f"; the sequential test's expected test GPU-hours {test * share[0] * hours:,.0f} with no difference "
                 f"and {test * share[1] * hours:,.0f} at Δ = {effect:g}, against {test * hours:,.0f} fixed")
    return text


def _finished_rates(study_dir: Path | None) -> list[float]:
    if study_dir is None or not (Path(study_dir) / "runs").is_dir():
        return []
    summaries = (read_json(p, "a run summary") for p in (Path(study_dir) / "runs").glob("*/summary.json"))
    return [r["tokens_per_s"] for r in summaries if isinstance(r.get("tokens_per_s"), (int, float))]


def shared_start_text(study: Study, limit: int = 20_000_000) -> str:
    """Per arm, the parameter tensors that start equal to the baseline's at the first test seed (weights are drawn
    per name, so equal names usually start equal): checked by building both models, for models under `limit`
    parameters."""
    s = study.design
    baseline = s.primary[0]
    configs = {v.name: update(update(study.base, v.changes), {"model": s.shape}).model for v in study.arms}
    if configs[baseline].approx_parameters() > limit:
        return f"shared initial weights: not checked here (models over {limit:,} parameters)"
    states = {arm: Transformer(cfg, seed=s.seeds[0]).state_dict() for arm, cfg in configs.items()}
    lines = []
    for arm, state in states.items():
        if arm == baseline:
            continue
        base = states[baseline]
        equal = [k for k in state if k in base and base[k].shape == state[k].shape and torch.equal(base[k], state[k])]
        differ = sorted({k.split(".", 2)[-1] for k in state if k not in equal})
        lines.append(f"arm {arm}: {len(equal)} of {len(state)} parameter tensors start equal to {baseline}'s; the "
                     f"others: {', '.join(differ) or 'none'}")
    return "\n".join(lines)


def power_text(s: dict) -> str:
    """What the plan's number of test pairs buys at its planning sd (for --dry-run, before anything runs): the
    paired t test's power to find the planning difference (the margin where none is declared), and the
    equivalence test's power to show equivalence within the margin when there is no difference."""
    n, sd = len(s.seeds), s.planning_sd
    effect = s.effect
    power = power_paired_t(effect, sd, n, s.confidence)
    text = (f"power: {n} test pairs at the planning sd {sd:g} find a true Δ of {effect:g} with probability "
            f"{power:.2f} (paired t, {s.confidence:.0%} interval) and show equivalence within ±{s.margin:g} "
            f"with probability {power_equivalence(0.0, sd, n, s.margin, s.alpha):.2f} when the true Δ is 0")
    if s.looks is not None:
        text += "\n" + sequential_text(s, effect, sd)
    wanted = s.planning_power
    if wanted is not None and power < wanted:
        needed = pairs_needed(effect, sd, wanted, s.confidence)
        text += (f"; below the declared planning_power {wanted:g}: " + (f"{needed} pairs would reach it" if needed
                                                                      else "no number of pairs reaches it"))
    return text


def sequential_text(s: dict, effect: float, sd: float) -> str:
    """A sequential design's bounds at each look and what it buys at the planning sd (normal approximation, the sd
    taken as known): the overall alpha, the power to find the planning difference and the expected pairs, with no
    difference and at that difference, stopping only for a difference."""
    looks, spending, alpha = s.looks, s.spending, 1 - s.confidence
    bounds = spending_bounds(looks, alpha, spending)
    null, alt = operating(looks, bounds, 0.0), operating(looks, bounds, effect / sd)
    at = "; ".join(f"after {n} pairs |z| >= {c:.4f} (nominal p <= {2 * stats.norm.sf(c):.5f})"
                   for n, c in zip(looks, bounds))
    equivalence = (" Stopping for equivalence (non-binding: the bounds keep their alpha whether or not it is used) "
                   "ends some studies earlier still.") if s.stop_for_equivalence else ""
    return (f"sequential test ({spending} spending, two-sided {alpha:g}): {at}; overall alpha {null.reject:.4f}; "
            f"power {alt.reject:.2f} to find Δ = {effect:g} at sd {sd:g} (the fixed design of {looks[-1]} pairs, "
            f"the same approximation: {operating(looks[-1:], [stats.norm.isf(alpha / 2)], effect / sd).reject:.2f}; "
            f"its t test: {power_paired_t(effect, sd, looks[-1], s.confidence):.2f}); expected pairs "
            f"{null.expected_pairs:.1f} "
            f"with no difference and {alt.expected_pairs:.1f} at Δ = {effect:g}, of {looks[-1]}.{equivalence}")


def exploration_text(study: Study, study_dir: Path, shards: int = 1) -> str:
    """An exploratory plan's costs (--dry-run): each arm's exact non-embedding parameters at every model shape its
    runs train (against the baseline's), and the whole study, every stage (a later stage's runs at a stand-in lr:
    their tokens do not depend on it): runs, tokens and hours at the pace its finished runs measured here."""
    from nlq.studies.running.dry_run import tokens_to_train  # the runner's count of a run's tokens

    stages = (study.planned_stages or study.stages or (lambda _: iter([study.runs()])))(study_dir)
    runs = [run for stage in stages for run in stage]
    fresh = study_dir / ".nothing-trained"  # every run's tokens from its start, whatever has finished
    counted = tokens_to_train(runs, fresh, [], fresh)
    shapes: dict[tuple, dict[str, int]] = {}
    for run, config, _ in counted:
        m = config.model
        shapes.setdefault((m.n_layer, m.n_head, m.n_embd), {})[run.arm.name] = non_embedding_parameters(config)
    lines = []
    for (layers, heads, width), counts in shapes.items():
        base = counts.get(study.baseline)
        for arm, count in counts.items():
            share = ("(baseline)" if arm == study.baseline or base is None else
                     f"({count - base:+,}, {(count - base) / base:+.1%} vs {study.baseline})")
            lines.append(f"arm {arm}: {count:,} non-embedding parameters at {layers} x d{width} ({heads} heads) "
                         f"{share}")
    tokens = sum(t for _, _, t in counted)
    text = f"whole plan, every stage: {len(runs)} runs, {tokens_text(tokens)} tokens"
    return "\n".join(lines + [text + hours_text(tokens, study_dir, shards, "about")])

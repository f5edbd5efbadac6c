"""`nlq study scaling`: how the nonlinear query's effect moves with training tokens per parameter and width;
`nlq study scaling-shared-lr`, its learning-rate control; and their report.

The paper trains 85M non-embedding parameters on ~350 tokens per parameter; the `cpu` study trains 0.8M on
~1.5. This study fills the axis between: widths d 64 and d 128 at 2 layers each (width is the only thing
that changes; a 4-layer d 128 would cost 3.5x the CPU time for its 20 tokens per parameter), arms linear,
nonlinear and linear-mlp4.75 (+12.5% parameters), 3 seeds, on the `pypkg` corpus (Python source of the
installed packages, 46M train tokens with bpe:2048, so no budget repeats a token).

Stage 1, lr sweep: each (width, arm) at three peak lrs, one seed, a short budget; the lowest val loss
picks the arm's lr for stage 2 (the report says whether the best lr differs between arms).
Stage 2, budgets: warmup-stable-decay branches (wsd.py), the last 20% of each budget a 1 - sqrt cooldown.
The widths, budgets, lrs and seeds are the study's design, written to study.json; the report reads them there.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from nlq.config import RunConfig, update
from nlq.fileio import atomic_write, read_json
from nlq.overrides import merge_changes
from nlq.presets import get_preset
from nlq.studies.design import LINEAR, MLP_4_75, NONLINEAR, DataSpec, Run, Study, upgraded_study
from nlq.studies.plots import plot_scaling_deltas
from nlq.studies.selection import lowest
from nlq.studies.stats import holm_verdicts, mean_std, paired_difference
from nlq.studies.tables import interval_text, load_summaries, markdown_table, write_result, write_runs_csv
from nlq.studies.wsd import budget_steps, wsd_chain

ARMS = [LINEAR, NONLINEAR, MLP_4_75]
# width -> model shape, budgets in tokens per non-embedding parameter, lrs to sweep, the sweep's budget
WIDTHS = {
    "d64": {"shape": {"n_layer": 2, "n_head": 4, "n_embd": 64}, "budgets": [2, 5, 10, 20, 50, 100, 300],
            "lrs": [2e-3, 4e-3, 8e-3], "sweep_tpp": 10},
    "d128": {"shape": {"n_layer": 2, "n_head": 4, "n_embd": 128}, "budgets": [2, 5, 10, 20],
             "lrs": [1e-3, 2e-3, 4e-3], "sweep_tpp": 3},
}
SEEDS = [1, 2, 3]
DATA = DataSpec("pypkg", "bpe:2048")


def base() -> RunConfig:
    config = get_preset("micro")
    return update(config, {
        "model": {"vocab_size": 2048, "block_size": 128},
        "train": {"batch_size": 16, "schedule": "wsd", "cooldown_fraction": 0.2, "warmup_steps": 50,
                  "weight_decay": 0.1, "log_every": 100, "keep_checkpoints": 1, "checkpoint_every": 0,
                  "loss_impl": "plain"},  # as when scaling and the verdict ran (train.loss_impl came later)
        "data": {"eval_windows": 128},  # 16k tokens: bounded eval cost
    })


def sweep_runs(study: Study) -> list[Run]:
    runs = []
    for width, spec in study.design["widths"].items():
        steps = budget_steps(study.base, spec["shape"], spec["sweep_tpp"])
        changes = merge_changes({"model": dict(spec["shape"])}, {"train": {"max_steps": steps, "eval_every": steps}})
        for lr in spec["lrs"]:
            for arm in study.arms:
                runs.append(Run(study, arm, study.design["sweep_seed"], lr, changes, tag=f"sweep-{width}",
                                labels={"stage": "lr-sweep", "width": width, "tpp": spec["sweep_tpp"]}))
    return runs


def best_lrs(study_dir: Path, runs: list[Run]) -> dict[tuple[str, str], float]:
    """(width, variant) -> the swept lr with the lowest final val loss (one seed; selection.lowest)."""
    losses: dict[tuple[str, str], dict[float, float]] = {}
    for run in runs:
        summary = read_json(study_dir / "runs" / run.name / "summary.json", "a run summary")
        losses.setdefault((run.labels["width"], run.arm.name), {})[run.lr] = summary["val_loss"]
    return {key: lowest(by_lr) for key, by_lr in losses.items()}


def budget_runs(study: Study, study_dir: Path, lrs: dict[tuple[str, str], float],
                budgets_by_width: dict[str, list[float]]) -> list[Run]:
    """Per (width, seed, variant) a WSD chain (wsd.py). Budget-major order: every chain reaches a budget before
    any goes on to the next, so a study cut short has all seeds and arms of its smaller budgets (each chain's
    runs stay in order)."""
    chains = []
    for width, budgets in budgets_by_width.items():
        shape = study.design["widths"][width]["shape"]
        for seed in study.seeds:
            for arm in study.arms:
                lr = lrs[(width, arm.name)]
                chains.append(wsd_chain(study, arm, seed, study_dir, width=width, shape=shape, budgets_tpp=budgets,
                                        lr=lr, min_lr=lr * study.min_lr_ratio))
    return [run for level in range(max(map(len, chains))) for chain in chains if level < len(chain)
            for run in chain[level]]


def scaling(widths: dict | None = None, seeds: list[int] | None = None) -> Study:
    widths = widths or WIDTHS
    study = Study("scaling", "the nonlinear query's effect against tokens per parameter and width (WSD branches)",
                  base(), ARMS, seeds=list(seeds or SEEDS), data=DATA, report="scaling",
                  design={"widths": widths, "sweep_seed": 1})

    def stages(study_dir: Path):
        sweep = sweep_runs(study)
        yield sweep
        budgets = {width: spec["budgets"] for width, spec in widths.items()}
        yield budget_runs(study, study_dir, best_lrs(study_dir, sweep), budgets)

    def planned(study_dir: Path):  # the chains at the first swept lr: a chain's tokens do not depend on its lr
        sweep = sweep_runs(study)
        yield sweep
        stand_in = {(width, arm.name): spec["lrs"][0] for width, spec in widths.items() for arm in study.arms}
        yield budget_runs(study, study_dir, stand_in, {width: spec["budgets"] for width, spec in widths.items()})

    study.stages, study.planned_stages = stages, planned
    return study


SHARED_LR = 2e-3  # the swept best of linear and linear-mlp4.75 at both widths
SHARED_LR_BUDGETS = {"d64": [2, 5, 10, 20]}


def scaling_shared_lr(widths: dict | None = None, seeds: list[int] | None = None) -> Study:
    """The lr control for `scaling`: there each variant trains at its own swept lr (d 64: nonlinear 8e-3,
    linear 2e-3, from one seed), so a trend in Δ with tokens may come from the lr, not the query. Here linear
    and nonlinear share one peak lr, with the same budgets, seeds, corpus and WSD branches as `scaling`."""
    widths = widths or {w: dict(WIDTHS[w], budgets=b) for w, b in SHARED_LR_BUDGETS.items()}
    study = Study("scaling-shared-lr", f"the scaling study's d64 budgets with linear and nonlinear at one peak lr "
                  f"({SHARED_LR:g}): is the trend the query's or the lr's?", base(), ARMS[:2],
                  seeds=list(seeds or SEEDS), data=DATA, report="scaling", design={"widths": widths, "lr": SHARED_LR})

    def stages(study_dir: Path):
        lrs = {(width, v.name): SHARED_LR for width in widths for v in study.arms}
        yield budget_runs(study, study_dir, lrs, {width: spec["budgets"] for width, spec in widths.items()})

    study.stages = stages
    return study


# ---- the report ------------------------------------------------------------------------------------------

def build_scaling_report(study_dir: Path, study: dict) -> str:
    """report.md (lr sweep; per width and budget the paired Δ val loss of each variant vs linear), result.json
    (its numbers), results.csv and scaling_delta.png (Δ against tokens per parameter, a line per width and
    variant, 95% band)."""
    study = upgraded_study(study)  # a study.json of older keys, read by another reader
    runs = load_summaries(study_dir, study)
    sweep = [r for r in runs if r["stage"] == "lr-sweep"]
    budgets = [r for r in runs if r["stage"] == "budget"]
    arms = [v["name"] for v in study["arms"]]
    lines = [f"# Study `{study['name']}`", "", study.get("description", ""), "",
             f"Corpus: `{(study.get('data_meta') or {}).get('source')}`, content hash "
             f"`{str((study.get('data_meta') or {}).get('source_hash'))[:16]}`.", "", "## Learning-rate sweep", ""]
    lines += _sweep_table(sweep, arms, (study.get("design") or {}).get("widths") or {})
    table = []
    for width in dict.fromkeys(r["width"] for r in budgets):
        for tpp in sorted({r["tpp"] for r in budgets if r["width"] == width}):
            cell = [r for r in budgets if r["width"] == width and r["tpp"] == tpp]
            base = {r["seed"]: r for r in cell if r["arm"] == "linear"}
            if not base:
                continue
            base_mean, base_sd = mean_std([r["val_loss"] for r in base.values()])
            base_text = f"{base_mean:.4f}" + (f" ± {base_sd:.4f}" if len(base) > 1 else "")
            for arm in arms[1:]:
                pairs = [(r["val_loss"], base[r["seed"]]["val_loss"]) for r in cell
                         if r["arm"] == arm and r["seed"] in base]
                if not pairs:
                    continue
                p = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
                p["deltas"] = [a - b for a, b in pairs]
                own = mean_std([r["tokens"] / r["non_embedding_parameters"] for r in cell
                                if r["arm"] == arm])[0]
                table.append(((width, arm, tpp), p, [width, f"{tpp:g}", f"{own:.1f}", f"{cell[0]['tokens']:,}",
                                                     base_text, arm]))
    tested = holm_verdicts([p for _, p, _ in table])
    lines += ["", "## Δ val loss vs `linear` at each budget (variant - linear, paired by seed: same batches and "
              "shared initial weights)", "",
              "Tokens/param: per non-embedding parameter of linear (the budget), and of the variant. Verdicts are "
              f"Holm-adjusted over the {len(table)} intervals of this table (one family); the interval is "
              "unadjusted.", ""]
    deltas = {key: p for (key, _, _), p in zip(table, tested)}
    lines += markdown_table(
        ["width", "tokens/param", "variant's tokens/param", "tokens", "linear val loss (mean ± std)", "variant",
         "pairs", "mean Δ", "95% interval", "p", "Holm p", "verdict (Holm)"],
        [cells + [p["n"], f"{p['mean']:+.4f}", interval_text(p), _p(p["p"]), _p(p["p_holm"]), p["verdict"]]
         for (_, _, cells), p in zip(table, tested)])
    trends = tpp_trends(budgets, arms)
    tested_trends = holm_verdicts(list(trends.values()))
    lines += ["", "## Trend: Δ per doubling of tokens per parameter", "",
              "Per seed, the least-squares slope of that seed's Δ against log2(tokens per parameter) over its finished "
              "budgets (at least 3); the mean over seeds with a 95% t interval. Below 0: the variant gains on linear "
              f"as tokens grow. Readings are Holm-adjusted over the {len(trends)} rows of this table.", ""]
    words = {"better": "gains as tokens grow", "worse": "loses as tokens grow", "within noise": "no trend beyond noise"}
    lines += markdown_table(
        ["width", "variant", "budgets (tokens/param)", "seeds", "Δ per doubling", "95% interval", "p", "Holm p",
         "reading"],
        [[width, arm, trend["span"], trend["n"], f"{trend['mean']:+.4f}", interval_text(trend), _p(trend["p"]),
          _p(tested["p_holm"]), words.get(tested["verdict"], tested["verdict"])]
         for ((width, arm), trend), tested in zip(trends.items(), tested_trends)])
    lrs = {(r["width"], r["arm"]): r["lr"] for r in budgets}
    write_result(study_dir / "result.json", {
        "study": study["name"], "baseline": "linear",
        "deltas": [{"width": w, "arm": v, "tpp": tpp, **p} for (w, v, tpp), p in deltas.items()],
        "trends": [{"width": w, "arm": v, **trend, "p_holm": tested["p_holm"], "reading": tested["verdict"]}
                   for ((w, v), trend), tested in zip(trends.items(), tested_trends)],
        "lrs": [{"width": w, "arm": v, "lr": lr} for (w, v), lr in lrs.items()]})
    lines += ["", "Plot: `scaling_delta.png` (each seed's Δ as a dot; the mean with its 95% interval band, unadjusted, "
              "against tokens per parameter; the legend gives each variant's peak lr and its pairs).", ""]
    plot_scaling_deltas(study_dir / "scaling_delta.png", deltas, lrs, study["name"])
    write_runs_csv(study_dir / "results.csv", runs, ["name", "stage", "width", "tpp", "arm", "lr", "seed", "tokens",
                                                      "non_embedding_parameters", "val_loss"])
    markdown = "\n".join(lines)
    atomic_write(study_dir / "report.md", markdown)
    return markdown


def tpp_trends(budgets: list[dict], arms: list[str], min_points: int = 3) -> dict[tuple[str, str], dict]:
    """(width, variant) -> the paired slope of Δ val loss (variant - linear) per doubling of tokens per
    parameter: one least-squares slope per seed over the budgets where both runs finished, then
    paired_difference of the slopes against 0 (mean, 95% interval, verdict; 'better' = Δ falls with tokens).
    A seed with fewer than min_points budgets is left out; also holds 'span', the budgets used."""
    loss = {(r["width"], r["arm"], r["seed"], r["tpp"]): r["val_loss"] for r in budgets}
    trends = {}
    for width in dict.fromkeys(r["width"] for r in budgets):
        for arm in arms[1:]:
            slopes, used = [], set()
            for seed in sorted({r["seed"] for r in budgets if r["width"] == width}):
                points = sorted((tpp, loss[(width, arm, seed, tpp)] - loss[(width, "linear", seed, tpp)])
                                for (w, v, s, tpp) in loss if (w, v, s) == (width, arm, seed)
                                and (width, "linear", seed, tpp) in loss)
                if len(points) < min_points:
                    continue
                slopes.append(float(np.polyfit(np.log2([t for t, _ in points]), [d for _, d in points], 1)[0]))
                used.update(t for t, _ in points)
            if slopes:
                span = sorted(used)
                trends[(width, arm)] = paired_difference(slopes, [0.0] * len(slopes)) | {
                    "span": f"{span[0]:g}-{span[-1]:g}"}
    return trends


def _sweep_table(sweep: list[dict], arms: list[str], widths: dict) -> list[str]:
    if not sweep:
        return ["No lr-sweep run has finished yet (or the study has no sweep: see its description)."]
    lrs = sorted({r["lr"] for r in sweep})
    rows, best_by_width, best_of = [], {}, {}
    for width in dict.fromkeys(r["width"] for r in sweep):
        for arm in arms:
            cells = {r["lr"]: r["val_loss"] for r in sweep if r["width"] == width and r["arm"] == arm}
            if not cells:
                continue
            best = best_of[(width, arm)] = lowest(cells)  # one seed: its loss is the mean
            best_by_width.setdefault(width, set()).add(best)
            rows.append([width, arm] + [f"{cells[lr]:.4f}" if lr in cells else "" for lr in lrs] + [f"{best:g}"])
    lines = markdown_table(["width", "variant"] + [f"lr {lr:g}" for lr in lrs] + ["best lr"], rows) + [""]
    for width, best in best_by_width.items():
        done = {(r["arm"], r["lr"]) for r in sweep if r["width"] == width}
        expected = len(arms) * len(widths[width]["lrs"]) if width in widths else len(done)
        if len(done) < expected:
            lines.append(f"- {width}: sweep incomplete ({len(done)} of {expected} runs); "
                         "no verdict on the best lr yet.")
            continue
        lines.append(f"- {width}: the best lr is "
                     f"{'the same for every variant' if len(best) == 1 else 'not the same for every variant'} "
                     f"({', '.join(f'{b:g}' for b in sorted(best))}); one seed, so a difference of one grid step can "
                     "be noise.")
        grid = sorted({r["lr"] for r in sweep if r["width"] == width})
        edge = [v for v in arms if best_of.get((width, v)) in (grid[0], grid[-1])]
        if edge and len(grid) > 2:
            lines.append(f"- {width}: the best lr of {', '.join(edge)} is at the edge of the swept grid "
                         f"({grid[0]:g}-{grid[-1]:g}); its optimum may lie beyond it.")
    return lines


def _p(p: float) -> str:
    return "" if math.isnan(p) else f"{p:.3g}"

"""The report of a scaling plan ([design] kind = "scaling": plans/scaling.toml, scaling-shared-lr.toml): how the
nonlinear query's effect moves with training tokens per parameter and width. Its lr sweep (the best lr per width and
arm, and whether it differs between arms), per width and budget the paired Δ of each arm vs the baseline, the trend
of Δ with tokens per parameter; the widths, budgets and lrs read from study.json's design."""

from __future__ import annotations

import math
from pathlib import Path

from nlq.studies.definition.tables import interval_text, load_summaries, markdown_table, write_runs_csv
from nlq.studies.inference.selection import lowest
from nlq.studies.inference.stats import holm_verdicts, mean_std, paired_difference
from nlq.studies.reports.plots import plot_scaling_deltas

# ---- the report ------------------------------------------------------------------------------------------

def build_scaling_report(study_dir: Path, study: dict) -> tuple[list[str], dict]:
    """The report's lines (lr sweep; per width and budget the paired Δ val loss of each variant vs linear) and numbers
    (result.json); writes results.csv and scaling_delta.png (Δ against tokens per parameter, a line per width and
    variant, 95% band)."""
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
    numbers = {
        "study": study["name"], "baseline": "linear",
        "deltas": [{"width": w, "arm": v, "tpp": tpp, **p} for (w, v, tpp), p in deltas.items()],
        "trends": [{"width": w, "arm": v, **trend, "p_holm": tested["p_holm"], "reading": tested["verdict"]}
                   for ((w, v), trend), tested in zip(trends.items(), tested_trends)],
        "lrs": [{"width": w, "arm": v, "lr": lr} for (w, v), lr in lrs.items()]}
    lines += ["", "Plot: `scaling_delta.png` (each seed's Δ as a dot; the mean with its 95% interval band, unadjusted, "
              "against tokens per parameter; the legend gives each variant's peak lr and its pairs).", ""]
    plot_scaling_deltas(study_dir / "scaling_delta.png", deltas, lrs, study["name"])
    write_runs_csv(study_dir / "results.csv", runs, ["name", "stage", "width", "tpp", "arm", "lr", "seed", "tokens",
                                                      "non_embedding_parameters", "val_loss"])
    return lines, numbers


def least_squares_slope(x: list[float], y: list[float]) -> float:
    """The slope of the least-squares line through (x, y), in closed form with exactly rounded sums: the same bits on
    every CPU (a LAPACK fit's last bits follow the BLAS kernels the CPU selects)."""
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    return math.fsum((a - mx) * (b - my) for a, b in zip(x, y)) / math.fsum((a - mx) ** 2 for a in x)


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
                slopes.append(least_squares_slope([math.log2(t) for t, _ in points], [d for _, d in points]))
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

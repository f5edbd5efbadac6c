"""The report of a comparison plan ([design] kind = "comparison": plans/cpu.toml, the main job of `nlq reproduce`;
cpu-lr, encoder, kvo, paper): arms x seeds (x peak lrs) on one budget. Per arm its non-embedding parameters (and %
vs baseline), final val loss mean and std over seeds, perplexity, relative change vs baseline in log-loss and
perplexity ((arm - base) / base: positive is worse), tokens/s; paired differences vs the baseline over seeds, with
95% t intervals, Holm-adjusted over the arms; parameter equivalence (val loss against log(non-embedding parameters)
over the baseline width family); plots val_curves.png, loss_vs_params.png and paired_curves.png. With several peak
lrs, each arm is compared at its own best (lowest mean val loss).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from nlq.errors import UserError
from nlq.fileio import atomic_write
from nlq.studies.definition.tables import RunResult, best_lr, interval_text, load_results, markdown_table
from nlq.studies.inference.stats import (
    equivalent_params,
    fit_loss_vs_params,
    holm_verdicts,
    paired_difference,
    relative_delta,
)
from nlq.studies.reports.plots import plot_loss_vs_params, plot_paired_curves, plot_val_curves

# ---- the report ----------------------------------------------------------------------------------

def build_comparison_report(study_dir: Path, study: dict) -> tuple[list[str], dict]:
    """The report's lines and numbers (result.json); writes results.csv, val_curves.png, loss_vs_params.png and
    paired_curves.png."""
    results = load_results(study_dir, study)
    baseline = study["baseline"]
    order = [v["name"] for v in study["arms"]]
    lrs = best_lr(results)
    chosen = [r for r in results if r.lr == lrs[r.arm]]
    by_arm = {v: sorted((r for r in chosen if r.arm == v), key=lambda r: r.seed) for v in order}
    by_arm = {v: rs for v, rs in by_arm.items() if rs}
    if baseline not in by_arm:
        raise UserError(f"the baseline {baseline!r} has no finished run in {study_dir}")
    base_runs = by_arm[baseline]
    base_loss = float(np.mean([r.val_loss for r in base_runs]))
    base_params = base_runs[0].params

    rows, paired = [], {}
    for arm, runs in by_arm.items():
        losses = [r.val_loss for r in runs]
        mean = float(np.mean(losses))
        rows.append({
            "arm": arm, "lr": lrs[arm], "seeds": len(runs), "params": runs[0].params,
            "params_vs_base": runs[0].params / base_params - 1, "val_loss": mean,
            "val_loss_std": float(np.std(losses, ddof=1)) if len(losses) > 1 else math.nan,
            "ppl": math.exp(mean), "bpb": float(np.mean([r.val_bpb for r in runs])),
            "d_loss": relative_delta(base_loss, mean), "d_ppl": relative_delta(math.exp(base_loss), math.exp(mean)),
            "tokens_per_s": float(np.median([r.tokens_per_s for r in runs])),
            "acc": float(np.mean([r.val_acc for r in runs])) if all(r.val_acc is not None for r in runs) else None,
        })
        if arm != baseline:
            base_by_seed = {r.seed: r.val_loss for r in base_runs}
            pairs = [(r.val_loss, base_by_seed[r.seed]) for r in runs if r.seed in base_by_seed]
            if pairs:
                paired[arm] = paired_difference([p[0] for p in pairs], [p[1] for p in pairs])

    family = [v for v in study.get("width_family", []) if v in by_arm]
    fit = fit_loss_vs_params([by_arm[v][0].params for v in family],
                             [np.mean([r.val_loss for r in by_arm[v]])
                              for v in family]) if len(family) >= 2 else None

    verdicts = dict(zip(paired, holm_verdicts(list(paired.values()))))
    _write_csv(study_dir / "results.csv", results)
    plot_val_curves(study_dir / "val_curves.png", by_arm, study["name"])
    plot_loss_vs_params(study_dir / "loss_vs_params.png", rows, family, fit)
    plot_paired_curves(study_dir / "paired_curves.png", by_arm, baseline, study["name"])
    return _lines(study, rows, paired, family, fit, base_params, len(results), baseline, lrs), {
        "study": study["name"], "baseline": baseline, "runs": len(results), "lrs": lrs, "arms": rows,
        "paired": verdicts, "width_family": family, "fit": list(fit) if fit else None}


def _lines(study, rows, paired, family, fit, base_params, n_runs, baseline, lrs) -> list[str]:
    sweep = study.get("lrs")
    with_acc = all(r["acc"] is not None for r in rows)  # next-token or masked-token accuracy, when logged
    header = ["variant", "lr", "seeds", "non-emb params", "vs base", "val loss (mean ± std)", "ppl", "Δ log-loss",
              "Δ ppl", "tokens/s"] + ["val accuracy"] * with_acc
    lines = [f"# Study `{study['name']}`", "", study.get("description", ""), "",
             f"{n_runs} finished runs. Relative change = (variant - baseline) / baseline, the sign of Δ: "
             "positive is worse."
             + (" Each variant at its best peak lr of " + ", ".join(f"{x:g}" for x in sweep) + "." if sweep else ""),
             ""]
    lines += markdown_table(header, [
        [r["arm"], f"{r['lr']:g}", r["seeds"], f"{r['params']:,}", f"{r['params_vs_base']:+.2%}",
         f"{r['val_loss']:.4f}" + (f" ± {r['val_loss_std']:.4f}" if not math.isnan(r["val_loss_std"]) else ""),
         f"{r['ppl']:.2f}", f"{r['d_loss']:+.2%}", f"{r['d_ppl']:+.2%}", f"{r['tokens_per_s']:,.0f}"]
        + ([f"{r['acc']:.4f}"] if with_acc else []) for r in rows])
    lines += ["", f"## Paired differences vs `{baseline}` (variant - baseline, same seed = same batches)", "",
              f"Verdicts are Holm-adjusted over the {len(paired)} variants compared with `{baseline}` (one family); "
              "the intervals are unadjusted.", ""]
    lines += markdown_table(
        ["variant", "pairs", "mean Δ val loss", "95% interval", "p", "Holm p", "verdict (Holm)"],
        [[arm, p["n"], f"{p['mean']:+.4f}", interval_text(p)]
         + (["", ""] if math.isnan(p["p"]) else [f"{p['p']:.3g}", f"{p['p_holm']:.3g}"]) + [p["verdict"]]
         for arm, p in zip(paired, holm_verdicts(list(paired.values())))])
    lines += ["", "## Parameter equivalence", ""]
    if not study.get("width_family"):
        lines.append("This study has no family of wider linear baselines, so no parameter equivalent is fitted.")
    elif fit is None:
        lines.append("No fit: the baseline width family (" + (", ".join(family) or "none") + ") does not show val loss "
                     "falling with parameters at this scale, so no parameter equivalent can be stated.")
    else:
        a, b = fit
        lines.append(f"Fit over {', '.join(family)}: val loss = {a:.4f} {b:+.4f} ln(N), N = non-embedding parameters.")
        needed = {r["arm"]: (r["val_loss"], equivalent_params(fit, r["val_loss"])) for r in rows
                  if r["arm"] not in family and r["arm"] != baseline}
        lines += [""] + markdown_table(["variant", "val loss", "linear baseline would need", "vs baseline"],
                                       [[v, f"{loss:.4f}", f"{n:,.0f}", f"{n / base_params - 1:+.1%}"]
                                        for v, (loss, n) in needed.items()])
        lines.append("")
        lines.append("Three width points span little range; read the extrapolated values as rough.")
    lines += ["", "Plots: `val_curves.png` (mean over seeds, band = min..max), `loss_vs_params.png` (mean ± std over "
              "seeds), `paired_curves.png` (each variant minus the baseline over training, paired by seed, with its "
              "95% interval band).", ""]
    return lines


def _write_csv(path: Path, results: list[RunResult]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["run", "variant", "lr", "seed", "non_embedding_params", "val_loss", "val_ppl", "val_bpb",
                     "tokens_per_s"])
    for r in sorted(results, key=lambda r: (r.arm, r.lr, r.seed)):
        writer.writerow([r.name, r.arm, r.lr, r.seed, r.params, f"{r.val_loss:.6f}", f"{math.exp(r.val_loss):.4f}",
                         f"{r.val_bpb:.6f}", f"{r.tokens_per_s:.1f}"])
    atomic_write(path, buffer.getvalue())

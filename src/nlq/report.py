"""`nlq report STUDY_DIR`: report.md, results.csv and PNG plots from a study's run directories.

- per variant: non-embedding parameters (and % vs baseline), final val loss mean and std over seeds,
  perplexity, relative change vs baseline in log-loss and perplexity ((base - variant) / base), tokens/s;
- paired differences vs the baseline over seeds, with a 95% t interval and a verdict;
- parameter equivalence: val loss against log(non-embedding parameters) over the baseline width family,
  and how many more parameters a linear baseline would need to match each variant;
- plots: val-loss curves of all variants, and loss against parameters with the fit.
With several peak learning rates, each variant is compared at its own best (lowest mean val loss).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nlq.errors import UserError
from nlq.studies.stats import paired_difference
from nlq.training.logging import read_metrics


@dataclass
class RunResult:
    name: str
    variant: str
    seed: int
    lr: float
    params: int
    val_loss: float
    val_bpb: float
    tokens_per_s: float
    curve: list[tuple[int, float]]  # (step, val loss)
    val_acc: float | None = None  # next-token or masked-token accuracy


# ---- statistics (pure functions, tested against hand-computed values) --------------------------------

def relative_change(baseline: float, variant: float) -> float:
    """(baseline - variant) / baseline: positive means the variant is lower (better)."""
    return (baseline - variant) / baseline


def fit_loss_vs_params(params: list[float], losses: list[float]) -> tuple[float, float] | None:
    """Least-squares loss = a + b ln(N); None when the fit is impossible or loss does not fall with N."""
    if len(set(params)) < 2:
        return None
    b, a = np.polyfit(np.log(np.asarray(params, dtype=float)), np.asarray(losses, dtype=float), 1)
    return (float(a), float(b)) if b < 0 else None


def equivalent_params(fit: tuple[float, float], loss: float) -> float:
    """N at which the fitted baseline family reaches `loss`."""
    a, b = fit
    return math.exp((loss - a) / b)


# ---- reading a study -------------------------------------------------------------------------------

def load_results(study_dir: Path) -> tuple[dict, list[RunResult]]:
    study_path = study_dir / "study.json"
    if not study_path.is_file():
        raise UserError(f"{study_dir} is not a study directory (no study.json); run nlq study NAME --out {study_dir}")
    study = read_json(study_path, "the study's description; run nlq study again to rewrite it")
    results = []
    for run in study.get("runs", []):
        run_dir = study_dir / "runs" / run["name"]
        summary_path = run_dir / "summary.json"
        if not summary_path.is_file():
            continue  # not finished yet
        summary = read_json(summary_path, "a run summary; run nlq study again to finish that run")
        if summary.get("val_loss") is None:
            continue
        curve = [(r["step"], r["val_loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
        results.append(RunResult(run["name"], run["variant"], run["seed"], run["lr"], summary["non_embedding_parameters"],
                                 summary["val_loss"], summary.get("val_bpb") or math.nan, summary["tokens_per_s"],
                                 curve, summary.get("val_acc")))
    if not results:
        raise UserError(f"{study_dir} has no finished runs yet; run nlq study first")
    return study, results


def read_json(path: Path, what: str) -> dict:
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is truncated or not JSON ({type(e).__name__}); it is {what}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} does not hold a JSON object; it is {what}")
    return value


def load_summaries(study_dir: Path, study: dict) -> list[dict]:
    """Each finished run of study.json (its labels) joined with its summary.json; unfinished runs left out."""
    found = {}
    for run in study.get("runs", []):
        path = study_dir / "runs" / run["name"] / "summary.json"
        if path.is_file():
            summary = read_json(path, "a run summary; run nlq study again to finish that run")
            if summary.get("val_loss") is not None:
                found[run["name"]] = {**summary, **run}
    return list(found.values())


def best_lr(results: list[RunResult]) -> dict[str, float]:
    """Each variant's peak lr with the lowest mean val loss."""
    by = {}
    for r in results:
        by.setdefault(r.variant, {}).setdefault(r.lr, []).append(r.val_loss)
    return {v: min(lrs, key=lambda lr: np.mean(lrs[lr])) for v, lrs in by.items()}


# ---- the report --------------------------------------------------------------------------------------

def build_report(study_dir: str | Path) -> str:
    """Write report.md, results.csv, val_curves.png, loss_vs_params.png; return the markdown."""
    study_dir = Path(study_dir)
    study, results = load_results(study_dir)
    if study.get("report") == "scaling":
        from nlq.scaling import build_scaling_report

        return build_scaling_report(study_dir, study)
    if study.get("report") == "probes":
        from nlq.probes import build_probes_report

        return build_probes_report(study_dir, study)
    baseline = study["baseline"]
    order = [v["name"] for v in study["variants"]]
    lrs = best_lr(results)
    chosen = [r for r in results if r.lr == lrs[r.variant]]
    by_variant = {v: sorted((r for r in chosen if r.variant == v), key=lambda r: r.seed) for v in order}
    by_variant = {v: rs for v, rs in by_variant.items() if rs}
    if baseline not in by_variant:
        raise UserError(f"the baseline {baseline!r} has no finished run in {study_dir}")
    base_runs = by_variant[baseline]
    base_loss = float(np.mean([r.val_loss for r in base_runs]))
    base_params = base_runs[0].params

    rows, paired = [], {}
    for variant, runs in by_variant.items():
        losses = [r.val_loss for r in runs]
        mean = float(np.mean(losses))
        rows.append({
            "variant": variant, "lr": lrs[variant], "seeds": len(runs), "params": runs[0].params,
            "params_vs_base": runs[0].params / base_params - 1, "val_loss": mean,
            "val_loss_std": float(np.std(losses, ddof=1)) if len(losses) > 1 else math.nan,
            "ppl": math.exp(mean), "bpb": float(np.mean([r.val_bpb for r in runs])),
            "d_loss": relative_change(base_loss, mean), "d_ppl": relative_change(math.exp(base_loss), math.exp(mean)),
            "tokens_per_s": float(np.median([r.tokens_per_s for r in runs])),
            "acc": float(np.mean([r.val_acc for r in runs])) if all(r.val_acc is not None for r in runs) else None,
        })
        if variant != baseline:
            base_by_seed = {r.seed: r.val_loss for r in base_runs}
            pairs = [(r.val_loss, base_by_seed[r.seed]) for r in runs if r.seed in base_by_seed]
            if pairs:
                paired[variant] = paired_difference([p[0] for p in pairs], [p[1] for p in pairs])

    family = [v for v in study.get("width_family", []) if v in by_variant]
    fit = fit_loss_vs_params([by_variant[v][0].params for v in family],
                             [np.mean([r.val_loss for r in by_variant[v]]) for v in family]) if len(family) >= 2 else None

    markdown = _markdown(study, rows, paired, family, fit, base_params, len(results), baseline, lrs)
    _write_csv(study_dir / "results.csv", results)
    _plot_curves(study_dir / "val_curves.png", by_variant, study["name"])
    _plot_params(study_dir / "loss_vs_params.png", rows, family, fit)
    _plot_paired_curves(study_dir / "paired_curves.png", by_variant, baseline, study["name"])
    _atomic_write(study_dir / "report.md", markdown)
    return markdown


def _markdown(study, rows, paired, family, fit, base_params, n_runs, baseline, lrs) -> str:
    sweep = study.get("lrs")
    with_acc = all(r["acc"] is not None for r in rows)  # next-token or masked-token accuracy, when logged
    lines = [f"# Study `{study['name']}`", "", study.get("description", ""), "",
             f"{n_runs} finished runs. Relative change = (baseline - variant) / baseline; positive is better."
             + (" Each variant at its best peak lr of " + ", ".join(f"{x:g}" for x in sweep) + "." if sweep else ""),
             "", "| variant | lr | seeds | non-emb params | vs base | val loss (mean ± std) | ppl | Δ log-loss | Δ ppl | tokens/s |"
             + (" val accuracy |" if with_acc else ""), "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_acc else "")]
    for r in rows:
        std = f" ± {r['val_loss_std']:.4f}" if not math.isnan(r["val_loss_std"]) else ""
        lines.append(f"| {r['variant']} | {r['lr']:g} | {r['seeds']} | {r['params']:,} | {r['params_vs_base']:+.2%} | "
                     f"{r['val_loss']:.4f}{std} | {r['ppl']:.2f} | {r['d_loss']:+.2%} | {r['d_ppl']:+.2%} | "
                     f"{r['tokens_per_s']:,.0f} |" + (f" {r['acc']:.4f} |" if with_acc else ""))
    lines += ["", f"## Paired differences vs `{baseline}` (variant - baseline, same seed = same batches)", "",
              "| variant | pairs | mean Δ val loss | 95% interval | verdict |", "|---|---|---|---|---|"]
    for variant, p in paired.items():
        interval = f"[{p['low']:+.4f}, {p['high']:+.4f}]" if not math.isnan(p["low"]) else "n/a"
        lines.append(f"| {variant} | {p['n']} | {p['mean']:+.4f} | {interval} | {p['verdict']} |")
    lines += ["", "## Parameter equivalence", ""]
    if not study.get("width_family"):
        lines.append("This study has no family of wider linear baselines, so no parameter equivalent is fitted.")
    elif fit is None:
        lines.append("No fit: the baseline width family (" + (", ".join(family) or "none") + ") does not show val loss "
                     "falling with parameters at this scale, so no parameter equivalent can be stated.")
    else:
        a, b = fit
        lines.append(f"Fit over {', '.join(family)}: val loss = {a:.4f} {b:+.4f} ln(N), N = non-embedding parameters.")
        lines += ["", "| variant | val loss | linear baseline would need | vs baseline |", "|---|---|---|---|"]
        for r in rows:
            if r["variant"] in family or r["variant"] == baseline:
                continue
            n_eq = equivalent_params(fit, r["val_loss"])
            lines.append(f"| {r['variant']} | {r['val_loss']:.4f} | {n_eq:,.0f} | {n_eq / base_params - 1:+.1%} |")
        lines.append("")
        lines.append("Three width points span little range; read the extrapolated values as rough.")
    lines += ["", "Plots: `val_curves.png` (mean over seeds, band = min..max), `loss_vs_params.png` (mean ± std over "
              "seeds), `paired_curves.png` (each variant minus the baseline over training, paired by seed, with its "
              "95% interval band).", ""]
    return "\n".join(lines)


def write_runs_csv(path: Path, runs: list[dict], keys: list[str]) -> None:
    """One row per run (a dict of its labels and summary), the given columns."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(keys)
    for r in runs:
        writer.writerow([r.get(k) for k in keys])
    _atomic_write(path, buffer.getvalue())


def _write_csv(path: Path, results: list[RunResult]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["run", "variant", "lr", "seed", "non_embedding_params", "val_loss", "val_ppl", "val_bpb", "tokens_per_s"])
    for r in sorted(results, key=lambda r: (r.variant, r.lr, r.seed)):
        writer.writerow([r.name, r.variant, r.lr, r.seed, r.params, f"{r.val_loss:.6f}", f"{math.exp(r.val_loss):.4f}",
                         f"{r.val_bpb:.6f}", f"{r.tokens_per_s:.1f}"])
    _atomic_write(path, buffer.getvalue())


def _plot_curves(path: Path, by_variant: dict[str, list[RunResult]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, runs in by_variant.items():
        steps = sorted(set.intersection(*(set(s for s, _ in r.curve) for r in runs)) - {0})
        values = np.array([[dict(r.curve)[s] for s in steps] for r in runs])  # (seeds, steps)
        line, = ax.plot(steps, values.mean(0), label=variant, marker=".")
        ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
    ax.set(xlabel="step", ylabel="val loss (nats/token)", title=f"{title}: validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    _save_figure(fig, path)


def paired_curve(runs: list[RunResult], base_runs: list[RunResult]) -> list[tuple[int, dict]]:
    """(step, paired difference variant - baseline over the seeds both have at that eval step)."""
    base = {r.seed: dict(r.curve) for r in base_runs}
    mine = {r.seed: dict(r.curve) for r in runs if r.seed in base}
    steps = sorted(set.intersection(*(set(c) & set(base[s]) for s, c in mine.items()))) if mine else []
    return [(step, paired_difference([mine[s][step] for s in mine], [base[s][step] for s in mine])) for step in steps]


def _plot_paired_curves(path: Path, by_variant: dict[str, list[RunResult]], baseline: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for variant, runs in by_variant.items():
        if variant == baseline:
            continue
        points = paired_curve(runs, by_variant[baseline])
        if not points:
            continue
        steps = [s for s, _ in points]
        line, = ax.plot(steps, [p["mean"] for _, p in points], marker=".", label=variant)
        if not any(math.isnan(p["low"]) for _, p in points):
            ax.fill_between(steps, [p["low"] for _, p in points], [p["high"] for _, p in points], color=line.get_color(),
                            alpha=0.15)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set(xlabel="step", ylabel=f"val loss - {baseline} (nats; < 0 is better)",
           title=f"{title}: paired difference to {baseline}, 95% interval")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save_figure(fig, path)


def _plot_params(path: Path, rows: list[dict], family: list[str], fit) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        marker = "o" if r["variant"] in family else "*"
        std = 0.0 if math.isnan(r["val_loss_std"]) else r["val_loss_std"]  # the seed spread, often larger than the gaps
        ax.errorbar(r["params"], r["val_loss"], yerr=std, fmt=marker, markersize=7 if marker == "o" else 11, capsize=4)
        ax.annotate(r["variant"], (r["params"], r["val_loss"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    if fit is not None:
        ns = np.linspace(min(r["params"] for r in rows) * 0.95, max(r["params"] for r in rows) * 1.05, 50)
        ax.plot(ns, fit[0] + fit[1] * np.log(ns), "k--", lw=1, label="fit over the width family")
        ax.legend()
    ax.set(xlabel="non-embedding parameters", ylabel="final val loss (mean ± std over seeds)", title="loss vs parameters")
    ax.grid(alpha=0.3)
    _save_figure(fig, path)


def _save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)

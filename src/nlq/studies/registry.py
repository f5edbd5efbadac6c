"""The one place that names the studies and their reports: `nlq study NAME` and `nlq report` look them up here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nlq.errors import UserError
from nlq.studies import comparison, probes, scaling, verdict, verdict_lr, verdict_lr_report
from nlq.studies.study import Study
from nlq.studies.tables import load_results

STUDIES: dict[str, Callable[[], Study]] = {
    "cpu": comparison.cpu,
    "cpu-lr": comparison.cpu_lr,
    "encoder": comparison.encoder,
    "kvo": comparison.kvo,
    "paper": comparison.paper,
    "scaling": scaling.scaling,
    "scaling-shared-lr": scaling.scaling_shared_lr,
    "probes": probes.probes,
    "verdict": verdict.verdict,
    "verdict-lr": verdict_lr.verdict_lr,
}

REPORTS: dict[str, Callable[[Path, dict], str]] = {
    "comparison": comparison.build_comparison_report,
    "scaling": scaling.build_scaling_report,
    "probes": probes.build_probes_report,
    "verdict": verdict.build_verdict_report,
    "verdict-lr": verdict_lr_report.build_verdict_lr_report,
}


def get_study(name: str) -> Study:
    if name not in STUDIES:
        raise UserError(f"unknown study {name!r}; valid studies: {', '.join(STUDIES)}")
    return STUDIES[name]()


def build_report(study_dir: str | Path) -> str:
    """Write the study's report (report.md, results.csv, plots) from what is on disk; return the markdown."""
    study_dir = Path(study_dir)
    study, _ = load_results(study_dir)  # one-line errors for a folder that is no study, or one with no finished run
    kind = study.get("report", "comparison")
    if kind not in REPORTS:
        raise UserError(f"{study_dir / 'study.json'} asks for a report {kind!r} that this nlq does not have ({', '.join(REPORTS)})")
    return REPORTS[kind](study_dir, study)

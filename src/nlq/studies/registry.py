"""The one place that names the studies and their reports: `nlq study NAME` and `nlq report` look them up here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nlq.errors import UserError
from nlq.runs.rundir import use_recorded_code
from nlq.studies.definition.design import PLAN_REPORTS, Study, read_study
from nlq.studies.definition.plan import is_plan_path, load_plan, shipped_plans
from nlq.studies.definition.plan_explore import EXPLORE_FIELDS
from nlq.studies.definition.tables import load_summaries
from nlq.studies.reports.plan_report import build_plan_report
from nlq.studies.running.engine import plan_study

# every study is a plan: the shipped plans (nlq/plans/*.toml, `plans/` in a checkout) by their names (`nlq study cpu`)
STUDIES: dict[str, Callable[[], Study]] = {
    name: (lambda path=path: plan_study(load_plan(path))) for name, path in shipped_plans().items()}

# study.json's "report" names what its report reads (one flow, plan_report.build_plan_report): a decision's is "plan"
# ("verdict" and "verdict-lr" before 2026-12-02), whose sections its Design's kind picks; an exploratory plan's is its
# kind, and so was a study's of code's own before every study was a plan (results/cpu, scaling, probes: the one
# upgrade path, read as their plans' now).
REPORTS = PLAN_REPORTS + tuple(EXPLORE_FIELDS)


def get_study(name: str) -> Study:
    """A named study, a shipped plan by its name, or a plan file (a path ending in .toml)."""
    if is_plan_path(name):
        return plan_study(load_plan(name))
    if name not in STUDIES:
        raise UserError(f"unknown study {name!r}; valid studies: {', '.join(STUDIES)}, or a plan file (.toml)")
    return STUDIES[name]()


def build_report(study_dir: str | Path) -> str:
    """Write the study's report (report.md, results.csv, plots) from what is on disk; return the markdown."""
    study_dir = Path(study_dir)
    study = read_study(study_dir)  # one-line errors for a folder that is no study or holds a damaged record
    if not load_summaries(study_dir, study):
        raise UserError(f"{study_dir} has no finished runs yet; run nlq study first")
    use_recorded_code(study.get("projections"), f"study {study_dir}")  # its arms' code of one's own, from its files
    kind = study.get("report", "comparison")
    if kind not in REPORTS:
        raise UserError(f"{study_dir / 'study.json'} asks for a report {kind!r} that this nlq does not have "
                        f"({', '.join(REPORTS)})")
    return build_plan_report(study_dir, study)

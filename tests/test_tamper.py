"""A study's record cannot be quietly rewritten: `nlq report` (and every reader of a plan study, through
design.read_study) checks the design against the plan its runs trained under and the plan hashes they recorded, and
refuses a mismatch in one line naming the field; a damaged run record or a summary that lost its endpoint is named."""

import json
import shutil
from pathlib import Path

import pytest

from helpers import one_line_error
from nlq.studies.definition.design import plan_hash, read_study

RESULTS = Path(__file__).resolve().parents[1] / "results"


def copy_study(tmp_path, name) -> Path:
    """A copy of a committed study with the studies beside it linked (the arms a plan may borrow)."""
    copy = shutil.copytree(RESULTS / name, tmp_path / name)
    for other in RESULTS.iterdir():
        if other.is_dir() and other.name != name:
            (tmp_path / other.name).symlink_to(other)
    return copy


def edit(study_dir: Path, change) -> None:
    path = study_dir / "study.json"
    described = json.loads(path.read_text())
    change(described, described.get("design", described.get("settings")))
    path.write_text(json.dumps(described))


def test_the_verdict_with_its_margin_edited_is_refused_in_one_line_and_its_report_kept(tmp_path, capsys):
    study = copy_study(tmp_path, "verdict")
    edit(study, lambda d, design: design.update(margin=0.5))
    err = one_line_error(capsys, ["report", str(study)], "design.margin differs from verdict.toml")
    assert "0.5 here and 0.037 there" in err
    assert (study / "report.md").read_bytes() == (RESULTS / "verdict" / "report.md").read_bytes()


@pytest.mark.parametrize("field,value", [("seeds", [211, 212, 213]), ("primary", ["gate-qknorm", "linear-qknorm"]),
                                         ("secondary_family", []), ("alpha", 0.1)])
def test_any_field_of_a_frozen_design_edited_is_refused_naming_it(tmp_path, capsys, field, value):
    study = copy_study(tmp_path, "gate-lr")
    edit(study, lambda d, design: design.update({field: value}))
    one_line_error(capsys, ["report", str(study)], f"design.{field}")


def test_a_plan_edited_with_its_design_no_longer_hashes_to_its_plan_hash(tmp_path, capsys):
    study = copy_study(tmp_path, "gate-lr")

    def both(d, design):
        design["margin"] = d["plan"]["design"]["margin"] = 0.5

    edit(study, both)
    one_line_error(capsys, ["report", str(study)], "does not hash to its plan_hash 72e3123434853d50 (design.margin "
                                                   "differs from gate-lr.toml")


def test_a_plan_rehashed_with_its_design_is_refused_by_the_hashes_its_runs_recorded(tmp_path, capsys):
    study = copy_study(tmp_path, "gate-lr")

    def all_three(d, design):
        design["margin"] = d["plan"]["design"]["margin"] = 0.5
        d["plan_hash"] = plan_hash(d["plan"])

    edit(study, all_three)
    one_line_error(capsys, ["report", str(study)], "but its runs trained under plan hash 72e3123434853d50")


def test_runs_that_trained_under_different_plans_are_refused(tmp_path, capsys):
    study = copy_study(tmp_path, "gate-lr")
    path = sorted((study / "runs").glob("*/summary.json"))[-1]
    summary = json.loads(path.read_text())
    summary["record"]["plan_hash"] = "0123456789abcdef"
    path.write_text(json.dumps(summary))
    one_line_error(capsys, ["report", str(study)], "its runs trained under different plans")


def test_every_committed_plan_study_passes_the_check():
    for study_json in sorted(RESULTS.glob("*/study.json")):
        read_study(study_json.parent)  # raises for a record that does not hold


def test_a_run_record_without_its_tokens_per_parameter_is_one_line(tmp_path, capsys):
    study = copy_study(tmp_path, "gate-lr")
    edit(study, lambda d, design: next(r for r in d["runs"] if "tpp" in r).pop("tpp"))
    one_line_error(capsys, ["report", str(study)], "run d64-tpp300-gate-qknorm-lr0.001-s201 has no tpp")


@pytest.mark.parametrize("lose", [lambda s: s.pop("full_val_loss"), lambda s: s.update(full_val_loss=None)])
def test_a_test_run_whose_summary_lost_its_endpoint_is_named_as_not_finished(tmp_path, lose):
    from nlq.studies.registry import build_report

    study = copy_study(tmp_path, "gate-lr")
    name = "d64-tpp300-gate-qknorm-lr0.004-s215"
    path = study / "runs" / name / "summary.json"
    summary = json.loads(path.read_text())
    lose(summary)
    path.write_text(json.dumps(summary))
    report = build_report(study)
    assert "15 of 16 test pairs have ended" in report
    assert f"Counted as not finished: 1 run whose summary.json holds no full_val_loss (missing or null): {name}" \
        in report


def test_collect_refuses_an_edited_study_before_copying_anything(tmp_path, capsys):
    study = copy_study(tmp_path, "gate-lr")
    edit(study, lambda d, design: design.update(margin=0.5))
    one_line_error(capsys, ["report", str(study), "--collect", str(tmp_path / "copy")], "design.margin differs")
    assert not (tmp_path / "copy").exists()


def test_a_finished_run_that_vanished_is_named_in_the_report(tmp_path):
    import shutil as sh

    from nlq.studies.registry import build_report

    study = copy_study(tmp_path, "gate-lr")
    gone = "d64-tpp300-gate-qknorm-lr0.004-s216"
    sh.rmtree(study / "runs" / gone)
    report = build_report(study)
    assert "15 of 16 test pairs have ended" in report
    assert "Vanished: the last report counted more finished pairs than there are now (gate-qknorm 16 then, 15 now)" \
        in report and gone in report


def test_a_study_borrowing_from_an_edited_study_is_refused(tmp_path, capsys):
    """gate-lr reads verdict-lr's arms: a verdict-lr beside it whose design was edited is refused like any reader's."""
    study = copy_study(tmp_path, "gate-lr")
    (tmp_path / "verdict-lr").unlink()
    source = shutil.copytree(RESULTS / "verdict-lr", tmp_path / "verdict-lr")
    edit(source, lambda d, design: design.update(margin=0.5))
    one_line_error(capsys, ["report", str(study)], "verdict-lr/study.json: design.margin differs")


def budget_records(described: dict) -> list[dict]:
    return [r for r in described["runs"] if r.get("stage") == "budget"]


def test_a_record_with_two_seeds_swapped_is_refused_and_its_report_kept(tmp_path, capsys):
    """Swapping two run records' seeds would pair the wrong runs and can flip a decision: each record is checked
    against the config its run trained with."""
    study = copy_study(tmp_path, "qknorm-4e-3")

    def swap(d, design):
        own = [r for r in budget_records(d) if (study / "runs" / r["name"]).is_dir()]
        other = next(r for r in own if r["seed"] != own[0]["seed"] and r["arm"] == own[0]["arm"])
        own[0]["seed"], other["seed"] = other["seed"], own[0]["seed"]

    edit(study, swap)
    err = one_line_error(capsys, ["report", str(study)], "is recorded with seed")
    assert "config.json trained with" in err
    assert (study / "report.md").read_bytes() == (RESULTS / "qknorm-4e-3" / "report.md").read_bytes()


@pytest.mark.parametrize("field,value,needle", [("name", 7, "has name 7, not a str"),
                                                ("seed", "211", "has seed '211', not a int"),
                                                ("lr", [0.004], "has lr [0.004], not a int or float")])
def test_a_run_record_of_the_wrong_type_is_one_line(tmp_path, capsys, field, value, needle):
    study = copy_study(tmp_path, "qknorm-4e-3")
    edit(study, lambda d, design: budget_records(d)[0].update({field: value}))
    one_line_error(capsys, ["report", str(study)], needle)


@pytest.mark.parametrize("value,shown", [(float("nan"), "nan"), (-1.0, "-1.0"), ("low", "'low'")])
def test_an_endpoint_no_run_can_end_with_is_named(tmp_path, capsys, value, shown):
    study = copy_study(tmp_path, "qknorm-4e-3")
    run = next(p for p in sorted((study / "runs").iterdir()) if "tpp300" in p.name)
    summary = json.loads((run / "summary.json").read_text())
    summary["full_val_loss"] = value
    (run / "summary.json").write_text(json.dumps(summary))
    one_line_error(capsys, ["report", str(study)], f"run {run.name}'s summary.json holds full_val_loss {shown}")


def test_a_run_summary_whose_plan_hash_is_not_text_is_one_line(tmp_path, capsys):
    study = copy_study(tmp_path, "qknorm-4e-3")
    run = next(p for p in sorted((study / "runs").iterdir()) if "tpp300" in p.name)
    summary = json.loads((run / "summary.json").read_text())
    summary["record"]["plan_hash"] = ["a", "b"]
    (run / "summary.json").write_text(json.dumps(summary))
    one_line_error(capsys, ["report", str(study)], f"run {run.name} records plan hash ['a', 'b']")

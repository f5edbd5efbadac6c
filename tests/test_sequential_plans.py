"""Sequential plans end to end: the looks as plan fields (one-line errors), the dry run's bounds and what they buy,
and a tiny study that stops at its first look when the arms differ by construction and runs to its last look when
they do not; its report reads the decision off the repeated interval, the naive one beside it."""

import json

import pytest
from test_plans import plan_text, to_toml

from nlq.errors import UserError
from nlq.studies.plan import load_plan, read_plan


def sequential_plan(tmp_path, arms: list[dict], **design):
    import tomllib

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = plan_text(tmp_path, seeds=[1, 2, 3, 4, 5, 6], looks=[3, 6], spending="pocock",
                     budgets_tpp=[2], primary_tpp=2, **design)
    raw = tomllib.loads(path.read_text())
    raw["arms"] = arms
    path.write_text(to_toml(raw))
    return path


@pytest.mark.parametrize("change, needle", [
    ({"looks": [3, 5]}, "the last 6"), ({"looks": [2, 6]}, "the first at least 3"), ({"looks": [6]}, "at least two"),
    ({"looks": [3, 6], "spending": "linear"}, "design.spending"),
    ({"spending": "obf"}, "belongs to a sequential test"), ({"looks": [3, 6], "stop_for_equivalence": 1}, "bool"),
])
def test_a_bad_sequential_field_is_one_line_naming_it(tmp_path, change, needle):
    import tomllib

    raw = tomllib.loads(plan_text(tmp_path, seeds=[1, 2, 3, 4, 5, 6]).read_text())
    raw["design"] |= change
    with pytest.raises(UserError) as error:
        read_plan(raw)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_the_dry_run_prints_each_looks_bound_and_what_the_design_buys(tmp_path):
    from nlq.studies.engine import plan_study, power_text

    s = plan_study(load_plan(sequential_plan(tmp_path, [{"name": "linear"}, {"name": "mine"}]))).settings
    text = power_text(s)
    assert "sequential test (pocock spending, two-sided 0.05): after 3 pairs |z| >= " in text
    assert "overall alpha 0.0500" in text and "expected pairs" in text


@pytest.mark.slow
def test_a_sequential_plan_stops_at_a_look_when_the_arms_differ_and_runs_on_when_they_do_not(byte_data, tmp_path):
    from nlq.cli import main

    frozen_arm = {"name": "mine", "model": {"query": "linear"}, "train": {"warmup_steps": 100000}}  # lr ~ 0: no learning
    differ = sequential_plan(tmp_path / "a", [{"name": "linear", "model": {"query": "linear"}}, frozen_arm])
    out = tmp_path / "differ"
    main(["study", str(differ), "--out", str(out), "--data", str(byte_data)])
    record = json.loads((out / "sequential.json").read_text())["looks"]
    assert [r["action"] for r in record] == ["difference"] and record[0]["pairs"] == 3
    trained = {json.loads(p.read_text())["train"]["seed"] for p in (out / "runs").glob("*tpp2*/config.json")}
    assert trained == {1, 2, 3}  # no chain of the seeds after the stopping look
    outcome = json.loads((out / "verdict.json").read_text())
    assert outcome["decision"]["verdict"] == "worse" and outcome["decision"]["sequential"]["look"] == 1
    report = (out / "report.md").read_text()
    assert "stopped for a difference at look 1 (3 pairs" in report and "the naive 95% interval" in report

    same = sequential_plan(tmp_path / "b", [{"name": "linear", "model": {"query": "linear"}},
                                            {"name": "mine", "model": {"query": "nonlinear"}}])
    out = tmp_path / "same"
    main(["study", str(same), "--out", str(out), "--data", str(byte_data)])
    record = json.loads((out / "sequential.json").read_text())["looks"]
    assert [r["action"] for r in record] == ["continue", "end"]
    trained = {json.loads(p.read_text())["train"]["seed"] for p in (out / "runs").glob("*tpp2*/config.json")}
    assert trained == {1, 2, 3, 4, 5, 6}
    assert "ran to its last look at look 2 (6 pairs" in (out / "report.md").read_text()

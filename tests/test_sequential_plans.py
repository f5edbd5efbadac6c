"""Sequential plans end to end: the looks as plan fields (one-line errors), the dry run's bounds and what they buy,
and a tiny study that stops at its first look when the arms differ by construction and runs to its last look when
they do not; its report reads the decision off the repeated interval, the naive one beside it."""

import json

import pytest

from nlq.errors import UserError
from nlq.studies.definition.plan import load_plan, read_plan
from test_plans import plan_text, to_toml


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
    from nlq.studies.running.engine import plan_study
    from nlq.studies.running.plan_costs import power_text

    s = plan_study(load_plan(sequential_plan(tmp_path, [{"name": "linear"}, {"name": "mine"}]))).design
    text = power_text(s)
    assert "sequential test (pocock spending, two-sided 0.05): after 3 pairs |z| >= " in text
    assert "overall alpha 0.0500" in text and "expected pairs" in text


@pytest.mark.slow
def test_a_sequential_plan_stops_at_a_look_when_the_arms_differ_and_runs_on_when_they_do_not(byte_data, tmp_path):
    from nlq.cli import main

    # lr about 0 throughout (a warmup far longer than the run): this arm does not learn
    frozen_arm = {"name": "mine", "model": {"query": "linear"}, "train": {"warmup_steps": 100000}}
    differ = sequential_plan(tmp_path / "a", [{"name": "linear", "model": {"query": "linear"}}, frozen_arm])
    out = tmp_path / "differ"
    main(["study", str(differ), "--out", str(out), "--data", str(byte_data)])
    record = json.loads((out / "sequential.json").read_text())["looks"]
    assert [r["action"] for r in record] == ["difference"] and record[0]["pairs"] == 3
    assert json.loads((out / "study.json").read_text())["sequential"] == record  # the stop: look, statistic, time
    assert record[0]["bound"] > 0 and record[0]["utc"].endswith("Z")
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


def test_the_paper_plan_dry_runs_on_a_cpu_with_its_power_and_gpu_hours(tmp_path, capsys):
    from nlq.cli import main

    main(["study", "paper-gpt3-small", "--out", str(tmp_path / "study"), "--dry-run"])
    out = capsys.readouterr().out
    assert "arm linear: 84,953,856 non-embedding parameters at gpt3-small" in out
    assert "at most 112 chains" in out and "cost on paper:" in out and "GPU-hours a chain on a H100" in out
    assert "the sequential test's expected test GPU-hours" in out and "after 6 pairs |z| >= 3.4786" in out


def test_the_paper_plans_runs_train_at_a_tiny_shape_on_local_data(byte_data, tmp_path):
    """The plan's own arms, recipe and chain (a stable run and its cooldown branch), two steps each at a tiny shape
    on the byte corpus, on the CPU: what the GPU study would run, shrunk."""
    import tomllib

    from nlq.studies.definition.plan import SHIPPED
    from nlq.studies.running.engine import plan_study
    from nlq.training.trainer import train

    raw = tomllib.loads((SHIPPED / "paper-gpt3-small.toml").read_text())
    raw["base"]["model"] = {"vocab_size": 257, "block_size": 32}
    raw["base"]["train"] |= {"device": "cpu", "dtype": "float32", "batch_size": 2, "batch_tokens": 64,
                             "warmup_steps": 1}
    raw["base"]["data"] = {"eval_windows": 2}
    raw["design"] |= {"shape": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "budgets_tpp": [0.05],
                      "primary_tpp": 0.05}
    study = plan_study(read_plan(raw))
    first = next(study.run_stages(tmp_path / "study"))
    arms = {run.arm.name for run in first}
    assert arms == {"linear", "nonlinear", "linear-qknorm", "nonlinear-qknorm"}
    for run in first[:2]:  # the first chain: its stable run, then its branch from the stable run's checkpoint
        config = run.config([], byte_data)
        assert config.train.max_steps <= 4
        summary = train(config, tmp_path / "study" / "runs" / run.name, quiet=True)
        assert summary["val_loss"] > 0


def test_looks_with_too_few_test_seeds_say_what_is_valid(tmp_path):
    """looks = [3] with 3 test seeds once suggested [3, 3], itself refused: the message names something valid."""
    import tomllib

    raw = tomllib.loads(plan_text(tmp_path, seeds=[1, 2, 3], looks=[3]).read_text())
    with pytest.raises(UserError) as error:
        read_plan(raw)
    assert "[3, 3]" not in str(error.value) and "leave looks (and spending) out" in str(error.value)
    raw["design"]["looks"] = [3, 4]
    raw["design"]["seeds"] = [1, 2, 3, 4]
    read_plan(raw)  # the smallest sequential design the message allows


def test_the_report_shows_every_look_of_a_sequential_test(byte_data, tmp_path):
    from nlq.cli import main

    arms = [{"name": "linear", "model": {"query": "linear"}}, {"name": "mine", "model": {"query": "nonlinear"}}]
    plan = sequential_plan(tmp_path, arms)
    main(["study", str(plan), "--out", str(tmp_path / "s"), "--data", str(byte_data)])
    report = (tmp_path / "s" / "report.md").read_text()
    recorded = json.loads((tmp_path / "s" / "sequential.json").read_text())["looks"]
    for entry in recorded:
        assert f"  - look {entry['look']} ({entry['pairs']} pairs): mean Δ {entry['mean']:+.4f}" in report

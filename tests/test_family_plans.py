"""Every study is a plan: the exploratory families (cpu, cpu-lr, encoder, kvo, paper, scaling, scaling-shared-lr,
probes) are plan files run by the one engine, and the ones with committed results ask for exactly the runs, with
exactly the configs, that their committed studies trained when they were Python definitions."""

import json
from pathlib import Path

import pytest

from helpers import one_line_error
from nlq.studies.definition.design import read_study, upgraded_study
from nlq.studies.definition.plan import read_plan, shipped_plans
from nlq.studies.definition.plan_explore import EXPLORE_FIELDS, Exploration
from nlq.studies.registry import STUDIES, get_study

RESULTS = Path(__file__).resolve().parents[1] / "results"
FAMILIES = ["cpu", "cpu-lr", "encoder", "kvo", "paper", "scaling", "scaling-shared-lr", "probes"]


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "projections":
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_every_study_nlq_names_is_a_plan_file_and_the_families_are_exploratory_plans():
    assert set(STUDIES) == set(shipped_plans())
    for name in FAMILIES:
        study = get_study(name)
        assert isinstance(study.design, Exploration) and study.plan is not None, name
        assert study.report == study.design.kind in EXPLORE_FIELDS


@pytest.mark.parametrize("name", ["cpu", "scaling", "scaling-shared-lr", "probes"])
def test_a_family_plan_asks_for_the_runs_its_committed_study_trained_with_the_same_configs(name):
    """Stage by stage (scaling's second stage at the lrs its committed sweep selected): the run records study.json
    holds, in order, and every config field a committed run's config.json recorded (its data directory aside)."""
    committed = upgraded_study(json.loads((RESULTS / name / "study.json").read_text()))
    study = get_study(name)
    runs = [run for stage in study.run_stages(RESULTS / name) for run in stage]
    ours = [run.record(run.config([], Path("/data")).train.lr) for run in runs]
    recorded = [r | ({"chain": ours[i]["chain"]} if "chain" in ours[i] and i < len(ours) else {})  # recorded since
                for i, r in enumerate(committed["runs"])]
    assert ours == recorded
    assert [(a.name, a.changes) for a in study.arms] == [(a["name"], a["changes"]) for a in committed["arms"]]
    assert study.design.seeds == committed["seeds"] and study.baseline == committed["baseline"]
    checked = 0
    for run in {run.name: run for run in runs}.values():  # a stable run's config.json: its last segment's
        path = RESULTS / name / "runs" / run.name / "config.json"
        if not path.is_file():  # committed thinned: some runs keep only their summary
            continue
        then = flat(json.loads(path.read_text()))
        now = flat(run.config([], then["data.dir"] or None).to_dict())
        for key in ("train.resume_from", "data.dir"):  # paths: a record keeps no absolute part (runs/paths.py)
            then[key], now[key] = Path(then[key] or "").name, Path(now[key] or "").name
        differ = {k: (v, now.get(k)) for k, v in then.items() if now.get(k, v) != v}
        assert not differ, (run.name, differ)
        checked += 1
    assert checked >= len({run.name for run in runs}) // 2, checked


def test_an_exploratory_plans_mistakes_are_one_line_errors_naming_the_field(tmp_path, capsys):
    import tomllib

    raw = tomllib.loads(shipped_plans()["scaling"].read_text())

    def refused(change, needle):
        plan = json.loads(json.dumps(raw))
        change(plan["design"])
        with pytest.raises(ValueError, match=needle):
            read_plan(plan, "p.toml")

    refused(lambda d: d.update(kind="sweep"), r"design.kind is 'sweep'; choose comparison, scaling, probes")
    refused(lambda d: d.update(margin=0.1), "design.margin is not a field of a scaling plan")
    refused(lambda d: d.pop("widths"), "design.widths is missing")
    refused(lambda d: d.update(lr=1e-3), "needs sweep_seed .* or lr .*, one of them")
    refused(lambda d: d["widths"]["d64"].pop("lrs"), r"design.widths.d64 is .*; give \{ shape, budgets, lrs, sweep_tpp")
    refused(lambda d: d["widths"]["d64"].update(budgets=[5, 2]), "design.widths.d64.budgets is")
    refused(lambda d: d.update(baseline="base"), "design.baseline is 'base', which is not an arm")
    refused(lambda d: d.update(seeds=[1, 1]), "design.seeds is")
    refused(lambda d: d.update(widths={}), "design.widths is empty")
    refused(lambda d: d.update(sweep_seed=7), r"design.sweep_seed is 7, none of design.seeds \(1, 2, 3\)")
    probes = tomllib.loads(shipped_plans()["probes"].read_text())
    empty = json.loads(json.dumps(probes))
    empty["design"]["tasks"] = {}
    with pytest.raises(ValueError, match="design.tasks is empty"):
        read_plan(empty, "p.toml")
    probes["design"]["tasks"]["mqar-2"]["task"] = "sort"
    with pytest.raises(ValueError, match="design.tasks.mqar-2.task is 'sort'; choose mqar, lookup, selective-copy"):
        read_plan(probes, "p.toml")
    cpu = tomllib.loads(shipped_plans()["cpu"].read_text())
    cpu["design"]["width_family"] = ["linear", "wider"]
    with pytest.raises(ValueError, match="design.width_family names 'wider', which is not an arm"):
        read_plan(cpu, "p.toml")
    text = shipped_plans()["cpu"].read_text()
    (tmp_path / "bad.toml").write_text(text.replace('kind = "comparison"', 'kind = "comparison"\nlrs = [2e-3, 1e-3]'))
    one_line_error(capsys, ["study", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "s"), "--dry-run"],
                   "design.lrs is [0.002, 0.001]; give strictly increasing positive peak lrs")


def test_an_exploratory_plan_study_is_frozen_and_its_record_checked(tmp_path, monkeypatch, byte_data):
    """As every plan: study.json holds the plan and its hash, a changed plan is refused against the directory, and a
    design edited in study.json after the runs is a one-line error naming the field."""
    import tomllib

    from helpers import fake_training
    from nlq.studies.running.engine import plan_study
    from nlq.studies.running.study import run_study

    fake_training(monkeypatch)
    raw = tomllib.loads(shipped_plans()["cpu"].read_text())
    raw["arms"] = raw["arms"][:2]
    raw["design"] |= {"seeds": [1, 2], "width_family": []}
    study = plan_study(read_plan(raw))
    run_study(study, tmp_path, ["--model.vocab_size=257", "--train.max_steps=2"], data_dir=str(byte_data),
              log=lambda *_: None)
    described = json.loads((tmp_path / "study.json").read_text())
    assert described["report"] == "comparison" and described["design"]["kind"] == "comparison"
    assert read_study(tmp_path)["design"] == study.design
    raw["design"]["seeds"] = [1, 2, 3]
    with pytest.raises(ValueError, match="ran another version of plan cpu: design.seeds"):
        run_study(plan_study(read_plan(raw)), tmp_path, ["--model.vocab_size=257", "--train.max_steps=2"],
                  data_dir=str(byte_data), log=lambda *_: None)
    described["design"]["seeds"] = [1, 3]
    (tmp_path / "study.json").write_text(json.dumps(described))
    with pytest.raises(ValueError, match=r"design.seeds\[1\] differs from the plan its runs trained under .*"
                                         r"\(seeds is \[1, 3\] here and \[1, 2\] there\)"):
        read_study(tmp_path)


@pytest.mark.parametrize("name", ["cpu", "scaling", "probes"])
def test_a_family_directory_from_before_plans_goes_on_under_the_plan_and_another_is_refused(name, tmp_path, capsys):
    """A study.json written by the family's Python definition (no plan hash; results/NAME's) describes the same study
    as the plan, so `nlq study NAME` goes on in that directory; one whose seeds differ is refused in one line."""
    from nlq.cli import main

    described = json.loads((RESULTS / name / "study.json").read_text())
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "study.json").write_text(json.dumps(described))
    main(["study", name, "--out", str(tmp_path / "same"), "--dry-run"])
    assert "whole plan, every stage" in capsys.readouterr().out
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "study.json").write_text(json.dumps(described | {"seeds": [1, 2]}))
    one_line_error(capsys, ["study", name, "--out", str(tmp_path / "other"), "--dry-run"], "records no plan hash")

"""Plans and study directories under hostile input: every field checked at read time in one line, run names that
cannot leave the study directory, a refusal that leaves nothing behind, one study per directory, and two starts of
different designs into one new directory that cannot both win."""

import json
import re
import threading
import tomllib

import pytest

from helpers import fake_training
from nlq.errors import UserError
from nlq.studies.definition.plan import SHIPPED, load_plan, read_plan
from nlq.studies.registry import get_study
from nlq.studies.running.study import run_study
from test_plans import plan_text


def quiet(*_):
    pass


def grid(raw: dict) -> dict:
    raw = json.loads(json.dumps(raw))
    del raw["design"]["lr"], raw["design"]["min_lr"]
    raw["design"] |= {"lrs": [1e-3, 2e-3], "min_lr_ratio": 0.1, "edge_factor": 2.0, "max_extensions": 1,
                      "selection_seeds": [8, 9]}
    return raw


@pytest.mark.parametrize("change,needle", [
    (lambda d: d.update(width="../../.."), "design.width is '../../..'; it names the runs"),
    (lambda d: d.update(width="a/b"), "design.width is 'a/b'"),
    (lambda d: d.update(shape={"n_layer": 2, "n_head": 3, "n_embd": 64}), "not divisible by n_head = 3"),
    (lambda d: d.update(shape={"n_layer": 2, "n_head": 4, "n_embd": 10**12}), "design.shape is"),
    (lambda d: d.update(budgets_tpp=[float("inf")], primary_tpp=float("inf")), "positive, finite"),
    (lambda d: d.update(planning_power=1.5), "design.planning_power is 1.5; a power lies in (0, 1)"),
    (lambda d: d.update(planning_difference=-0.02), "design.planning_difference is -0.02"),
    (lambda d: d.update(paper_lr_ratio=0.0), "design.paper_lr_ratio is 0.0"),
    (lambda d: d.update(margin=float("nan")), "design.margin is nan"),
    (lambda d: d.update(secondary_family=[["linear", "linear"]]), "pairs of two different arms"),
    (lambda d: d.update(secondary_family=[["linear", 3]]), "design.secondary_family holds ['linear', 3]"),
    (lambda d: d.update(secondary_family=[["residual", "linear"], ["residual", "linear"]]), "names a comparison twice"),
])
def test_every_design_field_is_checked_when_the_plan_is_read(change, needle):
    raw = tomllib.loads((SHIPPED / "example.toml").read_text())
    change(raw["design"])
    with pytest.raises(UserError) as error:
        read_plan(raw, "my.toml")
    assert needle in str(error.value) and "\n" not in str(error.value), str(error.value)


@pytest.mark.parametrize("change,needle", [
    (lambda d: d.update(lrs=[1e-3, 1e-3, 2e-3]), "strictly increasing positive peak lrs, each once"),
    (lambda d: d.update(lrs=[1e-3, float("inf")]), "design.lrs"),
    (lambda d: d.update(max_extensions=1000), "max_extensions in 0..10"),
])
def test_every_grid_field_is_checked_when_the_plan_is_read(change, needle):
    raw = grid(tomllib.loads((SHIPPED / "example.toml").read_text()))
    change(raw["design"])
    with pytest.raises(UserError, match="design") as error:
        read_plan(raw, "my.toml")
    assert needle in str(error.value), str(error.value)


def test_a_deeply_nested_plan_is_one_line_not_a_recursion_error(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UserError, match="cannot parse plan"):
        load_plan(path)


def test_a_refused_start_leaves_no_study_json_behind(byte_data, tmp_path, monkeypatch):
    """More shards than the first stage has chains used to be refused after study.json was written, freezing the
    directory to a plan that never ran."""
    fake_training(monkeypatch)
    plan = plan_text(tmp_path)
    with pytest.raises(UserError, match="at most 4 shards can share it"):
        run_study(get_study(str(plan)), tmp_path / "s", data_dir=str(byte_data), log=quiet, shard=(1, 9))
    assert not (tmp_path / "s" / "study.json").exists()


def test_one_study_per_directory_and_runs_without_their_study_json_are_refused(byte_data, tmp_path, monkeypatch):
    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    plan = plan_text(tmp_path)
    run_study(get_study(str(plan)), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    with pytest.raises(UserError, match="holds study 'example', not 'cpu'; give each study a directory of its own"):
        run_study(get_study("cpu"), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    described = json.loads((tmp_path / "s" / "study.json").read_text())
    del described["plan_hash"]
    (tmp_path / "s" / "study.json").write_text(json.dumps(described))
    with pytest.raises(UserError, match="records no plan hash"):
        run_study(get_study(str(plan)), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    (tmp_path / "s" / "study.json").unlink()
    with pytest.raises(UserError, match="holds runs but no study.json"):
        run_study(get_study(str(plan)), tmp_path / "s", data_dir=str(byte_data), log=quiet)


def test_two_starts_of_different_plans_into_one_new_directory_cannot_both_run(byte_data, tmp_path, monkeypatch):
    """Both used to run, leaving runs of two plan hashes under one study.json."""
    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    first = plan_text(tmp_path)
    (tmp_path / "other").mkdir()
    second = plan_text(tmp_path / "other", margin=0.02)
    outcomes = {}

    def start(name, plan):
        try:
            run_study(get_study(str(plan)), tmp_path / "s", data_dir=str(byte_data), log=quiet)
            outcomes[name] = "ran"
        except UserError as e:
            outcomes[name] = str(e)

    threads = [threading.Thread(target=start, args=(n, p)) for n, p in (("a", first), ("b", second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(v == "ran" for v in outcomes.values()) == [False, True], outcomes
    refused = next(v for v in outcomes.values() if v != "ran")
    assert "ran another version of plan example: design.margin changed" in refused
    summaries = (tmp_path / "s" / "runs").glob("*/summary.json")
    assert len({json.loads(p.read_text())["record"]["plan_hash"] for p in summaries}) == 1


def test_a_loss_this_machine_cannot_run_is_refused_before_the_directory_is_claimed(byte_data, tmp_path, monkeypatch):
    fake_training(monkeypatch)
    raw = tomllib.loads(plan_text(tmp_path).read_text())
    raw["base"]["train"]["loss_impl"] = "liger"
    from test_plans import to_toml

    (tmp_path / "liger.toml").write_text(to_toml(raw))
    with pytest.raises(UserError, match="train.loss_impl=liger is Liger-Kernel's CUDA kernel"):
        run_study(get_study(str(tmp_path / "liger.toml")), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    assert not (tmp_path / "s").exists()


def test_collect_never_writes_into_a_run_another_study_or_the_study_itself(byte_data, tmp_path, monkeypatch, capsys):
    from helpers import one_line_error

    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    run_study(get_study(str(plan_text(tmp_path))), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    run = next((tmp_path / "s" / "runs").iterdir())
    before = sorted(p.name for p in run.iterdir())
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "study.json").write_text(json.dumps({"name": "cpu"}))
    for target, needle in ((run, "is a run directory"), (tmp_path / "other", "holds study 'cpu', not 'example'"),
                           (tmp_path / "s", "is the study directory itself")):
        one_line_error(capsys, ["report", tmp_path / "s", "--collect", target], needle)
    assert sorted(p.name for p in run.iterdir()) == before and not (tmp_path / "other" / "runs").exists()


@pytest.mark.parametrize("damage,needle", [
    (lambda s: s.update(full_val_loss=None), "1 of 2 pre-registered pairs have finished"),
    (lambda s: s.pop("full_val_loss"), "1 of 2 pre-registered pairs have finished"),
])
def test_a_report_of_damaged_summaries_counts_them_as_not_ended(byte_data, tmp_path, monkeypatch, damage, needle):
    from nlq.studies.registry import build_report

    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0,
                                                        "non_embedding_parameters": 1, "tokens": 2})
    run_study(get_study(str(plan_text(tmp_path))), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    path = next(p for p in (tmp_path / "s" / "runs").glob("*tpp2*-s2/summary.json"))
    summary = json.loads(path.read_text())
    damage(summary)
    path.write_text(json.dumps(summary))
    (path.parent / "metrics.jsonl").write_bytes(b"\x00\xff\xfe garbage \x89PNG\n{\"step\": 1}\n[1, 2]\n")
    assert needle in build_report(tmp_path / "s")


def test_study_json_holds_the_design_and_arms_by_their_names_and_older_keys_still_read(byte_data, tmp_path,
                                                                                      monkeypatch):
    """study.json writes "design", "arms" and each run's "arm" (one name per concept); the design read back from it
    is the plan's, and a study.json of the older keys ("settings", "variants", a run's "variant") reads the same
    and reports byte for byte the same."""
    from nlq.studies.definition.design import read_study
    from nlq.studies.definition.plan_design import Design, check_design
    from nlq.studies.registry import build_report
    from nlq.studies.reports.plan_report import build_plan_report

    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0 + config.train.seed / 100,
                                                        "full_val_loss": 3.0 + config.train.seed / 100})
    study = get_study(str(plan_text(tmp_path)))
    run_study(study, tmp_path / "s", data_dir=str(byte_data), log=quiet)
    written = json.loads((tmp_path / "s" / "study.json").read_text())
    assert {"design", "arms"} <= set(written) and not {"settings", "variants"} & set(written)
    assert all("arm" in r and "variant" not in r for r in written["runs"])
    assert check_design(written["design"], "study.json") == study.design and isinstance(study.design, Design)
    assert written["design"] == study.design.to_dict() and read_study(tmp_path / "s")["design"] == study.design
    assert [a["name"] for a in written["arms"]] == [a.name for a in study.arms]
    report = build_report(tmp_path / "s")

    older = {{"design": "settings", "arms": "variants"}.get(k, k): v for k, v in written.items()}
    older["runs"] = [{("variant" if k == "arm" else k): v for k, v in r.items()} for r in written["runs"]]
    (tmp_path / "s" / "study.json").write_text(json.dumps(older))
    assert read_study(tmp_path / "s") == written | {"design": study.design}
    assert build_report(tmp_path / "s") == report
    assert build_plan_report(tmp_path / "s", older) == report  # the raw file, as another reader passes it


def test_a_report_whose_design_names_an_arm_it_does_not_have_is_refused(byte_data, tmp_path, monkeypatch):
    from nlq.studies.registry import build_report

    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    run_study(get_study(str(plan_text(tmp_path))), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    described = json.loads((tmp_path / "s" / "study.json").read_text())
    described["design"]["primary"] = ["linear", "ghost"]
    (tmp_path / "s" / "study.json").write_text(json.dumps(described))
    with pytest.raises(UserError, match="names arm 'ghost', which is none of its arms"):
        build_report(tmp_path / "s")


def test_budgets_that_end_at_the_same_step_are_one_line(tmp_path):
    plan = plan_text(tmp_path, budgets_tpp=[1, 1.0001], primary_tpp=1)
    with pytest.raises(UserError, match="each budget must end at a later step than the one before"):
        next(get_study(str(plan)).run_stages(tmp_path / "s"))


@pytest.mark.parametrize("flag,value", [("--num-samples", "10000000000"), ("--max-new-tokens", "1000000000000")])
def test_a_sampling_request_too_large_for_memory_is_refused_with_an_estimate(run_dir, capsys, flag, value):
    """It used to end in an allocator traceback (or the kernel's OOM killer)."""
    from helpers import one_line_error

    one_line_error(capsys, ["sample", run_dir, "--prompt", "a", flag, value], "such samples fit: lower --num-samples")


def test_shard_auto_with_more_array_tasks_than_chains_leaves_nothing_behind(byte_data, tmp_path, monkeypatch, capsys):
    from helpers import one_line_error

    fake_training(monkeypatch)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "99")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    one_line_error(capsys, ["study", plan_text(tmp_path), "--out", tmp_path / "s", "--data", byte_data, "--shard",
                            "auto"], "--shard 1/99: the first stage of example has 4 groups of runs")
    assert not (tmp_path / "s").exists()


def test_a_run_directory_is_not_a_study_directory(run_dir, byte_data, tmp_path, monkeypatch):
    import shutil

    fake_training(monkeypatch)
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(UserError, match="is a run directory"):
        run_study(get_study(str(plan_text(tmp_path))), target, data_dir=str(byte_data), log=quiet)
    assert sorted(p.name for p in target.iterdir()) == before


def test_a_summary_that_is_no_json_is_one_line_naming_the_run(byte_data, tmp_path, monkeypatch):
    from nlq.studies.registry import build_report

    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    run_study(get_study(str(plan_text(tmp_path))), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    path = next((tmp_path / "s" / "runs").glob("*tpp2*-s2/summary.json"))
    path.write_bytes(b"\x00\x01 not json")
    with pytest.raises(UserError) as error:
        build_report(tmp_path / "s")
    assert path.parent.name in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_start_that_fails_before_any_run_releases_its_claim(tmp_path, monkeypatch):
    """A corpus that cannot be prepared (here: a source that does not exist) fails the start after its checks; the
    directory must not stay frozen to a study that never ran."""
    fake_training(monkeypatch)
    raw = tomllib.loads(plan_text(tmp_path).read_text())
    raw["data"]["source"] = str(tmp_path / "no-such-corpus.txt")
    from test_plans import to_toml

    (tmp_path / "missing.toml").write_text(to_toml(raw))
    with pytest.raises(UserError):
        run_study(get_study(str(tmp_path / "missing.toml")), tmp_path / "s", log=quiet)
    assert not (tmp_path / "s" / "study.json").exists()


def test_an_arm_whose_loss_this_machine_cannot_run_is_refused_before_study_json(byte_data, tmp_path, capsys):
    """A secondary arm with train.loss_impl=liger trains only in a later stage; on a CPU it is refused at the start,
    in one line, and no study.json is left (it was refused only when that arm's first run began, after the primary
    arms had trained)."""
    import tomllib

    from helpers import one_line_error
    from test_plans import to_toml

    plan = plan_text(tmp_path)
    raw = tomllib.loads(plan.read_text())
    raw["arms"].append({"name": "fused", "model": {"query": "linear"}, "train": {"loss_impl": "liger"}})
    raw["design"]["secondary"] = ["fused"]
    plan.write_text(to_toml(raw))
    one_line_error(capsys, ["study", str(plan), "--out", str(tmp_path / "s"), "--data", str(byte_data)], "liger")
    assert not (tmp_path / "s" / "study.json").exists() and not (tmp_path / "s" / "runs").exists()


def test_a_tiny_plans_dry_run_gives_its_cost_in_units_that_fit(tmp_path, capsys):
    from nlq.cli import main
    from nlq.studies.definition.tables import duration_text, tokens_text

    main(["study", str(plan_text(tmp_path)), "--out", str(tmp_path / "s"), "--dry-run"])
    out = capsys.readouterr().out
    assert "0.00G" not in out and re.search(r"test 4 chains \(\d[\d.]*k tokens\)", out), out
    assert (tokens_text(4.7e9), tokens_text(1.23e7), tokens_text(950)) == ("4.70G", "12.3M", "950")
    assert (duration_text(2.34), duration_text(0.2), duration_text(0.001)) == ("2.3 h", "12 min", "4 s")


def test_a_split_per_seed_on_a_text_corpus_is_refused_before_study_json(byte_data, tmp_path, capsys):
    import tomllib

    from helpers import one_line_error
    from test_plans import to_toml

    plan = plan_text(tmp_path)
    raw = tomllib.loads(plan.read_text())
    raw["base"]["data"] |= {"split": "seed"}
    plan.write_text(to_toml(raw))
    for dry in ([], ["--dry-run"]):  # the dry run refuses it as the start does
        one_line_error(capsys, ["study", str(plan), "--out", str(tmp_path / "s"), "--data", str(byte_data), *dry],
                       "data.split=seed splits labelled examples")
    assert not (tmp_path / "s" / "study.json").exists()

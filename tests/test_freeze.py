"""A study's design cannot change under it: the overrides it ran with are part of it (only the fields that cannot
change what a run computes may differ later), a run directory that holds another config is never trained into, and
the refusal comes before anything starts: in the run, in the dry run and in the parent of --shards."""

import json
import shutil

import pytest

from helpers import fake_training, one_line_error
from nlq.errors import UserError
from nlq.studies.registry import get_study
from nlq.studies.running.dry_run import dry_run_text as dry_run
from nlq.studies.running.study import run_study
from test_plans import plan_text


def quiet(*_):
    pass


@pytest.fixture
def ran(byte_data, tmp_path, monkeypatch):
    """A tiny plan study that has run (stub training): (its plan file, its directory, the stub's list of trainings)."""
    trained = fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    plan = plan_text(tmp_path)
    run_study(get_study(str(plan)), tmp_path / "s", data_dir=str(byte_data), log=quiet)
    return plan, tmp_path / "s", trained


def test_an_override_that_changes_what_runs_compute_is_refused_against_a_study_that_ran(ran, byte_data, capsys):
    """The audit's scenario: --train.batch_size=8 against a batch-16 study rewrote study.json, and a deleted branch
    was then retrained at batch 8 from a batch-16 stable checkpoint and mixed into the test."""
    plan, study_dir, trained = ran
    before = (study_dir / "study.json").read_text()
    count = len(trained)
    with pytest.raises(UserError, match=r"ran with no overrides, and this command gives --train\.batch_size=8 "
                                        r"\(train\.batch_size differs\)") as error:
        run_study(get_study(str(plan)), study_dir, ["--train.batch_size=8"], data_dir=str(byte_data), log=quiet)
    assert "\n" not in str(error.value) and "new directory" in str(error.value)
    with pytest.raises(UserError, match=r"train\.batch_size differs"):
        dry_run(get_study(str(plan)), study_dir, ["--train.batch_size=8"], data_dir=str(byte_data))
    one_line_error(capsys, ["study", plan, "--out", study_dir, "--data", byte_data, "--shards", "2",
                            "--train.batch_size=8"], "train.batch_size differs")
    assert not list(study_dir.glob("shard-*.log"))  # refused in the parent: no shard was started
    assert (study_dir / "study.json").read_text() == before and len(trained) == count


def test_a_neutral_override_may_differ_and_a_deleted_branch_is_retrained_with_the_recorded_config(ran, byte_data):
    plan, study_dir, trained = ran
    branch = next(p for p in (study_dir / "runs").iterdir() if "tpp2" in p.name)
    saved = json.loads((branch / "config.json").read_text())
    shutil.rmtree(branch)
    count = len(trained)
    run_study(get_study(str(plan)), study_dir, ["--train.log_every=5", "--train.device=cpu"], data_dir=str(byte_data),
              log=quiet)
    assert [name for _, name, _ in trained[count:]] == [branch.name]
    again = json.loads((branch / "config.json").read_text())
    assert again["train"] | {"log_every": 10, "device": "auto"} == saved["train"] and again["model"] == saved["model"]


def test_a_run_directory_holding_another_config_is_not_trained_into(ran, byte_data):
    plan, study_dir, trained = ran
    run = next(p for p in (study_dir / "runs").iterdir() if "tpp2" in p.name)
    config = json.loads((run / "config.json").read_text())
    config["train"]["batch_size"] = 8
    (run / "config.json").write_text(json.dumps(config))
    (run / "summary.json").unlink()  # unfinished: the study would train into it
    count = len(trained)
    with pytest.raises(UserError, match=rf"run {run.name} was started with another config than the study gives it "
                                        r"now \(train\.batch_size: 8 there, 4 now\)"):
        run_study(get_study(str(plan)), study_dir, data_dir=str(byte_data), log=quiet)
    assert len(trained) == count


def test_plans_md_lists_exactly_the_overrides_a_frozen_study_allows():
    import re
    from pathlib import Path

    from nlq.studies.running.frozen import NEUTRAL

    text = (Path(__file__).resolve().parents[1] / "docs" / "PLANS.md").read_text()
    listed = re.search(r"\(any field but those that only say where and how a run is watched: (.*?); `studies", text,
                       re.S).group(1)
    assert set(re.findall(r"`([a-z_]+\.[a-z_]+)`", listed)) == set(NEUTRAL)

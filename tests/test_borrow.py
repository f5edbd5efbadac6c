"""A plan may borrow arms from another committed plan study (`borrow` in [[arms]]): those arms are never trained, their
selection and test endpoints are the other study's, the report says so, and a source that is not the same experiment
or not at the named commit is a one-line refusal."""

import json
import tomllib

import pytest

from helpers import fake_training
from nlq.errors import UserError
from nlq.studies.definition.plan import SHIPPED
from nlq.studies.registry import build_report, get_study
from nlq.studies.running.study import run_study
from test_plans import to_toml

COMMIT = "abcdef1234567890abcdef1234567890abcdef12"
QUERY_LOSS = {"linear": 3.00, "nonlinear": 2.99, "residual": 3.02}


def endpoint(config, run_dir) -> dict:
    """A deterministic endpoint per (query, lr, seed): lr 4e-3 is best for every arm; the code commit recorded."""
    loss = QUERY_LOSS[config.model.query] + abs(config.train.lr - 4e-3) + 0.001 * (config.train.seed % 3)
    return {"val_loss": loss, "full_val_loss": loss, "record": {"code": COMMIT}, "non_embedding_parameters": 1}


def grid_plan(tmp_path, name, arms, primary, secondary, base_changes=None) -> str:
    raw = tomllib.loads((SHIPPED / "example.toml").read_text())
    raw["name"] = name
    raw["base"] = {"preset": "nano", "model": {"vocab_size": 257, "block_size": 32},
                   "train": {"schedule": "wsd", "batch_size": 4, "warmup_steps": 2, "log_every": 10} | (base_changes
                                                                                                          or {}),
                   "data": {"eval_windows": 4}}
    raw["arms"] = arms
    design = raw["design"]
    del design["lr"], design["min_lr"]
    design |= {"shape": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "budgets_tpp": [2], "primary_tpp": 2,
               "seeds": [1, 2, 3], "primary": primary, "secondary": secondary, "lrs": [2e-3, 4e-3, 8e-3],
               "min_lr_ratio": 0.1, "edge_factor": 2.0, "max_extensions": 1, "selection_seeds": [8, 9]}
    path = tmp_path / f"{name}.toml"
    path.write_text(to_toml(raw))
    return str(path)


LINEAR = {"name": "linear", "model": {"query": "linear"}}
NONLINEAR = {"name": "nonlinear", "model": {"query": "nonlinear"}}
RESIDUAL = {"name": "residual", "model": {"query": "residual"}}


def lent(arm: dict, commit: str = COMMIT) -> dict:
    return arm | {"borrow": {"study": "source", "commit": commit}}


@pytest.fixture
def source(tmp_path, byte_data, monkeypatch):
    """A committed lr-grid study `source` (linear, nonlinear) under tmp_path/studies, trained by a stub."""
    fake_training(monkeypatch, endpoint)
    plan = grid_plan(tmp_path, "source", [LINEAR, NONLINEAR], ["linear", "nonlinear"], [])
    run_study(get_study(plan), tmp_path / "studies" / "source", data_dir=str(byte_data), log=lambda *_: None)
    return tmp_path / "studies" / "source"


def test_borrowed_arms_are_read_not_trained_and_the_report_says_where_they_come_from(source, tmp_path, byte_data,
                                                                                     monkeypatch):
    trained = fake_training(monkeypatch, endpoint)
    plan = grid_plan(tmp_path, "borrower", [lent(LINEAR), RESIDUAL, lent(NONLINEAR)], ["linear", "residual"],
                     ["nonlinear"])
    out = tmp_path / "studies" / "borrower"
    run_study(get_study(plan), out, data_dir=str(byte_data), log=lambda *_: None)
    assert trained and {config.model.query for _, _, config in trained} == {"residual"}
    assert len(trained) == 2 * (2 * 3 + 3)  # a stable run and a branch per chain: 3 lrs x 2 selection seeds, 3 tests
    build_report(out)
    outcome = json.loads((out / "verdict.json").read_text())
    assert outcome["selected_lrs"] == {"linear": 4e-3, "residual": 4e-3, "nonlinear": 4e-3}
    assert outcome["decision"]["interval"]["mean"] == pytest.approx(0.02)  # residual 3.02 - linear 3.00, each seed
    family = outcome["secondary_family"]
    assert family[0]["comparison"] == "nonlinear - linear" and family[0]["mean"] == pytest.approx(-0.01)
    report = (out / "report.md").read_text()
    assert f"linear, nonlinear from study `source` at commit `{COMMIT[:12]}`" in report


@pytest.mark.parametrize("arms,needle", [
    ([lent(LINEAR, commit="1234567"), RESIDUAL], "trained at code abcdef123456, not at commit 1234567"),
    ([lent(LINEAR | {"model": {"query": "linear", "qk_norm": True}}), RESIDUAL], "arms.linear.model.qk_norm differs"),
    ([lent(RESIDUAL | {"name": "linear"}) | {"name": "linear"}, LINEAR | {"name": "x"}], "arms.linear.model.query"),
])
def test_a_source_that_is_not_the_same_experiment_or_commit_is_refused_in_one_line(source, tmp_path, byte_data,
                                                                                   monkeypatch, arms, needle):
    trained = fake_training(monkeypatch, endpoint)
    plan = grid_plan(tmp_path, "borrower", arms, ["linear", arms[1]["name"]], [])
    with pytest.raises(UserError) as error:
        run_study(get_study(plan), tmp_path / "studies" / "borrower", data_dir=str(byte_data), log=lambda *_: None)
    assert needle in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert not trained  # refused before anything trains, a wrong commit too
    assert not (tmp_path / "studies" / "borrower" / "study.json").exists()


def test_a_one_lr_plan_or_one_that_borrows_every_arm_is_refused_at_once(tmp_path):
    raw = tomllib.loads((SHIPPED / "example.toml").read_text())
    raw["arms"] = [lent(arm) if arm["name"] == raw["design"]["primary"][0] else arm for arm in raw["arms"]]
    (tmp_path / "one-lr.toml").write_text(to_toml(raw))
    with pytest.raises(UserError, match="arms.borrow is for a plan with an lr grid"):
        get_study(str(tmp_path / "one-lr.toml"))
    plan = grid_plan(tmp_path, "borrower", [lent(LINEAR), lent(NONLINEAR)], ["linear", "nonlinear"], [])
    with pytest.raises(UserError, match=r"arms.borrow borrows every arm \(linear, nonlinear\)"):
        get_study(plan)


def test_a_changed_base_recipe_or_a_missing_source_is_refused_before_anything_trains(source, tmp_path, byte_data,
                                                                                     monkeypatch):
    trained = fake_training(monkeypatch, endpoint)
    plan = grid_plan(tmp_path, "borrower", [lent(LINEAR), RESIDUAL], ["linear", "residual"], [],
                     base_changes={"warmup_steps": 3})
    with pytest.raises(UserError, match=r"base\.train\.warmup_steps differs between the two plans"):
        run_study(get_study(plan), tmp_path / "studies" / "borrower", data_dir=str(byte_data), log=lambda *_: None)
    plan = grid_plan(tmp_path, "borrower", [lent(LINEAR), RESIDUAL], ["linear", "residual"], [])
    with pytest.raises(UserError, match="copy or link the committed results/source there"):
        run_study(get_study(plan), tmp_path / "elsewhere" / "borrower", data_dir=str(byte_data), log=lambda *_: None)
    assert not trained


@pytest.mark.parametrize("borrow", [{"study": "source"}, {"study": "../x", "commit": COMMIT},
                                    {"study": "source", "commit": "not hex"}])
def test_a_malformed_borrow_is_one_line_naming_the_field(tmp_path, borrow):
    plan = grid_plan(tmp_path, "borrower", [LINEAR | {"borrow": borrow}, RESIDUAL], ["linear", "residual"], [])
    with pytest.raises(UserError, match=r"arms\[0\]\.borrow is .*give \{ study = \"NAME\", commit = \"HEX\" \}"):
        get_study(plan)


def test_the_gate_plan_borrows_verdict_lrs_qk_norm_arms_as_committed():
    """plans/gate-lr.toml reads results/verdict-lr as the same experiment: its borrowed runs are at the named commit,
    and the borrowed arms' selection gives the lrs verdict-lr selected."""
    from pathlib import Path

    from nlq.studies.inference.selection import selection
    from nlq.studies.running.borrow import borrowed_records
    from nlq.studies.running.engine import endpoints

    study = get_study("gate-lr")
    results = Path(__file__).resolve().parent.parent / "results"
    described = {"design": study.design, "plan": study.plan, "runs": []}
    records = borrowed_records(results / "gate-lr", described)
    assert {r["arm"] for r in records} == {"linear-qknorm", "nonlinear-qknorm"}
    assert len(records) == 2 * 2 * (15 + 16)  # stable + branch; 5 lrs x 3 selection seeds, 16 test seeds
    picked = endpoints(results / "gate-lr", described, study.design.selection_seeds)
    chosen = selection(picked, study.design, ["linear-qknorm", "nonlinear-qknorm"])
    assert {arm: c["lr"] for arm, c in chosen.items()} == {"linear-qknorm": 0.008, "nonlinear-qknorm": 0.008}

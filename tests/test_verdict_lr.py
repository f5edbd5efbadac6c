"""`nlq study verdict-lr` as amended: four arms on one lr grid, the edge rule, the test stages in their order,
the paper-protocol pairing, and a report whose lr curve is the runs' summaries."""

import json
import math
import re

import pytest
import torch

from helpers import fake_training
from nlq.studies.definition.design import read_study
from nlq.studies.definition.plan import SHIPPED, load_plan
from nlq.studies.inference.selection import grid_step
from nlq.studies.reports.plan_selection import paper_protocol_lr

SETTINGS = load_plan(SHIPPED / "verdict-lr.toml").design  # as registered and amended
GRID = SETTINGS.lrs


def means_of(curve: dict) -> dict:
    return dict(curve)


def test_a_best_lr_inside_the_grid_ends_the_search():
    step = grid_step({1e-3: 3.1, 2e-3: 3.0, 4e-3: 2.9, 8e-3: 2.95, 1.6e-2: 3.2}, SETTINGS)
    assert step == {"lr": 4e-3, "next": None, "edge": False}


def test_a_best_lr_at_an_edge_extends_the_grid_that_way():
    assert grid_step({1e-3: 2.8, 2e-3: 2.9, 4e-3: 3.0, 8e-3: 3.1, 1.6e-2: 3.2}, SETTINGS)["next"] == pytest.approx(5e-4)
    assert grid_step({1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.0, 8e-3: 2.9, 1.6e-2: 2.8},
                     SETTINGS)["next"] == pytest.approx(3.2e-2)
    # a tie goes to the lower lr: inside here
    assert grid_step({1e-3: 3.2, 2e-3: 2.9, 4e-3: 2.9, 8e-3: 3.0, 1.6e-2: 3.1}, SETTINGS)["lr"] == 2e-3


def test_a_diverged_extension_stops_the_search_and_the_cap_ends_it_at_the_edge():
    diverged = {1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.0, 8e-3: 2.9, 1.6e-2: 2.8, 3.2e-2: None}
    assert grid_step(diverged, SETTINGS) == {"lr": 1.6e-2, "next": None, "edge": False}
    better = {1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.0, 8e-3: 2.9, 1.6e-2: 2.8, 3.2e-2: 2.7}
    assert grid_step(better, SETTINGS)["next"] == pytest.approx(6.4e-2)
    capped = better | {6.4e-2: 2.6, 1.28e-1: 2.5}  # three extensions made: the best stays at the edge
    assert grid_step(capped, SETTINGS) == {"lr": 1.28e-1, "next": None, "edge": True}
    diverged_grid = {lr: None for lr in GRID} | {4e-3: 3.0}
    assert grid_step(diverged_grid, SETTINGS) == {"lr": 4e-3, "next": None, "edge": False}
    assert grid_step({lr: None for lr in GRID}, SETTINGS) == {"lr": None, "next": None, "edge": False}


def test_the_paper_protocol_pairs_the_method_with_the_baseline_lr_nearest_a_sixth_of_its_own():
    assert paper_protocol_lr(8e-3, GRID, 6.0) == 1e-3  # 1.33e-3: 1e-3 is nearer than 2e-3 on a log scale
    assert paper_protocol_lr(1.6e-2, GRID, 6.0) == 2e-3  # 2.67e-3
    assert paper_protocol_lr(4e-3, GRID, 6.0) == 1e-3  # 6.7e-4, below the grid
    assert paper_protocol_lr(4e-3, [5e-4, *GRID], 6.0) == 5e-4  # ... unless an extension went there
    assert paper_protocol_lr(3.6e-3, [6e-4, 1e-3], 6.0) == 6e-4  # the paper's own pair


# Each arm's mean endpoint by lr (the fake training below); absent lrs are worse than every listed one.
LANDSCAPE = {
    "linear": {5e-4: 2.90, 1e-3: 2.92, 2e-3: 2.95, 2.5e-4: 2.93},  # best below the grid: one extension, then inside
    "nonlinear": {1.6e-2: 2.88, 8e-3: 2.91},  # best at the top, the next lr diverges
    "linear-qknorm": {4e-3: 2.87, 2e-3: 2.89, 8e-3: 2.89},  # inside
    "nonlinear-qknorm": {1.6e-2: 2.86, 3.2e-2: 2.85, 6.4e-2: 2.84, 1.28e-1: 2.83},  # the cap
}


def landscape_loss(arm: str, lr: float, seed: int) -> float:
    base = next((v for key, v in LANDSCAPE[arm].items() if math.isclose(key, lr)), 3.0 + abs(math.log(lr)) / 100)
    return base + 0.002 * (seed % 5) - 0.001 * (seed % 3) * (arm == "nonlinear")


@pytest.fixture
def finished_study(byte_data, tmp_path, monkeypatch):
    from nlq.errors import Diverged
    from nlq.studies.registry import get_study
    from nlq.studies.running.study import run_study

    def summary(config, run_dir):
        arm = arm_of(config)
        if arm == "nonlinear" and math.isclose(config.train.lr, 3.2e-2) and run_dir.name.endswith("-stable"):
            raise Diverged("loss is nan at step 7; stopped")
        loss = landscape_loss(arm, config.train.lr, config.train.seed)
        return {"val_loss": loss + 0.01, "full_val_loss": loss, "non_embedding_parameters": 1000, "tokens": 1}

    calls = fake_training(monkeypatch, summary)
    run_study(get_study("verdict-lr"), tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    return tmp_path, [(name, arm_of(c), c.train.lr, c.train.seed) for _, name, c in calls]


def arm_of(config) -> str:
    return config.model.query + ("-qknorm" if config.model.qk_norm else "")


def test_verdict_lr_selects_with_the_edge_rule_then_tests_the_primary_arms_first(finished_study, byte_data,
                                                                                 monkeypatch):
    from nlq.studies.registry import get_study
    from nlq.studies.running import study as study_module
    from nlq.studies.running.study import run_study

    study_dir, trained = finished_study
    s = SETTINGS
    budget = [(arm, lr, seed) for name, arm, lr, seed in trained if not name.endswith("-stable")]
    selection = [(arm, lr) for arm, lr, seed in budget if seed in s.selection_seeds]
    grid_runs = 4 * len(GRID) * 3
    assert {(arm, lr) for arm, lr in selection[:grid_runs]} == {(a, lr) for a in LANDSCAPE for lr in GRID}
    extensions = sorted({(arm, round(lr, 6)) for arm, lr in selection[grid_runs:]})
    assert extensions == [("linear", 0.00025), ("linear", 0.0005), ("nonlinear-qknorm", 0.032),
                          ("nonlinear-qknorm", 0.064), ("nonlinear-qknorm", 0.128)]  # nonlinear's 0.032 diverged
    tests = [(arm, lr) for arm, lr, seed in budget if seed in s.seeds]
    assert len(tests) == 4 * len(s.seeds)
    assert {arm for arm, _ in tests[:2 * len(s.seeds)]} == {"linear", "nonlinear"}  # the primary arms first
    assert {(arm, round(lr, 6)) for arm, lr in tests} == {("linear", 0.0005), ("nonlinear", 0.016),
                                                         ("linear-qknorm", 0.004), ("nonlinear-qknorm", 0.128)}
    assert (study_dir / "runs" / "d64-nonlinear-lr0.032-s201-stable" / "diverged.json").is_file()
    trained_again = []
    monkeypatch.setattr(study_module, "_train_run", lambda config, run_dir: trained_again.append(run_dir))
    run_study(get_study("verdict-lr"), study_dir, data_dir=str(byte_data), log=lambda *_: None)
    assert trained_again == []  # run again: every run finished or diverged, nothing is retrained


def test_verdict_lr_report_shows_the_selection_the_test_and_the_qknorm_family(finished_study):
    from nlq.studies.registry import build_report

    study_dir, _ = finished_study
    s = SETTINGS
    markdown = build_report(study_dir)
    assert "| linear | 0.0005 (extension, selected) | 3 of 3 | 2.9040 | [2.8990, 2.9090] | 0 |" in markdown
    assert "| nonlinear | 0.032 (extension) | 3 of 3 | n/a | n/a | 3 |" in markdown
    assert "nonlinear-qknorm 0.128 (at an edge after every extension)" in markdown
    assert "**Verdict: nonlinear better, by less than 0.037" in markdown  # 2.88 against 2.90
    assert "linear at 0.002 (the lr it tried nearest to 1/6 of it)" in markdown
    for label in ("nonlinear-qknorm - linear-qknorm", "linear-qknorm - linear", "linear-qknorm - nonlinear",
                  "interaction: (nonlinear-qknorm - linear-qknorm) - (nonlinear - linear)"):
        assert f"| {label} | 16 |" in markdown
    outcome = json.loads((study_dir / "verdict.json").read_text())
    assert outcome["decision"]["interval"]["mean"] == pytest.approx(
        sum(landscape_loss("nonlinear", 1.6e-2, seed) - landscape_loss("linear", 5e-4, seed) for seed in s.seeds)
        / len(s.seeds))
    interaction = next(r for r in outcome["secondary_family"] if r["member"] == "interaction")
    assert interaction["mean"] == pytest.approx((2.83 - 2.87) - (2.88 - 2.90) + 0.001 * sum(
        seed % 3 for seed in s.seeds) / len(s.seeds))
    # the lr curve is the summaries: every selection run's endpoint, in its place
    for arm, rows in outcome["lr_curve"].items():
        for row in rows:
            for seed, value in zip(s.selection_seeds, row["values"]):
                summary = study_dir / "runs" / f"d64-tpp300-{arm}-lr{row['lr']:g}-s{seed}" / "summary.json"
                expected = json.loads(summary.read_text())["full_val_loss"] if summary.is_file() else None
                assert value == expected
    assert (study_dir / "verdict_lr_curve.png").stat().st_size > 0 and (study_dir / "verdict_lr_test.png").is_file()
    assert build_report(study_dir) == markdown  # regenerates byte for byte
    status = publish_module().status_text(outcome, read_study(study_dir), "now", "here",
                                          "results/verdict-lr")
    assert "still running" not in status and "Holm-adjusted as one family of 4" in status
    for row in outcome["secondary_family"]:  # each comparison named, with its own interval and Holm p
        name = "the interaction (the query effect with QK-norm minus without)" if row["member"] == "interaction" \
            else row["comparison"]
        assert f"{name} {row['mean']:+.4f}" in status and f"Holm p {row['holm_p']:.2g}" in status


def publish_module():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "publish_verdict.py"
    spec = importlib.util.spec_from_file_location("publish_verdict", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_with_the_primary_pairs_in_the_status_gives_the_decision_and_how_far_the_qknorm_arms_are(finished_study):
    """The decision is published as soon as the primary pairs are in; until the secondary arms have every test seed,
    the report and the status say how many have, and no secondary number is shown."""
    import shutil

    from nlq.studies.registry import build_report

    study_dir, _ = finished_study
    for run in (study_dir / "runs").glob("d64-*qknorm-*"):
        if int(re.search(r"-s(\d+)", run.name).group(1)) > 213:
            shutil.rmtree(run)  # the QK-norm arms' test chains of seeds 214-226 not run yet
    markdown = build_report(study_dir)
    assert "**Verdict: nonlinear better" in markdown
    assert "3 of 16 test seeds have every arm's endpoint; the family is computed once all have." in markdown
    assert "| linear-qknorm - linear |" not in markdown
    outcome = json.loads((study_dir / "verdict.json").read_text())
    assert outcome["seeds_with_every_arm"] == 3 and outcome["secondary_family"] == []
    study = read_study(study_dir)
    status = publish_module().status_text(outcome, study, "now", "here", "results/verdict-lr")
    assert status.startswith("**Each at its own lr (now,") and "nonlinear better" in status
    assert "(linear-qknorm, nonlinear-qknorm) are still running: 3 of 16 test seeds have every arm's endpoint" in status


def test_a_status_names_a_borrowed_secondary_arm_as_borrowed_not_running():
    """gate-lr borrows nonlinear-qknorm from verdict-lr: while its own secondary arms train, the status says which
    arms are still running and that the borrowed one has every test run in (it is not running)."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "results" / "gate-lr"
    outcome = json.loads((results / "verdict.json").read_text())
    if "decision" not in outcome:
        pytest.skip("results/gate-lr has no decision yet")
    outcome["secondary_family"], outcome["seeds_with_every_arm"] = [], 5
    status = publish_module().status_text(outcome, read_study(results), "now", "here", "results/gate-lr")
    assert ("The secondary arms (mlp4.5-qknorm, identity-gate-qknorm) are still running (nonlinear-qknorm: borrowed, "
            "every test run in): 5 of 16 test seeds have every arm's endpoint") in status


def test_the_four_arms_of_a_test_seed_share_batches_and_every_initial_weight_their_shapes_share(tmp_path):
    """Apart from the query, QK-norm and the lr, the four arms' configs are identical (so are their batch plans,
    which depend on the seed, data and batch fields only); built with their seed, they share every weight they
    have in common, and the QK-norm gains are the only extra parameters."""
    from nlq.model import Transformer
    from nlq.studies.registry import get_study
    from nlq.studies.running.engine import chains

    study = get_study("verdict-lr")
    lrs = {"linear": [1e-3], "nonlinear": [8e-3], "linear-qknorm": [2e-3], "nonlinear-qknorm": [1.6e-2]}
    runs = [r for r in chains(study, tmp_path, [211], lrs) if r.labels["stage"] == "budget"]
    configs = {r.arm.name: r.config([], tmp_path / "data") for r in runs}
    assert sorted(configs) == sorted(lrs)

    def rest(config) -> dict:
        d = config.to_dict()
        d["model"] = {k: v for k, v in d["model"].items() if k not in ("query", "qk_norm")}
        d["train"] = {k: v for k, v in d["train"].items() if k not in ("lr", "min_lr", "resume_from")}
        return d

    assert all(rest(c) == rest(configs["linear"]) for c in configs.values())
    states = {arm: Transformer(c.model, seed=c.train.seed).state_dict() for arm, c in configs.items()}
    for arm, state in states.items():
        for other, other_state in states.items():
            shared = [k for k in state if k in other_state and state[k].shape == other_state[k].shape
                      and "q_" not in k and "query" not in k]
            assert shared and all(torch.equal(state[k], other_state[k]) for k in shared), (arm, other)
    extra = set(states["linear-qknorm"]) - set(states["linear"])
    assert extra and all("norm" in k for k in extra)


def test_a_status_after_a_sequential_stop_counts_the_pairs_the_test_used_and_gives_its_repeated_interval():
    """A group-sequential test that stopped at its first look used 8 of 16 registered pairs: the status says 8 pairs
    (and 8 test seeds for the secondary arms), and gives the repeated interval the words are read off."""
    import dataclasses
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "results" / "gate-lr"
    outcome = json.loads((results / "verdict.json").read_text())
    if "decision" not in outcome:
        pytest.skip("results/gate-lr has no decision yet")
    study = read_study(results)
    study["design"] = dataclasses.replace(study["design"], looks=[8, 16], spending="obf")
    end = {"action": "difference", "look": 1, "pairs": 8, "repeated": [0.0123, 0.0456]}
    outcome["decision"] = outcome["decision"] | {"sequential": end}
    outcome["secondary_family"], outcome["seeds_with_every_arm"] = [], 5
    status = publish_module().status_text(outcome, study, "now", "here", "results/gate-lr")
    assert "`nlq study gate-lr` as pre-registered, 8 pairs," in status and "pre-registered, 16 pairs" not in status
    assert ("stopped for a difference at look 1 (8 pairs), repeated 95% interval [+0.0123, +0.0456]" in status)
    assert "5 of 8 test seeds have every arm's endpoint" in status

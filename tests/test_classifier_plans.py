"""Pre-registered plans for encoder classifiers: [data] names a source of labelled examples alone, the study
prepares it itself, selects each arm's lr on the whole test split's loss, tests the pairs and reports test accuracy
beside the endpoint."""

import csv
import json

import pytest

from nlq.errors import UserError
from nlq.studies.definition.plan import read_plan

pytest.importorskip("mnist1d")

MODEL = {"classes": 10, "causal": False, "block_size": 11, "vocab_size": 8, "input_dims": 1, "input_size": 40,
         "in_channels": 1, "patch_size": 4, "pool": "cls"}
TRAIN = {"objective": "classify", "batch_size": 16, "warmup_steps": 2, "schedule": "wsd", "log_every": 100,
         "dtype": "float32", "device": "cpu"}


def plan(**design) -> dict:
    return {"name": "tiny-classifier", "data": {"source": "mnist1d:300"},
            "base": {"preset": "nano", "model": dict(MODEL), "train": dict(TRAIN)},
            "arms": [{"name": "linear", "model": {"query": "linear"}},
                     {"name": "nonlinear", "model": {"query": "nonlinear"}}],
            "design": {"width": "d16", "shape": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "budgets_tpp": [4],
                       "primary_tpp": 4, "seeds": [1, 2], "primary": ["linear", "nonlinear"],
                       "endpoint": "full_val_loss", "confidence": 0.95, "margin": 0.02, "alpha": 0.05,
                       "planning_sd": 0.05, "lrs": [1e-3, 4e-3], "min_lr_ratio": 0.1, "edge_factor": 2.0,
                       "max_extensions": 0, "selection_seeds": [8, 9]} | design}


def test_a_plan_of_labelled_examples_names_its_source_alone():
    spec = read_plan(plan()).data
    assert (spec.source, spec.tokenizer) == ("mnist1d:300", "")
    raw = plan()
    raw["data"]["tokenizer"] = "bpe:2048"
    with pytest.raises(UserError) as error:
        read_plan(raw)
    assert "\n" not in str(error.value) and "data.tokenizer" in str(error.value) and "source alone" in str(error.value)
    raw["data"] = {"tokenizer": "bpe:2048"}
    with pytest.raises(UserError, match="or a source of labelled examples alone"):
        read_plan(raw)


@pytest.mark.slow
def test_a_tiny_classifier_plan_prepares_selects_tests_and_reports_accuracy(tmp_path):
    from nlq.studies.registry import build_report
    from nlq.studies.running.engine import plan_study
    from nlq.studies.running.study import run_study

    out = tmp_path / "study"
    run_study(plan_study(read_plan(plan())), out, log=lambda *_: None)
    described = json.loads((out / "study.json").read_text())
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert described["data_meta"]["content_hash"] == meta["content_hash"] and meta["source"] == "mnist1d:300"
    build_report(out)
    outcome = json.loads((out / "verdict.json").read_text())
    assert set(outcome["selected_lrs"]) == {"linear", "nonlinear"} and outcome["finished_pairs"] == {"nonlinear": 2}
    report = (out / "report.md").read_text()
    assert "Examples: `mnist1d:300`" in report and "on the whole test split" in report
    assert "Test accuracy of the same pairs (not the endpoint)" in report and "fixed eval windows" not in report
    rows = list(csv.DictReader((out / "results.csv").open()))
    tested = [r for r in rows if int(r["seed"]) in (1, 2)]
    assert len(tested) == 4 and all(0 <= float(r["full_val_acc"]) <= 1 for r in tested)
    summary = json.loads(next((out / "runs").glob("d16-tpp4-linear-*-s1/summary.json")).read_text())
    assert summary["full_val_loss"] == summary["test_loss"] and summary["objective"] == "classify"

"""The pre-registered verdict study: its plan, its endpoint (the whole val split) and its decision rule."""

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from helpers import fake_training, tiny_run_config
from nlq.studies.inference import stats


def test_verdict_plan_pairs_both_variants_on_one_lr_and_schedule_then_runs_identity(byte_data, tmp_path, monkeypatch):
    from nlq.studies.registry import get_study
    from nlq.studies.running.study import run_study

    calls = fake_training(monkeypatch)
    study = get_study("verdict")
    settings = study.design.to_dict()
    run_study(study, tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    trained = [(name, config) for _, name, config in calls]
    described = json.loads((tmp_path / "study.json").read_text())
    assert described["design"] == json.loads(json.dumps(settings))  # the design is on disk for the report
    assert described["code"]  # the commit of the code that ran it (this checkout is a git repository)
    branches = [c for name, c in trained if not name.endswith("-stable")]
    assert len(branches) == len(settings["seeds"]) * 3 * len(settings["budgets_tpp"])
    primary = [c for c in branches if c.model.query in settings["primary"]]
    assert {c.model.query for c in branches[:len(primary)]} == {"linear", "nonlinear"}  # identity only afterwards
    assert {(c.train.lr, c.train.min_lr, c.train.schedule, c.train.warmup_steps) for _, c in trained} == {
        (settings["lr"], settings["min_lr"], "wsd", 50)}
    assert {c.data.final_eval for c in branches} == {"full"}
    assert {c.train.seed for c in branches} == set(settings["seeds"])
    by_budget = {}
    for c in branches:
        by_budget.setdefault(c.train.max_steps, set()).add(c.model.query)
    assert sorted(by_budget) == [4816,
                                 14447] and all(v == {"linear", "nonlinear", "identity"} for v in by_budget.values())
    assert all("-stable/checkpoints/step_" in c.train.resume_from for c in branches)
    # a pair's two chains land on different shards of two, and each shard gets both variants
    from nlq.studies.running.sharding import shard_indices

    stage = next(study.run_stages(tmp_path))
    shard_one = {stage[i].arm.name + str(stage[i].seed) for i in shard_indices(stage, 1, 2)}
    assert "linear101" in shard_one and "nonlinear102" in shard_one and "nonlinear101" not in shard_one


def test_full_final_eval_scores_the_whole_val_split(byte_data, tmp_path):
    from nlq.data.shards import load_data
    from nlq.training.evaluate import make_full_eval_set
    from nlq.training.trainer import train

    config = tiny_run_config(byte_data, max_steps=4, eval_every=2)
    config.data.final_eval = "full"
    summary = train(config, tmp_path / "run", quiet=True)
    data = load_data(byte_data)
    windows = (len(data.val) - 1) // config.model.block_size
    assert summary["full_val_windows"] == windows == len(make_full_eval_set(config, data).starts)
    assert summary["full_val_loss"] > 0 and summary["full_val_loss"] != summary["val_loss"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "full_val_loss" in r] == [4]  # the final step only


def test_equivalence_test_matches_scipy_one_sided_tests():
    rng = np.random.default_rng(3)
    for mean in (-0.05, -0.01, 0.0, 0.02):
        d = rng.normal(mean, 0.03, size=14)
        got = stats.equivalence_test(list(d), margin=0.037, alpha=0.05)
        lower = scipy_stats.ttest_1samp(d, -0.037, alternative="greater").pvalue
        upper = scipy_stats.ttest_1samp(d, 0.037, alternative="less").pvalue
        assert got["p_lower"] == pytest.approx(lower, rel=1e-9) and got["p_upper"] == pytest.approx(upper, rel=1e-9)
        assert got["equivalent"] == (max(lower, upper) < 0.05)
        interval = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
        assert (got["low"], got["high"]) == pytest.approx((interval.low, interval.high))


@pytest.mark.parametrize("differences, verdict", [
    ([-0.05, -0.04, -0.06, -0.045, -0.055, -0.05], "better"),
    ([0.03, 0.05, 0.04, 0.045, 0.035, 0.05], "worse"),
    ([0.002, -0.004, 0.003, -0.001, 0.0, 0.001, -0.002, 0.001], "equivalent"),
    ([0.03, -0.06, 0.05, -0.02, 0.01], "inconclusive"),
])
def test_decision_rule_on_hand_built_differences(differences, verdict):
    decision = stats.decide(differences, margin=0.037)
    assert decision["verdict"] == verdict
    assert decision["words"].startswith(stats.VERDICTS[verdict])


def test_a_significant_but_small_effect_says_it_is_smaller_than_the_margin():
    d = [-0.010, -0.011, -0.009, -0.010, -0.012, -0.008, -0.010, -0.010]
    decision = stats.decide(d, margin=0.037)
    assert decision["verdict"] == "better" and "by less than 0.037" in decision["words"]


def test_holm_matches_a_hand_computation():
    # sorted: 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 = 0.04 -> made non-decreasing: 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, float("nan"), 0.6])[0] == pytest.approx(1.0)  # m = 2: nan does not count


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert stats.median([1900, 2600, 1800, 2000]) == 1950
    assert stats.median([3, 1, 2]) == 2


def test_power_of_the_paired_t_test_matches_a_simulation():
    rng = np.random.default_rng(0)
    d = rng.normal(0.037, 0.045, size=(20000, 14))
    simulated = np.mean(scipy_stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05)
    assert stats.power_paired_t(0.037, 0.045, 14) == pytest.approx(simulated, abs=0.01)
    means, sds = d.mean(1) - 0.037, d.std(1, ddof=1)
    half = scipy_stats.t.ppf(0.95, 13) * sds / np.sqrt(14)
    assert stats.power_equivalence(0.0, 0.045, 14,
                                   0.037) == pytest.approx(np.mean(np.abs(means) + half < 0.037), abs=0.01)


def test_the_gpu_command_line_dry_runs_on_a_cpu(byte_data, tmp_path, capsys):
    """What `nlq study verdict --shards 14 --train.device=cuda` starts per shard, as a dry run: each shard's runs on
    cuda, the totals; no training, nothing written. Every chain lands on exactly one of the 14 shards."""
    from nlq.cli import main

    names = []
    for k in range(1, 15):
        main(["study", "verdict", "--out", str(tmp_path / "v"), "--data", str(byte_data), "--shard", f"{k}/14",
              "--train.device=cuda", "--train.dtype=float32", "--dry-run"])
        out = capsys.readouterr().out
        assert f"shard {k}/14" in out and "device cuda" in out and "device cpu" not in out
        names += [line.split(":")[0].strip() for line in out.splitlines() if "tpp300" in line]
    assert len(names) == len(set(names)) == 14 * 3  # linear, nonlinear and identity at 300 tokens/param, each once
    assert not (tmp_path / "v").exists()


def test_equivalence_test_with_identical_differences_decides_by_the_margin():
    assert stats.equivalence_test([0.01] * 5, margin=0.037)["equivalent"]
    assert not stats.equivalence_test([0.05] * 5, margin=0.037)["equivalent"]
    assert stats.decide([0.05] * 5, margin=0.037)["verdict"] == "worse"

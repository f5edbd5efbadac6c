import json
import math
import shutil
import subprocess
import sys
import threading
import time

import pytest

from helpers import TASK, fake_training, one_line_error, shipped_study, task_study, tiny_run_config, two_arm_study
from nlq.studies.definition.design import Arm
from nlq.studies.inference.stats import equivalent_params, fit_loss_vs_params, paired_difference, relative_delta
from nlq.studies.registry import build_report, get_study
from nlq.studies.running.dry_run import dry_run_text
from nlq.studies.running.study import run_study

TINY = ["--model.vocab_size=257", "--model.block_size=32", "--model.n_layer=1", "--model.n_embd=32",
        "--model.n_head=2", "--train.max_steps=3", "--train.eval_every=3", "--train.batch_size=4",
        "--data.eval_windows=4", "--train.warmup_steps=1"]


def tiny_study(byte_data, seeds=(1, 2)):
    return two_arm_study(tiny_run_config(byte_data, max_steps=4, eval_every=2, checkpoint_every=2), seeds=seeds)


@pytest.mark.slow
def test_tiny_study_end_to_end(byte_data, tmp_path):
    run_study(tiny_study(byte_data), tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    markdown = build_report(tmp_path)
    for name in ("report.md", "results.csv", "val_curves.png", "loss_vs_params.png", "paired_curves.png"):
        assert (tmp_path / name).stat().st_size > 0
    table = [line for line in markdown.splitlines() if line.startswith("| linear") or line.startswith("| nonlinear")]
    assert len(table) == 3  # two variant rows + one paired row
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 1 + 4
    assert "| nonlinear | 2 |" in markdown  # paired over both seeds


def test_same_seed_means_same_batches_across_variants(byte_data, tmp_path):
    from nlq.studies.definition.design import Run

    study = tiny_study(byte_data)
    configs = [Run(study, v, 1, None).config([], byte_data) for v in study.arms]
    assert configs[0].train == configs[1].train and configs[0].data == configs[1].data
    assert configs[0].model.query != configs[1].model.query


def test_interrupted_study_skips_finished_runs(byte_data, tmp_path, monkeypatch):
    from nlq.studies.running import study as study_module

    real_train, calls = study_module.train, []

    def flaky_train(config, run_dir, **kw):
        calls.append(run_dir.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_train(config, run_dir, **kw)

    monkeypatch.setattr(study_module, "train", flaky_train)
    with pytest.raises(KeyboardInterrupt):
        run_study(tiny_study(byte_data), tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    messages = []
    calls.clear()
    run_study(tiny_study(byte_data), tmp_path, data_dir=str(byte_data), log=messages.append)
    assert sum("finished earlier, skipped" in m for m in messages) == 2
    assert calls == ["linear-s2", "nonlinear-s2"]


@pytest.mark.parametrize("name,variants,extra", [
    ("cpu", ["linear", "nonlinear", "identity", "residual", "linear-mlp4.5", "linear-mlp4.75"], []),
    ("encoder", ["linear", "nonlinear", "identity"], ["--model.vocab_size=258"]),
    ("kvo", ["linear", "q-nonlinear", "k-nonlinear", "v-nonlinear", "o-nonlinear", "qk-nonlinear"], []),
])
@pytest.mark.slow
def test_named_study_runs_on_a_tiny_override(byte_data, tmp_path, name, variants, extra):
    result = subprocess.run([sys.executable, "-m", "nlq", "study", name, "--out", str(tmp_path), "--data",
                             str(byte_data),
                             *TINY, *extra], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (tmp_path / "report.md").read_text()
    for variant in variants:
        assert f"| {variant} | " in report
    assert len(json.loads((tmp_path / "study.json").read_text())["runs"]) == 3 * len(variants)


@pytest.mark.slow
def test_paper_study_runs_end_to_end_on_a_tiny_override(byte_data, tmp_path):
    overrides = [o for o in TINY if "batch_size" not in o] + ["--train.batch_tokens=128", "--train.batch_size=2",
                                                              "--train.checkpoint_every=3", "--data.eval_windows=4"]
    result = subprocess.run([sys.executable, "-m", "nlq", "study", "paper", "--out", str(tmp_path), "--data",
                             str(byte_data),
                             *overrides], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    config = json.loads((tmp_path / "runs" / "nonlinear-lr3.6e-3-s1337" / "config.json").read_text())
    assert config["train"]["lr"] == 3.6e-3 and config["model"]["query"] == "nonlinear"
    assert "| linear-mlp4.75 |" in (tmp_path / "report.md").read_text()


def test_lr_sweep_reports_each_variant_at_its_best(byte_data, tmp_path):
    study = tiny_study(byte_data, seeds=(1,))
    study.lrs = [1e-4, 3e-3]
    run_study(study, tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    markdown = build_report(tmp_path)
    assert "| linear | 0.003 |" in markdown and "| nonlinear | 0.003 |" in markdown  # the tiny lr is far worse
    assert "one seed: no interval" in markdown


def test_unknown_study_is_a_clear_error():
    with pytest.raises(ValueError,
                       match="unknown study 'big'; valid studies: cpu, cpu-lr, diff-lr, "):
        get_study("big")


# ---- statistics against hand-computed values -------------------------------------------------------------------------

def test_paired_difference_matches_hand_computation():
    p = paired_difference([1.0, 1.1, 0.9], [1.2, 1.2, 1.2])
    # d = [-0.2, -0.1, -0.3]: mean -0.2, sd 0.1, t(0.975, 2) = 4.302653
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert p["mean"] == pytest.approx(-0.2) and p["low"] == pytest.approx(-0.2 - half, abs=1e-6)
    assert p["high"] == pytest.approx(-0.2 + half, abs=1e-6) and p["verdict"] == "within noise"
    assert paired_difference([1.0, 1.01, 0.99, 1.0], [1.1, 1.1, 1.1, 1.1])["verdict"] == "better"
    assert paired_difference([1.2, 1.21, 1.19], [1.1, 1.1, 1.1])["verdict"] == "worse"


def test_relative_delta_and_parameter_fit():
    assert relative_delta(3.0, 2.94) == pytest.approx(-0.02)  # what the reports print: the sign of Δ
    fit = fit_loss_vs_params([math.e, math.e ** 2, math.e ** 3], [3.0, 2.0, 1.0])
    assert fit == pytest.approx((4.0, -1.0))
    assert equivalent_params(fit, 2.5) == pytest.approx(math.e ** 1.5)
    assert fit_loss_vs_params([1.0, 2.0], [1.0, 2.0]) is None  # loss rising with N: no equivalence


def write_fake_study(root, losses):
    """A study directory with hand-made finished runs: losses = {variant: {seed: (params, val_loss)}}."""
    runs = []
    for variant, seeds in losses.items():
        for seed, (params, loss) in seeds.items():
            name = f"{variant}-s{seed}"
            run_dir = root / "runs" / name
            run_dir.mkdir(parents=True)
            (run_dir / "summary.json").write_text(json.dumps({"val_loss": loss, "val_bpb": loss / 2,
                                                              "tokens_per_s": 1000.0,
                                                               "non_embedding_parameters": params}))
            (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "val_loss": loss + 1}) + "\n"
                                                   + json.dumps({"step": 20, "val_loss": loss}) + "\n")
            runs.append({"name": name, "variant": variant, "seed": seed, "lr": 1e-3})
    study = {"name": "fake", "baseline": "linear", "width_family": ["linear", "wide"], "lrs": None,
             "variants": [{"name": v} for v in losses], "runs": runs}
    (root / "study.json").write_text(json.dumps(study))


def test_report_numbers_on_synthetic_runs(tmp_path):
    write_fake_study(tmp_path, {
        "linear": {1: (1000, 3.0), 2: (1000, 3.1)},
        "nonlinear": {1: (1000, 2.9), 2: (1000, 3.0)},
        "wide": {1: (2000, 2.8), 2: (2000, 2.9)},
    })
    markdown = build_report(tmp_path)
    # nonlinear: mean 2.95 vs 3.05 -> (2.95 - 3.05) / 3.05 = -3.28% (lower: negative, Δ's sign);
    # ppl: (e^2.95 - e^3.05) / e^3.05 = e^-0.1 - 1 = -9.52%
    assert "| nonlinear | 0.001 | 2 | 1,000 | +0.00% | 2.9500 ± 0.0707 | 19.11 | -3.28% | -9.52% | 1,000 |" in markdown
    # paired: d = [-0.1, -0.1], sd 0 -> interval collapses to the mean, verdict better (Holm over the 2 variants)
    row = next(line for line in markdown.splitlines() if line.startswith("| nonlinear | 2 |"))
    assert row.startswith("| nonlinear | 2 | -0.1000 | [-0.1000, -0.1000] |") and row.endswith("| better |"), row
    # fit: loss = a + b ln N through (1000, 3.05), (2000, 2.85): b = -0.2 / ln 2;
    # 2.95 is the midpoint -> N = 1000 sqrt(2)
    assert "| nonlinear | 2.9500 | 1,414 | +41.4% |" in markdown


@pytest.mark.slow
def test_report_on_a_missing_study_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "nlq", "report", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "not a study directory" in result.stderr


@pytest.mark.slow
def test_scaling_study_sweeps_then_branches_every_budget(byte_data, tmp_path):
    """The scaling study on a tiny width: the lr sweep picks each variant's lr, then one WSD stable run per
    (variant, seed) branches a cooldown at every budget; the report pairs each budget's variants by seed."""
    widths = {"d16": {"shape": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "budgets": [4, 8], "lrs": [1e-3, 4e-3],
                      "sweep_tpp": 4}}
    overrides = ["--model.vocab_size=257", "--model.block_size=32", "--data.eval_windows=4", "--train.warmup_steps=2",
                 "--train.batch_size=4"]
    study = shipped_study("scaling", widths=widths, seeds=[1, 2])
    before = dry_run_text(study, tmp_path, overrides, data_dir=str(byte_data)).splitlines()
    run_study(study, tmp_path, overrides, data_dir=str(byte_data), log=lambda *_: None)
    described = json.loads((tmp_path / "study.json").read_text())
    # the dry run's whole-study tokens are what the sweep and then every chain trained: the sweep as listed before
    # anything ran, the chains as listed once the sweep alone is there
    swept = shutil.copytree(tmp_path, tmp_path.parent / "swept", ignore=lambda d, names: [
        n for n in names if d.endswith("runs") and not n.startswith("sweep-")])
    after_sweep = dry_run_text(study, swept, overrides, data_dir=str(byte_data)).splitlines()[-1]
    tokens = [int(line.split(" runs, ")[1].split(" tokens")[0].replace(",", "")) for line in (before[-2], after_sweep)]
    assert before[-1] == f"the whole study, every stage: {sum(tokens):,} tokens to train"
    stages = [r["stage"] for r in described["runs"]]
    assert stages.count("lr-sweep") == 2 * 3 and stages.count("budget") == 2 * 3 * 2
    budget_runs = [r for r in described["runs"] if r["stage"] == "budget"]
    assert [r["tpp"] for r in budget_runs] == [4] * 6 + [8] * 6  # budget-major: a cut-short study has whole budgets
    for run in budget_runs:
        config = json.loads((tmp_path / "runs" / run["name"] / "config.json").read_text())
        assert config["train"]["schedule"] == "wsd"
        assert config["train"]["max_steps"] == run["steps"]
        if run["steps"] > 1:  # every budget but a one-step one branches from its stable run
            assert f"{run['arm']}-s{run['seed']}-stable" in config["train"]["resume_from"]
    stable = [r for r in described["runs"] if r["stage"] == "stable"]
    assert {r["name"] for r in stable} == {f"d16-{v}-s{s}-stable" for v in ("linear", "nonlinear", "linear-mlp4.75")
                                           for s in (1, 2)}
    markdown = build_report(tmp_path)
    assert "| d16 | 8 |" in markdown and "| nonlinear | 2 |" in markdown and "| linear-mlp4.75 | 2 |" in markdown
    assert "best lr" in markdown and (tmp_path / "scaling_delta.png").stat().st_size > 0
    assert described["design"]["widths"] == widths and described["seeds"] == [1, 2]  # the design, on disk
    messages = []  # started again: everything is finished
    run_study(shipped_study("scaling", widths=widths, seeds=[1, 2]), tmp_path, overrides, data_dir=str(byte_data),
              log=messages.append)
    assert not [m for m in messages if m.startswith("[") and "skipped" not in m]


def test_tpp_trend_is_the_mean_of_per_seed_slopes_against_log2_tokens():
    from nlq.studies.reports.scaling import tpp_trends

    def row(variant, seed, tpp, loss):
        return {"width": "d8", "arm": variant, "seed": seed, "tpp": tpp, "val_loss": loss}

    rows = []
    for seed, slope in ((1, 0.01), (2, 0.03)):  # Δ = slope * log2(tpp) + seed offset, exactly
        for tpp in (2, 4, 16):
            rows += [row("linear", seed, tpp, 5.0 - tpp / 10), row("nonlinear", seed, tpp, 5.0 - tpp / 10 + seed / 100
                                                                                    + slope * math.log2(tpp))]
    rows += [row("linear", 3, 2, 5.0), row("linear", 3, 4, 5.0), row("nonlinear", 3, 2, 9.0),
             row("nonlinear", 3, 4, 9.0)]
    trend = tpp_trends(rows, ["linear", "nonlinear"])[("d8", "nonlinear")]
    assert trend["n"] == 2  # seed 3 has two budgets: too few for a slope, left out
    assert trend["mean"] == pytest.approx(0.02) and trend["span"] == "2-16"
    assert trend["low"] < 0.02 < trend["high"] and trend["verdict"] == "within noise"
    assert tpp_trends(rows, ["linear", "nonlinear"], min_points=4) == {}


def test_shared_lr_control_runs_linear_and_nonlinear_at_one_lr(byte_data, tmp_path, monkeypatch):
    widths = {"d16": {"shape": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "budgets": [4, 8]}}
    calls = fake_training(monkeypatch)
    study = shipped_study("scaling-shared-lr", widths=widths)
    run_study(study, tmp_path, ["--model.vocab_size=257", "--model.block_size=32", "--train.batch_size=4"],
              data_dir=str(byte_data), log=lambda *_: None)
    trained = [config for _, _, config in calls]
    assert {c.model.query for c in trained} == {"linear", "nonlinear"} and {c.model.mlp_ratio for c in trained} == {4.0}
    assert {c.train.lr for c in trained} == {study.design.lr} == {2e-3}
    budgets = [r for r in json.loads((tmp_path / "study.json").read_text())["runs"] if r["stage"] == "budget"]
    assert sorted({r["tpp"] for r in budgets}) == [4, 8] and len(budgets) == 2 * 2 * len(study.seeds)


def test_paired_curve_is_the_per_step_paired_difference():
    from nlq.studies.definition.tables import RunResult
    from nlq.studies.reports.plots import paired_curve

    def run(seed, curve):
        return RunResult(f"r{seed}", "v", seed, 1e-3, 10, curve[-1][1], 1.0, 1.0, curve)

    base = [run(1, [(0, 5.0), (10, 4.0), (20, 3.0)]), run(2, [(0, 5.0), (10, 4.2), (20, 3.1)])]
    variant = [run(1, [(0, 5.0), (10, 3.9), (20, 2.8)]), run(2, [(0, 5.0), (10, 4.0), (20, 3.0)]), run(3, [(0, 1.0)])]
    points = dict(paired_curve(variant, base))
    assert sorted(points) == [0, 10, 20]  # seed 3 has no baseline: left out
    assert points[10]["mean"] == pytest.approx(-0.15) and points[20]["mean"] == pytest.approx(-0.15)
    assert points[10]["n"] == 2 and points[20]["low"] < points[20]["mean"] < points[20]["high"]


def test_shards_split_every_stage_keep_groups_together_and_wait_for_each_other(tmp_path, monkeypatch):
    """Two shards on one study directory: every run trained once, a group's runs by one shard in order, and
    the second stage built only after both shards finished the first."""
    import threading

    from nlq.studies.definition.design import Run
    from nlq.studies.running.sharding import parse_shard

    trained = fake_training(monkeypatch, summary=lambda *_: time.sleep(0.02) or {})  # both shards get work
    variant = Arm("linear", {"model": {"query": "linear"}})
    study = task_study("sharded", [variant])
    first = [Run(study, variant, seed, None, TASK, tag="first") for seed in range(1, 6)]

    def stages(study_dir):
        yield first
        assert all((study_dir / "runs" / r.name / "summary.json").is_file() for r in first)  # both shards done
        yield [Run(study, variant, 1, None, TASK, tag=f"g{g}-{part}", chain_name=f"g{g}")
               for g in range(3) for part in "ab"]

    study.stages = stages
    shard_two = threading.Thread(target=run_study, name="2", args=(study, tmp_path),
                                 kwargs={"log": lambda *_: None, "shard": parse_shard("2/2")})
    shard_two.start()
    threading.current_thread().name, main_name = "1", threading.current_thread().name
    try:
        run_study(study, tmp_path, log=lambda *_: None, shard=parse_shard("1/2"))
    finally:
        threading.current_thread().name = main_name
    shard_two.join(timeout=30)
    names = [name for _, name, _ in trained]
    assert sorted(names) == sorted([r.name for r in first] + [f"g{g}-{p}-linear-s1" for g in range(3) for p in "ab"])
    by = {name: shard for shard, name, _ in trained}
    assert {by[f"g{g}-a-linear-s1"] == by[f"g{g}-b-linear-s1"] for g in range(3)} == {True}
    assert all(names.index(f"g{g}-a-linear-s1") < names.index(f"g{g}-b-linear-s1") for g in range(3))
    assert set(by.values()) == {"1", "2"}


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_bad_shard_is_a_clear_error(text):
    from nlq.errors import UserError
    from nlq.studies.running.sharding import parse_shard

    with pytest.raises(UserError, match="K/N"):
        parse_shard(text)


def test_a_shard_waits_while_another_prepares_the_study_data(tmp_path, monkeypatch):
    from nlq.errors import LockHeld
    from nlq.studies.running import study as study_module

    calls, messages = [], []

    def busy_then_ready(source, tokenizer, out, val_fraction, log, advice):
        calls.append(out)
        if len(calls) == 1:
            raise LockHeld("data directory is in use by another nlq process")

    monkeypatch.setattr(study_module, "prepare", busy_then_ready)
    monkeypatch.setattr(study_module, "WAIT_POLL_S", 0.01)
    study = get_study("cpu")
    assert study_module.prepare_study_data(study, tmp_path, None, messages.append,
                                           wait_for_others=True) == tmp_path / "data"
    assert len(calls) == 2 and "being prepared by another shard" in messages[0]
    calls.clear()
    with pytest.raises(LockHeld):  # not a shard: the one-line error, as before
        study_module.prepare_study_data(study, tmp_path, None, messages.append)


@pytest.mark.parametrize("argv,field", [
    (["study", "scaling", "--train.lr=1e-3"], "train.lr"),  # the swept lrs
    (["study", "cpu", "--model.query=identity"], "model.query"),  # each variant's query
    (["study", "cpu", "--model.projections.q=identity"], "model.projections.q"),  # ... under its other name
    (["study", "verdict", "--train.seed=5"], "train.seed"),
    (["study", "verdict", "--train.max_steps=10"], "train.max_steps"),  # a budget's steps
])
def test_an_override_of_a_field_the_study_sets_per_run_is_refused(byte_data, tmp_path, capsys, argv, field):
    from nlq.cli import main

    for extra in (["--dry-run"], []):
        with pytest.raises(SystemExit) as info:
            main([*argv, "--out", str(tmp_path / "s"), "--data", str(byte_data), *extra])
        err = capsys.readouterr().err.strip()
        assert info.value.code == 2 and len(err.splitlines()) == 1 and f"--{field} would overrule" in err, err
    assert not (tmp_path / "s" / "runs").exists()


def test_an_override_of_a_field_the_study_leaves_alone_is_allowed(byte_data, tmp_path, capsys):
    from nlq.cli import main

    main(["study", "verdict", "--out", str(tmp_path / "s"), "--data", str(byte_data), "--train.device=cpu",
          "--dry-run"])
    assert "device cpu" in capsys.readouterr().out


# ---- Shards that cannot work are refused or give up with a message ---------------------------------------------------

def test_more_shards_than_work_is_refused(byte_data, tmp_path, capsys):
    one_line_error(capsys, ["study", "cpu", "--out", tmp_path / "s", "--data", byte_data, "--shard", "1/1000"],
            "at most 18 shards")
    one_line_error(capsys, ["study", "cpu", "--out", tmp_path / "s", "--data", byte_data, "--shard", ""], "is not K/N")


def test_a_shard_whose_partner_never_starts_or_died_takes_over_its_chains_after_its_own(tmp_path, monkeypatch):
    from nlq.studies.definition.design import Arm, Run

    LINEAR = Arm("linear", {"model": {"query": "linear"}})

    trained = fake_training(monkeypatch)
    study = task_study("lonely", [LINEAR])
    study.stages = lambda study_dir: iter([[Run(study, LINEAR, s, None, TASK, tag="r") for s in range(1, 7)]])
    (tmp_path / "runs" / "r-linear-s4").mkdir(parents=True)  # shard 2/2 died in this run: no lock holds it
    (tmp_path / "study.json").write_text(json.dumps({"name": "lonely"}))  # which it had written before training
    messages = []
    lone = threading.Thread(target=run_study, args=(study, tmp_path), kwargs={"log": messages.append, "shard": (1, 2)},
                            daemon=True)
    lone.start()
    lone.join(timeout=30)
    assert not lone.is_alive(), "the shard still waits for its partner"
    # its own share (seeds 1, 3, 5) in order, then shard 2's, last first, to meet a live owner working forward
    assert [name for _, name, _ in trained] == [f"r-linear-s{s}" for s in (1, 3, 5, 6, 4, 2)]
    assert sum("taking over" in m and "shard 2/2's" in m for m in messages) == 3


@pytest.mark.parametrize("holder", ["a shard (the chain's lock)", "nlq train (the run's lock)"])
def test_a_chain_another_process_holds_is_left_to_it_and_the_stage_waits_for_it(tmp_path, monkeypatch, holder):
    """A chain whose lock, or whose run's lock, another process holds is neither trained nor taken over; the next
    stage starts only once that process has finished it."""
    from nlq.lock import directory_lock
    from nlq.studies.definition.design import Arm, Run
    from nlq.studies.running import study as study_module

    LINEAR = Arm("linear", {"model": {"query": "linear"}})
    from nlq.studies.running.sharding import chain_lock

    trained = fake_training(monkeypatch)
    fake = study_module._train_run

    def locking(config, run_dir):  # as train() does: the run directory's lock for the life of the run
        with directory_lock(run_dir, f"run directory {run_dir}"):
            fake(config, run_dir)

    monkeypatch.setattr(study_module, "_train_run", locking)
    study = task_study("shared", [LINEAR])
    first = [Run(study, LINEAR, s, None, TASK, tag="a") for s in (1, 2, 3)]
    second_started = []

    def stages(study_dir):
        yield first
        second_started.append((study_dir / "runs" / "a-linear-s2" / "summary.json").is_file())
        yield [Run(study, LINEAR, 1, None, TASK, tag="b")]

    study.stages = stages
    held = tmp_path / "runs" / "a-linear-s2"  # "another process" trains seed 2
    other = (chain_lock(tmp_path, held.name) if "chain" in holder else directory_lock(held, "run")).__enter__()
    try:
        worker = threading.Thread(target=run_study, args=(study, tmp_path), kwargs={"log": lambda *_: None},
                                  daemon=True)
        worker.start()
        for _ in range(500):
            if len(trained) == 2:
                break
            worker.join(timeout=0.01)
        assert [name for _, name, _ in trained] == ["a-linear-s1", "a-linear-s3"] and worker.is_alive()
        assert not second_started
        held.mkdir(parents=True, exist_ok=True)  # the other process ends its run, then lets go of it
        (held / "summary.json").write_text(json.dumps({"final_step": first[1].config([], None).train.max_steps,
                                                          "val_loss": 1.0, "tokens_per_s": 1.0}))
    finally:
        other.__exit__(None, None, None)
    worker.join(timeout=30)
    assert not worker.is_alive() and second_started == [True]
    assert [name for _, name, _ in trained] == ["a-linear-s1", "a-linear-s3", "b-linear-s1"]


def test_a_study_whose_data_directory_holds_another_dataset_gives_advice_a_study_can_follow(byte_data, tmp_path):
    """The shard logs used to advise --overwrite, which nlq study does not take."""
    from nlq.errors import UserError
    from nlq.studies.definition.design import DataSpec
    from nlq.studies.running.study import prepare_study_data

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text(json.dumps({"source": "other", "tokenizer": "byte"}))
    study = tiny_study(byte_data)
    study.data = DataSpec("shakespeare", "byte")
    with pytest.raises(UserError) as error:
        prepare_study_data(study, tmp_path, None, log=lambda *_: None)
    assert "--overwrite" not in str(error.value) and "--data DIR, or remove" in str(error.value)

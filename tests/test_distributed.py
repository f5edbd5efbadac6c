"""Data-parallel (DDP) and sharded (FSDP2) training on CPU with the gloo backend, 2 processes under torchrun."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import assert_wrapped_run_matches_plain, tiny_run_config, two_arm_study
from nlq.runs.metrics import read_metrics
from nlq.training.trainer import train

pytestmark = pytest.mark.slow  # every test here starts processes (torchrun, gloo)

TOLERANCE = 1e-4  # relative: the same math, summed in a different order across processes
TINY = ["--model.vocab_size=257", "--model.block_size=32", "--model.n_layer=2", "--model.n_embd=32",
        "--model.n_head=2", "--train.batch_size=4", "--train.batch_tokens=256", "--train.eval_every=3",
        "--data.eval_windows=8", "--train.warmup_steps=2", "--train.lr=3e-3", "--train.min_lr=3e-4"]


def torchrun(*args, script=None, timeout=180):
    target = [script] if script else ["-m", "nlq"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", *target,
               *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def single(data, out, *overrides, resume=False):
    """The same run in one process (global batch 8 x 32 tokens: 2 micro steps of 4)."""
    config = tiny_run_config(data, max_steps=6, batch_size=4, batch_tokens=256, eval_every=3, decay_steps=None)
    from nlq.overrides import apply_overrides

    train(apply_overrides(config, list(overrides)), out, resume=resume, quiet=True)


def curve(run_dir, key="train_loss"):
    return [(r["step"], r[key]) for r in read_metrics(run_dir / "metrics.jsonl") if key in r]


def assert_same_curve(a, b):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert x == pytest.approx(y, rel=TOLERANCE)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one_process(byte_data, tmp_path, strategy):
    result = torchrun("train", "--data", byte_data, "--out", tmp_path / "dist", *TINY, "--train.max_steps=6",
                      f"--dist.strategy={strategy}")
    assert result.returncode == 0, result.stderr[-3000:]
    single(byte_data, tmp_path / "one")
    assert_same_curve(curve(tmp_path / "dist"), curve(tmp_path / "one"))
    assert_same_curve(curve(tmp_path / "dist", "val_loss"), curve(tmp_path / "one", "val_loss"))
    assert "2 proc x 1 accum x 4" in result.stdout


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("flags, field, value", [
    (["--model.attn_gate=elementwise", "--model.qk_norm=true"], "attn_gate", "elementwise"),
    (["--model.attention=differential"], "attention", "differential"),
], ids=["gate", "differential"])
def test_a_gated_or_differential_model_in_two_processes_matches_one_process(byte_data, tmp_path, strategy, flags,
                                                                            field, value):
    """The output gate's W_g (model.attn_gate) and differential attention's lambda vectors under DDP and FSDP2: sharded
    and reduced like any other weight, so two processes train the curve one process trains."""
    result = torchrun("train", "--data", byte_data, "--out", tmp_path / "dist", *TINY, "--train.max_steps=6",
                      f"--dist.strategy={strategy}", *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    single(byte_data, tmp_path / "one", *flags)
    assert json.loads((tmp_path / "dist" / "config.json").read_text())["model"][field] == value
    assert_same_curve(curve(tmp_path / "dist"), curve(tmp_path / "one"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_checkpoint_from_two_processes_resumes_in_one(byte_data, tmp_path, strategy):
    result = torchrun("train", "--data", byte_data, "--out", tmp_path / "run", *TINY, "--train.max_steps=3",
                      "--train.decay_steps=6", f"--dist.strategy={strategy}")
    assert result.returncode == 0, result.stderr[-3000:]
    # the loss of a CPU run on a corpus is PyTorch's chunked linear cross-entropy (train.loss_impl=auto), here under
    # DDP and FSDP2 too
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["loss_impl"] == "chunked"
    single(byte_data, tmp_path / "run", "--train.decay_steps=6", f"--dist.strategy={strategy}", resume=True)
    single(byte_data, tmp_path / "straight", "--train.decay_steps=6", f"--dist.strategy={strategy}")
    assert_same_curve(curve(tmp_path / "run"), curve(tmp_path / "straight"))


HANGING_RANK = textwrap.dedent("""
    import sys, time
    from nlq.training import trainer

    update = trainer.Trainer._update
    def hanging(self, step, done, last_ckpt):
        if self.env.rank == 1 and step == 2:
            time.sleep(600)  # alive but stuck: only the collective timeout can free rank 0
        return update(self, step, done, last_ckpt)
    trainer.Trainer._update = hanging
    from nlq.cli import main
    main(sys.argv[1:])
""")


def test_a_stuck_rank_makes_the_others_fail_after_dist_timeout(byte_data, tmp_path):
    """Two ranks started by hand (no torchrun agent to tear them down): rank 1 hangs, and rank 0 must fail on
    its own once a collective has waited dist.timeout_s, with a message that says so."""
    from helpers import free_port

    script = tmp_path / "hanging.py"
    script.write_text(HANGING_RANK)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    args = [sys.executable, str(script), "train", "--data", str(byte_data), "--out", str(tmp_path / "run"), *TINY,
            "--train.max_steps=50", "--dist.timeout_s=10"]
    ranks = [subprocess.Popen(args, env=env | {"RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        started = time.perf_counter()
        _, stderr = ranks[0].communicate(timeout=120)
        waited = time.perf_counter() - started
    finally:
        for process in ranks:
            process.kill()
    assert ranks[0].returncode != 0
    assert waited < 100  # it did not hang until the test's own timeout
    assert "dist.timeout_s=10" in stderr and "Traceback" not in stderr


def test_study_runs_each_run_under_torchrun(byte_data, tmp_path):
    from nlq.overrides import apply_overrides
    from nlq.studies.running.study import run_study

    config = tiny_run_config(byte_data, max_steps=2, batch_size=4, batch_tokens=256, eval_every=2)
    study = two_arm_study(apply_overrides(config, ["--dist.nproc=2"]), "dist", seeds=[1],
                              description="two variants under torchrun")
    run_study(study, tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    for name in ("linear-s1", "nonlinear-s1"):
        assert '"world": 2' in (tmp_path / "runs" / name / "summary.json").read_text()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_torchrun_with_one_process_wraps_the_model_and_matches_the_plain_run(strategy, byte_data, tmp_path,
                                                                             monkeypatch):
    """torchrun --nproc_per_node=1: a gloo group of one, DDP or FSDP2 around the model, the same curve."""
    from nlq.training import distributed

    wrapped = []
    real_wrap = distributed.wrap
    monkeypatch.setattr(distributed, "wrap", lambda model, env, s: wrapped.append(env) or real_wrap(model, env, s))
    config = tiny_run_config(byte_data, max_steps=4, eval_every=2)
    assert_wrapped_run_matches_plain(config, strategy, "gloo", tmp_path, monkeypatch)
    assert [env.distributed for env in wrapped] == [False, True]


def test_ddp_resume_restores_each_ranks_own_dropout_stream(byte_data, tmp_path):
    """With dropout, each rank draws its own masks; a checkpoint keeps every rank's RNG state, so an interrupted
    2-process run resumed in 2 processes equals the straight run exactly (restoring rank 0's state on every
    rank, as nlq 0.1 did, gives both ranks the same masks and another curve)."""
    common = ["--data", byte_data, *TINY, "--model.dropout=0.2", "--train.decay_steps=6"]
    assert torchrun("train", "--out", tmp_path / "run", *common, "--train.max_steps=3").returncode == 0
    result = torchrun("train", "--out", tmp_path / "run", *common, "--train.max_steps=6", "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert torchrun("train", "--out", tmp_path / "straight", *common, "--train.max_steps=6").returncode == 0
    assert curve(tmp_path / "run") == curve(tmp_path / "straight")

"""Starting shards: --shard auto from a Slurm job array, --shards N processes on one machine."""

import json
import subprocess
import sys

import pytest

from nlq.errors import UserError
from nlq.studies.launch import shard_environment, slurm_shard

TINY = ["--model.vocab_size=257", "--model.block_size=32", "--model.n_layer=1", "--model.n_embd=32",
        "--model.n_head=2", "--train.max_steps=2", "--train.eval_every=2", "--train.batch_size=4",
        "--data.eval_windows=4", "--train.warmup_steps=1"]


@pytest.mark.parametrize("env,expected", [
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, (1, 4)),  # --array=0-3
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "0"}, (4, 4)),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"}, (1, 4)),  # --array=1-4
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4"}, (4, 4)),  # no MIN: 4 of 4 counts from 1
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"}, (1, 2)),  # no MIN: task 0 is the first of 0-1
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MAX": "2"}, (1, 2)),  # 1-2
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MAX": "1"}, (2, 2)),  # 0-1
])
def test_shard_auto_reads_the_slurm_array(env, expected):
    assert slurm_shard(env) == expected


@pytest.mark.parametrize("env", [{}, {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"},
                                 {"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_COUNT": "2",
                                  "SLURM_ARRAY_TASK_MIN": "1"},
                                 {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "2",  # MIN above MAX
                                  "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "2"},
                                 {"SLURM_ARRAY_TASK_ID": "-1", "SLURM_ARRAY_TASK_COUNT": "2"},  # a negative task id
                                 {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "0"}])  # no task at all
def test_shard_auto_outside_an_array_is_one_line(env):
    with pytest.raises(UserError) as error:
        slurm_shard(env)
    assert "\n" not in str(error.value) and "--shard" in str(error.value)


def test_shard_auto_without_the_arrays_first_index_never_deals_one_share_twice():
    """--array=1-2 without SLURM_ARRAY_TASK_MIN: task 1 was once taken for the second of 0-1, so both tasks ran
    shard 2 and shard 1's chains never trained. Every task gets its own share or a one-line refusal."""
    env = {"SLURM_ARRAY_TASK_COUNT": "2"}
    with pytest.raises(UserError, match="SLURM_ARRAY_TASK_MIN and _MAX are not set"):
        slurm_shard(env | {"SLURM_ARRAY_TASK_ID": "1"})
    assert slurm_shard(env | {"SLURM_ARRAY_TASK_ID": "2"}) == (2, 2)


def test_each_shard_gets_its_share_of_threads_and_a_gpu_round_robin(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert shard_environment(1, 2, cpus=16)["OMP_NUM_THREADS"] == "8"
    assert shard_environment(3, 4, cpus=2)["OMP_NUM_THREADS"] == "1"
    assert shard_environment(2, 8, cpus=16, gpus=8)["CUDA_VISIBLE_DEVICES"] == "1"  # one device each
    assert shard_environment(5, 14, cpus=16, gpus=1)["CUDA_VISIBLE_DEVICES"] == "0"  # 14 processes on one device
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert "CUDA_VISIBLE_DEVICES" not in shard_environment(1, 2, cpus=2, gpus=0)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user: kept
    assert shard_environment(1, 2, cpus=16)["OMP_NUM_THREADS"] == "3"


@pytest.mark.slow
def test_shards_n_runs_the_whole_study_in_n_processes_and_reports(byte_data, tmp_path):
    out = tmp_path / "s"
    result = subprocess.run([sys.executable, "-m", "nlq", "study", "encoder", "--out", str(out), "--data",
                             str(byte_data),
                             "--shards", "2", *TINY, "--model.vocab_size=258"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    logs = sorted(p.name for p in out.glob("shard-*.log"))
    assert logs == ["shard-1-of-2.log", "shard-2-of-2.log"]
    described = json.loads((out / "study.json").read_text())
    assert all((out / "runs" / r["name"] / "summary.json").is_file() for r in described["runs"])
    assert "| identity | " in (out / "report.md").read_text()
    trained = [line for k in (1, 2) for line in (out / f"shard-{k}-of-2.log").read_text().splitlines()
               if "val loss" in line]
    assert len(trained) == len(described["runs"])  # each run trained once, by one of the two shards


def test_shards_dry_run_lists_every_shard_and_auto_takes_the_array(byte_data, tmp_path, capsys, monkeypatch):
    from nlq.cli import main

    main(["study", "verdict", "--out", str(tmp_path / "v"), "--data", str(byte_data), "--shards", "3", "--dry-run"])
    out = capsys.readouterr().out
    assert all(f"shard {k}/3" in out for k in (1, 2, 3)) and not (tmp_path / "v").exists()
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    main(["study", "verdict", "--out", str(tmp_path / "v"), "--data", str(byte_data), "--shard", "auto", "--dry-run"])
    assert "shard 2/3" in capsys.readouterr().out

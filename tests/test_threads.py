"""CPU threads: chosen by the step's size and the machine's load unless set (train.threads, OMP_NUM_THREADS), and
recorded in the run's summary."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import train_small
from nlq.config import ConfigError, update
from nlq.presets import get_preset
from nlq.training.hardware import SMALL_STEP_FLOPS, busy_elsewhere, choose_threads, set_threads


def test_threads_follow_the_request_then_the_steps_size_then_the_free_cores():
    big = 10 * SMALL_STEP_FLOPS
    assert choose_threads(3, big, cores=2, busy=2.0) == 3  # asked for: exactly that
    assert choose_threads(0, SMALL_STEP_FLOPS / 2, cores=16, busy=0.0) == 1  # too little work to share
    assert choose_threads(0, big, cores=2, busy=0.0) == 2  # an idle machine: every core
    assert choose_threads(0, big, cores=2, busy=1.0) == 1  # one core kept busy by another job
    assert choose_threads(0, big, cores=2, busy=5.0) == 1  # never fewer than one
    assert choose_threads(0, big, cores=16, busy=3.0) == 13
    assert choose_threads(0, big, cores=16, busy=0.0, processes=4) == 4  # torchrun: a share per process


def test_the_load_is_read_from_the_runnable_tasks_less_this_process(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.50 0.40 0.30 3/211 12345\n")
    assert busy_elsewhere(samples=3, interval_s=0.0, loadavg=loadavg) == 2.0
    assert busy_elsewhere(loadavg=tmp_path / "missing") == 0.0  # no /proc: assume an idle machine


def test_train_threads_and_omp_num_threads_decide_and_bad_values_are_refused(monkeypatch):
    before = torch.get_num_threads()
    try:
        config = update(get_preset("nano"), {"train": {"threads": 2}})
        assert set_threads(config) == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        assert set_threads(get_preset("micro")) == 1  # the user's OMP_NUM_THREADS is kept
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="train.threads=-1 must be >= 0"):
        update(get_preset("nano"), {"train": {"threads": -1}})


def test_a_busy_core_leaves_a_large_step_one_thread(tmp_path):
    """A fresh process without OMP_NUM_THREADS, beside a process that keeps one core busy, picks one thread fewer
    than the cores it has (one at least)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        code = ("from nlq.training.hardware import busy_elsewhere, cpu_cores; "
                "print(busy_elsewhere(samples=15), cpu_cores())")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        busy_now, cores = out.stdout.split()
        assert float(busy_now) >= 1.0
        assert choose_threads(0, 10 * SMALL_STEP_FLOPS, int(cores), float(busy_now)) <= max(1, int(cores) - 1)
    finally:
        busy.kill()
        busy.wait()


def test_a_run_records_its_threads(byte_data, tmp_path):
    run = train_small(byte_data, tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["threads"] == int(os.environ["OMP_NUM_THREADS"])

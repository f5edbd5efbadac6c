"""Starting a study's shards: `--shards N` (N processes on this machine, each `--shard K/N`) and `--shard auto`
(the index and count of a Slurm job array). The shards themselves are plain `nlq study ... --shard K/N` processes
that share the study directory (sharding.py deals them whole chains; study.py runs a shard's share, takes
over the chains nobody trains, and waits at the end of a stage)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nlq.errors import UserError


def study_command(name: str, out: str, data: str | None, overrides: list[str], shard: str | None,
                  shards: int | None, dry_run: bool) -> None:
    """`nlq study NAME|PLAN --out OUT [--data DATA] [--shard K/N|auto | --shards N] [--dry-run] [overrides]`."""
    from nlq.studies.definition.plan_explore import Exploration
    from nlq.studies.registry import build_report, get_study
    from nlq.studies.running.dry_run import dry_run_text
    from nlq.studies.running.plan_costs import arms_text, bounds_text, exploration_text, power_text, shared_start_text
    from nlq.studies.running.sharding import parse_shard
    from nlq.studies.running.study import run_study

    study = get_study(name)
    if shards is not None and shard is not None:
        raise UserError("give --shards N (start N shard processes here) or --shard K/N (be one of them), not both")
    if shards is not None and not dry_run:  # this process starts the shards, then writes the report
        dry_run_text(study, out, overrides, data_dir=data)  # what a shard would refuse is refused here, first
        run_shards(["study", name, "--out", str(out), *(["--data", str(data)] if data else []), *overrides], shards,
                   Path(out))
    else:
        chosen = [(k, shards) for k in range(1, shards + 1)] if shards else [None]
        if shard is not None:
            chosen = [slurm_shard() if shard == "auto" else parse_shard(shard)]
        if dry_run:
            for one in chosen:
                print(dry_run_text(study, out, overrides, data_dir=data, shard=one))
            if isinstance(study.design, Exploration):
                print(exploration_text(study, Path(out), shards or 1))
            elif study.plan is not None:
                print(arms_text(study))
                print(shared_start_text(study))
                print(bounds_text(study, Path(out), shards or 1))
                print(power_text(study.design))
            return
        run_study(study, out, overrides, data_dir=data, shard=chosen[0])
    build_report(out)
    print(f"report: {out}/report.md")


def slurm_shard(env: dict | None = None) -> tuple[int, int]:
    """(K, N) from a Slurm job array (sbatch --array=0-3 or 1-4: K counts from 1 whatever the first index is). The
    first index is SLURM_ARRAY_TASK_MIN, else SLURM_ARRAY_TASK_MAX - N + 1; without either, only task 0 (an array
    from 0) and task N (one from 1) say which share they are, and any other task is refused: guessing made tasks 1
    and 2 of --array=1-2 the same shard."""
    env = os.environ if env is None else env
    try:
        task, count = int(env["SLURM_ARRAY_TASK_ID"]), int(env["SLURM_ARRAY_TASK_COUNT"])
        first = (int(env["SLURM_ARRAY_TASK_MIN"]) if "SLURM_ARRAY_TASK_MIN" in env
                 else int(env["SLURM_ARRAY_TASK_MAX"]) - count + 1 if "SLURM_ARRAY_TASK_MAX" in env
                 else {0: 0, count: 1}.get(task))
    except (KeyError, ValueError):
        raise UserError("--shard auto reads SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, which are not set (or "
                        "not numbers): submit the study as a job array (sbatch --array=1-N), "
                        "or give --shard K/N") from None
    if count < 1 or task < 0 or (first is not None and first < 0):
        raise UserError(f"--shard auto: SLURM_ARRAY_TASK_COUNT={count}, SLURM_ARRAY_TASK_ID={task}: a job array has at "
                        f"least one task and task ids from 0; submit it with sbatch --array=1-N (N >= 1)")
    if "SLURM_ARRAY_TASK_MIN" in env and "SLURM_ARRAY_TASK_MAX" in env and first > int(env["SLURM_ARRAY_TASK_MAX"]):
        raise UserError(f"--shard auto: SLURM_ARRAY_TASK_MIN={first} is above SLURM_ARRAY_TASK_MAX="
                        f"{env['SLURM_ARRAY_TASK_MAX']}; these are not a job array's")
    if first is None:
        raise UserError(f"--shard auto: array task {task} of {count}, but SLURM_ARRAY_TASK_MIN and _MAX are not set, "
                        f"so its share cannot be told (the array may start at 0 or at 1); give --shard K/N, e.g. "
                        f"--shard $((SLURM_ARRAY_TASK_ID - FIRST + 1))/{count}")
    k = task - first + 1
    if not 1 <= k <= count:
        raise UserError(f"--shard auto: array task {task} (first {first}) is not one of {count} tasks; use a "
                        f"contiguous array such as --array=1-{count}")
    return k, count


def shard_environment(k: int, n: int, cpus: int | None = None, gpus: int = 0) -> dict:
    """The environment of shard k of n on this machine: an equal share of the CPU threads (unless OMP_NUM_THREADS
    is set), and with GPUs one device each, round-robin (n > gpus: several shards share a device)."""
    env = dict(os.environ)
    cpus = cpus or os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // n)))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = str((k - 1) % gpus)
    return env


def run_shards(argv: list[str], n: int, out_dir: Path, log=print, gpus: int | None = None) -> None:
    """Start `nlq <argv> --shard K/N` for K = 1..N as child processes, each writing OUT/shard-K-of-N.log, and wait
    for all; a shard that fails is named with its log (the others keep their finished runs)."""
    if n < 1:
        raise UserError(f"--shards {n}: give a number of processes >= 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    if gpus is None:
        gpus = _cuda_devices()
    children = []
    for k in range(1, n + 1):
        path = out_dir / f"shard-{k}-of-{n}.log"
        command = [sys.executable, "-m", "nlq", *argv, "--shard", f"{k}/{n}"]
        with path.open("ab") as out:
            children.append((k, path, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                       env=shard_environment(k, n, gpus=gpus))))
    log(f"started {n} shards ({', '.join(str(c[2].pid) for c in children)}); logs: {out_dir}/shard-K-of-{n}.log")
    try:
        while any(child.poll() is None for _, _, child in children):
            time.sleep(2.0)
    except KeyboardInterrupt:
        for _, _, child in children:
            child.terminate()
        raise
    failed = [(k, path) for k, path, child in children if child.returncode != 0]
    if failed:
        names = ", ".join(f"{k}/{n} ({path})" for k, path in failed)
        raise UserError(f"shard(s) {names} failed; see the log; finished runs are kept, start the same command again "
                        f"to resume")


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0

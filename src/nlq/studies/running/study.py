"""The runner of every study: a plan's Study (design.py; engine.plan_study builds it) stage by stage, every run of a
seed on the identical batch plan. Each run lives in its own run directory under STUDY_DIR/runs; starting a study again
skips finished runs and resumes unfinished ones from their last checkpoint. N processes can share a study
(run_study(shard=(k, n))); frozen.py holds what a started study directory refuses.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from nlq.config import RunConfig
from nlq.data.labelled import KIND as LABELLED
from nlq.data.labelled import is_labelled, prepare_labelled
from nlq.data.shards import prepare, read_meta
from nlq.errors import Diverged, LockHeld, UserError
from nlq.fileio import read_json, write_json
from nlq.provenance import code_versions
from nlq.runs import checkpoint as ckpt
from nlq.runs.rundir import DIVERGED, run_diverged, run_ended, run_finished, save_config, write_diverged
from nlq.studies.definition.design import Run, Study, plan_hash
from nlq.studies.running import frozen
from nlq.studies.running.sharding import chain_claimed, chain_lock, parse_shard, shard_indices  # noqa: F401 (parse_shard, for callers)
from nlq.training.trainer import train

# ---- running ---------------------------------------------------------------------------------------

def prepare_study_data(study: Study, study_dir: Path, data_dir: str | None, log=print,
                       wait_for_others: bool = False) -> Path | None:
    """The study's data directory, prepared under study_dir/data unless data_dir is given. Shards
    (wait_for_others) all call this: one prepares, the others wait for its lock and then find it ready."""
    if data_dir:
        read_meta(data_dir)  # a prepared directory, or a one-line error before any run starts
        return Path(data_dir)
    if study.data.source == "task":  # synthetic tasks are generated on the fly: nothing to prepare
        return None
    out = study_dir / "data"
    while True:
        try:
            if is_labelled(study.data.source):  # a classifier's examples, generated offline
                prepare_labelled(study.data.source, out, log=log)
            else:
                prepare(study.data.source, study.data.tokenizer, out, val_fraction=study.data.val_fraction, log=log,
                        advice=f"give the study a prepared directory with --data DIR, or remove {out} to prepare "
                               "it again")
            return out
        except LockHeld:
            if not wait_for_others:
                raise
            log(f"{out} is being prepared by another shard; waiting")
            time.sleep(WAIT_POLL_S)


def run_study(study: Study, study_dir: str | Path, overrides: list[str] | None = None, data_dir: str | None = None,
              log=print, shard: tuple[int, int] | None = None) -> list[Path]:
    """Run (or continue) every run of the study, stage by stage; returns the run directories.

    shard=(k, n): this process runs the k-th of n shares of every stage (whole groups, round-robin), so n
    processes (e.g. one thread each) share a study directory. Every process trains a chain under the chain's lock;
    one that has finished its share takes over the chains nobody is training (a slower or dead shard's, last
    first), then waits for the rest of the stage, since a later stage may depend on all of it."""
    study_dir = Path(study_dir)
    overrides = overrides or []
    claimed = frozen.claim(study, study_dir, overrides, data_dir, shard)
    try:
        data = prepare_study_data(study, study_dir, data_dir, log, wait_for_others=shard is not None)
    except BaseException:
        frozen.release(study_dir, claimed)  # no run has started: the directory is not frozen to this study
        raise
    done_dirs, started, recorded = [], time.perf_counter(), []
    stamp = {"plan_hash": plan_hash(study.plan)} if study.plan is not None else {}  # into every run's record
    for number, stage in enumerate(study.run_stages(study_dir), start=1):
        frozen.check_overrides(study, stage, overrides)
        configs = [r.config(overrides, data) for r in stage]  # validate every run before the first starts
        recorded += [r.record(c.train.lr) for r, c in zip(stage, configs)]
        own = frozen.frozen_own_code(study_dir, [c.model for c in configs])  # the user's own projections, by hash
        described = study.describe() | {"overrides": overrides, "data_dir": str(Path(data).resolve()) if data else None,
                                        "data_meta": _data_meta(data) if data else None,
                                        "code": code_versions(study_dir / "study.json"), "runs": recorded}
        looks = study_dir / "sequential.json"  # a sequential test's looks so far (engine.record_look)
        if looks.is_file():
            described["sequential"] = read_json(looks, "the sequential test's record")["looks"]
        write_json(study_dir / "study.json", described | ({"projections": own} if own else {}))
        mine = shard_indices(stage, *shard) if shard else list(range(len(stage)))
        done_dirs += _run_stage([stage[i] for i in mine], [configs[i] for i in mine], study_dir, log, stamp)
        done_dirs += _finish_stage(stage, configs, study_dir, shard, log, stamp)
    log(f"study {study.name}: {len(recorded)} runs in {study_dir} ({(time.perf_counter() - started) / 60:.1f} min)")
    return done_dirs


WAIT_POLL_S = 20.0  # how often a process that has done all it can of a stage looks again


def _finish_stage(runs: list[Run], configs: list[RunConfig], study_dir: Path, shard: tuple[int, int] | None, log,
                  stamp: dict) -> list[Path]:
    """After its own share: take over every chain of the stage that no process is training (another shard's not
    yet started, or left by a process that died), last first so as to meet its owner working forward; then wait
    while other processes finish the chains they hold, since a later stage may depend on all of this one."""
    me = f"shard {shard[0]}/{shard[1]}" if shard else "this process"
    owner = {runs[i].name: k for k in range(1, shard[1] + 1) for i in shard_indices(runs, k, shard[1])} if shard else {}
    done_dirs, waited, announced = [], 0.0, set()
    while True:
        pending = [i for i, (r, c) in enumerate(zip(runs, configs))
                   if not run_ended(study_dir / "runs" / r.name, c.train.max_steps)]
        if not pending:
            return done_dirs
        for chain in reversed(list(dict.fromkeys(runs[i].chain for i in pending))):
            left = [i for i in pending if runs[i].chain == chain]
            if chain_claimed(study_dir, chain):
                continue
            if chain not in announced:
                dealt = f"shard {owner[runs[left[0]].name]}/{shard[1]}'s" if shard else "left unfinished"
                log(f"{me}: taking over {chain} ({dealt}, not being trained)")
                announced.add(chain)
            done_dirs += _run_stage([runs[i] for i in left], [configs[i] for i in left], study_dir, log, stamp)
        unended = [runs[i].name for i in pending if not run_ended(study_dir / "runs" / runs[i].name,
                                                                    configs[i].train.max_steps)]
        if not unended:
            continue  # look again: the stage may be done
        if waited == 0 or waited // 600 != (waited - WAIT_POLL_S) // 600:  # at the start, then every 10 minutes
            log(f"{me}: waiting for other processes to finish the runs they are training (e.g. {unended[0]}) "
                f"before the next stage")
        time.sleep(WAIT_POLL_S)
        waited += WAIT_POLL_S


def _data_meta(data_dir: Path) -> dict:
    """What ties a study's results to its corpus: source (with versions), tokenizer, content hash, tokens."""
    meta = read_meta(data_dir)
    if meta.get("kind") == LABELLED:  # labelled examples: named by their content hash
        return {k: meta.get(k) for k in ("source", "content_hash", "splits", "classes")}
    return {k: meta.get(k) for k in ("source", "tokenizer", "source_hash", "splits")}


def steps_to_train(run_dir: Path, config: RunConfig) -> int:
    """Steps a run still has to train: from its own latest checkpoint, or from the checkpoint it branches from."""
    if run_finished(run_dir, config.train.max_steps):
        return 0
    start = ckpt.latest_checkpoint(run_dir) or (config.train.resume_from and Path(config.train.resume_from))
    return config.train.max_steps - (ckpt.step_of(start) if start else 0)


def _run_stage(runs: list[Run], configs: list[RunConfig], study_dir: Path, log, stamp: dict) -> list[Path]:
    """Train the runs not finished (or diverged) yet, in order, each chain under its lock (a chain that another
    process holds is left to it); each finished run's summary record gets the stamp (a plan's hash), so that a run
    directory says which plan it belongs to."""
    done_dirs, seconds, steps_done = [], 0.0, 0
    diverged_chains = {}  # chain -> the run of it that diverged: the chain's later runs cannot start
    held, elsewhere = {}, set()  # chain -> its lock while this process trains it; chains another process holds
    last = {r.chain: i for i, r in enumerate(runs)}  # a chain's lock is let go after its last run here
    steps_left = [steps_to_train(study_dir / "runs" / r.name, c) for r, c in zip(runs, configs)]
    try:
        for index, (run, config) in enumerate(zip(runs, configs), start=1):
            run_dir, tag = study_dir / "runs" / run.name, f"[{index}/{len(runs)}] {run.name}"
            if run.chain in elsewhere:
                continue
            if run.chain not in held and not run_ended(run_dir, config.train.max_steps):
                try:
                    held[run.chain] = chain_lock(study_dir, run.chain).__enter__()
                except LockHeld:
                    elsewhere.add(run.chain)
                    log(f"{tag}: another process is training its chain; left to it")
                    continue
            done_dirs.append(run_dir)
            eta = f", stage ETA {seconds / steps_done * sum(steps_left[index - 1:]) / 60:.1f} min" if steps_done else ""
            try:
                took = _train_unless_ended(run, config, run_dir, tag, eta, diverged_chains, log, stamp)
                if took is not None:
                    seconds, steps_done = seconds + took, steps_done + steps_left[index - 1]
            except LockHeld:  # the run itself is locked: a process that takes no chain locks (nlq train) has it
                elsewhere.add(run.chain)
                done_dirs.pop()
                log(f"{tag}: another process is training this run; its chain is left to it")
            finally:
                if last[run.chain] == index - 1 and run.chain in held:
                    held.pop(run.chain).__exit__(None, None, None)
    finally:
        for lock in held.values():
            lock.__exit__(None, None, None)
    return done_dirs


def _train_unless_ended(run: Run, config: RunConfig, run_dir: Path, tag: str, eta: str, diverged_chains: dict,
                        log, stamp: dict) -> float | None:
    """Train one run unless it has finished or diverged (or continues a diverged run of its chain); the seconds it
    trained, None where it did not train to the end."""
    frozen.check_run_config(run_dir, config)  # a run directory that holds another config is never trained into
    if run_finished(run_dir, config.train.max_steps):
        log(f"{tag}: finished earlier, skipped")
        return None
    if run_diverged(run_dir) or run.chain in diverged_chains:
        if not run_diverged(run_dir):
            write_diverged(run_dir, run.name, f"{diverged_chains[run.chain]}, which it continues, diverged")
        if run.name == run.chain:  # a diverged stable run ends its chain; a diverged branch only itself
            diverged_chains.setdefault(run.chain, run.name)
        log(f"{tag}: diverged (see {run_dir / DIVERGED}), skipped")
        return None
    log(f"{tag}: {run.arm.note or run.arm.name}{eta}")
    run_start = time.perf_counter()
    try:
        _train_run(config, run_dir)
    except Diverged as e:  # recorded, and the study goes on: a report counts the run as diverged
        write_diverged(run_dir, run.name, str(e))
        if run.name == run.chain:
            diverged_chains[run.chain] = run.name
        log(f"{tag}: diverged: {e}")
        return None
    summary = read_json(run_dir / "summary.json", "a run summary")
    if stamp:
        summary["record"] = (summary.get("record") or {}) | stamp
        write_json(run_dir / "summary.json", summary)
    took = time.perf_counter() - run_start
    log(f"{tag}: val loss {summary['val_loss']:.4f} ({summary['tokens_per_s']:,.0f} tok/s, {took:.0f}s)")
    return took


def _train_run(config: RunConfig, run_dir: Path) -> None:
    nproc = config.dist.nproc
    if nproc == 1:
        train(config, run_dir, resume=True, quiet=True)
        return
    # several processes per run: torchrun, with the run's config in a file beside it
    run_dir.mkdir(parents=True, exist_ok=True)
    request = run_dir / "requested_config.json"
    save_config(config, request)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
               "-m", "nlq", "train", "--out", str(run_dir), "--config", str(request), "--resume"]
    result = subprocess.run(command)
    if result.returncode != 0:
        raise UserError(f"run {run_dir.name} failed under torchrun (exit {result.returncode}); see its output above")

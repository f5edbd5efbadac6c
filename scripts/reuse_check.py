"""Retrain chains of a committed plan study at the current code and compare them with the committed runs: may a new
plan pair its arms against that study's runs (`borrow` in a plan's [[arms]]) instead of training them again?

    python scripts/reuse_check.py results/verdict-lr linear-qknorm:0.008:211 --out DIR --data DATA_DIR

Each ARM:LR:SEED names one WSD chain of the study's plan (its stable run and its budgets' branches). They are trained
into DIR/runs exactly as the study trains them (one thread), then every number of every committed run's metrics.jsonl
line (timings aside) and summary.json is compared with the retrained run's. DIR/reuse_check.json records the chains
and per run the commit it was retrained at and the largest absolute difference (0.0: bitwise equal). Started again,
it skips finished runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from nlq.errors import UserError
from nlq.fileio import read_json, write_json
from nlq.studies.definition.plan import read_plan
from nlq.studies.running.engine import chains, plan_study
from nlq.studies.running.study import _run_stage

TIMINGS = {"tokens_per_s", "record", "mfu", "step_ms", "elapsed_s", "threads"}  # what the machine decides


def numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """Every number of a JSON record (nested keys dotted), timings left out."""
    out = {}
    for key, value in record.items():
        if key in TIMINGS:
            continue
        if isinstance(value, dict):
            out |= numbers(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix + key] = float(value)
    return out


def largest_difference(committed: Path, retrained: Path) -> float:
    """The largest absolute difference between a committed run's numbers and a retrained one's: every line of the
    committed metrics.jsonl (thinned by `nlq report --collect` to its evaluations and every 100th step) against the
    retrained line of the same step and kind (training, evaluation, diagnostics), and summary.json; inf where the
    retrained run lacks a line or a number the committed one has (numbers nlq records since, such as the
    diagnostics and the transition step, are not compared: the committed run has none to compare them with)."""
    def kind(row: dict) -> str:
        return "val" if "val_loss" in row else "diagnostics" if "prefix_matching_max" in row else "train"

    def lines(run: Path) -> dict[tuple, dict]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return {(row["step"], kind(row)): row for row in rows}

    kept, retrained_lines = lines(committed), lines(retrained)
    if not set(kept) <= set(retrained_lines):
        return math.inf
    pairs = [(row, retrained_lines[key]) for key, row in kept.items()]
    pairs.append((read_json(committed / "summary.json", "a run summary"),
                  read_json(retrained / "summary.json", "a run summary")))
    worst = 0.0
    for x, y in pairs:
        nx, ny = numbers(x), numbers(y)
        if not set(nx) <= set(ny):
            return math.inf
        worst = max([worst] + [abs(nx[k] - ny[k]) for k in nx])
    return worst


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", help="a committed plan study directory (its study.json and runs/)")
    parser.add_argument("chains", nargs="+", help="ARM:LR:SEED, e.g. linear-qknorm:0.008:211")
    parser.add_argument("--out", required=True, help="where to retrain them (runs/ and reuse_check.json)")
    parser.add_argument("--data", required=True, help="the prepared data (nlq prepare), the study's corpus")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # as the study's shards train: nlq's trainer keeps what the user set ...
    torch.set_num_threads(1)  # ... and would otherwise choose by the load (2 threads sum in another order)
    source, out = Path(args.study), Path(args.out)
    described = read_json(source / "study.json", "the study's description")
    study = plan_study(read_plan(described["plan"], str(source / "study.json")))
    meta = read_json(Path(args.data) / "meta.json", "the data's description")
    key = "source_hash" if "source_hash" in meta else "content_hash"  # a text corpus, or labelled examples
    theirs = (described.get("data_meta") or {}).get(key)
    if meta.get(key) != theirs:
        raise UserError(f"{args.data} holds other data than {source} trained on ({key} {str(meta.get(key))[:16]}, not "
                        f"{str(theirs)[:16]})")
    results = []
    for spec in args.chains:
        arm, lr, seed = spec.split(":")
        runs = chains(study, out, [int(seed)], {arm: [float(lr)]})
        configs = [r.config([], Path(args.data)) for r in runs]
        _run_stage(runs, configs, out, print, {})
        for run in runs:
            worst = largest_difference(source / "runs" / run.name, out / "runs" / run.name)
            summary = read_json(out / "runs" / run.name / "summary.json", "a run summary")
            code = (summary.get("record") or {}).get("code")
            results.append({"run": run.name, "code": code, "largest_difference": worst, "bitwise": worst == 0.0})
            print(f"{run.name}: largest difference {worst:g}" + (" (bitwise equal)" if worst == 0.0 else ""))
    report = {"study": described["name"], "committed_code": described["code"], "chains": args.chains,
              "runs": results}
    write_json(out / "reuse_check.json", report)
    return report


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        sys.exit(f"error: {e}")

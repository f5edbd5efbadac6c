"""Reading a study from disk (study.json, each run's summary.json and metrics.jsonl) and writing its tables:
what every report shares."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nlq.errors import UserError
from nlq.fileio import atomic_write, read_json, write_json
from nlq.runs.metrics import read_metrics
from nlq.studies.inference.selection import lowest


@dataclass
class RunResult:
    name: str
    arm: str
    seed: int
    lr: float
    params: int
    val_loss: float
    val_bpb: float
    tokens_per_s: float
    curve: list[tuple[int, float]]  # (step, val loss)
    val_acc: float | None = None  # next-token or masked-token accuracy


NUMBERS = ("val_loss", "full_val_loss", "val_bpb", "val_acc", "tokens_per_s", "non_embedding_parameters", "tokens")


def read_summary(path: Path) -> dict:
    """A run's summary.json, its numbers checked: a one-line error names a field that holds no number."""
    summary = read_json(path, "a run summary; run nlq study again to finish that run")
    for key in NUMBERS:
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"{path}: {key} is {value!r}, not a number; the file was not written by nlq (or was "
                            f"edited); delete it and run nlq study again to redo that run")
    return summary


def load_results(study_dir: Path, study: dict) -> list[RunResult]:
    """Each finished run of the study as a RunResult with its val-loss curve (load_summaries, the one reader of a
    study's runs, then the curve from metrics.jsonl)."""
    results = []
    for run in load_summaries(study_dir, study):
        run_dir = Path(run.get("dir") or study_dir / "runs" / run["name"])
        curve = [(r["step"], r["val_loss"]) for r in read_metrics(run_dir / "metrics.jsonl") if "val_loss" in r]
        results.append(RunResult(run["name"], run["arm"], run["seed"], run["lr"],
                                 run.get("non_embedding_parameters") or 0,  # a damaged summary: shown as n/a
                                 run["val_loss"], run.get("val_bpb") or math.nan,
                                 run.get("tokens_per_s") or math.nan, curve, run.get("val_acc")))
    if not results:
        raise UserError(f"{study_dir} has no finished runs yet; run nlq study first")
    return results


def load_summaries(study_dir: Path, study: dict) -> list[dict]:
    """Each finished run of study.json (its labels) joined with its summary.json; unfinished runs left out. A record
    with "dir" (an arm borrowed from another study) is read from there."""
    found = {}
    for run in study.get("runs", []):
        path = Path(run.get("dir") or study_dir / "runs" / run["name"]) / "summary.json"
        if path.is_file():
            summary = read_summary(path)
            if summary.get("val_loss") is not None:
                found[run["name"]] = {**summary, **run}
    return list(found.values())


def best_lr(results: list[RunResult]) -> dict[str, float]:
    """Each arm's peak lr with the lowest mean val loss (selection.lowest: a tie goes to the lower lr, an lr with
    a non-finite loss is out)."""
    by = {}
    for r in results:
        by.setdefault(r.arm, {}).setdefault(r.lr, []).append(r.val_loss)
    return {v: lowest({lr: float(np.mean(x)) if np.isfinite(x).all() else None for lr, x in lrs.items()})
            for v, lrs in by.items()}


# results.csv and the report tables keep the column name the committed studies were written with: a run's arm is
# "variant" there.
CSV_COLUMNS = {"arm": "variant"}


def write_runs_csv(path: Path, runs: list[dict], keys: list[str]) -> None:
    """One row per run (a dict of its labels and summary), the given columns (named as CSV_COLUMNS says)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([CSV_COLUMNS.get(k, k) for k in keys])
    for r in runs:
        writer.writerow([r.get(k) for k in keys])
    atomic_write(path, buffer.getvalue())


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """A Markdown table as report lines: the header, its rule, a line per row (cells as given, as text; None is a
    cell left blank, "| |", as the probes tables were written)."""
    def line(cells: list) -> str:
        return "|" + "".join(" |" if cell is None else f" {cell} |" for cell in cells)

    return [line(header), "|" + "---|" * len(header)] + [line(row) for row in rows]


def interval_text(p: dict, digits: int = 4) -> str:
    """[low, high] of a paired difference, or n/a without an interval (one seed)."""
    return f"[{p['low']:+,.{digits}f}, {p['high']:+,.{digits}f}]" if not math.isnan(p["low"]) else "n/a"


def json_safe(value):
    """value with every non-finite float (an undefined sd, the interval of one seed) as None: valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return json_safe(value.item())
    return value


def write_result(path: Path, result: dict) -> None:
    """A report's numbers as one JSON object (result.json beside report.md): what tests and scripts read, instead
    of parsing the Markdown."""
    write_json(path, json_safe(result))


def tokens_text(tokens: float) -> str:
    """A count of tokens in the unit that fits: 4.70G, 12.3M, 45.1k, 950."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.2f}{unit}" if unit == "G" else f"{tokens / scale:.1f}{unit}"
    return f"{tokens:,.0f}"


def duration_text(hours: float) -> str:
    """Hours where there are some, else minutes (at least 1), else seconds."""
    if hours >= 1:
        return f"{hours:.1f} h"
    return f"{max(1.0, hours * 60):.0f} min" if hours * 60 >= 0.5 else f"{hours * 3600:.0f} s"

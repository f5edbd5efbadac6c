"""Copy a study's small files into the repository (results/NAME), enough for `nlq report` to regenerate its
report from them: study.json, report.md, results.csv, plots, and per finished run config.json, summary.json
and metrics.jsonl thinned to its evaluations and diagnostics plus every `every`-th training step. No checkpoints
or weights, so a WSD chain's stable run is copied only once its budget branches have all finished: a study resumed
from the copy could not branch them from it, and trains the whole chain again instead. No absolute path of the
machine either: configs and study.json name data and checkpoints relatively (runs/paths.py).

    nlq report STUDY_DIR --collect results/NAME     (copies, then writes the report there)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import read_json
from nlq.runs.paths import scrubbed_text
from nlq.studies.definition.design import read_study, upgraded_study


def thin(source: Path, every: int) -> str:
    keep = []
    for line in source.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the last line of a run that is writing it
            continue
        if any(k.startswith("val_") for k in row) or "prefix_matching_max" in row or row.get("step", 0) % every == 0:
            keep.append(line)
    return "\n".join(keep) + "\n"


def branch_sources(study_dir: Path) -> set[str]:
    """The stable runs (study.json's stage "stable") of the WSD chains whose budget branches have not all finished:
    their checkpoints are still needed."""
    path = study_dir / "study.json"
    runs = upgraded_study(read_json(path, "the study's description")).get("runs", []) if path.is_file() else []

    def chain(r: dict):  # study.json names a run's chain; studies recorded before it did, by its arm, seed, lr, width
        if r.get("stage") == "stable" and "chain" not in r and any("chain" in other for other in runs):
            return r["name"]
        return r.get("chain") or (r.get("arm"), r.get("seed"), r.get("lr"), r.get("width"))

    open_chains = {chain(r) for r in runs if r.get("stage") == "budget"
                   and not (study_dir / "runs" / r["name"] / "summary.json").is_file()}
    return {r["name"] for r in runs if r.get("stage") == "stable" and chain(r) in open_chains}


def check_target(study_dir: Path, out: Path) -> None:
    """OUT must be new, empty, or a copy of this same study: never the study itself, a run, or another study."""
    if out.resolve() == study_dir.resolve():
        raise UserError(f"--collect {out} is the study directory itself; give the copy another directory, e.g. "
                        f"results/NAME")
    if (out / "config.json").is_file() or (out / "checkpoints").is_dir():
        raise UserError(f"--collect {out} is a run directory; give the study's copy a directory of its own")
    theirs = out / "study.json"
    if theirs.is_file():
        name = read_json(theirs, "the study's description").get("name")
        ours = read_json(study_dir / "study.json", "the study's description").get("name")
        if name != ours:
            raise UserError(f"--collect {out} holds study {name!r}, not {ours!r}; give the copy a directory of its own")


def collect(study_dir: Path, out: Path, every: int = 100) -> int:
    """Copy the study's small files and its finished runs into out; return how many runs were copied. A plan study
    whose record does not hold (design.read_study: edited after its runs trained) is refused before anything is
    copied."""
    check_target(study_dir, out)
    read_study(study_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in study_dir.iterdir():
        if path.is_file() and path.suffix in (".json", ".md", ".csv", ".png") and not path.name.startswith(".") \
                and path.name != "study.json":
            shutil.copy2(path, out / path.name)
    (out / "study.json").write_text(scrubbed_text((study_dir / "study.json").read_text()))  # no absolute path
    copied, waiting = 0, branch_sources(study_dir)
    for run in sorted((study_dir / "runs").iterdir()):
        if not (run / "summary.json").is_file() or run.name in waiting:
            continue
        target = out / "runs" / run.name
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run / "summary.json", target / "summary.json")
        (target / "config.json").write_text(scrubbed_text((run / "config.json").read_text()))
        (target / "metrics.jsonl").write_text(thin(run / "metrics.jsonl", every))
        copied += 1
    return copied

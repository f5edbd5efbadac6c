"""Copy a study's small files into the repository (results/NAME), enough for `nlq report` to regenerate its
report from them: study.json, report.md, results.csv, plots, and per finished run config.json, summary.json
and metrics.jsonl thinned to its evaluations plus every `every`-th training step. No checkpoints or weights.

    nlq report STUDY_DIR --collect results/NAME     (copies, then writes the report there)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def thin(source: Path, every: int) -> str:
    keep = []
    for line in source.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the last line of a run that is writing it
            continue
        if any(k.startswith("val_") for k in row) or row.get("step", 0) % every == 0:
            keep.append(line)
    return "\n".join(keep) + "\n"


def collect(study_dir: Path, out: Path, every: int = 100) -> int:
    """Copy the study's small files and its finished runs into out; return how many runs were copied."""
    out.mkdir(parents=True, exist_ok=True)
    for path in study_dir.iterdir():
        if path.is_file() and path.suffix in (".json", ".md", ".csv", ".png") and not path.name.startswith("."):
            shutil.copy2(path, out / path.name)
    copied = 0
    for run in sorted((study_dir / "runs").iterdir()):
        if not (run / "summary.json").is_file():
            continue
        target = out / "runs" / run.name
        target.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "summary.json"):
            shutil.copy2(run / name, target / name)
        (target / "metrics.jsonl").write_text(thin(run / "metrics.jsonl", every))
        copied += 1
    return copied

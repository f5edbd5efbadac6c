"""metrics.jsonl: one JSON object per line (training steps with "train_loss", evaluations with "val_loss").
Every reader goes through read_metrics, which tolerates a last line cut short by a killed process."""

from __future__ import annotations

import json
from pathlib import Path

from nlq.fileio import atomic_write


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl ([] if there is none); a line cut short by a killed process, or one that is no
    JSON object (a damaged file), is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a killed process
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def write_metrics(path: Path, records: list[dict]) -> None:
    """Replace metrics.jsonl with these records, atomically."""
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in records))


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep records up to last_step: a resumed run redoes the steps after its checkpoint."""
    write_metrics(path, [r for r in read_metrics(path) if r.get("step", 0) <= last_step])

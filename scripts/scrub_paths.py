"""Committed records without the absolute paths of the machines that trained them (runs/paths.py): every config.json
and study.json under a results folder rewritten with its data directory by name and its checkpoints from runs/ on,
every other byte unchanged (tests/test_paths.py). `nlq report --collect` publishes new runs so already.

    python scripts/scrub_paths.py [results]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nlq.fileio import atomic_write
from nlq.runs.paths import scrubbed_text

ROOT = Path(__file__).resolve().parent.parent


def scrub(results: Path) -> int:
    """Rewrite every config.json and study.json under results that holds an absolute path; return how many."""
    changed = 0
    for path in sorted([*results.rglob("config.json"), *results.rglob("study.json")]):
        text = path.read_text()
        clean = scrubbed_text(text)
        if clean != text:
            atomic_write(path, clean)
            changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=ROOT / "results")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        print(f"error: {args.results} is not a directory; give the folder of committed studies (results/)",
              file=sys.stderr)
        raise SystemExit(2)
    changed = scrub(args.results)
    print(f"{changed} files rewritten under {args.results}")
    return changed


if __name__ == "__main__":
    main()

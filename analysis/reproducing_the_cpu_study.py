"""Reproducing the cpu study (docs/RESULTS.md, "Reproducing the cpu study on a fresh clone"): a `nlq reproduce --out
DIR` run against the committed results/cpu, arm by arm and comparison by comparison: each arm's mean val loss in both,
each paired Δ vs the baseline with its interval and Holm verdict in both, whether every verdict is the same, and how
far single runs moved (the cross-CPU spread of one run: other kernels, other thread counts).

    python analysis/reproducing_the_cpu_study.py results/cpu REPRODUCED_DIR

Both directories must hold a finished report (result.json: `nlq report DIR` writes it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def result_of(study_dir: Path) -> dict:
    path = study_dir / "result.json"
    if not path.is_file():
        sys.exit(f"error: {path} is missing; run `nlq report {study_dir}` first")
    return json.loads(path.read_text())


def run_losses(study_dir: Path) -> dict[str, float]:
    return {p.parent.name: json.loads(p.read_text())["val_loss"] for p in sorted(study_dir.glob("runs/*/summary.json"))}


def compare(committed: Path, reproduced: Path) -> dict:
    """Per arm the mean val loss of both, per comparison both intervals and verdicts, and the runs' differences."""
    a, b = result_of(committed), result_of(reproduced)
    arms = {row["arm"]: [row["val_loss"]] for row in a["arms"]}
    for row in b["arms"]:
        arms.setdefault(row["arm"], [None]).append(row["val_loss"])
    paired = {arm: (p, b["paired"].get(arm)) for arm, p in a["paired"].items()}
    ours, theirs = run_losses(committed), run_losses(reproduced)
    moved = {name: theirs[name] - ours[name] for name in ours if name in theirs}
    same = all(q is not None and p["verdict"] == q["verdict"] for p, q in paired.values())
    return {"arms": arms, "paired": paired, "moved": moved, "same_verdicts": same,
            "runs": (len(ours), len(theirs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("committed", type=Path)
    parser.add_argument("reproduced", type=Path)
    args = parser.parse_args()
    out = compare(args.committed, args.reproduced)
    print(f"runs: {out['runs'][0]} committed, {out['runs'][1]} reproduced")
    print("| arm | committed mean val loss | reproduced | difference |\n|---|---|---|---|")
    for arm, (x, y) in out["arms"].items():
        print(f"| {arm} | {x:.4f} | {y:.4f} | {y - x:+.4f} |")
    print("\n| variant - baseline | committed Δ [95%] | verdict (Holm) | reproduced Δ [95%] | verdict (Holm) |\n"
          "|---|---|---|---|---|")
    for arm, (p, q) in out["paired"].items():
        print(f"| {arm} | {p['mean']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}] | {p['verdict']} | "
              f"{q['mean']:+.4f} [{q['low']:+.4f}, {q['high']:+.4f}] | {q['verdict']} |")
    moved = sorted(out["moved"].values())
    sizes = sorted(map(abs, moved))
    print(f"\nevery verdict the same: {'yes' if out['same_verdicts'] else 'no'}; single runs moved by "
          f"{moved[0]:+.4f} to {moved[-1]:+.4f} nats (median |difference| {sizes[len(sizes) // 2]:.4f})")


if __name__ == "__main__":
    main()

"""The spread across CPUs (docs/RESULTS.md, "Spread across CPUs"): committed runs retrained on another machine with the
same code path (scripts/reuse_check.py writes them), compared run by run and pair by pair: how far a run's endpoint
and a pair's Δ move when only the CPU (its kernels) changes.

    python analysis/spread_across_cpus.py results/verdict-lr RETRAINED_DIR [RETRAINED_DIR ...]

RETRAINED_DIR is a reuse check's --out (its runs/ hold the retrained runs, named as the committed ones). A pair is two
retrained runs of one seed and budget whose arms the study compares (its primary and declared comparisons).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nlq.studies.definition.design import read_study
from nlq.studies.reports.plan_sections import family_members


def endpoints(study_dir: Path, retrained: list[Path]) -> list[dict]:
    """One row per retrained budget run: its arm, seed, lr, the committed and retrained endpoint, and the kernels each
    ran with where recorded."""
    study = read_study(study_dir)
    key = study["design"].endpoint
    records = {r["name"]: r for r in study["runs"] if r.get("stage") == "budget"}
    rows = []
    for folder in retrained:
        for summary in sorted((folder / "runs").glob("*/summary.json")):
            name = summary.parent.name
            committed = study_dir / "runs" / name / "summary.json"
            if name not in records or not committed.is_file():
                continue
            a, b = json.loads(committed.read_text()), json.loads(summary.read_text())
            r = records[name]
            rows.append({"run": name, "arm": r["arm"], "seed": r["seed"], "lr": r["lr"], "committed": a.get(key),
                         "retrained": b.get(key), "difference": b.get(key) - a.get(key),
                         "kernels": [(x.get("record") or {}).get("cpu_capability") for x in (a, b)]})
    return rows


def pairs(rows: list[dict], study_dir: Path) -> list[dict]:
    """Per compared pair of arms retrained on one seed: Δ committed, Δ retrained, and how far Δ moved."""
    s = read_study(study_dir)["design"]
    members = [s.primary[::-1]] + [m for m in family_members(s) if m != "interaction"]
    by = {(r["arm"], r["seed"]): r for r in rows}
    out = []
    for first, second in members:
        for seed in sorted({r["seed"] for r in rows}):
            if (first, seed) in by and (second, seed) in by:
                a, b = by[(first, seed)], by[(second, seed)]
                then, now = a["committed"] - b["committed"], a["retrained"] - b["retrained"]
                out.append({"pair": f"{first} - {second}", "seed": seed, "committed": then, "retrained": now,
                            "moved": now - then})
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("retrained", type=Path, nargs="+")
    args = parser.parse_args(argv)
    rows = endpoints(args.study, args.retrained)
    print("| run | committed | retrained | difference | kernels (committed, retrained) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['committed']:.4f} | {r['retrained']:.4f} | {r['difference']:+.4f} | "
              f"{r['kernels'][0] or 'not recorded'}, {r['kernels'][1] or 'not recorded'} |")
    found = pairs(rows, args.study)
    if found:
        print("\n| pair | seed | Δ committed | Δ retrained | moved |\n|---|---|---|---|---|")
        for p in found:
            print(f"| {p['pair']} | {p['seed']} | {p['committed']:+.4f} | {p['retrained']:+.4f} | {p['moved']:+.4f} |")
    else:
        print("\nno pair has both arms retrained")
    return {"runs": rows, "pairs": found}


if __name__ == "__main__":
    main()

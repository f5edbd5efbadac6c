"""Holm-adjust a published paired table whose runs are not in the repository, from its printed numbers
(docs/RESULTS.md, "What changed in the reports on 2026-11-30", and the `kvo` section's reading).

The `cpu`, `cpu-lr`, `encoder` and `kvo` tables in docs/RESULTS.md were written before reports adjusted for
many intervals, and their run directories are not committed. Each row prints pairs n, the mean Δ and its 95%
t interval [low, high]; that gives the standard error (half-width / t(0.975, n - 1)), the two-sided p against 0
and, over the rows of one table (one family), the Holm-adjusted p and verdict.

    python analysis/what_changed_in_the_reports.py docs/RESULTS.md "nlq study kvo"

reads the first paired table after the first line containing the given text (rows: | variant | pairs | mean Δ |
[low, high] | ... |) and prints it with p, Holm p and the verdict at 0.05. Numbers carry the table's 4-decimal
rounding.
"""

import argparse
import re
import sys
from pathlib import Path

from scipy import stats

from nlq.studies.inference.stats import holm_verdicts

ROW = re.compile(r"^\| *([\w.-]+) *\| *(\d+) *\| *([+-]?\d+\.\d+) *\| *\[([+-]?\d+\.\d+), *([+-]?\d+\.\d+)\] *\|")


def paired_rows(lines: list[str]) -> list[dict]:
    """The rows of the first table in lines that has the paired columns; stops at its end or the next heading."""
    rows = []
    for line in lines:
        if line.startswith("#"):
            break
        m = ROW.match(line)
        if m:
            name, n, mean, low, high = m.groups()
            rows.append({"variant": name, "n": int(n), "mean": float(mean), "low": float(low), "high": float(high)})
        elif rows and not line.startswith("|"):
            break
    return rows


def with_p(row: dict, confidence: float = 0.95) -> dict:
    se = (row["high"] - row["low"]) / 2 / stats.t.ppf(0.5 + confidence / 2, row["n"] - 1)
    return row | {"p": float(2 * stats.t.sf(abs(row["mean"]) / se, row["n"] - 1))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("markdown", type=Path)
    parser.add_argument("after", help="text of a line before the table (its section heading)")
    args = parser.parse_args()
    lines = args.markdown.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if args.after in line), None)
    if start is None:
        sys.exit(f"error: no line of {args.markdown} contains {args.after!r}")
    rows = paired_rows(lines[start + 1:])
    if not rows:
        sys.exit(f"error: no paired table (| variant | pairs | mean | [low, high] |) in the section of {args.after!r}")
    print(f"Holm over the {len(rows)} rows of the paired table after {args.after!r} ({args.markdown}):\n")
    print("| variant | pairs | mean Δ | 95% interval | p | Holm p | verdict (Holm) |\n|---|---|---|---|---|---|---|")
    for r in holm_verdicts([with_p(r) for r in rows]):
        print(f"| {r['variant']} | {r['n']} | {r['mean']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] | {r['p']:.3g} | "
              f"{r['p_holm']:.3g} | {r['verdict']} |")


if __name__ == "__main__":
    main()

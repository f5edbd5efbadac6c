"""Publish the verdict study's state into the repository: copy its finished runs to results/verdict, regenerate
the report there, paste it into docs/RESULTS.md and write the status (or, once every registered pair is in, the
verdict and its numbers) at the top of docs/RESULTS.md and in the README. Every number comes from the report's
verdict.json; before all pairs are in, only how many have finished is written.

    python scripts/publish_verdict.py STUDY_DIR [--results results/verdict] [--where "2 CPU cores"]

The blocks it writes lie between <!-- verdict-status --> / <!-- /verdict-status --> (README.md and the top of
docs/RESULTS.md) and <!-- verdict-report --> / <!-- /verdict-report --> (docs/RESULTS.md); nothing else changes.
"""

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

from collect_results import collect

from nlq.fileio import atomic_write
from nlq.studies.registry import build_report
from nlq.studies.tables import interval_text

ROOT = Path(__file__).resolve().parent.parent


def replace_block(text: str, tag: str, body: str, path: Path) -> str:
    """text with what lies between <!-- tag --> and <!-- /tag --> replaced by body."""
    pattern = re.compile(rf"(<!-- {tag} -->).*?(<!-- /{tag} -->)", re.DOTALL)
    if not pattern.search(text):
        sys.exit(f"error: {path} has no <!-- {tag} --> ... <!-- /{tag} --> block to write into")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text, count=1)


def demote(markdown: str, levels: int = 2) -> str:
    """The report's headings moved down so that it sits under a section of RESULTS.md."""
    return re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + levels) + " ", markdown, flags=re.MULTILINE)


def status_text(outcome: dict, when: str, where: str, results: str) -> str:
    registered, finished = outcome["registered_pairs"], outcome["finished_pairs"]
    arms = list(finished)
    primary, secondary = arms[0], arms[1:]
    if "decision" not in outcome:
        return (f"Status ({when}): running on {where}, {finished[primary]} of {registered} pairs finished "
                f"(`{results}`); no outcome is shown before all {registered} have.")
    d, tost = outcome["decision"], outcome["decision"]["tost"]
    i = d["interval"]
    text = (f"**Verdict ({when}, `nlq study verdict` as pre-registered, {registered} pairs, {where}): {d['words']}.** "
            f"Δ = {outcome['endpoint']}({outcome['variant']}) - {outcome['endpoint']}({outcome['baseline']}) at "
            f"{outcome['tokens_per_parameter']:g} tokens per parameter: {i['mean']:+.4f} nats, 95% interval "
            f"{interval_text(i)} ({i['mean'] / outcome['baseline_mean']:+.2%} of {outcome['baseline']}'s "
            f"{outcome['baseline_mean']:.4f} nats; the paper: -1.24% to -2.40%); equivalence within ±{outcome['margin']:g} "
            f"{'shown' if tost['equivalent'] else 'not shown'} (two one-sided tests, p = {tost['p']:.3g}). "
            f"`nlq report {results}` regenerates it.")
    pending = [f"{arm} {finished[arm]} of {registered}" for arm in secondary if finished[arm] < registered]
    if pending:
        text += f" Secondary arms still running ({', '.join(pending)} pairs); they do not change the verdict."
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "verdict")
    parser.add_argument("--where", default="2 CPU cores", help="the hardware, in a few words")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--results-md", type=Path, default=ROOT / "docs" / "RESULTS.md")
    args = parser.parse_args()
    copied = collect(args.study_dir, args.results)
    report = build_report(args.results)
    outcome = json.loads((args.results / "verdict.json").read_text())
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        shown = args.results.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(args.results)
    status = status_text(outcome, when, args.where, shown)
    readme = args.readme.read_text()
    atomic_write(args.readme, replace_block(readme, "verdict-status", status, args.readme))
    text = replace_block(args.results_md.read_text(), "verdict-status", status, args.results_md)
    body = demote(report).strip()
    plot = args.results / "verdict_deltas.png"
    if "decision" in outcome and plot.is_file():
        body += f"\n\n![per-seed Δ with the mean and its interval]({os.path.relpath(plot, args.results_md.parent)})"
    atomic_write(args.results_md, replace_block(text, "verdict-report", "\n" + body + "\n", args.results_md))
    print(f"{copied} finished runs -> {args.results}; {args.readme} and {args.results_md}: {status}")


if __name__ == "__main__":
    main()

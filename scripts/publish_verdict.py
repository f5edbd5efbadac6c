"""Publish a pre-registered study's state into the repository (`verdict`, or another of TITLES with --study):
copy its finished runs to results/NAME, regenerate the report there, paste it into docs/RESULTS.md and write the
status (or, once every registered pair is in, the decision and its numbers, with its scope) at the top of
docs/RESULTS.md and in the README. Every number comes from the report's verdict.json and the study's study.json;
before all pairs are in, only how many have finished is written.

    python scripts/publish_verdict.py STUDY_DIR [--study verdict|NAME of TITLES]
                                      [--results results/NAME]
                                      [--where "2 CPU cores"] [--when "2026-12-01 02:45 UTC"]

The blocks it writes lie between <!-- NAME-status --> / <!-- /NAME-status --> (README.md and the top of
docs/RESULTS.md) and <!-- NAME-report --> / <!-- /NAME-report --> (docs/RESULTS.md); nothing else changes.
Sign convention: Δ = variant - baseline in nats, positive = worse; a percentage beside it has Δ's sign.
"""

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import atomic_write
from nlq.studies.definition.design import read_study
from nlq.studies.definition.plan import reference_of
from nlq.studies.definition.tables import interval_text
from nlq.studies.registry import build_report
from nlq.studies.reports.plan_sequential import SEQUENTIAL_ENDS
from nlq.studies.running.collect import collect

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


def scope(study: dict) -> str:
    """The setting a decision holds in, from study.json: shape, head size, corpus, tokens per parameter."""
    design, meta = study["design"], study.get("data_meta") or {}
    shape = design.shape
    corpus = "Python source (pypkg)" if str(meta.get("source", "")).startswith("pypkg") else meta.get("source")
    data = (f"{corpus}, {meta.get('classes')} classes, an encoder classifier" if meta.get("content_hash")
            else f"{corpus}, {meta.get('tokenizer')}")  # labelled examples have no tokenizer
    return (f"{shape['n_layer']} layers, d {shape['n_embd']}, head dim {shape['n_embd'] // shape['n_head']}, {data}, "
            f"{design.primary_tpp} tokens per parameter")


TITLES = {"verdict-lr": "Each at its own lr", "gate-lr": "The output gate, each arm at its own lr",
          "mnist1d-lr": "MNIST-1D, each arm at its own lr", "digits-lr": "8 x 8 digits, each arm at its own lr",
          "qknorm-4e-3": "The QK-norm baseline at 4e-3 (a robustness check)",
          "digits-controls": "8 x 8 digits with controls, splits drawn per seed",
          "mnist1d-qknorm": "MNIST-1D, the QK-norm arms",
          "diff-lr": "Differential attention, each arm at its own lr",
          "transition": "When the induction transition comes"}


def decision_text(outcome: dict, paper_claim: str | None = None) -> str:
    """The decision's numbers in one sentence; paper_claim (the plan's [reference]) quoted beside them where given."""
    d, tost = outcome["decision"], outcome["decision"]["tost"]
    i = d["interval"]
    claim = f"; the paper, in this sign: {paper_claim}" if paper_claim else ""
    return (f"Δ = {outcome['endpoint']}({outcome['variant']}) - {outcome['endpoint']}({outcome['baseline']}): "
            f"{i['mean']:+.4f} nats, 95% interval {interval_text(i)} ({i['mean'] / outcome['baseline_mean']:+.2%} of "
            f"{outcome['baseline']}'s {outcome['baseline_mean']:.4f} nats, positive = worse{claim}); equivalence "
            f"within ±{outcome['margin']:g} "
            f"{'shown' if tost['equivalent'] else 'not shown'} "
            f"(two one-sided tests, p = {tost['p']:.3g}).")


def one_pair_text(outcome: dict) -> str:
    """The exploratory sentence that goes next to a decision whose words one pair decides (verdict.json's one_pair):
    the pair, the estimate without it, and how many pairs have the variant worse."""
    rows, n = outcome.get("one_pair") or [], outcome["decision"]["interval"]["n"]
    if not rows:
        return ""
    row, p = rows[0], rows[0]["without"]
    return (f" Exploratory (the pair found after looking): the words rest on one pair; without seed {row['seed']} "
            f"(Δ {row['delta']:+.4f}) Δ is {p['mean']:+.4f} {interval_text(p)} over {p['n']} pairs, which would read "
            f"\"{row['words_without']}\"; {outcome['worse_pairs']} of {n} seeds have {outcome['variant']} worse.")


def status_text(outcome: dict, study: dict, when: str, where: str, results: str) -> str:
    registered, finished = outcome["registered_pairs"], outcome["finished_pairs"]
    arms = list(finished)
    primary, secondary = arms[0], arms[1:]
    name = study["name"]
    if name != "verdict":
        return _grid_status(outcome, study, when, where, results)
    if "decision" not in outcome:
        return (f"Status ({when}): running on {where}, {finished[primary]} of {registered} pairs finished "
                f"(`{results}`); no outcome is shown before all {registered} have.")
    text = (f"**Verdict ({when}, `nlq study verdict` as pre-registered, {registered} pairs, {where}; {scope(study)}; "
            f"both at one peak lr, {study['design'].lr:g}): {outcome['decision']['words']}.** "
            f"{decision_text(outcome, reference_of(study).get('paper_claim'))}{one_pair_text(outcome)} "
            f"`nlq report {results}` regenerates it.")
    pending = [f"{arm} {finished[arm]} of {registered}" for arm in secondary if finished[arm] < registered]
    if pending:
        text += f" Secondary arms still running ({', '.join(pending)} pairs); they do not change the verdict."
    return text


def _grid_status(outcome: dict, study: dict, when: str, where: str, results: str) -> str:
    s, name = study["design"], study["name"]
    registered = "as pre-registered and amended" if name == "verdict-lr" else "as pre-registered"
    arms = [arm for arm in s.primary + s.secondary if arm not in (s.borrowed or {})]
    grid_runs = len(arms) * len(s.lrs) * len(s.selection_seeds)
    ended = sum(row["ended"] for arm in arms for row in (outcome.get("lr_curve") or {}).get(arm, [])
                if row["lr"] in s.lrs)
    lrs = ", ".join(f"{arm} {lr:g}" for arm, lr in (outcome.get("selected_lrs") or {}).items() if lr is not None)
    if "decision" not in outcome:
        test = f"{outcome['finished_pairs'][s.primary[1]]} of {outcome['registered_pairs']} test pairs"
        done = ended == grid_runs and not any((outcome.get("at_edge") or {}).values())  # no extension to come
        chosen = f" (selected: {lrs})" if lrs and done else ""
        how = "pre-registered, amended before its first run" if name == "verdict-lr" else "pre-registered"
        return (f"{TITLES.get(name, name)}: `nlq study {name}` ({how}) is "
                f"running on {where} (status {when}): selection {ended} of {grid_runs} grid runs ended{chosen}, "
                f"{test} (`{results}`); no test endpoint is shown before all {outcome['registered_pairs']} primary "
                f"pairs have ended.")
    pairs, end = tested_pairs(outcome), outcome["decision"].get("sequential")
    text = (f"**{TITLES.get(name, name)} ({when}, `nlq study {name}` {registered}, "
            f"{pairs} pairs, {where}; {scope(study)}; selected: {lrs}): "
            f"{outcome['decision']['words']}.** {sequential_text(end, s)}"
            f"{decision_text(outcome, reference_of(study).get('paper_claim'))}"
            f"{one_pair_text(outcome)} `nlq report {results}` regenerates it.")
    if s.secondary and not outcome.get("secondary_family"):
        borrowed = [arm for arm in s.secondary if arm in (s.borrowed or {})]
        running = [arm for arm in s.secondary if arm not in borrowed]
        whose = f" ({', '.join(borrowed)}: borrowed, every test run in)" if borrowed else ""
        text += (f" The secondary arms ({', '.join(running)}) are still running{whose}: "
                 f"{outcome.get('seeds_with_every_arm', 0)} of {pairs} test seeds have every arm's "
                 "endpoint; their declared family is computed once all have, and it does not change this decision.")
    elif outcome.get("secondary_family"):
        text += " " + family_text(outcome["secondary_family"], pairs)
    return text


def tested_pairs(outcome: dict) -> int:
    """How many pairs the test used: all registered ones, or those up to the look where a sequential test stopped."""
    return (outcome["decision"].get("sequential") or {}).get("pairs", outcome["registered_pairs"])


def sequential_text(end: dict | None, s) -> str:
    """For a sequential test, where it ended and the repeated interval its words are read off (nothing otherwise)."""
    if not end:
        return ""
    low, high = end["repeated"]
    return (f"Sequential test ({s.spending} spending, looks after {', '.join(map(str, s.looks))} pairs): "
            f"{SEQUENTIAL_ENDS[end['action']]} at look {end['look']} ({end['pairs']} pairs), repeated "
            f"{s.confidence:.0%} interval [{low:+.4f}, {high:+.4f}], which the words are read off; the interval below "
            "ignores the looks. ")


def family_text(family: list[dict], seeds: int) -> str:
    """The declared secondary family in one sentence, each comparison named, with its interval and Holm p."""
    def one(row: dict) -> str:
        name = ("the interaction (the query effect with QK-norm minus without)" if row["member"] == "interaction"
                else row["comparison"])
        share = f", {row['mean'] / row['baseline_mean']:+.2%}" if row.get("baseline_mean") else ""
        text = f"{name} {row['mean']:+.4f}{share} {interval_text(row)}, Holm p {row['holm_p']:.2g}"
        if row.get("one_pair"):  # exploratory: its reading changes without one pair
            pair, p = row["one_pair"][0], row["one_pair"][0]["without"]
            text += (f" (exploratory: its reading rests on one pair; without seed {pair['seed']} Δ is "
                     f"{p['mean']:+.4f} {interval_text(p)}, which would read \"{pair['words_without']}\")")
        return text

    return (f"Declared secondaries on the same {seeds} test seeds, each arm at its own lr, Holm-adjusted as one family "
            f"of {len(family)} (Δ = the first-named arm - the second, positive = the first worse): "
            + "; ".join(one(row) for row in family) + ".")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study_dir", type=Path)
    parser.add_argument("--study", choices=["verdict", *TITLES], default="verdict")
    parser.add_argument("--results", type=Path, help="default: results/NAME")
    parser.add_argument("--where", default="2 CPU cores", help="the hardware, in a few words")
    parser.add_argument("--when", help="the time the status is dated (default: now, UTC)")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--results-md", type=Path, default=ROOT / "docs" / "RESULTS.md")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the study's report block in RESULTS.md from its report, and no status (after a "
                             "change to what reports print)")
    args = parser.parse_args()
    if not (args.study_dir / "study.json").is_file():
        raise UserError(f"{args.study_dir} holds no study.json: give the study directory `nlq study {args.study} "
                        f"--out DIR` trained into (or results/{args.study} to republish the committed runs)")
    results = args.results or ROOT / "results" / args.study
    same = args.study_dir.resolve() == results.resolve()  # republishing the committed runs: nothing to copy
    copied = 0 if same else collect(args.study_dir, results)
    report = build_report(results)
    outcome = json.loads((results / "verdict.json").read_text())
    study = read_study(results)
    when = args.when or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        shown = results.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        shown = str(results)
    status = status_text(outcome, study, when, args.where, shown)
    tag = args.study
    text = args.results_md.read_text()
    if not args.report_only:
        readme = args.readme.read_text()
        if f"<!-- {tag}-status -->" in readme:  # the README shows decisions as a table now (analysis/decisions.py)
            atomic_write(args.readme, replace_block(readme, f"{tag}-status", status, args.readme))
        text = replace_block(text, f"{tag}-status", status, args.results_md)
    body = demote(report).strip()
    plots = {"verdict": [("verdict_deltas.png", "per-seed Δ with the mean and its interval")],
             "verdict-lr": [("verdict_lr_curve.png", "the lr curve of every arm on the selection seeds"),
                            ("verdict_lr_test.png", "per-seed Δ of the test with the mean and its interval")]}
    plots = plots.get(tag, plots["verdict-lr"])
    for name, words in plots:
        if (results / name).is_file() and (name != "verdict_deltas.png" or "decision" in outcome):
            body += f"\n\n![{words}]({os.path.relpath(results / name, args.results_md.parent)})"
    atomic_write(args.results_md, replace_block(text, f"{tag}-report", "\n" + body + "\n", args.results_md))
    print(f"{copied} finished runs -> {results}; " + (f"{args.results_md}: the report block" if args.report_only
                                                      else f"{args.readme} and {args.results_md}: {status}"))


if __name__ == "__main__":
    try:
        main()
    except UserError as e:  # a user's mistake or a refused record: one line, status 2, nothing half-written
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

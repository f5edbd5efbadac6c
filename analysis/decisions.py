"""The decisions at a glance (docs/RESULTS.md, "Decisions at a glance"): every committed plan study's registered test
and its declared comparisons, as one table (the README's `<!-- decisions -->` block) and one forest plot
(docs/decisions.png), regenerated from the studies' result.json and study.json alone (read through
design.read_study, so an edited record is refused).

Each row: the study, its question, the arms compared with their lrs, the pairs, Δ = first - second (positive: the
first has the higher loss) with its 95% interval (a sequential test's repeated interval, which its words are read
off), the words (the registered rule's for a primary test, the Holm reading for a declared comparison) and, where
the words rest on one pair, which.

    python analysis/decisions.py [--results results] [--readme README.md] [--plot docs/decisions.png]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from nlq.fileio import atomic_write  # noqa: E402
from nlq.studies.definition.design import read_study  # noqa: E402
from nlq.studies.reports.plan_sections import reading  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = {  # a few words per study; a study not named here is asked its plan's description
    "verdict": "nonlinear vs linear query, one shared lr (language model)",
    "verdict-lr": "nonlinear vs linear query, each at its own lr (language model)",
    "gate-lr": "the output gate on the QK-norm baseline, each at its own lr (language model)",
    "qknorm-4e-3": "the QK-norm baseline at 4e-3 (a robustness check of gate-lr and verdict-lr)",
    "mnist1d-lr": "nonlinear vs linear query, MNIST-1D encoder classifier",
    "mnist1d-qknorm": "the QK-norm arms, MNIST-1D encoder classifier",
    "digits-lr": "nonlinear vs linear query, 8 x 8 digits classifier (one fixed 360-image test split, no controls)",
    "digits-controls": "nonlinear vs linear query with controls, digits split per seed",
    "diff-lr": "differential attention vs linear, each at its own lr (language model)",
}


def decisions(results: Path) -> list[dict]:
    """One row per registered test (kind "primary") and per declared comparison (kind "family") of every plan study
    in results/ whose test has ended (pilots, exploratory, left out), in QUESTIONS' order, then by name."""
    rows = []
    order = list(QUESTIONS)
    paths = sorted(results.glob("*/study.json"), key=lambda p: (order.index(p.parent.name) if p.parent.name in order
                                                                  else len(order), p.parent.name))
    for study_json in paths:
        outcome_path = study_json.parent / "result.json"
        if not outcome_path.is_file():
            continue
        outcome = json.loads(outcome_path.read_text())
        if "decision" not in outcome:
            continue
        study = read_study(study_json.parent)
        s, name = study["design"], study["name"]
        if study.get("description", "").startswith("pilot"):
            continue
        lrs = outcome.get("selected_lrs") or {arm: s.lr for arm in s.primary + s.secondary}
        baseline, method = s.primary
        interval = outcome["decision"]["interval"]
        end = outcome["decision"].get("sequential")  # a sequential test's words are read off its repeated interval
        low, high = end["repeated"] if end else (interval["low"], interval["high"])
        units = s.units  # nats for a loss; steps for the transition step
        rows.append({"study": name, "question": QUESTIONS.get(name, study.get("description", name).split(",")[0]),
                     "units": units.name, "kind": "primary", "first": method, "second": baseline,
                     "first_lr": lrs.get(method), "second_lr": lrs.get(baseline), "n": interval["n"],
                     "mean": interval["mean"],
                     "low": low, "high": high,
                     "words": outcome["decision"]["words"] + (" (sequential: the repeated interval)" if end else ""),
                     "one_pair": rests_on(outcome)})
        for member in outcome.get("secondary_family") or []:
            if member["member"] == "interaction":  # (method' - baseline') - (method - baseline): two differences
                first, second = member["comparison"].removeprefix("interaction: ").split(") - (")
                first, second = first + ")", "(" + second
                question, words = "declared interaction (Holm over the family)", interaction_words(member, s)
            else:
                (first, second), question = member["member"], "declared comparison (Holm over the family)"
                words = reading(member, member["holm_p"], s)
            rows.append({"study": name, "question": question, "units": units.name, "kind": "family",
                         "first": first, "second": second, "first_lr": lrs.get(first), "second_lr": lrs.get(second),
                         "n": member["n"], "mean": member["mean"], "low": member["low"], "high": member["high"],
                         "words": words, "one_pair": rests_on(member)})
    return rows


def interaction_words(member: dict, s) -> str:
    """An interaction's Holm reading: the first difference smaller or larger than the second, or within noise."""
    if not member["holm_p"] < 1 - s.confidence:
        return "within noise"
    return "the first difference lower" if member["mean"] < 0 else "the first difference higher"


def rests_on(found: dict) -> str:
    """"rests on seed N" where removing one pair alone would change the words (the report's most influential such
    pair; its one_pair rows in result.json), else empty."""
    pairs = found.get("one_pair") or []
    return f"rests on seed {pairs[0]['seed']}" if pairs else ""


def table(rows: list[dict]) -> str:
    def arm(name, lr):
        return f"{name} ({lr:g})" if lr is not None else name

    lines = ["| study | question | Δ = first - second | pairs | Δ (nats) | 95% interval | reading | one pair |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        study = f"`{r['study']}`" if r["kind"] == "primary" else ""
        value = number(r)
        lines.append(f"| {study} | {r['question']} | {arm(r['first'], r['first_lr'])} - "
                     f"{arm(r['second'], r['second_lr'])} | {r['n']} | {value(r['mean'])} | "
                     f"[{value(r['low'])}, {value(r['high'])}] | {r['words']} | {r['one_pair']} |")
    return "\n".join(lines)


def number(row: dict):
    """How a row's Δ is written: nats to 4 decimals; a Δ in another unit (the transition step) with its unit."""
    if row.get("units", "nats") == "nats":
        return lambda x: f"{x:+.4f}"
    return lambda x: f"{x:+,.0f} {row['units']}"


def forest_plot(rows: list[dict], path: Path) -> None:
    """Every row's Δ in nats with its 95% interval, one line each, primary tests in black, declared comparisons in
    grey (a Δ in steps, the transition's, is in the table alone: one axis holds one unit)."""
    rows = [r for r in rows if r.get("units", "nats") == "nats"]
    fig, ax = plt.subplots(figsize=(8, 0.34 * len(rows) + 1.2))
    for i, r in enumerate(reversed(rows)):
        color = "black" if r["kind"] == "primary" else "0.5"
        ax.errorbar([r["mean"]], [i], xerr=[[r["mean"] - r["low"]], [r["high"] - r["mean"]]], fmt="o", ms=4,
                    color=color, capsize=2)
    ax.axvline(0, color="0.7", lw=1)
    ax.set_yticks(range(len(rows)),
                  [f"{r['study']}: {r['first']} - {r['second']}" for r in reversed(rows)], fontsize=7)
    ax.set(xlabel="Δ in nats (first - second; negative: the first has the lower loss), 95% interval",
           title="Every committed decision (black) and declared comparison (grey)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def refuse(message: str) -> None:
    """A user's mistake: one line on stderr, exit status 2, nothing written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


BLOCK = re.compile(r"(<!-- decisions -->).*?(<!-- /decisions -->)", re.DOTALL)


def check_block(readme: Path) -> None:
    if not BLOCK.search(readme.read_text()):
        refuse(f"{readme} has no <!-- decisions --> ... <!-- /decisions --> block to write into")


def write_block(readme: Path, body: str) -> None:
    check_block(readme)
    atomic_write(readme, BLOCK.sub(lambda m: m.group(1) + "\n" + body + "\n" + m.group(2), readme.read_text()))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "decisions.png")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        refuse(f"--results {args.results} is not a directory; give the folder that holds the "
                         f"committed studies (results/)")
    if not args.readme.is_file():
        refuse(f"--readme {args.readme} does not exist; give the README.md whose <!-- decisions --> "
                         f"block to write")
    rows = decisions(args.results)
    if not rows:
        refuse(f"{args.results} holds no decided plan study (a study.json with a result.json that "
                         f"records a decision); nothing was written")
    check_block(args.readme)
    forest_plot(rows, args.plot)
    write_block(args.readme, table(rows))
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()

"""A sequential test in a plan's report: the look where it ended (sequential.json), the seeds it used, its words read
off the repeated confidence interval, and its lines; and the words of a Δ below or above 0 for the endpoint."""

from __future__ import annotations

from pathlib import Path

from nlq.fileio import read_json
from nlq.studies.inference.stats import verdict_words


def directions(s) -> tuple[str, str]:
    """The words of a Δ below and above 0 for this design's endpoint."""
    return s.units.lower, s.units.higher


def sequential_end(study_dir: Path, s: dict) -> dict | None:
    """A sequential test's last recorded look once the test has ended there (stopped at a bound, or the last look);
    None while it runs (no endpoint is shown before). A plan without looks: None."""
    path = study_dir / "sequential.json"
    if s.looks is None or not path.is_file():
        return None
    looks = read_json(path, "the sequential test's record").get("looks") or []
    ended = [entry for entry in looks if entry.get("action") in ("difference", "equivalence", "end")]
    if not ended:
        return None
    return ended[0] | {"every_look": [entry for entry in looks if entry["look"] <= ended[0]["look"]]}


def test_seeds(study_dir: Path, s: dict) -> list[int] | None:
    """The seeds the pre-registered test is computed on: every test seed, or for a sequential test those up to the
    look where it ended (None while it runs)."""
    if s.looks is None:
        return s.seeds
    end = sequential_end(study_dir, s)
    return None if end is None else s.seeds[:s.looks[end["look"] - 1]]


def sequential_decision(decision: dict, end: dict, s: dict, method: str, no_effect_words: str) -> dict:
    """The registered rule read off the repeated confidence interval at the look where the test ended (below 0:
    better; above 0: worse; inside ±margin: equivalence; else inconclusive), replacing the fixed design's words;
    the naive interval stays in decision["interval"], labelled as such in the report."""
    low, high = end["repeated"]
    return decision | {"verdict": sequential_key(low, high, s), "words": sequential_words(low, high, s, method,
                                                                                       no_effect_words),
                       "sequential": end}


def sequential_key(low: float, high: float, s: dict) -> str:
    return "better" if high < 0 else "worse" if low > 0 else (
        "equivalent" if -s.margin < low and high < s.margin else "inconclusive")


def sequential_words(low: float, high: float, s: dict, method: str, no_effect_words: str) -> str:
    """The registered rule's words on a repeated interval [low, high]."""
    return verdict_words(sequential_key(low, high, s), method, no_effect_words, directions(s))


# how a sequential test ended, by the action of its last look (sequential.look)
SEQUENTIAL_ENDS = {"difference": "stopped for a difference", "equivalence": "stopped for equivalence",
                   "end": "ran to its last look"}


def sequential_lines(end: dict, s: dict) -> list[str]:
    stopped = SEQUENTIAL_ENDS[end["action"]]
    return [f"- sequential test ({s.spending} spending, looks after {', '.join(map(str, s.looks))} "
            f"pairs): {stopped} at look {end['look']} ({end['pairs']} pairs; t = {end['t']:+.3f}, p = {end['p']:.3g} "
            f"against the look's nominal level {end['level']:.3g}); repeated confidence interval "
            f"[{end['repeated'][0]:+.4f}, {end['repeated'][1]:+.4f}] (Jennison & Turnbull 1989: its coverage holds "
            f"over every look together; the decision is read off it); the naive 95% interval "
            f"[{end['naive'][0]:+.4f}, {end['naive'][1]:+.4f}] ignores the looks and is shown for comparison only;"
            ] + [f"  - look {e['look']} ({e['pairs']} pairs): mean Δ {e['mean']:+.4f}, t = {e['t']:+.3f}, p = "
                 f"{e['p']:.3g} against its nominal level {e['level']:.3g} (|z| bound {e['bound']:.4f}); repeated "
                 f"interval [{e['repeated'][0]:+.4f}, {e['repeated'][1]:+.4f}]; {e['action']}"
                 for e in end.get("every_look", [])]

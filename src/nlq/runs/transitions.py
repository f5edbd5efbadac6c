"""When a run's induction transition came: the step a curve of its metrics.jsonl first crosses a stated level.

Two rules, each applied to every arm alike (docs/METHOD.md, "The induction transition"):
- INDUCTION, from the diagnostics (training/diagnostics.py) that runs log since 2026-12-07: the first diagnostic step at
  which the largest prefix-matching score of any head reaches PREFIX_LEVEL, i.e. one head puts that share of its
  attention on the token after the current token's earlier occurrence in a repeated random sequence.
- TRAIN_LOSS, for runs without diagnostics (the committed studies): the first logged training step at which the
  centred moving mean of the logged train loss (LOSS_WINDOW points) falls below a level stated per study (at the d64
  pypkg shape 3.5 nats, shown beside 3.45 and 3.55).
A run that never crosses is censored at its last step: its transition is later than that step, by an unknown amount.
No torch here: reports read these from the records alone.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX_KEY = "prefix_matching_max"
PREFIX_LEVEL = 0.2
LOSS_WINDOW = 9


@dataclass(frozen=True)
class Transition:
    step: int | None  # the step it crossed, or the last step measured where it never did (censored)
    censored: bool

    def to_dict(self) -> dict:
        return {"step": self.step, "censored": self.censored}


def first_crossing(curve: list[tuple[int, float]], level: float, below: bool) -> Transition:
    """The first (step, value) of a curve (in step order) whose value is at or past level; censored at the curve's
    last step where none is (an empty curve: step None, censored)."""
    for step, value in curve:
        if (value <= level) if below else (value >= level):
            return Transition(step, False)
    return Transition(curve[-1][0] if curve else None, True)


def moving_mean(curve: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """Each point's centred mean over `window` logged points (fewer at the ends, where the window is cut)."""
    half = window // 2
    values = [v for _, v in curve]
    out = []
    for i, (step, _) in enumerate(curve):
        part = values[max(0, i - half): i + half + 1]
        out.append((step, sum(part) / len(part)))
    return out


def induction_transition(records: list[dict], level: float = PREFIX_LEVEL) -> Transition | None:
    """INDUCTION's transition from a run's metrics.jsonl records; None where it has no diagnostics."""
    curve = sorted((r["step"], r[PREFIX_KEY]) for r in records if r.get(PREFIX_KEY) is not None)
    return first_crossing(curve, level, below=False) if curve else None


def loss_curve(records: list[dict], every: int = 100) -> list[tuple[int, float]]:
    """The logged train loss at steps that are multiples of `every` (what a committed, thinned metrics.jsonl keeps),
    one point per step (a resumed run's last write of a step wins)."""
    points = {r["step"]: r["train_loss"] for r in records
              if r.get("train_loss") is not None and r["step"] % every == 0}
    return sorted(points.items())


def loss_transition(records: list[dict], level: float, window: int = LOSS_WINDOW, every: int = 100) -> Transition:
    """TRAIN_LOSS's transition: the first step where the centred moving mean of the train loss falls to level."""
    return first_crossing(moving_mean(loss_curve(records, every), window), level, below=True)


def mean_loss_after(records: list[dict], step: int, start: int, end: int, every: int = 100) -> float | None:
    """The mean logged train loss from step + start to step + end (inclusive): a run's loss a fixed distance after its
    own transition; None where the run did not log that far."""
    curve = loss_curve(records, every)
    if not curve or curve[-1][0] < step + end:
        return None
    part = [v for s, v in curve if step + start <= s <= step + end]
    return sum(part) / len(part) if part else None

"""The exploratory kinds of plan ([design] kind = "comparison", "scaling" or "probes"), typed and frozen
(Exploration): many arms against one baseline, read with Holm over the family, with no pre-registered decision.

- comparison: every arm on the base recipe (its steps and schedule as the base sets them) on every seed, at the base's
  lr or at each of `lrs` (each arm then read at its own best); `width_family` names the wider linear baselines whose
  losses fit the parameter equivalence.
- scaling: per width in `widths` (a model shape and budgets in tokens per non-embedding parameter), WSD chains with a
  branch per budget; each (width, arm) at the best of the width's `lrs` on `sweep_seed` at `sweep_tpp`, or every arm
  at one `lr`.
- probes: synthetic tasks (`tasks`: the task, its vocabulary, pairs, example length and widths), held-out accuracy and
  the first step that reaches `threshold`.

exploration_of checks a plan's [design] of these kinds (one line naming the field); study.json holds to_dict().
The runs each kind asks for are families.py's, its report plan_report.FLOWS's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

EXPLORE_FIELDS = {  # a kind's fields: (type, required)
    "comparison": {"seeds": (list, True), "baseline": (str, True), "lrs": (list, False),
                   "width_family": (list, False), "min_lr_ratio": (float, False)},
    "scaling": {"seeds": (list, True), "baseline": (str, True), "widths": (dict, True), "sweep_seed": (int, False),
                "lr": (float, False), "min_lr_ratio": (float, False)},
    "probes": {"seeds": (list, True), "baseline": (str, True), "tasks": (dict, True), "threshold": (float, True)},
}
WIDTH_KEYS = {"shape": dict, "budgets": list, "lrs": list, "sweep_tpp": (int, float)}
TASK_KEYS = {"task": str, "vocab": int, "pairs": int, "block": int, "widths": list}
TASKS = ("mqar", "lookup", "selective-copy")  # data/tasks.py


class DesignView(Mapping):
    """What every plan's design is besides its fields (a decision's Design, an Exploration): read by attribute, and as
    the read-only mapping of to_dict(), the fields not at their default, which study.json holds."""

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING or value != default:
                out[f.name] = value
        return out

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other) -> bool:  # a plain mapping is equal to the dict study.json would hold
        return self.to_dict() == dict(other) if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # its lists and tables are mutable


@dataclass(frozen=True, eq=False)
class Exploration(DesignView):
    """An exploratory plan's design; study.json holds its kind and the fields that are set."""

    kind: str
    seeds: list
    baseline: str
    lrs: list | None = None  # comparison: each arm at its best of these
    width_family: list | None = None  # comparison: the wider linear baselines of the parameter equivalence
    min_lr_ratio: float = 0.1  # a swept run's min lr = ratio x its peak lr
    widths: dict | None = None  # scaling: name -> {shape, budgets, lrs, sweep_tpp}
    sweep_seed: int | None = None  # scaling: the seed of the lr sweep (none: every arm at `lr`)
    lr: float | None = None  # scaling: one peak lr for every arm, no sweep
    tasks: dict | None = None  # probes: name -> {task, vocab, pairs, block, widths}
    threshold: float | None = None  # probes: "solved" at this held-out accuracy


def exploration_of(table: dict, arms: list[str], fail) -> Exploration:
    """A plan's [design] of an exploratory kind (table["kind"]), every field checked (fail(field, what) raises)."""
    kind = table["kind"]
    fields = EXPLORE_FIELDS[kind]
    unknown = sorted(set(table) - set(fields) - {"kind"})
    if unknown:
        fail(f"design.{unknown[0]}", f"is not a field of a {kind} plan; its fields: kind, {', '.join(fields)}")
    for key, (wanted, required) in fields.items():
        if key not in table:
            if required:
                needed = ", ".join(k for k, (_, r) in fields.items() if r)
                fail(f"design.{key}", f"is missing (a {kind} plan needs {needed})")
            continue
        value = table[key]
        types = (int, float) if wanted is float else (wanted,)
        if isinstance(value, bool) or not isinstance(value, types):
            fail(f"design.{key}", f"is {value!r}; it must be {'a number' if wanted is float else wanted.__name__}")
    design = Exploration(**table)
    _check(design, arms, fail)
    return design


def _check(d: Exploration, arms: list[str], fail) -> None:
    check_seeds(d.seeds, "design.seeds", fail)
    if d.baseline not in arms:
        fail("design.baseline", f"is {d.baseline!r}, which is not an arm ({', '.join(arms)})")
    if d.lrs is not None:
        check_lrs(d.lrs, "design.lrs", fail)
    for name in d.width_family or []:
        if name not in arms:
            fail("design.width_family", f"names {name!r}, which is not an arm ({', '.join(arms)})")
    if not 0 < d.min_lr_ratio <= 1:
        fail("design.min_lr_ratio", f"is {d.min_lr_ratio!r}; it must lie in (0, 1]")
    if d.kind == "scaling":
        if (d.sweep_seed is None) == (d.lr is None):
            fail("design", "needs sweep_seed (each width and arm at the best of the width's lrs on that seed) or lr "
                           "(one peak lr for every arm), one of them")
        if d.sweep_seed is not None and not count(d.sweep_seed, 0):
            fail("design.sweep_seed", f"is {d.sweep_seed!r}; give a non-negative integer")
        if d.sweep_seed is not None and d.sweep_seed not in d.seeds:
            fail("design.sweep_seed", f"is {d.sweep_seed!r}, none of design.seeds ({', '.join(map(str, d.seeds))}); "
                                      f"the sweep's runs are that seed's, so give one of them")
        if not d.widths:
            fail("design.widths", "is empty; give at least one width, e.g. d64 = { shape = {...}, budgets = [...] }")
        if d.lr is not None and not 0 < d.lr < 10:
            fail("design.lr", f"is {d.lr!r}; give a peak lr in (0, 10)")
        for width, spec in d.widths.items():
            _width(width, spec, d.sweep_seed is not None, fail)
    if d.kind == "probes":
        if not d.tasks:
            fail("design.tasks", "is empty; give at least one task, e.g. mqar2 = { task = \"mqar\", ... }")
        for task, spec in d.tasks.items():
            _task(task, spec, fail)
        if not 0 < d.threshold <= 1:
            fail("design.threshold", f"is {d.threshold!r}; an accuracy in (0, 1]")


def count(value, low: int) -> bool:
    """Whether value is an integer (not a bool) of at least low."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


# ---- the checks of fields that decisions' designs have too (plan_design.py) ----------------------------------------

def check_seeds(values, field: str, fail, least: int = 1) -> None:
    if len(values) < least or not all(count(s, 0) for s in values) or len(set(values)) < len(values):
        fail(field, f"is {values!r}; give {'at least two ' if least == 2 else ''}distinct non-negative integers")


def check_lrs(values, field: str, fail) -> None:
    ok = isinstance(values, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 10
                                          for x in values)
    if not values or not ok or sorted(set(values)) != values:
        fail(field, f"is {values!r}; give strictly increasing positive peak lrs, each once")


def check_label(value, field: str, fail) -> None:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value) or ".." in value:
        fail(field, f"is {value!r}; it names the runs: give a short label of letters, digits, '.', '_' or '-', such "
                    "as \"d64\" (no path)")


def check_shape(shape, field: str, fail) -> None:
    if not isinstance(shape, dict) or sorted(shape) != ["n_embd", "n_head", "n_layer"] or not all(
            count(v, 1) and v <= 1_000_000 for v in shape.values()):
        fail(field, f"is {shape!r}; give {{n_layer = L, n_head = H, n_embd = D}} as positive integers")
    if shape["n_embd"] % shape["n_head"]:
        fail(field, f"has n_embd = {shape['n_embd']}, not divisible by n_head = {shape['n_head']}; pick n_embd a "
                    "multiple of n_head")


def check_budgets(values, field: str, fail) -> None:
    """Tokens-per-parameter budgets: positive, finite, each once, increasing (each continues the one before's run)."""
    if not isinstance(values, list) or not values or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and 0 < b < 1e9 for b in values):
        fail(field, f"is {values!r}; give positive, finite tokens-per-parameter budgets")
    ordered = sorted(set(values))
    if ordered != values:
        fail(field, f"is {values!r}; list each budget once, in increasing order (each one continues the stable run of "
                    f"the one before), e.g. {ordered!r}")


def _width(width: str, spec, sweep: bool, fail) -> None:
    where = f"design.widths.{width}"
    check_label(width, where, fail)
    needed = ["shape", "budgets"] + (["lrs", "sweep_tpp"] if sweep else [])
    if not isinstance(spec, dict) or any(k not in spec for k in needed) or set(spec) - set(WIDTH_KEYS):
        fail(where, f"is {spec!r}; give {{ {', '.join(needed)} }}" + (" (lrs and sweep_tpp with a sweep_seed)"
                                                                     if not sweep else ""))
    check_shape(spec["shape"], f"{where}.shape", fail)
    check_budgets(spec["budgets"], f"{where}.budgets", fail)
    if sweep:
        check_lrs(spec["lrs"], f"{where}.lrs", fail)
        tpp = spec["sweep_tpp"]
        if isinstance(tpp, bool) or not isinstance(tpp, (int, float)) or not (0 < tpp < 1e9 and math.isfinite(tpp)):
            fail(f"{where}.sweep_tpp", f"is {tpp!r}; give the sweep's budget in tokens per parameter (> 0)")


def _task(name: str, spec, fail) -> None:
    where = f"design.tasks.{name}"
    if not isinstance(spec, dict) or set(spec) != set(TASK_KEYS):
        fail(where, f"is {spec!r}; give {{ {', '.join(TASK_KEYS)} }}")
    if spec["task"] not in TASKS:
        fail(f"{where}.task", f"is {spec['task']!r}; choose {', '.join(TASKS)}")
    for key in ("vocab", "pairs", "block"):
        if not count(spec[key], 1):
            fail(f"{where}.{key}", f"is {spec[key]!r}; give a positive integer")
    widths = spec["widths"]
    if not isinstance(widths, list) or not widths or not all(count(w, 1) and w % max(1, w // 16) == 0
                                                               for w in widths):
        fail(f"{where}.widths", f"is {widths!r}; give model widths (n_embd) as positive integers")

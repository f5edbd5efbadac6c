"""A plan's [design], typed and frozen (Design): the shape, the budgets in tokens per parameter, the seeds, the lr
rule (one lr for every arm, or a grid with selection seeds and an edge rule: its `kind`), the endpoint and the decision
rule, the declared secondary family, a sequential test's looks, the cost on paper and the arms borrowed from other
studies. design_of builds one from a plan file's [design] (plan.py), check_design from what a study.json holds
(design.read_study); each mistake is a one-line error naming the field. study.json holds Design.to_dict().
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from nlq.errors import UserError
from nlq.studies.definition import plan_explore as checks
from nlq.studies.definition.plan_explore import EXPLORE_FIELDS, DesignView, Exploration, exploration_of

ENDPOINTS = ("full_val_loss", "val_loss", "transition_step")  # the last: runs/transitions.py, in steps
COMMON = {"width": str, "shape": dict, "budgets_tpp": list, "primary_tpp": (int, float), "seeds": list,
          "primary": list, "secondary": list, "endpoint": str, "confidence": float, "margin": float, "alpha": float,
          "planning_sd": float}
FIXED_LR = {"lr": float, "min_lr": float}
LR_GRID = {"lrs": list, "edge_factor": float, "max_extensions": int, "min_lr_ratio": float, "selection_seeds": list}
# a kind's own fields: a decision's (Design.kind, from its fields; engine.LR_RULES), then the exploratory kinds a plan
# names with [design] kind = ... (plan_explore.py; families.py runs them)
KIND_FIELDS = {"fixed-lr": FIXED_LR, "lr-grid": LR_GRID} | {
    kind: {key: wanted for key, (wanted, _) in fields.items()} for kind, fields in EXPLORE_FIELDS.items()}
# an lr grid's optional fields: arms held at an lr of their own (not selected), and the firmer selection (the two best
# lrs of each refined arm trained on more seeds, the pooled mean selecting)
GRID_OPTIONAL = {"pinned_lrs": dict, "refine_seeds": list, "refine_arms": list, "refine_selects": bool}
OPTIONAL = {"secondary_family": list, "paper_lr_ratio": float, "planning_difference": float, "planning_power": float,
            "looks": list, "spending": str, "stop_for_equivalence": bool,  # a sequential test
            "gpu": str, "gpu_peak_tflops": float, "mfu": float}  # the cost on paper: GPU-hours at this MFU


@dataclass(frozen=True)
class Units:
    """How a report writes an endpoint: its unit, digits, and the words for a Δ below or above 0 (a primary test's
    and a declared comparison's)."""

    name: str
    digits: int
    what: str  # what a percentage is of: "{baseline}'s {what}"
    lower: str
    higher: str
    lower_reading: str
    higher_reading: str

    def __call__(self, value: float, signed: bool = True) -> str:
        return f"{value:{'+' if signed else ''},.{self.digits}f}"


LOSS_UNITS = Units("nats", 4, "loss", "better", "worse", "lower loss", "higher loss")
STEP_UNITS = Units("steps", 0, "transition step", "earlier", "later", "earlier", "later")


@dataclass(frozen=True, eq=False)
class Design(DesignView):
    """Read by attribute; also a read-only mapping of to_dict() (design["seeds"], "looks" in design), the view that
    study.json, scripts and code written against the design as a dict see."""

    width: str  # names the runs, e.g. "d64"
    shape: dict  # {n_layer, n_head, n_embd}
    budgets_tpp: list  # tokens per non-embedding parameter of the baseline, increasing; one WSD chain reaches each
    primary_tpp: float
    seeds: list  # the test seeds, in the order a sequential test looks at them
    primary: list  # [baseline, method]
    endpoint: str
    confidence: float
    margin: float  # of the equivalence test, in the endpoint's units (nats; steps for transition_step)
    alpha: float  # of each one-sided test of equivalence
    planning_sd: float
    secondary: list = field(default_factory=list)  # arms whose test runs follow the primary arms'
    lr: float | None = None  # one lr for every arm ("fixed-lr") ...
    min_lr: float | None = None
    lrs: list | None = None  # ... or each arm's own from this grid ("lr-grid"), with the edge rule
    edge_factor: float | None = None
    max_extensions: int | None = None
    min_lr_ratio: float | None = None
    selection_seeds: list | None = None
    secondary_family: list | None = None  # [arm, baseline] pairs or "interaction"; None: each secondary vs baseline
    paper_lr_ratio: float | None = None
    planning_difference: float | None = None  # None: the margin
    planning_power: float | None = None
    looks: list | None = None  # a sequential test: the numbers of pairs it looks after
    spending: str = "obf"
    stop_for_equivalence: bool = False
    gpu: str | None = None  # the cost on paper: GPU-hours at this MFU
    gpu_peak_tflops: float | None = None
    mfu: float | None = None
    borrowed: dict | None = None  # arm -> {study, commit}: arms whose runs another committed study made
    pinned_lrs: dict | None = None  # arm -> peak lr: arms of an lr grid trained at this lr, never selected
    refine_seeds: list | None = None  # the firmer selection: more selection seeds for the two best lrs of ...
    refine_arms: list | None = None  # ... these arms (None: every arm that is selected)
    refine_selects: bool = True  # False: the refined selection is a declared reading; the test keeps the grid's

    @property
    def units(self) -> Units:
        """A loss endpoint in nats; the transition step (runs/transitions.py) in steps, earlier or later."""
        return STEP_UNITS if self.endpoint == "transition_step" else LOSS_UNITS

    @property
    def kind(self) -> str:
        """'lr-grid' (each arm selects its lr on the selection seeds) or 'fixed-lr' (one lr for every arm)."""
        return "lr-grid" if self.lrs is not None else "fixed-lr"

    def min_lr_at(self, lr: float) -> float:
        """A run's min lr at peak lr: lr x min_lr_ratio on a grid (each arm's own lr), else the registered min_lr."""
        return lr * self.min_lr_ratio if self.kind == "lr-grid" else self.min_lr

    def selection_chains(self, arms: int) -> list[tuple[str, int]]:
        """The chains the lr rule trains before the test, (stage, at most this many), for this many arms trained."""
        if self.kind == "fixed-lr":
            return []
        seeds = len(self.selection_seeds)
        stages = [("selection", arms * len(self.lrs) * seeds),
                  ("edge extensions at most", arms * 2 * self.max_extensions * seeds)]
        if self.refine_seeds:
            stages.append(("refinement at most", len(self.refined_arms) * 2 * len(self.refine_seeds)))
        return stages

    def selected_arms(self, arms: list[str]) -> list[str]:
        """The arms (of these) whose lr the grid selects: all but the pinned ones."""
        return [arm for arm in arms if arm not in (self.pinned_lrs or {})]

    @property
    def refined_arms(self) -> list[str]:
        """The arms whose two best grid lrs train on refine_seeds (none without them)."""
        if not self.refine_seeds:
            return []
        return self.refine_arms if self.refine_arms is not None else self.selected_arms(self.primary + self.secondary)

    @property
    def effect(self) -> float:
        """The difference the test is powered for: planning_difference, else the margin."""
        return self.planning_difference if self.planning_difference is not None else self.margin

    def __or__(self, other: Mapping) -> dict:
        return self.to_dict() | dict(other)

    def __eq__(self, other) -> bool:  # the same fields; a plain mapping is equal to the dict study.json would hold
        if isinstance(other, Design):
            return all(getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self))
        return DesignView.__eq__(self, other)

    __hash__ = None


def design_of(table: dict, arms: list[str], fail, borrowed: dict | None = None) -> Design | Exploration:
    """A plan's [design] table, every field checked (fail(field, what) raises), as a Design (a decision), or as an
    Exploration when it names an exploratory kind (kind = "comparison", "scaling" or "probes")."""
    if "kind" in table:
        if table["kind"] not in EXPLORE_FIELDS:
            fail("design.kind", f"is {table['kind']!r}; choose {', '.join(EXPLORE_FIELDS)} (an exploratory plan), or "
                                "leave kind out for a decision (one lr, or an lr grid, by its fields)")
        if borrowed:
            fail("arms.borrow", f"is for decisions; a {table['kind']} plan trains every arm it names")
        return exploration_of(dict(table), arms, fail)
    design = Design(**_checked(dict(table), arms, fail), **({"borrowed": borrowed} if borrowed else {}))
    if borrowed and design.kind == "fixed-lr":
        fail("arms.borrow", "is for a plan with an lr grid (each arm at the lr its own study selected); a plan with "
                            "one lr for every arm trains every arm it names: remove the borrow")
    if borrowed and set(arms) <= set(borrowed):
        fail("arms.borrow", f"borrows every arm ({', '.join(arms)}), which leaves nothing to train; a plan trains at "
                            f"least one arm of its own (read the other study's report instead)")
    lent = [arm for arm in design.refined_arms if arm in (borrowed or {})]
    if design.refine_selects and lent:
        fail("design.refine_selects", f"is true, but {lent[0]} is borrowed: its test runs are at the lr its own study "
                                      "selected; set refine_selects = false to read its refinement beside the test")
    if set(design.pinned_lrs or {}) & set(borrowed or {}):
        fail("design.pinned_lrs", "names a borrowed arm; a borrowed arm is tested at the lr its own study selected")
    return design


def check_design(recorded, where: str, arms: list[str] | None = None) -> Design | Exploration:
    """A study's design as study.json holds it (a plan's [design]), checked as a plan file's design is: a
    study.json edited by hand is a one-line error naming the field, not a traceback in its report."""
    def fail(field: str, what: str):
        raise UserError(f"{where}: {field} {what}; run the study again from its plan to rewrite it")

    if isinstance(recorded, dict) and recorded.get("kind") in EXPLORE_FIELDS:  # an exploratory plan's
        named = [recorded.get("baseline"), *(recorded.get("width_family") or [])]  # the arms it names
        return design_of(dict(recorded), list(arms) if arms is not None else named, fail)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("primary"), list):
        fail("design", "is missing or holds no design.primary")
    arms = [a for a in recorded["primary"] + (recorded.get("secondary") or []) if isinstance(a, str)]  # its own
    design = dict(recorded)
    borrowed = design.pop("borrowed", None)
    if borrowed is not None and not (isinstance(borrowed, dict) and set(borrowed) <= set(arms)):
        fail("design.borrowed", f"is {borrowed!r}; it maps arm names to {{study, commit}}")
    for arm, value in (borrowed or {}).items():
        borrow_table(value, f"design.borrowed.{arm}", fail)
    return design_of(design, arms, fail, borrowed)


def _checked(design: dict, arms: list[str], fail) -> dict:
    grid = "lrs" in design
    allowed = COMMON | KIND_FIELDS["lr-grid" if grid else "fixed-lr"] | (GRID_OPTIONAL if grid else {}) | OPTIONAL
    unknown = sorted(set(design) - set(allowed))
    if unknown:
        other = "lr and min_lr (one lr for every arm)" if grid else "lrs, pinned_lrs, refine_*"
        fail(f"design.{unknown[0]}", f"is not a field of this design (with{'' if grid else 'out'} an lr grid; "
                                     f"{other} belong to the other kind); fields: {', '.join(allowed)}")
    for key, kind in allowed.items():
        if key not in design:
            if key in OPTIONAL or key in GRID_OPTIONAL or key == "secondary":
                continue
            fail(f"design.{key}", "is missing")
        value = design[key]
        kinds = kind if isinstance(kind, tuple) else (int, float) if kind is float else (kind,)
        if (isinstance(value, bool) != (kind is bool)) or not isinstance(value, kinds):
            wanted = kind.__name__ if isinstance(kind, type) and kind is not float else "a number"
            fail(f"design.{key}", f"is {value!r}; it must be {wanted}")
    _check_design(design, arms, grid, fail)
    return design


def _check_design(d: dict, arms: list[str], grid: bool, fail) -> None:
    checks.check_label(d["width"], "design.width", fail)
    checks.check_shape(d["shape"], "design.shape", fail)
    checks.check_budgets(d["budgets_tpp"], "design.budgets_tpp", fail)
    if d["primary_tpp"] not in d["budgets_tpp"]:
        fail("design.primary_tpp", f"is {d['primary_tpp']!r}, not one of design.budgets_tpp {d['budgets_tpp']!r}")
    checks.check_seeds(d["seeds"], "design.seeds", fail, least=2)
    primary, secondary = d["primary"], d.get("secondary", [])
    if len(primary) != 2 or len(set(primary)) != 2:
        fail("design.primary", f"is {primary!r}; give [baseline, method], two arm names")
    for key, names in (("primary", primary), ("secondary", secondary)):
        missing = [n for n in names if n not in arms]
        if missing:
            fail(f"design.{key}", f"names {missing[0]!r}, which is not an arm ({', '.join(arms)})")
    unused = [a for a in arms if a not in primary + secondary]
    if unused or set(primary) & set(secondary):
        fail("design.secondary", f"must list every arm that is not primary, once ({', '.join(unused) or 'repeated'})")
    if d["endpoint"] not in ENDPOINTS:
        fail("design.endpoint", f"is {d['endpoint']!r}; choose {' or '.join(ENDPOINTS)}")
    for key, low, high in (("confidence", 0, 1), ("alpha", 0, 0.5)):
        if not low < d[key] < high:
            fail(f"design.{key}", f"is {d[key]!r}; it must lie in ({low}, {high})")
    for key in ("margin", "planning_sd", "paper_lr_ratio", "planning_difference"):
        if key in d and not (d[key] > 0 and math.isfinite(d[key])):
            fail(f"design.{key}", f"is {d[key]!r}; it must be a finite number > 0")
    if "planning_power" in d and not 0 < d["planning_power"] < 1:
        fail("design.planning_power", f"is {d['planning_power']!r}; a power lies in (0, 1), e.g. 0.8")
    if grid:
        checks.check_seeds(d["selection_seeds"], "design.selection_seeds", fail, least=2)
        if set(d["selection_seeds"]) & set(d["seeds"]):
            fail("design.selection_seeds",
                 "share seeds with design.seeds; the lr is chosen on seeds that are not tested")
        checks.check_lrs(d["lrs"], "design.lrs", fail)
        if not 1 < d["edge_factor"] < 100 or not 0 <= d["max_extensions"] <= 10 or not 0 < d["min_lr_ratio"] <= 1:
            fail("design", "needs edge_factor in (1, 100), max_extensions in 0..10 and min_lr_ratio in (0, 1]")
    if grid:
        _check_refinement(d, arms, fail)
    family = d.get("secondary_family", [])
    for member in family:
        ok = member == "interaction" and len(secondary) == 2 or (
            isinstance(member, list) and len(member) == 2 and all(isinstance(m, str) and m in arms for m in member)
            and member[0] != member[1])
        if not ok:
            fail("design.secondary_family", f"holds {member!r}; give [arm, baseline] pairs of two different "
                                            "arms, or \"interaction\" (with two secondary arms)")
    if len({json.dumps(m) for m in family}) < len(family):
        fail("design.secondary_family", "names a comparison twice; each once")
    _check_looks(d, fail)
    cost = [key for key in ("gpu", "gpu_peak_tflops", "mfu") if key in d]
    if cost and (len(cost) < 3 or not 0 < d["mfu"] <= 1 or not 0 < d["gpu_peak_tflops"] < 1e6):
        fail("design.mfu", "needs gpu (a name), gpu_peak_tflops (> 0) and mfu (in (0, 1]) together, e.g. gpu = "
                           "\"H100 SXM\", gpu_peak_tflops = 989, mfu = 0.4")
    if not grid and not (0 < d["lr"] < 10 and 0 <= d["min_lr"] <= d["lr"]):
        fail("design", f"needs lr > 0 and 0 <= min_lr <= lr (got {d['lr']!r}, {d['min_lr']!r})")


def _check_refinement(d: dict, arms: list[str], fail) -> None:
    """An lr grid's pinned arms (pinned_lrs: arm -> peak lr) and the firmer selection (refine_seeds, refine_arms,
    refine_selects)."""
    pinned = d.get("pinned_lrs", {})
    for arm, lr in pinned.items():
        if arm not in arms or isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < 10:
            fail("design.pinned_lrs", f"holds {arm} = {lr!r}; give arm = peak lr for arms of this plan, e.g. "
                                      f"{{ \"{arms[-1]}\" = 4e-3 }}")
    if "refine_seeds" not in d:
        extra = [key for key in ("refine_arms", "refine_selects") if key in d]
        if extra:
            fail(f"design.{extra[0]}", "belongs to the firmer selection; give design.refine_seeds too")
        return
    checks.check_seeds(d["refine_seeds"], "design.refine_seeds", fail)
    if set(d["refine_seeds"]) & (set(d["seeds"]) | set(d["selection_seeds"])):
        fail("design.refine_seeds", "share seeds with design.seeds or design.selection_seeds; refinement adds seeds "
                                    "of its own")
    refined = d.get("refine_arms", [a for a in arms if a not in pinned])
    if not refined or not all(isinstance(a, str) and a in arms and a not in pinned for a in refined) \
            or len(set(refined)) < len(refined):
        fail("design.refine_arms", f"is {refined!r}; give arms of this plan whose lr the grid selects (not pinned), "
                                   "each once")


def _check_looks(d: dict, fail) -> None:
    """A sequential test: `looks` (increasing numbers of test pairs, the last all of design.seeds), `spending` and
    `stop_for_equivalence` (which mean nothing without looks)."""
    if "looks" not in d:
        extra = [key for key in ("spending", "stop_for_equivalence") if key in d]
        if extra:
            fail(f"design.{extra[0]}", "belongs to a sequential test; give design.looks too (e.g. looks = [6, 10, 16])")
        return
    looks, n = d["looks"], len(d["seeds"])
    ok = all(isinstance(k, int) and not isinstance(k, bool) for k in looks) and len(looks) >= 2
    if not ok or looks != sorted(set(looks)) or looks[0] < 3 or looks[-1] != n:
        valid = (f"e.g. [{max(3, n // 3)}, {n}]" if n >= 4 else
                 f"with {n} test seeds there is no such list: leave looks (and spending) out, which is the fixed "
                 f"design of one test after all {n} pairs, or register at least 4 test seeds")
        fail("design.looks", f"is {looks!r}; a sequential test needs at least two increasing numbers of test pairs, "
                             f"the first at least 3 and the last {n} (every test seed): {valid}")
    spending = d.get("spending", "obf")
    rho = spending.split(":", 1)[1] if spending.startswith("power:") else None
    if spending not in ("obf", "pocock") and not (rho and re.fullmatch(r"\d+(\.\d+)?", rho) and float(rho) > 0):
        fail("design.spending", f"is {spending!r}; choose obf (O'Brien-Fleming type), pocock or power:RHO (RHO > 0)")


COMMIT = re.compile(r"[0-9a-f]{7,40}")


def borrow_table(value, field: str, fail) -> dict:
    """An arm's `borrow = { study = "NAME", commit = "HEX" }`: the committed study whose runs of this arm it reuses
    (studies/borrow.py), and the commit those runs record."""
    if not (isinstance(value, dict) and set(value) == {"study", "commit"} and isinstance(value["study"], str)
            and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value["study"]) and isinstance(value["commit"], str)
            and COMMIT.fullmatch(value["commit"])):
        fail(field, f"is {value!r}; give {{ study = \"NAME\", commit = \"HEX\" }}: the committed plan study whose "
                    "runs of this arm are reused and the commit (7 to 40 hex digits) they were trained at")
    return dict(value)

"""Plan files: a pre-registered comparison as data (TOML), read into a typed Plan with a one-line error per mistake.

A plan names its corpus, the recipe every run starts from (a preset and config changes), its arms (a name and
config changes each), and its design: the shape, the budgets in tokens per parameter, the seeds, either one lr for
every arm or an lr grid with selection seeds and an edge rule, the endpoint, the margin and the declared secondary
arms. The shipped plans live in nlq/plans/ (`plans/` in a checkout): `nlq study verdict` is `plans/verdict.toml`.
The design goes to study.json as the study's design, the whole plan and its hash beside it: a changed plan is
refused against a study directory that ran another (the field that changed is named).
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from nlq.config import RunConfig, update
from nlq.data.labelled import SOURCES as LABELLED
from nlq.data.labelled import is_labelled
from nlq.errors import ConfigError, UserError
from nlq.plugins import import_modules
from nlq.presets import PRESETS, get_preset
from nlq.studies.design import WORDING, Arm, DataSpec, plan_hash

SHIPPED = Path(__file__).resolve().parent.parent / "plans"
TOP_KEYS = {"name", "description", "imports", "data", "base", "arms", "design", "reference"}
REFERENCE = {"no_effect_words": "the words of an equivalence shown, e.g. \"no effect of the paper's size\"",
             "paper_claim": "the paper's reported change in Δ's sign, e.g. \"-1.24% to -2.40%\""}
SECTIONS = ("model", "data", "train", "dist")
ENDPOINTS = ("full_val_loss", "val_loss")
COMMON = {"width": str, "shape": dict, "budgets_tpp": list, "primary_tpp": (int, float), "seeds": list,
          "primary": list, "secondary": list, "endpoint": str, "confidence": float, "margin": float, "alpha": float,
          "planning_sd": float}
FIXED_LR = {"lr": float, "min_lr": float}
LR_GRID = {"lrs": list, "edge_factor": float, "max_extensions": int, "min_lr_ratio": float, "selection_seeds": list}
OPTIONAL = {"secondary_family": list, "paper_lr_ratio": float, "planning_difference": float, "planning_power": float,
            "looks": list, "spending": str, "stop_for_equivalence": bool,  # a sequential test
            "gpu": str, "gpu_peak_tflops": float, "mfu": float}  # the cost on paper: GPU-hours at this MFU


@dataclass(frozen=True)
class Plan:
    name: str
    description: str
    data: DataSpec
    base: RunConfig
    arms: list[Arm]
    design: dict  # what the plan fixes, as study.json holds it
    raw: dict  # the whole file as parsed: what is frozen

    @property
    def kind(self) -> str:
        return design_kind(self.design)


def design_kind(design: dict) -> str:
    """'lr-grid' (each arm selects its lr on the selection seeds) or 'fixed-lr' (one lr for every arm): the one place
    a design's kind is read, by the engine, its report and Plan.kind."""
    return "lr-grid" if "lrs" in design else "fixed-lr"


def reference_of(study: dict) -> dict:
    """The [reference] wording of a plan study (study.json): its frozen plan's, or, for a study frozen before plans
    carried one, the shipped plan of its name with the same design: the same hash (the wording is not hashed), or
    for a study run before plan files, the same [design] as its own."""
    plan = study.get("plan") or {}
    if WORDING in plan:
        return plan[WORDING]
    shipped = shipped_plans().get(study.get("name", ""))
    if shipped is None:
        return {}
    raw = tomllib.loads(shipped.read_text(encoding="utf-8"))
    frozen = study.get("plan_hash")
    same = plan_hash(raw) == frozen if frozen else raw.get("design") == study.get("design")
    return raw.get(WORDING, {}) if same else {}


def shipped_plans() -> dict[str, Path]:
    return {p.stem: p for p in sorted(SHIPPED.glob("*.toml"), key=lambda p: p.stem)}


def is_plan_path(name: str) -> bool:
    return name.endswith(".toml") or "/" in name


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"plan file {path} does not exist; shipped plans: {', '.join(shipped_plans())} (in {SHIPPED})")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"cannot parse plan {path}: {str(e).splitlines()[0][:200]}") from None
    except RecursionError:
        raise UserError(f"cannot parse plan {path}: its tables or arrays are nested too deeply; a plan is a few "
                        f"flat tables (docs/PLANS.md)") from None
    return read_plan(raw, str(path), base=path.parent)


def read_plan(raw: dict, where: str = "the plan", base: Path | None = None) -> Plan:
    """A Plan from a parsed plan file; every mistake is a one-line UserError naming the field. The modules in
    `imports` (code of the user's own, such as a projection they register) are imported first, .py files
    relative to base (the plan file's folder)."""
    def fail(field: str, what: str):
        raise UserError(f"{where}: {field} {what}")

    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        fail(unknown[0], f"is not a plan field; a plan has {', '.join(sorted(TOP_KEYS))}")
    imports = raw.get("imports", [])
    if not (isinstance(imports, list) and all(isinstance(i, str) for i in imports)):
        fail("imports", "must be a list of module names or .py files, e.g. imports = [\"my_projection.py\"]")
    import_modules(imports, base, f"{where}: imports")
    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        fail("name", f"is {name!r}; give a short name of letters, digits, '.', '_' or '-'")
    data = _data(_table(raw, "data", fail), fail)
    base = _base(_table(raw, "base", fail), fail)
    arms = _arms(raw.get("arms"), base, fail)
    design = _design(dict(_table(raw, "design", fail)), [a.name for a in arms], fail)
    borrowed = {arm["name"]: _borrow(arm["borrow"], f"arms[{i}].borrow", fail)
                for i, arm in enumerate(raw["arms"]) if "borrow" in arm}
    design |= {"borrowed": borrowed} if borrowed else {}
    spec = DataSpec(data["source"], data.get("tokenizer", ""), **({"val_fraction": float(data["val_fraction"])}
                                                                  if "val_fraction" in data else {}))
    reference = raw.get("reference", {})
    if not isinstance(reference, dict) or not all(isinstance(reference.get(k), str) for k in reference):
        fail("reference", "must be a table of text: " + "; ".join(f"{k} ({v})" for k, v in REFERENCE.items()))
    unknown = sorted(set(reference) - set(REFERENCE))
    if unknown:
        fail(f"reference.{unknown[0]}", f"is not known; [reference] has {', '.join(REFERENCE)}")
    description = raw.get("description", f"plan {name}")
    if not isinstance(description, str):
        fail("description", "must be text")
    return Plan(name, description, spec, base, arms, design, raw)


def _table(raw: dict, key: str, fail) -> dict:
    value = raw.get(key)
    if not isinstance(value, dict):
        fail(key, f"is missing or not a table ([{key}])")
    return value


def _data(data: dict, fail) -> dict:
    """[data]: a text corpus (source and tokenizer, as for nlq prepare) or labelled examples (a source alone)."""
    if isinstance(data.get("source"), str) and is_labelled(data["source"]):
        extra = sorted(set(data) - {"source"})
        if extra:
            fail(f"data.{extra[0]}", f"is not known for labelled examples ({data['source']}); they have a source "
                                     "alone, split as nlq prepare splits them")
        return data
    if not all(isinstance(data.get(k), str) and data.get(k) for k in ("source", "tokenizer")):
        fail("data", "needs source and tokenizer (as for nlq prepare), e.g. source = \"pypkg\", tokenizer = "
                     f"\"bpe:2048\", or a source of labelled examples alone ({LABELLED})")
    extra = sorted(set(data) - {"source", "tokenizer", "val_fraction"})
    if extra:
        fail(f"data.{extra[0]}", "is not known; data has source, tokenizer and val_fraction")
    return data


def _base(table: dict, fail) -> RunConfig:
    preset = table.get("preset")
    if preset not in PRESETS:
        fail("base.preset", f"is {preset!r}; choose one of {', '.join(PRESETS)}")
    changes = {k: v for k, v in table.items() if k != "preset"}
    for key, value in changes.items():
        if key not in SECTIONS or not isinstance(value, dict):
            fail(f"base.{key}", f"is not a config section table; use {', '.join(SECTIONS)}")
    try:
        return update(get_preset(preset), changes)
    except ConfigError as e:
        fail("base", f"sets a bad value: {e}")


def _arms(arms, base: RunConfig, fail) -> list[Arm]:
    if not isinstance(arms, list) or len(arms) < 2 or not all(isinstance(a, dict) for a in arms):
        fail("arms", "must list at least two [[arms]] tables, each with a name and config changes")
    out = []
    for i, arm in enumerate(arms):
        name = arm.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+_-]*", name):
            fail(f"arms[{i}].name", f"is {name!r}; give a name of letters, digits, '.', '+', '_' or '-'")
        changes = {k: v for k, v in arm.items() if k not in ("name", "note", "borrow")}
        for key, value in changes.items():
            if key not in SECTIONS or not isinstance(value, dict):
                fail(f"arms[{i}].{key}", f"is not a config section table; an arm sets {', '.join(SECTIONS)}")
        try:
            update(base, changes)
        except ConfigError as e:
            fail(f"arms[{i}] ({name})", f"sets a bad value: {e}")
        out.append(Arm(name, changes, str(arm.get("note", ""))))
    names = [a.name for a in out]
    if len(set(names)) < len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        fail("arms", f"repeat a name ({', '.join(repeated)}); names must differ")
    return out


COMMIT = re.compile(r"[0-9a-f]{7,40}")


def _borrow(value, field: str, fail) -> dict:
    """An arm's `borrow = { study = "NAME", commit = "HEX" }`: the committed study whose runs of this arm it reuses
    (studies/borrow.py), and the commit those runs record."""
    if not (isinstance(value, dict) and set(value) == {"study", "commit"} and isinstance(value["study"], str)
            and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value["study"]) and isinstance(value["commit"], str)
            and COMMIT.fullmatch(value["commit"])):
        fail(field, f"is {value!r}; give {{ study = \"NAME\", commit = \"HEX\" }}: the committed plan study whose "
                    "runs of this arm are reused and the commit (7 to 40 hex digits) they were trained at")
    return dict(value)


def check_design(recorded, where: str) -> dict:
    """A study's design as study.json holds it (a plan's [design]), checked as a plan file's design is: a
    study.json edited by hand is a one-line error naming the field, not a traceback in its report."""
    def fail(field: str, what: str):
        raise UserError(f"{where}: {field} {what}; run the study again from its plan to rewrite it")

    if not isinstance(recorded, dict) or not isinstance(recorded.get("primary"), list):
        fail("design", "is missing or holds no design.primary")
    arms = [a for a in recorded["primary"] + (recorded.get("secondary") or []) if isinstance(a, str)]
    design = dict(recorded)
    borrowed = design.pop("borrowed", None)
    if borrowed is not None and not (isinstance(borrowed, dict) and set(borrowed) <= set(arms)):
        fail("design.borrowed", f"is {borrowed!r}; it maps arm names to {{study, commit}}")
    for arm, value in (borrowed or {}).items():
        _borrow(value, f"design.borrowed.{arm}", fail)
    return _design(design, arms, fail) | ({"borrowed": borrowed} if borrowed else {})


def _design(design: dict, arms: list[str], fail) -> dict:
    grid = "lrs" in design
    allowed = COMMON | (LR_GRID if grid else FIXED_LR) | OPTIONAL
    unknown = sorted(set(design) - set(allowed))
    if unknown:
        other = "lr and min_lr (one lr for every arm)" if grid else "lrs and its selection fields"
        fail(f"design.{unknown[0]}", f"is not a field of this design (with{'' if grid else 'out'} an lr grid; "
                                     f"{other} belong to the other kind); fields: {', '.join(allowed)}")
    for key, kind in allowed.items():
        if key not in design:
            if key in OPTIONAL or key == "secondary":
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
    def seeds(key):
        values = d[key]
        if len(values) < 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in values)\
                or len(set(values)) < len(values):
            fail(f"design.{key}", f"is {values!r}; give at least two distinct non-negative integers")

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", d["width"]) or ".." in d["width"]:
        fail("design.width", f"is {d['width']!r}; it names the runs: give a short label of letters, digits, '.', '_' "
                             "or '-', such as \"d64\" (no path)")
    shape = d["shape"]
    if sorted(shape) != ["n_embd", "n_head", "n_layer"] or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1_000_000 for v in shape.values()):
        fail("design.shape", f"is {shape!r}; give {{n_layer = L, n_head = H, n_embd = D}} as positive integers")
    if shape["n_embd"] % shape["n_head"]:
        fail("design.shape", f"has n_embd = {shape['n_embd']}, not divisible by n_head = {shape['n_head']}; pick "
                             "n_embd a multiple of n_head")
    if not d["budgets_tpp"] or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 < b < 1e9
                                       for b in d["budgets_tpp"]):
        fail("design.budgets_tpp", f"is {d['budgets_tpp']!r}; give positive, finite tokens-per-parameter budgets")
    ordered = sorted(set(d["budgets_tpp"]))
    if ordered != d["budgets_tpp"]:
        fail("design.budgets_tpp", f"is {d['budgets_tpp']!r}; list each budget once, in increasing order (each one "
                                   f"continues the stable run of the one before), e.g. {ordered!r}")
    if d["primary_tpp"] not in d["budgets_tpp"]:
        fail("design.primary_tpp", f"is {d['primary_tpp']!r}, not one of design.budgets_tpp {d['budgets_tpp']!r}")
    seeds("seeds")
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
        seeds("selection_seeds")
        if set(d["selection_seeds"]) & set(d["seeds"]):
            fail("design.selection_seeds",
                 "share seeds with design.seeds; the lr is chosen on seeds that are not tested")
        positive = all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 10 for x in d["lrs"])
        if not d["lrs"] or not positive or sorted(set(d["lrs"])) != d["lrs"]:
            fail("design.lrs", f"is {d['lrs']!r}; give strictly increasing positive peak lrs, each once")
        if not 1 < d["edge_factor"] < 100 or not 0 <= d["max_extensions"] <= 10 or not 0 < d["min_lr_ratio"] <= 1:
            fail("design", "needs edge_factor in (1, 100), max_extensions in 0..10 and min_lr_ratio in (0, 1]")
    family = d.get("secondary_family", [])
    for member in family:
        ok = member == "interaction" and len(secondary) == 2 or (
            isinstance(member, list) and len(member) == 2 and all(isinstance(m, str) and m in arms for m in member)
            and member[0] != member[1])
        if not ok:
            fail("design.secondary_family", f"holds {member!r}; give [variant, baseline] pairs of two different "
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
        fail("design.looks", f"is {looks!r}; give at least two increasing numbers of test pairs, the first at least 3 "
                             f"and the last {n} (every test seed), e.g. [{max(3, n // 3)}, {n}]")
    spending = d.get("spending", "obf")
    rho = spending.split(":", 1)[1] if spending.startswith("power:") else None
    if spending not in ("obf", "pocock") and not (rho and re.fullmatch(r"\d+(\.\d+)?", rho) and float(rho) > 0):
        fail("design.spending", f"is {spending!r}; choose obf (O'Brien-Fleming type), pocock or power:RHO (RHO > 0)")

"""Plan files: a pre-registered comparison as data (TOML), read into a typed Plan with a one-line error per mistake.

A plan names its corpus, the recipe every run starts from (a preset and config changes), its arms (a name and
config changes each), and its design: the shape, the budgets in tokens per parameter, the seeds, either one lr for
every arm or an lr grid with selection seeds and an edge rule, the endpoint, the margin and the declared secondary
arms. The shipped plans live in nlq/plans/ (`plans/` in a checkout): `nlq study verdict` is `plans/verdict.toml`.
The design goes to study.json as the study's design, the whole plan and its hash beside it: a changed plan is
refused against a study directory that ran another (the field that changed is named).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from nlq.config import SECTIONS, RunConfig, update
from nlq.data.labelled import SOURCES as LABELLED
from nlq.data.labelled import is_labelled
from nlq.errors import ConfigError, UserError
from nlq.plugins import import_modules
from nlq.presets import PRESETS, get_preset
from nlq.studies.definition.design import SHIPPED, WORDING, Arm, DataSpec, plan_hash
from nlq.studies.definition.plan_design import Design, borrow_table, design_of

TOP_KEYS = {"name", "description", "imports", "data", "base", "arms", "design", "reference"}
REFERENCE = {"no_effect_words": "the words of an equivalence shown, e.g. \"no effect of the paper's size\"",
             "paper_claim": "the paper's reported change in Δ's sign, e.g. \"-1.24% to -2.40%\""}


@dataclass(frozen=True)
class Plan:
    name: str
    description: str
    data: DataSpec
    base: RunConfig
    arms: list[Arm]
    design: Design  # what the plan fixes (study.json holds its to_dict())
    raw: dict  # the whole file as parsed: what is frozen


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
    same = plan_hash(raw) == frozen if frozen else Design(**raw["design"]) == study.get("design")
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
    borrowed = {arm["name"]: borrow_table(arm["borrow"], f"arms[{i}].borrow", fail)
                for i, arm in enumerate(raw["arms"]) if "borrow" in arm}
    design = design_of(_table(raw, "design", fail), [a.name for a in arms], fail, borrowed)
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



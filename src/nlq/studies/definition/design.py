"""A study's design as data: its arms (Arm), the corpus it prepares (DataSpec), the study (Study, with the design
its plan fixes) and each run it asks for (Run), with the hash that freezes a plan, the field where two plans differ,
and the reader of study.json (read_study: older files' keys read as today's). Nothing here trains, or imports the
trainer or torch: reading a plan, dry-running it and writing its report need only this (study.py runs it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nlq.errors import UserError
from nlq.fileio import read_json
from nlq.studies.definition.plan_design import Design, check_design

if TYPE_CHECKING:  # this module is data and loads without torch; a run's config is built in Run.config
    from nlq.config import RunConfig

WORDING = "reference"  # a plan's [reference] table: how its report words an outcome, not what the study runs
SHIPPED = Path(__file__).resolve().parents[2] / "plans"  # the shipped plan files (`plans/` in a checkout)


def plan_hash(raw: dict) -> str:
    """The hash of a parsed plan (its canonical JSON, without its [reference] wording): what freezes a study directory
    to its plan."""
    design = {key: value for key, value in raw.items() if key != WORDING}
    return hashlib.sha256(json.dumps(design, sort_keys=True).encode()).hexdigest()[:16]


def changed_field(old, new, prefix: str = "") -> str | None:
    """The first dotted field where two parsed plans differ (list items as field[i]), or None if they are equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            found = changed_field(old.get(key), new.get(key), f"{prefix}{'.' if prefix else ''}{key}")
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return next((f for i, (a, b) in enumerate(zip(old, new)) if (f := changed_field(a, b, f"{prefix}[{i}]"))), None)
    return None if old == new else prefix or "the plan"


@dataclass(frozen=True)
class Arm:
    name: str
    changes: dict = field(default_factory=dict)  # nested {section: {field: value}}
    note: str = ""


@dataclass(frozen=True)
class DataSpec:
    """What `nlq prepare` makes for the study when no --data is given."""
    source: str
    tokenizer: str
    val_fraction: float = 0.05


@dataclass
class Study:
    name: str
    description: str
    base: RunConfig
    arms: list[Arm]
    seeds: list[int]
    data: DataSpec
    lrs: list[float] | None = None  # peak learning rates to sweep; None: the base's train.lr
    baseline: str = "linear"
    width_family: list[str] = field(default_factory=list)  # baselines that differ only in MLP width
    min_lr_ratio: float = 0.1  # min_lr = ratio x peak lr when sweeping
    # Studies whose later runs depend on earlier results (e.g. the lr an lr sweep picked) run in stages:
    # stages(study_dir) yields lists of runs, and each list is finished before the next is asked for.
    stages: Callable[[Path], Iterator[list[Run]]] | None = None
    report: str = "comparison"  # what its report reads (registry.REPORTS)
    # what its plan fixes (a decision's plan_design.Design, an exploratory plan's Exploration): study.json holds it
    design: Design | dict = field(default_factory=dict)
    plan: dict | None = None  # the plan file it was read from (studies/plan.py), frozen by its hash in study.json
    # every stage at once, what a stage learns from the one before (the lr a sweep picks) stood in for: a dry run
    # counts the whole study's tokens with it (they do not depend on what is learnt). None: the stages alone.
    planned_stages: Callable[[Path], Iterator[list[Run]]] | None = None

    def runs(self) -> list[Run]:
        """Seed-major order, so an interrupted study has complete seeds to compare."""
        lrs = self.lrs or [None]
        return [Run(self, v, seed, lr) for seed in self.seeds for lr in lrs for v in self.arms]

    def run_stages(self, study_dir: Path) -> Iterator[list[Run]]:
        if self.stages is None:
            yield self.runs()
        else:
            yield from self.stages(study_dir)

    def describe(self) -> dict:
        described = {"name": self.name, "description": self.description, "baseline": self.baseline,
                     "report": self.report, "width_family": self.width_family, "seeds": self.seeds, "lrs": self.lrs,
                     "arms": [dataclasses.asdict(v) for v in self.arms], "data": dataclasses.asdict(self.data)}
        design = self.design.to_dict() if hasattr(self.design, "to_dict") else self.design
        described |= {"design": design} if design else {}
        plan = {"plan": self.plan, "plan_hash": plan_hash(self.plan)} if self.plan is not None else {}
        return described | plan


@dataclass(frozen=True)
class Run:
    study: Study
    arm: Arm
    seed: int
    lr: float | None
    changes: dict = field(default_factory=dict)  # this run's own deltas on top of the arm's (width, budget)
    tag: str = ""  # name prefix, e.g. "d64-tpp20"
    suffix: str = ""  # name suffix, e.g. "-stable" for the shared stable phase of WSD branches
    labels: dict = field(default_factory=dict)  # recorded in study.json for the report (width, budget, stage)
    chain_name: str = ""  # the chain it belongs to, run in order in one process (a WSD stable run and its branches)
    min_lr: float | None = None  # None: lr x the study's min_lr_ratio (the one place a run's min lr is set)
    lr_in_name: bool = True  # False: a study of one lr per arm keeps the lr out of the run names

    @property
    def chain(self) -> str:
        return self.chain_name or self.name  # a run of no chain is one of its own

    @property
    def name(self) -> str:
        lr = f"-lr{self.lr:g}" if self.lr is not None and self.lr_in_name else ""
        return f"{self.tag + '-' if self.tag else ''}{self.arm.name}{lr}-s{self.seed}{self.suffix}"

    def record(self, lr: float | None) -> dict:
        """What study.json records of this run, lr its config's: name, arm, seed, lr, labels, and its chain's name."""
        return ({"name": self.name, "arm": self.arm.name, "seed": self.seed, "lr": lr, **self.labels}
                | ({"chain": self.chain} if self.chain != self.name else {}))

    def config(self, overrides: list[str], data_dir: Path) -> RunConfig:
        from nlq.config import update  # the config machinery (its projection registry imports torch), when used
        from nlq.overrides import apply_overrides

        config = update(self.study.base, self.arm.changes)
        train = {"seed": self.seed}
        if self.lr is not None:
            train.update(lr=self.lr, min_lr=self.lr * self.study.min_lr_ratio if self.min_lr is None else self.min_lr)
        config = update(config, {"train": train, "data": {"dir": str(Path(data_dir).resolve()) if data_dir else ""}})
        return apply_overrides(update(config, self.changes), overrides)


PLAN_REPORTS = ("plan", "verdict", "verdict-lr")  # a plan study's report (the last two: its name before 2026-12-02)

# study.json's keys before nlq named one thing one way: the design was "settings", the arms "variants" and a run's
# arm "variant". Committed studies keep them; read_study reads them as today's.
OLD_STUDY_KEYS = {"settings": "design", "variants": "arms"}


def upgraded_study(described: dict) -> dict:
    """A study.json's contents with older keys (OLD_STUDY_KEYS, a run record's "variant") read as today's."""
    out = {OLD_STUDY_KEYS.get(key, key): value for key, value in described.items()}
    runs = out.get("runs")
    if isinstance(runs, list):
        out["runs"] = [{("arm" if key == "variant" else key): value for key, value in r.items()}
                       if isinstance(r, dict) else r for r in runs]
    return out


def read_study(study_dir: Path) -> dict:
    """A study directory's study.json, with today's keys, its list of runs checked; one-line errors otherwise."""
    study_path = Path(study_dir) / "study.json"
    if not study_path.is_file():
        raise UserError(f"{study_dir} is not a study directory (no study.json); run nlq study NAME --out {study_dir}")
    study = upgraded_study(read_json(study_path, "the study's description; run nlq study again to rewrite it"))
    runs = study.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) and "name" in r for r in runs):
        raise UserError(f"{study_path} lists its runs wrongly (not a list of runs with names); run nlq study again")
    if study.get("report") in PLAN_REPORTS:
        study = checked_plan_study(study, Path(study_dir))
    elif study.get("plan") is not None:  # an exploratory plan's study (a study of code's own before plans has none)
        study = study | {"design": check_design(study.get("design"), str(study_path), _arm_names(study))}
        check_frozen(study, Path(study_dir))
    return study


def _arm_names(study: dict) -> list[str]:
    return [v.get("name") for v in study.get("arms", []) if isinstance(v, dict)]


def checked_plan_study(study: dict, study_dir: Path) -> dict:
    """A plan's study as study.json holds it (today's keys), checked: its design typed and checked as a plan file's
    is, every arm it names one of the study's, every run record whole, and the record as its runs trained under it
    (check_frozen). Each mistake is one line."""
    where = study_dir / "study.json"
    study = study | {"design": check_design(study.get("design"), str(where))}
    arms = {v.get("name") for v in study.get("arms", []) if isinstance(v, dict)}
    named = study["design"].primary + study["design"].secondary
    if arms and not set(named) <= arms:
        missing = sorted(set(named) - arms)
        raise UserError(f"{where}: its design names arm {missing[0]!r}, which is none of its arms "
                        f"({', '.join(sorted(arms))}); run the study again from its plan to rewrite it")
    check_run_records(study.get("runs", []), where)
    summaries = _summaries(study, study_dir)  # read once for both checks
    check_frozen(study, study_dir, summaries)
    check_runs_hold_their_records(study, study_dir, summaries)
    return study


RUN_FIELDS = ("arm", "seed", "lr", "stage")  # what a plan report reads of every run record (a budget run: tpp too)


RECORD_TYPES = {"name": (str,), "arm": (str,), "seed": (int,), "lr": (int, float, type(None)), "stage": (str,),
                "tpp": (int, float), "steps": (int,)}  # what each field of a run record must be


def check_run_records(runs: list[dict], where: Path) -> None:
    """Every run record of a plan study holds the fields its report reads, each of its type: one line naming the run
    and the field."""
    restore = f"study.json was edited or damaged: restore it (git checkout -- {where} for a committed study)"
    for r in runs:
        name = r["name"]
        needed = RUN_FIELDS + (("tpp",) if r.get("stage") == "budget" else ())
        missing = [key for key in needed if key not in r]
        if missing:
            raise UserError(f"{where}: run {name} has no {missing[0]}; {restore}")
        wrong = [key for key, kinds in RECORD_TYPES.items() if key in r and (
            not isinstance(r[key], kinds) or isinstance(r[key], bool))]
        if wrong:
            raise UserError(f"{where}: run {name!r} has {wrong[0]} {r[wrong[0]]!r}, not a "
                            f"{' or '.join(k.__name__ for k in RECORD_TYPES[wrong[0]] if k is not type(None))}; "
                            f"{restore}")


def check_runs_hold_their_records(study: dict, study_dir: Path, summaries: dict[str, dict]) -> None:
    """Each run record of a plan study agrees with the run it names: the seed, peak lr and steps its config.json
    trained with, the arm's settings, and a finite endpoint (a loss is never below 0) in its summary; one line naming
    the run and the field otherwise. A record rewritten after its runs trained (two seeds swapped) is refused."""
    where, s = study_dir / "study.json", study["design"]
    arms = {a.get("name"): a.get("changes") or {} for a in study.get("arms", []) if isinstance(a, dict)}
    for r in study.get("runs", []):
        run = study_dir / "runs" / r["name"]
        config = read_json(run / "config.json", "a run's config") if (run / "config.json").is_file() else None
        if isinstance(config, dict):
            trained = config.get("train") or {}
            said = {"seed": (r["seed"], trained.get("seed")), "lr": (r["lr"], trained.get("lr"))}
            if r.get("steps") is not None:
                said["steps"] = (r["steps"], trained.get("max_steps"))
            for section, values in arms.get(r["arm"], {}).items():
                for key, value in (values.items() if isinstance(values, dict) else ()):
                    if key in (config.get(section) or {}):
                        said[f"arm {r['arm']}'s {section}.{key}"] = (value, config[section][key])
            for what, (record, actual) in said.items():
                if record is not None and actual is not None and record != actual:
                    raise UserError(f"{where}: run {r['name']} is recorded with {what} {record!r}, but its "
                                    f"config.json trained with {actual!r}: the record was edited after the run "
                                    f"trained; restore study.json (git checkout -- {where} for a committed study)")
        value = summaries.get(r["name"], {}).get(s.endpoint)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and value >= 0):
            raise UserError(f"{where}: run {r['name']}'s summary.json holds {s.endpoint} {value!r}, which no run can "
                            f"end with (a finite number >= 0); train the run again (remove its directory) or restore "
                            f"its summary.json")


def check_frozen(study: dict, study_dir: Path, summaries: dict[str, dict] | None = None) -> None:
    """A plan study's record cannot be quietly rewritten: its plan must hash to the plan_hash in study.json and in
    every run's summary (record.plan_hash, where the run recorded one), and its design must be the plan's. A study
    frozen before plans were recorded in study.json (results/verdict) is held to the shipped plan of its name when
    its runs record that nlq trained them (record.code); one written by hand, as the tests write them, has no record
    to check. Each mismatch is one line naming the field that differs from what the runs trained under."""
    where = study_dir / "study.json"
    restore = f"restore the file (git checkout -- {where}, for a committed study)"
    summaries = _summaries(study, study_dir) if summaries is None else summaries
    records = {name: summary["record"] for name, summary in summaries.items()
               if isinstance(summary.get("record"), dict)}
    plan, frozen = study.get("plan"), study.get("plan_hash")
    if plan is None:
        shipped = SHIPPED / f"{study.get('name')}.toml"
        if not shipped.is_file() or not any(record.get("code") for record in records.values()):
            return  # no plan to hold it to
        plan, source = tomllib.loads(shipped.read_text(encoding="utf-8")), f"{shipped.name}, the plan its runs ran"
    else:
        source = "the plan its runs trained under (study.json's plan)"
        if not isinstance(plan, dict) or plan_hash(plan) != frozen:
            named = _against_shipped(study, frozen)
            raise UserError(f"{where}: its plan does not hash to its plan_hash {frozen}{named}: the plan was edited "
                            f"after the study ran; {restore}")
    borrowed = {a["name"]: a["borrow"] for a in plan.get("arms", []) if isinstance(a, dict) and "borrow" in a}
    expected = check_design(dict(plan.get("design") or {}, **({"borrowed": borrowed} if borrowed else {})),
                            str(where), _arm_names(plan))
    if expected != study["design"]:
        field_name = changed_field(expected.to_dict(), study["design"].to_dict(), "design") or "design"
        key = field_name.removeprefix("design.").split(".")[0].split("[")[0]
        now, then = study["design"].to_dict().get(key), expected.to_dict().get(key)
        raise UserError(f"{where}: {field_name} differs from {source} ({key} is {now!r} here and {then!r} there): "
                        f"the record was edited after the study ran; set it back to {then!r} or {restore}")
    hashes = {}  # plan hash -> the first run that recorded it
    for name, record in records.items():
        if record.get("plan_hash") is not None:
            if not isinstance(record["plan_hash"], str):
                raise UserError(f"{where}: run {name} records plan hash {record['plan_hash']!r}, not a hash (text); "
                                f"its summary.json was edited or damaged: restore it or train the run again")
            hashes.setdefault(record["plan_hash"], name)
    if len(hashes) > 1:
        (a, first), (b, second) = list(hashes.items())[:2]
        raise UserError(f"{where}: its runs trained under different plans (run {first}: plan hash {a}; run {second}: "
                        f"{b}); a study directory holds the runs of one plan: move the others to a study of their own")
    if hashes and frozen is not None and frozen not in hashes:
        hash_, name = next(iter(hashes.items()))
        raise UserError(f"{where}: plan_hash is {frozen}, but its runs trained under plan hash {hash_} (run {name})"
                        f"{_against_shipped(study, hash_)}; {restore}")


def _summaries(study: dict, study_dir: Path) -> dict[str, dict]:
    """Run name -> its summary.json (the record of code, plan hash and times; the endpoint), for the runs in this
    study's runs/ that have one."""
    out = {}
    for r in study.get("runs", []):
        path = study_dir / "runs" / r["name"] / "summary.json"
        summary = read_json(path, "a run summary") if path.is_file() else None
        if isinstance(summary, dict):
            out[r["name"]] = summary
    return out


def _against_shipped(study: dict, frozen: str) -> str:
    """Where the study's plan differs from the shipped plan of its name, when that plan is the one hashed `frozen`
    (the plan its runs trained under, at hand): ' (FIELD differs from NAME.toml, whose hash it is)', else ''."""
    shipped = SHIPPED / f"{study.get('name')}.toml"
    original = tomllib.loads(shipped.read_text(encoding="utf-8")) if shipped.is_file() else None
    plan = study.get("plan")
    if not (original and isinstance(plan, dict) and plan_hash(original) == frozen):
        return ""
    field_name = changed_field({k: v for k, v in original.items() if k != WORDING},
                               {k: v for k, v in plan.items() if k != WORDING})
    return f" ({field_name} differs from {shipped.name}, whose hash that is)" if field_name else ""

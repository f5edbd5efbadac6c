"""What keeps a study's design its own: a plan is frozen by its hash once it has run in a study directory, and a
command-line override may not overrule a field the study sets per arm or per run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import read_json
from nlq.overrides import parse_overrides
from nlq.projections import own_sources


def plan_hash(raw: dict) -> str:
    """The hash of a parsed plan (its canonical JSON): what freezes a study directory to its plan."""
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


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


def check_frozen(name: str, plan: dict | None, study_dir: Path) -> None:
    """A study directory that ran one plan refuses another: the changed field is named."""
    path = Path(study_dir) / "study.json"
    if plan is None or not path.is_file():
        return
    earlier = read_json(path, "the study's description")
    if "plan_hash" not in earlier or earlier["plan_hash"] == plan_hash(plan):
        return
    field_name = changed_field(earlier.get("plan") or {}, plan)
    raise UserError(f"{study_dir} ran another version of plan {name}: {field_name} changed; a pre-registered plan "
                    f"is frozen once it has run: put the changed plan in a new study directory")


def frozen_own_code(study_dir: Path, models: list) -> dict[str, dict]:
    """The projections of the user's own that these model configs use (class, file, sha256), checked against what
    study.json recorded when the study started: their code is part of the design, so a changed file is refused
    like a changed plan."""
    own = own_sources({name for model in models for name in model.placements.values()})
    path = Path(study_dir) / "study.json"
    earlier = read_json(path, "the study's description").get("projections", {}) if path.is_file() else {}
    for name, source in own.items():
        before = earlier.get(name)
        if before and before["sha256"] != source["sha256"]:
            raise UserError(f"{study_dir} ran projection {name} from {before['file']} with sha256 "
                            f"{before['sha256'][:16]}, and {source['file']} now has {(source['sha256'] or '')[:16]}: "
                            f"the code of a study's arm is frozen once it has run; restore it or start a new study "
                            f"directory")
    return earlier | own


def dotted_keys(changes: dict, prefix: str = "") -> set[str]:
    """{"model": {"query": "x", "projections": {"q": "y"}}} -> {"model.query", "model.projections.q"}."""
    keys = set()
    for key, value in changes.items():
        keys |= dotted_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
    return keys


ALIASES = {"model.projections.q": "model.query"}  # two names of one field


def check_overrides(study, runs: list, overrides: list[str]) -> None:
    """A command-line override of a field the study sets per arm or per run (its design: the query of each variant,
    the swept lrs, the seeds, a budget's steps) would silently overrule it while the run names still say otherwise:
    a one-line error naming the field. Fields the study leaves alone may be overridden (they are recorded)."""
    designed = set()
    for run in runs:
        designed |= dotted_keys(run.variant.changes) | dotted_keys(run.changes) | {"train.seed"}
        if run.lr is not None:
            designed |= {"train.lr", "train.min_lr"}
    designed = {ALIASES.get(k, k) for k in designed}
    clash = sorted(k for k in dotted_keys(parse_overrides(overrides)) if ALIASES.get(k, k) in designed)
    if clash:
        raise UserError(f"--{clash[0]} would overrule what study {study.name} sets per arm or run "
                        f"({', '.join(clash)} {'is' if len(clash) == 1 else 'are'} part of its design); leave "
                        f"{'it' if len(clash) == 1 else 'them'} out, or define a study (or plan) that varies "
                        f"{'it' if len(clash) == 1 else 'them'}")

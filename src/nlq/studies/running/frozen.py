"""What keeps a study's design its own: a plan is frozen by its hash once it has run in a study directory, a
command-line override may not overrule a field the study sets per arm or per run, the overrides a study ran with are
part of it (only those that cannot change what a run computes may differ later), a run directory whose recorded
config is not the one the study would give it is never trained into, and a start claims its directory (claim) only
after every check has passed, one start at a time."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from nlq.config import RunConfig
from nlq.data.labelled import is_labelled
from nlq.errors import LockHeld, UserError
from nlq.fields import upgraded
from nlq.fileio import read_json, write_json
from nlq.lock import DirectoryLock
from nlq.overrides import apply_overrides, parse_overrides
from nlq.projections import own_sources
from nlq.studies.definition.design import changed_field, plan_hash, upgraded_study
from nlq.studies.definition.plan_explore import EXPLORE_FIELDS
from nlq.training.distributed import resolve_device
from nlq.training.hardware import check_memory
from nlq.training.trainer import loss_impl


def check_frozen(name: str, plan: dict | None, study_dir: Path) -> None:
    """A study directory that ran one study or plan refuses another (for a plan, the changed field is named), and one
    that holds runs without the study.json that says what they are is refused too."""
    path = Path(study_dir) / "study.json"
    runs = Path(study_dir) / "runs"
    if (Path(study_dir) / "config.json").is_file() or (Path(study_dir) / "checkpoints").is_dir():
        raise UserError(f"{study_dir} is a run directory (config.json, checkpoints); give the study a directory of its "
                        f"own")
    if not path.is_file():
        if runs.is_dir() and any(p.is_dir() for p in runs.iterdir()):
            raise UserError(f"{study_dir} holds runs but no study.json, which says what study they belong to; restore "
                            f"it, or give this study a new directory")
        return
    earlier = read_json(path, "the study's description")
    if earlier.get("name") != name:
        raise UserError(f"{study_dir} holds study {earlier.get('name')!r}, not {name!r}; give each study a directory "
                        f"of its own")
    if plan is None or "plan_hash" not in earlier and _family_before_plans(upgraded_study(earlier), plan):
        return
    if "plan_hash" not in earlier:
        raise UserError(f"{path} records no plan hash, so it cannot show that its runs ran plan {name}; restore it, or "
                        f"give this study a new directory")
    if earlier["plan_hash"] == plan_hash(plan):
        return
    field_name = changed_field(earlier.get("plan") or {}, plan)
    raise UserError(f"{study_dir} ran another version of plan {name}: {field_name} changed; a pre-registered plan "
                    f"is frozen once it has run: put the changed plan in a new study directory")


def _family_before_plans(earlier: dict, plan: dict) -> bool:
    """Whether study.json was written by a family's Python definition before every study was a plan (a `nlq reproduce`
    directory of then) and describes the same study as this exploratory plan: its arms, seeds and lrs. Such a
    directory goes on under the plan, which then freezes it."""
    design = plan.get("design") or {}
    arms = [(a.get("name"), {k: v for k, v in a.items() if k not in ("name", "note")}) for a in plan.get("arms", [])]
    return (earlier.get("report") == design.get("kind") in EXPLORE_FIELDS
            and earlier.get("seeds") == design.get("seeds") and earlier.get("lrs") == design.get("lrs")
            and [(a.get("name"), a.get("changes")) for a in earlier.get("arms", [])] == arms)


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
    """A command-line override of a field the study sets per arm or per run (its design: the query of each arm,
    the swept lrs, the seeds, a budget's steps) would silently overrule it while the run names still say otherwise:
    a one-line error naming the field. Fields the study leaves alone may be overridden (they are recorded)."""
    designed = set()
    for run in runs:
        designed |= dotted_keys(run.arm.changes) | dotted_keys(run.changes) | {"train.seed"}
        if run.lr is not None:
            designed |= {"train.lr", "train.min_lr"}
    designed = {ALIASES.get(k, k) for k in designed}
    clash = sorted(k for k in dotted_keys(parse_overrides(overrides)) if ALIASES.get(k, k) in designed)
    if clash:
        raise UserError(f"--{clash[0]} would overrule what study {study.name} sets per arm or run "
                        f"({', '.join(clash)} {'is' if len(clash) == 1 else 'are'} part of its design); leave "
                        f"{'it' if len(clash) == 1 else 'them'} out, or define a study (or plan) that varies "
                        f"{'it' if len(clash) == 1 else 'them'}")


# Fields that cannot change what a run computes, only where and how it is watched: they may differ between the
# commands that continue a study. Everything else a command-line override sets is part of the study.
NEUTRAL = frozenset({"train.device", "train.threads", "train.log_every", "train.checkpoint_every",
                     "train.keep_checkpoints", "train.tensorboard", "train.wandb", "train.peak_tflops",
                     "dist.timeout_s", "data.dir"})
PATHS = frozenset({"train.resume_from", "train.init_from"})  # compared by file name: a study directory may move


def _computed(config: dict) -> dict:
    """A config as nested dicts without the neutral fields; path fields reduced to their file name."""
    out = {}
    for section, values in config.items():
        kept = {}
        for key, value in (values or {}).items():
            dotted = f"{section}.{key}"
            if dotted in NEUTRAL:
                continue
            kept[key] = Path(value).name if dotted in PATHS and value else value
        out[section] = kept
    return out


def check_study_dir(study, study_dir: Path, overrides: list[str]) -> None:
    """What a study directory that has run refuses: another plan, or overrides that compute something else."""
    check_frozen(study.name, study.plan, study_dir)
    check_same_overrides(study, study_dir, overrides)


def check_same_overrides(study, study_dir: Path, overrides: list[str]) -> None:
    """Against a study directory that has run, this command's overrides must compute what the recorded ones did
    (applied to the study's base recipe); only the NEUTRAL fields may differ. One line naming the field otherwise."""
    path = Path(study_dir) / "study.json"
    if not path.is_file():
        return
    earlier = read_json(path, "the study's description").get("overrides")
    if not isinstance(earlier, list):
        return
    before = _computed(apply_overrides(study.base, earlier).to_dict())
    now = _computed(apply_overrides(study.base, overrides).to_dict())
    field_name = changed_field(before, now)
    if field_name:
        raise UserError(f"{study_dir} ran with {' '.join(earlier) or 'no overrides'}, and this command gives "
                        f"{' '.join(overrides) or 'none'} ({field_name} differs): what a study's runs compute is "
                        f"frozen once it has run; give the same overrides (only {', '.join(sorted(NEUTRAL))} may "
                        f"differ), or put the changed study in a new directory")


def check_run_config(run_dir: Path, config: RunConfig) -> None:
    """A run directory that exists must hold the config this study gives the run (the NEUTRAL fields aside, fields
    the study leaves at "auto", which the run records resolved, fields added to nlq since the run was written,
    where they hold their default, and train.max_steps, which the study sets per run and a stable run's later
    segments raise); a one-line refusal otherwise, before anything is trained into it."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return
    recorded = _computed(upgraded(read_json(path, "a run's config")))
    expected = _computed(config.to_dict())
    for tree in (recorded, expected):  # a WSD stable run is trained in segments, each to a later step
        tree.get("train", {}).pop("max_steps", None)
    defaults = _computed(RunConfig().to_dict())
    for section, values in expected.items():
        for key in list(values):
            if values[key] == "auto":  # the trainer records what "auto" resolved to on its device
                recorded.get(section, {}).pop(key, None)
                del values[key]
            elif key not in recorded.get(section, {}) and values[key] == defaults[section].get(key):
                del values[key]  # a field nlq gained after this run was written, at the value it had before
    field_name = changed_field(recorded, expected)
    if field_name:
        raise UserError(f"run {Path(run_dir).name} was started with another config than the study gives it now "
                        f"({field_name}: {_at(recorded, field_name)!r} there, {_at(expected, field_name)!r} now); "
                        f"it is not trained into: restore the study's overrides, or remove that run directory to train "
                        f"it again")


def _at(tree: dict, dotted: str):
    node = tree
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def claim(study, study_dir: Path, overrides: list[str], data_dir: str | None, shard: tuple[int, int] | None) -> bool:
    """Decide, one start at a time, that study_dir holds this study: refuse another study, plan or overrides, and
    whatever its first stage would refuse (a designed field overridden, changed code of one's own, more shards than
    chains, a loss or a model size this machine cannot run), before anything is written; then write its study.json
    if there is none, so that a second start of another design is refused. Returns whether it wrote it."""
    data = Path(data_dir) if data_dir else None if study.data.source == "task" else study_dir / "data"
    with start_lock(study_dir):
        check_study_dir(study, study_dir, overrides)
        first = next(iter(study.run_stages(study_dir)))
        check_overrides(study, first, overrides)
        configs = [r.config(overrides, data) for r in first]
        frozen_own_code(study_dir, [c.model for c in configs])
        for config in configs[:1] + configs[-1:]:  # a size this machine cannot run (arms share a recipe)
            check_memory(config, config.train.batch_size, resolve_device(config.train.device))
        for config in configs + arm_configs(study, overrides, data):  # a loss it cannot run, in any arm and stage
            loss_impl(config, bool(config.data.task), resolve_device(config.train.device))
            check_split(study, config)
        groups = len(dict.fromkeys(r.chain for r in first))
        if shard is not None and shard[1] > groups:  # more shards than the first stage's work: a typo
            raise UserError(f"--shard {shard[0]}/{shard[1]}: the first stage of {study.name} has {groups} groups of "
                            f"runs, so at most {groups} shards can share it; use N <= {groups}")
        if (study_dir / "study.json").is_file():
            return False
        study_dir.mkdir(parents=True, exist_ok=True)
        write_json(study_dir / "study.json", study.describe() | {"overrides": overrides, "runs": []})
        return True


def check_split(study, config: RunConfig) -> None:
    """data.split=seed needs labelled examples to split again: a text corpus's val split is fixed."""
    if config.data.split == "seed" and not is_labelled(study.data.source):
        raise UserError(f"data.split=seed splits labelled examples by each run's seed, and study {study.name} "
                        f"trains on {study.data.source!r}, a text corpus with a fixed val split; leave it out")


def arm_configs(study, overrides: list[str], data) -> list[RunConfig]:
    """Every arm's config on the study's recipe (a plan's at its design's shape), overrides applied: what an arm sets
    for all its runs, such as its own train.loss_impl, is then checked before any stage starts, not when that arm's
    first run does."""
    from nlq.config import update

    shape = getattr(study.design, "shape", None)
    out = []
    for arm in study.arms:
        config = update(study.base, arm.changes)
        config = update(config, {"model": dict(shape)}) if shape else config
        out.append(apply_overrides(update(config, {"data": {"dir": str(data) if data else ""}}), overrides))
    return out


def release(study_dir: Path, claimed: bool) -> None:
    """Undo a claim this start made, when the start failed before any run: a directory frozen to a study that never
    ran would refuse the corrected one."""
    runs = Path(study_dir) / "runs"
    if claimed and not (runs.is_dir() and any(runs.iterdir())):
        (Path(study_dir) / "study.json").unlink(missing_ok=True)


@contextlib.contextmanager
def start_lock(study_dir: Path, wait_s: float = 120.0):
    """The lock under which a start decides what a study directory holds (shards of one study wait for each other)."""
    lock = DirectoryLock(Path(study_dir).resolve().parent / f".{Path(study_dir).name}.start.lock",
                         f"the start of study directory {study_dir}")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.__enter__()
            break
        except LockHeld:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        yield
    finally:
        lock.__exit__(None, None, None)

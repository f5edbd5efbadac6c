"""Arms a plan borrows from another committed plan study instead of training them again.

An arm with `borrow = { study = "verdict-lr", commit = "3e1f3c9..." }` in a plan's [[arms]] is that study's arm of the
same name: its selection and test runs are read from the study directory of that name beside this one
(STUDY_DIR/../verdict-lr, as results/ holds them), never trained here. It may be borrowed only if it is the same
experiment: the same corpus, base recipe and arm changes, the same shape, budgets, lr grid and selection rule, and
test seeds that cover this plan's; every borrowed run must record the commit the plan names. Each mismatch is a
one-line error naming the field. `scripts/reuse_check.py` retrains some of its chains at the current code to show
that they would come out the same.
"""

from __future__ import annotations

from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import read_json
from nlq.studies.definition.design import changed_field, read_study, upgraded_study

# what must be equal for runs of another study to pair with this one's: the design of the experiment, not its seeds
# or its arms
SAME_DESIGN = ("width", "shape", "budgets_tpp", "primary_tpp", "endpoint", "lrs", "edge_factor", "max_extensions",
               "min_lr_ratio", "selection_seeds", "lr", "min_lr")
ARM_KEYS_OF_NO_CONSEQUENCE = ("name", "note", "borrow")


def borrowed_arms(design) -> dict[str, dict]:
    """arm -> {"study", "commit"} for the arms a plan's design (plan_design.Design) borrows."""
    return design.borrowed or {}


def source_dir(study_dir: Path, source: str) -> Path:
    return Path(study_dir).resolve().parent / source


def borrowed_records(study_dir: Path, study: dict) -> list[dict]:
    """The run records (as study.json holds them) of every borrowed arm, each with "dir", its run directory in the
    source study; checked against this study's plan first."""
    records = []
    for arm, borrow in borrowed_arms(study["design"]).items():
        source = source_dir(study_dir, borrow["study"])
        described = _source_study(source, arm, borrow, study_dir)
        _check_same_experiment(described, study, arm, borrow)
        for record in described.get("runs", []):
            if record.get("arm") == arm:
                records.append({**record, "dir": str(source / "runs" / record["name"]), "borrowed_from": borrow})
                summary = source / "runs" / record["name"] / "summary.json"
                if summary.is_file():  # before anything trains: a wrong commit is refused at the start
                    check_commit(read_json(summary, "a run summary"), records[-1])
    return records


def check_commit(summary: dict, record: dict) -> None:
    """A borrowed run must have been trained at the commit the plan names."""
    borrow = record.get("borrowed_from")
    code = str(((summary.get("record") or {}).get("code")) or "")
    if borrow and not code.startswith(borrow["commit"]):
        raise UserError(f"run {record['name']} of study {borrow['study']} was trained at code "
                        f"{code[:12] or '(not recorded)'}, not at commit {borrow['commit'][:12]} that the plan borrows "
                        "it at; name the commit its runs record")


def _source_study(source: Path, arm: str, borrow: dict, study_dir: Path) -> dict:
    path = source / "study.json"
    if not path.is_file():
        raise UserError(f"arm {arm} borrows the runs of study {borrow['study']}, expected beside {study_dir} at "
                        f"{source} (its study.json); copy or link the committed results/{borrow['study']} there")
    described = upgraded_study(read_json(path, f"the study.json of {borrow['study']}"))
    if described.get("name") == borrow["study"] and isinstance(described.get("plan"), dict):
        described = read_study(source)  # its record checked as every reader checks it (an edited design is refused)
    if described.get("name") != borrow["study"] or not isinstance(described.get("plan"), dict):
        raise UserError(f"{path} is not the plan study {borrow['study']} (it is {described.get('name')!r}); arm {arm} "
                        f"borrows from a study run from a plan file")
    return described


def _check_same_experiment(source: dict, study: dict, arm: str, borrow: dict) -> None:
    """One line naming the first field where the source study is not the same experiment as this one."""
    ours, theirs = study["plan"], source["plan"]

    def refuse(field: str) -> None:
        raise UserError(f"arm {arm} cannot borrow study {borrow['study']}'s runs: {field} differs between the two "
                        f"plans; borrow only from a study of the same design, or train the arm here")

    for key in ("data", "base"):
        found = changed_field(theirs.get(key), ours.get(key), key)
        if found:
            refuse(found)
    arms = {a.get("name"): a for a in theirs.get("arms", [])}
    if arm not in arms:
        refuse(f"arm {arm} (absent from {borrow['study']})")
    strip = {k: v for k, v in ours_arm(ours, arm).items() if k not in ARM_KEYS_OF_NO_CONSEQUENCE}
    found = changed_field({k: v for k, v in arms[arm].items() if k not in ARM_KEYS_OF_NO_CONSEQUENCE}, strip,
                          f"arms.{arm}")
    if found:
        refuse(found)
    design, their_design = study["design"], source["design"]
    for key in SAME_DESIGN:
        if getattr(design, key) != their_design.get(key):
            refuse(f"design.{key}")
    missing = sorted(set(design.seeds) - set(their_design["seeds"]))
    if missing:
        refuse(f"design.seeds (seed {missing[0]} is not one of its test seeds)")


def ours_arm(plan: dict, arm: str) -> dict:
    return next(a for a in plan["arms"] if a.get("name") == arm)

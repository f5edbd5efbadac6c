"""The engine of pre-registered plans (plans/*.toml, `nlq study PLAN`): the runs a plan asks for, stage by stage.

Every arm trains one WSD chain per seed (a stable run and a cooldown branch per budget in tokens per parameter,
every branch scored on the whole validation split); within a seed the arms' order alternates, so that shards dealing
chains round-robin each get every arm and a pair ends at about the same time. A plan with one lr (`design.lr`,
`design.min_lr`) trains its primary arms, then its secondary ones. A plan with an lr grid (`design.lrs`,
`design.min_lr_ratio`) first trains every arm at every grid lr on selection seeds that are never tested, extends
the grid by the edge rule stage by stage while an arm's best lr sits at an edge, and then trains each arm at its
selected lr on the test seeds, the primary arms first. An arm borrowed from another committed study (borrow.py) is
never trained: its selection and test endpoints are that study's. The report of both is plan_report.py. An
exploratory plan (kind = comparison, scaling or probes) is families.py's to run.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from nlq.errors import UserError
from nlq.fileio import read_json, write_json
from nlq.runs.rundir import DIVERGED
from nlq.studies.definition.design import Run, Study
from nlq.studies.definition.plan import Plan
from nlq.studies.definition.plan_explore import Exploration
from nlq.studies.inference.selection import grid_step, lowest, lr_means, two_best
from nlq.studies.inference.sequential import look
from nlq.studies.running.borrow import borrowed_arms, borrowed_records, check_commit
from nlq.studies.running.families import family_study
from nlq.studies.running.wsd import wsd_chain


def chains(study: Study, study_dir: Path, seeds: list[int], lrs: dict[str, list[float]],
           borrowed_too: bool = False) -> list[Run]:
    """One WSD chain per (seed, arm, lr), borrowed arms left out (unless borrowed_too: the firmer selection trains
    them on seeds of its own). A grid plan names its runs with their lr and sets min lr = lr x min_lr_ratio; a one-lr
    plan keeps the lr out of the names and takes its min lr as registered."""
    s = study.design
    runs = []
    for i, seed in enumerate(seeds):
        arms = [v for v in study.arms if lrs.get(v.name) and (borrowed_too or v.name not in borrowed_arms(s))]
        arms = arms if i % 2 == 0 else arms[::-1]
        for lr in sorted({lr for v in arms for lr in lrs[v.name]}):
            min_lr = s.min_lr_at(lr)
            for arm in (v for v in arms if lr in lrs[v.name]):
                levels = wsd_chain(study, arm, seed, study_dir, width=s.width, shape=s.shape,
                                   budgets_tpp=s.budgets_tpp, lr=lr, min_lr=min_lr,
                                   branch={"data": {"final_eval": "full"}}, lr_in_name=s.kind == "lr-grid")
                runs += [run for level in levels for run in level]
    return runs


def run_records(study_dir: Path, study: dict) -> list[dict]:
    """study.json's run records, then those of the arms borrowed from other studies (with "dir", where they are)."""
    return study.get("runs", []) + borrowed_records(study_dir, study)


def records_of(study: Study, runs: list[Run]) -> dict:
    """The study as endpoints() reads it, from runs this process asked for (their records as study.json holds them),
    with its design and plan (for the arms it borrows)."""
    return {"design": study.design, "plan": study.plan, "runs": [r.record(r.lr) for r in runs]}


def run_dir_of(study_dir: Path, record: dict) -> Path:
    return Path(record["dir"]) if "dir" in record else study_dir / "runs" / record["name"]


def endpoints(study_dir: Path, study: dict, seeds: list[int]) -> dict[tuple[str, float, int], float | None]:
    """(arm, lr, seed) -> the endpoint of its primary-budget run, or None if it (or its chain) diverged; runs still
    to come are absent. Borrowed arms' runs are read where they are, and must record the commit borrowed at."""
    s = study["design"]
    out = {}
    for r in run_records(study_dir, study):
        if r.get("stage") != "budget" or r.get("tpp") != s.primary_tpp or r["seed"] not in seeds:
            continue
        run_dir = run_dir_of(study_dir, r)
        if (run_dir / DIVERGED).is_file():
            out[(r["arm"], r["lr"], r["seed"])] = None
        elif (run_dir / "summary.json").is_file():
            summary = read_json(run_dir / "summary.json", "a run summary")
            check_commit(summary, r)
            if summary.get(s.endpoint) is not None:  # a summary without it (or null) has not ended as a plan's run
                out[(r["arm"], r["lr"], r["seed"])] = summary[s.endpoint]  # ends; the report names it
    return out


def selected_lrs(study: Study, study_dir: Path):
    """The stages of a grid plan's selection, one at a time; its return value (what `yield from` gives) is each
    arm's selected lr."""
    s = study.design
    arms = s.selected_arms([v.name for v in study.arms])
    trained = chains(study, study_dir, s.selection_seeds, {arm: s.lrs for arm in arms})

    def means() -> dict[str, dict]:  # from the runs this selection trained (as study.json records them)
        ended = endpoints(study_dir, records_of(study, trained), s.selection_seeds)
        return {arm: lr_means(ended, arm, s.selection_seeds) for arm in arms}

    if trained:  # an lr rule whose arms are all borrowed or pinned trains nothing here
        yield trained
    asked = set()
    while True:  # the edge rule: one more lr per arm at an edge, stage by stage, until no arm asks for one
        now = means()
        more = {arm: [step] for arm in arms if (step := grid_step(now[arm], s)["next"]) is not None}
        unended = [arm for arm in arms if any(lr not in now[arm] for lr in s.lrs)]
        lent = [arm for arm in unended + list(more) if arm in borrowed_arms(s)]
        if lent:
            raise UserError(f"arm {lent[0]} is borrowed from study {borrowed_arms(s)[lent[0]]['study']}, whose "
                            "selection of it has not ended; finish that study first")
        if unended or any((arm, lr[0]) in asked for arm, lr in more.items()):
            raise UserError(f"the selection runs of {study.name} have not all ended; run the study again to "
                            "finish them")
        if not more:
            break
        asked |= {(arm, lr[0]) for arm, lr in more.items()}
        extension = chains(study, study_dir, s.selection_seeds, more)
        trained = trained + extension  # a new list: the stage yielded before stays as it was
        yield extension
    chosen = {arm: grid_step(now[arm], s)["lr"] for arm in arms} | (s.pinned_lrs or {})
    if any(chosen[arm] is None for arm in s.primary):
        out = [arm for arm in s.primary if chosen[arm] is None]
        raise UserError(f"every lr of {', '.join(out)} diverged in the selection; the test cannot run (the "
                        "pre-registration says so); nlq report shows the selection")
    if s.refine_seeds:
        refined = yield from refined_lrs(study, study_dir, endpoints(study_dir, records_of(study, trained),
                                                                     s.selection_seeds))
        if s.refine_selects:
            chosen |= refined
    return chosen


def refined_lrs(study: Study, study_dir: Path, selection: dict):
    """The firmer selection (design.refine_seeds): each refined arm's two best lrs of the grid's selection (selection:
    its endpoints on the selection seeds) trained on the refine seeds (a borrowed arm too, here); its return value is
    each refined arm's lr with the lowest mean over the selection and refine seeds together."""
    s = study.design
    best = {arm: two_best(lr_means(selection, arm, s.selection_seeds)) for arm in s.refined_arms}
    best = {arm: lrs for arm, lrs in best.items() if lrs}
    runs = chains(study, study_dir, s.refine_seeds, best, borrowed_too=True)
    if runs:
        yield runs
    ended = endpoints(study_dir, records_of(study, runs), s.refine_seeds)
    if any((arm, lr, seed) not in ended for arm, lrs in best.items() for lr in lrs for seed in s.refine_seeds):
        raise UserError(f"the refinement runs of {study.name} have not all ended; run the study again to finish them")
    pooled = selection | ended
    return {arm: lowest(lr_means(pooled, arm, s.selection_seeds + s.refine_seeds)) for arm in best}


def registered_lr(study: Study, study_dir: Path):
    """A fixed-lr plan's lr rule: every arm at the registered lr, no stage before the test (a generator, as every
    rule of LR_RULES is, that yields nothing)."""
    yield from ()
    return {v.name: study.design.lr for v in study.arms}


# A plan's lr rule by its kind (plan_design.Design.kind): the stages before the test, returning each arm's lr. A new
# kind of plan is a Design kind (its fields, plan_design.KIND_FIELDS), a rule here and a report flow in plan_report.
LR_RULES = {"fixed-lr": registered_lr, "lr-grid": selected_lrs}


def sequential_test(study: Study, study_dir: Path, lrs: dict[str, list[float]]):
    """The primary arms' test chains look by look (design.looks, in the registered seed order); after each look has
    ended, the statistic (sequential.look) on its pairs, recorded in study_dir/sequential.json; at a crossed bound
    no further test chain is trained (every shard computes the same from the same endpoints). Its return value (what
    `yield from` gives) is the seeds the test used, on which the secondary arms then train."""
    s, (baseline, method) = study.design, study.design.primary
    done, trained = 0, []
    for k, n in enumerate(s.looks):
        look_runs = chains(study, study_dir, s.seeds[done:n], lrs)
        trained += look_runs
        yield look_runs
        done, seeds = n, s.seeds[:n]
        ended = endpoints(study_dir, records_of(study, trained), seeds)
        values = {(arm, seed): v for (arm, lr, seed), v in ended.items() if lr in lrs.get(arm, [])}
        if any((arm, seed) not in values for arm in (baseline, method) for seed in seeds):
            raise UserError(f"the test runs of look {k + 1} of {study.name} have not all ended; run the study again "
                            "to finish them")
        deltas = [values[(method, seed)] - values[(baseline, seed)] for seed in seeds
                  if values[(method, seed)] is not None and values[(baseline, seed)] is not None]
        at = look(deltas, k, s.looks, 1 - s.confidence, s.spending, s.margin,
                  s.stop_for_equivalence)  # two-sided at 1 - confidence, as the fixed test
        record_look(study_dir, at)
        if at["action"] in ("difference", "equivalence"):
            return seeds
    return s.seeds


def record_look(study_dir: Path, at: dict) -> None:
    """Add a look's statistic and what it decided to study_dir/sequential.json and to study.json's "sequential" (with
    the UTC time it was first computed; a look computed again by another shard or a restart keeps its first
    record)."""
    path = study_dir / "sequential.json"
    looks = read_json(path, "the sequential test's record")["looks"] if path.is_file() else []
    if all(entry["look"] != at["look"] for entry in looks):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        looks = looks + [at | {"utc": stamp}]
        write_json(path, {"looks": looks})
        study = read_json(study_dir / "study.json", "the study's description")
        write_json(study_dir / "study.json", study | {"sequential": looks})  # the stop is part of the study


def plan_study(plan: Plan) -> Study:
    """The study of a plan: its arms, seeds and design; its stages as the module docstring says (an exploratory
    plan's, families.py's)."""
    s = plan.design
    if isinstance(s, Exploration):
        return family_study(plan)
    study = Study(plan.name, plan.description, plan.base, plan.arms, seeds=s.seeds, data=plan.data,
                  report="plan", design=s, plan=plan.raw)

    def stages(study_dir: Path):
        borrowed_records(study_dir, {"design": s, "plan": plan.raw})  # a borrowed arm must be the same experiment
        chosen = yield from LR_RULES[s.kind](study, study_dir)
        tested = s.seeds
        for group in (s.primary, s.secondary):  # the primary arms' test runs first
            lrs = {arm: [chosen[arm]] for arm in group if chosen[arm] is not None}  # an arm out of every lr: no test
            if not set(lrs) - set(borrowed_arms(s)):
                continue
            if group is s.primary and s.looks is not None:  # a sequential test: look by look, until it stops
                tested = yield from sequential_test(study, study_dir, lrs)
            else:
                yield chains(study, study_dir, tested, lrs)

    study.stages = stages
    return study


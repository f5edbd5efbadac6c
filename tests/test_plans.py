"""Plan files: the shipped plans build the studies that ran (the committed configs), a plan is frozen once it has
run, a mistake is one line naming its field, and a user's own tiny plan runs end to end to its decision."""

import dataclasses
import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from helpers import fake_training
from nlq.errors import UserError
from nlq.fields import upgraded
from nlq.studies.definition.plan import SHIPPED, load_plan, read_plan, shipped_plans
from nlq.studies.registry import get_study

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "results" / "verdict"


def as_committed(config: dict, saved: dict) -> dict:
    """config as a committed record holds it: its paths without the machine's absolute part (runs/paths.py), and
    without the fields nlq gained after `saved` was written, where they hold their default: the value every earlier
    run had (model.attn_gate, model.options, the classifier's fields, ...)."""
    from nlq.config import RunConfig
    from nlq.runs.paths import scrubbed_text

    defaults = RunConfig().to_dict()
    config = json.loads(scrubbed_text(json.dumps(config, indent=2)))
    out = {section: dict(values) for section, values in config.items()}
    for section, values in out.items():
        for key in list(values):
            if key not in saved.get(section, {}) and values[key] == defaults[section].get(key):
                del values[key]
    return out


def test_the_shipped_plans_are_the_named_studies_and_the_checkout_links_them():
    assert {"verdict", "verdict-lr", "example"} <= set(shipped_plans())
    assert (ROOT / "plans" / "verdict.toml").resolve() == (SHIPPED / "verdict.toml").resolve()
    for name in ("verdict", "verdict-lr"):
        by_name, by_path = get_study(name), get_study(str(ROOT / "plans" / f"{name}.toml"))
        assert by_name.describe() == by_path.describe() and by_name.plan["design"] == by_name.design.to_dict()


def test_plans_verdict_builds_exactly_the_runs_of_the_committed_verdict():
    """Every committed run of results/verdict is a run of plans/verdict.toml with the same resolved config (the
    configs written before train.loss_impl existed ran the plain loss, which the plan pins); the plan's runs that
    are not committed are only the identity chains still running when the snapshot was taken."""
    study_json = json.loads((COMMITTED / "study.json").read_text())
    study = get_study(str(ROOT / "plans" / "verdict.toml"))
    committed = {p.parent.name: upgraded(json.loads(p.read_text())) for p in (COMMITTED / "runs").glob("*/config.json")}
    branch = next(c["train"]["resume_from"] for c in committed.values() if c["train"]["resume_from"])
    where = Path(branch).parents[3]  # the study directory the runs were trained in (their checkpoints' paths)
    planned = {}
    for stage in study.run_stages(where):
        planned |= {r.name: r.config([], Path(study_json["data_dir"])).to_dict() for r in stage}
    assert committed and set(committed) <= set(planned)
    assert all("identity" in name for name in set(planned) - set(committed))
    for name, saved in committed.items():
        ours = as_committed(planned[name], saved)
        for section, values in saved.items():
            for key, value in values.items():
                if section == "train" and key == "loss_impl":
                    assert value == "plain", name
                    continue
                assert ours[section][key] == value, (name, section, key)
        assert ours["train"]["loss_impl"] == "plain" and set(ours) == set(saved)


def test_plans_verdict_lr_builds_exactly_the_runs_of_the_committed_verdict_lr():
    """Every committed run of results/verdict-lr (the selection grid, then the test runs at the lrs the committed
    selection picks) is a run of plans/verdict-lr.toml with the same resolved config, the one it was trained with."""
    results = ROOT / "results" / "verdict-lr"
    study_json = json.loads((results / "study.json").read_text())
    committed = {p.parent.name: upgraded(json.loads(p.read_text())) for p in (results / "runs").glob("*/config.json")}
    stages, planned = get_study(str(ROOT / "plans" / "verdict-lr.toml")).run_stages(results), {}
    while True:  # the stages the committed results decide; one that needs runs not committed yet ends the list
        try:
            stage = next(stages)
        except (StopIteration, UserError, OSError, KeyError):
            break
        for r in stage:
            planned[r.name] = r.config([], Path(study_json["data_dir"])).to_dict()  # its paths: as_committed
    assert committed and set(committed) <= set(planned)
    assert all(as_committed(planned[name], saved) == saved for name, saved in committed.items())
    tested = {f"-s{seed}" for seed in study_json["settings"]["seeds"]}
    assert any(name.endswith(tuple(tested)) for name in committed)  # test runs are among them


def test_the_committed_verdict_lr_runs_record_their_code_times_and_one_first_batch_per_seed_and_stage():
    """Pairing and timing can be checked from the files alone: every committed run of results/verdict-lr names its
    code commit and UTC start and end, and every arm of one seed at one stage saw the same first batch (the stable
    runs at step 0, each branch where it leaves its stable run); another seed saw another."""
    import datetime

    records = {}
    for path in (ROOT / "results" / "verdict-lr" / "runs").glob("*/summary.json"):
        record, config = json.loads(path.read_text())["record"], json.loads((path.parent / "config.json").read_text())
        assert re.fullmatch(r"[0-9a-f]{40}", record["code"]), path
        start, end = (datetime.datetime.strptime(record[k], "%Y-%m-%dT%H:%M:%SZ")
                      for k in ("started_utc", "ended_utc"))
        assert start < end, path
        stage = "stable" if path.parent.name.endswith("-stable") else "branch"
        records.setdefault((config["train"]["seed"], stage), {})[path.parent.name] = record["first_batch"]
    assert records
    for (seed, stage), batches in records.items():
        assert len({(b["step"], b["sha256"]) for b in batches.values()}) == 1, (seed, stage, batches)
    stable = {seed: next(iter(b.values()))["sha256"] for (seed, stage), b in records.items() if stage == "stable"}
    assert len(set(stable.values())) == len(stable)  # each seed its own batches


def test_plans_verdict_lr_builds_the_amended_design():
    study = get_study("verdict-lr")
    s = study.design
    first = next(study.run_stages(Path("/nonexistent")))
    budget = [r for r in first if r.labels["stage"] == "budget"]
    assert len(budget) == 4 * len(s.lrs) * len(s.selection_seeds) == 60
    configs = [r.config([], Path("/data")) for r in budget]
    assert {c.train.loss_impl for c in configs} == {"chunked"} and {c.data.final_eval for c in configs} == {"full"}
    assert {(c.model.query, c.model.qk_norm) for c in configs} == {("linear", False), ("nonlinear", False),
                                                                     ("linear", True), ("nonlinear", True)}
    assert len(s.seeds) == 16 and not set(s.seeds) & set(s.selection_seeds)


def plan_text(tmp_path, byte_data=None, **design_changes) -> Path:
    """A tiny user plan: two arms on the byte data, 2 pairs, a budget of a few dozen steps."""
    raw = tomllib.loads((SHIPPED / "example.toml").read_text())
    raw["base"] = {"preset": "nano", "model": {"vocab_size": 257, "block_size": 32},
                   "train": {"schedule": "wsd", "batch_size": 4, "warmup_steps": 2, "log_every": 10},
                   "data": {"eval_windows": 4}}
    raw["arms"] = [{"name": "linear", "model": {"query": "linear"}}, {"name": "mine", "model": {"query": "nonlinear"}}]
    raw["design"] |= {"shape": {"n_layer": 1, "n_head": 2, "n_embd": 16}, "budgets_tpp": [1, 2], "primary_tpp": 2,
                      "seeds": [1, 2], "primary": ["linear", "mine"], "secondary": []} | design_changes
    path = tmp_path / "mine.toml"
    path.write_text(to_toml(raw))
    return path


def to_toml(raw: dict) -> str:
    """Enough TOML for the plans of these tests (tables, arrays of tables, inline values)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"{k} = {value(v)}" for k, v in raw.items() if not isinstance(v, (dict, list))]
    for key, v in raw.items():
        if isinstance(v, dict):
            lines += [f"[{key}]"] + [f"{k} = {value(x)}" for k, x in v.items()]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                lines += [f"[[{key}]]"] + [f"{k} = {value(x)}" for k, x in item.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_a_users_tiny_plan_runs_end_to_end_and_its_report_shows_the_decision(byte_data, tmp_path, capsys):
    from nlq.cli import main

    plan = plan_text(tmp_path)
    out = tmp_path / "study"
    main(["study", str(plan), "--out", str(out), "--data", str(byte_data)])
    report = (out / "report.md").read_text()
    assert "**Verdict: mine " in report or "**Verdict: no effect" in report or "**Verdict: inconclusive" in report
    assert "Decision rule: the interval below 0: mine better" in report
    assert "equivalence shown: no effect beyond ±0.037 nats" in report and "the paper's size" not in report
    described = json.loads((out / "study.json").read_text())
    assert described["plan_hash"] and described["plan"]["design"]["seeds"] == [1, 2]
    summaries = [json.loads(p.read_text()) for p in (out / "runs").glob("*tpp2*/summary.json")]
    assert len(summaries) == 4 and all("full_val_loss" in s for s in summaries)
    every = [json.loads(p.read_text())["record"] for p in (out / "runs").glob("*/summary.json")]
    assert len(every) == 12 and all(r["plan_hash"] == described["plan_hash"] and r["code"] for r in every)


@pytest.mark.slow
def test_a_users_tiny_lr_grid_plan_selects_then_tests_and_its_report_shows_both(byte_data, tmp_path):
    """A plan of the other kind, written by a user: two arms on an lr grid of two, two selection seeds, no secondary
    arms and none of verdict-lr's optional fields; the engine selects each arm's lr, tests the 2 pairs at it, and
    the report shows the selection table and the decision."""
    from nlq.cli import main

    grid = {"lrs": [1e-3, 4e-3], "min_lr_ratio": 0.1, "edge_factor": 2.0, "max_extensions": 0,
            "selection_seeds": [8, 9]}
    plan = plan_text(tmp_path, **grid)
    raw = tomllib.loads(plan.read_text())
    del raw["design"]["lr"], raw["design"]["min_lr"]
    plan.write_text(to_toml(raw))
    assert load_plan(plan).design.kind == "lr-grid"
    out = tmp_path / "study"
    main(["study", str(plan), "--out", str(out), "--data", str(byte_data)])
    report = (out / "report.md").read_text()
    assert "| arm | peak lr | runs ended |" in report and "(selected)" in report
    assert "Decision rule: the interval below 0: mine better" in report and "**Verdict: " in report
    outcome = json.loads((out / "verdict.json").read_text())
    chosen = outcome["selected_lrs"]
    assert set(chosen) == {"linear", "mine"} and set(chosen.values()) <= {1e-3, 4e-3}
    tested = [json.loads(p.read_text()) for p in (out / "runs").glob("*tpp2*-s[12]/config.json")]
    assert len(tested) == 4 and {c["train"]["seed"] for c in tested} == {1, 2}
    assert {(c["model"]["query"], c["train"]["lr"]) for c in tested} == {("linear", chosen["linear"]),
                                                                       ("nonlinear", chosen["mine"])}


def test_a_changed_plan_is_refused_against_its_study_directory_naming_the_field(byte_data, tmp_path, monkeypatch):
    from nlq.studies.running.study import run_study

    fake_training(monkeypatch, lambda config, run_dir: {"val_loss": 3.0, "full_val_loss": 3.0})
    path = plan_text(tmp_path)
    run_study(get_study(str(path)), tmp_path / "s", data_dir=str(byte_data), log=lambda *_: None)
    run_study(get_study(str(path)), tmp_path / "s", data_dir=str(byte_data), log=lambda *_: None)  # unchanged: fine
    changed = plan_text(tmp_path, margin=0.02)
    with pytest.raises(UserError, match=r"design\.margin changed") as error:
        run_study(get_study(str(changed)), tmp_path / "s", data_dir=str(byte_data), log=lambda *_: None)
    assert "\n" not in str(error.value)
    from nlq.studies.running.dry_run import dry_run_text as dry_run

    with pytest.raises(UserError, match=r"design\.margin changed"):
        dry_run(get_study(str(changed)), tmp_path / "s", data_dir=str(byte_data))


@pytest.mark.parametrize("change,needle", [
    (lambda r: r.pop("design"), "design is missing"),
    (lambda r: r.update(colour="red"), "colour is not a plan field"),
    (lambda r: r["design"].update(seeds=[1, 1]), "design.seeds"),
    (lambda r: r["design"].update(primary=["linear", "nope"]), "design.primary names 'nope'"),
    (lambda r: r["design"].update(margin="0.037"), "design.margin is '0.037'"),
    (lambda r: r["design"].update(lrs=[1e-3, 2e-3]), "design.lr is not a field of this design"),
    (lambda r: r["design"].update(primary_tpp=7), "design.primary_tpp is 7"),
    (lambda r: r["design"].update(budgets_tpp=[20, 5], primary_tpp=5), "in increasing order (each one continues"),
    (lambda r: r["design"].update(budgets_tpp=[5, 5]), "list each budget once"),
    (lambda r: r["arms"][1].update(model={"query": "nope"}), "arms[1] (residual) sets a bad value"),
    (lambda r: r["base"].update(preset="huge"), "base.preset is 'huge'"),
    (lambda r: r["arms"].append({"name": "linear"}), "arms repeat a name (linear)"),
])
def test_every_plan_mistake_is_one_line_naming_the_field(change, needle):
    raw = tomllib.loads((SHIPPED / "example.toml").read_text())
    change(raw)
    with pytest.raises(UserError) as error:
        read_plan(raw, "my.toml")
    assert needle in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert str(error.value).startswith("my.toml: ")


def test_a_missing_or_broken_plan_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match="does not exist; shipped plans"):
        load_plan(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text("name = [")
    with pytest.raises(UserError, match="cannot parse plan"):
        load_plan(tmp_path / "bad.toml")
    shutil.copy(SHIPPED / "example.toml", tmp_path / "ok.toml")
    assert load_plan(tmp_path / "ok.toml").design.kind == "fixed-lr"
    assert load_plan(SHIPPED / "verdict-lr.toml").design.kind == "lr-grid"


def test_the_dry_run_says_what_the_test_pairs_buy_at_the_planning_sd(tmp_path, capsys):
    """verdict-lr's 16 pairs were fixed for at least 70% power at a true Δ of 0.02 and sd 0.03; a user's plan that
    declares more power than its pairs give is told how many would."""
    from nlq.cli import main
    from nlq.studies.inference.stats import power_paired_t
    from nlq.studies.running.plan_costs import power_text

    line = power_text(get_study("verdict-lr").design)
    assert line.startswith("power: 16 test pairs at the planning sd 0.03 find a true Δ of 0.02 with probability 0.70")
    assert power_paired_t(0.02, 0.03, 16) >= 0.70 > power_paired_t(0.02, 0.03, 15)
    plan = plan_text(tmp_path, planning_difference=0.02, planning_power=0.9)
    main(["study", str(plan), "--out", str(tmp_path / "s"), "--dry-run"])
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("power: 2 test pairs at the planning sd 0.03")
    assert out[-1].endswith("below the declared planning_power 0.9: 26 pairs would reach it")


def test_the_dry_run_bounds_every_stage_and_lists_the_weights_each_arm_shares_with_the_baseline():
    """A grid plan's dry run used to count its first stage only ("in all: 24 runs" where 36 ran); it now bounds
    the whole plan, the edge rule's worst case included, and shows which initial weights each arm shares."""
    from nlq.studies.running.plan_costs import bounds_text, shared_start_text

    study = get_study("gate-lr")
    bounds = bounds_text(study)
    assert bounds.startswith("whole plan, every stage: selection 45 chains (1.33G tokens); edge extensions at most "
                             "54 chains (1.60G tokens); test 48 chains (1.42G tokens); at most 147 chains")
    assert bounds.endswith("hours: estimated once a run of it has finished here (its tokens/s)")
    shared = shared_start_text(study).splitlines()
    assert "arm gate-qknorm: 22 of 24 parameter tensors start equal to linear-qknorm's; the others: " \
           "attn.gate_proj.weight" in shared
    assert any(line.startswith("arm nonlinear-qknorm: 20 of 28") and "attn.q_proj.up.weight" in line
               for line in shared)


def test_a_plans_reference_words_its_report_and_is_not_part_of_its_hash(tmp_path):
    """[reference] words the outcome (the shipped verdict plans: "no effect of the paper's size"), is checked like
    any field, and leaves the plan's hash alone, so a study frozen before it was added still runs and reports."""
    from nlq.studies.definition.design import plan_hash
    from nlq.studies.definition.plan import reference_of
    from nlq.studies.reports.plan_sections import no_effect

    raw = tomllib.loads((SHIPPED / "verdict-lr.toml").read_text())
    assert raw["reference"]["no_effect_words"] == "no effect of the paper's size"
    without = {k: v for k, v in raw.items() if k != "reference"}
    assert plan_hash(raw) == plan_hash(without)
    committed = json.loads((Path(__file__).resolve().parents[1] / "results" / "verdict-lr" / "study.json").read_text())
    assert "reference" not in committed["plan"] and reference_of(committed) == raw["reference"]
    assert no_effect(committed) == "no effect of the paper's size"
    design = dataclasses.replace(load_plan(SHIPPED / "verdict-lr.toml").design, margin=0.05)
    mine = {"name": "mine", "design": design, "plan": without | {"name": "mine"}}
    assert no_effect(mine) == "no effect beyond ±0.05 nats"
    for bad, needle in (({"words": "x"}, "reference.words is not known"),
                        ({"paper_claim": 1}, "must be a table of text")):
        with pytest.raises(UserError, match=needle):
            read_plan(raw | {"reference": bad})


def test_every_shipped_plans_design_round_trips_through_study_json():
    """A plan's Design is typed and frozen; study.json holds its to_dict(), which reads back as the same Design."""
    import dataclasses

    from nlq.studies.definition.plan_design import check_design
    from nlq.studies.definition.plan_explore import Exploration

    for name, path in shipped_plans().items():
        design = load_plan(path).design
        assert check_design(json.loads(json.dumps(design.to_dict())), name) == design, name
        if isinstance(design, Exploration):  # an exploratory plan (kind = "comparison", "scaling" or "probes")
            assert design["kind"] == design.kind and dict(design) == design.to_dict() == design
            with pytest.raises(dataclasses.FrozenInstanceError):
                design.seeds = [1]
            continue
        assert design.kind == ("lr-grid" if design.lrs is not None else "fixed-lr")
        assert design["seeds"] == design.seeds and dict(design) == design.to_dict() == design  # the mapping view
        assert ("looks" in design) == (design.looks is not None)
        assert design.get("spending") == (None if design.spending == "obf" else design.spending)  # defaults left out
        with pytest.raises(dataclasses.FrozenInstanceError):
            design.margin = 1.0

"""Every report, built from synthetic study directories (no training): the numbers it prints, the pre-registered
verdict, the Holm-adjusted readings, and that a metrics.jsonl whose last line was cut short breaks none of them."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nlq.errors import UserError
from nlq.studies.definition.plan import SHIPPED, load_plan
from nlq.studies.registry import build_report

SETTINGS = load_plan(SHIPPED / "verdict.toml").design.to_dict()  # the shipped one-lr plan, as study.json holds it


def write_study(root, study, runs):
    """study.json with these runs (labels) and, per run, summary.json and a metrics.jsonl whose last line is cut."""
    (root / "runs").mkdir(parents=True, exist_ok=True)
    study = study | {"runs": [{k: v for k, v in r.items() if k not in ("summary", "curve")} for r in runs]}
    (root / "study.json").write_text(json.dumps(study))
    for r in runs:
        run_dir = root / "runs" / r["name"]
        run_dir.mkdir()
        (run_dir / "summary.json").write_text(json.dumps(r["summary"]))
        lines = [json.dumps({"step": step, **values}) for step, values in r.get("curve", [])]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 9999, "val_lo')  # killed mid-line


def summary(val_loss, **more):
    return {"val_loss": val_loss, "non_embedding_parameters": 1000, "tokens_per_s": 1.0, "tokens": 300_000,
            "final_step": 10, **more}


def test_comparison_report_reads_truncated_metrics_and_adjusts_over_the_variants(tmp_path):
    runs = [{"name": f"{v}-s{s}", "variant": v, "seed": s, "lr": 1e-3, "summary": summary(loss + 0.01 * s),
             "curve": [(0, {"val_loss": 5.0}), (10, {"val_loss": loss + 0.01 * s})]}
            for v, loss in (("linear", 3.0), ("nonlinear", 2.9), ("identity", 3.1)) for s in (1, 2, 3)]
    write_study(tmp_path, {"name": "t", "description": "", "baseline": "linear", "report": "comparison",
                           "variants": [{"name": v} for v in ("linear", "nonlinear", "identity")]}, runs)
    markdown = build_report(tmp_path)
    assert "Holm-adjusted over the 2 variants" in markdown
    result = json.loads((tmp_path / "result.json").read_text())  # the numbers, without parsing the Markdown
    paired = result["paired"]
    assert paired["nonlinear"]["mean"] == pytest.approx(-0.1) and paired["identity"]["mean"] == pytest.approx(0.1)
    assert paired["nonlinear"]["verdict"] == "better" and paired["identity"]["verdict"] == "worse"
    assert [row["arm"] for row in result["arms"]] == ["linear", "nonlinear", "identity"]
    assert "| nonlinear | 3 | -0.1000 |" in markdown and "| identity | 3 | +0.1000 |" in markdown


def scaling_runs(deltas):
    return [{"name": f"d8-tpp{t}-{v}-s{s}", "variant": v, "seed": s, "lr": 1e-3, "stage": "budget", "width": "d8",
             "tpp": t, "summary": summary(4.0 - 0.1 * t + (d if v == "nonlinear" else 0.0) + 0.01 * s,
                                          tokens=1000 * t, non_embedding_parameters=1000 if v == "linear" else 1250)}
            for t, d in deltas.items() for v in ("linear", "nonlinear") for s in (1, 2, 3)]


def test_scaling_report_gives_each_variants_tokens_per_parameter_and_holm_verdicts(tmp_path):
    write_study(tmp_path, {"name": "scaling", "description": "", "baseline": "linear", "report": "scaling",
                           "variants": [{"name": "linear"},
                                        {"name": "nonlinear"}]}, scaling_runs({2: 0.05, 4: 0.0, 8: -0.05}))
    markdown = build_report(tmp_path)
    assert "Holm-adjusted over the 3 intervals" in markdown
    assert "| d8 | 2 | 1.6 | 2,000 |" in markdown  # 2,000 tokens over the variant's 1,250 parameters
    result = json.loads((tmp_path / "result.json").read_text())
    deltas = {row["tpp"]: row for row in result["deltas"]}
    assert {t: round(d["mean"], 6) for t, d in deltas.items()} == {2: 0.05, 4: 0.0, 8: -0.05}
    assert result["trends"][0]["mean"] == pytest.approx(-0.05) and result["trends"][0]["span"] == "2-8"
    assert (tmp_path / "scaling_delta.png").stat().st_size > 0


def test_probes_report_medians_are_true_medians_and_sign_tests_are_adjusted(tmp_path):
    runs = []
    for v, steps in (("linear", [1800, 2000, None]), ("nonlinear", [1900, 2000, 2200])):
        for s, solve in enumerate(steps, start=1):
            curve = [(0, {"val_acc": 0.1}), (100, {"val_acc": 0.5})] + ([(solve, {"val_acc": 0.95})] if solve else [])
            runs.append({"name": f"mqar-d8-{v}-s{s}", "variant": v, "seed": s, "lr": 1e-3, "stage": "probe",
                         "task": "mqar-2", "width": 8, "curve": curve,
                         "summary": summary(1.0, val_acc=0.95 if solve else 0.5)})
    write_study(tmp_path, {"name": "probes", "description": "", "baseline": "linear", "report": "probes",
                           "variants": [{"name": "linear"},
                                        {"name": "nonlinear"}], "settings": {"threshold": 0.9}}, runs)
    markdown = build_report(tmp_path)
    assert "| mqar-2 | linear | 2/3 | | | | | 1,900 |" in markdown  # (1800 + 2000) / 2: even count
    assert "| mqar-2 | nonlinear | 3/3 | 1 | 0 | 1 | 1 | 2,000 |" in markdown
    result = json.loads((tmp_path / "result.json").read_text())
    cells = {row["arm"]: row for row in result["cells"]}
    assert cells["linear"]["steps_to_solve"] == [1800, 2000, None] and cells["nonlinear"]["accuracy"] == [0.95] * 3
    pooled = {(row["scope"], row["arm"]): row for row in result["pooled"]}
    assert pooled[("mqar-2", "linear")]["median"] == 1900 and pooled[("mqar-2", "nonlinear")]["solved"] == 3


def verdict_study(tmp_path, pairs, identity=True):
    """A verdict study of len(seeds) registered pairs, the first `pairs` finished with these Δ."""
    settings = SETTINGS | {"seeds": [1, 2, 3, 4, 5, 6]}
    deltas = [-0.050, -0.045, -0.055, -0.048, -0.052, -0.050][:pairs]
    runs = []
    for s, d in enumerate(deltas, start=1):
        for v, shift in (("linear", 0.0), ("nonlinear", d), *((("identity", 0.01 * s),) if identity else ())):
            for tpp in (100, 300):
                loss = 3.0 - tpp / 1000 + 0.02 * s + shift
                runs.append({"name": f"d64-tpp{tpp}-{v}-s{s}", "variant": v, "seed": s, "lr": 2e-3, "stage": "budget",
                             "width": "d64", "tpp": tpp, "summary": summary(loss + 0.001, full_val_loss=loss)})
    write_study(tmp_path, {"name": "verdict", "description": "", "baseline": "linear", "report": "verdict",
                           "settings": settings, "code": ["abc"],
                           "variants": [{"name": v} for v in ("linear", "nonlinear", "identity")]}, runs)


def test_verdict_report_shows_no_endpoint_before_every_registered_pair_is_in(tmp_path):
    verdict_study(tmp_path, pairs=5)
    markdown = build_report(tmp_path)
    assert "5 of 6 pre-registered pairs have finished" in markdown
    assert "Verdict" not in markdown and "-0.05" not in markdown
    outcome = json.loads((tmp_path / "verdict.json").read_text())
    assert outcome == {"registered_pairs": 6, "finished_pairs": {"nonlinear": 5, "identity": 5}}


def test_verdict_report_prints_the_test_and_the_verdict_in_the_rules_words(tmp_path):
    verdict_study(tmp_path, pairs=6)
    markdown = build_report(tmp_path)
    assert "**Verdict: nonlinear better" in markdown and "equivalence test: p =" in markdown
    assert "mean Δ -0.0500 nats" in markdown
    # the family: nonlinear at 100, identity at 100 and 300
    assert "Holm-adjusted over the 3 declared comparisons as one family." in markdown
    assert (tmp_path / "verdict_deltas.png").stat().st_size > 0
    decision = json.loads((tmp_path / "verdict.json").read_text())["decision"]
    assert decision["verdict"] == "better" and decision["interval"]["mean"] == pytest.approx(-0.05)


def test_a_summary_with_a_number_that_is_no_number_is_a_one_line_error(tmp_path):
    runs = scaling_runs({2: 0.0})
    runs[0]["summary"]["val_loss"] = "NaN"
    write_study(tmp_path, {"name": "scaling", "description": "", "baseline": "linear", "report": "scaling",
                           "variants": [{"name": "linear"}, {"name": "nonlinear"}]}, runs)
    with pytest.raises(UserError, match="val_loss is 'NaN', not a number"):
        build_report(tmp_path)


@pytest.mark.slow
def test_publish_verdict_writes_only_the_marked_blocks_and_no_number_before_every_pair_is_in(tmp_path):
    root = Path(__file__).resolve().parent.parent
    docs = {"README.md": "# x\n<!-- verdict-status -->old<!-- /verdict-status -->\nkept\n",
            "RESULTS.md": "# R\n<!-- verdict-status -->old<!-- /verdict-status -->\nkept\n"
                          "## The verdict\n<!-- verdict-report -->old<!-- /verdict-report -->\nkept too\n"}
    for name, text in docs.items():
        (tmp_path / name).write_text(text)

    def publish(pairs):
        study = tmp_path / f"study{pairs}"
        verdict_study(study, pairs=pairs)
        for run in (study / "runs").iterdir():
            (run / "config.json").write_text("{}")
        subprocess.run([sys.executable, str(root / "scripts" / "publish_verdict.py"), str(study), "--results",
                        str(tmp_path / f"results{pairs}"), "--readme", str(tmp_path / "README.md"),
                        "--results-md", str(tmp_path / "RESULTS.md")], check=True, capture_output=True)
        return (tmp_path / "README.md").read_text(), (tmp_path / "RESULTS.md").read_text()

    readme, results = publish(5)
    assert "5 of 6 pairs finished" in readme and "Verdict" not in readme + results and "-0.05" not in readme + results
    assert "#### The pre-registered test" in results and "5 of 6 pre-registered pairs have finished" in results
    assert len(list((tmp_path / "results5" / "runs").iterdir())) == 30  # the metrics' cut last line is skipped

    readme, results = publish(6)
    assert "**Verdict (" in readme and "nonlinear better" in readme and "-0.0500 nats" in readme
    assert results.startswith("# R\n<!-- verdict-status -->**Verdict (") and "| 6 | " in results
    assert "equivalence within ±0.037 not shown" in readme and "](results6/verdict_deltas.png)" in results
    for text, original in ((readme, docs["README.md"]), (results, docs["RESULTS.md"])):
        outside = re.sub(r"<!-- (verdict-\w+) -->.*?<!-- /\1 -->", "", text, flags=re.DOTALL)
        assert outside == re.sub(r"<!-- (verdict-\w+) -->.*?<!-- /\1 -->", "", original, flags=re.DOTALL)


def test_verdict_secondary_family_counts_unfinished_comparisons_as_p_1(tmp_path):
    """Before the identity arm is in, nonlinear at 100 tokens/param is adjusted as one of the 3 declared
    comparisons (the two identity ones at p = 1), not as a family of one."""
    from nlq.studies.inference.stats import paired_difference

    verdict_study(tmp_path, pairs=6, identity=False)
    markdown = build_report(tmp_path)
    row = next(line for line in markdown.splitlines() if line.startswith("| nonlinear | 100 |"))
    deltas = [-0.050, -0.045, -0.055, -0.048, -0.052, -0.050]
    p = paired_difference(deltas, [0.0] * 6)["p"]
    assert row.split("|")[6].strip() == f"{p:.3g}" and row.split("|")[7].strip() == f"{min(1.0, 3 * p):.3g}"
    assert "the 2 whose pairs are not all in yet count with p = 1" in markdown
    assert "| identity |" not in markdown


def test_report_collect_copies_the_finished_runs_without_checkpoints_and_reports_there(tmp_path, capsys):
    from nlq.cli import main

    study = tmp_path / "study"
    verdict_study(study, pairs=3)
    (study / "runs" / "unfinished").mkdir()  # no summary: not copied
    for run in (study / "runs").iterdir():
        (run / "config.json").write_text("{}")
        (run / "checkpoints").mkdir(exist_ok=True)
        (run / "checkpoints" / "step_0000001.pt").write_bytes(b"x")
    main(["report", str(study), "--collect", str(tmp_path / "results")])
    copied = sorted(p.name for p in (tmp_path / "results" / "runs").iterdir())
    assert copied and "unfinished" not in copied and not list((tmp_path / "results").rglob("*.pt"))
    assert (tmp_path / "results" / "report.md").is_file() and "finished runs ->" in capsys.readouterr().out


@pytest.mark.parametrize("named", [False, True])  # study.json before and after it names each run's chain
def test_collect_keeps_a_stable_run_back_until_its_chain_has_ended(tmp_path, named):
    """A copy holds no checkpoints: a WSD stable run whose budget branch has not finished is not copied yet (a study
    resumed from the copy would find it finished and its branch without the checkpoint to start from)."""
    from nlq.studies.running.collect import collect

    study = tmp_path / "study"
    chain = {"variant": "linear", "lr": 2e-3, "width": "d64"}

    def of(seed):  # a branch's record names its chain (the stable run) in study.json written since 2026-12-04
        return {"chain": f"d64-linear-s{seed}-stable"} if named else {}

    runs = [{"name": "d64-linear-s1-stable", "seed": 1, "stage": "stable", **chain},
            {"name": "d64-tpp10-linear-s1", "seed": 1, "stage": "budget", "tpp": 10, **chain, **of(1)},
            {"name": "d64-tpp20-linear-s1", "seed": 1, "stage": "budget", "tpp": 20, **chain, **of(1)},
            {"name": "d64-linear-s2-stable", "seed": 2, "stage": "stable", **chain},
            {"name": "d64-tpp10-linear-s2", "seed": 2, "stage": "budget", "tpp": 10, **chain, **of(2)},
            {"name": "d64-tpp20-linear-s2", "seed": 2, "stage": "budget", "tpp": 20, **chain, **of(2)}]
    study.mkdir()
    (study / "study.json").write_text(json.dumps({"name": "x", "runs": runs}))
    for run in runs:
        if run["name"] == "d64-tpp20-linear-s1":  # seed 1's chain: its last branch still training
            continue
        folder = study / "runs" / run["name"]
        folder.mkdir(parents=True)
        for name in ("config.json", "summary.json", "metrics.jsonl"):
            (folder / name).write_text("{}\n")
    assert collect(study, tmp_path / "out") == 4
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == [
        "d64-linear-s2-stable", "d64-tpp10-linear-s1", "d64-tpp10-linear-s2", "d64-tpp20-linear-s2"]


RESULTS = Path(__file__).resolve().parents[1] / "results"
# every committed study, and a study committed inside another (results/cpu/fresh-clone-*: a reproduction of it)
COMMITTED = sorted(str(p.parent.relative_to(RESULTS)) for pattern in ("*/study.json", "*/*/study.json")
                   for p in RESULTS.glob(pattern)) if RESULTS.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("name", COMMITTED)
def test_every_committed_report_regenerates_byte_for_byte(name, tmp_path):
    """`nlq report results/NAME` rewrites what is committed there, the plots included, from the committed runs."""
    import shutil

    committed = RESULTS / name
    copy = shutil.copytree(committed, tmp_path / name)
    for other in RESULTS.iterdir():  # the studies beside it, whose arms a plan may borrow
        if other.is_dir() and other.name != name.split("/")[0]:
            (tmp_path / other.name).symlink_to(other)
    build_report(copy)
    outputs = [p.name for p in committed.iterdir()
               if p.suffix in (".md", ".csv", ".json", ".png") and p.name != "study.json"]
    assert "report.md" in outputs and "result.json" in outputs  # every report writes its numbers as JSON
    changed = [f for f in outputs if (committed / f).read_bytes() != (copy / f).read_bytes()]
    assert not changed, f"nlq report results/{name} no longer reproduces {changed}"


@pytest.mark.parametrize("damage,needle", [(lambda s: s["settings"].pop("margin"), "design.margin is missing"),
                                           (lambda s: s["settings"].update(seeds="x"), "design.seeds is 'x'"),
                                           (lambda s: s.pop("settings"), "design is missing")])
def test_a_plan_study_whose_settings_were_edited_by_hand_is_a_one_line_error(tmp_path, capsys, damage, needle):
    import shutil

    from helpers import one_line_error

    study = shutil.copytree(RESULTS / "verdict", tmp_path / "verdict")
    described = json.loads((study / "study.json").read_text())
    damage(described)
    (study / "study.json").write_text(json.dumps(described))
    one_line_error(capsys, ["report", study], needle)
    assert (study / "report.md").read_bytes() == (RESULTS / "verdict" / "report.md").read_bytes()  # not rewritten

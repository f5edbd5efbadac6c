"""The analyses behind docs/RESULTS.md (analysis/*.py, each named after the section it regenerates): each runs on the
committed results and prints the numbers that section quotes."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANALYSIS = ROOT / "analysis"
RESULTS_MD = ROOT / "docs" / "RESULTS.md"


def run(script: str, *args: str) -> str:
    return subprocess.run([sys.executable, str(ANALYSIS / script), *args], check=True, capture_output=True,
                          text=True).stdout


def test_every_analysis_is_named_after_a_section_of_results_md_and_says_so():
    headings = [line.lstrip("#").strip().lower().replace("-", " ") for line in RESULTS_MD.read_text().splitlines()
                if line.startswith("#")]
    scripts = sorted(ANALYSIS.glob("*.py"))
    assert len(scripts) >= 4
    for script in scripts:
        words = script.stem.replace("_", " ")
        assert any(h.startswith(words) for h in headings), f"{script.name}: no RESULTS.md section starts '{words}'"
        assert "docs/RESULTS.md" in script.read_text().split('"""')[1], f"{script.name}: its docstring names no section"


def test_the_lr_control_prints_the_three_numbers_results_md_quotes():
    out = run("the_lr_control.py")
    quoted = RESULTS_MD.read_text()
    numbers = re.findall(r"([+-]\d\.\d{4}) \[([+-]\d\.\d{4}), ([+-]\d\.\d{4})\]", out)
    assert len(numbers) == 3, out
    for mean, low, high in numbers:  # the page rounds to 3 decimals
        text = f"{float(mean):+.3f}"
        interval = f"[{float(low):+.3f}, {float(high):+.3f}]"
        assert text in quoted and interval in quoted, (text, interval)


def test_pre_registration_gives_the_planning_sd_and_the_number_of_pairs_results_md_quotes():
    quoted = RESULTS_MD.read_text()
    verdict = run("pre_registration.py")
    sd, df, bound = re.search(r"pooled paired sd of scaling-shared-lr: (\d\.\d+) on (\d+) df; upper one-sided 80% "
                              r"bound (\d\.\d+)", verdict).groups()
    assert f"is {float(sd):.3f} nats pooled on {df} degrees" in quoted and f"bound is {float(bound):.3f}" in quoted
    amended = run("pre_registration.py", "--study", "verdict-lr")
    assert "fewest pairs with >= 70% power to find 0.02 nats at sd 0.03: 16 (registered: 16)" in amended
    row = next(line for line in amended.splitlines() if line.startswith("| 0.03 |"))
    assert row.split("|")[4].strip().startswith("70%")  # 16 pairs, as the amendment says


def test_the_pace_of_verdict_lrs_first_chains_is_what_its_record_quotes():
    """The amendment's record of verdict-lr's cost: chain times from the committed run records."""
    out = run("pre_registration.py", "--pace", "12")
    quoted = " ".join(RESULTS_MD.read_text().split())
    low, high, median, fast_low, fast_high, fast_mean = re.search(
        r"11 ran (\d+\.\d) to (\d+\.\d) min per chain per shard \(median (\d+\.\d); the fastest third "
        r"(\d+\.\d) to (\d+\.\d), mean (\d+\.\d)\); 1 waited", out).groups()
    assert (f"took {low} to {high} minutes per shard, median {median}, over 11 chains" in quoted
            and f"the fastest third took {fast_low} to {fast_high} (mean {fast_mean})" in quoted)
    hours = re.findall(r"at the (?:fastest third|median) pace: (\d+\.\d) h", out)
    assert f"about {hours[0]} and {hours[1]} hours as two shards" in quoted


def test_the_pace_after_30_chains_is_what_its_record_and_the_readme_quote():
    """The second record leaves out the chains resumed from a checkpoint (their records hold part of their time)."""
    out = run("pre_registration.py", "--pace", "30")
    quoted = " ".join(RESULTS_MD.read_text().split())
    ran, low, high, median, fast_low, fast_high, fast_mean, resumed = re.search(
        r"(\d+) ran (\d+\.\d) to (\d+\.\d) min per chain per shard \(median (\d+\.\d); the fastest third "
        r"(\d+\.\d) to (\d+\.\d), mean (\d+\.\d)\); 1 waited .*; (\d+) resumed from a checkpoint, left out",
        out).groups()
    assert (f"{ran} of the first 30 chains took {low} to {high} minutes per shard, median {median}, the fastest third "
            f"{fast_low} to {fast_high} (mean {fast_mean})" in quoted
            and f"and {resumed} resumed from a checkpoint" in quoted)
    hours = re.findall(r"at the (?:fastest third|median) pace: (\d+\.\d) h", out)
    assert f"about {hours[0]} and {hours[1]} hours as two shards" in quoted


def test_the_time_left_the_readme_quotes_is_the_pace_command_it_names():
    readme = " ".join((RESULTS_MD.parent.parent / "README.md").read_text().split())
    pattern = (r"(\d+\.\d)-(\d+\.\d) min per chain per shard, the fastest third's mean and the median, measured "
               r"on (?:its first|all its) (\d+) chains: "
               r"`python analysis/pre_registration.py --study verdict-lr --pace (\d+)`")
    fast_mean, median, n, command_n = re.search(pattern, readme).groups()
    out = run("pre_registration.py", "--pace", n)
    assert n == command_n and f"median {median};" in out and f"mean {fast_mean})" in out
    if "chains ended" in out:  # the study is done: the row quotes its recorded run time per shard
        per_shard = re.search(r"(\d+\.\d) h per shard as 2 shards", out).group(1)
        assert f"done: {per_shard} h of recorded run time per shard as 2 shards" in readme
        return
    low, high = re.findall(r"at the (?:fastest third|median) pace: (\d+)\.\d h", out)
    assert f"~{low}-{high} h left as 2 shards" in readme or f"~{low}-{int(high) + 1} h left as 2 shards" in readme


@pytest.mark.slow
def test_holm_from_printed_tables_recovers_the_p_values_of_the_intervals(tmp_path):
    """analysis/what_changed_in_the_reports.py: p values recomputed from a table's printed mean and interval match
    the ones computed from the data (to the 4-decimal rounding), the adjustment is Holm's, and a table in a later
    section is not read."""
    from nlq.studies.inference.stats import holm, paired_difference

    rows = {"a": [0.01, 0.03, 0.02], "b": [0.10, 0.20, 0.15], "c": [-0.2, 0.1, 0.05]}
    tests = {name: paired_difference(d, [0.0] * 3) for name, d in rows.items()}
    table = "\n".join(f"| {name} | 3 | {t['mean']:+.4f} | [{t['low']:+.4f}, {t['high']:+.4f}] | worse |"
                      for name, t in tests.items())
    doc = tmp_path / "doc.md"
    doc.write_text(f"## study x\n\n| variant | pairs | mean | interval | verdict |\n|---|---|---|---|---|\n{table}\n\n"
                   "## other\n| z | 3 | +1.0000 | [+0.5000, +1.5000] | worse |\n")
    script = ANALYSIS / "what_changed_in_the_reports.py"
    out = subprocess.run([sys.executable, str(script), str(doc), "study x"], check=True, capture_output=True,
                         text=True).stdout
    printed = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| ") and
               line.split("|")[1].strip() in rows}
    assert set(printed) == set(rows) and "| z |" not in out
    adjusted = dict(zip(rows, holm([t["p"] for t in tests.values()])))
    for name, t in tests.items():
        assert float(printed[name][5]) == pytest.approx(t["p"], rel=0.02)
        assert float(printed[name][6]) == pytest.approx(adjusted[name], rel=0.02)
    missing = subprocess.run([sys.executable, str(script), str(doc), "nowhere"], capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.startswith("error: no line of") and not missing.stdout


def test_reading_the_verdict_agrees_with_the_verdict_report_on_the_committed_runs():
    """analysis/reading_the_verdict.py on results/: its end-of-cooldown rows are the pre-registered endpoint of
    verdict.json, the per-seed growth is Δ300 - Δ100 of the same runs, and its Welch interval is Welch's."""
    import math
    import statistics

    from scipy import stats

    root = Path(__file__).resolve().parent.parent
    results = root / "results"
    if not (results / "verdict" / "verdict.json").is_file():
        pytest.skip("results/verdict is not committed")
    decision = json.loads((results / "verdict" / "verdict.json").read_text()).get("decision")
    if decision is None:
        pytest.skip("the verdict study has not finished")
    out = subprocess.run([sys.executable, str(ANALYSIS / "reading_the_verdict.py"), "--results", str(results)],
                         check=True, capture_output=True, text=True).stdout
    i = decision["interval"]
    end = next(line for line in out.splitlines() if "end of the 300 tokens/param cooldown" in line)
    assert end.split("|")[5].strip() == f"{i['mean']:+.4f} [{i['low']:+.4f}, {i['high']:+.4f}]"
    assert "| 0 | stable (128 windows) | 14 |" in out  # paired: the same initial loss

    a, b = [1.0, 1.2, 1.1], [1.5, 1.4, 1.6, 1.45]
    sys.path.insert(0, str(ANALYSIS))
    try:
        from reading_the_verdict import welch
    finally:
        sys.path.remove(str(ANALYSIS))
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 4
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    w = welch(a, b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    assert w["mean"] == pytest.approx(diff) and w["low"] == pytest.approx(diff - half)
    assert w["high"] == pytest.approx(diff + half)


def test_reading_verdict_lr_agrees_with_the_committed_runs_and_the_decision():
    """analysis/reading_verdict_lr.py on results/: its end-of-cooldown row is the paired Δ of the test seeds'
    summaries (and, once decided, verdict.json's interval), and its lr rows count the runs of both studies."""
    from nlq.studies.inference.stats import paired_difference

    results = ROOT / "results"
    if not (results / "verdict-lr" / "study.json").is_file() or not (results / "verdict" / "study.json").is_file():
        pytest.skip("results/verdict-lr or results/verdict is not committed")
    study = json.loads((results / "verdict-lr" / "study.json").read_text())
    loss = {}
    for path in (results / "verdict-lr" / "runs").glob("d64-tpp300-*/summary.json"):
        arm, lr, seed = re.fullmatch(r"d64-tpp300-(.+)-lr([\d.e-]+)-s(\d+)", path.parent.name).groups()
        if int(seed) in study["settings"]["seeds"]:
            loss[(arm, int(seed))] = json.loads(path.read_text())["full_val_loss"]
    seeds = sorted(s for a, s in loss if a == "nonlinear" and ("linear", s) in loss)
    if not seeds:
        pytest.skip("no verdict-lr test pair is committed yet")
    p = paired_difference([loss[("nonlinear", s)] for s in seeds], [loss[("linear", s)] for s in seeds])
    out = run("reading_verdict_lr.py", "--results", str(results))
    end = next(line for line in out.splitlines() if "end of the 300 tokens/param cooldown" in line)
    assert end.split("|")[3].strip() == str(len(seeds))
    assert end.split("|")[5].strip() == f"{p['mean']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}]"
    decision = json.loads((results / "verdict-lr" / "verdict.json").read_text()).get("decision")
    if decision is not None:
        i = decision["interval"]
        assert end.split("|")[5].strip() == f"{i['mean']:+.4f} [{i['low']:+.4f}, {i['high']:+.4f}]"
    lr_rows = [line for line in out.splitlines() if "(verdict-lr) -" in line]
    assert len(lr_rows) == 3 and all(f"{len(seeds)} vs 14" in line for line in lr_rows)
    # 4. the 2 x 2: each arm's mean over the seeds that have all four, and each declared comparison's sign count
    arms = study["settings"]["primary"] + study["settings"]["secondary"]
    complete = sorted(s for s in study["settings"]["seeds"] if all((arm, s) in loss for arm in arms))
    if len(complete) < len(study["settings"]["seeds"]):
        assert f"{len(complete)} of {len(study['settings']['seeds'])} test seeds have all four arms" in out
        return
    for arm in arms:
        mean = sum(loss[(arm, s)] for s in complete) / len(complete)
        assert re.search(rf"^\| {re.escape(arm)} \| {len(complete)} \| {mean:.4f} \[", out, re.MULTILINE), arm
    family = json.loads((results / "verdict-lr" / "verdict.json").read_text())["secondary_family"]
    for row in family:
        line = next(line for line in out.splitlines() if line.startswith(f"| {row['comparison']} |"))
        if row["member"] == "interaction":
            (nq, lq), (n, ln) = study["settings"]["secondary"][::-1], study["settings"]["primary"][::-1]
            delta = [(loss[(nq, s)] - loss[(lq, s)]) - (loss[(n, s)] - loss[(ln, s)]) for s in complete]
        else:
            delta = [loss[(row["member"][0], s)] - loss[(row["member"][1], s)] for s in complete]
        assert sum(delta) / len(delta) == pytest.approx(row["mean"])  # the same seeds as the report
        assert line.split("|")[2].strip() == f"{sum(d > 0 for d in delta)} of {len(complete)}"


def test_reading_gate_lr_agrees_with_the_committed_runs_and_what_results_md_quotes():
    """analysis/reading_gate_lr.py on results/: each arm's sd over the test seeds is the one of the committed
    summaries (the borrowed arms read from results/verdict-lr), its leave-one-out rows are verdict.json's, and
    docs/RESULTS.md quotes its numbers."""
    import statistics

    from nlq.studies.definition.design import read_study

    results = ROOT / "results"
    outcome = json.loads((results / "gate-lr" / "verdict.json").read_text())
    if "decision" not in outcome:
        pytest.skip("results/gate-lr has no decision yet")
    seeds = set(read_study(results / "gate-lr")["design"].seeds)
    loss = {}
    for study in ("gate-lr", "verdict-lr"):
        for path in (results / study / "runs").glob("d64-tpp300-*/summary.json"):
            arm, seed = re.fullmatch(r"d64-tpp300-(.+)-lr[\d.e-]+-s(\d+)", path.parent.name).groups()
            if int(seed) in seeds and (study == "gate-lr" or arm.endswith("-qknorm")):
                loss.setdefault(arm, []).append(json.loads(path.read_text())["full_val_loss"])
    out = run("reading_gate_lr.py", "--results", str(results))
    for arm in ("gate-qknorm", "linear-qknorm", "nonlinear-qknorm"):
        line = next(line for line in out.splitlines() if line.startswith(f"| {arm} | 0.0"))
        mean, sd = statistics.fmean(loss[arm]), statistics.stdev(loss[arm])
        assert f"| {len(loss[arm])} of 16 | {mean:.4f} | {sd:.4f} [" in line
    for row in outcome["one_pair"]:
        p = row["without"]
        assert f"without seed {row['seed']} (Δ {row['delta']:+.4f}): {p['mean']:+.4f} [{p['low']:+.4f}" in out
    quoted = " ".join(RESULTS_MD.read_text().split())
    worse = re.search(r"gate-qknorm worse on (\d+) of 16 seeds \(sign test p ([\d.]+)\); median Δ ([+-][\d.]+) "
                      r"\(Wilcoxon p ([\d.]+)\)", out).groups()
    assert (f"{16 - int(worse[0])} of 16 seeds have the gated model lower (sign test p {worse[1]}); the median Δ is "
            f"{float(worse[2]):.3f} (Wilcoxon p {worse[3]})") in quoted
    pm, high, rest = re.search(r"\| gate-qknorm \| 16 \| [\d.]+ \| [+-][\d.]+ \| ([\d.]+) \| ([+-][\d.]+) \| "
                               r"([+-][\d.]+) \|", out).groups()
    assert f"Pitman-Morgan test for paired variances p {pm}" in quoted
    groups = re.findall(r"Δ [+-][\d.]+ to [+-][\d.]+, mean ([+-][\d.]+)", out)
    assert groups == [high, rest]  # the table's group means for the primary arm are the groups' lines above it


def test_the_mnist1d_table_quotes_the_committed_runs():
    """docs/RESULTS.md's MNIST-1D row is results/mnist1d-baseline/summary.json's mean and 95% interval."""
    path = ROOT / "results" / "mnist1d-baseline" / "summary.json"
    summary = json.loads(path.read_text())
    accuracies = [r["accuracy"] for r in summary["test"]]
    assert len(accuracies) == 5 and summary["mean_accuracy"] == pytest.approx(sum(accuracies) / 5)
    low, high = summary["interval"]
    row = f"{summary['mean_accuracy']:.1%}, 95% interval [{low:.1%}, {high:.1%}]"
    assert row in (ROOT / "docs" / "RESULTS.md").read_text()
    best = max(summary["selection"], key=lambda r: (r["accuracy"], -r["lr"], -r["steps"]))
    assert summary["selected"] == {"lr": best["lr"], "steps": best["steps"]}


def test_the_sequential_replay_prints_the_table_results_md_quotes():
    """Every replayed comparison's row (stopping look, interval, decision, chains saved) as the page shows it, and
    each one's decision equal to the fixed design's."""
    out = run("replaying_the_committed_decisions.py", "--sims", "0")
    rows = [line for line in out.splitlines() if line.startswith("| verdict")]
    assert len(rows) == 6
    quoted = RESULTS_MD.read_text()
    for row in rows:
        assert row in quoted, row
        cells = [c.strip() for c in row.split("|")]
        assert cells[6] == cells[7]  # the sequential decision is the fixed design's


def test_decisions_table_and_forest_plot_come_from_the_committed_results(tmp_path):
    """analysis/decisions.py: one row per committed decision and declared comparison, each Δ and interval those of the
    study's result.json; the README's block is that table (regenerated, not typed)."""
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- decisions -->\nold\n<!-- /decisions -->\nkept\n")
    run("decisions.py", "--readme", str(readme), "--plot", str(tmp_path / "d.png"))
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- /decisions -->\nkept\n") and (tmp_path / "d.png").is_file()
    for name in ("verdict", "verdict-lr", "gate-lr", "mnist1d-lr", "digits-lr"):
        interval = json.loads((ROOT / "results" / name / "result.json").read_text())["decision"]["interval"]
        assert f"| `{name}` |" in text
        assert f"| {interval['mean']:+.4f} | [{interval['low']:+.4f}, {interval['high']:+.4f}] |" in text
    decision = json.loads((ROOT / "results" / "diff-lr" / "result.json").read_text()).get("decision")
    if decision:  # a sequential test: the interval its words are read off, said so
        low, high = decision["sequential"]["repeated"]
        assert f"| [{low:+.4f}, {high:+.4f}] | {decision['words']} (sequential: the repeated interval) |" in text
    assert "pilot" not in text  # pilots are exploratory, not decisions
    committed = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- decisions -->\n(.*?)\n<!-- /decisions -->", text, re.S).group(1)
    assert block in committed, "README's decisions table is not what analysis/decisions.py writes; run it"


def test_a_declared_comparison_that_rests_on_one_pair_says_so_in_the_record_and_the_decisions_table(tmp_path):
    """Each declared comparison's one-pair check (the report's "the reading of ... rests on one pair" lines) is kept in
    result.json, and the decisions table names its most influential such seed, as it does for a primary test."""
    readme = tmp_path / "README.md"
    readme.write_text("<!-- decisions -->\n<!-- /decisions -->\n")
    run("decisions.py", "--readme", str(readme), "--plot", str(tmp_path / "d.png"))
    table = readme.read_text()
    flagged = 0
    for path in sorted((ROOT / "results").glob("*/result.json")):
        family = json.loads(path.read_text()).get("secondary_family") or []
        report = (path.parent / "report.md").read_text()
        for member in family:
            named = [int(seed) for seed in re.findall(rf"the reading of {re.escape(member['comparison'])} rests on one "
                                                      r"pair\. Seed (\d+)", report)]
            assert [row["seed"] for row in member["one_pair"]] == named, (path.parent.name, member["comparison"])
            if named and member["member"] != "interaction":
                flagged += 1
                first, second = member["member"]
                assert re.search(rf"\| {re.escape(first)} \([\d.e-]+\) - {re.escape(second)} \([\d.e-]+\) \|.*"
                                 rf"\| rests on seed {named[0]} \|", table), (path.parent.name, member["comparison"])
    assert flagged >= 2  # qknorm-4e-3's nonlinear-qknorm (seed 225) and diff-lr's diff-qknorm (seed 218)


def test_spread_across_cpus_compares_the_committed_runs_with_their_retrained_copies():
    out = run("spread_across_cpus.py", str(ROOT / "results" / "verdict-lr"),
              str(ROOT / "results" / "qknorm-4e-3" / "reuse_check"))
    assert "| d64-tpp300-linear-qknorm-lr0.004-s201 | 2.8361 | 2.8069 | -0.0293 |" in out
    assert "-0.0293" in RESULTS_MD.read_text()
    same_kind = run("spread_across_cpus.py", str(ROOT / "results" / "digits-lr"),
                    str(ROOT / "results" / "digits-lr" / "reuse_check"))
    assert same_kind.count("| +0.0000 |") == 15  # 10 runs and 5 pairs, bitwise on the same CPU kind


def test_reading_digits_controls_pairs_the_committed_runs_and_results_md_quotes_it():
    """analysis/reading_digits_controls.py on results/: its primary loss row is the committed verdict.json's, every
    pair shares one split (the arms of a seed score the same 360 images), and docs/RESULTS.md quotes its numbers."""
    results = ROOT / "results"
    outcome = json.loads((results / "digits-controls" / "verdict.json").read_text())
    if "decision" not in outcome:
        pytest.skip("results/digits-controls has no decision yet")
    out = run("reading_digits_controls.py", "--results", str(results))
    i = outcome["decision"]["interval"]
    primary = next(line for line in out.splitlines() if line.startswith("| nonlinear - linear |"))
    assert f"{i['mean']:+.4f} [{i['low']:+.4f}, {i['high']:+.4f}]" in primary
    rows = [line for line in out.splitlines() if " - " in line and line.startswith("| ") and "42 of 42" in line]
    assert len(rows) == 6, out
    quoted = RESULTS_MD.read_text()
    beside = out.split("## Beside")[1]
    for mean, low, high in re.findall(r"([+-]\d\.\d{4}) \[([+-]\d\.\d{4}), ([+-]\d\.\d{4})\]", beside):
        assert f"{float(mean):+.3f} [{float(low):+.3f}, {float(high):+.3f}]" in quoted, (mean, low, high)


def test_reproducing_the_cpu_study_compares_both_reports_and_results_md_quotes_every_row():
    """analysis/reproducing_the_cpu_study.py on results/cpu and its fresh-clone reproduction: each arm's and each
    comparison's row from the two result.json files, the verdicts compared, and docs/RESULTS.md quoting every row."""
    fresh = sorted((ROOT / "results" / "cpu").glob("fresh-clone-*"))
    if not fresh:
        pytest.skip("no reproduction of the cpu study is committed")
    out = run("reproducing_the_cpu_study.py", str(ROOT / "results" / "cpu"), str(fresh[-1]))
    committed = json.loads((ROOT / "results" / "cpu" / "result.json").read_text())
    reproduced = json.loads((fresh[-1] / "result.json").read_text())
    same = all(p["verdict"] == reproduced["paired"][arm]["verdict"] for arm, p in committed["paired"].items())
    assert f"every verdict the same: {'yes' if same else 'no'}" in out
    p = committed["paired"]["nonlinear"]
    assert f"| nonlinear | {p['mean']:+.4f} [{p['low']:+.4f}, {p['high']:+.4f}] | {p['verdict']} |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| arm")
            and not line.startswith("| variant") and "---" not in line]
    assert len(rows) == 6 + 5
    quoted = RESULTS_MD.read_text()
    assert all(row in quoted for row in rows), [row for row in rows if row not in quoted]


def test_the_decisions_table_holds_the_declared_interactions():
    readme_path = ROOT / "README.md"
    for name in ("verdict-lr", "mnist1d-qknorm"):
        member = next(m for m in json.loads((ROOT / "results" / name / "result.json").read_text())["secondary_family"]
                      if m["member"] == "interaction")
        first, second = member["comparison"].removeprefix("interaction: ").split(") - (")
        row = (f"| declared interaction (Holm over the family) | {first}) - ({second} | {member['n']} | "
               f"{member['mean']:+.4f} | [{member['low']:+.4f}, {member['high']:+.4f}] |")
        assert row in readme_path.read_text(), row


@pytest.mark.parametrize("arguments,needle", [
    (["--results", "{tmp}/missing"], "is not a directory"),
    (["--results", "{tmp}/empty"], "holds no decided plan study"),
    (["--readme", "{tmp}/missing.md"], "does not exist"),
])
def test_decisions_refuses_a_missing_or_empty_folder_and_writes_nothing(tmp_path, arguments, needle):
    (tmp_path / "empty").mkdir()
    readme, plot = tmp_path / "README.md", tmp_path / "d.png"
    readme.write_text("<!-- decisions -->\nkept\n<!-- /decisions -->\n")
    args = [a.format(tmp=tmp_path) for a in arguments]
    args = args + (["--readme", str(readme)] if "--readme" not in args else []) + ["--plot", str(plot)]
    result = subprocess.run([sys.executable, str(ANALYSIS / "decisions.py"), *args], capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr
    assert "Traceback" not in result.stderr
    assert readme.read_text() == "<!-- decisions -->\nkept\n<!-- /decisions -->\n" and not plot.exists()


def test_a_sequential_decision_is_reread_under_its_registered_rule():
    """mnist1d-qknorm's words are read off the repeated interval at its last look: no single pair changes them under
    that rule (the fixed design's t interval would have said otherwise), so its record and the table name no seed."""
    from nlq.studies.inference.sequential import repeated_interval
    from nlq.studies.reports.plan_sections import primary_facts

    outcome = json.loads((ROOT / "results" / "mnist1d-qknorm" / "result.json").read_text())
    assert outcome["decision"]["sequential"] and outcome["one_pair"] == []
    assert "| `mnist1d-qknorm` |" in (ROOT / "README.md").read_text()
    assert "rests on seed 237" not in (ROOT / "README.md").read_text()

    from nlq.studies.definition.plan_design import LOSS_UNITS

    class Design:
        margin, confidence, alpha, units = 0.037, 0.95, 0.05, LOSS_UNITS

    deltas = [0.05, 0.06, 0.04, 0.05, 0.055, -0.3]  # the last pair alone pulls the mean to zero
    pairs = [(seed, 0.0, d) for seed, d in enumerate(deltas)]
    end = {"level": 0.001, "repeated": list(repeated_interval(deltas, 0.001))}
    fixed = primary_facts(pairs, Design, "nonlinear", "no effect")["one_pair"]
    sequential = primary_facts(pairs, Design, "nonlinear", "no effect", end)["one_pair"]
    assert [r["seed"] for r in fixed] == [5] and fixed[0]["words_without"] == "nonlinear worse"
    assert sequential and sequential[0]["words_without"] == "nonlinear worse"
    wide = {"level": 1e-9, "repeated": list(repeated_interval(deltas, 1e-9))}  # so wide that no pair matters
    assert primary_facts(pairs, Design, "nonlinear", "no effect", wide)["one_pair"] == []


def test_a_hodges_lehmann_interval_that_cannot_exist_says_why():
    from nlq.studies.inference.stats import hodges_lehmann, hodges_lehmann_pairs

    assert hodges_lehmann_pairs(0.95) == 6 and hodges_lehmann_pairs(0.9) == 5
    assert math.isnan(hodges_lehmann([0.1, 0.2, 0.3, 0.4, 0.5])["low"])
    assert not math.isnan(hodges_lehmann([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])["low"])


def test_publish_verdict_refuses_an_empty_study_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "publish_verdict.py"), str(tmp_path),
                             "--study", "diff-lr", "--readme", str(tmp_path / "R.md")], capture_output=True, text=True)
    assert result.returncode == 2 and "holds no study.json" in result.stderr and "Traceback" not in result.stderr


def test_the_induction_transition_rereads_the_committed_retrained_runs(tmp_path):
    """analysis/the_induction_transition.py on its own committed output: the same readings per run (the induction
    rule's and the train-loss rule's steps), and RESULTS.md quotes them."""
    committed = ROOT / "results" / "transition-mechanism"
    run("the_induction_transition.py", str(committed), "--out", str(tmp_path))
    again = json.loads((tmp_path / "mechanism.json").read_text())["runs"]
    kept = json.loads((committed / "mechanism.json").read_text())["runs"]
    strip = [{k: v for k, v in r.items() if k != "reuse_check"} for r in again]
    assert strip == [{k: v for k, v in r.items() if k != "reuse_check"} for r in kept]
    row = next(r for r in kept if r["run"] == "d64-linear-lr0.008-s217-stable")
    text = " ".join(RESULTS_MD.read_text().split())
    assert f"the train-loss rule: {row['loss_steps']['3.5']:,}; the induction rule: {row['induction_step']:,}" in text


def test_a_decision_in_steps_is_written_with_its_unit_and_kept_off_the_nats_axis(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("decisions", ANALYSIS / "decisions.py")
    decisions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decisions)
    row = {"study": "transition", "question": "q", "kind": "primary", "first": "nonlinear", "second": "linear",
           "first_lr": 0.008, "second_lr": 0.008, "n": 12, "mean": 827.4, "low": 404.0, "high": 1250.2,
           "words": "nonlinear later", "one_pair": "", "units": "steps"}
    loss = row | {"study": "verdict", "units": "nats", "mean": 0.0311, "low": 0.0199, "high": 0.0423}
    text = decisions.table([loss, row])
    assert "| 12 | +827 steps | [+404 steps, +1,250 steps] | nonlinear later |" in text
    assert "| +0.0311 | [+0.0199, +0.0423] |" in text
    decisions.forest_plot([loss, row], tmp_path / "d.png")  # the steps row is left out of the nats axis
    assert (tmp_path / "d.png").is_file()

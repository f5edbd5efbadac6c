"""The registrations in docs/RESULTS.md say truthfully when each part of them was written: a bracket that claims to
have been added "before the first run" was committed before the first run of its study started (by the UTC start
its committed runs record), and a plan's file was committed before the first run that names it."""

import json
import re
import shutil
import subprocess
import tomllib
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = ROOT / "docs" / "RESULTS.md"


def git(*args: str) -> str:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository's git history")
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if result.returncode != 0 or (args[0] == "rev-parse" and "true" in result.stdout):
        pytest.skip(f"git {' '.join(args)} failed here: {result.stderr.strip()[:200]}")
    return result.stdout


def registrations(text: str) -> dict[str, str]:
    """study name -> the text of its "## Pre-registration: `nlq study NAME`" section (up to the next ## heading)."""
    found = {}
    for match in re.finditer(r"^## Pre-registration: `nlq study ([\w.-]+)`.*?$(.*?)(?=^## )", text, re.M | re.S):
        found[match.group(1)] = match.group(2)
    return found


def brackets(section: str) -> list[tuple[str, str]]:
    """(the bracket's first line as written, its whole text without quote marks) of every "[Added ...]" note."""
    out = []
    for match in re.finditer(r"\[Added[^\]]*\]", section):
        first = match.group(0).splitlines()[0]
        whole = " ".join(line.lstrip("> ").strip() for line in match.group(0).splitlines())
        out.append((first, whole))
    return out


def first_run_start(study: str) -> datetime | None:
    starts = [json.loads(p.read_text()).get("record", {}).get("started_utc")
              for p in (ROOT / "results" / study / "runs").glob("*/summary.json")]
    starts = [s for s in starts if s]
    return min(datetime.fromisoformat(s.replace("Z", "+00:00")) for s in starts) if starts else None


def added_at(fragment: str) -> datetime:
    """When the first commit that put this text into docs/RESULTS.md was made."""
    dates = git("log", "--format=%cI", "-S", fragment, "--", "docs/RESULTS.md").split()
    assert dates, f"no commit added {fragment!r}"
    return datetime.fromisoformat(dates[-1])


def claims_before_first_run(bracket: str) -> bool:
    return bool(re.search(r"before (the|its) first run", bracket)) and not re.search(
        r"(after|not) (the|its) first run", bracket)


def test_the_bracket_rule_reads_claims_as_a_reviewer_would():
    assert claims_before_first_run("[Added 2026-12-01, before the first run: the settings are ...]")
    assert not claims_before_first_run("[Added 2026-12-02 in commit 0c97a3e, 72 minutes after the first run had "
                                       "started ...]")
    section = "> text. [Added 2026-12-01, before the first run: the settings\n> are X.]\n"
    assert brackets(section) == [("[Added 2026-12-01, before the first run: the settings",
                                  "[Added 2026-12-01, before the first run: the settings are X.]")]


def test_no_registration_bracket_claims_before_the_first_run_for_a_commit_made_after_it():
    """The audit found "[Added 2026-12-01, before the first run: ...]" in verdict-lr's registration, committed 72
    minutes after its first run started; every such claim is checked against the history."""
    for study, section in registrations(RESULTS_MD.read_text()).items():
        start = first_run_start(study)
        for first_line, whole in brackets(section):
            if start is None or not claims_before_first_run(whole):
                continue
            when = added_at(first_line)
            assert when < start, (f"{study}: {whole[:120]!r} was committed {when.isoformat()}, after the first run "
                                  f"started ({start.isoformat()})")
    assert "verdict-lr" in registrations(RESULTS_MD.read_text())


def test_a_plan_file_was_committed_before_the_first_run_that_names_it():
    """Every committed plan study records the commits that ran it; each holds the plan file, parsed equal to the plan
    the study froze."""
    for study_json in sorted((ROOT / "results").glob("*/study.json")):
        described = json.loads(study_json.read_text())
        plan = ROOT / "src" / "nlq" / "plans" / f"{described['name']}.toml"
        if "plan" not in described or not plan.is_file():
            continue
        for code in described.get("code") or []:
            commit = code.removesuffix("+dirty")
            shown = subprocess.run(["git", "show", f"{commit}:src/nlq/plans/{plan.name}"], cwd=ROOT,
                                   capture_output=True, text=True)
            if shutil.which("git") is None or "unknown revision" in shown.stderr:
                pytest.skip("needs the repository's git history")
            assert shown.returncode == 0, f"{study_json.parent.name} ran at {commit[:12]}, which has no {plan.name}"
            assert tomllib.loads(shown.stdout) == described["plan"], f"{plan.name} at {commit[:12]} is another plan"

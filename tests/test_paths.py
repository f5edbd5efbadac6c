"""Published records hold no absolute path of the machine that trained them (runs/paths.py): the scrub changes the
path fields alone, every committed record is scrubbed, and `nlq report --collect` publishes so."""

import json
import re
from pathlib import Path

from nlq.runs.paths import relative, scrubbed_text

RESULTS = Path(__file__).resolve().parents[1] / "results"
ABSOLUTE = re.compile(r'"/(work|tmp|home|root|Users|scratch|data)/')


def test_the_scrub_makes_the_paths_relative_and_changes_nothing_else():
    committed = RESULTS / "verdict-lr" / "runs" / "d64-tpp300-linear-lr0.008-s217" / "config.json"
    config = json.loads(committed.read_text())
    config["data"]["dir"] = "/work/studies/pypkg-bpe2048"  # as the run recorded it before the scrub
    config["train"]["resume_from"] = "/scratch/me/verdict-lr/runs/d64-linear-lr0.008-s217-stable/checkpoints/x.pt"
    text = json.dumps(config, indent=2) + "\n"
    clean = scrubbed_text(text)
    after = json.loads(clean)
    assert after["data"]["dir"] == "pypkg-bpe2048"
    assert after["train"]["resume_from"] == "runs/d64-linear-lr0.008-s217-stable/checkpoints/x.pt"
    for section in config:
        for key, value in config[section].items():
            if (section, key) not in (("data", "dir"), ("train", "resume_from")):
                assert after[section][key] == value, (section, key)
    assert len(clean.splitlines()) == len(text.splitlines())  # line for line: only the two values changed
    assert scrubbed_text(clean) == clean  # a scrubbed record stays as it is
    assert relative("/a/runs/b/runs/c/step.pt") == "runs/c/step.pt" and relative("/a/b") == "b"


def test_no_committed_record_holds_an_absolute_path():
    found = [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.json") if ABSOLUTE.search(p.read_text())]
    assert not found, found[:5]


def test_collect_publishes_without_absolute_paths(tmp_path):
    from nlq.studies.running.collect import collect

    study = tmp_path / "study"
    run = study / "runs" / "d64-tpp10-linear-s1"
    run.mkdir(parents=True)
    (study / "study.json").write_text(json.dumps({"name": "x", "data_dir": "/work/data/pypkg", "runs": [
        {"name": run.name, "seed": 1, "stage": "budget", "tpp": 10}]}, indent=2))
    (run / "config.json").write_text(json.dumps({"data": {"dir": "/work/data/pypkg"}, "train": {
        "resume_from": "/work/s/runs/d64-linear-s1-stable/checkpoints/step_0000010.pt"}}, indent=2))
    (run / "summary.json").write_text("{}")
    (run / "metrics.jsonl").write_text("")
    assert collect(study, tmp_path / "out") == 1
    published = [p for p in (tmp_path / "out").rglob("*.json")]
    assert published and not any(ABSOLUTE.search(p.read_text()) for p in published)
    assert json.loads((tmp_path / "out" / "runs" / run.name / "config.json").read_text())["train"]["resume_from"] == \
        "runs/d64-linear-s1-stable/checkpoints/step_0000010.pt"

"""plans/transition.toml: its design (every arm pinned at its committed study's lr, fresh seeds, the transition step
as the endpoint) and its report in steps, run end to end with a stub for training: the words "later" and "earlier",
the Δ in steps, the family read the same way, and the transitions section from the runs' own diagnostics."""

import json

import pytest

from helpers import fake_training
from nlq.studies.definition.design import read_study

STEP = {"linear": 5000, "nonlinear": 5900, "linear-qknorm": 4200, "nonlinear-qknorm": 4900, "gate-qknorm": 3600}


def arm_of(config) -> str:
    if config.model.attn_gate != "none":
        return "gate-qknorm"
    return config.model.query + ("-qknorm" if config.model.qk_norm else "")


def diagnostics(step: int, end: int) -> str:
    """metrics.jsonl of a run whose largest prefix-matching score reaches 0.2 at `step`, with its train loss."""
    lines = []
    for s in range(0, end + 1, 100):
        lines.append({"step": s, "train_loss": 3.8 if s < step else 3.3, "lr": 0.008})
        lines.append({"step": s, "prefix_matching_max": 0.01 if s < step else 0.4, "icl_score": 0.0})
    return "".join(json.dumps(r) + "\n" for r in lines)


@pytest.fixture
def transition_study(byte_data, tmp_path, monkeypatch):
    from nlq.studies.registry import get_study
    from nlq.studies.running.study import run_study

    def summary(config, run_dir):
        arm, seed = arm_of(config), config.train.seed
        step = STEP[arm] + 40 * (seed % 7) - 100 * (seed % 3)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.jsonl").write_text(diagnostics(step, config.train.max_steps))
        return {"transition_step": step, "transition_censored": False, "val_loss": 3.1, "full_val_loss": 3.0,
                "non_embedding_parameters": 1000, "tokens": 1}

    calls = fake_training(monkeypatch, summary)
    run_study(get_study("transition"), tmp_path, data_dir=str(byte_data), log=lambda *_: None)
    return tmp_path, calls


def test_the_plan_trains_every_arm_at_its_pinned_lr_on_fresh_seeds(transition_study):
    study_dir, calls = transition_study
    s = read_study(study_dir)["design"]
    assert s.endpoint == "transition_step" and s.units.name == "steps"
    assert not set(s.seeds) & set(range(201, 227))  # never a seed of the committed studies
    lrs = {(arm_of(c), c.train.lr) for _, _, c in calls}
    assert lrs == {("linear", 8e-3), ("nonlinear", 8e-3), ("linear-qknorm", 8e-3), ("nonlinear-qknorm", 8e-3),
                   ("gate-qknorm", 4e-3)}
    assert all(c.train.diagnostics_every == 100 for _, _, c in calls)
    assert {c.train.seed for _, _, c in calls} == set(s.seeds)  # no selection runs: every arm is pinned


def test_its_report_reads_steps_later_or_earlier(transition_study):
    from nlq.studies.registry import build_report

    study_dir, _ = transition_study
    markdown = build_report(study_dir)
    assert "**Verdict: nonlinear later.**" in markdown
    assert "Decision rule: the interval below 0: nonlinear earlier; above 0: nonlinear later" in markdown
    assert "margin ±400 steps" in markdown and "nats" not in markdown.split("## Transitions")[0].split("## The test")[1]
    outcome = json.loads((study_dir / "verdict.json").read_text())
    assert outcome["decision"]["words"] == "nonlinear later" and outcome["decision"]["interval"]["mean"] > 800
    family = {m["comparison"]: m for m in outcome["secondary_family"]}
    assert set(family) == {"nonlinear-qknorm - linear-qknorm", "linear-qknorm - linear", "gate-qknorm - linear-qknorm"}
    assert "| linear-qknorm - linear | 12 | -800 |" in markdown and "| earlier |" in markdown
    assert "## Transitions" in markdown and "induction rule (runs with diagnostics)" in markdown
    rows = outcome["transitions"]["comparisons"]
    assert rows[0]["comparison"] == "nonlinear - linear" and rows[0]["steps"]["mean"] == pytest.approx(900)
    assert outcome["transitions"]["post_transition"]["reading"] == "within noise"  # the stub's losses are equal
    assert "Declared secondary, the post-transition loss (nonlinear - linear, registered" in markdown

"""The dry run of a study (`nlq study ... --dry-run`): what run_study would train, stage by stage, without training
anything; it refuses what run_study would refuse (another plan, other overrides, changed code of one's own) first."""

from __future__ import annotations

from pathlib import Path

from nlq.errors import UserError
from nlq.studies.definition.design import Run, Study
from nlq.studies.running import frozen
from nlq.studies.running.sharding import shard_indices
from nlq.studies.running.study import steps_to_train
from nlq.studies.running.wsd import step_tokens


def dry_run_text(study: Study, study_dir: str | Path, overrides: list[str] | None = None, data_dir: str | None = None,
              shard: tuple[int, int] | None = None) -> str:
    """What run_study would train, without training anything (--dry-run): per stage the runs (of this shard),
    their device, steps, lr and tokens still to train, and the totals. A stage that depends on the results of
    an earlier one is named, not listed."""
    study_dir, overrides = Path(study_dir), overrides or []
    frozen.check_study_dir(study, study_dir, overrides)
    data = Path(data_dir) if data_dir else study_dir / "data"
    for config in frozen.arm_configs(study, overrides, data):  # what the start would refuse of every arm's recipe
        frozen.check_split(study, config)
    lines = [f"study {study.name} into {study_dir}" + (f", shard {shard[0]}/{shard[1]}" if shard else "")
             + f": {study.description}"]
    stages = study.run_stages(study_dir)
    total_runs = total_tokens = 0
    for number in range(1, 100):
        try:
            stage = next(stages)
        except StopIteration:
            break
        except (UserError, OSError, KeyError):
            if number == 1:  # nothing depends on an earlier stage: a mistake in the study itself
                raise
            lines.append(f"stage {number}: depends on the results of stage {number - 1}, which are not there yet")
            break
        frozen.check_overrides(study, stage, overrides)
        frozen.frozen_own_code(study_dir, [r.config(overrides, data).model for r in stage])  # unchanged since it ran
        mine = shard_indices(stage, *shard) if shard else range(len(stage))
        lines.append(f"stage {number}: {len(mine)} of {len(stage)} runs")
        for run, config, tokens in tokens_to_train([stage[i] for i in mine], study_dir, overrides, data):
            total_runs, total_tokens = total_runs + 1, total_tokens + tokens
            lines.append(f"  {run.name}: device {config.train.device}, {config.train.max_steps:,} steps at lr "
                         f"{config.train.lr:g}, {tokens:,} tokens to train")
    pending = lines[-1].endswith("which are not there yet")
    lines.append(f"in all: {total_runs} runs, {total_tokens:,} tokens to train"
                 + (" in the stages listed (a plan's dry run bounds the whole plan below)" if pending else ""))
    if pending and study.planned_stages is not None:
        whole = sum(tokens for stage in study.planned_stages(study_dir)
                    for _, _, tokens in tokens_to_train(stage, study_dir, overrides, data))
        lines.append(f"the whole study, every stage: {whole:,} tokens to train")
    return "\n".join(lines)


def tokens_to_train(runs: list[Run], study_dir: Path, overrides: list[str], data: Path) -> list[tuple]:
    """(run, its config, the tokens it still has to train) for each run of a stage, in order: a stable run listed
    once per segment counts each segment's steps once."""
    out, planned = [], {}  # run name -> the step an earlier segment of it will have reached
    for run in runs:
        config = run.config(overrides, data)
        steps = steps_to_train(study_dir / "runs" / run.name, config)
        steps = max(0, min(steps, config.train.max_steps - planned.get(run.name, 0)))
        planned[run.name] = config.train.max_steps
        out.append((run, config, steps * step_tokens(config)))
    return out

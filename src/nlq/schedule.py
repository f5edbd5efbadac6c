"""Learning-rate schedules, one function each; `lr_at(step, cfg)` picks the run's (train.schedule).

- cosine: linear warmup, then cosine from the peak lr to min_lr at decay_steps (default max_steps).
- wsd (warmup-stable-decay; Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed
  Training Durations"): linear warmup, the peak lr until the cooldown, then the "1 - sqrt" cooldown to
  min_lr over the last cooldown_fraction of decay_steps. Before its cooldown a WSD run does not depend on
  its length, so one stable run can branch into cooldowns for every budget (train.resume_from).
Steps are 0-based: lr_at(0) is the lr of the first update.
"""

from __future__ import annotations

import math

from nlq.config import TrainConfig


def warmup(step: int, cfg: TrainConfig) -> float | None:
    """The warmup lr at step, or None once warmup is over."""
    return cfg.lr * (step + 1) / cfg.warmup_steps if step < cfg.warmup_steps else None


def cosine(step: int, cfg: TrainConfig) -> float:
    decay_steps = cfg.decay_steps or cfg.max_steps
    progress = (step - cfg.warmup_steps) / max(1, decay_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - cfg.min_lr)


def cooldown_start(cfg: TrainConfig) -> int:
    """The first step of the WSD cooldown (the last stable step is one before it)."""
    decay_steps = cfg.decay_steps or cfg.max_steps
    return decay_steps - round(cfg.cooldown_fraction * decay_steps)


def wsd(step: int, cfg: TrainConfig) -> float:
    decay_steps = cfg.decay_steps or cfg.max_steps
    start = max(cooldown_start(cfg), cfg.warmup_steps)
    if step < start:
        return cfg.lr
    progress = min((step - start + 1) / max(1, decay_steps - start), 1.0)  # reaches 1 at the last step
    return cfg.min_lr + (1 - math.sqrt(progress)) * (cfg.lr - cfg.min_lr)


SCHEDULES = {"cosine": cosine, "wsd": wsd}


def lr_at(step: int, cfg: TrainConfig) -> float:
    lr = warmup(step, cfg)
    return lr if lr is not None else SCHEDULES[cfg.schedule](step, cfg)

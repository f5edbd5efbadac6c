"""Run logging: metrics.jsonl (one JSON object per line; runs/metrics.py reads it), a progress bar on a terminal
or plain periodic lines otherwise, and TensorBoard / Weights & Biases (offline) when installed and asked for."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path


class MetricsLogger:
    """Writes only on the main rank; the others get a logger that does nothing."""

    def __init__(self, run_dir: Path, enabled: bool, total_steps: int, start_step: int, log_every: int,
                 tensorboard: bool = False, wandb: bool = False, config: dict | None = None, quiet: bool = False):
        self.enabled, self.log_every, self.quiet = enabled, log_every, quiet
        self.path = Path(run_dir) / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1) if enabled else None
        self.bar = None
        if enabled and not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        self.tb = self._tensorboard(run_dir) if enabled and tensorboard else None
        self.wandb = self._wandb(run_dir, config) if enabled and wandb else None
        self.start_time, self.start_step, self.total_steps = time.perf_counter(), start_step, total_steps

    def _tensorboard(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        except ImportError:
            self.print("tensorboard is not installed (pip install tensorboard); logging to metrics.jsonl only")

    def _wandb(self, run_dir: Path, config: dict | None):
        try:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            return wandb.init(dir=str(run_dir), config=config, name=Path(run_dir).name, reinit=True)
        except ImportError:
            self.print("wandb is not installed (pip install wandb); logging to metrics.jsonl only")

    def print(self, message: str) -> None:
        if not self.enabled or self.quiet:
            return
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        clean["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # when the line was written (UTC)
        self.file.write(json.dumps(clean) + "\n")
        step = record["step"]
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)
        if self.bar is not None:
            if "train_loss" in record:
                self.bar.n = step
                self.bar.set_postfix(loss=f"{record['train_loss']:.4f}", refresh=False)
                self.bar.refresh()
            if "val_loss" in record:
                self.bar.write(f"step {step}: val loss {record['val_loss']:.4f}")
        elif not self.quiet and ("val_loss" in record or ("train_loss" in record and step % self.log_every == 0)):
            self.print(self._line(record))

    def _line(self, record: dict) -> str:
        step = record["step"]
        if "val_loss" in record:
            line = f"step {step:>6}/{self.total_steps}: val loss {record['val_loss']:.4f}  ppl {record['val_ppl']:.2f}"
            if record.get("val_bpb") is not None:
                line += f"  bpb {record['val_bpb']:.4f}"
            if record.get("val_acc") is not None:
                line += f"  acc {record['val_acc']:.4f}"
            if record.get("full_val_loss") is not None:
                line += f"  whole val split: loss {record['full_val_loss']:.4f}"
            return line
        elapsed = time.perf_counter() - self.start_time
        done = step - self.start_step
        eta = elapsed / max(done, 1) * (self.total_steps - step)
        return (f"step {step:>6}/{self.total_steps}: loss {record['train_loss']:.4f}  lr {record['lr']:.2e}  "
                f"{record['tokens_per_s']:,.0f} tok/s  eta {eta / 60:.1f} min")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

"""The training loop: AdamW, warmup + cosine, gradient accumulation to a global batch in tokens,
clipping, periodic eval on a fixed val set, atomic checkpoints and exact resume.

The same code runs as one process and under torchrun (DDP or FSDP2); only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import shutil
import sys
import time
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nlq.config import ModelConfig, RunConfig, TrainConfig
from nlq.data.batches import IGNORE, BatchPlan, eval_starts, mlm_windows, windows
from nlq.data.shards import TokenData, load_data
from nlq.data.tokenizers import GPT2_FILES
from nlq.errors import UserError
from nlq.lock import DirectoryLock, remove_stale
from nlq.model import Transformer
from nlq.training import checkpoint as ckpt
from nlq.training import distributed
from nlq.training.distributed import DistEnv
from nlq.training.logging import MetricsLogger, read_metrics, truncate_metrics, write_metrics
from nlq.training.schedule import lr_at

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


class TrainingError(UserError):
    """Training cannot go on (a non-finite loss); the message names the step and the last good checkpoint."""


class PeerFailure(TrainingError):
    """A collective failed because another process died or hung. The process group is left as it is: its worker
    threads may still wait on the dead peer, so destroying it, or a normal interpreter exit, can hang; the command
    line ends the process with os._exit after reporting (checkpoints and records are complete files by then)."""


@dataclass(frozen=True)
class BatchSpec:
    global_rows: int  # context windows per optimizer step, over all ranks
    micro_rows: int  # windows per forward pass on one rank
    accum: int  # micro steps per optimizer step on each rank

    def tokens(self, context: int) -> int:
        return self.global_rows * context


def batch_spec(train: TrainConfig, context: int, world: int) -> BatchSpec:
    """The global batch stays the same whatever the world size; the accumulation adapts to it."""
    if train.batch_tokens is None:
        global_rows = train.batch_size
    elif train.batch_tokens % context:
        raise UserError(f"train.batch_tokens={train.batch_tokens} is not a multiple of model.block_size={context}")
    else:
        global_rows = train.batch_tokens // context
    if global_rows % world:
        raise UserError(f"a global batch of {global_rows} windows does not split over {world} processes; "
                        f"make train.batch_tokens / model.block_size a multiple of {world}")
    per_rank = global_rows // world
    micro = min(train.batch_size, per_rank)
    if per_rank % micro:
        raise UserError(f"{per_rank} windows per process do not split into micro-batches of train.batch_size="
                        f"{train.batch_size}; pick a batch_size that divides {per_rank}")
    return BatchSpec(global_rows, micro, per_rank // micro)


def tune_allocator() -> bool:
    """Keep freed tensor memory in glibc's heap instead of returning it to the OS. By default glibc serves
    large blocks with mmap and unmaps them on free, so every training step faults the same pages in again
    (about 90k minor page faults and 0.17 s of system time per step of the `small` preset on 2 cores;
    docs/PERFORMANCE.md). With mmap off and no trimming the heap keeps its high-water mark and reuses it.
    A no-op (False) where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # glibc's mallopt parameter numbers (malloc.h)
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))  # int max: never trim
    except (OSError, AttributeError):
        return False


def memory_estimate(model: ModelConfig, micro_rows: int) -> dict[str, float]:
    """Rough bytes a training step needs, from the config alone (nothing is allocated): fp32 weights,
    gradients and AdamW's two moments, and the activations of one micro-batch kept for the backward pass."""
    d, L, T, V = model.n_embd, model.n_layer, model.block_size, model.vocab_size
    params = V * d * (1 if model.tie_embeddings else 2) + (T * d if model.position == "learned" else 0)
    params += L * (4 * d * d + 2 * d * model.mlp_hidden)
    activations = micro_rows * T * (L * (16 * d + 2 * model.mlp_hidden) + 3 * V)
    return {"parameters": 16.0 * params, "activations": 4.0 * activations}


def available_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_memory(config: RunConfig, micro_rows: int, device: torch.device) -> None:
    """Refuse, before allocating anything, a step that cannot fit: a one-line error naming what to lower."""
    need = memory_estimate(config.model, micro_rows)
    have = available_memory(device)
    if sum(need.values()) <= have:
        return
    m = config.model
    lower = ("model.n_layer, model.n_embd, model.vocab_size or model.block_size" if need["parameters"] > have / 2
             else "train.batch_size (the micro-batch), model.block_size or the model size")
    raise UserError(f"this run needs about {sum(need.values()) / 2**30:,.1f} GiB ({need['parameters'] / 2**30:,.1f} for "
                    f"weights and optimizer state, {need['activations'] / 2**30:,.1f} for activations of {micro_rows} x "
                    f"{m.block_size} tokens) and {device} has {have / 2**30:,.1f} GiB; lower {lower}")


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device, sharded: bool):
    """AdamW; weight decay on >= 2-D parameters (matrices, embeddings) only, never on norm weights or biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = not sharded and device.type in ("cpu", "cuda")  # the fused kernel halves optimizer time on CPU
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls in hardware (AVX-512 with bf16, or AMX). Elsewhere (AVX2) torch
    emulates them: measured on an AVX2 EPYC, 0.3 GFLOP/s against 145 in fp32 (docs/PERFORMANCE.md)."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX", "AVX512_AMX")


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda"):
        if device.type == "cpu" and not cpu_has_native_bf16():
            raise UserError(f"train.dtype=bfloat16 on this CPU ({torch.backends.cpu.get_cpu_capability()}, no native "
                            f"bf16) runs about 100x slower than float32; use --train.dtype=float32")
        return torch.bfloat16
    return None


def peak_flops(cfg: TrainConfig, device: torch.device, dtype: torch.dtype | None) -> float | None:
    """Peak FLOP/s of one device for the MFU estimate: train.peak_tflops, or known GPUs in bf16."""
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if device.type == "cuda" and dtype == torch.bfloat16:
        name = torch.cuda.get_device_name(device)
        return next((tf * 1e12 for key, tf in PEAK_BF16_TFLOPS.items() if key in name), None)
    return None


def unigram_entropy(tokens: np.ndarray, vocab_size: int, block: int = 1 << 26) -> float:
    """Entropy (nats) of the token frequencies: the loss of a model that ignores context."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(tokens), block):
        counts += np.bincount(tokens[i:i + block], minlength=vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@dataclass(frozen=True)
class EvalSet:
    """The fixed eval windows of a run, and how they become (inputs, targets) for its objective."""

    tokens: np.ndarray
    starts: np.ndarray
    context: int
    objective: str = "clm"
    mask_id: int = 0
    vocab_size: int = 0
    mask_prob: float = 0.15
    seed: int = 0

    def batch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.starts[indices]
        if self.objective == "clm":
            return windows(self.tokens, starts, self.context)
        seeds = [(self.seed, _EVAL_MASK_STREAM, int(i)) for i in indices]  # fixed masks, like the windows
        return mlm_windows(self.tokens, starts, self.context, seeds, self.mask_id, self.vocab_size, self.mask_prob)


_EVAL_MASK_STREAM = 0xE7A2


def make_eval_set(config: RunConfig, data: TokenData) -> EvalSet:
    context = config.model.block_size
    starts = eval_starts(data.val, context, config.data.eval_windows, config.data.eval_seed)
    return EvalSet(data.val, starts, context, config.train.objective, mask_id=data.vocab_size,
                   vocab_size=data.vocab_size, mask_prob=config.train.mask_prob, seed=config.data.eval_seed)


def make_full_eval_set(config: RunConfig, data: TokenData) -> EvalSet:
    """The whole val split as non-overlapping windows (every token but the last few scored once; a token's
    context is what precedes it in its window)."""
    context = config.model.block_size
    starts = np.arange((len(data.val) - 1) // context, dtype=np.int64) * context
    if not len(starts):
        raise UserError(f"the val split has {len(data.val)} tokens, fewer than one window of {context + 1}")
    return dataclasses.replace(make_eval_set(config, data), starts=starts)


@torch.no_grad()
def evaluate(model, eval_set: EvalSet, batch_rows: int, env: DistEnv, dtype: torch.dtype | None) -> dict:
    """Loss (nats per scored token) and accuracy over the fixed eval windows, split over ranks. Every rank
    runs the same number of forward passes (FSDP needs that), padding with a batch that counts zero."""
    was_training = model.training
    model.eval()
    mine = np.array_split(np.arange(len(eval_set.starts)), env.world)[env.rank]
    n_batches = math.ceil(math.ceil(len(eval_set.starts) / env.world) / batch_rows)
    total = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss sum, scored tokens, correct
    for b in range(n_batches):
        rows = mine[b * batch_rows:(b + 1) * batch_rows]
        counts = len(rows) > 0
        x, y = (t.to(env.device) for t in eval_set.batch(rows if counts else np.arange(1)))
        with _autocast(env.device, dtype):
            logits, _ = model(x)
        scored = y != IGNORE
        loss_sum = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1), ignore_index=IGNORE,
                                   reduction="sum")
        correct = ((logits.argmax(dim=-1) == y) & scored).sum()
        if counts:
            total += torch.stack([loss_sum.double(), scored.sum().double(), correct.double()])
    distributed.all_reduce_sum(total, env)
    model.train(was_training)
    return {"loss": (total[0] / total[1]).item(), "accuracy": (total[2] / total[1]).item()}


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def check_vocab(data: TokenData, model: ModelConfig, objective: str = "clm") -> None:
    """The model's vocabulary must hold the data's (and, for masked LM, one more id: the mask token)."""
    needed = data.vocab_size + (1 if objective == "mlm" else 0)
    if needed > model.vocab_size:
        padded = math.ceil(needed / 64) * 64
        extra = " plus the mask token" if objective == "mlm" else ""
        raise UserError(f"the data's vocabulary ({data.vocab_size}, {data.meta['tokenizer']}){extra} does not fit "
                        f"model.vocab_size={model.vocab_size}; set --model.vocab_size={padded} or prepare the data "
                        f"with a smaller tokenizer")


TOKENIZER_FILES = ("tokenizer.json", *GPT2_FILES)


def copy_data_files(data: TokenData, run_dir: Path) -> None:
    """Keep what eval --text and sample need in the run directory: the data's meta and tokenizer files."""
    shutil.copyfile(data.directory / "meta.json", run_dir / "data_meta.json")
    for name in TOKENIZER_FILES:
        if (data.directory / name).is_file():
            shutil.copyfile(data.directory / name, run_dir / name)


def tokenizer_files(data: TokenData) -> dict:
    """The data's meta and tokenizer files as text, stored in every checkpoint."""
    files = {name: (data.directory / name).read_text() for name in TOKENIZER_FILES if (data.directory / name).is_file()}
    return {"data_meta": json.dumps(data.meta), "files": files}


def _restore_rng(payload: dict, env: DistEnv, seed: int) -> None:
    """Each rank gets back its own RNG state (dropout masks differ per rank and continue exactly). When the
    world size changed, no saved state belongs to a rank: each rank is then seeded from (seed, step, rank),
    so ranks still differ, deterministically, though the stream differs from the uninterrupted run's."""
    states = payload.get("rng_ranks") or [payload.get("rng") or {}]  # nlq 0.1 saved rank 0's only
    if len(states) != env.world:
        torch.manual_seed(int.from_bytes(hashlib.blake2b(f"{seed}/{payload['step']}/{env.rank}".encode(),
                                                         digest_size=8).digest(), "little") >> 1)
        return
    rng = states[env.rank]
    if "cpu" in rng:
        torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and env.device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], env.device)


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def train(config: RunConfig, run_dir: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    """Train one run into run_dir; returns its summary. Joins the process group under torchrun."""
    env = distributed.init(config.dist, config.train.device)
    tune_allocator()
    run_dir = Path(run_dir)
    lock = (DirectoryLock(run_dir.parent / f".{run_dir.name}.lock", f"run directory {run_dir}") if env.is_main
            else contextlib.nullcontext())
    peer_failed = False
    try:
        with lock:  # one writer per run directory, for the life of this process
            if env.is_main:  # leftovers of a killed process: half-written checkpoints and records
                for folder, pattern in ((run_dir / "checkpoints", ".step_*.tmp-*"), (run_dir, ".*.tmp-*"), (run_dir, "*.tmp")):
                    remove_stale(folder, pattern)
            return Trainer(config, run_dir, env, resume, quiet).run()
    except RuntimeError as e:  # a peer died or hung: the collective failed, or timed out after dist.timeout_s
        if not (env.distributed and distributed.is_collective_failure(e)):
            raise
        peer_failed = True
        raise PeerFailure(f"rank {env.rank}: a collective operation failed ({str(e).splitlines()[0][:160]}); another "
                            f"process died or stopped answering (dist.timeout_s={config.dist.timeout_s}); resume from "
                            f"the last checkpoint once all processes are healthy") from None
    finally:
        if not peer_failed:
            distributed.shutdown(env)


class Trainer:
    def __init__(self, config: RunConfig, run_dir: Path, env: DistEnv, resume: bool, quiet: bool):
        self.config, self.run_dir, self.env, self.quiet = config, run_dir, env, quiet
        cfg, tcfg = config, config.train
        self.data, self.task = None, None
        if cfg.data.task:  # a synthetic task generated on the fly (data/tasks.py); its table comes from eval_seed
            from nlq.data.tasks import Task

            self.task = Task(cfg.data.task, cfg.data.task_vocab, cfg.data.task_pairs, cfg.model.block_size,
                             cfg.data.eval_seed)
            if self.task.vocab_size > cfg.model.vocab_size:
                raise UserError(f"task {self.task.name} uses {self.task.vocab_size} token ids, more than "
                                f"model.vocab_size={cfg.model.vocab_size}; set --model.vocab_size={self.task.vocab_size}")
        elif not cfg.data.dir:
            raise UserError("no data directory: pass --data DATA_DIR (made by nlq prepare)")
        else:
            self.data = load_data(cfg.data.dir)
            check_vocab(self.data, cfg.model, tcfg.objective)  # before any compute
        self.spec = batch_spec(tcfg, cfg.model.block_size, env.world)
        check_memory(cfg, self.spec.micro_rows, env.device)
        self.dtype = autocast_dtype(tcfg, env.device)  # refuses bf16 where the CPU has none, before any write
        self.payload = self._existing_checkpoint(resume)
        self.start_step = self.payload["step"] if self.payload else 0
        distributed.barrier(env)  # every rank has looked at the run directory before rank 0 writes to it
        if env.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            config.save(run_dir / "config.json")  # the resolved config, before step 0
            if self.data is not None:
                copy_data_files(self.data, run_dir)
            self._start_metrics()
        distributed.barrier(env)

        torch.manual_seed(tcfg.seed + env.rank)  # dropout: independent masks on each rank
        self.model = Transformer(cfg.model, seed=tcfg.seed)  # the bare model: checkpoints are taken from it
        self.fresh, self.train_acc = None, None
        if tcfg.init_from and not self.payload:  # weights trained elsewhere, a fresh optimizer at step 0
            from nlq.interop.load import load_initial_weights

            self.fresh = load_initial_weights(self.model, tcfg.init_from)
        self.model = self.model.to(env.device)
        self.train_model = distributed.wrap(self.model, env, cfg.dist.strategy)
        self.optimizer = make_optimizer(self.model, tcfg, env.device, sharded=env.distributed and cfg.dist.strategy == "fsdp")
        if self.payload:
            try:
                ckpt.load_full_state(self.model, self.optimizer, self.payload["model"], self.payload["optimizer"])
            except (RuntimeError, KeyError, ValueError) as e:
                raise UserError(f"cannot resume from {self.payload['path']}: its weights do not fit the model its "
                                f"config describes ({str(e).splitlines()[0][:200]})") from None
            _restore_rng(self.payload, env, tcfg.seed)
        if tcfg.compile:
            self.train_model = torch.compile(self.train_model)
        if self.task is not None:
            from nlq.data.tasks import TaskEvalSet, TaskPlan

            self.plan = TaskPlan(self.task, self.spec.global_rows, tcfg.seed)
            self.eval_set = TaskEvalSet(self.task, np.arange(cfg.data.eval_windows), cfg.data.eval_seed)
        else:
            self.plan = BatchPlan(self.data.train, cfg.model.block_size, self.spec.global_rows, tcfg.seed,
                                  cfg.data.batch_mode)
            self.eval_set = make_eval_set(cfg, self.data)
        self.flops_per_token = self.model.flops_per_token()
        self.tokenizer_files = tokenizer_files(self.data) if self.data is not None else None
        self.peak = peak_flops(tcfg, env.device, self.dtype)

    def _existing_checkpoint(self, resume: bool) -> dict | None:
        """The state to start from: this run's latest checkpoint on --resume, else train.resume_from (a
        checkpoint of another run: a branch, e.g. a WSD cooldown from a stable run), else None."""
        latest = ckpt.latest_checkpoint(self.run_dir)
        if not resume and (latest is not None or read_metrics(self.run_dir / "metrics.jsonl")):  # an empty start is no run
            raise UserError(f"{self.run_dir} already holds a run; pass --resume to continue it or choose another --out")
        if resume and latest is not None:
            return self._resumable(ckpt.load_checkpoint(latest))
        if self.config.train.resume_from:
            payload = self._resumable(ckpt.load_checkpoint(self.config.train.resume_from))
            return payload | {"branched_from": payload["path"]}
        return None

    def _resumable(self, payload: dict) -> dict:
        if "optimizer" not in payload:
            raise UserError(f"{payload['path']} holds weights only (no optimizer state), so training cannot continue "
                            f"from it; start a new run from its weights with --train.init_from={payload['path']}")
        return self._compatible(payload)

    def _compatible(self, payload: dict) -> dict:
        saved = asdict(RunConfig.from_dict({"model": payload["config"].get("model") or {}}).model)
        changed = [k for k, v in asdict(self.config.model).items() if saved.get(k) != v]
        if changed:
            raise UserError(f"cannot start from {payload['path']}: the model config differs "
                            f"({', '.join('model.' + k for k in changed)})")
        return payload

    def _start_metrics(self) -> None:
        """Keep this run's records up to its start step; a branch starts with its source run's records."""
        path = self.run_dir / "metrics.jsonl"
        if self.payload and "branched_from" in self.payload:
            source = Path(self.payload["branched_from"]).parent.parent / "metrics.jsonl"
            write_metrics(path, [r for r in read_metrics(source) if r.get("step", 0) <= self.start_step])
        else:
            truncate_metrics(path, self.start_step if self.payload else -1)

    def run(self) -> dict:
        cfg, tcfg, env = self.config, self.config.train, self.env
        context = cfg.model.block_size
        step_tokens = self.spec.tokens(context)
        logger = MetricsLogger(self.run_dir, env.is_main, tcfg.max_steps, self.start_step, tcfg.log_every,
                               tcfg.tensorboard, tcfg.wandb, cfg.to_dict(), quiet=self.quiet)
        logger.print(
            f"run {self.run_dir}: {self.model.num_parameters():,} non-embedding parameters, query={cfg.model.query}, "
            f"{step_tokens:,} tokens/step ({self.spec.global_rows} x {context}; {env.world} proc x "
            f"{self.spec.accum} accum x {self.spec.micro_rows}), device {env.device}, "
            + (f"branching from {self.payload['branched_from']} at step {self.start_step}" if self.payload and "branched_from" in self.payload
               else f"resuming at step {self.start_step}" if self.payload else "from scratch"))
        if self.fresh is not None:
            logger.print(f"weights from {tcfg.init_from}" + (f"; fresh: {', '.join(self.fresh)}" if self.fresh else ""))
        if self.start_step == 0:
            logger.log(self._eval_record(0))
        last_ckpt = self.payload["path"] if self.payload else None
        rates = []
        try:
            for step in range(self.start_step, tcfg.max_steps):
                started = time.perf_counter()
                lr = lr_at(step, tcfg)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                done = step + 1
                train_loss, grad_norm = self._update(step, done, last_ckpt)
                elapsed = time.perf_counter() - started
                rates.append(step_tokens / elapsed)
                record = {"step": done, "train_loss": train_loss, "lr": lr, "grad_norm": grad_norm,
                          "tokens": done * step_tokens, "tokens_per_s": step_tokens / elapsed}
                if self.train_acc is not None:
                    record["train_acc"] = self.train_acc
                if self.peak:
                    record["mfu"] = self.flops_per_token * record["tokens_per_s"] / (self.peak * env.world)
                logger.log(record)
                if done % tcfg.eval_every == 0 or done == tcfg.max_steps:
                    logger.log(self._eval_record(done))
                if (tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0) or done == tcfg.max_steps:
                    if not all(torch.isfinite(p).all() for p in self.model.parameters()):
                        raise self._diverged(f"parameters are not finite after step {done}", last_ckpt)
                    last_ckpt = self._save(done)
        finally:
            logger.close()
        summary = self._summary(rates)
        if env.is_main:
            tmp = self.run_dir / "summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            tmp.replace(self.run_dir / "summary.json")
        return summary

    @staticmethod
    def _diverged(what: str, last_ckpt: str | None) -> TrainingError:
        return TrainingError(f"{what}; stopped. The last good checkpoint is "
                             f"{last_ckpt or 'none (no checkpoint was saved yet)'}; lower train.lr or resume from it")

    def _update(self, step: int, done: int, last_ckpt: str | None) -> tuple[float, float]:
        """One optimizer step over the global batch; returns (mean loss over ranks, grad norm). A non-finite
        loss or gradient stops training before the optimizer touches the weights."""
        env, accum = self.env, self.spec.accum
        totals = torch.zeros(3, device=env.device)  # loss sum; correct and scored answers (tasks)
        for micro in range(accum):
            x, y = self._batch(step, micro)
            x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
            sync = micro == accum - 1 or not hasattr(self.train_model, "no_sync")
            with (contextlib.nullcontext() if sync else self.train_model.no_sync()), _autocast(env.device, self.dtype):
                logits, loss = self.train_model(x, y)
            (loss / accum).backward()
            totals[0] += loss.detach()
            if self.task is not None:  # accuracy on the answer positions
                scored = y != IGNORE
                totals[1] += ((logits.detach().argmax(dim=-1) == y) & scored).sum()
                totals[2] += scored.sum()
        totals = distributed.all_reduce_sum(totals, env)
        loss = (totals[0] / (accum * env.world)).item()
        self.train_acc = (totals[1] / totals[2]).item() if self.task is not None else None
        clip = self.config.train.grad_clip or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
            grad_norm = grad_norm.full_tensor()
        grad_norm = grad_norm.item()
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {grad_norm}"
            raise self._diverged(f"{what} at step {done}", last_ckpt)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grad_norm

    def _batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        env, tcfg = self.env, self.config.train
        if tcfg.objective == "mlm":
            return self.plan.mlm_batch(step, env.rank, env.world, micro, self.spec.accum, self.data.vocab_size,
                                       self.data.vocab_size, tcfg.mask_prob)
        return self.plan.batch(step, env.rank, env.world, micro, self.spec.accum)

    def _eval_record(self, step: int) -> dict:
        result = evaluate(self.train_model, self.eval_set, self.spec.micro_rows, self.env, self.dtype)
        loss = result["loss"]
        record = {"step": step, "val_loss": loss, "val_ppl": math.exp(min(loss, 700)), "val_acc": result["accuracy"]}
        if self.config.train.objective == "clm" and self.data is not None:  # bits per byte of text (not tasks); masked LM scores only 15% of it
            record["val_bpb"] = loss / math.log(2) / self.data.bytes_per_token("val")
        if step == self.config.train.max_steps and self.config.data.final_eval == "full":
            record |= self._full_eval_record()
        return record

    def _full_eval_record(self) -> dict:
        """The final model on the whole val split (data.final_eval=full): keys full_val_*."""
        eval_set = make_full_eval_set(self.config, self.data)
        result = evaluate(self.train_model, eval_set, self.spec.micro_rows, self.env, self.dtype)
        record = {"full_val_loss": result["loss"], "full_val_acc": result["accuracy"],
                  "full_val_windows": len(eval_set.starts)}
        if self.config.train.objective == "clm":
            record["full_val_bpb"] = result["loss"] / math.log(2) / self.data.bytes_per_token("val")
        return record

    def _save(self, step: int) -> str:
        model_state, optim_state = ckpt.full_state(self.model, self.optimizer)  # collective under FSDP
        rng_ranks = distributed.gather_objects(_rng_state(self.env.device), self.env)  # collective too
        path = ckpt.checkpoint_dir(self.run_dir) / f"step_{step:07d}.pt"
        if self.env.is_main:
            payload = {"model": model_state, "optimizer": optim_state, "step": step, "rng": rng_ranks[0],
                       "rng_ranks": rng_ranks, "config": self.config.to_dict(),
                       "tokenizer": self.tokenizer_files}  # a copied checkpoint file still knows its tokenizer
            path = ckpt.save_checkpoint(self.run_dir, step, payload, self.config.train.keep_checkpoints)
            if step == self.config.train.max_steps:
                ckpt.save_model_only(self.run_dir, model_state, self.config.to_dict(), step)
        distributed.barrier(self.env)
        return str(path)

    def _summary(self, rates: list[float]) -> dict:
        records = read_metrics(self.run_dir / "metrics.jsonl") if self.env.is_main else []
        evals = [r for r in records if "val_loss" in r]
        final = evals[-1] if evals else {}
        data = self.data
        return {
            "steps": self.config.train.max_steps, "final_step": final.get("step"),
            "val_loss": final.get("val_loss"), "val_ppl": final.get("val_ppl"), "val_bpb": final.get("val_bpb"),
            "val_acc": final.get("val_acc"), "objective": self.config.train.objective,
            **{k: v for k, v in final.items() if k.startswith("full_val_")},
            "tokens": self.config.train.max_steps * self.spec.tokens(self.config.model.block_size),
            "tokens_per_s": float(np.median(rates)) if rates else None,
            "non_embedding_parameters": self.model.num_parameters(),
            "unigram_entropy": (unigram_entropy(data.train, data.vocab_size) if data is not None and len(data.train) < 2**30
                                else None),
            "world": self.env.world, "device": str(self.env.device),
        }

"""The training loop: AdamW, warmup then cosine or warmup-stable-decay, gradient accumulation to a global
batch in tokens, clipping, periodic eval on a fixed val set, atomic checkpoints and exact resume.

The same code runs as one process and under torchrun (DDP or FSDP2); only rank 0 writes. What the run trains
on (inputs.py), evaluation (evaluate.py), the diagnostics (diagnostics.py), the host (hardware.py) and the files of
a run directory (runs/) live beside it. lines: the loop, its checkpoints and what a run records of itself stay in
one class.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from nlq.components import check_loss_impl
from nlq.config import RunConfig, TrainConfig, update
from nlq.data.batches import IGNORE
from nlq.errors import Diverged, PeerFailure, UserError
from nlq.fileio import remove_stale
from nlq.interop.load import load_initial_weights
from nlq.lock import directory_lock
from nlq.model import Transformer
from nlq.own_code import first_batch, guarded
from nlq.projections import check_own_code, own_sources
from nlq.provenance import code_version, tensor_hash, utc_now
from nlq.runs import checkpoint as ckpt
from nlq.runs.metrics import read_metrics, truncate_metrics, write_metrics
from nlq.runs.rundir import recorded_code, save_config, write_summary
from nlq.runs.transitions import induction_transition
from nlq.schedule import lr_at
from nlq.training import distributed
from nlq.training.diagnostics import InductionProbe
from nlq.training.distributed import DistEnv
from nlq.training.evaluate import evaluate, perplexity
from nlq.training.hardware import autocast, autocast_dtype, check_memory, peak_flops, set_threads, tune_allocator
from nlq.training.inputs import batch_spec, load_inputs
from nlq.training.logging import MetricsLogger


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device, sharded: bool):
    """AdamW; weight decay on >= 2-D parameters (matrices, embeddings) only, never on norm weights or biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = not sharded and device.type in ("cpu", "cuda")  # the fused kernel halves optimizer time on CPU
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def loss_impl(config: RunConfig, scores_answers: bool, device: torch.device) -> str:
    """train.loss_impl resolved for this run ("auto": chunked on a CPU where this torch has F.linear_cross_entropy,
    as measured in docs/PERFORMANCE.md; plain on other devices until measured there, and for a synthetic task,
    whose answer accuracy needs the logits); a combination that cannot work is a one-line error."""
    impl, chunked_here = config.train.loss_impl, hasattr(torch.nn.functional, "linear_cross_entropy")
    if impl == "auto":
        return "chunked" if chunked_here and not scores_answers and device.type == "cpu" else "plain"
    if impl != "plain" and scores_answers:
        raise UserError(f"train.loss_impl={impl} never builds the logits, and data.task={config.data.task} scores its "
                        f"answers from them; use train.loss_impl=plain (or auto)")
    check_loss_impl(impl, device)
    return impl


def train(config: RunConfig, run_dir: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    """Train one run into run_dir; returns its summary. Joins the process group under torchrun."""
    env = distributed.init(config.dist, config.train.device)
    tune_allocator()
    if env.device.type == "cpu":
        set_threads(config)
    run_dir = Path(run_dir)
    lock = directory_lock(run_dir, f"run directory {run_dir}") if env.is_main else contextlib.nullcontext()
    peer_failed = False
    try:
        with lock:  # one writer per run directory, for the life of this process
            if env.is_main:  # leftovers of a killed process: half-written checkpoints and records
                for folder in (run_dir, ckpt.checkpoint_dir(run_dir)):
                    remove_stale(folder)
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
        self.inputs = load_inputs(config)  # a corpus or a synthetic task; checked before any compute
        resolved = loss_impl(config, self.inputs.scores_answers, env.device)
        config = update(config, {"train": {"loss_impl": resolved}})  # config.json records the loss that ran
        self.config, self.run_dir, self.env, self.quiet = config, run_dir, env, quiet
        cfg, tcfg = config, config.train
        self.spec = batch_spec(tcfg, cfg.model.block_size, env.world)
        check_memory(cfg, self.spec.micro_rows, env.device)
        self.dtype = autocast_dtype(tcfg, env.device)  # refuses bf16 where the CPU has none, before any write
        self.payload = self._existing_checkpoint(resume)
        self.start_step = self.payload["step"] if self.payload else 0
        torch.manual_seed(tcfg.seed + env.rank)  # dropout: independent masks on each rank
        with guarded(cfg.model.placements.values(), "nlq built the model"):  # code of one's own fails before any write
            self.model = Transformer(cfg.model, seed=tcfg.seed)  # the bare model: checkpoints are taken from it
        self.fresh, self.train_acc = None, None
        if tcfg.init_from and not self.payload:  # weights trained elsewhere, a fresh optimizer at step 0
            self.fresh = load_initial_weights(self.model, tcfg.init_from)
        self.model = self.model.to(env.device)
        self.batches = self.inputs.batches(self.spec.global_rows, tcfg.seed)  # each step's batch, from (seed, step)
        self._try_own_code()
        distributed.barrier(env)  # every rank has looked at the run directory before rank 0 writes to it
        if env.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            save_config(config, run_dir / "config.json")  # the resolved config, before step 0
            self.inputs.save_files(run_dir)
            self._start_metrics()
        distributed.barrier(env)
        self.train_model = distributed.wrap(self.model, env, cfg.dist.strategy)
        self.optimizer = make_optimizer(self.model, tcfg, env.device,
                                        sharded=env.distributed and cfg.dist.strategy == "fsdp")
        if self.payload:
            try:
                ckpt.load_full_state(self.model, self.optimizer, self.payload["model"], self.payload["optimizer"])
            except (RuntimeError, KeyError, ValueError) as e:
                raise UserError(f"cannot resume from {self.payload['path']}: its weights do not fit the model its "
                                f"config describes ({str(e).splitlines()[0][:200]})") from None
            ckpt.restore_rng(self.payload, env.rank, env.world, tcfg.seed, env.device)
        if tcfg.compile:
            self.train_model = torch.compile(self.train_model)
        self.eval_set = self.inputs.eval_set()
        self.probe = (InductionProbe(cfg.model.vocab_size, cfg.model.block_size, tcfg.diagnostics_every, env.device)
                      if tcfg.diagnostics_every and tcfg.objective == "clm" and cfg.model.block_size >= 4
                      else None)  # language models with room for two copies of a few tokens
        self.flops_per_token = self.model.flops_per_token()
        self.peak = peak_flops(tcfg, env.device, self.dtype)

    def _try_own_code(self) -> None:
        """A model with projections of one's own reads its first batch once before anything is written."""
        if own_sources(self.config.model.placements.values()):
            x, y = (t.to(self.env.device) for t in self._batch(self.start_step, 0))
            first_batch(self.model, x, y, self.config, autocast(self.env.device, self.dtype))

    def _existing_checkpoint(self, resume: bool) -> dict | None:
        """The state to start from: this run's latest checkpoint on --resume, else train.resume_from (a
        checkpoint of another run: a branch, e.g. a WSD cooldown from a stable run), else None."""
        others = [p for p in self.run_dir.iterdir()
                  if p.name != "requested_config.json"] if self.run_dir.is_dir() else []
        if others and not (self.run_dir / "config.json").is_file():  # (a study writes requested_config.json first)
            raise UserError(f"{self.run_dir} holds files but no run (no config.json): it is another kind of folder, "
                            f"which nlq train does not write into; choose a new or empty --out")
        latest = ckpt.latest_checkpoint(self.run_dir)
        # an empty start is no run
        if not resume and (latest is not None or read_metrics(self.run_dir / "metrics.jsonl")):
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
        check_own_code(recorded_code(payload), str(payload["path"]))  # its weights meant for the same code
        saved = asdict(ckpt.payload_config(payload).model)
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
            + (f"branching from {self.payload['branched_from']} at step {self.start_step}"
               if self.payload and "branched_from" in self.payload
               else f"resuming at step {self.start_step}" if self.payload else "from scratch"))
        if self.fresh is not None:
            logger.print(f"weights from {tcfg.init_from}" + (f"; fresh: {', '.join(self.fresh)}" if self.fresh else ""))
        started_utc = utc_now()
        self.starts = self._earlier_starts() + [{"step": self.start_step, "utc": started_utc}]
        code = code_version()  # now, while the tree is the one this process imported, not when the run ends
        if self.start_step == 0:
            logger.log(self._eval_record(0))
            self._diagnose(logger, 0)
        last_ckpt = self.payload["path"] if self.payload else None
        if self.start_step == 0 and tcfg.checkpoint_at_start:  # the initial weights, to check an init against
            last_ckpt = self._save(0)
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
                self._diagnose(logger, done)
                if done % tcfg.eval_every == 0 or done == tcfg.max_steps:
                    logger.log(self._eval_record(done))
                if (tcfg.checkpoint_every and done % tcfg.checkpoint_every == 0) or done == tcfg.max_steps:
                    if not all(torch.isfinite(p).all() for p in self.model.parameters()):
                        raise self._diverged(f"parameters are not finite after step {done}", last_ckpt)
                    last_ckpt = self._save(done)
        finally:
            logger.close()
        summary = self._summary(rates) | {"record": self._record(started_utc, code)}
        if env.is_main:
            write_summary(self.run_dir, summary)
        return summary

    @staticmethod
    def _diverged(what: str, last_ckpt: str | None) -> Diverged:
        return Diverged(f"{what}; stopped. The last good checkpoint is "
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
            with (contextlib.nullcontext() if sync else self.train_model.no_sync()), autocast(env.device, self.dtype):
                logits, loss = self.train_model(x, y, loss_impl=self.config.train.loss_impl,
                                                loss_chunk=self.config.train.loss_chunk)
            (loss / accum).backward()
            totals[0] += loss.detach()
            if self.inputs.scores_answers:  # accuracy on the answer positions
                scored = y != IGNORE
                totals[1] += ((logits.detach().argmax(dim=-1) == y) & scored).sum()
                totals[2] += scored.sum()
        totals = distributed.all_reduce_sum(totals, env)
        loss = (totals[0] / (accum * env.world)).item()
        self.train_acc = (totals[1] / totals[2]).item() if self.inputs.scores_answers else None
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
        return self.batches.batch(step, self.env.rank, self.env.world, micro, self.spec.accum)

    def _diagnose(self, logger: MetricsLogger, step: int) -> None:
        """The induction diagnostics at their cadence (every rank measures: under FSDP the forward is collective)."""
        if self.probe is not None and self.probe.due(step, self.config.train.max_steps):
            logger.log(self.probe.measure(self.model, step, autocast(self.env.device, self.dtype)))

    def _eval_record(self, step: int) -> dict:
        result = evaluate(self.train_model, self.eval_set, self.spec.micro_rows, self.env, self.dtype)
        loss = result["loss"]
        record = {"step": step, "val_loss": loss, "val_ppl": perplexity(loss), "val_acc": result["accuracy"]}
        record |= self.inputs.loss_metrics(loss)
        if step == self.config.train.max_steps and self.config.data.final_eval == "full":
            record |= self._full_eval_record()
        return record

    def _full_eval_record(self) -> dict:
        """The final model on the whole val split (data.final_eval=full): keys full_val_*."""
        eval_set = self.inputs.full_eval_set()
        result = evaluate(self.train_model, eval_set, self.spec.micro_rows, self.env, self.dtype)
        return {"full_val_loss": result["loss"], "full_val_acc": result["accuracy"],
                "full_val_windows": len(eval_set.starts)} | self.inputs.loss_metrics(result["loss"], "full_val")

    def _save(self, step: int) -> str:
        model_state, optim_state = ckpt.full_state(self.model, self.optimizer)  # collective under FSDP
        rng_ranks = distributed.gather_objects(ckpt.rng_state(self.env.device), self.env)  # collective too
        path = ckpt.checkpoint_dir(self.run_dir) / f"step_{step:07d}.pt"
        if self.env.is_main:
            payload = {"model": model_state, "optimizer": optim_state, "step": step, "rng": rng_ranks[0],
                       "starts": self.starts,  # each process's start of this run: a resumed run keeps its history
                       "rng_ranks": rng_ranks, "config": self.config.to_dict(),
                       "tokenizer": self.inputs.checkpoint_files(),  # a copied checkpoint still knows its tokenizer
                       "projections": own_sources(self.config.model.placements.values())}  # and its code of one's own
            path = ckpt.save_checkpoint(self.run_dir, step, payload, self.config.train.keep_checkpoints)
            if step == self.config.train.max_steps:
                ckpt.save_model_only(self.run_dir, model_state, self.config.to_dict(), step)
        distributed.barrier(self.env)
        return str(path)

    def _earlier_starts(self) -> list[dict]:
        """The starts of the processes that trained this run before this one, from the checkpoint it resumes (one
        written before nlq kept them: an earlier start at step 0, time unknown); none for a new run or a branch."""
        if not self.payload or "branched_from" in self.payload:
            return []
        return self.payload.get("starts") or [{"step": 0, "utc": None}]

    def _record(self, started_utc: str, code: str | None) -> dict:
        """Where the run came from: the code commit, this process's UTC start and end (resumed_at_step: where it
        took over from an earlier process of the same run; starts: every process's start step and UTC time, the
        first also as first_started_utc, None where a checkpoint written before nlq kept them cannot say), a hash of
        the run's first training batch (rank 0's first micro-batch of the step the run starts at: 0, or the step of
        the checkpoint it branches from), equal for every member of a pair), and the CPU kernels torch chose
        (ATEN_CPU_CAPABILITY sets them): runs at AVX2 and AVX-512 kernels differ in the last bits from the first step
        on."""
        first_step = ckpt.step_of(Path(self.config.train.resume_from)) if self.config.train.resume_from else 0
        x, y = self.batches.batch(first_step, 0, self.env.world, 0, self.spec.accum)
        resumed = self.start_step if self.payload and "branched_from" not in self.payload else None
        record = {"code": code, "started_utc": started_utc, "ended_utc": utc_now(),
                  "first_started_utc": self.starts[0]["utc"], "starts": self.starts, "resumed_at_step": resumed,
                  "first_batch": {"step": first_step, "sha256": tensor_hash(x, y)},
                  "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # which kernels: runs on other CPUs differ
        own = own_sources(self.config.model.placements.values())  # projections of the user's own: which code
        return record | ({"projections": own} if own else {})

    def _summary(self, rates: list[float]) -> dict:
        records = read_metrics(self.run_dir / "metrics.jsonl") if self.env.is_main else []
        evals = [r for r in records if "val_loss" in r]
        final = evals[-1] if evals else {}
        transition = induction_transition(records)  # None: no diagnostics
        return {
            "steps": self.config.train.max_steps, "final_step": final.get("step"),
            "val_loss": final.get("val_loss"), "val_ppl": final.get("val_ppl"), "val_bpb": final.get("val_bpb"),
            "val_acc": final.get("val_acc"), "objective": self.config.train.objective,
            **{k: v for k, v in final.items() if k.startswith("full_val_")},
            "tokens": self.config.train.max_steps * self.spec.tokens(self.config.model.block_size),
            "tokens_per_s": float(np.median(rates)) if rates else None,
            "non_embedding_parameters": self.model.num_parameters(),
            **self.inputs.summary(),
            "world": self.env.world, "device": str(self.env.device), "threads": torch.get_num_threads(),
        } | ({"transition_step": transition.step, "transition_censored": transition.censored} if transition else {}) \
          | ({"test_loss": final.get("val_loss"), "test_accuracy": final.get("val_acc")}  # a classifier's evaluations
             if self.config.train.objective == "classify" else {})  # score its whole test split

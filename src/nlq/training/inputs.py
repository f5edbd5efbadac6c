"""What a run trains and evaluates on, behind one interface: token shards of a prepared corpus, or a synthetic
task generated on the fly (data/tasks.py). The trainer asks the inputs for batches, eval sets and the extra
metrics their kind has, so it needs no `if task` of its own. Also the batch geometry: global batch, micro
batches and accumulation for a world size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nlq.config import RunConfig, TrainConfig
from nlq.data.batches import BatchPlan
from nlq.data.labelled import is_labelled_dir, load_labelled, seeded_split
from nlq.data.shards import TokenData, load_data
from nlq.data.tasks import Task, TaskEvalSet, TaskPlan
from nlq.errors import UserError
from nlq.fileio import write_json
from nlq.runs.rundir import copy_data_files, tokenizer_files
from nlq.training.evaluate import bits_per_byte, check_vocab, make_eval_set, make_full_eval_set


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


class _MaskedPlan:
    """Masked-LM batches of a corpus: the same windows as next-token training, masked per (seed, step, row)."""

    def __init__(self, plan: BatchPlan, vocab_size: int, mask_prob: float):
        self.plan, self.vocab_size, self.mask_prob = plan, vocab_size, mask_prob

    def batch(self, step: int, rank: int = 0, world: int = 1, micro: int = 0, n_micro: int = 1):
        return self.plan.mlm_batch(step, rank, world, micro, n_micro, self.vocab_size, self.vocab_size, self.mask_prob)


class CorpusInputs:
    """A prepared data directory (nlq prepare)."""

    scores_answers = False  # the training loss covers every token; no accuracy to log per step

    def __init__(self, config: RunConfig):
        if not config.data.dir:
            raise UserError("no data directory: pass --data DATA_DIR (made by nlq prepare)")
        self.config = config
        self.data: TokenData = load_data(config.data.dir)
        check_vocab(self.data, config.model, config.train.objective)  # before any compute

    def batches(self, global_rows: int, seed: int):
        cfg = self.config
        plan = BatchPlan(self.data.train, cfg.model.block_size, global_rows, seed, cfg.data.batch_mode)
        return _MaskedPlan(plan, self.data.vocab_size, cfg.train.mask_prob) if cfg.train.objective == "mlm" else plan

    def eval_set(self):
        return make_eval_set(self.config, self.data)

    def full_eval_set(self):
        return make_full_eval_set(self.config, self.data)

    def loss_metrics(self, loss: float, prefix: str = "val") -> dict:
        """Bits per byte of text, for next-token models (masked LM scores only 15% of it)."""
        if self.config.train.objective != "clm":
            return {}
        return {f"{prefix}_bpb": bits_per_byte(loss, self.data.bytes_per_token("val"))}

    def save_files(self, run_dir: Path) -> None:
        copy_data_files(self.data, run_dir)

    def checkpoint_files(self) -> dict | None:
        return tokenizer_files(self.data)

    def summary(self) -> dict:
        data = self.data
        entropy = unigram_entropy(data.train, data.vocab_size) if len(data.train) < 2**30 else None
        return {"unigram_entropy": entropy}


class TaskInputs:
    """A synthetic task generated on the fly; its table and held-out set come from data.eval_seed."""

    scores_answers = True  # loss and accuracy count the answer positions only

    def __init__(self, config: RunConfig):
        cfg = config.data
        self.config = config
        self.task = Task(cfg.task, cfg.task_vocab, cfg.task_pairs, config.model.block_size, cfg.eval_seed)
        if config.train.objective != "clm":
            raise UserError(f"data.task={cfg.task} trains next-token prediction on its answers; use "
                            f"--train.objective=clm (and a causal model)")
        if self.task.vocab_size > config.model.vocab_size:
            raise UserError(f"task {self.task.name} uses {self.task.vocab_size} token ids, more than "
                            f"model.vocab_size={config.model.vocab_size}; "
                            f"set --model.vocab_size={self.task.vocab_size}")

    def batches(self, global_rows: int, seed: int):
        return TaskPlan(self.task, global_rows, seed)

    def eval_set(self):
        return TaskEvalSet(self.task, np.arange(self.config.data.eval_windows), self.config.data.eval_seed)

    def full_eval_set(self):
        raise UserError("a synthetic task has no val split to score whole; use data.final_eval=windows")

    def loss_metrics(self, loss: float, prefix: str = "val") -> dict:
        return {}

    def save_files(self, run_dir: Path) -> None:
        pass

    def checkpoint_files(self) -> dict | None:
        return None

    def summary(self) -> dict:
        return {"unigram_entropy": None}


class LabelledPlan:
    """Batches of labelled examples, a pure function of (seed, step): each step draws global_rows example indices
    with replacement (as the corpus plan draws windows), split over ranks and micro-batches."""

    def __init__(self, x: np.ndarray, y: np.ndarray, global_rows: int, seed: int):
        self.x, self.y, self.global_rows, self.seed = x, y, global_rows, seed

    def batch(self, step: int, rank: int = 0, world: int = 1, micro: int = 0, n_micro: int = 1):
        rows = np.random.default_rng([self.seed, step]).integers(0, len(self.y), self.global_rows)
        mine = np.array_split(np.array_split(rows, world)[rank], n_micro)[micro]
        return torch.from_numpy(self.x[mine]), torch.from_numpy(self.y[mine])


@dataclass(frozen=True)
class LabelledEvalSet:
    """Every example of the test split, in order (its `starts` are the example indices)."""

    x: np.ndarray
    y: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        return np.arange(len(self.y))

    def batch(self, indices: np.ndarray):
        return torch.from_numpy(self.x[indices]), torch.from_numpy(self.y[indices])


class LabelledInputs:
    """Labelled signals or images (nlq prepare --source mnist1d|digits): a classifier's training examples and its
    whole test split, which is both the evaluation during training and the final score (val_* and full_val_* in
    metrics.jsonl and summary.json are on the test split)."""

    scores_answers = True  # the loss covers each example's class; accuracy is logged per step

    def __init__(self, config: RunConfig):
        self.config = config
        self.arrays, self.meta = load_labelled(config.data.dir)
        self.split = None  # the prepared split; data.split=seed: a stratified split drawn from train.seed
        if config.data.split == "seed":
            self.arrays, self.split = seeded_split(self.arrays, config.train.seed)
        m, shape = config.model, self.meta["splits"]["train"]["shape"]
        expected = [m.input_size, m.in_channels] if m.input_dims == 1 else [m.in_channels, m.input_size, m.input_size]
        if config.train.objective != "classify" or shape != expected or self.meta["classes"] > m.classes:
            size, channels = (shape[-1], shape[0]) if len(shape) == 3 else (shape[0], shape[1])
            raise UserError(f"{config.data.dir} holds {self.meta['classes']} classes of inputs shaped {shape}; train "
                            f"it with --train.objective=classify --model.classes={self.meta['classes']} "
                            f"--model.input_dims={len(shape) - 1} --model.input_size={size} --model.in_channels="
                            f"{channels} (and --model.causal=false)")

    def batches(self, global_rows: int, seed: int):
        return LabelledPlan(self.arrays["train_x"], self.arrays["train_y"], global_rows, seed)

    def eval_set(self):
        return LabelledEvalSet(self.arrays["test_x"], self.arrays["test_y"])

    def full_eval_set(self):
        return self.eval_set()

    def loss_metrics(self, loss: float, prefix: str = "val") -> dict:
        return {}

    def save_files(self, run_dir: Path) -> None:
        write_json(run_dir / "data_meta.json", self.meta)

    def checkpoint_files(self) -> dict | None:
        return None

    def summary(self) -> dict:
        return {"unigram_entropy": None, "data_content_hash": self.meta["content_hash"]} | (
            {"split": self.split} if self.split else {})


def load_inputs(config: RunConfig) -> CorpusInputs | TaskInputs | LabelledInputs:
    if config.data.task:
        return TaskInputs(config)
    if config.data.dir and is_labelled_dir(config.data.dir):
        return LabelledInputs(config)
    if config.data.split == "seed":
        raise UserError(f"data.split=seed splits labelled examples again, and {config.data.dir or 'the data'} holds a "
                        "text corpus, whose val split is fixed; leave data.split at fixed")
    if config.train.objective == "classify":
        raise UserError("train.objective=classify needs labelled examples: --data DIR made by nlq prepare --source "
                        "mnist1d (or digits)")
    return CorpusInputs(config)


def unigram_entropy(tokens: np.ndarray, vocab_size: int, block: int = 1 << 26) -> float:
    """Entropy (nats) of the token frequencies: the loss of a model that ignores context."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(tokens), block):
        counts += np.bincount(tokens[i:i + block], minlength=vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())

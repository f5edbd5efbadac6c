"""Synthetic tasks, generated on the fly: mechanism probes for what attention can compute (no files).

Every example is a pure function of a seed tuple, like the token batch plans: row r of training step i comes
from (train.seed, i, r), so variants see the same examples, resume needs only the step, and ranks take
disjoint rows. The held-out set comes from data.eval_seed on a stream of its own. Targets are IGNORE except
at the answer positions, so loss and accuracy count answers only. Token 0 is padding.

- mqar: multi-query associative recall (Zoology, Arora et al. 2023). `pairs` key-value pairs
  k1 v1 ... kN vN (distinct keys), then queries: a stored key, whose value is the answer (it follows as the
  next input). Keys and values come from two vocabularies of `vocab` tokens each.
- lookup: recall through a two-token name. Stored pairs as in mqar, but a query names its key by two
  attribute tokens (a, b), and the key is T[a, b] for a fixed random table T (a bijection from A x B
  attribute pairs onto the A * B = `vocab` keys). The query must first gather both name tokens (a layer
  of composition more than mqar). Which key T[a, b] is, is a non-additive function of (a, b), but a key
  token's embedding can carry its own two attributes, so an additive score [a = a'] + [b = b'] (within a
  linear W_Q's reach) already singles out the right key: the task does not force a nonlinear query, it
  gives one room to help.
- selective-copy: `pairs` data tokens (from `vocab`) scattered among noise tokens; after a separator, copy
  them in order (Mamba, Gu & Dao 2023).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from nlq.data.batches import IGNORE
from nlq.errors import UserError

_TASK_STREAM = 0x7A5C
_EVAL_STREAM = 0x7A5E
PAD = 0


@dataclass(frozen=True)
class Task:
    name: str
    vocab: int  # keys and values each (mqar, lookup) or data tokens (selective-copy)
    pairs: int  # stored pairs, or data tokens to copy
    length: int  # tokens per example (model.block_size)
    seed: int = 0  # the task's identity: the lookup table

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise UserError(f"data.task={self.name!r} is not a task; choose one of {', '.join(TASKS)}")
        if self.vocab < 2 or self.pairs < 1:
            raise UserError(f"data.task_vocab={self.vocab} and data.task_pairs={self.pairs} must be >= 2 and >= 1")
        need = TASKS[self.name].min_length(self)
        if self.length < need:
            raise UserError(f"task {self.name} with {self.pairs} pairs needs examples of at least {need} tokens; "
                            f"model.block_size={self.length}: raise it or lower data.task_pairs")
        if self.name in ("mqar", "lookup") and self.pairs > self.vocab:
            raise UserError(f"data.task_pairs={self.pairs} distinct keys need data.task_vocab >= {self.pairs}")
        if self.name == "lookup" and math.isqrt(self.vocab) ** 2 != self.vocab:
            raise UserError(f"task lookup needs a square data.task_vocab (A x B attribute pairs), not {self.vocab}")

    @property
    def vocab_size(self) -> int:
        return TASKS[self.name].vocab_size(self)

    def example(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), each (length,) int64; targets IGNORE except at answer positions."""
        return TASKS[self.name].example(self, rng)

    def batch(self, row_seeds: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.example(np.random.default_rng([*s, _TASK_STREAM])) for s in row_seeds]
        return torch.from_numpy(np.stack([p[0] for p in pairs])), torch.from_numpy(np.stack([p[1] for p in pairs]))


def _blank(task: Task) -> tuple[np.ndarray, np.ndarray]:
    return np.full(task.length, PAD, dtype=np.int64), np.full(task.length, IGNORE, dtype=np.int64)


class MQAR:
    """ids: 0 pad, keys 1..V, values V+1..2V."""

    @staticmethod
    def min_length(task: Task) -> int:
        return 2 * task.pairs + 2

    @staticmethod
    def vocab_size(task: Task) -> int:
        return 1 + 2 * task.vocab

    @staticmethod
    def example(task: Task, rng: np.random.Generator):
        x, y = _blank(task)
        keys = 1 + rng.choice(task.vocab, size=task.pairs, replace=False)
        values = 1 + task.vocab + rng.integers(0, task.vocab, size=task.pairs)
        x[0:2 * task.pairs:2], x[1:2 * task.pairs:2] = keys, values
        _queries(x, y, 2 * task.pairs, keys, values, rng)
        return x, y


def _queries(x, y, start, query_tokens, answers, rng, width: int = 1) -> None:
    """Fill x from start with queries (width tokens naming a stored item) each followed by its answer; the
    target at a query's last token is the answer."""
    position = start
    while position + width < len(x):
        i = rng.integers(0, len(answers))
        x[position:position + width] = query_tokens[i]
        y[position + width - 1] = answers[i]
        x[position + width] = answers[i]
        position += width + 1


class Lookup:
    """ids: 0 pad, keys 1..V, values V+1..2V, attribute a 2V+1..2V+A, attribute b 2V+A+1..2V+2A (V = A^2)."""

    @staticmethod
    def min_length(task: Task) -> int:
        return 2 * task.pairs + 3

    @staticmethod
    def vocab_size(task: Task) -> int:
        return 1 + 2 * task.vocab + 2 * math.isqrt(task.vocab)

    @staticmethod
    def table(task: Task) -> np.ndarray:
        """T[a, b] -> key index 0..V-1, a fixed bijection per task seed."""
        side = math.isqrt(task.vocab)
        return np.random.default_rng([task.seed, _TASK_STREAM, 1]).permutation(task.vocab).reshape(side, side)

    @staticmethod
    def example(task: Task, rng: np.random.Generator):
        x, y = _blank(task)
        side, table = math.isqrt(task.vocab), Lookup.table(task)
        key_index = rng.choice(task.vocab, size=task.pairs, replace=False)
        values = 1 + task.vocab + rng.integers(0, task.vocab, size=task.pairs)
        x[0:2 * task.pairs:2], x[1:2 * task.pairs:2] = 1 + key_index, values
        inverse = np.empty((task.vocab, 2), dtype=np.int64)
        inverse[table.reshape(-1)] = np.stack(np.divmod(np.arange(task.vocab), side), axis=1)
        a, b = inverse[key_index, 0], inverse[key_index, 1]
        names = np.stack([1 + 2 * task.vocab + a, 1 + 2 * task.vocab + side + b], axis=1)  # (pairs, 2)
        _queries(x, y, 2 * task.pairs, names, values, rng, width=2)
        return x, y


class SelectiveCopy:
    """ids: 0 pad, 1 noise, 2 separator, data 3..V+2."""

    @staticmethod
    def min_length(task: Task) -> int:
        return 2 * task.pairs + 1

    @staticmethod
    def vocab_size(task: Task) -> int:
        return 3 + task.vocab

    @staticmethod
    def example(task: Task, rng: np.random.Generator):
        x, y = _blank(task)
        region = task.length - task.pairs  # noise with the data scattered in, then the separator at `region`
        data = 3 + rng.integers(0, task.vocab, size=task.pairs)
        x[:region] = 1
        x[np.sort(rng.choice(region, size=task.pairs, replace=False))] = data
        x[region] = 2
        x[region + 1:region + task.pairs] = data[:-1]  # the copy so far, as the next inputs
        y[region:region + task.pairs] = data
        return x, y


TASKS = {"mqar": MQAR, "lookup": Lookup, "selective-copy": SelectiveCopy}


class TaskPlan:
    """The training batches of a task: the interface of BatchPlan.batch (global batch split over ranks and
    micro steps; row r of step i is example (seed, i, r))."""

    def __init__(self, task: Task, global_rows: int, seed: int):
        self.task, self.global_rows, self.seed = task, global_rows, seed

    def batch(self, step: int, rank: int = 0, world: int = 1, micro: int = 0, n_micro: int = 1):
        per_micro = self.global_rows // (world * n_micro)
        first = (rank * n_micro + micro) * per_micro
        return self.task.batch([(self.seed, step, row) for row in range(first, first + per_micro)])


@dataclass(frozen=True)
class TaskEvalSet:
    """A fixed held-out set of n examples from eval_seed (the EvalSet interface: starts, batch(indices))."""

    task: Task
    starts: np.ndarray
    seed: int

    def batch(self, indices: np.ndarray):
        return self.task.batch([(self.seed, _EVAL_STREAM, int(i)) for i in indices])

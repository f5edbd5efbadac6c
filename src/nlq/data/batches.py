"""Deterministic, stateless batch plans: the windows of training step i are a pure function of
(seed, i, global batch, context). So every variant of a comparison sees the same batches, resuming needs
only the step number, and data-parallel ranks take disjoint slices of one global batch.

Global batch layout at a step: rows [rank][micro step][row], i.e. rank r, micro step m of A takes rows
(r * A + m) * b ... (r * A + m + 1) * b - 1. One process with A * world micro steps sees the same rows.
"""

from __future__ import annotations

import numpy as np
import torch

from nlq.errors import UserError

_EVAL_STREAM = 0xE7A1  # keeps the eval windows' random stream apart from the training steps'
_EPOCH_STREAM = 0xE90C
_MLM_STREAM = 0x3A5C
IGNORE = -100  # target of a position that is not scored


def step_rng(seed: int, step: int, stream: int = 0) -> np.random.Generator:
    """The random generator of one step; any per-batch randomness (e.g. MLM masking) derives from it."""
    return np.random.default_rng([seed, step, stream])


class BatchPlan:
    def __init__(self, tokens: np.ndarray, context: int, global_rows: int, seed: int, mode: str = "random"):
        if len(tokens) < context + 1:
            raise UserError(f"the training split has {len(tokens)} tokens, fewer than one window of "
                            f"context + 1 = {context + 1}; use a shorter model.block_size or more data")
        if mode not in ("random", "epoch"):
            raise UserError(f"data.batch_mode={mode!r} is not valid; choose random or epoch")
        self.tokens, self.context, self.global_rows, self.seed, self.mode = tokens, context, global_rows, seed, mode
        self.n_windows = (len(tokens) - 1) // context  # non-overlapping windows, for epoch mode
        self._orders: dict[int, np.ndarray] = {}  # epoch -> window order; a cache, recomputable from seed

    def starts(self, step: int) -> np.ndarray:
        """Start offsets of the step's global batch, shape (global_rows,)."""
        if self.mode == "random":  # windows with replacement, as the paper
            high = len(self.tokens) - self.context  # last start whose target window still fits
            return step_rng(self.seed, step).integers(0, high, size=self.global_rows)
        flat = step * self.global_rows + np.arange(self.global_rows)  # position in the endless epoch stream
        epochs, positions = np.divmod(flat, self.n_windows)
        order = np.empty(self.global_rows, dtype=np.int64)
        for epoch in np.unique(epochs):
            picked = epochs == epoch
            order[picked] = self._epoch_order(int(epoch))[positions[picked]]
        return order * self.context

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                self._orders.pop(min(self._orders))
            self._orders[epoch] = np.random.default_rng([self.seed, epoch, _EPOCH_STREAM]).permutation(self.n_windows)
        return self._orders[epoch]

    def rows(self, step: int, rank: int = 0, world: int = 1, micro: int = 0, n_micro: int = 1) -> np.ndarray:
        """Start offsets of one micro batch of one rank."""
        per_micro = self.global_rows // (world * n_micro)
        if per_micro * world * n_micro != self.global_rows:
            raise UserError(f"a global batch of {self.global_rows} rows does not split into {world} ranks x "
                            f"{n_micro} micro steps")
        first = (rank * n_micro + micro) * per_micro
        return self.starts(step)[first:first + per_micro]

    def batch(self, step: int, rank: int = 0, world: int = 1, micro: int = 0, n_micro: int = 1):
        """(x, y) int64 tensors of shape (rows, context); y is x shifted by one token."""
        return windows(self.tokens, self.rows(step, rank, world, micro, n_micro), self.context)

    def mlm_batch(self, step: int, rank: int, world: int, micro: int, n_micro: int, mask_id: int,
                  vocab_size: int, prob: float):
        """Masked-LM (inputs, targets): the same windows as batch(), masked by (seed, step, global row)."""
        per_micro = self.global_rows // (world * n_micro)
        first = (rank * n_micro + micro) * per_micro
        seeds = [(self.seed, step, row) for row in range(first, first + per_micro)]
        return mlm_windows(self.tokens, self.rows(step, rank, world, micro, n_micro), self.context, seeds,
                           mask_id, vocab_size, prob)


def windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    block = np.stack([np.asarray(tokens[s:s + context + 1], dtype=np.int64) for s in starts])  # (B, T + 1)
    block = torch.from_numpy(block)
    return block[:, :-1], block[:, 1:]


def eval_starts(tokens: np.ndarray, context: int, n_windows: int, seed: int) -> np.ndarray:
    """The fixed eval set: n_windows val windows drawn once from seed; the same for every run."""
    if len(tokens) < context + 1:
        raise UserError(f"the val split has {len(tokens)} tokens, fewer than one window of {context + 1}; "
                        f"use a shorter model.block_size or a larger --val-fraction")
    return np.random.default_rng([seed, _EVAL_STREAM]).integers(0, len(tokens) - context, size=n_windows)


def mask_tokens(tokens: torch.Tensor, rng: np.random.Generator, mask_id: int, vocab_size: int,
                prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of one window (T,): choose each position with probability prob; of those, 80% become
    mask_id, 10% a random token, 10% stay. Returns (inputs, targets) with targets IGNORE where not chosen."""
    chosen = torch.from_numpy(rng.random(tokens.shape) < prob)
    action = torch.from_numpy(rng.random(tokens.shape))
    random_ids = torch.from_numpy(rng.integers(0, vocab_size, size=tokens.shape))
    inputs = torch.where(chosen & (action < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, torch.where(chosen, tokens, IGNORE)


def mlm_windows(tokens: np.ndarray, starts: np.ndarray, context: int, row_seeds: list[tuple[int, ...]],
                mask_id: int, vocab_size: int, prob: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked-LM inputs and targets (B, T) of the windows at starts; row i's masking comes from the
    generator seeded with row_seeds[i], so it is the same on every rank, run and resume."""
    x, _ = windows(tokens, starts, context)
    pairs = [mask_tokens(row, np.random.default_rng([*seed, _MLM_STREAM]), mask_id, vocab_size, prob)
             for row, seed in zip(x, row_seeds)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

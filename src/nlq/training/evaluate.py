"""Evaluation: the fixed eval windows (or the whole val split) of a run, loss and accuracy over them, the
numbers derived from a loss (perplexity, bits per byte), and scoring a plain text file."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nlq.config import RunConfig
from nlq.data.batches import IGNORE, eval_starts, mlm_windows, windows
from nlq.data.shards import TokenData
from nlq.data.tokenizers import encode_text
from nlq.errors import UserError
from nlq.training import distributed
from nlq.training.distributed import DistEnv
from nlq.training.hardware import autocast

_EVAL_MASK_STREAM = 0xE7A2


def perplexity(loss: float) -> float:
    """exp(loss), capped where exp overflows (a diverged run's loss)."""
    return math.exp(min(loss, 700))


def bits_per_byte(loss: float, bytes_per_token: float) -> float:
    return loss / math.log(2) / bytes_per_token


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
def evaluate(model, eval_set, batch_rows: int, env: DistEnv, dtype: torch.dtype | None) -> dict:
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
        with autocast(env.device, dtype):
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


def check_vocab(data: TokenData, model, objective: str = "clm") -> None:
    """The model's vocabulary must hold the data's (and, for masked LM, one more id: the mask token)."""
    needed = data.vocab_size + (1 if objective == "mlm" else 0)
    if needed > model.vocab_size:
        padded = math.ceil(needed / 64) * 64
        extra = " plus the mask token" if objective == "mlm" else ""
        raise UserError(f"the data's vocabulary ({data.vocab_size}, {data.meta['tokenizer']}){extra} does not fit "
                        f"model.vocab_size={model.vocab_size}; set --model.vocab_size={padded} or prepare the data "
                        f"with a smaller tokenizer")


def evaluate_on_data(model, config: RunConfig, data: TokenData, full: bool = False) -> dict:
    """A trained model on a prepared dataset's val split (the run's fixed eval windows, or the whole split):
    loss, perplexity, accuracy, bits per byte (next-token models) and the number of windows."""
    check_vocab(data, config.model, config.train.objective)
    eval_set = (make_full_eval_set if full else make_eval_set)(config, data)
    result = evaluate(model, eval_set, config.train.batch_size, DistEnv(), None)
    result |= {"ppl": perplexity(result["loss"]), "windows": len(eval_set.starts)}
    if config.train.objective == "clm":
        result["bpb"] = bits_per_byte(result["loss"], data.bytes_per_token("val"))
    return result


@torch.no_grad()
def score_tokens(model, ids: np.ndarray) -> tuple[float, int]:
    """Sum of next-token losses (nats) over consecutive non-overlapping windows, and the number of targets."""
    T = model.cfg.block_size
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    if len(ids) < 2:
        raise UserError("the text is too short to score: it needs at least 2 tokens")
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, T):
        y = ids[start + 1:start + T + 1].to(device)[None]  # (1, <=T)
        x = ids[start:start + y.size(1)].to(device)[None]
        _, loss = model(x, y)
        total += loss.item() * y.numel()
        count += y.numel()
    return total, count


def loss_report(total_nats: float, tokens: int, n_bytes: int) -> dict:
    loss = total_nats / tokens
    return {"loss": loss, "ppl": perplexity(loss), "bpb": total_nats / math.log(2) / n_bytes, "tokens": tokens}


def evaluate_text_file(model, config: RunConfig, tokenizer, path: str | Path) -> dict:
    """A next-token model on a plain text file, tokenised with its run's tokenizer: loss, perplexity, bits per
    byte of the file and the number of scored tokens."""
    if config.train.objective != "clm":
        raise UserError("--text scores next-token prediction, and this run is a masked LM; use --data instead")
    path = Path(path)
    if not path.is_file():
        raise UserError(f"text file {path} does not exist")
    raw = path.read_bytes()
    ids = encode_text(tokenizer, raw.decode("utf-8", errors="replace"), str(path))
    return loss_report(*score_tokens(model, ids), len(raw))

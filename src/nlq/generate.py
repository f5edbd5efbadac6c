"""Loading a trained model from a run or checkpoint, sampling text, and scoring text files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from nlq.config import RunConfig
from nlq.data.tokenizers import load_tokenizer
from nlq.errors import UserError
from nlq.model import Transformer
from nlq.training import checkpoint as ckpt


def load_model(path: str | Path, device: str = "cpu") -> tuple[Transformer, RunConfig, dict]:
    """The model of a run directory (its latest checkpoint) or of a checkpoint file, in eval mode."""
    payload = ckpt.load_checkpoint(path)
    config = RunConfig.from_dict(payload["config"])
    model = Transformer(config.model)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise UserError(f"checkpoint {payload['path']} does not match its config: {str(e).splitlines()[0]}") from None
    return model.to(device).eval(), config, payload


def run_tokenizer(checkpoint_path: str | Path):
    """The tokenizer a run was trained with: from its run directory (training copies the files there), or
    from the checkpoint itself, which carries them (a checkpoint file copied on its own)."""
    import tempfile

    path = Path(checkpoint_path)
    run_dir = path.parent if path.suffix == ".safetensors" else path.parent.parent  # RUN_DIR/checkpoints/step_*.pt
    meta_path = run_dir / "data_meta.json"
    if meta_path.is_file():
        return load_tokenizer(run_dir, json.loads(meta_path.read_text())["tokenizer"])
    stored = ckpt.load_checkpoint(path).get("tokenizer") if path.suffix == ".pt" else None
    if not stored:
        raise UserError(f"{run_dir} has no data_meta.json and {path.name} carries no tokenizer, so the tokenizer is "
                        f"unknown; use nlq eval --data instead")
    folder = Path(tempfile.mkdtemp(prefix="nlq-tokenizer-"))
    for name, text in stored["files"].items():
        (folder / name).write_text(text)
    return load_tokenizer(folder, json.loads(stored["data_meta"])["tokenizer"])


def encode_text(tokenizer, text: str, what: str) -> np.ndarray:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{what} holds bytes that are not valid UTF-8, which the tokenizer cannot encode") from None
    (ids,) = tokenizer.encode_batch([text])
    if len(ids) == 0:
        raise UserError(f"{what} is empty: it encodes to no tokens")
    return ids


@torch.no_grad()
def generate(model: Transformer, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             vocab_limit: int | None = None) -> torch.Tensor:
    """Append max_new_tokens sampled tokens to idx (B, T); temperature 0 is greedy. vocab_limit: draw only
    ids below it (the tokenizer's vocabulary when the model's is padded)."""
    for _ in range(max_new_tokens):
        context = idx[:, -model.cfg.block_size:]
        logits = model(context)[0][:, -1, :vocab_limit]  # (B, V)
        if temperature == 0:
            next_id = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_id = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
        idx = torch.cat([idx, next_id], dim=1)
    return idx


@torch.no_grad()
def score_tokens(model: Transformer, ids: np.ndarray) -> tuple[float, int]:
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
    return {"loss": loss, "ppl": math.exp(min(loss, 700)), "bpb": total_nats / math.log(2) / n_bytes, "tokens": tokens}

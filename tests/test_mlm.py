"""Masked-language-model training for the encoder (causal = false)."""

import numpy as np
import pytest
import torch

from helpers import tiny_model_config, tiny_run_config
from nlq.data.batches import IGNORE, BatchPlan, mask_tokens
from nlq.errors import UserError
from nlq.runs.metrics import read_metrics
from nlq.training.trainer import train

TOKENS = (np.arange(200_000) % 250).astype(np.uint16)


def test_masking_proportions_on_a_large_sample():
    tokens = torch.randint(0, 250, (200_000,))
    inputs, targets = mask_tokens(tokens, np.random.default_rng(0), mask_id=250, vocab_size=250, prob=0.15)
    chosen = targets != IGNORE
    assert chosen.float().mean().item() == pytest.approx(0.15, abs=0.003)
    assert torch.equal(targets[chosen], tokens[chosen]) and (inputs[~chosen] == tokens[~chosen]).all()
    masked = (inputs[chosen] == 250).float().mean().item()
    unchanged = (inputs[chosen] == tokens[chosen]).float().mean().item()  # includes random draws of the same id
    assert masked == pytest.approx(0.8, abs=0.01)
    assert unchanged == pytest.approx(0.1 + 0.1 / 250, abs=0.01)
    assert 1 - masked - unchanged == pytest.approx(0.1 * (1 - 1 / 250), abs=0.01)  # random other tokens


def test_masks_are_identical_for_the_same_seed_and_step_and_split_across_ranks():
    plan = BatchPlan(TOKENS, context=64, global_rows=8, seed=3)
    a = plan.mlm_batch(5, 0, 1, 0, 1, 250, 250, 0.15)
    b = BatchPlan(TOKENS, context=64, global_rows=8, seed=3).mlm_batch(5, 0, 1, 0, 1, 250, 250, 0.15)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    other = plan.mlm_batch(6, 0, 1, 0, 1, 250, 250, 0.15)
    assert not torch.equal(a[1], other[1])
    halves = [plan.mlm_batch(5, rank, 2, 0, 1, 250, 250, 0.15) for rank in (0, 1)]
    assert torch.equal(torch.cat([h[0] for h in halves]), a[0]) and torch.equal(torch.cat([h[1] for h in halves]), a[1])


def encoder_config(data, **train):
    model = tiny_model_config(vocab_size=258, block_size=32, n_layer=2, n_head=2, n_embd=32, causal=False)
    return tiny_run_config(data, model=model, objective="mlm", **train)


def test_mlm_training_learns_and_reports_accuracy(byte_data, tmp_path):
    summary = train(encoder_config(byte_data, max_steps=60, eval_every=30, lr=5e-3), tmp_path / "run", quiet=True)
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "val_loss" in r]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 1.0
    assert evals[-1]["val_acc"] > evals[0]["val_acc"] + 0.1 and "val_bpb" not in evals[-1]
    assert summary["objective"] == "mlm" and summary["val_acc"] == evals[-1]["val_acc"]


def test_mlm_needs_room_for_the_mask_token(byte_data, tmp_path):
    config = encoder_config(byte_data)
    config = type(config)(model=tiny_model_config(vocab_size=257, block_size=32, causal=False), data=config.data,
                          train=config.train)
    with pytest.raises(UserError, match="plus the mask token does not fit model.vocab_size=257; set "
                                        "--model.vocab_size=320"):
        train(config, tmp_path / "run", quiet=True)


def test_mlm_resume_is_exact(byte_data, tmp_path):
    train(encoder_config(byte_data, max_steps=6, decay_steps=6, checkpoint_every=3), tmp_path / "a", quiet=True)
    train(encoder_config(byte_data, max_steps=3, decay_steps=6), tmp_path / "b", quiet=True)
    train(encoder_config(byte_data, max_steps=6, decay_steps=6), tmp_path / "b", resume=True, quiet=True)
    losses = [[r["train_loss"] for r in read_metrics(tmp_path / d / "metrics.jsonl") if "train_loss" in r]
              for d in "ab"]
    assert losses[0] == losses[1]


@pytest.mark.slow
def test_cli_encoder_eval_reports_accuracy_and_sample_refuses(byte_data, tmp_path):
    import subprocess
    import sys

    def nlq(*args):
        return subprocess.run([sys.executable, "-m", "nlq", *map(str, args)], capture_output=True, text=True)

    run = tmp_path / "enc"
    result = nlq("train", "--data", byte_data, "--out", run, "--preset", "nano", "--model.vocab_size=258",
                 "--model.block_size=32", "--model.causal=false", "--train.objective=mlm", "--train.max_steps=3")
    assert result.returncode == 0, result.stderr
    result = nlq("eval", run)
    assert result.returncode == 0 and "masked LM" in result.stdout and "accuracy" in result.stdout
    assert "bits/byte" not in result.stdout
    result = nlq("sample", run, "--prompt", "Shall")
    assert result.returncode == 2 and "needs a causal" in result.stderr
    result = nlq("eval", run, "--text", byte_data / "meta.json")
    assert result.returncode == 2 and "masked LM" in result.stderr

import socket

import pytest
import torch

from nlq.config import ModelConfig


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


def tiny_model_config(**changes) -> ModelConfig:
    """A model small enough that every test runs in milliseconds."""
    base = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32)
    base.update(changes)
    return ModelConfig(**base)


SAMPLE_TEXT = (
    "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
    "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
)


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory):
    """A small byte-level dataset prepared with nlq prepare (about 60 KB of text)."""
    from nlq.data.shards import prepare

    root = tmp_path_factory.mktemp("bytes")
    docs = root / "docs"
    docs.mkdir()
    for i in range(60):
        (docs / f"d{i:02d}.txt").write_text(f"Sonnet {i}.\n" + SAMPLE_TEXT * (2 + i % 5))
    prepare(str(docs), "byte", root / "data", log=lambda *_: None, val_fraction=0.15)
    return root / "data"


def tiny_run_config(data_dir, model=None, **train):
    """nano-sized model on the byte data; a handful of steps run in about a second."""
    from nlq.config import DataConfig, RunConfig, TrainConfig

    model = model or tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32)
    values = dict(max_steps=8, batch_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=2, eval_every=4, log_every=1)
    values.update(train)
    return RunConfig(model=model, data=DataConfig(dir=str(data_dir), eval_windows=8), train=TrainConfig(**values))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_wrapped_run_matches_plain(config, strategy, backend, tmp_path, monkeypatch):
    """Train config plainly, then as torchrun --nproc_per_node=1 would (a group of one, the model wrapped
    by DDP or FSDP2); the two loss curves must agree."""
    from nlq.config import update
    from nlq.runs.metrics import read_metrics
    from nlq.training.trainer import train

    train(config, tmp_path / "plain", quiet=True)
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    train(update(config, {"dist": {"strategy": strategy, "backend": backend}}), tmp_path / strategy, quiet=True)
    plain, wrapped = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("plain", strategy))
    a = [r["train_loss"] for r in plain if "train_loss" in r]
    b = [r["train_loss"] for r in wrapped if "train_loss" in r]
    assert len(a) == len(b) == config.train.max_steps
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x)


# a one-layer model on the byte data: the command-line tests train it in a second or two
SMALL = ["--model.vocab_size=257", "--model.block_size=32", "--model.n_layer=1", "--model.n_embd=32",
         "--model.n_head=2", "--train.batch_size=4", "--data.eval_windows=4", "--train.eval_every=2",
         "--train.warmup_steps=1"]


def train_small(byte_data, out, *extra):
    """A finished 4-step nano run through the command line (checkpoints at 2 and 4), with extra overrides."""
    from nlq.cli import main

    main(["train", "--data", str(byte_data), "--out", str(out), "--preset", "nano", *SMALL, "--train.max_steps=4",
          "--train.checkpoint_every=2", *extra])
    return out

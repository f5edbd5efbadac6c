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

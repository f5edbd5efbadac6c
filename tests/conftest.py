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

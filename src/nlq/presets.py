"""Named model sizes. Each preset is a function returning a full RunConfig: a base plus a few deltas.

gpt3-small follows the paper's recipe (docs/METHOD.md, section 3). The CPU presets keep its shape
(pre-LN, learned positions, no biases, tied embeddings, GELU MLP 4x) at sizes that learn something in
minutes on two cores. Their vocabulary (8192) fits `nlq prepare --tokenizer bpe:8192`.
"""

from __future__ import annotations

import dataclasses

from nlq.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig


def _cpu(model: ModelConfig, **train) -> RunConfig:
    defaults = dict(max_steps=1000, batch_size=16, lr=1e-3, min_lr=1e-4, warmup_steps=50, eval_every=100,
                    log_every=10)
    defaults.update(train)
    return RunConfig(model=model, data=DataConfig(eval_windows=64), train=TrainConfig(**defaults))


def gpt3_small() -> RunConfig:
    """GPT-3 small as in the paper: 12 x 768, 12 heads, context 1024, 491,520 tokens per step, 60k steps."""
    return RunConfig(
        model=ModelConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
        data=DataConfig(eval_windows=200 * 12),
        train=TrainConfig(
            max_steps=60_000, batch_size=12, batch_tokens=12 * 40 * 1024, lr=6e-4, min_lr=6e-5,
            warmup_steps=2000, weight_decay=0.1, eval_every=1000, checkpoint_every=1000, log_every=10,
        ),
    )


def nano() -> RunConfig:
    """2 x 64: for tests and smoke runs (seconds)."""
    return _cpu(ModelConfig(vocab_size=8192, block_size=64, n_layer=2, n_head=4, n_embd=64), batch_size=8)


def micro() -> RunConfig:
    """4 x 128, context 128 (about 0.8M non-embedding parameters)."""
    return _cpu(ModelConfig(vocab_size=8192, block_size=128, n_layer=4, n_head=4, n_embd=128))


def mini() -> RunConfig:
    """6 x 256, context 256 (about 4.7M non-embedding parameters)."""
    return _cpu(ModelConfig(vocab_size=8192, block_size=256, n_layer=6, n_head=8, n_embd=256), batch_size=8)


def small() -> RunConfig:
    """6 x 384, context 256: the common small reference shape (10.6M non-embedding parameters)."""
    return _cpu(ModelConfig(vocab_size=8192, block_size=256, n_layer=6, n_head=6, n_embd=384), batch_size=8,
                lr=6e-4, min_lr=6e-5)


def encoder() -> RunConfig:
    """micro as a bidirectional encoder trained with masked LM; vocabulary 8256 holds bpe:8192 + the mask token."""
    config = _cpu(ModelConfig(vocab_size=8256, block_size=128, n_layer=4, n_head=4, n_embd=128, causal=False))
    return dataclasses.replace(config, train=dataclasses.replace(config.train, objective="mlm"))


PRESETS = {"gpt3-small": gpt3_small, "nano": nano, "micro": micro, "mini": mini, "small": small, "encoder": encoder}


def get_preset(name: str) -> RunConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name]()


def with_model(config: RunConfig, **changes) -> RunConfig:
    """A copy of config with model fields changed (validated again)."""
    return dataclasses.replace(config, model=dataclasses.replace(config.model, **changes))

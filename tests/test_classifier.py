"""Encoder classifiers (model.classes > 0): the patch stem against a written-out reference for signals and images,
a bidirectional encoder with a class token or mean pooling, exact parameter counts, one-line config errors, batches
that are a pure function of (seed, step), and a classifier that learns MNIST-1D above chance."""

import json

import numpy as np
import pytest
import torch

from helpers import one_line_error
from nlq.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig
from nlq.model import Transformer

pytest.importorskip("mnist1d")


def classifier(**changes) -> ModelConfig:
    base = dict(vocab_size=8, n_layer=2, n_head=2, n_embd=32, classes=10, causal=False, input_dims=1, input_size=40,
                in_channels=1, patch_size=4, block_size=11)
    return ModelConfig(**(base | changes))


def test_the_patch_stem_cuts_signals_and_images_as_written_out():
    from nlq.components import PatchStem

    signal = torch.randn(2, 40, 3)
    stem = PatchStem(classifier(in_channels=3))
    reference = torch.stack([signal[:, 4 * i:4 * i + 4].reshape(2, 12) for i in range(10)], dim=1)
    torch.testing.assert_close(stem.patches(signal), reference, rtol=0, atol=0)
    image = torch.randn(2, 3, 8, 8)
    stem = PatchStem(classifier(input_dims=2, input_size=8, in_channels=3, patch_size=2, block_size=17))
    reference = torch.stack([image[:, :, 2 * r:2 * r + 2, 2 * c:2 * c + 2].reshape(2, 12)
                             for r in range(4) for c in range(4)], dim=1)  # reading order, channels first
    torch.testing.assert_close(stem.patches(image), reference, rtol=0, atol=0)


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_a_classifier_is_bidirectional_and_returns_one_logit_row_per_example(pool):
    cfg = classifier(pool=pool, block_size=11 if pool == "cls" else 10)
    model = Transformer(cfg, seed=0).eval()
    x = torch.randn(3, 40, 1)
    later = x.clone()
    later[:, -4:] += 1.0  # the last patch only
    with torch.no_grad():
        logits, loss = model(x, torch.tensor([1, 2, 3]))
        assert logits.shape == (3, 10) and loss.shape == ()
        assert not torch.allclose(model(later)[0], logits)  # the first token sees the last patch


def test_a_classifiers_parameters_are_counted_exactly():
    model = Transformer(classifier())
    groups = model.parameter_groups()
    assert groups["patch stem"] == 4 * 32 + 32 + 32  # proj weight and bias, the class token
    assert groups["position embedding"] == 11 * 32 and groups["class head"] == 32 * 10 + 10
    assert groups["token embedding"] == 0 and groups["lm head (untied)"] == 0
    assert model.num_parameters() == sum(groups.values()) - 11 * 32


@pytest.mark.parametrize("changes,needle", [
    (dict(causal=True), "set --model.causal=false"),
    (dict(block_size=16), "the stem makes 11 tokens (10^1 patches + a class token): set --model.block_size=11"),
    (dict(classes=1), "needs at least 2 classes"),
    (dict(input_size=42), "not a multiple of model.patch_size=4"),
])
def test_a_wrong_classifier_config_is_one_line(changes, needle):
    with pytest.raises(ConfigError) as error:
        classifier(**changes)
    assert needle in str(error.value), str(error.value)
    with pytest.raises(ConfigError, match="a classifier is --train.objective=classify"):
        RunConfig(model=classifier(), train=TrainConfig(objective="clm"))


def test_labelled_batches_are_a_pure_function_of_seed_and_step_and_split_over_ranks():
    from nlq.training.inputs import LabelledPlan

    x, y = np.arange(100, dtype=np.float32)[:, None, None].repeat(40, 1), np.arange(100) % 10
    plan = LabelledPlan(x, y, global_rows=8, seed=3)
    first, again = plan.batch(5), plan.batch(5)
    assert torch.equal(first[1], again[1]) and not torch.equal(first[1], plan.batch(6)[1])
    parts = [plan.batch(5, rank, 2, micro, 2)[1] for rank in range(2) for micro in range(2)]
    assert torch.equal(torch.cat(parts), first[1])


@pytest.fixture(scope="module")
def mnist1d_small(tmp_path_factory):
    from nlq.data.labelled import prepare_labelled

    out = tmp_path_factory.mktemp("mnist1d") / "data"
    prepare_labelled("mnist1d:600", out, log=lambda *_: None)
    return out


def test_a_classifier_learns_mnist1d_above_chance_and_nlq_eval_scores_its_test_split(mnist1d_small, tmp_path,
                                                                                      capsys):
    from nlq.cli import main
    from nlq.runs.metrics import read_metrics
    from nlq.training.trainer import train

    config = RunConfig(model=classifier(), data=DataConfig(dir=str(mnist1d_small)),
                       train=TrainConfig(objective="classify", max_steps=300, batch_size=32, lr=3e-3, min_lr=3e-4,
                                         warmup_steps=10, eval_every=300, log_every=10))
    train(config, tmp_path / "run", quiet=True)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert losses[-1] < losses[0] - 0.3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_acc"] > 0.25  # 10 classes: chance is 0.1
    assert summary["test_accuracy"] == summary["val_acc"] and summary["test_loss"] == summary["val_loss"]
    assert json.loads((tmp_path / "run" / "data_meta.json").read_text())["source"] == "mnist1d:600"
    capsys.readouterr()
    main(["eval", str(tmp_path / "run")])
    assert f"test (120 examples): loss {summary['val_loss']:.4f}" in capsys.readouterr().out
    one_line_error(capsys, ["export", tmp_path / "run", "--to", "hf", tmp_path / "hf"], "is an encoder classifier")


def test_a_labelled_directory_with_the_wrong_model_is_one_line(mnist1d_small, tmp_path, capsys):
    one_line_error(capsys, ["train", "--data", mnist1d_small, "--out", tmp_path / "run", "--preset", "nano",
                            "--model.classes=10", "--model.causal=false", "--model.block_size=9",
                            "--model.input_size=32", "--train.objective=classify"],
                   "--model.input_dims=1 --model.input_size=40 --model.in_channels=1")


def test_a_classifier_trains_on_digits_images(tmp_path):
    pytest.importorskip("sklearn")
    from nlq.data.labelled import prepare_labelled
    from nlq.training.trainer import train

    prepare_labelled("digits", tmp_path / "digits", log=lambda *_: None)
    cfg = classifier(input_dims=2, input_size=8, patch_size=2, block_size=17, pool="cls")
    config = RunConfig(model=cfg, data=DataConfig(dir=str(tmp_path / "digits")),
                       train=TrainConfig(objective="classify", max_steps=20, batch_size=32, lr=3e-3, min_lr=3e-4,
                                         warmup_steps=2, eval_every=20))
    summary = train(config, tmp_path / "run", quiet=True)
    assert summary["val_acc"] is not None and np.isfinite(summary["val_loss"])

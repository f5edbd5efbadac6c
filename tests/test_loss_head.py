"""The LM head's loss through PyTorch's own chunked linear cross-entropy (train.loss_impl=chunked) equals the plain
loss: value and every gradient, at several shapes, tied and untied, with ignored targets, for every query.

Tolerance: fp32 has a 24-bit mantissa (eps 1.2e-7). Chunking changes only the order of the sums (logsumexp over the
vocabulary, the mean over rows, the weight gradient accumulated chunk by chunk), so the two agree to a few eps
relative to the sizes involved: rtol 1e-5 and atol 1e-6 (losses near 5 nats, gradients near 1e-2) leave a margin
of 10x and more over the largest difference measured here (5e-7 on the loss, 3e-8 on gradients) and would catch any
real difference (a dropped row, a wrong ignore mask: 1e-3 and more)."""

import warnings

import pytest
import torch

from helpers import tiny_model_config, tiny_run_config
from nlq.errors import UserError
from nlq.model import Transformer
from nlq.runs.metrics import read_metrics
from nlq.training.trainer import train

RTOL, ATOL = 1e-5, 1e-6


def loss_and_grads(model, idx, targets, **kw):
    model.zero_grad(set_to_none=True)
    logits, loss = model(idx, targets, **kw)
    loss.backward()
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("query", ["linear", "identity", "residual", "nonlinear"])
@pytest.mark.parametrize("rows,chunk,tied",
                         [(3 * 16, 16, True), (5 * 16, 32, True), (4 * 16, 7, False), (2 * 16, 512, True)])
def test_chunked_loss_and_every_gradient_equal_the_plain_loss(query, rows, chunk, tied):
    """rows = B x T: 80 rows in chunks of 32 and 64 in chunks of 7 leave a last chunk that is not full; 32 rows
    in chunks of 512 is one chunk smaller than its size."""
    model = Transformer(tiny_model_config(query=query, tie_embeddings=tied), seed=3)
    idx = torch.randint(0, 97, (rows // 16, 16))
    targets = torch.randint(0, 97, (rows // 16, 16))
    targets[0, :5] = -100  # ignored positions (the masked-LM objective ignores every unmasked one)
    _, plain, plain_grads = loss_and_grads(model, idx, targets)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch warns when it falls back to its reference path: that fails here
        logits, chunked, chunked_grads = loss_and_grads(model, idx, targets, loss_impl="chunked", loss_chunk=chunk)
    assert logits is None  # the (rows, vocab) logits were never built
    torch.testing.assert_close(chunked, plain, rtol=RTOL, atol=ATOL)
    assert chunked_grads.keys() == plain_grads.keys() and len(plain_grads) == len(list(model.parameters()))
    for name in plain_grads:
        torch.testing.assert_close(chunked_grads[name], plain_grads[name], rtol=RTOL, atol=ATOL, msg=name)


def test_the_ignored_targets_are_ignored():
    model = Transformer(tiny_model_config(), seed=1)
    idx, targets = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    kept = targets.clone()
    kept[:, ::2] = -100
    _, loss = model(idx, kept, loss_impl="chunked", loss_chunk=8)
    _, only_odd = model(idx[:, :], torch.where(kept == -100, -100, targets), loss_impl="plain")
    torch.testing.assert_close(loss, only_odd, rtol=RTOL, atol=ATOL)
    _, everything = model(idx, targets, loss_impl="chunked", loss_chunk=8)
    assert abs(everything.item() - loss.item()) > 1e-4


def test_twenty_steps_with_the_chunked_loss_follow_the_plain_run(byte_data, tmp_path):
    """Whole training runs (AdamW, clipping, the nonlinear query, an MLM-free next-token objective) from the same
    seed: the loss curves agree step by step within the tolerance, compounded over 20 steps of updates."""
    model = tiny_model_config(vocab_size=257, block_size=32, query="nonlinear")
    for impl in ("plain", "chunked"):
        train(tiny_run_config(byte_data, model=model, max_steps=20, eval_every=10, loss_impl=impl, loss_chunk=48),
              tmp_path / impl, quiet=True)
    curves = {impl: [r["train_loss"] for r in read_metrics(tmp_path / impl / "metrics.jsonl") if "train_loss" in r]
              for impl in ("plain", "chunked")}
    assert len(curves["plain"]) == 20 and curves["plain"][-1] < curves["plain"][0] - 0.5
    for a, b in zip(curves["plain"], curves["chunked"]):
        assert b == pytest.approx(a, rel=1e-5)
    assert (tmp_path / "chunked" / "config.json").read_text().count('"loss_impl": "chunked"') == 1


def test_auto_resolves_to_chunked_for_a_corpus_and_the_run_records_it(byte_data, tmp_path):
    train(tiny_run_config(byte_data, max_steps=2), tmp_path / "run", quiet=True)
    assert '"loss_impl": "chunked"' in (tmp_path / "run" / "config.json").read_text()


@pytest.mark.parametrize("impl,needle", [("liger", "needs CUDA|CUDA kernel"), ("chunked", "never builds the logits")])
def test_combinations_that_cannot_work_are_one_line_errors(byte_data, tmp_path, impl, needle):
    from nlq.config import DataConfig, RunConfig, TrainConfig

    if impl == "liger":
        config = tiny_run_config(byte_data, max_steps=2, loss_impl="liger", device="cpu")
    else:  # a synthetic task scores its answers from the logits
        config = RunConfig(model=tiny_model_config(vocab_size=192, block_size=32), data=DataConfig(task="mqar"),
                           train=TrainConfig(max_steps=2, loss_impl="chunked"))
    with pytest.raises(UserError, match=needle) as error:
        train(config, tmp_path / "run", quiet=True)
    assert "\n" not in str(error.value) and not (tmp_path / "run").exists()


def test_the_model_called_directly_refuses_liger_off_cuda_in_one_line():
    """A user's own loop calls the model, not the trainer: the same one-line error, before any kernel is sought."""
    model = Transformer(tiny_model_config(), seed=0)
    idx = torch.randint(0, 97, (2, 16))
    with pytest.raises(UserError, match="CUDA kernel and this run is on cpu") as error:
        model(idx, idx, loss_impl="liger")
    assert "\n" not in str(error.value)

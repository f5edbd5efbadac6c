"""GPU checks (skipped without CUDA, so CI on CPU stays green): bf16 against fp32 for every query variant,
torch.compile against eager, a fused SDPA kernel at the paper's shapes, fused AdamW, DDP and FSDP2 in one
process, and checkpoints that move between GPU and CPU. `python benchmarks/gpu_check.py --out DIR` runs them."""

import os

import pytest
import torch

from helpers import assert_wrapped_run_matches_plain, tiny_model_config, tiny_run_config
from nlq.model import Transformer
from nlq.projections import PROJECTIONS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")
BF16_TOLERANCE = 0.03  # relative, on the training loss after 20 steps; measured in docs/PERFORMANCE.md


def _train_losses(model, steps: int, dtype, seed: int = 0) -> list[float]:
    from nlq.config import TrainConfig
    from nlq.training.trainer import make_optimizer

    optimizer = make_optimizer(model, TrainConfig(lr=3e-3), CUDA, sharded=False)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, model.cfg.vocab_size, (8, model.cfg.block_size), generator=generator).to(CUDA)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, (7 * x + 3) % model.cfg.vocab_size)  # a learnable token map
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@pytest.mark.parametrize("query", list(PROJECTIONS))
def test_bf16_autocast_training_tracks_fp32(query):
    cfg = tiny_model_config(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=128, query=query)
    fp32 = _train_losses(Transformer(cfg, seed=1).to(CUDA), 20, None)
    bf16 = _train_losses(Transformer(cfg, seed=1).to(CUDA), 20, torch.bfloat16)
    assert fp32[-1] < fp32[0] - 0.5  # it learned
    for a, b in zip(fp32, bf16):
        assert abs(a - b) / a < BF16_TOLERANCE, (fp32, bf16)


@pytest.mark.parametrize("query", ["linear", "nonlinear"])
def test_compile_agrees_with_eager(query):
    cfg = tiny_model_config(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=128, query=query)
    model = Transformer(cfg, seed=1).to(CUDA)
    x = torch.randint(0, 512, (4, 64), device=CUDA)
    eager_logits, eager_loss = model(x, x)
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    compiled_logits, compiled_loss = torch.compile(model)(x, x)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_logits, eager_logits, rtol=1e-4, atol=1e-4)
    for a, b in zip(eager_grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("query", ["linear", "nonlinear"])
def test_sdpa_runs_a_fused_kernel_at_the_papers_shape(query):
    """Only flash and cuDNN attention allowed: the call fails if neither kernel takes the paper's shape
    (context 1024, 12 heads of 64, causal, bf16, the folded 1/2 scale)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from nlq.presets import get_preset, with_model

    cfg = with_model(get_preset("gpt3-small"), query=query, n_layer=1).model
    model = Transformer(cfg, seed=1).to(CUDA)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), device=CUDA)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]), torch.autocast("cuda", torch.bfloat16):
        _, loss = model(x, x)
        loss.backward()
    assert torch.isfinite(loss)


def test_fused_adamw_on_cuda():
    from nlq.config import TrainConfig
    from nlq.training.trainer import make_optimizer

    model = Transformer(tiny_model_config(query="nonlinear"), seed=1).to(CUDA)
    optimizer = make_optimizer(model, TrainConfig(), CUDA, sharded=False)
    assert optimizer.defaults["fused"] is True
    _, loss = model(torch.randint(0, 97, (2, 16), device=CUDA), torch.randint(0, 97, (2, 16), device=CUDA))
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ddp_and_fsdp2_in_one_process_match_the_plain_model(strategy, byte_data, tmp_path, monkeypatch):
    """What torchrun --nproc_per_node=1 does: a process group of one (nccl), the model wrapped."""
    config = tiny_run_config(byte_data, max_steps=6, eval_every=3, device="cuda", dtype="float32")
    assert_wrapped_run_matches_plain(config, strategy, "nccl", tmp_path, monkeypatch)


def test_checkpoint_moves_from_gpu_to_cpu_and_back(byte_data, tmp_path):
    from nlq.config import update
    from nlq.runs.metrics import read_metrics
    from nlq.training.trainer import train

    gpu = tiny_run_config(byte_data, max_steps=4, eval_every=2, decay_steps=8, device="cuda", dtype="float32")
    train(gpu, tmp_path / "run", quiet=True)
    train(update(gpu, {"train": {"max_steps": 6, "device": "cpu"}}), tmp_path / "run", resume=True, quiet=True)
    train(update(gpu, {"train": {"max_steps": 8}}), tmp_path / "run", resume=True, quiet=True)
    straight = update(gpu, {"train": {"max_steps": 8}})
    train(straight, tmp_path / "straight", quiet=True)
    moved = [r["train_loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train_loss" in r]
    same = [r["train_loss"] for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if "train_loss" in r]
    assert len(moved) == len(same) == 8
    for x, y in zip(moved, same):  # CPU and GPU kernels round differently; the curve is the same run
        assert abs(x - y) <= 1e-3 * abs(y)
    assert os.path.isfile(tmp_path / "run" / "checkpoints" / "step_0000008.pt")


@pytest.mark.parametrize("impl", ["chunked", "liger"])
def test_the_fused_losses_equal_the_plain_loss_on_cuda(impl):
    """train.loss_impl=chunked (PyTorch's) and liger (Liger-Kernel's) against the plain loss on the GPU, fp32 (TF32
    off): the loss and every gradient within 1e-4 relative (a GPU reduction order differs more than a CPU's)."""
    if impl == "liger":
        pytest.importorskip("liger_kernel")
    model = Transformer(tiny_model_config(vocab_size=512, block_size=64), seed=1).to(CUDA)
    idx = torch.randint(0, 512, (6, 64), device=CUDA)
    targets = torch.randint(0, 512, (6, 64), device=CUDA)
    targets[0, :9] = -100
    _, plain = model(idx, targets)
    plain.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    _, fused = model(idx, targets, loss_impl=impl, loss_chunk=100)
    fused.backward()
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, reference[name], rtol=1e-4, atol=1e-6, msg=name)

"""Each query mode equals its formula from the paper, written out by hand, given the same weights."""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model_config
from nlq.model import Attention, Transformer
from nlq.projections import PROJECTIONS, build_projection


def rms_norm(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def layer_norm(x, weight, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight


def reference_query(mode, proj, x, cfg, activation=lambda h: F.gelu(h)):
    """Q exactly as the paper writes it, including the 1/2."""
    if mode == "linear":
        return x @ proj.weight_proj.weight.T
    if mode == "identity":
        return x
    if mode == "residual":
        return (x + x @ proj.weight_proj.weight.T) / 2
    if mode == "nonlinear":
        h = rms_norm(x, proj.in_norm_weight, cfg.norm_eps) @ proj.up.weight.T  # (B, T, r)
        f = layer_norm(activation(h) @ proj.down.weight.T, proj.out_norm.weight, cfg.norm_eps)  # (B, T, d)
        return (x + f) / 2
    raise AssertionError(mode)


def reference_attention(attn, x, cfg, q, scale, causal):
    """softmax(q k^T * scale) v with a loop over heads; no shortcut shared with the model."""
    d, hs = cfg.n_embd, cfg.head_size
    kv = x @ attn.kv_proj.weight.T
    k, v = kv[..., :d], kv[..., d:]
    T = x.shape[1]
    heads = []
    for h in range(cfg.n_head):
        sl = slice(h * hs, (h + 1) * hs)
        scores = q[..., sl] @ k[..., sl].transpose(-1, -2) * scale  # (B, T, T)
        if causal:
            scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        heads.append(scores.softmax(-1) @ v[..., sl])
    return torch.cat(heads, dim=-1) @ attn.o_proj.weight.T


def randomize_norms(module):
    """Norm weights start at 1; make them random so a forgotten norm would show."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or "bias" in name:
                p.uniform_(0.5, 1.5)


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mode", list(PROJECTIONS))
def test_attention_matches_paper_formula(mode, causal, impl):
    cfg = tiny_model_config(query=mode, causal=causal, attn_impl=impl)
    attn = Attention(cfg).double()
    randomize_norms(attn)
    x = torch.randn(2, 8, cfg.n_embd, dtype=torch.float64)
    q = reference_query(mode, attn.q_proj, x, cfg)
    # identity keeps Q = X and halves the scale instead (predecessor paper); the others halve Q itself
    scale = 1 / (2 * math.sqrt(cfg.head_size)) if mode == "identity" else 1 / math.sqrt(cfg.head_size)
    expected = reference_attention(attn, x, cfg, q, scale, causal)
    torch.testing.assert_close(attn(x), expected)


@pytest.mark.parametrize("activation,fn", [("relu", F.relu), ("silu", F.silu), ("relu2", lambda h: F.relu(h) ** 2)])
def test_nonlinear_activation_options(activation, fn):
    cfg = tiny_model_config(query="nonlinear", query_activation=activation)
    proj = build_projection("nonlinear", cfg).double()
    randomize_norms(proj)
    x = torch.randn(2, 5, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(proj(x) / 2, reference_query("nonlinear", proj, x, cfg, activation=fn))


def test_nonlinear_without_norms_and_custom_rank():
    cfg = tiny_model_config(query="nonlinear", query_in_norm=False, query_out_norm=False, query_rank=8)
    proj = build_projection("nonlinear", cfg).double()
    assert proj.up.weight.shape == (8, cfg.n_embd) and proj.down.weight.shape == (cfg.n_embd, 8)
    assert sum(p.numel() for p in proj.parameters()) == 2 * 8 * cfg.n_embd  # no norm weights left
    x = torch.randn(3, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(proj(x), x + F.gelu(x @ proj.up.weight.T) @ proj.down.weight.T)


def test_explicit_attn_scale_overrides_the_projection_multiplier():
    cfg = tiny_model_config(query="nonlinear", attn_scale=0.3)
    attn = Attention(cfg).double()
    x = torch.randn(2, 6, cfg.n_embd, dtype=torch.float64)
    q_unhalved = 2 * reference_query("nonlinear", attn.q_proj, x, cfg)
    torch.testing.assert_close(attn(x), reference_attention(attn, x, cfg, q_unhalved, 0.3, causal=True))


def test_residual_with_zero_weights_equals_identity():
    residual = Transformer(tiny_model_config(query="residual"))
    with torch.no_grad():
        for block in residual.blocks:
            block.attn.q_proj.weight_proj.weight.zero_()
    identity = Transformer(tiny_model_config(query="identity"))
    state = {k: v for k, v in residual.state_dict().items() if "q_proj" not in k}
    identity.load_state_dict(state)
    idx = torch.randint(0, 97, (2, 12))
    # (X + 0) / 2 at scale 1/sqrt(hs) is X at scale 1/(2 sqrt(hs))
    torch.testing.assert_close(residual(idx)[0], identity(idx)[0])


def test_gradients_reach_both_nonlinear_matrices():
    model = Transformer(tiny_model_config(query="nonlinear"))
    idx = torch.randint(0, 97, (2, 12))
    _, loss = model(idx, idx)
    loss.backward()
    for block in model.blocks:
        proj = block.attn.q_proj
        for p in (proj.up.weight, proj.down.weight, proj.in_norm_weight, proj.out_norm.weight):
            assert p.grad is not None and p.grad.abs().sum() > 0


def test_unknown_projection_lists_valid_names():
    with pytest.raises(ValueError, match="linear, identity, residual, nonlinear"):
        build_projection("quadratic", tiny_model_config())


def test_nonlinear_with_biases_matches_formula():
    cfg = tiny_model_config(query="nonlinear", bias=True)
    proj = build_projection("nonlinear", cfg).double()
    randomize_norms(proj)
    x = torch.randn(2, 5, cfg.n_embd, dtype=torch.float64)
    h = rms_norm(x, proj.in_norm_weight, cfg.norm_eps) @ proj.up.weight.T + proj.up.bias
    f = layer_norm(F.gelu(h) @ proj.down.weight.T + proj.down.bias, proj.out_norm.weight, cfg.norm_eps)
    torch.testing.assert_close(proj(x), x + f)

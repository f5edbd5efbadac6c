"""Each query mode equals its formula from the paper, written out by hand, given the same weights."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_model_config
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
    cfg = tiny_model_config(query="nonlinear", nonlinear_activation=activation)
    proj = build_projection("nonlinear", cfg).double()
    randomize_norms(proj)
    x = torch.randn(2, 5, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(proj(x) / 2, reference_query("nonlinear", proj, x, cfg, activation=fn))


def test_nonlinear_without_norms_and_custom_rank():
    cfg = tiny_model_config(query="nonlinear", nonlinear_in_norm=False, nonlinear_out_norm=False, nonlinear_rank=8)
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


# ---- beyond the query: K, V and O placements, QK-norm, RoPE, GQA (a reference for each) --------------------

def reference_full_attention(attn, x, cfg, causal=True, rotary=None):
    """Every placement by its formula: P(X) = X W (linear), X (identity), (X + X W)/2, (X + f(X))/2."""
    names = cfg.placements
    hs, T = cfg.head_size, x.shape[1]

    def apply(name, proj, inp):
        if isinstance(proj, torch.nn.Linear):  # the standard output projection is a plain nn.Linear
            return inp @ proj.weight.T
        return reference_query(name, proj, inp, cfg)

    q = apply(names["q"], attn.q_proj, x)
    if hasattr(attn, "kv_proj"):
        kv = x @ attn.kv_proj.weight.T
        k, v = kv.split(attn.kv_dim, dim=-1)
    else:
        k, v = apply(names["k"], attn.k_proj, x), apply(names["v"], attn.v_proj, x)
    scale = (0.5 if names["q"] == "identity" else 1.0) / math.sqrt(hs)
    group = cfg.n_head // cfg.kv_heads
    heads = []
    for h in range(cfg.n_head):
        qh = q[..., h * hs:(h + 1) * hs]
        g = h // group
        kh, vh = k[..., g * hs:(g + 1) * hs], v[..., g * hs:(g + 1) * hs]
        if cfg.qk_norm:
            qh, kh = rms_norm(qh, attn.q_norm.weight, cfg.norm_eps), rms_norm(kh, attn.k_norm.weight, cfg.norm_eps)
        if rotary is not None:
            qh, kh = rotary(qh), rotary(kh)
        scores = qh @ kh.transpose(-1, -2) * scale
        if causal:
            scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        heads.append(scores.softmax(-1) @ vh)
    y = torch.cat(heads, dim=-1)
    return apply(names["o"], attn.o_proj, y)


@pytest.mark.parametrize("impl", ["sdpa", "math"])
@pytest.mark.parametrize("placements", [
    dict(k="nonlinear"), dict(v="nonlinear"), dict(o="nonlinear"), dict(q="nonlinear", k="nonlinear"),
    dict(k="residual", v="identity", o="residual"), dict(q="identity", v="nonlinear", o="identity"),
])
def test_each_placement_matches_its_formula(placements, impl):
    from nlq.config import ProjectionsConfig

    cfg = tiny_model_config(projections=ProjectionsConfig(**placements), attn_impl=impl)
    attn = Attention(cfg).double()
    randomize_norms(attn)
    x = torch.randn(2, 7, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(attn(x), reference_full_attention(attn, x, cfg))


@pytest.mark.parametrize("query", ["linear", "nonlinear"])
def test_qk_norm_matches_reference(query):
    cfg = tiny_model_config(query=query, qk_norm=True)
    attn = Attention(cfg).double()
    randomize_norms(attn)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(attn(x), reference_full_attention(attn, x, cfg))


def test_rope_matches_complex_rotation():
    from nlq.model import rotary_tables

    cfg = tiny_model_config(position="rope", query="nonlinear")
    attn = Attention(cfg).double()
    T, hs = 7, cfg.head_size
    cos, sin = rotary_tables(hs, T, cfg.rope_theta)

    def rotate(t):  # pair i = (t[i], t[i + hs/2]) as a complex number times e^{i pos theta^(-2i/hs)}
        half = hs // 2
        z = torch.complex(t[..., :half], t[..., half:])
        pos = torch.arange(T, dtype=torch.float64)[:, None]
        freq = cfg.rope_theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
        z = z * torch.polar(torch.ones_like(pos * freq), pos * freq)
        return torch.cat([z.real, z.imag], dim=-1)

    x = torch.randn(2, T, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(attn(x, None, (cos.double(), sin.double())),
                               reference_full_attention(attn, x, cfg, rotary=rotate))


def test_rope_model_is_causal_and_has_no_position_embedding():
    model = Transformer(tiny_model_config(position="rope"))
    assert not hasattr(model, "pos_emb") and model.parameter_groups()["position embedding"] == 0
    idx = torch.randint(0, 97, (1, 10))
    changed = idx.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % 97
    model.eval()
    torch.testing.assert_close(model(idx)[0][:, :6], model(changed)[0][:, :6])
    shifted = torch.roll(idx, 1, dims=1)
    assert not torch.allclose(model(idx)[0][:, 5], model(shifted)[0][:, 6])  # position matters


def test_gqa_matches_reference_and_mha_with_repeated_kv_heads():
    cfg = tiny_model_config(n_head=4, n_kv_head=2)
    attn = Attention(cfg).double()
    assert attn.kv_proj.weight.shape == (2 * 2 * cfg.head_size, cfg.n_embd)
    x = torch.randn(2, 7, cfg.n_embd, dtype=torch.float64)
    torch.testing.assert_close(attn(x), reference_full_attention(attn, x, cfg))
    mha = Attention(tiny_model_config(n_head=4)).double()
    hs = cfg.head_size
    k_w, v_w = attn.kv_proj.weight.split(2 * hs)
    with torch.no_grad():
        mha.q_proj.load_state_dict(attn.q_proj.state_dict())
        mha.o_proj.load_state_dict(attn.o_proj.state_dict())
        repeat = lambda w: w.view(2, hs, -1).repeat_interleave(2, dim=0).reshape(4 * hs, -1)  # noqa: E731
        mha.kv_proj.weight.copy_(torch.cat([repeat(k_w), repeat(v_w)]))
    torch.testing.assert_close(attn(x), mha(x))


def test_gpt3_small_nonlinear_q_and_k_parameter_count():
    from nlq.overrides import apply_overrides
    from nlq.presets import get_preset

    config = apply_overrides(get_preset("gpt3-small"), ["--model.query=nonlinear", "--model.projections.k=nonlinear"])
    with torch.device("meta"):
        model = Transformer(config.model)
    assert model.num_parameters() == 84_990_720
    config = apply_overrides(get_preset("gpt3-small"),
                             ["--model.projections.v=nonlinear", "--model.projections.o=nonlinear"])
    with torch.device("meta"):
        assert Transformer(config.model).num_parameters() == 84_953_856 + 2 * 12 * 2 * 768


@pytest.mark.parametrize("overrides,needle", [
    (["--model.n_kv_head=5"], "model.n_kv_head=5 must divide model.n_head=12"),
    (["--model.n_kv_head=4", "--model.projections.k=nonlinear"], "needs linear key and value projections"),
    (["--model.projections.v=cubic"], "model.projections.v='cubic'"),
    (["--model.position=alibi"], "model.position='alibi'"),
    (["--train.objective=mlm"], "needs a bidirectional encoder"),
])
def test_bad_beyond_the_paper_configs(overrides, needle):
    from nlq.errors import ConfigError
    from nlq.overrides import apply_overrides
    from nlq.presets import get_preset

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        apply_overrides(get_preset("gpt3-small"), overrides)


# ---- the fused input matmul (one X [W_q | W_k | W_v]) and the standalone module ---------------------------

FUSION_CASES = [dict(q=mode) for mode in PROJECTIONS] + [
    dict(q="nonlinear", k="nonlinear"), dict(q="identity", v="nonlinear"), dict(k="residual", v="identity"),
    dict(q="nonlinear", k="identity", v="residual", o="nonlinear"),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("placements", FUSION_CASES)
def test_fused_and_unfused_input_projections_agree(placements, bias):
    from nlq.config import ProjectionsConfig

    cfg = tiny_model_config(projections=ProjectionsConfig(**placements), bias=bias)
    attn = Attention(cfg).double()
    randomize_norms(attn)
    x = torch.randn(2, 7, cfg.n_embd, dtype=torch.float64, requires_grad=True)
    assert attn.fused_input
    fused = attn(x)
    fused_grads = torch.autograd.grad(fused.square().sum(), [x, *attn.parameters()])
    attn.fused_input = False
    unfused = attn(x)
    unfused_grads = torch.autograd.grad(unfused.square().sum(), [x, *attn.parameters()])
    torch.testing.assert_close(fused, unfused, rtol=1e-12, atol=1e-12)
    for a, b in zip(fused_grads, unfused_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if not bias:  # the hand-written reference has no biases
        torch.testing.assert_close(fused, reference_full_attention(attn, x, cfg))


def test_fused_gqa_and_qk_norm_agree_with_unfused():
    cfg = tiny_model_config(query="nonlinear", n_kv_head=2, qk_norm=True)
    attn = Attention(cfg).double()
    randomize_norms(attn)
    x = torch.randn(2, 7, cfg.n_embd, dtype=torch.float64)
    fused = attn(x)
    attn.fused_input = False
    torch.testing.assert_close(fused, attn(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("query", ["linear", "nonlinear"])
def test_checkpoint_written_by_nlq_0_1_still_loads(query):
    """tests/data holds a real checkpoint trained 3 steps by nlq 0.1 (commit a86a226, separate q and kv
    matmuls) and the logits it gave; today's model loads it by the same names and computes the same logits."""
    from pathlib import Path

    from nlq.runs.rundir import load_model

    data = Path(__file__).parent / "data"
    model, config, payload = load_model(data / f"nlq0.1_{query}_step3.pt")
    assert payload["step"] == 3 and config.model.query == query
    expected = torch.load(data / f"nlq0.1_{query}_logits.pt", weights_only=True)
    torch.testing.assert_close(model(expected["input"])[0], expected["logits"], rtol=1e-5, atol=1e-5)


def test_standalone_nonlinear_query_computes_the_formula():
    from nlq import NonlinearQuery

    q = NonlinearQuery(24, rank=10, activation="silu", bias=True).double()
    randomize_norms(q)
    x = torch.randn(3, 5, 24, dtype=torch.float64)
    h = F.silu(rms_norm(x, q.in_norm_weight, 1e-5) @ q.up.weight.T + q.up.bias)
    f = layer_norm(h @ q.down.weight.T + q.down.bias, q.out_norm.weight, 1e-5)
    torch.testing.assert_close(q(x), (x + f) / 2)  # the formula, 1/2 included
    folded = NonlinearQuery(24, rank=10, activation="silu", bias=True, fold_half=True).double()
    folded.load_state_dict(q.state_dict())
    assert folded.output_scale == 0.5 and q.output_scale == 1.0
    torch.testing.assert_close(folded(x) * folded.output_scale, q(x))
    assert sum(p.numel() for p in NonlinearQuery(64).parameters()) == 64 * 64 + 2 * 64  # d^2 + two norm gains


@pytest.mark.parametrize("kwargs,needle", [(dict(dim=8, rank=0), "rank >= 1"),
                                           (dict(dim=8, activation="tanh"), "valid: gelu")])
def test_standalone_nonlinear_query_rejects_bad_arguments(kwargs, needle):
    from nlq import NonlinearQuery

    with pytest.raises(ValueError, match=needle):
        NonlinearQuery(**kwargs)


def test_nlq_model_uses_the_standalone_class():
    from nlq import NonlinearQuery

    model = Transformer(tiny_model_config(query="nonlinear"))
    assert all(type(b.attn.q_proj) is NonlinearQuery and b.attn.q_proj.fold_half for b in model.blocks)

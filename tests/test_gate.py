"""The attention output gate (model.attn_gate): Y * sigmoid(X W_g) between attention and W_O, against a hand-written
reference, transformers' own Qwen3-Next attention, exact parameter counts, causality, the KV cache, pairing, export
and import round trips."""

import math

import pytest
import torch

from helpers import tiny_model_config, tiny_run_config, written_out_qkv
from nlq.components import KVCache
from nlq.config import ModelConfig
from nlq.errors import ConfigError
from nlq.model import Transformer, rotary_tables

GATES = ["elementwise", "headwise"]


def reference_gated_attention(attn, x, rotary=None):
    """softmax(q k^T / sqrt(hs)) v per head, times sigmoid(x W_g), then W_O, written out from the weights alone
    (linear query, fused K/V, QK-norm or not)."""
    B, T, C = x.shape
    nh, hs = attn.n_head, attn.head_size
    q, k, v = written_out_qkv(attn, x, rotary)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2)  # (B, T, nh, hs)
    gate = torch.sigmoid(x @ attn.gate_proj.weight.T).view(B, T, nh, -1)  # (B, T, nh, hs or 1)
    return (y * gate).reshape(B, T, C) @ attn.o_proj.weight.T


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("changes", [dict(), dict(qk_norm=True), dict(qk_norm=True, position="rope", n_kv_head=2)],
                         ids=["plain", "qk-norm", "qk-norm, rope, gqa"])
def test_gated_attention_equals_the_written_out_formula(gate, changes):
    cfg = tiny_model_config(attn_gate=gate, **changes)
    model = Transformer(cfg, seed=0)
    attn = model.blocks[0].attn
    x = torch.randn(2, 16, cfg.n_embd)
    rotary = rotary_tables(cfg.head_size, 16, cfg.rope_theta) if cfg.position == "rope" else None
    expected = reference_gated_attention(attn, x, rotary)
    torch.testing.assert_close(attn(x, rotary=rotary), expected, rtol=1e-5, atol=1e-6)
    attn.fused_input = False  # one matmul per projection gives the same numbers
    torch.testing.assert_close(attn(x, rotary=rotary), expected, rtol=1e-5, atol=1e-6)
    attn.impl = "math"
    torch.testing.assert_close(attn(x, rotary=rotary), expected, rtol=1e-5, atol=1e-6)


def test_the_gate_changes_the_output_and_a_zero_gate_halves_it():
    """W_g = 0 gives sigmoid(0) = 1/2 on every element: exactly half the ungated attention's output."""
    plain = Transformer(tiny_model_config(), seed=3).blocks[0].attn
    gated = Transformer(tiny_model_config(attn_gate="elementwise"), seed=3).blocks[0].attn
    x = torch.randn(2, 16, 32)
    assert not torch.allclose(gated(x), plain(x) / 2, atol=1e-4)
    with torch.no_grad():
        gated.gate_proj.weight.zero_()
    torch.testing.assert_close(gated(x), plain(x) / 2, rtol=1e-6, atol=1e-7)


# ---- parameters: exact counts, and the pairing of weights with the ungated model -----------------------------------

@pytest.mark.parametrize("gate, per_layer", [("none", 0), ("elementwise", 64 * 64), ("headwise", 64 * 4)])
def test_the_gate_adds_exactly_its_weights(gate, per_layer):
    """At the verdict shape (d 64, 4 heads, 2 layers): linear has 98,624 non-embedding parameters; the elementwise gate
    adds d^2 per layer (8,192 = 8.3%), the headwise one d x n_head (512)."""
    cfg = ModelConfig(vocab_size=2048, block_size=128, n_layer=2, n_head=4, n_embd=64, attn_gate=gate)
    model = Transformer(cfg)
    assert model.num_parameters() == 98_624 + 2 * per_layer
    assert model.parameter_groups()["attention gate"] == 2 * per_layer
    assert cfg.approx_parameters() - ModelConfig(**{**cfg.__dict__, "attn_gate": "none"}).approx_parameters() \
        == 2 * per_layer


def test_the_parameter_matched_controls_have_the_gates_count():
    """mlp_ratio 4.5 adds 2 x d x d/2 per layer, the elementwise gate's d^2; the identity query with the gate has
    exactly linear's parameters (W_Q's d^2 spent on W_g)."""
    shape = dict(vocab_size=2048, block_size=128, n_layer=2, n_head=4, n_embd=64, qk_norm=True)
    count = {name: Transformer(ModelConfig(**shape, **changes)).num_parameters() for name, changes in {
        "linear": {}, "gate": dict(attn_gate="elementwise"), "mlp4.5": dict(mlp_ratio=4.5),
        "identity-gate": dict(query="identity", attn_gate="elementwise")}.items()}
    assert count["gate"] == count["mlp4.5"] == count["linear"] + 8_192
    assert count["identity-gate"] == count["linear"]


def test_a_gated_model_shares_every_other_weight_with_the_ungated_one():
    """Weights are seeded by name: the gate's W_g is new, everything else starts as in the baseline (pairing)."""
    a = Transformer(tiny_model_config(qk_norm=True), seed=7).state_dict()
    b = Transformer(tiny_model_config(qk_norm=True, attn_gate="elementwise"), seed=7).state_dict()
    assert sorted(set(b) - set(a)) == ["blocks.0.attn.gate_proj.weight", "blocks.1.attn.gate_proj.weight"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    std = b["blocks.0.attn.gate_proj.weight"].std().item()
    assert 0.015 < std < 0.025  # N(0, 0.02), the default of every linear layer here (and Qwen3-Next's init range)


def test_a_bad_gate_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="model.attn_gate='sigmoid' is not valid; choose one of none, elementwise"):
        tiny_model_config(attn_gate="sigmoid")


# ---- every model it goes into -------------------------------------------------------------------------------------

MODELS = {
    "linear": dict(),
    "nonlinear, qk-norm": dict(query="nonlinear", qk_norm=True),
    "identity, rope, gqa": dict(query="identity", position="rope", n_kv_head=2),
    "residual, math attention": dict(query="residual", attn_impl="math"),
}


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("changes", MODELS.values(), ids=MODELS.keys())
def test_a_gated_decoder_is_causal_and_an_encoder_is_not(gate, changes):
    idx = torch.randint(0, 97, (2, 16))
    later = idx.clone()
    later[:, 10] = (later[:, 10] + 1) % 97
    decoder = Transformer(tiny_model_config(attn_gate=gate, **changes), seed=1).eval()
    encoder = Transformer(tiny_model_config(attn_gate=gate, causal=False, **changes), seed=1).eval()
    with torch.no_grad():
        torch.testing.assert_close(decoder(later)[0][:, :10], decoder(idx)[0][:, :10])
        assert not torch.allclose(decoder(later)[0][:, 10:], decoder(idx)[0][:, 10:])
        assert not torch.allclose(encoder(later)[0][:, :10], encoder(idx)[0][:, :10])


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("changes", MODELS.values(), ids=MODELS.keys())
def test_a_gated_model_with_a_kv_cache_gives_the_logits_of_the_whole_sequence(gate, changes):
    model = Transformer(tiny_model_config(attn_gate=gate, **changes), seed=2).eval()
    idx = torch.randint(0, 97, (2, 16))
    cache, pieces, start = KVCache(len(model.blocks)), [], 0
    with torch.no_grad():
        for n in (5, 1, 4, 6):
            pieces.append(model(idx[:, start:start + n], cache=cache)[0])
            start += n
        torch.testing.assert_close(torch.cat(pieces, dim=1), model(idx)[0], rtol=1e-5, atol=1e-5)


def test_a_gated_run_trains_resumes_exactly_and_round_trips_through_import(byte_data, tmp_path):
    """Its loss falls; a resumed run ends bitwise where a straight one does; import-checkpoint gives the same logits."""
    from nlq.interop.load import import_run
    from nlq.runs.metrics import read_metrics
    from nlq.runs.rundir import load_model
    from nlq.training.trainer import train

    model = tiny_model_config(vocab_size=257, block_size=32, n_head=2, attn_gate="elementwise", qk_norm=True)
    train(tiny_run_config(byte_data, model=model, max_steps=12, lr=1e-2, min_lr=1e-3), tmp_path / "straight",
          quiet=True)
    losses = [r["train_loss"] for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if "train_loss" in r]
    assert losses[-1] < losses[0] - 0.3
    train(tiny_run_config(byte_data, model=model, max_steps=6, lr=1e-2, min_lr=1e-3, decay_steps=12,
                          checkpoint_every=6), tmp_path / "first", quiet=True)
    train(tiny_run_config(byte_data, model=model, max_steps=12, lr=1e-2, min_lr=1e-3,
                          resume_from=str(tmp_path / "first" / "checkpoints" / "step_0000006.pt")),
          tmp_path / "resumed", quiet=True)
    straight, _, _ = load_model(tmp_path / "straight")
    resumed, _, _ = load_model(tmp_path / "resumed")
    assert all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()))
    import_run(tmp_path / "straight", tmp_path / "imported")
    imported, config, _ = load_model(tmp_path / "imported")
    assert config.model.attn_gate == "elementwise"
    ids = torch.randint(0, 257, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(imported(ids)[0], straight(ids)[0], rtol=0, atol=0)


@pytest.mark.parametrize("gate", GATES)
def test_a_gated_run_exports_to_transformers_with_the_same_logits(byte_data, tmp_path, gate):
    transformers = pytest.importorskip("transformers")
    from nlq.interop.export import export_hf
    from nlq.runs.rundir import load_model
    from nlq.training.trainer import train

    model = tiny_model_config(vocab_size=257, block_size=32, n_head=2, attn_gate=gate, qk_norm=True, position="rope")
    train(tiny_run_config(byte_data, model=model, max_steps=3, eval_every=3), tmp_path / "run", quiet=True)
    assert "NlqForCausalLM" in export_hf(tmp_path / "run", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    nlq_model, _, _ = load_model(tmp_path / "run")
    ids = torch.randint(0, 257, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, nlq_model(ids)[0], rtol=1e-5, atol=1e-5)


def test_nlq_info_prints_the_gates_count(capsys):
    from nlq.cli import main

    main(["info", "gpt3-small", "--model.attn_gate=elementwise"])
    out = capsys.readouterr().out
    assert "attn_gate=elementwise" in out
    row = next(line for line in out.splitlines() if line.startswith("attention gate"))
    assert int(row.split()[-1].replace(",", "")) == 12 * 768 * 768
    assert f"non-embedding parameters: {84_953_856 + 12 * 768 * 768:,}" in out


# ---- the outside reference: transformers' own Qwen3-Next attention -------------------------------------------------

def _qwen3_next_attention():
    try:
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention
    except ImportError:
        import transformers

        pytest.skip(f"transformers {transformers.__version__} has no Qwen3-Next; it needs transformers >= 4.57")
    return Qwen3NextConfig, Qwen3NextAttention


@pytest.mark.parametrize("rope", [False, True], ids=["no rope", "rope"])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_gated_attention_with_qk_norm_equals_qwen3_next_full_attention(rope, kv_heads):
    """The mapping: Qwen3-Next's q_proj (d -> 2 d) holds, per head, the head's query rows then its gate rows; its
    q_norm/k_norm compute x / rms(x) * (1 + w), nlq's RMSNorm x / rms(x) * w', so w' = 1 + w; k_proj and v_proj
    are nlq's kv_proj halves; the scale 1/sqrt(hs) and (with rope) the full-width NeoX rotation are the same. Without
    rope, Qwen3-Next is given the identity rotation (cos 1, sin 0). Tolerance 1e-5 (fp32, the same operations)."""
    Qwen3NextConfig, Qwen3NextAttention = _qwen3_next_attention()
    d, nh, hs, T = 64, 4, 16, 12
    cfg = ModelConfig(vocab_size=97, block_size=T, n_layer=1, n_head=nh, n_embd=d, qk_norm=True, n_kv_head=kv_heads,
                      attn_gate="elementwise", norm_eps=1e-6, position="rope" if rope else "learned")
    ours = Transformer(cfg, seed=0).blocks[0].attn.eval()
    with torch.no_grad():  # norm weights away from 1, so a wrong mapping of them shows
        ours.q_norm.weight.uniform_(0.5, 1.5)
        ours.k_norm.weight.uniform_(0.5, 1.5)
    hf_config = Qwen3NextConfig(hidden_size=d, num_attention_heads=nh, num_key_value_heads=kv_heads, head_dim=hs,
                                rms_norm_eps=1e-6, attention_bias=False, partial_rotary_factor=1.0)
    hf_config._attn_implementation = "eager"
    theirs = Qwen3NextAttention(hf_config, layer_idx=0).eval()
    q_rows = ours.q_proj.weight_proj.weight.view(nh, hs, d)
    gate_rows = ours.gate_proj.weight.view(nh, hs, d)
    k, v = ours.kv_proj.weight.split(kv_heads * hs)
    with torch.no_grad():
        theirs.q_proj.weight.copy_(torch.cat([q_rows, gate_rows], dim=1).reshape(2 * d, d))
        theirs.k_proj.weight.copy_(k)
        theirs.v_proj.weight.copy_(v)
        theirs.o_proj.weight.copy_(ours.o_proj.weight)
        theirs.q_norm.weight.copy_(ours.q_norm.weight - 1)
        theirs.k_norm.weight.copy_(ours.k_norm.weight - 1)
    x = torch.randn(2, T, d)
    if rope:
        cos, sin = rotary_tables(hs, T, cfg.rope_theta)
        ours_out = ours(x, rotary=(cos, sin))
        position = tuple(torch.cat([t, t], -1)[None].expand(2, -1, -1) for t in (cos, sin))
    else:
        ours_out = ours(x)
        position = (torch.ones(2, T, hs), torch.zeros(2, T, hs))
    causal = torch.zeros(T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    with torch.no_grad():
        theirs_out, _ = theirs(x, position_embeddings=position, attention_mask=causal[None, None].expand(2, 1, T, T))
    torch.testing.assert_close(ours_out, theirs_out, rtol=1e-5, atol=1e-5)

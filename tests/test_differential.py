"""Differential attention (model.attention=differential, Ye et al. 2025) and its norm control (model.attn_out_norm):
against the formula written out in float64, transformers' own DiffLlamaAttention, exact parameter counts, causality,
the KV cache, pairing of initial weights, and the export round trip."""

import math

import pytest
import torch

from helpers import tiny_model_config, written_out_qkv
from nlq.components import KVCache, lambda_init
from nlq.config import ModelConfig
from nlq.errors import ConfigError
from nlq.model import Transformer, rotary_tables


def reference_differential(attn, x, layer, rotary=None):
    """The paper's formula from the weights alone: head j (j < nh/2) is the pair (j, j + nh/2):
    (softmax(Q1 K1^T / sqrt(hs)) - lambda softmax(Q2 K2^T / sqrt(hs))) [V_j | V_(j + nh/2)], lambda = exp(lq1 . lk1) -
    exp(lq2 . lk2) + lambda_init, each head RMS-normalised over its 2 hs, times (1 - lambda_init), then W_O."""
    B, T, C = x.shape
    nh, hs = attn.n_head, attn.head_size
    q, k, v = written_out_qkv(attn, x, rotary)
    mask = ~torch.ones(T, T, dtype=torch.bool).tril()

    def softmax(i):
        return ((q[:, i] @ k[:, i].transpose(-2, -1)) / math.sqrt(hs)).masked_fill(mask, float("-inf")).softmax(-1)
    lam = attn.lambdas
    lam = (torch.exp((lam.lambda_q1 * lam.lambda_k1).sum()) - torch.exp((lam.lambda_q2 * lam.lambda_k2).sum())
           + (0.8 - 0.6 * math.exp(-0.3 * layer))).to(x.dtype)
    heads = []
    for j in range(nh // 2):
        value = torch.cat([v[:, j], v[:, j + nh // 2]], dim=-1)  # (B, T, 2 hs)
        y = (softmax(j) - lam * softmax(j + nh // 2)) @ value
        y = y / torch.sqrt((y * y).mean(-1, keepdim=True) + attn.norm_eps)
        heads.append((1 - lambda_init(layer)) * y)
    return torch.cat(heads, dim=-1) @ attn.o_proj.weight.T


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("changes", [dict(), dict(position="rope", n_kv_head=2), dict(qk_norm=True)],
                         ids=["mha", "rope, gqa", "qk-norm"])
def test_differential_attention_equals_the_formula_written_out_in_float64(layer, changes):
    cfg = tiny_model_config(attention="differential", **changes)
    attn = Transformer(cfg, seed=0).blocks[layer].attn.double()
    x = torch.randn(2, 16, cfg.n_embd, dtype=torch.float64)
    rotary = rotary_tables(cfg.head_size, 16, cfg.rope_theta) if cfg.position == "rope" else None
    expected = reference_differential(attn, x, layer, rotary)
    torch.testing.assert_close(attn(x, rotary=rotary), expected, rtol=1e-10, atol=1e-12)
    attn.impl = "math"
    torch.testing.assert_close(attn(x, rotary=rotary), expected, rtol=1e-10, atol=1e-12)


def test_lambda_init_follows_the_layer_and_the_lambdas_start_as_drawn():
    assert [round(lambda_init(i), 6) for i in range(3)] == [0.2, round(0.8 - 0.6 * math.exp(-0.3), 6),
                                                          round(0.8 - 0.6 * math.exp(-0.6), 6)]
    model = Transformer(tiny_model_config(attention="differential", n_layer=4, n_embd=256, n_head=4), seed=5)
    drawn = torch.cat([p for n, p in model.named_parameters() if "lambda_" in n])
    assert 0.08 < drawn.std().item() < 0.12 and abs(drawn.mean().item()) < 0.03  # N(0, 0.1), as DiffLlama
    again = Transformer(tiny_model_config(attention="differential", n_layer=4, n_embd=256, n_head=4), seed=5)
    assert torch.equal(drawn, torch.cat([p for n, p in again.named_parameters() if "lambda_" in n]))


def test_differential_shares_every_other_initial_weight_with_softmax_attention():
    plain = Transformer(tiny_model_config(), seed=7).state_dict()
    diff = Transformer(tiny_model_config(attention="differential"), seed=7).state_dict()
    assert sorted(set(diff) - set(plain)) == sorted(f"blocks.{i}.attn.lambdas.lambda_{w}" for i in range(2)
                                                    for w in ("q1", "k1", "q2", "k2"))
    assert all(torch.equal(plain[k], diff[k]) for k in plain)


@pytest.mark.parametrize("preset_shape, extra", [({"n_layer": 12, "n_head": 12, "n_embd": 768}, 12 * 4 * 64),
                                                 ({"n_layer": 2, "n_head": 4, "n_embd": 64}, 2 * 4 * 16)])
def test_differential_adds_exactly_its_lambda_vectors(preset_shape, extra):
    """At gpt3-small (12 x 768, 12 heads of 64: 84,953,856 non-embedding parameters with a linear query) and at the
    decision shape (2 x 64, 4 heads of 16: 98,624): four head-size vectors per layer."""
    base = {"vocab_size": 2048, "block_size": 128} | preset_shape
    linear = Transformer(ModelConfig(**base), seed=None)
    with torch.device("meta"):
        diff = Transformer(ModelConfig(**base, attention="differential"))
        norm = Transformer(ModelConfig(**base, attn_out_norm=True))
    assert diff.num_parameters() - linear.num_parameters() == extra
    assert norm.num_parameters() == linear.num_parameters()
    assert ModelConfig(**base, attention="differential").approx_parameters() - ModelConfig(
        **base).approx_parameters() == extra


def test_nlq_info_prints_the_exact_count_of_gpt3_small_with_differential_attention(capsys):
    from nlq.cli import main

    main(["info", "gpt3-small", "--model.attention=differential"])
    out = capsys.readouterr().out
    assert f"non-embedding parameters: {84_953_856 + 12 * 4 * 64:,}" in out
    row = next(line for line in out.splitlines() if line.startswith("differential lambda"))
    assert int(row.split()[-1].replace(",", "")) == 12 * 4 * 64


@pytest.mark.parametrize("changes, needle", [(dict(n_head=3, n_embd=30), "even n_head"),
                                             (dict(n_kv_head=1), "even n_head and n_kv_head"),
                                             (dict(attn_gate="elementwise"), "has its own output norm"),
                                             (dict(attn_out_norm=True), "has its own output norm")])
def test_a_differential_model_that_cannot_pair_its_heads_is_one_line(changes, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny_model_config(attention="differential", **changes)


def test_the_norm_control_is_softmax_attention_with_each_head_normalised_and_scaled():
    plain = Transformer(tiny_model_config(), seed=2).blocks[1].attn
    normed = Transformer(tiny_model_config(attn_out_norm=True), seed=2).blocks[1].attn
    x = torch.randn(2, 16, 32)
    captured = {}
    plain.o_proj.register_forward_hook(lambda m, args, out: captured.setdefault("y", args[0]))
    plain(x)
    y = captured["y"].view(2, 16, 4, 8)
    y = (1 - lambda_init(1)) * y / torch.sqrt((y * y).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(normed(x), y.reshape(2, 16, 32) @ normed.o_proj.weight.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_differential_attention_is_causal_in_a_decoder_and_runs_as_an_encoder(causal):
    model = Transformer(tiny_model_config(attention="differential", causal=causal), seed=0).eval()
    x = torch.randint(0, 97, (1, 16))
    y = x.clone()
    y[0, 10] = (y[0, 10] + 1) % 97
    a, b = model(x)[0], model(y)[0]
    assert torch.allclose(a[0, :10], b[0, :10]) == causal  # a later token moves earlier outputs only without a mask


def test_the_kv_cache_gives_the_logits_of_the_whole_sequence():
    model = Transformer(tiny_model_config(attention="differential", position="rope", n_kv_head=2), seed=1).eval()
    x = torch.randint(0, 97, (2, 12))
    full = model(x)[0]
    cache = KVCache(model.cfg.n_layer)
    steps = [model(x[:, :8], cache=cache)[0][:, -1]]
    steps += [model(x[:, i:i + 1], cache=cache)[0][:, -1] for i in range(8, 12)]
    torch.testing.assert_close(torch.stack(steps[1:], 1), full[:, 8:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(steps[0], full[:, 7], rtol=1e-5, atol=1e-5)


# ---- the outside reference: transformers' DiffLlamaAttention --------------------------------------------------------

def _diffllama():
    try:
        from transformers.models.diffllama.configuration_diffllama import DiffLlamaConfig
        from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention
    except ImportError:
        import transformers

        pytest.skip(f"transformers {transformers.__version__} has no DiffLlama; it needs transformers >= 4.48")
    return DiffLlamaConfig, DiffLlamaAttention


@pytest.mark.parametrize("layer", [0, 2])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_differential_attention_equals_diffllama_attention(kv_heads, layer):
    """The mapping, nlq -> DiffLlama: q_proj.weight_proj.weight -> q_proj.weight; kv_proj.weight's first n_kv_head x
    hs rows -> k_proj.weight, the rest -> v_proj.weight; o_proj -> o_proj; lambdas.lambda_q1 (k1, q2, k2) ->
    lambda_q1 (k1, q2, k2); DiffLlama's lambda_init(layer_idx) is nlq's for the same block index (from 0), its
    "groupnorm" an RMSNorm over 2 hs without weights, as nlq's (the paper's code gives that norm weights; DiffLlama and
    nlq do not). RoPE in both is the NeoX half-split rotation. Tolerance 1e-5, fp32."""
    DiffLlamaConfig, DiffLlamaAttention = _diffllama()
    d, nh, hs, T = 64, 4, 16, 12
    cfg = ModelConfig(vocab_size=97, block_size=T, n_layer=layer + 1, n_head=nh, n_embd=d, n_kv_head=kv_heads,
                      attention="differential", norm_eps=1e-6, position="rope")
    ours = Transformer(cfg, seed=0).blocks[layer].attn.eval()
    hf_config = DiffLlamaConfig(hidden_size=d, num_attention_heads=nh, num_key_value_heads=kv_heads, head_dim=hs,
                                rms_norm_eps=1e-6, attention_bias=False, rope_theta=cfg.rope_theta,
                                max_position_embeddings=T)
    hf_config._attn_implementation = "eager"
    theirs = DiffLlamaAttention(hf_config, layer_idx=layer).eval()
    k, v = ours.kv_proj.weight.split(kv_heads * hs)
    with torch.no_grad():
        theirs.q_proj.weight.copy_(ours.q_proj.weight_proj.weight)
        theirs.k_proj.weight.copy_(k)
        theirs.v_proj.weight.copy_(v)
        theirs.o_proj.weight.copy_(ours.o_proj.weight)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(theirs, name).copy_(getattr(ours.lambdas, name))
    assert theirs.lambda_init == pytest.approx(ours.lambda_init)
    x = torch.randn(2, T, d)
    cos, sin = rotary_tables(hs, T, cfg.rope_theta)
    position = tuple(torch.cat([t, t], -1)[None].expand(2, -1, -1) for t in (cos, sin))
    causal = torch.zeros(T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    with torch.no_grad():
        theirs_out, _ = theirs(x, position_embeddings=position, attention_mask=causal[None, None].expand(2, 1, T, T))
        ours_out = ours(x, rotary=(cos, sin))
    torch.testing.assert_close(ours_out, theirs_out, rtol=1e-5, atol=1e-5)


def test_a_differential_run_resumes_bitwise(byte_data, tmp_path):
    from helpers import tiny_run_config
    from nlq.training.trainer import train
    from test_training import losses

    model = tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32, attention="differential")
    straight = tiny_run_config(byte_data, model=model, max_steps=8, decay_steps=8, checkpoint_every=4)
    train(straight, tmp_path / "a", quiet=True)
    train(tiny_run_config(byte_data, model=model, max_steps=4, decay_steps=8), tmp_path / "b", quiet=True)
    train(straight, tmp_path / "b", resume=True, quiet=True)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")


def test_differential_flops_count_values_of_twice_the_width():
    """QK^T costs what softmax attention's does; the two maps each weigh values of twice the width: 18 L d T instead
    of 12 L d T (6 L d T more per token), the weights' 6N unchanged (the lambdas are vectors)."""
    base = dict(vocab_size=2048, block_size=128, n_layer=2, n_head=4, n_embd=64)
    plain, diff = Transformer(ModelConfig(**base)), Transformer(ModelConfig(**base, attention="differential"))
    assert diff.flops_per_token() - plain.flops_per_token() == 6 * 2 * 64 * 128

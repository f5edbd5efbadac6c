"""nlq outside nlq: the standalone module, HF export/import, the paper's checkpoints, retrofitting HF models.
Everything is built locally from tiny random configs; nothing is downloaded."""

import functools
import json
import math
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from helpers import one_line_error, tiny_model_config, tiny_run_config, train_small
from nlq.cli import main
from nlq.training.trainer import train

transformers = pytest.importorskip("transformers")


def trained_run(byte_data, tmp_path, name="run", **model_changes):
    model = tiny_model_config(**(dict(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32) | model_changes))
    config = tiny_run_config(byte_data, model=model, max_steps=3, eval_every=3,
                             objective="clm" if model.causal else "mlm")
    train(config, tmp_path / name, quiet=True)
    return tmp_path / name


def nlq_logits(run_dir, ids):
    from nlq.runs.rundir import load_model

    model, _, _ = load_model(run_dir)
    return model(ids)[0]


IDS = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 256, 3, 9]])


def test_linear_run_exports_as_plain_gpt2(byte_data, tmp_path):
    from nlq.cli import main

    run = trained_run(byte_data, tmp_path)
    main(["export", str(run), "--to", "hf", str(tmp_path / "hf")])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and "auto_map" not in config
    assert (tmp_path / "hf" / "model.safetensors").is_file() and not list((tmp_path / "hf").glob("*.py"))
    gpt2 = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    auto = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    expected = nlq_logits(run, IDS)
    with torch.no_grad():
        torch.testing.assert_close(gpt2(IDS).logits, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(auto(IDS).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes", [dict(query="nonlinear"), dict(query="identity"),
                                     dict(query="nonlinear", qk_norm=True, position="rope", n_kv_head=1),
                                     dict(attention="differential", position="rope"), dict(attn_out_norm=True)])
def test_other_variants_export_as_custom_code_with_the_same_logits(byte_data, tmp_path, changes):
    run = trained_run(byte_data, tmp_path, **changes)
    from nlq.interop.export import export_hf

    message = export_hf(run, tmp_path / "hf")
    assert "NlqForCausalLM" in message
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, nlq_logits(run, IDS), rtol=1e-5, atol=1e-5)
        out = model(IDS, labels=IDS)
    assert out.loss is not None and math.isfinite(out.loss.item())
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()  # tied


def test_encoder_exports_as_masked_lm(byte_data, tmp_path):
    run = trained_run(byte_data, tmp_path, vocab_size=258, causal=False, query="nonlinear")
    from nlq.interop.export import export_hf

    export_hf(run, tmp_path / "hf")
    model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.mask_token_id == 257  # nlq's mask id: the data's vocabulary size
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, nlq_logits(run, IDS), rtol=1e-5, atol=1e-5)


def test_exported_tokenizer_encodes_like_nlq(byte_data, tmp_path):
    """byte here; bpe below: the exported tokenizer.json gives nlq's ids and decodes back."""
    from nlq.data.tokenizers import load_tokenizer
    from nlq.interop.export import export_hf

    run = trained_run(byte_data, tmp_path)
    export_hf(run, tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    nlq = load_tokenizer(run, "byte")
    for text in ["Shall I compare thee", "  naïve café — ünïcödé\n\ttabs", "x = {'a': [1, 2]}  # ok"]:
        assert hf.encode(text, add_special_tokens=False) == nlq.encode_batch([text])[0].tolist()
        assert hf.decode(hf.encode(text, add_special_tokens=False)) == text
    assert hf.eos_token_id == 256 == nlq.eot_id


def test_exported_bpe_tokenizer_encodes_like_nlq(tmp_path):
    from nlq.data.shards import prepare
    from nlq.data.tokenizers import load_tokenizer
    from nlq.interop.export import write_tokenizer

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"{i}.txt").write_text(f"def function_{i}(x):\n    return x * {i} + 'naïve'\n" * 4)
    prepare(str(docs), "bpe:300", tmp_path / "data", log=lambda *_: None, val_fraction=0.2)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("tokenizer.json",):
        (run / name).write_bytes((tmp_path / "data" / name).read_bytes())
    (run / "data_meta.json").write_text((tmp_path / "data" / "meta.json").read_text())
    write_tokenizer(run / "checkpoints" / "step_0000001.pt", tmp_path / "hf")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    nlq = load_tokenizer(tmp_path / "data", "bpe:300")
    text = "def function_7(y):\n    return y * 7 + 'naïve'  # new text"
    assert hf.encode(text, add_special_tokens=False) == nlq.encode_batch([text])[0].tolist()


def tiny_gpt2(tmp_path):
    config = transformers.GPT2Config(vocab_size=257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(3)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # random biases and norms, so a forgotten one would show
        for name, p in model.named_parameters():
            if "bias" in name or "ln_" in name:
                p.uniform_(-0.5, 0.5) if "bias" in name else p.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / "gpt2")
    return model


def test_hf_gpt2_imports_with_the_same_logits(tmp_path):
    from nlq.config import ModelConfig
    from nlq.interop.load import hf_gpt2
    from nlq.model import Transformer

    hf = tiny_gpt2(tmp_path)
    fields, state = hf_gpt2(tmp_path / "gpt2")
    assert fields["mlp_activation"] == "gelu_tanh" and fields["bias"] is True
    model = Transformer(ModelConfig(**fields)).eval()
    model.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS)[0], hf(IDS).logits, rtol=1e-5, atol=1e-5)


def test_training_starts_from_hf_gpt2_and_converts_its_query(byte_data, tmp_path):
    """--train.init_from=GPT2_DIR: the shape comes from the checkpoint; with --model.query=nonlinear the
    trained W_Q is dropped and the nonlinear query starts fresh, everything else is GPT-2's."""
    from nlq.cli import main
    from nlq.interop.load import hf_gpt2
    from nlq.runs.checkpoint import load_checkpoint

    tiny_gpt2(tmp_path)
    main(["train", "--data", str(byte_data), "--out", str(tmp_path / "run"), "--preset", "nano",
          f"--train.init_from={tmp_path / 'gpt2'}", "--model.query=nonlinear", "--train.max_steps=2",
          "--train.lr=1e-9", "--train.min_lr=0", "--train.batch_size=2", "--data.eval_windows=2",
          "--train.eval_every=2"])
    config = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert (config["n_embd"], config["bias"], config["mlp_activation"], config["query"]) == (32, True, "gelu_tanh",
                                                                                             "nonlinear")
    state = load_checkpoint(tmp_path / "run")["model"]
    _, source = hf_gpt2(tmp_path / "gpt2")
    torch.testing.assert_close(state["blocks.1.attn.kv_proj.weight"], source["blocks.1.attn.kv_proj.weight"],
                               rtol=1e-5, atol=1e-6)
    assert "blocks.0.attn.q_proj.up.weight" in state and "blocks.0.attn.q_proj.weight_proj.weight" not in state


# ---- the paper's checkpoints -----------------------------------------------------------------------------------------

def paper_checkpoint(mode, d=16, heads=2, layers=2, vocab=50, block=8, hidden=40, scale=None, bias=False,
                     with_scale=True):
    """A dict in the paper's nanoGPT format (the key names and shapes of its model.py: LayerNorm and Linear
    biases named .bias when bias=True), random values including norm gains and biases. with_scale=False leaves
    `scale` out of model_args, as a checkpoint relying on the paper's GPTConfig default."""
    g = torch.Generator().manual_seed(7)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # noqa: E731
    t = "_orig_mod.transformer."
    state = {t + "wte.weight": rnd(vocab, d), t + "wpe.weight": rnd(block, d), t + "ln_f.weight": 1 + rnd(d)}
    qkv = (3 if mode in ("original", "residual") else 2) * d
    for i in range(layers):
        h = f"{t}h.{i}."
        state |= {h + "ln_1.weight": 1 + rnd(d), h + "ln_2.weight": 1 + rnd(d),
                  h + "attn.c_attn.weight": rnd(qkv, d),
                  h + "attn.c_proj.weight": rnd(d, d), h + "mlp.c_fc.weight": rnd(hidden, d),
                  h + "mlp.c_proj.weight": rnd(d, hidden)}
        if bias:
            state |= {h + "ln_1.bias": rnd(d), h + "ln_2.bias": rnd(d), h + "attn.c_attn.bias": rnd(qkv),
                      h + "attn.c_proj.bias": rnd(d), h + "mlp.c_fc.bias": rnd(hidden), h + "mlp.c_proj.bias": rnd(d)}
        if mode == "residual_gelu":
            state |= {h + "attn.residual_rmsnorm_input.weight": 1 + rnd(d),
                      h + "attn.residual_in.weight": rnd(d // 2, d),
                      h + "attn.residual_out.weight": rnd(d, d // 2),
                      h + "attn.residual_layernorm_output.weight": 1 + rnd(d)}
    if bias:
        state[t + "ln_f.bias"] = rnd(d)
    state["_orig_mod.lm_head.weight"] = state[t + "wte.weight"]
    scale = scale or (1 / (2 * math.sqrt(d // heads)) if mode != "original" else 1 / math.sqrt(d // heads))
    args = dict(n_layer=layers, num_heads=heads, n_embd=d, block_size=block, vocab_size=vocab, bias=bias,
                tie_weights=True, head_size=d // heads, scale=scale, query_mode=mode, mlp_hidden_size=hidden,
                dropout=0.0)
    if not with_scale:
        del args["scale"]
    return {"model": state, "model_args": args, "iter_num": 1234, "config": {"learning_rate": 6e-4}}


def paper_forward(ckpt, idx):
    """The paper's model, written out from its formulas (docs/METHOD.md, section 2), on the raw tensors; a missing
    `scale` is its GPTConfig default, the constant sqrt(1/64)."""
    s = {k.removeprefix("_orig_mod.transformer.").removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    a = ckpt["model_args"]
    d, nh, mode = a["n_embd"], a["num_heads"], a["query_mode"]
    scale = a.get("scale", math.sqrt(1 / 64))
    ln = lambda x, w, b=None: F.layer_norm(x, (d,), w, b, 1e-5)  # noqa: E731
    T = idx.shape[1]
    x = s["wte.weight"][idx] + s["wpe.weight"][:T]
    for i in range(a["n_layer"]):
        p = lambda n: s.get(f"h.{i}.{n}")  # noqa: E731
        lin = lambda x, n: x @ p(f"{n}.weight").T + (p(f"{n}.bias") if p(f"{n}.bias") is not None else 0)  # noqa: E731
        h = ln(x, p("ln_1.weight"), p("ln_1.bias"))
        proj = lin(h, "attn.c_attn")
        if mode in ("original", "residual"):
            q, k, v = proj.split(d, dim=-1)
            q = q if mode == "original" else h + q
        else:
            k, v = proj.split(d, dim=-1)
            if mode == "identity":
                q = h
            else:
                r = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * p("attn.residual_rmsnorm_input.weight")
                f = ln(F.gelu(r @ p("attn.residual_in.weight").T) @ p("attn.residual_out.weight").T,
                       p("attn.residual_layernorm_output.weight"))
                q = h + f
        heads = []
        for j in range(nh):
            sl = slice(j * d // nh, (j + 1) * d // nh)
            scores = (q[..., sl] @ k[..., sl].transpose(-1, -2)) * scale
            scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            heads.append(scores.softmax(-1) @ v[..., sl])
        x = x + lin(torch.cat(heads, -1), "attn.c_proj")
        x = x + lin(F.gelu(lin(ln(x, p("ln_2.weight"), p("ln_2.bias")), "mlp.c_fc")), "mlp.c_proj")
    return ln(x, s["ln_f.weight"], s.get("ln_f.bias")) @ s["lm_head.weight"].T


@pytest.mark.parametrize("mode", ["original", "identity", "residual", "residual_gelu"])
def test_paper_checkpoint_of_each_mode_computes_its_formula(mode, tmp_path):
    from nlq.cli import main
    from nlq.runs.rundir import load_model

    ckpt = paper_checkpoint(mode)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    main(["import-checkpoint", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run")])
    model, config, payload = load_model(tmp_path / "run")
    assert payload["step"] == 1234
    assert config.model.query == {"original": "linear", "identity": "identity", "residual": "residual",
                                  "residual_gelu": "nonlinear"}[mode]
    idx = torch.tensor([[1, 5, 9, 2, 44, 7, 0, 3]])
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], paper_forward(ckpt, idx), rtol=1e-5, atol=1e-5)
    from nlq.interop.export import export_hf  # and it goes on to transformers

    export_hf(tmp_path / "run", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, paper_forward(ckpt, idx), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_scale", [True, False])
@pytest.mark.parametrize("mode", ["original", "identity", "residual", "residual_gelu"])
def test_paper_checkpoints_with_and_without_bias_and_scale_compute_the_formula(mode, bias, with_scale, tmp_path):
    """Every mode, bias=True and False, with and without `scale` in model_args (the paper's default then, 0.125 at
    any head size); residual_gelu with bias has a LayerNorm bias nlq's query does not have: refused in one line."""
    from nlq.errors import UserError
    from nlq.interop.load import import_run
    from nlq.runs.rundir import load_model

    ckpt = paper_checkpoint(mode, d=16, heads=2, bias=bias, with_scale=with_scale)  # head size 8: 0.125 != 8 ** -0.5
    torch.save(ckpt, tmp_path / "ckpt.pt")
    if mode == "residual_gelu" and bias:
        with pytest.raises(UserError, match="not supported"):
            import_run(tmp_path / "ckpt.pt", tmp_path / "run")
        assert not (tmp_path / "run").exists()
        return
    import_run(tmp_path / "ckpt.pt", tmp_path / "run")
    model, config, _ = load_model(tmp_path / "run")
    idx = torch.tensor([[1, 5, 9, 2, 44, 7, 0, 3]])
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], paper_forward(ckpt, idx), rtol=1e-5, atol=1e-5)
    if not with_scale:
        assert config.model.attn_scale == 0.125


def test_paper_checkpoints_dropout_is_carried_into_the_run(tmp_path):
    from nlq.interop.load import import_run
    from nlq.overrides import load_config

    ckpt = paper_checkpoint("residual_gelu")
    ckpt["model_args"]["dropout"] = 0.1
    torch.save(ckpt, tmp_path / "ckpt.pt")
    import_run(tmp_path / "ckpt.pt", tmp_path / "run")
    assert load_config(tmp_path / "run" / "config.json").model.dropout == 0.1


def test_weights_that_do_not_fit_their_mode_are_one_line(tmp_path, capsys):
    from nlq.cli import main

    ckpt = paper_checkpoint("identity")  # c_attn of 2 d rows: identity-shaped
    ckpt["model_args"]["query_mode"] = "original"
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit) as info:
        main(["import-checkpoint", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and "q_proj" in err and "do not fit" in err, err
    assert not (tmp_path / "run").exists()


def test_imported_run_cannot_be_resumed_but_can_start_a_run(byte_data, tmp_path):
    from nlq.cli import main
    from nlq.interop.load import import_run

    tiny_gpt2(tmp_path)
    import_run(tmp_path / "gpt2", tmp_path / "imported")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(tmp_path / "imported"), "--resume", "--data", str(byte_data)])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_untrusted_checkpoint_never_runs_code(tmp_path):
    """A pickle that would run code on load is refused (weights_only), with a one-line error."""
    import pickle

    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(tmp_path / "ckpt.pt", "wb") as f:
        pickle.dump({"model": Exploit(), "model_args": {}}, f)
    result = subprocess.run([sys.executable, "-m", "nlq", "import-checkpoint", str(tmp_path / "ckpt.pt"), "--out",
                             str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 2 and "pwned" not in result.stdout + result.stderr
    assert "does not unpickle" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("content, message", [(b"not a checkpoint at all", "is not a PyTorch checkpoint"),
                                              (b"PK\x03\x04 truncated zip", "truncated or corrupt")])
def test_a_file_that_is_no_checkpoint_is_a_one_line_error(tmp_path, content, message):
    (tmp_path / "ckpt.pt").write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "nlq", "import-checkpoint", str(tmp_path / "ckpt.pt"), "--out",
                             str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


# ---- retrofitting transformers models --------------------------------------------------------------------------------

def assert_query_is_the_formula(query, x):
    h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * query.in_norm_weight
    f = F.layer_norm(F.gelu(h @ query.up.weight.T) @ query.down.weight.T, (x.shape[-1],),
                     query.out_norm.weight, None, 1e-5)
    torch.testing.assert_close(query(x), (x + f) / 2)


def test_retrofit_llama_runs_forward_and_backward():
    from nlq import NonlinearQuery
    from nlq.interop.hf import apply_nonlinear_query

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)
    before = sum(p.numel() for p in model.parameters())
    replaced = apply_nonlinear_query(model)
    assert replaced == ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"]
    assert sum(p.numel() for p in model.parameters()) == before + 2 * 2 * 32  # d^2 -> d^2 + two norm gains
    ids = torch.randint(0, 64, (2, 10))
    out = model(ids, labels=ids)
    out.loss.backward()
    query = model.model.layers[0].self_attn.q_proj
    assert isinstance(query, NonlinearQuery) and query.up.weight.grad.abs().sum() > 0
    assert_query_is_the_formula(query, torch.randn(3, 32))


def test_retrofit_gpt2_splits_c_attn_and_keeps_keys_and_values():
    from nlq.interop.hf import apply_nonlinear_query

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32,
                                                                 n_layer=2, n_head=2))
    kv_before = model.transformer.h[0].attn.c_attn.weight[:, 32:].clone()
    assert apply_nonlinear_query(model) == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]
    fused = model.transformer.h[0].attn.c_attn
    torch.testing.assert_close(fused.kv.weight, kv_before.T)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(fused(x)[..., 32:], fused.kv(x))
    assert_query_is_the_formula(fused.query, x)
    ids = torch.randint(0, 64, (2, 10))
    model(ids, labels=ids).loss.backward()
    assert fused.query.down.weight.grad.abs().sum() > 0


def test_retrofit_refuses_unsupported_models():
    from nlq.errors import UserError
    from nlq.interop.hf import apply_nonlinear_query

    with pytest.raises(UserError, match="no supported attention found"):
        apply_nonlinear_query(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_retrofit_refuses_cross_attention_and_changes_nothing():
    """GPT-2 with cross-attention and BART (encoder_attn): refused before any module is replaced."""
    from nlq.errors import UserError
    from nlq.interop.hf import apply_nonlinear_query

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                                                n_head=4, add_cross_attention=True))
    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32))
    for model in (gpt2, bart):
        before = {name: type(m) for name, m in model.named_modules()}
        with pytest.raises(UserError, match="cross-attention"):
            apply_nonlinear_query(model)
        assert {name: type(m) for name, m in model.named_modules()} == before  # nothing half converted


def test_retrofit_of_qwen2_warns_that_its_query_biases_are_dropped():
    from nlq.interop.hf import apply_nonlinear_query

    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2))
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    with pytest.warns(UserWarning, match="2 trained q_proj biases are not carried over"):
        apply_nonlinear_query(model)
    ids = torch.randint(0, 64, (2, 6))
    model(ids, labels=ids).loss.backward()


# ---- light imports ---------------------------------------------------------------------------------------------------

def test_import_nlq_and_the_module_need_torch_alone():
    """Whatever torch imports, `from nlq import NonlinearQuery` adds only nlq's own modules."""
    code = ("import sys, torch; before = set(sys.modules); import nlq; from nlq import NonlinearQuery; "
            "NonlinearQuery(8)(torch.zeros(1, 8)); print(sorted({m.split('.')[0] for m in set(sys.modules) - before}))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "['nlq']"


def test_cli_help_does_not_import_torch():
    code = "import sys; from nlq.cli import build_parser; build_parser().format_help(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# ---- self-contained runs ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_copied_checkpoint_file_keeps_its_tokenizer_and_the_final_model_is_safetensors(byte_data, tmp_path):
    import shutil

    from safetensors import safe_open

    from nlq.runs.rundir import load_model, run_tokenizer

    run = trained_run(byte_data, tmp_path)
    alone = tmp_path / "elsewhere" / "step.pt"
    alone.parent.mkdir()
    shutil.copyfile(next((run / "checkpoints").glob("step_*.pt")), alone)
    assert run_tokenizer(alone).encode_batch(["Thou art"])[0].tolist() == list(b"Thou art")
    result = subprocess.run([sys.executable, "-m", "nlq", "sample", str(alone), "--prompt", "Thou", "--max-new-tokens",
                             "5"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("Thou")
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:  # weights only: no optimizer state
        assert not any("exp_avg" in k for k in f.keys()) and "nlq_config" in f.metadata()
    model_only, _, payload = load_model(run / "model.safetensors")
    full, _, _ = load_model(run)
    assert payload["step"] == 3
    torch.testing.assert_close(model_only(IDS)[0], full(IDS)[0], rtol=0, atol=0)


# ---- Imports and exports are atomic, find their tokenizer, and generate in batches; odd inputs are refused -----------

@pytest.fixture(scope="module")
def nonlinear_run(byte_data, tmp_path_factory):
    return train_small(byte_data, tmp_path_factory.mktemp("edges") / "nonlinear", "--model.query=nonlinear")


KILL_DURING_IMPORT = """
import os, signal, sys, torch
from nlq.runs import checkpoint
real = torch.save
def dying(obj, f, *a, **k):
    f.write(b"half")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.torch.save = dying
from nlq.cli import main
main(sys.argv[1:])
"""


@pytest.mark.slow
def test_import_checkpoint_killed_or_out_of_space_leaves_no_output_and_the_retry_works(run_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    source = next((run_dir / "checkpoints").glob("step_*.pt"))
    out = tmp_path / "imported"
    killed = subprocess.run([sys.executable, "-c", KILL_DURING_IMPORT, "import-checkpoint", str(source),
                             "--out", str(out)])
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists() and list(tmp_path.glob(".imported.tmp-*"))  # only a temporary was left
    from nlq.runs import checkpoint

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_write", full_disk)
    one_line_error(capsys, ["import-checkpoint", source, "--out", out], "No space left")
    assert not out.exists()
    monkeypatch.undo()
    main(["import-checkpoint", str(source), "--out", str(out)])
    assert (out / "config.json").is_file() and list((out / "checkpoints").glob("step_*.pt"))
    assert not list(tmp_path.glob(".imported.tmp-*"))  # the killed import's temporary is gone


def test_a_killed_exports_temporary_is_removed_by_the_next_export(run_dir, tmp_path):
    stale = tmp_path / ".hf.tmp-999999-1"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    main(["export", str(run_dir), "--to", "hf", str(tmp_path / "hf")])
    assert not stale.exists() and (tmp_path / "hf" / "config.json").is_file()


@pytest.mark.parametrize("which", ["model.safetensors", "copied checkpoint"])
def test_export_writes_the_tokenizer_for_a_model_file_or_a_copied_checkpoint(run_dir, tmp_path, which):
    if which == "model.safetensors":
        source = run_dir / "model.safetensors"
    else:
        source = tmp_path / "elsewhere" / "step.pt"
        source.parent.mkdir()
        shutil.copyfile(sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1], source)
    main(["export", str(source), "--to", "hf", str(tmp_path / "hf")])
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("Thou art")["input_ids"] == list(b"Thou art")


def test_batched_left_padded_generation_of_a_custom_export_equals_each_row_alone(nonlinear_run, tmp_path):
    from nlq.interop.export import export_hf

    export_hf(nonlinear_run, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    tokenizer.padding_side = "left"
    prompts = ["Shall I", "Thou art more lovely", "Rough winds do shake the", "A"]

    def generate(batch):
        encoded = tokenizer(batch, return_tensors="pt", padding=True)
        out = model.generate(**encoded, max_new_tokens=6, do_sample=False, use_cache=False,
                             pad_token_id=tokenizer.pad_token_id)
        return [tokenizer.decode(row[encoded["input_ids"].shape[1]:]) for row in out]

    alone = [generate([p])[0] for p in prompts]
    assert generate(prompts) == alone  # batch size 4 (lm-eval's generate_until) equals batch size 1
    with torch.no_grad():  # and the padded rows' logits equal the rows' own
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
        batched = model(**encoded).logits
        for i, p in enumerate(prompts):
            ids = tokenizer(p, return_tensors="pt")["input_ids"]
            torch.testing.assert_close(batched[i, -ids.shape[1]:], model(ids).logits[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("query", ["nonlinear", "nonlinear --model.qk_norm=true --model.position=rope"])
def test_a_custom_export_generates_with_transformers_cache_the_tokens_it_generates_without(byte_data, tmp_path, query):
    """generate() with transformers' own cache (the default) draws, greedy, the tokens of use_cache=False for a
    left-padded batch, and past block_size (a 15-token prompt and 40 new tokens, block_size 32), where the window
    slides and is read afresh; and the cache path really is incremental: one token per step after the prompt."""
    from nlq.interop.export import export_hf

    run = train_small(byte_data, tmp_path / "run", *[f"--model.query={query.split()[0]}", *query.split()[1:]])
    export_hf(run, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    tokenizer.padding_side = "left"
    prompts = ["Shall I compare", "Thou art", "A"]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    seen = []
    real_forward = model.forward

    @functools.wraps(real_forward)  # generate reads forward's signature
    def counting_forward(*args, **kwargs):
        seen.append(kwargs["input_ids"].shape[1])
        return real_forward(*args, **kwargs)

    def generate(use_cache):
        with torch.no_grad():
            return model.generate(**encoded, max_new_tokens=40, do_sample=False, use_cache=use_cache,
                                  pad_token_id=tokenizer.pad_token_id)

    model.forward = counting_forward
    cached = generate(True)
    steps = list(seen)
    assert torch.equal(cached, generate(False))
    width, window = encoded["input_ids"].shape[1], model.config.max_position_embeddings
    assert (width, window) == (15, 32)
    assert steps == [width] + [1] * (window - width) + [window] * (40 - 1 - window + width)  # then the window


def test_export_into_a_symlink_loop_is_one_line_and_writes_nothing(run_dir, tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")  # points at itself
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(capsys, ["export", run_dir, "--to", "hf", loop], "symlink loop")
    one_line_error(capsys, ["export", run_dir, "--to", "hf", loop / "inside"], "symlink loop")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("key,value", [("n_embd", "16"), ("n_layer", 2.0), ("dropout", "0.1"), ("scale", "0.125")])
def test_a_paper_checkpoint_with_a_string_for_a_number_is_refused(tmp_path, capsys, key, value):
    from test_interop import paper_checkpoint

    ckpt = paper_checkpoint("residual_gelu")
    ckpt["model_args"][key] = value
    torch.save(ckpt, tmp_path / "ckpt.pt")
    needle = {"scale": "attn_scale"}.get(key, key)
    one_line_error(capsys, ["import-checkpoint", tmp_path / "ckpt.pt", "--out", tmp_path / "run"], needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["weights", "tokenizer"])
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(run_dir, tmp_path, capsys, monkeypatch, where):
    """safetensors says a full disk with an error of its own (not an OSError); either way nothing is left behind,
    not even the export's lock file."""
    import safetensors.torch
    import transformers.modeling_utils
    from safetensors import SafetensorError

    from nlq.interop import export

    def full(*args, **kwargs):
        if where == "weights":
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        raise OSError(28, "No space left on device", "tokenizer.json")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full, raising=False)
    monkeypatch.setattr(export, "write_tokenizer", full) if where == "tokenizer" else None
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(capsys, ["export", run_dir, "--to", "hf", tmp_path / "hf"], "o space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no hf, no .hf.tmp-*, no .hf.lock

"""The induction diagnostics (training/diagnostics.py) and the transition rules (runs/transitions.py): each number
against a float64 formula written out here, training bitwise unchanged by measuring (dropout on), the cadence, the
switch, and the transition recorded in summary.json."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_model_config, tiny_run_config
from nlq.model import Transformer
from nlq.runs.metrics import read_metrics
from nlq.runs.transitions import (
    Transition,
    first_crossing,
    induction_transition,
    loss_transition,
    mean_loss_after,
    moving_mean,
)
from nlq.training.diagnostics import induction_record, repeated_tokens
from nlq.training.trainer import train


def test_the_synthetic_batch_repeats_itself_and_leaves_the_global_generator_alone():
    state = torch.get_rng_state()
    tokens = repeated_tokens(97, 16, rows=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert tokens.shape == (3, 16) and torch.equal(tokens[:, :8], tokens[:, 8:])
    assert torch.equal(tokens, repeated_tokens(97, 16, rows=3)) and tokens.max() < 97


def reference_maps(model: Transformer, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's softmax(q k^T / sqrt(hs) + causal mask) in float64, q and k written out from the weights of a
    linear-query model (the input of each attention read by a hook on its block's ln_1)."""
    inputs = []
    hooks = [b.ln_1.register_forward_hook(lambda m, i, o: inputs.append(o.double())) for b in model.blocks]
    model.eval()
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    maps = []
    for x, block in zip(inputs, model.blocks):
        attn, (B, T, C) = block.attn, x.shape
        nh, hs = attn.n_head, attn.head_size
        q = x @ attn.q_proj.weight_proj.weight.double().T  # (B, T, C)
        k = (x @ attn.kv_proj.weight.double().T)[..., :C]
        q, k = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k))  # (B, nh, T, hs)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hs)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        maps.append(scores.softmax(-1))
    return maps


def test_each_diagnostic_equals_its_formula_in_float64():
    torch.manual_seed(0)
    model = Transformer(tiny_model_config(block_size=16), seed=3)
    tokens = repeated_tokens(97, 16, rows=2)
    got = induction_record(model, tokens)
    maps, half = reference_maps(model, tokens), 8
    for layer, probs in enumerate(maps):
        for head in range(4):
            expected = sum(probs[b, head, half + j, j + 1] for b in range(2) for j in range(half)) / (2 * half)
            assert got["prefix_matching"][layer][head] == pytest.approx(expected.item(), abs=1e-6)
        entropy = -(probs * probs.clamp_min(1e-300).log()).sum(-1).mean()
        assert got["attn_entropy"][layer] == pytest.approx(entropy.item(), abs=1e-5)
    assert got["prefix_matching_max"] == max(max(h) for h in got["prefix_matching"])
    with torch.no_grad():
        logits, _ = model(tokens)
    nll = F.cross_entropy(logits[:, :-1].double().transpose(1, 2), tokens[:, 1:], reduction="none")  # (B, T - 1)
    first = nll[:, :7].mean()  # tokens 1..7 of the first copy (token 0 has no context)
    second = nll[:, 8:].mean()  # tokens 9..15: the second copy but its first token
    assert got["induction_loss_first"] == pytest.approx(first.item(), abs=1e-5)
    assert got["icl_score"] == pytest.approx((second - first).item(), abs=1e-5)
    model.train()
    induction_record(model, tokens)
    assert model.training  # left as it was


def test_a_copying_model_scores_as_one():
    """Prefix matching reads the right cell: a map that attends from each second-copy token to the token after its
    first occurrence scores 1, a map one cell off scores 0."""
    model = Transformer(tiny_model_config(block_size=16, n_layer=1), seed=0)
    tokens = repeated_tokens(97, 16, rows=1)

    def planted(offset):
        def attend(module, args, output):
            maps = module.attention_maps
            if maps is not None and maps:
                T = maps[-1].size(-1)
                fake = torch.zeros_like(maps[-1])
                for i in range(T):
                    fake[..., i, max(0, min(i, i - 7 + offset))] = 1.0  # i - (half - 1): the induction target
                maps[-1] = fake
        return attend

    for offset, expected in ((0, 1.0), (1, 0.0)):
        hook = model.blocks[0].attn.register_forward_hook(planted(offset))
        assert induction_record(model, tokens)["prefix_matching_max"] == pytest.approx(expected)
        hook.remove()


def test_differential_attention_reports_every_query_head():
    model = Transformer(tiny_model_config(block_size=16, attention="differential"), seed=1)
    record = induction_record(model, repeated_tokens(97, 16, rows=2))
    assert [len(layer) for layer in record["prefix_matching"]] == [4, 4]


def _train(data, out, **train_values):
    model = tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    config = tiny_run_config(data, model=model, max_steps=10, checkpoint_every=5, **train_values)
    train(config, out, quiet=True)
    return read_metrics(out / "metrics.jsonl"), json.loads((out / "summary.json").read_text())


def test_measuring_changes_no_training_number_even_with_dropout(byte_data, tmp_path):
    """Dropout draws from the global generator at every step: measuring in eval mode without gradients, from a
    generator of its own, leaves every training and evaluation number and the weights bitwise as they were."""
    on, on_summary = _train(byte_data, tmp_path / "on", diagnostics_every=3)
    off, off_summary = _train(byte_data, tmp_path / "off", diagnostics_every=0)
    timing = {"tokens_per_s", "time"}
    kept = [{k: v for k, v in r.items() if k not in timing} for r in on if "prefix_matching_max" not in r]
    assert kept == [{k: v for k, v in r.items() if k not in timing} for r in off]
    assert [r["step"] for r in on if "prefix_matching_max" in r] == [0, 3, 6, 9, 10]  # step 0, the cadence, the end
    assert not any("prefix_matching_max" in r for r in off)
    a = torch.load(tmp_path / "on/checkpoints/step_0000010.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "off/checkpoints/step_0000010.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert on_summary["transition_censored"] in (True, False) and on_summary["transition_step"] in (3, 6, 9, 10)
    assert "transition_step" not in off_summary


def test_a_resumed_run_measures_on_from_its_checkpoint(byte_data, tmp_path):
    whole, _ = _train(byte_data, tmp_path / "whole", diagnostics_every=2)
    model = tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    first = tiny_run_config(byte_data, model=model, max_steps=10, checkpoint_every=5, diagnostics_every=2)
    out = tmp_path / "resumed"
    train(first, out, quiet=True)
    (out / "summary.json").unlink()
    for path in sorted((out / "checkpoints").glob("step_0000010.pt")):
        path.unlink()
    train(first, out, resume=True, quiet=True)
    timing = {"tokens_per_s", "time"}
    resumed = read_metrics(out / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k not in timing} for r in whole] == \
        [{k: v for k, v in r.items() if k not in timing} for r in resumed]


def test_the_transition_rules():
    curve = [(100, 0.01), (200, 0.02), (300, 0.35), (400, 0.6)]
    assert first_crossing(curve, 0.3, below=False) == Transition(300, False)
    assert first_crossing(curve, 0.9, below=False) == Transition(400, True)  # censored at the last step
    assert first_crossing([], 0.3, below=False) == Transition(None, True)
    assert moving_mean([(1, 3.0), (2, 6.0), (3, 9.0)], 3) == [(1, 4.5), (2, 6.0), (3, 7.5)]  # centred, cut at the ends
    records = [{"step": s, "prefix_matching_max": v} for s, v in curve] + [{"step": 400, "train_loss": 1.0}]
    assert induction_transition(records) == Transition(300, False)
    assert induction_transition([{"step": 1, "train_loss": 1.0}]) is None  # no diagnostics
    losses = [{"step": s, "train_loss": 3.9 if s < 3000 else 3.2} for s in range(0, 6001, 50)]
    # a 9-point centred mean of the every-100 points: at 3000, (4 x 3.9 + 5 x 3.2) / 9 = 3.511; at 3100, 3.433
    assert loss_transition(losses, 3.5) == Transition(3100, False)
    assert loss_transition(losses, 3.0) == Transition(6000, True)
    assert mean_loss_after(losses, 3000, 1500, 2500) == pytest.approx(3.2)
    assert mean_loss_after(losses, 5000, 1500, 2500) is None  # the run did not log that far


def test_every_line_carries_its_time_and_a_resumed_run_keeps_its_first_start(byte_data, tmp_path):
    model = tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32)
    config = tiny_run_config(byte_data, model=model, max_steps=10, checkpoint_every=5, diagnostics_every=5)
    out = tmp_path / "run"
    train(config, out, quiet=True)
    first = json.loads((out / "summary.json").read_text())["record"]
    assert first["starts"] == [{"step": 0, "utc": first["started_utc"]}]
    assert first["first_started_utc"] == first["started_utc"]
    (out / "checkpoints" / "step_0000010.pt").unlink()
    train(config, out, resume=True, quiet=True)
    again = json.loads((out / "summary.json").read_text())["record"]
    assert again["resumed_at_step"] == 5
    assert again["starts"] == [{"step": 0, "utc": first["started_utc"]}, {"step": 5, "utc": again["started_utc"]}]
    assert again["first_started_utc"] == first["started_utc"]
    lines = read_metrics(out / "metrics.jsonl")
    assert lines and all(len(r["time"]) == 20 and r["time"].endswith("Z") for r in lines)

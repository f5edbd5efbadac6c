import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import one_line_error, tiny_model_config, tiny_run_config
from nlq.cli import main
from nlq.config import TrainConfig
from nlq.errors import TrainingError, UserError
from nlq.model import Transformer
from nlq.runs.checkpoint import clean_state_dict, list_checkpoints, load_checkpoint
from nlq.runs.metrics import read_metrics
from nlq.runs.rundir import save_config
from nlq.training.inputs import batch_spec
from nlq.training.trainer import lr_at, make_optimizer, train


def losses(run_dir, key="train_loss"):
    return [(r["step"], r[key]) for r in read_metrics(run_dir / "metrics.jsonl") if key in r]


def test_loss_falls_and_run_dir_is_complete(byte_data, tmp_path):
    summary = train(tiny_run_config(byte_data, max_steps=40, eval_every=20), tmp_path / "run", quiet=True)
    vals = losses(tmp_path / "run", "val_loss")
    assert [s for s, _ in vals] == [0, 20, 40]
    assert vals[-1][1] < vals[0][1] - 1.5  # from ~ln(257) = 5.5 to well below
    assert summary["val_loss"] == vals[-1][1] and summary["unigram_entropy"] > 0
    for name in ("config.json", "data_meta.json", "metrics.jsonl", "summary.json"):
        assert (tmp_path / "run" / name).is_file()
    record = next(r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "train_loss" in r)
    assert {"step", "train_loss", "lr", "grad_norm", "tokens", "tokens_per_s"} <= record.keys()
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_0000040.pt"]


@pytest.mark.parametrize("query", ["linear", "nonlinear"])
def test_exact_resume_is_bitwise_identical(byte_data, tmp_path, query):
    model = tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32, query=query, dropout=0.1)
    straight = tiny_run_config(byte_data, model=model, max_steps=10, decay_steps=10, checkpoint_every=5)
    train(straight, tmp_path / "a", quiet=True)
    half = tiny_run_config(byte_data, model=model, max_steps=5, decay_steps=10)  # the same schedule, stopped early
    train(half, tmp_path / "b", quiet=True)
    train(straight, tmp_path / "b", resume=True, quiet=True)
    assert losses(tmp_path / "a") == losses(tmp_path / "b")  # exact float equality, dropout included
    records = {d: json.loads((tmp_path / d / "summary.json").read_text())["record"] for d in "ab"}
    assert records["a"]["resumed_at_step"] is None and records["b"]["resumed_at_step"] == 5
    val_a, val_b = dict(losses(tmp_path / "a", "val_loss")), dict(losses(tmp_path / "b", "val_loss"))
    assert set(val_a) == {0, 4, 8, 10} and all(val_a[s] == val_b[s] for s in val_a)  # b also evaluated at 5
    a, b = (load_checkpoint(tmp_path / d)["model"] for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


KILL_WHILE_SAVING = textwrap.dedent("""
    import os, signal, sys
    import torch
    from nlq.overrides import load_config
    from nlq.runs import checkpoint
    from nlq.training.trainer import train

    real_save = torch.save
    def dying_save(obj, f, *args, **kwargs):
        if obj["step"] == 6:  # half-write the second checkpoint, then die without any cleanup
            f.write(b"partial")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(obj, f, *args, **kwargs)
    checkpoint.torch.save = dying_save
    train(load_config(sys.argv[1]), sys.argv[2], quiet=True)
""")


@pytest.mark.slow
def test_sigkill_while_writing_a_checkpoint_resumes_from_the_previous_one(byte_data, tmp_path):
    config = tiny_run_config(byte_data, max_steps=9, checkpoint_every=3, keep_checkpoints=5)
    save_config(config, tmp_path / "config.json")
    result = subprocess.run([sys.executable, "-c", KILL_WHILE_SAVING, str(tmp_path / "config.json"),
                             str(tmp_path / "run")])
    assert result.returncode == -9
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step_0000003.pt"]
    assert list((tmp_path / "run" / "checkpoints").glob(".step_0000006.pt.tmp-*"))  # the half-written file
    train(config, tmp_path / "run", resume=True, quiet=True)
    train(config, tmp_path / "straight", quiet=True)
    assert losses(tmp_path / "run") == losses(tmp_path / "straight")


def test_gradient_accumulation_matches_one_big_batch(byte_data, tmp_path):
    big = tiny_run_config(byte_data, batch_size=8, max_steps=4)
    accum = tiny_run_config(byte_data, batch_size=4, batch_tokens=8 * 32, max_steps=4)
    assert batch_spec(accum.train, 32, 1).accum == 2
    train(big, tmp_path / "big", quiet=True)
    train(accum, tmp_path / "accum", quiet=True)
    for (s1, l1), (s2, l2) in zip(losses(tmp_path / "big"), losses(tmp_path / "accum"), strict=True):
        assert s1 == s2 and l1 == pytest.approx(l2, rel=1e-5)


def test_batch_spec_keeps_the_global_batch_across_world_sizes():
    cfg = TrainConfig(batch_size=4, batch_tokens=16 * 64)
    specs = [batch_spec(cfg, 64, world) for world in (1, 2, 4, 8)]
    assert [(s.global_rows, s.micro_rows, s.accum) for s in specs] == [(16, 4, 4), (16, 4, 2), (16, 4, 1), (16, 2, 1)]
    with pytest.raises(UserError, match="does not split over 3 processes"):
        batch_spec(cfg, 64, 3)
    with pytest.raises(UserError, match="not a multiple of model.block_size"):
        batch_spec(TrainConfig(batch_tokens=100), 64, 1)
    with pytest.raises(UserError, match="micro-batches"):
        batch_spec(TrainConfig(batch_size=3, batch_tokens=8 * 64), 64, 1)


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(110, cfg) == pytest.approx(0.1)


def test_weight_decay_only_on_matrices():
    model = Transformer(tiny_model_config(query="nonlinear", bias=True))
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"), sharded=False)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("q_proj.up" in names[id(p)] for p in decay["params"])
    assert any("q_proj.in_norm_weight" in names[id(p)] for p in no_decay["params"])


def test_non_finite_training_stops_and_keeps_the_last_good_checkpoint(byte_data, tmp_path, monkeypatch):
    from nlq.training import trainer

    normal = trainer.lr_at
    monkeypatch.setattr(trainer, "lr_at", lambda step, cfg: 1e38 if step >= 3 else normal(step, cfg))  # blows up at 4
    config = tiny_run_config(byte_data, max_steps=8, checkpoint_every=1, keep_checkpoints=10, grad_clip=0.0)
    with pytest.raises(TrainingError, match=r"(not finite|is nan|is inf).* step [45]; stopped") as info:
        train(config, tmp_path / "run", quiet=True)
    saved = list_checkpoints(tmp_path / "run")
    assert saved[-1].name in ("step_0000003.pt", "step_0000004.pt") and str(saved[-1]) in str(info.value)
    assert all(torch.isfinite(v).all() for v in load_checkpoint(saved[-1])["model"].values())


def test_compiled_and_ddp_prefixes_are_stripped():
    state = {"_orig_mod.module.tok_emb.weight": 1, "module._orig_mod.ln_f.weight": 2, "lm_head.weight": 3}
    assert clean_state_dict(state) == {"tok_emb.weight": 1, "ln_f.weight": 2, "lm_head.weight": 3}


def test_existing_run_needs_resume(byte_data, tmp_path):
    config = tiny_run_config(byte_data, max_steps=2)
    train(config, tmp_path / "run", quiet=True)
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        train(config, tmp_path / "run", quiet=True)


def test_vocab_mismatch_fails_before_compute(byte_data, tmp_path):
    config = tiny_run_config(byte_data, model=tiny_model_config(vocab_size=200, block_size=32))
    with pytest.raises(UserError, match=r"vocabulary \(257, byte\) does not fit model.vocab_size=200; set "
                                        r"--model.vocab_size=320"):
        train(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


# ---- the command line ------------------------------------------------------------------------------------------------

def nlq(*args, cwd=None):
    result = subprocess.run([sys.executable, "-m", "nlq", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture(scope="module")
def trained_run(byte_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("cli") / "run"
    code, out, err = nlq("train", "--data", byte_data, "--out", run, "--preset", "nano", "--model.vocab_size=257",
                         "--model.block_size=32", "--train.max_steps=6", "--train.eval_every=3", "--train.batch_size=4")
    assert code == 0, err
    return run


@pytest.mark.slow
def test_cli_train_eval_sample(trained_run, tmp_path):
    assert json.loads((trained_run / "config.json").read_text())["model"]["vocab_size"] == 257
    code, out, err = nlq("eval", trained_run)
    assert code == 0 and out.startswith("step 6 on") and "perplexity" in out and "bits/byte" in out
    (tmp_path / "t.txt").write_text("Shall I compare thee to a summer's day?\n" * 20)
    code, out, err = nlq("eval", trained_run, "--text", tmp_path / "t.txt")
    assert code == 0 and "(799 scored tokens)" in out
    code, first, _ = nlq("sample", trained_run, "--prompt", "Shall", "--max-new-tokens", "10", "--seed", "3")
    code2, second, _ = nlq("sample", trained_run / "checkpoints" / "step_0000006.pt", "--prompt", "Shall",
                           "--max-new-tokens", "10", "--seed", "3")
    assert code == code2 == 0 and first == second and first.startswith("Shall")
    code, several, _ = nlq("sample", trained_run, "--prompt", "Shall", "--max-new-tokens", "10", "--num-samples", "3")
    samples = several.rstrip("\n").split("\n" + "-" * 40 + "\n")
    assert code == 0 and len(samples) == 3 and all(s.startswith("Shall") for s in samples)


@pytest.mark.slow
def test_cli_resume_continues_with_saved_config(trained_run, byte_data, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    code, out, err = nlq("train", "--out", run, "--resume", "--train.max_steps=8")
    assert code == 0, err
    assert [s for s, _ in losses(run)] == list(range(1, 9))


@pytest.mark.parametrize("args,needle", [
    (["train", "--data", "{data}", "--out", "{tmp}/r", "--train.bogus=1"], "unknown config key train.bogus"),
    (["train", "--data", "{data}", "--out", "{tmp}/r", "--train.max_steps=lots"],
     "train.max_steps='lots' is not a valid int"),
    (["train", "--data", "{data}", "--out", "{tmp}/r", "--preset", "nano", "--model.vocab_size=100"],
     "does not fit model.vocab_size=100"),
    (["train", "--data", "{tmp}/nowhere", "--out", "{tmp}/r"], "not a prepared data directory"),
    (["eval", "{tmp}/missing"], "does not exist"),
    (["eval", "{tmp}/corrupt.pt"], "is corrupt or not an nlq checkpoint"),
    (["eval", "{tmp}/truncated.pt"], "is corrupt or not an nlq checkpoint"),
    (["sample", "{run}", "--prompt", ""], "the prompt is empty"),
    (["sample", "{run}", "--prompt", "\udcff"], "not valid UTF-8"),
    (["eval", "{run}", "--text", "{tmp}/none.txt"], "does not exist"),
    (["eval", "{run}", "--train.lr=1"], "takes only --data.* overrides"),
])
@pytest.mark.slow
def test_cli_bad_input_is_one_line(trained_run, byte_data, tmp_path, args, needle):
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "truncated.pt").write_bytes(b"PK\x03\x04 then nothing")
    args = [a.format(data=byte_data, tmp=tmp_path, run=trained_run) for a in args]
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-m", "nlq", *args], capture_output=True, env=env,
                            text=True, errors="surrogateescape") if "\udcff" not in args else None
    if result is None:  # an argument with a byte that is not UTF-8
        raw = [a.encode("utf-8", "surrogateescape") for a in args]
        result = subprocess.run([sys.executable.encode(), b"-m", b"nlq", *raw], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "r").exists()


def test_wsd_schedule_shape_at_its_boundaries():
    from nlq.schedule import cooldown_start

    cfg = TrainConfig(schedule="wsd", lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, cooldown_fraction=0.2)
    assert cooldown_start(cfg) == 80
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)  # warmup, as cosine
    assert lr_at(10, cfg) == 1.0 and lr_at(79, cfg) == 1.0  # stable to the last step before the cooldown
    assert lr_at(80, cfg) == pytest.approx(0.1 + 0.9 * (1 - (1 / 20) ** 0.5))  # 1 - sqrt cooldown begins
    assert lr_at(89, cfg) == pytest.approx(0.1 + 0.9 * (1 - (10 / 20) ** 0.5))
    assert lr_at(99, cfg) == pytest.approx(0.1) and lr_at(150, cfg) == pytest.approx(0.1)  # min_lr at the end
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # never rises after warmup
    longer = TrainConfig(schedule="wsd", lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=400, cooldown_fraction=0.2)
    assert [lr_at(s, longer) for s in range(80)] == lrs[:80]  # before its cooldown a run does not know its length


def test_wsd_cooldown_branched_from_a_stable_run_equals_a_straight_run(byte_data, tmp_path):
    """The stable run to step 8 of a 16-step budget; a branch from its checkpoint cools down to 10 steps and
    must equal, bitwise, a straight 10-step WSD run (dropout on, so the RNG state must travel too)."""
    model = tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32, query="nonlinear",
                              dropout=0.1)
    wsd = dict(schedule="wsd", cooldown_fraction=0.2, warmup_steps=2, eval_every=4)
    train(tiny_run_config(byte_data, model=model, max_steps=8, decay_steps=16, **wsd), tmp_path / "stable", quiet=True)
    straight = tiny_run_config(byte_data, model=model, max_steps=10, **wsd)
    train(straight, tmp_path / "straight", quiet=True)
    branch = tiny_run_config(byte_data, model=model, max_steps=10, resume_from=str(tmp_path / "stable"), **wsd)
    train(branch, tmp_path / "branch", quiet=True)
    assert losses(tmp_path / "branch") == losses(tmp_path / "straight")  # steps 1-8 copied, 9-10 trained
    assert losses(tmp_path / "branch", "val_loss")[-1] == losses(tmp_path / "straight", "val_loss")[-1]
    a, b = (load_checkpoint(tmp_path / d)["model"] for d in ("branch", "straight"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = tiny_run_config(byte_data, model=tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2,
                                                               n_embd=32), resume_from=str(tmp_path / "stable"))
    with pytest.raises(UserError, match="model config differs .*model.query"):
        train(other, tmp_path / "wrong", quiet=True)


def test_the_checkpoints_folder_resolves_to_the_runs_latest_checkpoint(trained_run):
    from nlq.runs.checkpoint import latest_checkpoint, resolve_checkpoint

    assert resolve_checkpoint(trained_run / "checkpoints") == latest_checkpoint(trained_run) is not None


def test_the_code_a_run_records_is_read_when_it_starts_not_when_it_ends(byte_data, tmp_path, monkeypatch):
    """A study trains for hours while its checkout may change: the commit is read (and cached) before the first step,
    so the record names the tree the process imported, not the one it finds at the end."""
    from nlq.training import trainer

    steps = []
    real_lr_at = trainer.lr_at
    monkeypatch.setattr(trainer, "lr_at", lambda step, cfg: steps.append(step) or real_lr_at(step, cfg))
    monkeypatch.setattr(trainer, "code_version", lambda: "after a step" if steps else "before the first step")
    train(tiny_run_config(byte_data, max_steps=3), tmp_path / "run", quiet=True)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["record"]["code"] == "before the first step"


def test_run_records_code_times_and_first_batch_equal_within_a_pair(byte_data, tmp_path):
    """Pairing and timing can be checked from the files alone: the members of a pair (same seed, other query)
    record the same first-batch hash, another seed another; a branch records the batch it starts at."""
    records = {}
    for query, seed in (("linear", 1), ("nonlinear", 1), ("linear", 2)):
        config = tiny_run_config(byte_data, model=tiny_model_config(vocab_size=257, query=query),
                                 max_steps=4, seed=seed)
        train(config, tmp_path / f"{query}{seed}", quiet=True)
        records[(query, seed)] = json.loads((tmp_path / f"{query}{seed}" / "summary.json").read_text())["record"]
    assert records[("linear", 1)]["first_batch"] == records[("nonlinear", 1)]["first_batch"]
    assert records[("linear", 1)]["first_batch"]["sha256"] != records[("linear", 2)]["first_batch"]["sha256"]
    record = records[("linear", 1)]
    assert record["first_batch"]["step"] == 0 and record["resumed_at_step"] is None
    assert record["started_utc"] <= record["ended_utc"] and record["ended_utc"].endswith("Z")
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()  # the kernels: AVX2 and AVX-512 differ
    from nlq.provenance import code_version
    assert record["code"] == code_version()
    branch = tiny_run_config(byte_data, model=tiny_model_config(vocab_size=257), max_steps=6, seed=1,
                             resume_from=str(tmp_path / "linear1"))
    train(branch, tmp_path / "branch", quiet=True)
    first = json.loads((tmp_path / "branch" / "summary.json").read_text())["record"]["first_batch"]
    assert first["step"] == 4 and first["sha256"] != record["first_batch"]["sha256"]


# ---- Messages that name the real reason ------------------------------------------------------------------------------

def test_eval_of_a_task_run_says_it_has_no_val_split(tmp_path, capsys):
    main(["train", "--out", str(tmp_path / "task"), "--preset", "nano", "--data.task=mqar", "--data.task_vocab=8",
          "--data.task_pairs=2", "--model.vocab_size=64", "--model.block_size=16", "--train.max_steps=2",
          "--train.eval_every=2", "--data.eval_windows=4"])
    one_line_error(capsys, ["eval", tmp_path / "task"], "synthetic task (mqar)")


def test_init_from_a_decoder_into_an_encoder_does_not_ask_for_what_is_set(run_dir, byte_data, tmp_path, capsys):
    argv = ["train", "--data", byte_data, "--out", tmp_path / "enc", f"--train.init_from={run_dir}",
            "--model.causal=false", "--train.objective=mlm", "--train.max_steps=2"]
    with pytest.raises(SystemExit):
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "set --model.causal=false" not in err and "vocab" in err, err  # the real reason: the mask token needs an id


def test_a_step_0_checkpoint_holds_the_initial_weights(byte_data, tmp_path):
    from nlq.model import Transformer
    from nlq.runs import checkpoint as ckpt

    model = tiny_model_config(vocab_size=257, block_size=32, query="nonlinear")
    config = tiny_run_config(byte_data, model=model, max_steps=3, seed=5, checkpoint_at_start=True,
                             keep_checkpoints=5)
    train(config, tmp_path / "run", quiet=True)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "run")]
    assert names[0] == "step_0000000.pt" and names[-1] == "step_0000003.pt"
    payload = torch.load(tmp_path / "run" / "checkpoints" / names[0], weights_only=True)
    initial = Transformer(model, seed=5).state_dict()
    state = payload["model"]
    assert set(initial) <= set(state) and all(torch.equal(state[k], v) for k, v in initial.items())

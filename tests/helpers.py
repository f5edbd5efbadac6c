"""What many test modules share: tiny configs, a small command-line run, the one-line-error check, stub training
for studies and a two-variant study. Fixtures that use these live in conftest.py."""

import json
import socket
import threading

import pytest

from nlq.config import ModelConfig

# a one-layer model on the byte data: the command-line tests train it in a second or two
SMALL = ["--model.vocab_size=257", "--model.block_size=32", "--model.n_layer=1", "--model.n_embd=32",
         "--model.n_head=2", "--train.batch_size=4", "--data.eval_windows=4", "--train.eval_every=2",
         "--train.warmup_steps=1"]

SAMPLE_TEXT = (
    "Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
    "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
)


def tiny_model_config(**changes) -> ModelConfig:
    """A model small enough that every test runs in milliseconds."""
    base = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32)
    base.update(changes)
    return ModelConfig(**base)


def tiny_run_config(data_dir, model=None, **train):
    """nano-sized model on the byte data; a handful of steps run in about a second."""
    from nlq.config import DataConfig, RunConfig, TrainConfig

    model = model or tiny_model_config(vocab_size=257, block_size=32, n_layer=2, n_head=2, n_embd=32)
    values = dict(max_steps=8, batch_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=2, eval_every=4, log_every=1)
    values.update(train)
    return RunConfig(model=model, data=DataConfig(dir=str(data_dir), eval_windows=8), train=TrainConfig(**values))


def train_small(byte_data, out, *extra):
    """A finished 4-step nano run through the command line (checkpoints at 2 and 4), with extra overrides."""
    from nlq.cli import main

    main(["train", "--data", str(byte_data), "--out", str(out), "--preset", "nano", *SMALL, "--train.max_steps=4",
          "--train.checkpoint_every=2", *extra])
    return out


def one_line_error(capsys, argv, needle):
    """`nlq ARGV` exits with status 2 and one line on stderr (no traceback) that contains needle; returns it."""
    from nlq.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    return err


def fake_training(monkeypatch, summary=None) -> list:
    """Replace a study's training with a stub that writes each run's config.json and summary.json at once
    (final_step, val_loss 1.0, tokens_per_s; `summary(config, run_dir)` adds fields, or raises as a failing run
    would). Returns the list of (thread name, run name, config) it was asked to train, in order."""
    from nlq.studies.running import study as study_module

    trained, lock = [], threading.Lock()

    def fake_train(config, run_dir):
        values = {"final_step": config.train.max_steps, "val_loss": 1.0, "tokens_per_s": 1.0}
        values |= summary(config, run_dir) if summary else {}
        with lock:
            trained.append((threading.current_thread().name, run_dir.name, config))
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(config.to_dict()))
        (run_dir / "summary.json").write_text(json.dumps(values))

    monkeypatch.setattr(study_module, "_train_run", fake_train)
    monkeypatch.setattr(study_module, "WAIT_POLL_S", 0.01)
    return trained


def two_arm_study(config, name="tiny", seeds=(1, 2), description="two arms"):
    """linear and nonlinear on one config, data from the config's data.dir (the byte data in tests)."""
    from nlq.studies.definition.design import Arm, DataSpec, Study

    return Study(name, description, config, [Arm("linear", {"model": {"query": "linear"}}),
                                            Arm("nonlinear", {"model": {"query": "nonlinear"}})],
                 seeds=list(seeds), data=DataSpec("unused", "byte"))


def shipped_study(name, **design):
    """The study of a shipped plan (plans/NAME.toml) with these [design] fields changed, e.g. a tiny grid."""
    import tomllib

    from nlq.studies.definition.plan import read_plan, shipped_plans
    from nlq.studies.running.engine import plan_study

    raw = tomllib.loads(shipped_plans()[name].read_text())
    raw["design"] |= design
    return plan_study(read_plan(raw, name))


def task_study(name, variants):
    """A study on a synthetic task (no prepared data), for the tests that give it stages of their own."""
    from nlq.studies.definition.design import DataSpec, Study

    return Study(name, "", shipped_study("probes").base, list(variants), seeds=[1], data=DataSpec("task", "none"))


TASK = {"data": {"task": "mqar", "task_vocab": 8, "task_pairs": 2}, "train": {"max_steps": 2}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_wrapped_run_matches_plain(config, strategy, backend, tmp_path, monkeypatch):
    """Train config plainly, then as torchrun --nproc_per_node=1 would (a group of one, the model wrapped
    by DDP or FSDP2); the two loss curves must agree."""
    from nlq.config import update
    from nlq.runs.metrics import read_metrics
    from nlq.training.trainer import train

    train(config, tmp_path / "plain", quiet=True)
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    train(update(config, {"dist": {"strategy": strategy, "backend": backend}}), tmp_path / strategy, quiet=True)
    plain, wrapped = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("plain", strategy))
    a = [r["train_loss"] for r in plain if "train_loss" in r]
    b = [r["train_loss"] for r in wrapped if "train_loss" in r]
    assert len(a) == len(b) == config.train.max_steps
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-4 * abs(x)


def written_out_qkv(attn, x, rotary=None):
    """q, k, v (B, h, T, hs) of a linear-query attention written out from its weights alone (fused K/V, QK-norm or not,
    the NeoX half-split rotation where rotary is given; k and v expanded to every query head): the start of every
    hand-written attention reference in the tests."""
    import torch

    B, T, _ = x.shape
    nh, hs = attn.n_head, attn.head_size
    q = x @ attn.q_proj.weight_proj.weight.T
    k, v = (x @ attn.kv_proj.weight.T).split(attn.kv_dim, dim=-1)
    q, k, v = (t.view(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if rotary is not None:
        cos, sin = (t.to(x.dtype) for t in rotary)

        def rotate(t):
            t1, t2 = t[..., :hs // 2], t[..., hs // 2:]
            return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1)
        q, k = rotate(q), rotate(k)
    k, v = (t.repeat_interleave(nh // k.size(1), dim=1) for t in (k, v))
    return q, k, v

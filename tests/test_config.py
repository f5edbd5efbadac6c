import json

import pytest

from nlq.config import ModelConfig, RunConfig, TrainConfig
from nlq.errors import ConfigError
from nlq.overrides import apply_overrides, load_config, parse_overrides
from nlq.runs.rundir import save_config


@pytest.mark.parametrize("changes,field,value", [
    (dict(n_embd=768, n_head=7), "n_head", "7"),
    (dict(query="quadratic"), "model.query", "quadratic"),
    (dict(query="nonlinear", nonlinear_rank=0), "model.nonlinear_rank", "0"),
    (dict(nonlinear_rank=-3), "model.nonlinear_rank", "-3"),
    (dict(dropout=1.0), "model.dropout", "1.0"),
    (dict(dropout=-0.1), "model.dropout", "-0.1"),
    (dict(mlp_ratio=0.0), "model.mlp_ratio", "0.0"),
    (dict(nonlinear_activation="tanh"), "model.nonlinear_activation", "tanh"),
])
def test_bad_model_config_names_field_and_value(changes, field, value):
    with pytest.raises(ValueError) as info:
        ModelConfig(**changes)
    assert field in str(info.value) and value in str(info.value)


def test_overrides_convert_to_field_types():
    config = apply_overrides(RunConfig(), [
        "--model.query=nonlinear", "--model.mlp_ratio=4.75", "--model.causal=false", "--model.nonlinear_rank=none",
        "--train.max_steps=1_000", "--train.lr=3e-3", "--train.batch_tokens=1e6", "--model.attn_scale=0.0625",
    ])
    assert config.model.query == "nonlinear" and config.model.mlp_ratio == 4.75 and config.model.causal is False
    assert config.model.nonlinear_rank is None and config.train.max_steps == 1000 and config.train.lr == 3e-3
    assert config.train.batch_tokens == 1_000_000 and config.model.attn_scale == 0.0625


@pytest.mark.parametrize("arg,message", [
    ("--train.max_steps=ten", "train.max_steps='ten' is not a valid int"),
    ("--train.max_steps=1.5", "train.max_steps='1.5' is not a valid int"),
    ("--model.causal=maybe", "model.causal='maybe' is not a valid bool"),
    ("--train.lr=nan", "train.lr='nan' is not a valid float"),
    ("--train.bogus=1", "unknown config key train.bogus"),
    ("--optim.lr=1", "unknown config section 'optim'"),
    ("--train.lr", "overrides look like --section.field=value"),
    ("--lr=1", "overrides look like --section.field=value"),
    ("--train.max_steps=0", "train.max_steps=0 must be a positive integer"),
])
def test_bad_overrides_are_one_line_errors(arg, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")) as info:
        apply_overrides(RunConfig(), [arg])
    assert "\n" not in str(info.value)


def test_config_files_round_trip(tmp_path):
    config = apply_overrides(RunConfig(), ["--model.query=nonlinear", "--train.lr=0.002"])
    save_config(config, tmp_path / "c.json")
    assert load_config(tmp_path / "c.json") == config
    (tmp_path / "c.yaml").write_text("model:\n  query: identity\ntrain:\n  lr: 0.001\n  max_steps: 5\n")
    loaded = load_config(tmp_path / "c.yaml")
    assert loaded.model.query == "identity" and loaded.train.max_steps == 5
    (tmp_path / "c.toml").write_text("[model]\nmlp_ratio = 4.5\n")
    assert load_config(tmp_path / "c.toml").model.mlp_ratio == 4.5
    (tmp_path / "bad.yaml").write_text("train:\n  max_steps: 'many'\n")
    with pytest.raises(ConfigError, match="train.max_steps='many' is not a valid int"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_parse_overrides_nests_sections():
    assert parse_overrides(["--a.b=1", "--a.c=x=y"]) == {"a": {"b": "1", "c": "x=y"}}


def test_train_config_validation():
    with pytest.raises(ConfigError, match="train.min_lr"):
        TrainConfig(lr=1e-3, min_lr=1e-2)


@pytest.mark.slow
def test_config_file_layers_over_the_preset_and_a_resumed_runs_config(byte_data, tmp_path):
    """One rule: preset (or the run's own config on resume), then the file's fields, then overrides; a field
    the file does not set keeps the layer below."""
    import json
    import subprocess
    import sys

    (tmp_path / "empty.yaml").write_text("{}\n")
    (tmp_path / "lr.yaml").write_text("train:\n  lr: 0.01\n  max_steps: 4\n")
    info = subprocess.run([sys.executable, "-m", "nlq", "info", "nano", "--config", str(tmp_path / "empty.yaml")],
                          capture_output=True, text=True).stdout
    assert "n_layer=2 n_embd=64" in info and "vocab_size=8192" in info
    from nlq.cli import main

    common = ["--model.vocab_size=257", "--model.block_size=32", "--train.batch_size=2", "--data.eval_windows=2",
              "--train.eval_every=2"]
    main(["train", "--data", str(byte_data), "--out", str(tmp_path / "run"), "--preset", "nano",
          "--train.max_steps=2", *common])
    main(["train", "--out", str(tmp_path / "run"), "--resume", "--config", str(tmp_path / "lr.yaml")])
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["train"]["lr"] == 0.01 and saved["train"]["max_steps"] == 4  # from the file
    assert saved["model"]["n_embd"] == 64 and saved["data"]["dir"] == str(byte_data.resolve())  # kept from the run


def test_projections_q_is_another_name_of_model_query_resolved_when_read(byte_data, tmp_path, capsys):
    """--model.projections.q=nonlinear trains, logs and records query=nonlinear: one name per field."""
    from nlq.cli import main
    from nlq.config import RunConfig
    from nlq.overrides import apply_overrides

    config = apply_overrides(RunConfig(), ["--model.projections.q=nonlinear"])
    assert config.model.query == "nonlinear" and config.model.projections.q is None
    assert config.model.placements["q"] == "nonlinear"
    assert RunConfig.from_dict(config.to_dict()) == config
    main(["train", "--data", str(byte_data), "--out", str(tmp_path / "run"), "--preset", "nano",
          "--model.vocab_size=257",
          "--model.block_size=32", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2", "--train.max_steps=1",
          "--train.batch_size=2", "--data.eval_windows=2", "--model.projections.q=nonlinear"])
    assert "query=nonlinear" in capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["model"]
    assert saved["query"] == "nonlinear" and saved["projections"]["q"] is None


def test_the_nonlinear_options_old_names_are_read_into_the_new():
    """model.query_rank and friends configure the nonlinear projection at k, v or o too, so they were renamed
    model.nonlinear_*; committed configs, checkpoints and command lines with the old names still read."""
    recorded = {"model": {"query": "nonlinear", "query_rank": 16, "query_activation": "relu", "query_in_norm": False,
                          "query_out_norm": False}}
    model = RunConfig.from_dict(recorded).model
    assert (model.nonlinear_rank, model.nonlinear_activation, model.nonlinear_in_norm, model.nonlinear_out_norm) \
        == (16, "relu", False, False)
    assert "query_rank" not in RunConfig.from_dict(recorded).to_dict()["model"]
    with pytest.raises(ConfigError, match="model.nonlinear_rank=0 must be > 0 .model.query_rank is read as"):
        apply_overrides(RunConfig(), ["--model.query=nonlinear", "--model.query_rank=0"])
    with pytest.raises(ConfigError, match="model.query_rank is model.nonlinear_rank's old name, and both are given"):
        apply_overrides(RunConfig(), ["--model.nonlinear_rank=4", "--model.query_rank=4"])


def test_a_model_config_built_from_a_runs_config_json_by_hand_says_how_to_build_it(byte_data, tmp_path):
    import json

    from helpers import train_small
    from nlq.config import ConfigError, ModelConfig, RunConfig

    run = train_small(byte_data, tmp_path / "run")
    saved = json.loads((run / "config.json").read_text())
    with pytest.raises(ConfigError, match="RunConfig.from_dict"):
        ModelConfig(**saved["model"])
    assert RunConfig.from_dict(saved).model.n_embd == saved["model"]["n_embd"]

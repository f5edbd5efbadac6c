import subprocess
import sys

import pytest

from nlq.cli import main


def run_cli(capsys, *argv):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
        raise SystemExit(0)
    out = capsys.readouterr()
    return info.value.code, out.out, out.err


@pytest.mark.parametrize("override,count", [
    ("--model.query=linear", "84,953,856"), ("--model.query=nonlinear", "84,972,288"),
    ("--model.query=identity", "77,875,968"), ("--model.mlp_ratio=4.75", "95,570,688"),
])
def test_info_prints_paper_counts(capsys, override, count):
    code, out, _ = run_cli(capsys, "info", "gpt3-small", override)
    assert code == 0 and f"non-embedding parameters: {count}" in out
    assert "training FLOPs per token" in out and "attention query" in out


@pytest.mark.parametrize("argv,needle", [
    (["info", "gpt3-small", "--model.n_head=7"], "model.n_embd=768 is not divisible by model.n_head=7"),
    (["info", "gpt3-small", "--model.query=cubic"], "model.query='cubic'"),
    (["info", "gpt3-small", "--model.nonlinear_rank=0"], "model.nonlinear_rank=0"),
    (["info", "gpt3-small", "--model.dropout=1.5"], "model.dropout=1.5"),
    (["info", "gpt3-small", "--model.mlp_ratio=0"], "model.mlp_ratio=0.0"),
    (["info", "nope"], "unknown preset 'nope'"),
])
def test_bad_input_is_one_line_error(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_console_entry_point_runs():
    """The `nlq` script pip installed beside this interpreter (not python -m nlq)."""
    from pathlib import Path

    script = Path(sys.executable).parent / "nlq"
    assert script.is_file(), f"no console script at {script}; pip install -e . creates it"
    result = subprocess.run([str(script), "info", "nano", "--model.n_head=3"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip().startswith("nlq info: error: model.n_embd=64")


def test_train_help_lists_every_config_field_with_default_choices_and_help():
    import dataclasses

    from nlq.config import RunConfig

    def leaves(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            key = f"{prefix}.{f.name}"
            yield from leaves(value, key) if dataclasses.is_dataclass(value) else [key]

    def helps(obj):
        for f in dataclasses.fields(obj):
            assert f.metadata.get("help", "").strip(), f"{type(obj).__name__}.{f.name} has no help text"
            if dataclasses.is_dataclass(getattr(obj, f.name)):
                helps(getattr(obj, f.name))

    expected = [key for section in ("model", "data", "train", "dist")
                for key in leaves(getattr(RunConfig(), section), section)]
    out = subprocess.run([sys.executable, "-m", "nlq", "train", "--help"], capture_output=True, text=True).stdout
    listed = [line.split("=")[0].strip()[2:] for line in out.splitlines() if line.startswith("  --")
              and "." in line.split("=")[0]]
    assert listed == expected
    assert "--model.query=STR  (default 'linear'; choices: linear, identity, residual, nonlinear)" in out
    helps(RunConfig())  # every field, sections included, carries its help text, and --help prints it under the flag
    lines = out.splitlines()
    flag = next(i for i, line in enumerate(lines) if line.startswith("  --train.loss_chunk="))
    assert lines[flag + 1].strip() == dataclasses.fields(RunConfig().train)[-1].metadata["help"]
    flags = [i for i, line in enumerate(lines) if line.startswith("  --") and "." in line.split("=")[0]]
    assert all(lines[i + 1].startswith("      ") and lines[i + 1].strip() for i in flags)


def test_preset_help_lists_every_preset(capsys):
    from nlq.cli import main, preset_names
    from nlq.presets import PRESETS

    assert preset_names() == list(PRESETS) and "encoder" in PRESETS
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in PRESETS)

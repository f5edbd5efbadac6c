"""Edges a new user found (issue 21): outputs that must never delete what they did not write, a lock that a symlink
must not defeat, imports and exports that are atomic, checksummed model files, exported tokenizers, and batched
generation of an exported custom model."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from conftest import SMALL, train_small
from nlq.cli import main

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def run_dir(byte_data, tmp_path_factory):
    return train_small(byte_data, tmp_path_factory.mktemp("edges") / "run")


@pytest.fixture(scope="module")
def nonlinear_run(byte_data, tmp_path_factory):
    return train_small(byte_data, tmp_path_factory.mktemp("edges") / "nonlinear", "--model.query=nonlinear")


def snapshot(folder):
    """Every file under folder with the hash of its contents."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, argv, needle):
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err


# ---- 11: no output deletes or overwrites what nlq did not write as that output -----------------------------------

def test_no_output_lands_at_inside_or_around_a_run_or_a_dataset(run_dir, byte_data, tmp_path, capsys):
    run = tmp_path / "runs" / "run"
    shutil.copytree(run_dir, run)
    data = tmp_path / "data"
    shutil.copytree(byte_data, data)
    before = {"run": snapshot(run), "data": snapshot(data)}
    step = next((run / "checkpoints").glob("step_*.pt"))
    cases = [
        (["export", run, "--to", "hf", run, "--overwrite"], "is, contains or lies inside"),
        (["export", step, "--to", "hf", run / "checkpoints", "--overwrite"], "is, contains or lies inside"),
        (["export", run, "--to", "hf", run.parent, "--overwrite"], "is, contains or lies inside"),
        (["export", run, "--to", "hf", data, "--overwrite"], "not an nlq export"),
        (["prepare", "--source", "shakespeare", "--tokenizer", "byte", "--out", run, "--overwrite"],
         "not an nlq data directory"),
        (["prepare", "--source", "shakespeare", "--tokenizer", "byte", "--out", run.parent, "--overwrite"],
         "not an nlq data directory"),
        (["train", "--data", data, "--out", data, "--preset", "nano", *SMALL, "--train.max_steps=2"],
         "holds files but no run"),
        (["train", "--data", data, "--out", run.parent, "--preset", "nano", *SMALL, "--train.max_steps=2"],
         "holds files but no run"),
    ]
    for argv, needle in cases:
        refused(capsys, argv, needle)
        assert {"run": snapshot(run), "data": snapshot(data)} == before, argv
    export = tmp_path / "export"  # an earlier export is replaced with --overwrite, and only with it
    main(["export", str(run), "--to", "hf", str(export)])
    capsys.readouterr()
    refused(capsys, ["export", run, "--to", "hf", export], "pass --overwrite")
    main(["export", str(run), "--to", "hf", str(export), "--overwrite"])
    assert (export / "nlq_export.json").is_file() and (export / "config.json").is_file()


# ---- 12: a symlink does not defeat the run lock -----------------------------------------------------------------

def test_training_a_run_through_a_symlink_takes_the_same_lock(run_dir, tmp_path, capsys):
    from nlq.lock import directory_lock

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    with directory_lock(run, "the test"):  # as a running nlq train holds it
        refused(capsys, ["train", "--out", link, "--resume", "--train.max_steps=6"], "in use by another nlq process")


# ---- 13: import-checkpoint and export are atomic; their killed temporaries are cleaned -------------------------

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
    refused(capsys, ["import-checkpoint", source, "--out", out], "No space left")
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


# ---- 14: model.safetensors is checksummed ----------------------------------------------------------------------

def test_a_flipped_byte_in_model_safetensors_is_caught(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    path = run / "model.safetensors"
    raw = bytearray(path.read_bytes())
    header = int.from_bytes(raw[:8], "little")
    raw[8 + header + (len(raw) - 8 - header) // 2] ^= 0x40  # an exponent bit in the middle of the weights
    path.write_bytes(bytes(raw))
    refused(capsys, ["eval", path], "is corrupt")
    refused(capsys, ["export", path, "--to", "hf", tmp_path / "hf"], "is corrupt")
    refused(capsys, ["sample", path, "--prompt", "a"], "is corrupt")


# ---- 8: export finds the tokenizer of a model.safetensors and of a checkpoint copied out of its run -------------

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


# ---- 9: a left-padded batch generates what each row generates alone ----------------------------------------------

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


# ---- 16, 17: hangs and misleading messages -----------------------------------------------------------------------

def test_eval_of_a_task_run_says_it_has_no_val_split(tmp_path, capsys):
    main(["train", "--out", str(tmp_path / "task"), "--preset", "nano", "--data.task=mqar", "--data.task_vocab=8",
          "--data.task_pairs=2", "--model.vocab_size=64", "--model.block_size=16", "--train.max_steps=2",
          "--train.eval_every=2", "--data.eval_windows=4"])
    refused(capsys, ["eval", tmp_path / "task"], "synthetic task (mqar)")


def test_init_from_a_decoder_into_an_encoder_does_not_ask_for_what_is_set(run_dir, byte_data, tmp_path, capsys):
    argv = ["train", "--data", byte_data, "--out", tmp_path / "enc", f"--train.init_from={run_dir}",
            "--model.causal=false", "--train.objective=mlm", "--train.max_steps=2"]
    with pytest.raises(SystemExit):
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "set --model.causal=false" not in err and "vocab" in err, err  # the real reason: the mask token needs an id


def test_more_shards_than_work_is_refused(byte_data, tmp_path, capsys):
    refused(capsys, ["study", "cpu", "--out", tmp_path / "s", "--data", byte_data, "--shard", "1/1000"],
            "at most 18 shards")
    refused(capsys, ["study", "cpu", "--out", tmp_path / "s", "--data", byte_data, "--shard", ""], "is not K/N")


def test_a_shard_whose_partners_never_start_gives_up_with_a_message(tmp_path, monkeypatch):
    from nlq.errors import UserError
    from nlq.studies import study as study_module
    from nlq.studies.probes import base
    from nlq.studies.study import LINEAR, DataSpec, Run, Study, run_study

    def fake_train(config, run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text('{"final_step": 2, "val_loss": 1.0, "tokens_per_s": 1.0}')

    monkeypatch.setattr(study_module, "_train_run", fake_train)
    monkeypatch.setattr(study_module, "WAIT_POLL_S", 0.01)
    monkeypatch.setattr(study_module, "WAIT_UNSTARTED_S", 0.05)
    task = {"data": {"task": "mqar", "task_vocab": 8, "task_pairs": 2}, "train": {"max_steps": 2}}
    study = Study("lonely", "", base(), [LINEAR], seeds=[1], data=DataSpec("task", "none"))
    study.stages = lambda study_dir: iter([[Run(study, LINEAR, s, None, task, tag="r") for s in range(1, 5)]])
    with pytest.raises(UserError, match=r"shard\(s\) 2/2 have not started"):
        run_study(study, tmp_path, log=lambda *_: None, shard=(1, 2))


def test_prepare_says_when_the_corpus_has_fewer_merges_than_asked(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(20):
        (docs / f"{i}.txt").write_text("abc abd abe " * 50)
    main(["prepare", "--source", str(docs), "--tokenizer", "bpe:5000", "--out", str(tmp_path / "data"),
          "--val-fraction", "0.5"])
    assert "the corpus supports no more merges than that, not 5,000" in capsys.readouterr().out


def test_a_malicious_checkpoint_in_a_run_is_not_loaded_and_not_called_corrupt(run_dir, tmp_path, capsys):
    import pickle

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    for old in (run / "checkpoints").glob("step_*.pt"):
        old.unlink()
    torch.save({"model": Payload(), "step": 4, "config": {}}, run / "checkpoints" / "step_0000004.pt",
               pickle_protocol=pickle.HIGHEST_PROTOCOL)
    refused(capsys, ["eval", run / "checkpoints"], "was not loaded")
    assert not (tmp_path / "pwned").exists()


# ---- issue "plans", item 9: two inputs an outside probe still found ------------------------------------------------

def test_export_into_a_symlink_loop_is_one_line_and_writes_nothing(run_dir, tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")  # points at itself
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(capsys, ["export", run_dir, "--to", "hf", loop], "symlink loop")
    refused(capsys, ["export", run_dir, "--to", "hf", loop / "inside"], "symlink loop")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("key,value", [("n_embd", "16"), ("n_layer", 2.0), ("dropout", "0.1"), ("scale", "0.125")])
def test_a_paper_checkpoint_with_a_string_for_a_number_is_refused(tmp_path, capsys, key, value):
    from test_interop import paper_checkpoint

    ckpt = paper_checkpoint("residual_gelu")
    ckpt["model_args"][key] = value
    torch.save(ckpt, tmp_path / "ckpt.pt")
    needle = {"scale": "attn_scale"}.get(key, key)
    refused(capsys, ["import-checkpoint", tmp_path / "ckpt.pt", "--out", tmp_path / "run"], needle)
    assert not (tmp_path / "run").exists()

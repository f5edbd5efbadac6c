"""What must hold whatever the user types or the machine does: every bad input is a one-line error with exit
status 2 (never a traceback), and faults (flipped bytes, a second writer, a full disk, kill -9) lose nothing
and leave nothing half-written behind. docs/RELIABILITY.md lists these guarantees."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from helpers import SMALL, one_line_error
from nlq.cli import main


def copy_run(run_dir, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(run_dir, target)
    return target


# ---- bad inputs: (what, argv builder, expected words) ----------------------------------------------------------------

BAD_INPUTS = [
    ("negative seed", lambda d, r, t: ["train", "--data", d, "--out", t / "x", "--preset", "nano", "--train.seed=-1"],
     "train.seed=-1 must be a non-negative integer"),
    ("batch that cannot be allocated", lambda d, r, t: ["train", "--data", d, "--out", t / "x", "--preset", "nano",
                                                        "--train.batch_size=1e8"], "lower train.batch_size"),
    ("context that cannot be allocated", lambda d, r, t: ["train", "--data", d, "--out", t / "x", "--preset", "nano",
                                                          "--model.block_size=1e8"], "GiB"),
    ("a million layers", lambda d, r, t: ["train", "--data", d, "--out", t / "x", "--preset", "nano",
                                          "--model.n_layer=1e6"], "lower model.n_layer"),
    ("zero-width MLP", lambda d, r, t: ["info", "nano", "--model.mlp_ratio=0.001"], "0 hidden units"),
    ("unknown key", lambda d, r, t: ["info", "nano", "--model.widht=3"], "unknown config key model.widht"),
    ("non-positive rope base", lambda d, r, t: ["info", "nano", "--model.position=rope", "--model.rope_theta=-1"],
     "model.rope_theta=-1.0 must be > 0"),
    ("wrong type", lambda d, r, t: ["info", "nano", "--model.n_layer=two"], "model.n_layer='two' is not a valid int"),
    ("infinite lr on the command line", lambda d, r, t: ["info", "nano", "--train.lr=inf"], "train.lr='inf'"),
    ("infinite lr in YAML", lambda d, r, t: ["info", "nano", "--config", yaml_file(t, "train:\n  lr: .inf\n")],
     "train.lr=inf is not a valid float"),
    ("missing config file", lambda d, r, t: ["info", "nano", "--config", t / "nope.yaml"], "does not exist"),
    ("temperature nan", lambda d, r, t: ["sample", r, "--prompt", "a", "--temperature", "nan"], "--temperature nan"),
    ("temperature inf", lambda d, r, t: ["sample", r, "--prompt", "a", "--temperature", "inf"], "--temperature inf"),
    ("negative temperature", lambda d, r, t: ["sample", r, "--prompt", "a", "--temperature", "-1"],
     "finite number >= 0"),
    ("negative sampling seed", lambda d, r, t: ["sample", r, "--prompt", "a", "--seed", "-3"], "--seed -3"),
    ("no samples", lambda d, r, t: ["sample", r, "--prompt", "a", "--num-samples", "0"], "--num-samples"),
    ("prepare onto a file", lambda d, r, t: ["prepare", "--source", "shakespeare", "--tokenizer", "byte", "--out",
                                             touch(t / "afile"), "--overwrite"], "is a file"),
    ("train onto a file", lambda d, r, t: ["train", "--data", d, "--out", touch(t / "afile"), "--preset", "nano"],
     "--out"),
    ("study onto a file", lambda d, r, t: ["study", "cpu", "--out", touch(t / "afile")], "is a file, not a directory"),
    ("study on data that was never prepared",
     lambda d, r, t: ["study", "cpu", "--out", t / "s", "--data", t / "nodata"],
     "is not a prepared data directory (no meta.json); run nlq prepare"),
    ("export onto a file", lambda d, r, t: ["export", r, "--to", "hf", touch(t / "afile")], "OUT_DIR"),
    ("vocab_size as a string", lambda d, r, t: ["train", "--data", edited_data(d, t, vocab_size="257"), "--out",
                                                t / "x", "--preset", "nano", *SMALL], "not a positive integer"),
    ("an empty val split", lambda d, r, t: ["train", "--data", edited_data(d, t, val_tokens=0), "--out", t / "x",
                                            "--preset", "nano", *SMALL], "val split holds 0 tokens"),
    ("truncated study.json", lambda d, r, t: ["report", study_with(t, study="{\"runs\": [")], "truncated or not JSON"),
    ("truncated summary.json", lambda d, r, t: ["report", study_with(t, summary="{\"val_loss\": 4.")],
     "truncated or not JSON"),
    ("eval of a missing checkpoint", lambda d, r, t: ["eval", t / "nothing.pt"], "does not exist"),
    ("export into a non-empty directory", lambda d, r, t: ["export", r, "--to", "hf", touch(t / "full" / "f").parent],
     "not an nlq export"),
    ("resume a run that is not there, with a config lacking data", lambda d, r, t: ["train", "--out", t / "new",
                                                                                    "--resume"], "no data directory"),
    # imports of malformed paper checkpoints (nanoGPT format)
    ("paper model_args a list", lambda d, r, t: ["import-checkpoint", paper_file(t, args=[1, 2]), "--out", t / "x"],
     "model_args is a list"),
    ("paper model_args without n_embd", lambda d, r, t: ["import-checkpoint", paper_file(t, drop_arg="n_embd"), "--out",
                                                         t / "x"], "lacks n_embd"),
    ("paper weights without wte", lambda d, r,
     t: ["import-checkpoint", paper_file(t, drop_weight="wte.weight"), "--out",
                                                   t / "x"], "not a checkpoint of the paper's model"),
    ("paper weights that are not tensors", lambda d, r, t: ["import-checkpoint", paper_file(t, weight_value=[1.0]),
                                                            "--out", t / "x"], "not a mapping of names to tensors"),
    ("paper weights of the wrong shape", lambda d, r,
     t: ["import-checkpoint", paper_file(t, weight_value=torch.zeros(3)),
                                                          "--out", t / "x"], "do not fit"),
    ("paper zero heads", lambda d, r, t: ["import-checkpoint", paper_file(t, arg=("num_heads", 0)), "--out", t / "x"],
     "model.n_head=0"),
    ("paper sizes as words", lambda d, r, t: ["import-checkpoint", paper_file(t, arg=("n_embd", "big")), "--out",
                                              t / "x"], "model.n_embd='big' is not a valid int"),
    ("paper checkpoint of ten million layers", lambda d, r, t: ["import-checkpoint",
                                                                paper_file(t, arg=("n_layer", 10_000_000)), "--out",
                                                                t / "x"], "not loaded"),
    ("paper checkpoint with a huge vocabulary as init_from", lambda d, r, t: [
        "train", "--data", d, "--out", t / "x", f"--train.init_from={paper_file(t, arg=('vocab_size', 10**11))}"],
     "not loaded"),
    # imports of malformed Hugging Face GPT-2 directories
    ("HF config.json not JSON", lambda d, r, t: ["import-checkpoint", hf_dir(t, config="{oops"), "--out", t / "x"],
     "is not JSON"),
    ("HF config without n_embd", lambda d, r, t: ["import-checkpoint", hf_dir(t, drop="n_embd"), "--out", t / "x"],
     "not a usable GPT-2 checkpoint"),
    ("HF weights missing", lambda d, r, t: ["import-checkpoint", hf_dir(t, weights=None), "--out", t / "x"],
     "holds no model.safetensors"),
    ("HF weights truncated", lambda d, r,
     t: ["import-checkpoint", hf_dir(t, weights=b"\x10\x00\x00"), "--out", t / "x"],
     "truncated or corrupt"),
    # a tampered model.safetensors
    ("model.safetensors config null", lambda d, r, t: ["eval", tampered_model(r, t, nlq_config="null")],
     "not an nlq model file"),
    ("model.safetensors config a list", lambda d, r, t: ["eval", tampered_model(r, t, nlq_config="[1]")],
     "not an nlq model file"),
    ("model.safetensors step a word", lambda d, r, t: ["eval", tampered_model(r, t, step="four")],
     "not an nlq model file"),
    ("model.safetensors of a huge model", lambda d, r, t: ["eval", tampered_model(r, t, n_layer=10**9)], "not loaded"),
    # a run's copy of its data's meta
    ("data_meta.json not JSON", lambda d, r, t: ["sample", run_with_meta(r, t, "{oops"), "--prompt", "a"],
     "truncated or not JSON"),
    ("data_meta.json without a tokenizer", lambda d, r, t: ["sample", run_with_meta(r, t, "{}"), "--prompt", "a"],
     "names no tokenizer"),
    ("data_meta.json a list", lambda d, r, t: ["eval", run_with_meta(r, t, "[]"), "--text", touch(t / "a.txt")],
     "does not hold a JSON object"),
    # config values that are nonsense, or hang
    ("a binary config file", lambda d, r, t: ["info", "nano", "--config", binary_file(t / "c.yaml")], "is not text"),
    ("a YAML alias bomb as a value", lambda d, r, t: ["info", "nano", "--config", yaml_file(t, ALIAS_BOMB)],
     "train.lr=[["),
    ("steps beyond any counter (flag)", lambda d, r, t: ["info", "nano", "--train.max_steps=99999999999999999999999"],
     "out of range"),
    ("steps beyond any counter (YAML)",
     lambda d, r, t: ["info", "nano", "--config", yaml_file(t, "train:\n  max_steps: 99999999999999999999999\n")],
     "out of range"),
    ("steps beyond any counter (TOML)", lambda d, r, t: ["info", "nano", "--config",
                                                         toml_file(t, "[train]\nmax_steps = 9223372036854775807\n"
                                                                      "warmup_steps = 99999999999999999999")],
     "out of range"),
    ("a huge query rank", lambda d, r, t: ["train", "--data", d, "--out", t / "x", "--preset", "nano",
                                           "--model.query=nonlinear", "--model.nonlinear_rank=1e9"], "GiB"),
    ("a BPE larger than any corpus", lambda d, r,
     t: ["prepare", "--source", "shakespeare", "--tokenizer", "bpe:100000000",
                                                      "--out", t / "x"], "from 258 to 1,048,576"),
    ("masked LM on a synthetic task", lambda d, r,
     t: ["train", "--out", t / "x", "--preset", "nano", "--data.task=mqar",
                                                      "--model.causal=false", "--train.objective=mlm",
                                                      "--model.vocab_size=256"], "use --train.objective=clm"),
    ("a summary whose val_loss is the word NaN", lambda d, r,
     t: ["report", study_with(t, summary='{"val_loss": "NaN"}')],
     "not a number"),
]

ALIAS_BOMB = ("train:\n  lr: [&a [1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b],"
              " &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e],"
              " &g [*f,*f,*f,*f,*f,*f,*f,*f,*f], &h [*g,*g,*g,*g,*g,*g,*g,*g,*g], &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]]\n")


def paper_file(tmp_path, args=None, drop_arg=None, drop_weight=None, weight_value=None, arg=None):
    """A small checkpoint in the paper's format (tests/test_interop.py builds it), made wrong in one way."""
    from test_interop import paper_checkpoint

    ckpt = paper_checkpoint("original")
    if args is not None:
        ckpt["model_args"] = args
    if drop_arg:
        del ckpt["model_args"][drop_arg]
    if arg:
        ckpt["model_args"][arg[0]] = arg[1]
    if drop_weight:
        del ckpt["model"]["_orig_mod.transformer." + drop_weight]
    if weight_value is not None:
        ckpt["model"]["_orig_mod.transformer.h.0.attn.c_proj.weight"] = weight_value
    path = tmp_path / "paper_ckpt.pt"
    torch.save(ckpt, path)
    return path


def hf_dir(tmp_path, config=None, drop=None, weights=b"keep"):
    """A tiny Hugging Face GPT-2 directory, made wrong in one way."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()  # the test reads stderr: no bars from building the fixture
    folder = tmp_path / "hf"
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=8, n_embd=16, n_layer=1,
                                                                 n_head=2, bos_token_id=None, eos_token_id=None))
    model.save_pretrained(folder)
    raw = json.loads((folder / "config.json").read_text())
    if drop:
        del raw[drop]
    (folder / "config.json").write_text(config if config is not None else json.dumps(raw))
    if weights is None:
        (folder / "model.safetensors").unlink()
    elif weights != b"keep":
        (folder / "model.safetensors").write_bytes(weights)
    return folder


def tampered_model(run_dir, tmp_path, nlq_config=None, step=None, n_layer=None):
    """A copy of a run's model.safetensors with its metadata changed (weights and checksum kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    source = run_dir / "model.safetensors"
    with safe_open(str(source), framework="pt") as f:
        metadata = dict(f.metadata())
    if nlq_config is not None:
        metadata["nlq_config"] = nlq_config
    if step is not None:
        metadata["step"] = step
    if n_layer is not None:
        config = json.loads(metadata["nlq_config"])
        config["model"]["n_layer"] = n_layer
        metadata["nlq_config"] = json.dumps(config)
    path = tmp_path / "model.safetensors"
    save_file(load_file(str(source)), str(path), metadata=metadata)
    return path


def run_with_meta(run_dir, tmp_path, text):
    run = copy_run(run_dir, tmp_path)
    (run / "data_meta.json").write_text(text)
    return run


def binary_file(path):
    path.write_bytes(bytes(range(256)) * 4)
    return path


def toml_file(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def yaml_file(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    return path


def edited_data(data, tmp_path, vocab_size=None, val_tokens=None):
    target = tmp_path / "data"
    shutil.copytree(data, target)
    meta = json.loads((target / "meta.json").read_text())
    if vocab_size is not None:
        meta["vocab_size"] = vocab_size
    if val_tokens is not None:
        meta["splits"]["val"]["tokens"] = val_tokens
        (target / "val.bin").write_bytes(b"")
    (target / "meta.json").write_text(json.dumps(meta))
    return target


def study_with(tmp_path, study=None, summary=None):
    folder = tmp_path / "study"
    (folder / "runs" / "a").mkdir(parents=True)
    (folder / "study.json").write_text(study or json.dumps({"runs": [{"name": "a", "variant": "linear", "seed": 1,
                                                                      "lr": 1e-3}], "baseline": "linear"}))
    (folder / "runs" / "a" / "summary.json").write_text(summary or "{}")
    return folder


@pytest.mark.parametrize("what,argv,needle", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_a_one_line_error(what, argv, needle, byte_data, run_dir, tmp_path, capsys):
    one_line_error(capsys, argv(byte_data, run_dir, tmp_path), needle)
    assert not (tmp_path / "x").exists()  # a refused start writes nothing, so the corrected retry is not refused


# ---- checkpoints: integrity ------------------------------------------------------------------------------------------

def flip_a_tensor_byte(path):
    """Flip one byte inside the largest tensor's data record of a torch zip checkpoint."""
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        offset = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def test_a_flipped_byte_is_caught_on_load_and_names_the_other_checkpoints(run_dir, tmp_path, capsys):
    run = copy_run(run_dir, tmp_path)
    flip_a_tensor_byte(run / "checkpoints" / "step_0000004.pt")
    err = one_line_error(capsys, ["eval", run], "is corrupt")
    assert "step_0000002.pt" in err
    one_line_error(capsys, ["train", "--out", run, "--resume", "--train.max_steps=6"], "is corrupt")


def test_a_checkpoint_whose_name_and_step_disagree_is_refused(run_dir, tmp_path, capsys):
    run = copy_run(run_dir, tmp_path)
    (run / "checkpoints" / "step_0000004.pt").rename(run / "checkpoints" / "step_0000009.pt")
    one_line_error(capsys, ["train", "--out", run, "--resume", "--train.max_steps=12"], "holds step 4")
    assert (run / "checkpoints" / "step_0000002.pt").is_file()  # nothing was rotated away


def test_resume_from_weights_that_do_not_fit_the_stored_config(run_dir, tmp_path, capsys):
    from nlq.runs.checkpoint import load_checkpoint, save_checkpoint

    run = copy_run(run_dir, tmp_path)
    payload = load_checkpoint(run / "checkpoints" / "step_0000004.pt")
    payload["model"]["blocks.0.mlp.up.weight"] = torch.zeros(7, 3)  # consistent checksum, wrong shape
    del payload["path"], payload["checksum"]
    (run / "checkpoints" / "step_0000004.pt").unlink()
    save_checkpoint(run, 4, payload, keep=5)
    one_line_error(capsys, ["train", "--out", run, "--resume", "--train.max_steps=6"], "do not fit the model")


# ---- ownership -------------------------------------------------------------------------------------------------------

def test_a_second_writer_is_refused_while_the_first_holds_the_run(run_dir, tmp_path, capsys):
    from nlq.lock import DirectoryLock

    run = copy_run(run_dir, tmp_path)
    with DirectoryLock(run.parent / f".{run.name}.lock", "the test"):  # as a running nlq train holds it
        one_line_error(capsys, ["train", "--out", run, "--resume", "--train.max_steps=6"],
                       "in use by another nlq process")
    main(["train", "--out", str(run), "--resume", "--train.max_steps=6"])  # free again: it continues
    assert json.loads((run / "summary.json").read_text())["final_step"] == 6


def test_a_second_prepare_of_the_same_dataset_is_refused(byte_data, tmp_path, capsys):
    from nlq.lock import DirectoryLock

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("hello world\n" * 50)
    with DirectoryLock(tmp_path / ".data.lock", "the test"):
        one_line_error(capsys, ["prepare", "--source", docs, "--tokenizer", "byte", "--out", tmp_path / "data"],
                       "in use by another nlq process")


# ---- a full disk -----------------------------------------------------------------------------------------------------

def test_a_full_disk_while_checkpointing_is_a_one_line_error_and_loses_nothing(run_dir, tmp_path, capsys, monkeypatch):
    """torch's zip writer raises RuntimeError on ENOSPC; the half-written temporary file goes, and the
    earlier checkpoints stay (injected: no small tmpfs can be mounted here without privileges)."""
    run = copy_run(run_dir, tmp_path)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file "
                           "data/3: file write failed")

    monkeypatch.setattr(torch, "save", full_disk)
    one_line_error(capsys, ["train", "--out", run, "--resume", "--train.max_steps=6"], "cannot write checkpoint")
    monkeypatch.setattr(torch, "save", real_save)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_0000002.pt", "step_0000004.pt"]  # no temporary left, nothing lost


def test_an_unwritable_output_is_a_one_line_error(byte_data, tmp_path, capsys, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "data"))

    monkeypatch.setattr("nlq.data.shards.atomic_directory", no_space)
    one_line_error(capsys, ["prepare", "--source", "shakespeare", "--tokenizer", "byte", "--out", tmp_path / "data"],
                   "No space left on device")


# ---- kill -9 ---------------------------------------------------------------------------------------------------------

KILL_DURING_SAVE = """
import os, signal, sys, torch
real = torch.save
def dying(obj, f, *a, **k):
    if obj["step"] == {step}:
        f.write(b"half a checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(obj, f, *a, **k)
torch.save = dying
from nlq.cli import main
main(sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.parametrize("step", [2, 4])
def test_kill_9_during_a_checkpoint_write_loses_nothing_and_leaves_no_temp(byte_data, tmp_path, step):
    script = tmp_path / "die.py"
    script.write_text(KILL_DURING_SAVE.replace("{step}", str(step)))
    args = ["train", "--data", str(byte_data), "--out", str(tmp_path / "run"), "--preset", "nano", *SMALL,
            "--train.max_steps=6", "--train.checkpoint_every=2", "--train.keep_checkpoints=5"]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert result.returncode == -signal.SIGKILL
    assert list((tmp_path / "run" / "checkpoints").glob(".step_*.tmp-*"))  # the half-written file is there
    main([*args, "--resume"])
    assert not list((tmp_path / "run" / "checkpoints").glob(".*"))  # and gone after the next start
    main(["train", "--data", str(byte_data), "--out", str(tmp_path / "straight"), "--preset", "nano", *SMALL,
          "--train.max_steps=6", "--train.checkpoint_every=2"])
    from nlq.runs.metrics import read_metrics

    def curve(run):
        return [(r["step"], r["train_loss"]) for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]

    assert curve(tmp_path / "run") == curve(tmp_path / "straight")  # bitwise: the resume redid the lost steps


@pytest.mark.slow
def test_kill_9_during_prepare_leaves_nothing_and_the_next_prepare_cleans_up(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(400):
        (docs / f"{i}.txt").write_text(f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 400)
    args = [sys.executable, "-m", "nlq", "prepare", "--source", str(docs), "--tokenizer", "bpe:4000", "--out",
            str(tmp_path / "data")]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob(".data.tmp-*")):  # wait until it writes
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "data").exists()  # nothing half-written under the real name
    leftovers = list(tmp_path.glob(".data.tmp-*"))
    assert leftovers
    assert subprocess.run(args, capture_output=True).returncode == 0
    assert not list(tmp_path.glob(".data.tmp-*")) and (tmp_path / "data" / "meta.json").is_file()


def test_sampling_draws_only_ids_the_tokenizer_has():
    """A model whose vocabulary is padded (320) past its byte tokenizer's (257) must not draw the padding ids,
    which the tokenizer would drop silently."""
    from helpers import tiny_model_config
    from nlq.generate import generate
    from nlq.model import Transformer

    model = Transformer(tiny_model_config(vocab_size=320, block_size=16)).eval()
    with torch.no_grad():
        model.lm_head.weight[257:] += 5.0  # make the padding ids the most likely ones
    out = generate(model, torch.zeros(4, 1, dtype=torch.long), 30, temperature=2.0, top_k=None,
                   generator=torch.Generator().manual_seed(0), vocab_limit=257)
    assert int(out.max()) < 257
    unrestricted = generate(model, torch.zeros(4, 1, dtype=torch.long), 30, temperature=2.0,
                            generator=torch.Generator().manual_seed(0))
    assert int(unrestricted.max()) >= 257  # the test would notice a missing limit


def test_a_flipped_byte_in_a_data_shard_is_caught_on_load(byte_data, tmp_path, capsys):
    target = tmp_path / "data"
    shutil.copytree(byte_data, target)
    raw = bytearray((target / "train.bin").read_bytes())
    raw[len(raw) // 2] ^= 0x01  # still a valid byte id: only the checksum can tell
    (target / "train.bin").write_bytes(bytes(raw))
    one_line_error(capsys, ["train", "--data", target, "--out", tmp_path / "x", "--preset", "nano", *SMALL],
                   "train.bin is corrupt: its checksum does not match meta.json")


# ---- No output deletes what it did not write; a symlink does not defeat the lock; model files are checked ------------

def snapshot(folder):
    """Every file under folder with the hash of its contents."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


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
        one_line_error(capsys, argv, needle)
        assert {"run": snapshot(run), "data": snapshot(data)} == before, argv
    export = tmp_path / "export"  # an earlier export is replaced with --overwrite, and only with it
    main(["export", str(run), "--to", "hf", str(export)])
    capsys.readouterr()
    one_line_error(capsys, ["export", run, "--to", "hf", export], "pass --overwrite")
    main(["export", str(run), "--to", "hf", str(export), "--overwrite"])
    assert (export / "nlq_export.json").is_file() and (export / "config.json").is_file()


def test_training_a_run_through_a_symlink_takes_the_same_lock(run_dir, tmp_path, capsys):
    from nlq.lock import directory_lock

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    with directory_lock(run, "the test"):  # as a running nlq train holds it
        one_line_error(capsys, ["train", "--out", link, "--resume", "--train.max_steps=6"],
                       "in use by another nlq process")


def test_a_flipped_byte_in_model_safetensors_is_caught(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    path = run / "model.safetensors"
    raw = bytearray(path.read_bytes())
    header = int.from_bytes(raw[:8], "little")
    raw[8 + header + (len(raw) - 8 - header) // 2] ^= 0x40  # an exponent bit in the middle of the weights
    path.write_bytes(bytes(raw))
    one_line_error(capsys, ["eval", path], "is corrupt")
    one_line_error(capsys, ["export", path, "--to", "hf", tmp_path / "hf"], "is corrupt")
    one_line_error(capsys, ["sample", path, "--prompt", "a"], "is corrupt")


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
    one_line_error(capsys, ["eval", run / "checkpoints"], "was not loaded")
    assert not (tmp_path / "pwned").exists()

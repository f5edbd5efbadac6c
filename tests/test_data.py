import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from nlq.cli import main
from nlq.data.batches import BatchPlan, eval_starts, step_rng
from nlq.data.shards import load_data, prepare
from nlq.data.sources import get_source, split_scenes, strip_play_markup
from nlq.data.tokenizers import BPETokenizer, ByteTokenizer, gpt2_from_files, load_tokenizer
from nlq.errors import UserError

TEXT = "Now is the winter of our discontent\nMade glorious summer by this sun of York. Ünïcödé ✓ 🎭\n"


def quiet(*_):
    pass


def write_docs(folder, n=40, suffix=".txt"):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc{i:03d}{suffix}").write_text(f"Document {i}. " + TEXT * (1 + i % 3))
    return folder


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "bpe"
    prepare(str(write_docs(out.parent / "docs")), "bpe:300", out, log=quiet, val_fraction=0.2)
    return out


# ---- tokenizers ------------------------------------------------------------------------------------------------------

def test_byte_round_trip():
    tok = ByteTokenizer()
    (ids,) = tok.encode_batch([TEXT])
    assert ids.max() < 256 and tok.decode(list(ids) + [tok.eot_id]) == TEXT


def test_bpe_round_trip_and_reload(bpe_dir):
    tok = load_tokenizer(bpe_dir, "bpe:300")
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 300
    (ids,) = tok.encode_batch([TEXT])
    assert len(ids) < len(TEXT.encode())  # it merged something
    assert tok.decode(ids) == TEXT


def write_data_gym_files(directory):
    """GPT-2's file format (vocab.bpe + encoder.json) for a tiny vocabulary: the 256 bytes and two merges."""
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    byte_to_char = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in byte_to_char:
            byte_to_char[b] = chr(256 + n)
            n += 1
    encoder = {byte_to_char[b]: i for i, b in enumerate(printable + [b for b in range(256) if b not in printable])}
    merges = [("t", "h"), ("th", "e")]
    for a, b in merges:
        encoder[a + b] = len(encoder)
    (directory / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    (directory / "encoder.json").write_text(json.dumps(encoder))


def test_gpt2_loads_from_local_files_and_round_trips(tmp_path):
    write_data_gym_files(tmp_path)
    tok = gpt2_from_files(tmp_path)
    (ids,) = tok.encode_batch(["the theme"])
    assert tok.eot_id == 258 and len(ids) == 5  # "the", " ", "the", "m", "e"
    assert tok.decode(list(ids)) == "the theme"
    (ids,) = tok.encode_batch([TEXT])
    assert tok.decode(ids) == TEXT


def test_gpt2_offline_is_a_clear_error(tmp_path):
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path), NLQ_GPT2_DIR="")
    code = ("from nlq.data.tokenizers import gpt2\ntry:\n    gpt2()\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("UserError") and "gpt2:DIR" in out


# ---- sources and prepare ---------------------------------------------------------------------------------------------

def test_shakespeare_markup_is_stripped():
    play = ("# Title\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ROMEO_\n\n"
            "**ROMEO**  \nHe jests at scars\\[1]  \n\n### SCENE II.\n\nx\n")
    scenes = split_scenes(play)
    assert len(scenes) == 2
    text = strip_play_markup(scenes[0])
    assert text == "Title\n\nACT I\n\nSCENE I. A room.\n\nEnter ROMEO\n\nROMEO:\nHe jests at scars[1]\n"


def test_shakespeare_source_is_offline_and_large():
    docs = list(get_source("shakespeare").documents())
    assert len(docs) > 700 and sum(map(len, docs)) > 4_000_000
    assert not any("**" in d or "\\[" in d for d in docs)


@pytest.mark.slow
def test_python_stdlib_source_skips_tests():
    """Every document is a non-test file of the standard library, and no test file's text is among them."""
    import hashlib
    import sysconfig
    from pathlib import Path

    from nlq.data.sources import _is_test_path

    source = get_source("python-stdlib")
    assert source.meta["python_version"] == sys.version.split()[0]
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.rglob("*.py"))
    tests = [f for f in files if _is_test_path(f.relative_to(root))]
    kept = [f for f in files if not _is_test_path(f.relative_to(root))]
    assert len(tests) > 10 and any(f.name.startswith("test_") for f in tests)  # there are tests to skip
    digest = lambda text: hashlib.blake2b(text.encode(errors="replace")).digest()  # noqa: E731
    documents = [digest(d) for d in source.documents()]
    assert len(documents) == len(kept)
    kept_texts = {digest(f.read_bytes().decode("utf-8", errors="replace")) for f in kept}
    leaked = [f for f in tests if (h := digest(f.read_bytes().decode("utf-8", errors="replace"))) in set(documents)
              and h not in kept_texts]
    assert not leaked, leaked[:3]


def test_prepare_writes_shards_and_meta(bpe_dir):
    meta = json.loads((bpe_dir / "meta.json").read_text())
    data = load_data(bpe_dir)
    assert meta["dtype"] == "uint16" and data.train.dtype == np.uint16
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 40
    assert meta["splits"]["val"]["documents"] > 0 and len(data.val) == meta["splits"]["val"]["tokens"]
    assert (data.train == meta["eot_id"]).sum() == meta["splits"]["train"]["documents"]  # one EOT per document
    assert meta["source_hash"] and meta["replaced_bytes"] == 0
    assert not list(bpe_dir.parent.glob(".bpe.tmp-*"))


def test_split_is_deterministic_and_document_level(tmp_path):
    docs = write_docs(tmp_path / "docs")
    a = prepare(str(docs), "byte", tmp_path / "a", log=quiet)
    b = prepare(str(docs), "byte", tmp_path / "b", log=quiet)
    assert a["splits"] == b["splits"]
    assert (tmp_path / "a" / "val.bin").read_bytes() == (tmp_path / "b" / "val.bin").read_bytes()
    c = prepare(str(docs), "byte", tmp_path / "c", log=quiet, seed=7)
    assert c["splits"] != a["splits"]


def test_jsonl_with_custom_field_and_undecodable_bytes(tmp_path):
    lines = [json.dumps({"body": f"record {i} {TEXT}", "text": "ignored"}) for i in range(30)]
    (tmp_path / "a.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b'{"body": "bad \xff\xfe bytes"}\n')
    meta = prepare(str(tmp_path / "a.jsonl"), "byte", tmp_path / "out", log=quiet, text_field="body")
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 31
    assert meta["replaced_bytes"] == 2
    data = load_data(tmp_path / "out")
    text = data.tokenizer().decode(np.concatenate([data.train, data.val]))
    assert "record 7" in text and "ignored" not in text and "\ufffd" in text


def test_hf_source_on_a_local_parquet_dataset(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "ds").mkdir()
    table = pa.table({"text": [f"row {i}: {TEXT}" for i in range(50)], "id": list(range(50))})
    pq.write_table(table, tmp_path / "ds" / "train.parquet")
    meta = prepare(f"hf:{tmp_path / 'ds'}", "byte", tmp_path / "out", log=quiet)
    assert meta["source"] == f"hf:{tmp_path / 'ds'}"
    assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 50


def test_hf_offline_says_what_to_do(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "nlq", "prepare", "--source", "hf:Skylion007/openwebtext",
                             "--tokenizer", "byte", "--out", str(tmp_path / "o")], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "prepare from local files instead" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("setup,source,tokenizer,needle", [
    (lambda p: (p / "e.txt").write_text(""), "e.txt", "byte", "no documents with text"),
    (lambda p: (p / "e.jsonl").write_text('{"other": 1}\n'), "e.jsonl", "byte", "is empty"),
    (lambda p: None, "missing.txt", "byte", "does not exist"),
    (lambda p: None, "wikipedia", "byte", "unknown source 'wikipedia'"),
    (lambda p: (p / "a.txt").write_text(TEXT), "a.txt", "sentencepiece", "unknown tokenizer"),
    (lambda p: (p / "one.txt").write_text(TEXT), "one.txt", "byte", "split is empty"),
])
def test_bad_prepare_input_is_a_clear_error_and_writes_nothing(tmp_path, setup, source, tokenizer, needle):
    setup(tmp_path)
    spec = str(tmp_path / source) if source != "wikipedia" else source
    with pytest.raises(UserError, match=needle):
        prepare(spec, tokenizer, tmp_path / "out", log=quiet)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_output_holding_other_data_is_refused_unless_overwrite(tmp_path):
    docs = write_docs(tmp_path / "docs")
    prepare(str(docs), "byte", tmp_path / "out", log=quiet)
    before = (tmp_path / "out" / "train.bin").read_bytes()
    with pytest.raises(UserError, match="holds a different dataset"):
        prepare(str(docs), "bpe:300", tmp_path / "out", log=quiet)
    assert (tmp_path / "out" / "train.bin").read_bytes() == before
    prepare(str(docs), "byte", tmp_path / "out", log=quiet)  # same inputs: reused
    assert prepare(str(docs), "bpe:300", tmp_path / "out", log=quiet, overwrite=True)["tokenizer"] == "bpe:300"
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(UserError, match="not an nlq data directory"):
        prepare(str(docs), "byte", tmp_path / "junk", log=quiet)


def test_truncated_or_out_of_vocab_shards_are_refused(tmp_path):
    prepare(str(write_docs(tmp_path / "docs")), "byte", tmp_path / "out", log=quiet)
    train = tmp_path / "out" / "train.bin"
    raw = train.read_bytes()
    train.write_bytes(raw[:-3])
    with pytest.raises(UserError, match="truncated or corrupt"):
        load_data(tmp_path / "out")
    bad = np.frombuffer(raw, dtype=np.uint16).copy()
    bad[5] = 999
    train.write_bytes(bad.tobytes())
    with pytest.raises(UserError, match="^\\S*train.bin is corrupt: its checksum does not match meta.json"):
        load_data(tmp_path / "out")
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    for split in meta["splits"].values():  # data prepared by nlq 0.1 has no checksums: the id check still holds
        split.pop("blake2b")
    (tmp_path / "out" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="token id 999, outside the vocabulary of 257"):
        load_data(tmp_path / "out")
    with pytest.raises(UserError, match="not a prepared data directory"):
        load_data(tmp_path / "docs")


# ---- batch plans -----------------------------------------------------------------------------------------------------

TOKENS = np.arange(10_000, dtype=np.uint16) % 5000


@pytest.mark.parametrize("mode", ["random", "epoch"])
def test_batch_plan_is_a_pure_function_of_seed_and_step(mode):
    a = BatchPlan(TOKENS, context=32, global_rows=8, seed=1, mode=mode)
    b = BatchPlan(TOKENS, context=32, global_rows=8, seed=1, mode=mode)
    for step in (5, 0, 5, 123):
        np.testing.assert_array_equal(a.starts(step), b.starts(step))
    assert not np.array_equal(a.starts(0), a.starts(1))
    assert not np.array_equal(a.starts(3), BatchPlan(TOKENS, 32, 8, seed=2, mode=mode).starts(3))
    x, y = a.batch(7)
    assert x.shape == (8, 32) and torch_equal(x[:, 1:], y[:, :-1])


def torch_equal(a, b):
    return bool((a == b).all())


@pytest.mark.slow
def test_batch_plan_is_identical_across_processes():
    code = ("import numpy as np; from nlq.data.batches import BatchPlan;"
            "t = np.arange(10_000, dtype=np.uint16) % 5000;"
            "print([BatchPlan(t, 32, 8, 3, m).starts(s).tolist() for m in ('random', 'epoch') for s in (0, 99)])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout for _ in range(2)}
    here = str([BatchPlan(TOKENS, 32, 8, 3, m).starts(s).tolist() for m in ("random", "epoch") for s in (0, 99)])
    assert outs == {here + "\n"}


@pytest.mark.parametrize("world,n_micro", [(2, 1), (2, 2), (4, 2)])
def test_rank_slices_are_disjoint_and_cover_the_global_batch(world, n_micro):
    plan = BatchPlan(TOKENS, context=16, global_rows=16, seed=0, mode="epoch")
    parts = [plan.rows(4, rank, world, micro, n_micro) for rank in range(world) for micro in range(n_micro)]
    np.testing.assert_array_equal(np.concatenate(parts), plan.starts(4))
    assert len(set(np.concatenate(parts).tolist())) == 16  # epoch windows never repeat within a step
    with pytest.raises(UserError, match="does not split"):
        plan.rows(0, 0, 3, 0, 1)


def test_epoch_mode_visits_every_window_once_per_epoch():
    plan = BatchPlan(TOKENS, context=100, global_rows=9, seed=0, mode="epoch")  # 99 windows = 11 steps
    starts = np.concatenate([plan.starts(s) for s in range(11)])
    assert sorted(starts.tolist()) == list(range(0, 9900, 100))


def test_eval_windows_and_step_rng_are_fixed():
    np.testing.assert_array_equal(eval_starts(TOKENS, 32, 10, 2357), eval_starts(TOKENS, 32, 10, 2357))
    assert step_rng(1, 2).random() == step_rng(1, 2).random() != step_rng(1, 3).random()
    with pytest.raises(UserError, match="fewer than one window"):
        BatchPlan(TOKENS[:10], context=32, global_rows=1, seed=0)


# ---- pypkg: the Python source of installed distributions -------------------------------------------------------------

def test_pypkg_corpus_order_names_and_hash_are_deterministic(tmp_path):
    import importlib.metadata

    from nlq.data.shards import prepare

    source = get_source("pypkg:tqdm,pyyaml")
    version = importlib.metadata.version("tqdm")
    assert source.name == f"pypkg:pyyaml=={importlib.metadata.version('pyyaml')},tqdm=={version}"  # sorted, versioned
    first, second = list(source.documents()), list(get_source("pypkg:pyyaml,tqdm").documents())
    assert first == second and len(first) > 10
    assert len(set(first)) == len(first)  # exact duplicates dropped
    metas = [prepare("pypkg:tqdm,pyyaml", "byte", tmp_path / name, log=lambda *_: None) for name in ("a", "b")]
    assert metas[0]["source_hash"] == metas[1]["source_hash"] and metas[0]["splits"] == metas[1]["splits"]
    assert metas[0]["source_meta"]["distributions"]["tqdm"] == version
    assert (tmp_path / "a" / "train.bin").read_bytes() == (tmp_path / "b" / "train.bin").read_bytes()


def test_pypkg_refuses_a_missing_distribution_or_one_without_source(monkeypatch):
    import importlib.metadata

    with pytest.raises(UserError, match="distribution 'no-such-dist' is not installed; pip install no-such-dist"):
        get_source("pypkg:torch,no-such-dist")

    class BinaryOnly:
        version, files = "1.0", []

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: BinaryOnly())
    with pytest.raises(UserError, match="has no Python source files"):
        get_source("pypkg:compiled-only")


def test_a_data_directory_from_other_package_versions_is_a_different_dataset(tmp_path, monkeypatch):
    """A study continued on a machine whose packages differ notices: the versioned source name differs."""
    import importlib.metadata

    from nlq.data.shards import prepare

    prepare("pypkg:tqdm", "byte", tmp_path / "d", log=lambda *_: None)
    real = importlib.metadata.distribution

    class Newer:
        def __init__(self, dist):
            self.dist, self.version, self.files = dist, "999.0", dist.files

        def locate_file(self, f):
            return self.dist.locate_file(f)

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Newer(real(name)))
    with pytest.raises(UserError, match="holds a different dataset.*tqdm==999.0"):
        prepare("pypkg:tqdm", "byte", tmp_path / "d", log=lambda *_: None)


# ---- A BPE that the corpus cannot fill says so -----------------------------------------------------------------------

def test_prepare_says_when_the_corpus_has_fewer_merges_than_asked(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(20):
        (docs / f"{i}.txt").write_text("abc abd abe " * 50)
    main(["prepare", "--source", str(docs), "--tokenizer", "bpe:5000", "--out", str(tmp_path / "data"),
          "--val-fraction", "0.5"])
    assert "the corpus supports no more merges than that, not 5,000" in capsys.readouterr().out


def test_hf_hub_unreachable_is_one_line_without_the_hubs_retry_warnings(tmp_path, monkeypatch, capfd):
    """Without HF_HUB_OFFLINE and without a network, huggingface_hub warns at each of its retries before it
    gives up: the user sees only nlq's one line."""
    import datasets
    import huggingface_hub  # noqa: F401  (its logger's handler writes to stderr)

    def unreachable(*args, **kwargs):
        logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 1s [Retry 1/5].")
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    level = logging.getLogger("huggingface_hub").level
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(UserError, match="prepare from local files instead"):
        prepare("hf:someone/some-corpus", "byte", tmp_path / "out", log=quiet)
    assert "Retrying" not in capfd.readouterr().err
    assert logging.getLogger("huggingface_hub").level == level  # put back as it was

"""The fixtures every test module can ask for; the plain helpers they use are in helpers.py. Every test process
trains on one thread (OMP_NUM_THREADS=1 unless the caller set it; subprocesses inherit it), so that the suite does
not oversubscribe the cores beside other work; a test about threads sets its own."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402 (after the thread count, which torch reads when it starts)
import torch  # noqa: E402

from helpers import SAMPLE_TEXT, train_small


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # a test that changed it leaves no trace


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory):
    """A small byte-level dataset prepared with nlq prepare (about 60 KB of text)."""
    from nlq.data.shards import prepare

    root = tmp_path_factory.mktemp("bytes")
    docs = root / "docs"
    docs.mkdir()
    for i in range(60):
        (docs / f"d{i:02d}.txt").write_text(f"Sonnet {i}.\n" + SAMPLE_TEXT * (2 + i % 5))
    prepare(str(docs), "byte", root / "data", log=lambda *_: None, val_fraction=0.15)
    return root / "data"


@pytest.fixture(scope="module")
def run_dir(byte_data, tmp_path_factory):
    """A finished 4-step nano run through the command line, with checkpoints at steps 2 and 4 (one per module:
    tests copy it before changing it)."""
    return train_small(byte_data, tmp_path_factory.mktemp("run") / "run")

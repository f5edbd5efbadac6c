"""`nlq prepare`: documents -> token shards (train.bin, val.bin) + tokenizer files + meta.json.

Documents go to train or val by a seeded hash of their position in the source, so the split is the same
on every machine. Tokenisation streams the source in chunks (bounded memory) and the tokenizers encode
each chunk on all cores. Everything is written into a temporary directory beside the output and renamed
into place at the end, so an interrupted or failed prepare leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nlq.data.sources import Source, get_source
from nlq.data.tokenizers import build_tokenizer, check_tokenizer_name, load_tokenizer
from nlq.errors import UserError
from nlq.fileio import atomic_directory, is_empty_dir, read_json, remove_stale, stale_siblings, write_json
from nlq.lock import directory_lock

FORMAT_VERSION = 1
SPLITS = ("train", "val")
CHUNK_CHARS = 8_000_000  # characters per tokenisation chunk: bounds memory, keeps all cores busy


def is_val(seed: int, index: int, val_fraction: float) -> bool:
    """Document index -> val with probability val_fraction, the same everywhere for a seed."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < val_fraction


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def chunks(docs: Iterator[str], chunk_chars: int) -> Iterator[list[str]]:
    chunk, size = [], 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc)
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _split_documents(source: Source, seed: int, val_fraction: float, split: str) -> Iterator[str]:
    for index, doc in enumerate(source.documents()):
        if doc.strip() and (is_val(seed, index, val_fraction) == (split == "val")):
            yield doc


def prepare(source_spec: str, tokenizer_name: str, out: str | Path, *, overwrite: bool = False,
            val_fraction: float = 0.05, seed: int = 2357, text_field: str = "text",
            doc_separator: str | None = None, chunk_chars: int = CHUNK_CHARS, log=print,
            advice: str = "choose another --out or pass --overwrite") -> dict:
    """Prepare a data directory; returns its meta. A directory already prepared from the same inputs is
    reused as it is; one holding anything else is refused unless overwrite (advice: what a refusal tells the user
    to do, in the words of the command that called)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; choose a directory path for the prepared data")
    if not 0 < val_fraction < 1:
        raise UserError(f"--val-fraction={val_fraction} must be in (0, 1)")
    check_tokenizer_name(tokenizer_name)
    source = get_source(source_spec, text_field=text_field, doc_separator=doc_separator)
    request = {"source": source.name, "tokenizer": tokenizer_name, "split_seed": seed, "val_fraction": val_fraction,
               "text_field": text_field, "doc_separator": doc_separator}
    if out.exists() and not is_empty_dir(out) and not (out / "meta.json").is_file():
        raise UserError(f"{out} exists and is not an nlq data directory (no meta.json); nlq replaces only its own "
                        f"datasets: {advice.replace(' or pass --overwrite', '')}")
    if out.exists() and not overwrite and (existing := _existing_meta(out, request, advice)):
        log(f"{out} is already prepared from {source.name} with {tokenizer_name}; reusing it"
            + (" (--overwrite rebuilds)" if "--overwrite" in advice else ""))
        return existing
    out.parent.mkdir(parents=True, exist_ok=True)
    with directory_lock(out, f"data directory {out}"):
        remove_stale(out.parent, stale_siblings(out))
        return _prepare(source, tokenizer_name, out, request, seed, val_fraction, chunk_chars, log)


def _prepare(source: Source, tokenizer_name: str, out: Path, request: dict, seed: int, val_fraction: float,
             chunk_chars: int, log) -> dict:
    start = time.perf_counter()
    tokenizer = build_tokenizer(tokenizer_name, _split_documents(source, seed, val_fraction, "train"))
    dtype = token_dtype(tokenizer.vocab_size)
    with atomic_directory(out) as tmp:
        stats = {split: {"documents": 0, "tokens": 0, "bytes": 0} for split in SPLITS}
        shard_hashes = {split: hashlib.blake2b(digest_size=16) for split in SPLITS}  # verified by load_data
        content_hash = hashlib.sha256()
        files = {split: open(tmp / f"{split}.bin", "wb") for split in SPLITS}
        max_id = -1
        with files["train"], files["val"]:
            index = 0
            for chunk in chunks(source.documents(), chunk_chars):
                for doc in chunk:
                    content_hash.update(doc.encode("utf-8", errors="replace") + b"\0")
                keep = [(i, d) for i, d in enumerate(chunk, start=index) if d.strip()]
                index += len(chunk)
                for split in SPLITS:
                    docs = [d for i, d in keep if is_val(seed, i, val_fraction) == (split == "val")]
                    if not docs:
                        continue
                    # each document ends with end-of-text, so documents are separated in the stream
                    ids = np.concatenate([np.append(t, tokenizer.eot_id) for t in tokenizer.encode_batch(docs)])
                    max_id = max(max_id, int(ids.max()))
                    block = ids.astype(dtype).tobytes()
                    files[split].write(block)
                    shard_hashes[split].update(block)
                    stats[split]["documents"] += len(docs)
                    stats[split]["tokens"] += len(ids)
                    stats[split]["bytes"] += sum(len(d.encode("utf-8", errors="replace")) for d in docs)
        total_docs = stats["train"]["documents"] + stats["val"]["documents"]
        if index == 0:
            raise UserError(f"source {source.name} is empty: it yielded no documents")
        if total_docs == 0:
            raise UserError(f"source {source.name} has no documents with text after filtering ({index} were empty)")
        for split in SPLITS:
            if stats[split]["documents"] == 0:
                raise UserError(
                    f"the {split} split is empty ({total_docs} documents, --val-fraction={val_fraction}); "
                    f"give more documents or change --val-fraction"
                )
        if max_id >= tokenizer.vocab_size:
            raise UserError(f"tokenizer produced id {max_id} outside its vocabulary of {tokenizer.vocab_size}")
        tokenizer.save(tmp)
        for split in SPLITS:
            stats[split]["blake2b"] = shard_hashes[split].hexdigest()
        meta = {
            "format_version": FORMAT_VERSION, **request, "source_hash": content_hash.hexdigest(),
            "source_meta": source.meta, "vocab_size": tokenizer.vocab_size, "eot_id": tokenizer.eot_id,
            "dtype": dtype.name, "splits": stats, "replaced_bytes": source.replaced_bytes[0],
            "seconds": round(time.perf_counter() - start, 2),
        }
        write_json(tmp / "meta.json", meta)
    short = ""
    if tokenizer.name.startswith("bpe:") and tokenizer.vocab_size < int(tokenizer.name[4:]):
        short = f": the corpus supports no more merges than that, not {int(tokenizer.name[4:]):,}"
    log(f"prepared {out}: {stats['train']['tokens']:,} train / {stats['val']['tokens']:,} val tokens "
        f"({tokenizer.name}, vocab {tokenizer.vocab_size:,}{short}) in {meta['seconds']:.1f}s")
    return meta


def _existing_meta(out: Path, request: dict, advice: str) -> dict | None:
    """The meta of an output directory prepared from the same request; None for an empty directory;
    an error for anything else."""
    meta_path = out / "meta.json"
    if not meta_path.is_file():
        if out.is_dir() and not any(out.iterdir()):
            return None
        raise UserError(f"{out} exists and is not an nlq data directory; {advice}")
    meta = read_json(meta_path, f"the meta of a prepared dataset; {advice}")
    differs = [k for k, v in request.items() if meta.get(k) != v]
    if differs:
        raise UserError(
            f"{out} holds a different dataset "
            f"({', '.join(f'{k}={meta.get(k)!r}, not {request[k]!r}' for k in differs)}); "
            f"{advice}"
        )
    return meta


# ---- reading ---------------------------------------------------------------------------------------

@dataclass
class TokenData:
    """A prepared data directory: token arrays (memory-mapped) and what they mean."""

    directory: Path
    meta: dict
    train: np.ndarray
    val: np.ndarray

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    def bytes_per_token(self, split: str = "val") -> float:
        s = self.meta["splits"][split]
        return s["bytes"] / s["tokens"]

    def tokenizer(self):
        return load_tokenizer(self.directory, self.meta["tokenizer"])


def read_meta(directory: str | Path) -> dict:
    """The meta.json of a prepared data directory; a one-line error where there is none."""
    meta_path = Path(directory) / "meta.json"
    if not meta_path.is_file():
        raise UserError(f"{directory} is not a prepared data directory (no meta.json); run nlq prepare --out "
                        f"{directory}")
    return read_json(meta_path, "the meta of a prepared data directory; prepare the data again")


def load_data(directory: str | Path, check_ids: bool = True) -> TokenData:
    directory = Path(directory)
    meta_path = directory / "meta.json"
    meta = read_meta(directory)
    try:
        dtype = np.dtype(meta["dtype"])
        if not isinstance(meta["vocab_size"], int) or isinstance(meta["vocab_size"], bool) or meta["vocab_size"] < 1:
            raise TypeError(f"vocab_size is {meta['vocab_size']!r}, not a positive integer")
        arrays = {}
        for split in SPLITS:
            path = directory / f"{split}.bin"
            expected = meta["splits"][split]["tokens"]
            if not isinstance(expected, int) or expected < 1:
                raise UserError(f"{meta_path} says the {split} split holds {expected!r} tokens; prepare the data again")
            if not path.is_file():
                raise UserError(f"{path} is missing; prepare the data again")
            size = path.stat().st_size
            if size != expected * dtype.itemsize:
                raise UserError(f"{path} is truncated or corrupt: {size:,} bytes, meta.json says "
                                f"{expected:,} tokens of {dtype.name}; prepare the data again")
            checksum = meta["splits"][split].get("blake2b")  # data prepared by nlq 0.1 has none
            if checksum and size <= VERIFY_MAX_BYTES and _file_digest(path) != checksum:
                raise UserError(f"{path} is corrupt: its checksum does not match meta.json; prepare the data again")
            arrays[split] = np.memmap(path, dtype=dtype, mode="r")
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        raise UserError(f"{meta_path} is malformed ({type(e).__name__}: {e}); prepare the data again") from None
    data = TokenData(directory, meta, arrays["train"], arrays["val"])
    if check_ids:
        for split in SPLITS:
            top = _max_id(arrays[split])
            if top >= data.vocab_size:
                raise UserError(f"{directory / (split + '.bin')} holds token id {top}, outside the vocabulary of "
                                f"{data.vocab_size} in meta.json; prepare the data again")
    return data


VERIFY_MAX_BYTES = 2 * 2**30  # shards up to this size are hashed at every load (~1 GB/s); larger: size check only


def _file_digest(path: Path, block: int = 1 << 26) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def _max_id(tokens: np.ndarray, block: int = 1 << 26) -> int:
    return max(int(tokens[i:i + block].max()) for i in range(0, len(tokens), block)) if len(tokens) else -1

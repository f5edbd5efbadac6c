"""Tokenizers, one interface: encode_batch, decode, vocab_size, eot_id, save(dir), load_tokenizer(dir, name).

- byte:   the 256 byte values plus an end-of-text token (257 ids); needs no files.
- bpe:N:  byte-level BPE with vocabulary N, trained on the train split with the `tokenizers` library
          and saved beside the shards as tokenizer.json.
- gpt2:   GPT-2's BPE through tiktoken (the paper's). tiktoken downloads its encoding files on first use;
          offline, point NLQ_GPT2_DIR (or gpt2:DIR) at a folder holding vocab.bpe and encoder.json.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from nlq.errors import UserError

EOT = "<|endoftext|>"
GPT2_FILES = ("vocab.bpe", "encoder.json")


class ByteTokenizer:
    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, directory: Path) -> None:
        pass


class BPETokenizer:
    def __init__(self, tokenizer, name: str):
        self.tokenizer, self.name = tokenizer, name
        self.vocab_size = tokenizer.get_vocab_size()
        self.eot_id = tokenizer.token_to_id(EOT)

    @classmethod
    def train(cls, texts: Iterator[str], vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer, f"bpe:{vocab_size}")

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # encode_batch_fast skips offsets; both run on all cores in Rust
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [np.asarray(e.ids, dtype=np.int64) for e in encode(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != self.eot_id])

    def save(self, directory: Path) -> None:
        self.tokenizer.save(str(Path(directory) / "tokenizer.json"))


class TiktokenTokenizer:
    def __init__(self, encoding, name: str, files_dir: Path | None = None):
        self.encoding, self.name, self.files_dir = encoding, name, files_dir
        self.eot_id = encoding.eot_token
        self.vocab_size = encoding.n_vocab

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.int64)
                for ids in self.encoding.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.encoding.decode([int(i) for i in ids if int(i) != self.eot_id], errors="replace")

    def save(self, directory: Path) -> None:
        if self.files_dir is not None:  # keep the data directory usable offline
            for name in GPT2_FILES:
                shutil.copyfile(self.files_dir / name, Path(directory) / name)


def gpt2_from_files(directory: Path) -> TiktokenTokenizer:
    """GPT-2's BPE from local vocab.bpe and encoder.json (the files tiktoken would download)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    missing = [n for n in GPT2_FILES if not (directory / n).is_file()]
    if missing:
        raise UserError(f"{directory} lacks {', '.join(missing)}; it needs GPT-2's vocab.bpe and encoder.json")
    ranks = data_gym_to_mergeable_bpe_ranks(str(directory / "vocab.bpe"), str(directory / "encoder.json"))
    encoding = tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                 special_tokens={EOT: len(ranks)})
    return TiktokenTokenizer(encoding, "gpt2", files_dir=directory)


def gpt2(local_dir: str | None = None) -> TiktokenTokenizer:
    local_dir = local_dir or os.environ.get("NLQ_GPT2_DIR")
    if local_dir:
        return gpt2_from_files(Path(local_dir))
    import tiktoken

    try:
        return TiktokenTokenizer(tiktoken.get_encoding("gpt2"), "gpt2")
    except Exception as e:  # offline: requests' ConnectionError, or a proxy error
        raise UserError(
            f"cannot load tiktoken's gpt2 encoding ({type(e).__name__}); offline, download vocab.bpe and "
            f"encoder.json of GPT-2 elsewhere and pass --tokenizer gpt2:DIR (or set NLQ_GPT2_DIR=DIR), "
            f"or use --tokenizer bpe:8192 or byte"
        ) from None


TOKENIZER_NAMES = "byte, bpe:N (e.g. bpe:8192), gpt2 or gpt2:DIR"
BPE_MAX = 2**20  # far beyond any corpus nlq prepares; a larger N is a typo


def check_tokenizer_name(name: str) -> None:
    kind, _, arg = name.partition(":")
    if kind == "bpe":
        if not arg.isdigit() or not 258 <= int(arg) <= BPE_MAX:
            raise UserError(f"tokenizer {name!r}: bpe needs a vocabulary size from 258 to {BPE_MAX:,}, e.g. bpe:8192")
    elif kind not in ("byte", "gpt2") or (kind == "byte" and arg):
        raise UserError(f"unknown tokenizer {name!r}; valid: {TOKENIZER_NAMES}")


def build_tokenizer(name: str, train_texts: Iterator[str] | None = None):
    """A tokenizer by name; bpe:N is trained on train_texts."""
    check_tokenizer_name(name)
    kind, _, arg = name.partition(":")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        return gpt2(arg or None)
    return BPETokenizer.train(train_texts, int(arg))


def load_tokenizer(directory: str | Path, name: str):
    """The tokenizer a data (or run) directory was made with."""
    directory = Path(directory)
    kind = name.partition(":")[0]
    if kind == "byte":
        return ByteTokenizer()
    if kind == "gpt2":
        if all((directory / n).is_file() for n in GPT2_FILES):
            return gpt2_from_files(directory)
        return gpt2()
    if kind == "bpe":
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json"
        if not path.is_file():
            raise UserError(f"{path} is missing; prepare the data again with nlq prepare")
        return BPETokenizer(Tokenizer.from_file(str(path)), name)
    raise UserError(f"unknown tokenizer {name!r} in {directory}; valid: {TOKENIZER_NAMES}")


def encode_text(tokenizer, text: str, what: str) -> np.ndarray:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{what} holds bytes that are not valid UTF-8, which the tokenizer cannot encode") from None
    (ids,) = tokenizer.encode_batch([text])
    if len(ids) == 0:
        raise UserError(f"{what} is empty: it encodes to no tokens")
    return ids

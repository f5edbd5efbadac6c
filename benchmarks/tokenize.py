"""Tokenisation throughput: encode the shakespeare corpus with each tokenizer, best of a few rounds.

    python benchmarks/tokenize.py [--source shakespeare] [--rounds 3]

Prints tokens/s of the encoder alone (chunks of documents, as nlq prepare feeds it) and of a full
`nlq prepare` (reading, BPE training, encoding, writing), with peak memory.
"""

import argparse
import os
import resource
import tempfile
import time

import torch

from nlq.data.shards import CHUNK_CHARS, chunks, prepare
from nlq.data.sources import get_source
from nlq.data.tokenizers import BPETokenizer, ByteTokenizer


def encode_rate(tokenizer, docs, rounds):
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        tokens = sum(len(ids) for chunk in chunks(iter(docs), CHUNK_CHARS) for ids in tokenizer.encode_batch(chunk))
        best = min(best, time.perf_counter() - start)
    return tokens, tokens / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="shakespeare")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    docs = list(get_source(args.source).documents())
    n_bytes = sum(len(d.encode()) for d in docs)
    print(f"source {args.source}: {len(docs)} documents, {n_bytes / 1e6:.1f} MB; {os.cpu_count()} cores, "
          f"torch threads {torch.get_num_threads()}")
    start = time.perf_counter()
    bpe = BPETokenizer.train(iter(docs), 8192)
    print(f"bpe:8192 training: {time.perf_counter() - start:.2f}s")
    for name, tok in (("byte", ByteTokenizer()), ("bpe:8192", bpe)):
        tokens, rate = encode_rate(tok, docs, args.rounds)
        print(f"{name:>9} encode: {tokens:>10,} tokens  {rate / 1e6:6.2f}M tokens/s")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        meta = prepare(args.source, "bpe:8192", f"{tmp}/data", log=lambda *_: None)
        wall = time.perf_counter() - start
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"nlq prepare --source {args.source} --tokenizer bpe:8192: {tokens:,} tokens in {wall:.2f}s "
          f"({tokens / wall / 1e6:.2f}M tokens/s end to end), peak RSS of this process {peak_mb:.0f} MB")


if __name__ == "__main__":
    main()

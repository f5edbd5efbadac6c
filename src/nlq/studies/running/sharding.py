"""How processes share a study: shards dealt whole chains round-robin, and a lock per chain.

A chain is a WSD stable run with its branches (or a single run): the unit one process trains. `--shard K/N` deals
the K-th of every N chains of a stage to a process; whoever trains a chain holds its lock (an flock beside the run
directories, dropped by the kernel when the process dies), so no chain is trained by two processes at once, and a
process that has finished its share can take over any chain that nobody holds (study.py)."""

from __future__ import annotations

from pathlib import Path

from nlq.errors import LockHeld, UserError
from nlq.lock import DirectoryLock


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 1 <= K <= N."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise UserError(f"--shard {text!r} is not K/N with 1 <= K <= N (e.g. --shard 1/2 and --shard 2/2 in two "
                        "processes)")
    return k, n


def shard_indices(runs: list, k: int, n: int) -> list[int]:
    """Indices of the runs (each with a .chain) of shard k of n: chains in order of first appearance, dealt
    round-robin."""
    groups = list(dict.fromkeys(r.chain for r in runs))
    mine = {g for i, g in enumerate(groups) if i % n == k - 1}
    return [i for i, r in enumerate(runs) if r.chain in mine]


def chain_lock(study_dir: Path, chain: str) -> DirectoryLock:
    """Held by the process training a chain, for all of its runs."""
    return DirectoryLock(Path(study_dir) / "runs" / f".{chain}.chain.lock", f"chain {chain} of {study_dir}")


def chain_claimed(study_dir: Path, chain: str) -> bool:
    """Whether another process holds the chain now (this one takes and lets go of its lock to find out)."""
    try:
        with chain_lock(study_dir, chain):
            return False
    except LockHeld:
        return True

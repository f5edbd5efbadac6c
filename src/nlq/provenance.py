"""Where a result came from: the code commit that produced it, UTC times, and content hashes of what it saw,
so that pairing and timing can be checked from a run's files alone."""

from __future__ import annotations

import functools
import hashlib
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

from nlq.errors import UserError
from nlq.fileio import read_json


@functools.lru_cache(maxsize=1)
def code_version() -> str | None:
    """The git commit of nlq's source tree ("+dirty" with uncommitted changes to it); None outside a git checkout.
    Read once per process and cached: the code a process runs is the code it imported at its start, so a caller
    reads it when it starts (the trainer does, before its first step), not when it writes its record hours later
    from a tree that may have changed since."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=source, capture_output=True, text=True,
                                timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return commit.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second (e.g. 2026-12-01T20:45:03Z)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def tensor_hash(*tensors: torch.Tensor) -> str:
    """SHA-256 of the tensors' values (dtype and shape included), the first 16 hex digits."""
    digest = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def code_versions(study_json: Path) -> list[str]:
    """Every code version that has run this study: the ones study.json already records, then this one."""
    try:
        earlier = read_json(study_json, "the study's description").get("code") or []
    except (OSError, UserError):
        earlier = []
    now = code_version()
    return list(earlier) + ([now] if now and now not in earlier else [])

"""One writer per run directory or dataset: an advisory lock (flock) held for the life of the process.

The kernel drops a flock when its process dies, however it dies, so a lock never goes stale; the pid in the
lock file is only for the message. Because the lock proves that no other nlq process writes the directory,
the temporary files found there at start are leftovers of a killed process and are removed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

from nlq.errors import UserError


class LockHeld(UserError):
    """Another live process holds the lock."""


class DirectoryLock:
    def __init__(self, lock_path: Path, what: str):
        self.path, self.what, self.fd = Path(lock_path), what, None

    def __enter__(self) -> DirectoryLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LockHeld(f"{self.what} is in use by another nlq process (pid {holder}); wait for it to finish "
                            f"or stop it, then try again") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def remove_stale(folder: Path, pattern: str) -> list[str]:
    """Delete leftovers matching pattern in folder (call only while holding the folder's lock)."""
    removed = []
    for path in sorted(Path(folder).glob(pattern)) if Path(folder).is_dir() else []:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed

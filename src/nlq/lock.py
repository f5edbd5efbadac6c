"""One writer per run directory or dataset: an advisory lock (flock) held for the life of the process.

The kernel drops a flock when its process dies, however it dies, so a lock never goes stale; the pid in the
lock file is only for the message. Because the lock proves that no other nlq process writes the directory,
the temporary files found there at start are leftovers of a killed process (fileio.remove_stale). The lock
file sits beside the directory, named after its resolved path, so a symlink to the same directory takes the
same lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from nlq.errors import LockHeld


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


def directory_lock(directory: Path, what: str) -> DirectoryLock:
    """The lock of `directory` (which need not exist yet): `.NAME.lock` beside its resolved path."""
    resolved = Path(directory).resolve()
    return DirectoryLock(resolved.parent / f".{resolved.name}.lock", what)

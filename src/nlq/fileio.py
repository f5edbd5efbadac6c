"""Writing files and directories so that no reader, and no killed process, leaves half of one behind.

One pattern everywhere: write beside the target under a temporary name, `.NAME.tmp-PID-THREAD`, then rename
over it (atomic on POSIX). A process killed in between leaves only such a temporary, which matches TEMP_GLOB;
whoever next holds the folder's lock (lock.py) removes it with remove_stale.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from nlq.errors import UserError

TEMP_GLOB = ".*.tmp-*"  # what a killed writer leaves: a file or a directory


def temp_path(path: Path) -> Path:
    """The temporary name of `path` for this process and thread (shards and threads may write the same file)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: str | bytes | Callable[[BinaryIO], None], durable: bool = False) -> Path:
    """Write text, bytes, or whatever writer(file) writes, to `path` at once. durable: fsync the file and its
    folder before returning (checkpoints), so a power cut cannot leave a renamed but empty file."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def write_json(path: Path, value, indent: int | None = 2) -> Path:
    return atomic_write(path, json.dumps(value, indent=indent) + "\n")


def read_json(path: Path, what: str) -> dict:
    """A JSON object from a file nlq wrote; a one-line error naming the file and what it is when it is not one."""
    try:
        value = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is truncated or not JSON ({type(e).__name__}); it is {what}") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} does not hold a JSON object; it is {what}")
    return value


def remove_stale(folder: Path, pattern: str = TEMP_GLOB) -> list[str]:
    """Delete leftovers matching pattern in folder (call only while holding the folder's lock)."""
    removed = []
    for path in sorted(Path(folder).glob(pattern)) if Path(folder).is_dir() else []:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def stale_siblings(out: Path) -> str:
    """The glob of the temporaries atomic_directory leaves beside `out` when killed."""
    return f".{Path(out).name}.tmp-*"


def real_path(path: Path) -> Path:
    """path with every symlink resolved; a symlink loop is a one-line error naming the path."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError) as e:  # Python raises RuntimeError("Symlink loop ...") for a loop
        raise UserError(f"{path} cannot be resolved ({str(e).splitlines()[0][:120]}): a symlink loop or an unreadable "
                        f"link; choose a plain directory") from None


def overlaps(a: Path, b: Path) -> bool:
    """Whether two paths are the same directory or one lies inside the other (after resolving symlinks)."""
    a, b = real_path(a), real_path(b)
    return a == b or a in b.parents or b in a.parents


def is_empty_dir(path: Path) -> bool:
    return Path(path).is_dir() and not any(Path(path).iterdir())


@contextlib.contextmanager
def atomic_directory(out: Path) -> Iterator[Path]:
    """A new temporary directory beside `out`; when the block ends without an error it replaces `out` (an
    existing `out` is moved aside first and removed after), otherwise it is removed and `out` is untouched.
    The caller holds a lock on `out` and has decided that replacing it is allowed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            old = tmp.with_name(tmp.name + "-old")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

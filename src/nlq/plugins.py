"""Code of your own that nlq imports before it reads a config, such as a module that registers a projection
(`nlq.projections.register_projection`). Name it in the environment variable NLQ_IMPORT (comma-separated; every
nlq command, every shard and every torchrun rank reads it) or in a plan file's `imports`.

An entry is a module on the Python path (`my_projection`, `mypkg.projections`) or a .py file: relative to the
current directory in NLQ_IMPORT, to the plan file's folder in a plan. A run that uses a projection of your own
records its class, file and the file's sha256 (summary.json, record.projections), so a result says which code
made it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from nlq.errors import UserError

ENV = "NLQ_IMPORT"


def import_modules(entries: list[str], base: Path | None = None, where: str = ENV) -> None:
    """Import each entry once (module name or .py file); a missing or failing module is a one-line error that
    names it and, for an error inside it, the file and line."""
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise UserError(f"{where}: {entry!r} is not a module name or a .py file")
        entry = entry.strip()
        if entry.endswith(".py"):
            path = Path(entry) if base is None or Path(entry).is_absolute() else base / entry
            if not path.is_file():
                raise UserError(f"{where}: {path} does not exist; name a module on the Python path or an existing "
                                f".py file")
            _import_file(path.resolve(), where)
        else:
            _import_name(entry, where)


def import_from_environment() -> None:
    """The modules named in NLQ_IMPORT (nothing when it is unset or empty)."""
    entries = [e for e in os.environ.get(ENV, "").split(",") if e.strip()]
    if entries:
        import_modules(entries)


def _import_name(name: str, where: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):  # the entry itself, not an import in it
            raise UserError(f"{where}: no module named {name!r} on the Python path; install it, add its folder to "
                            f"PYTHONPATH, or give the .py file's path") from None
        raise UserError(_failure(name, e)) from None
    except (Exception, SystemExit) as e:  # an error inside the user's module (or its exit): where, in one line
        raise UserError(_failure(name, e)) from None


def _import_file(path: Path, where: str) -> None:
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return  # imported already (NLQ_IMPORT and a plan may name the same file)
    if name in sys.modules:
        raise UserError(f"{where}: {path} would be imported as the module {name!r}, which is already another "
                        f"module ({getattr(sys.modules[name], '__file__', 'built in')}); rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs, as import does (dataclasses and pickling look it up)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # sys.exit() at import would end nlq with no word of where
        del sys.modules[name]
        raise UserError(_failure(str(path), e)) from None


def _failure(what: str, error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename] or frames
    at = f" at {own[-1].filename}:{own[-1].lineno}" if own else ""
    if isinstance(error, SystemExit):
        return f"importing {what} called sys.exit({error.code!r}){at}; code imported by nlq must not exit"
    return f"importing {what} failed{at}: {type(error).__name__}: {error}"

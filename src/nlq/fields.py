"""The machinery of typed config fields: a field with its help text (`setting`), the choices of a Literal field,
each field's declared type, the conversion of a raw value (a command-line string, a YAML/TOML scalar) to that
type with a one-line error, and the fields read under an old name (RENAMED). config.py declares the sections with
it; overrides.py reads values through it.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
import typing
from dataclasses import field
from typing import Any, Literal

from nlq.errors import ConfigError


def setting(default: Any, help: str) -> Any:
    """A config field with its help text (printed by `nlq train --help`); a dataclass default becomes its factory."""
    if isinstance(default, type):
        return field(default_factory=default, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def field_help(section_cls: type) -> dict[str, str]:
    """The help text of each field of a config section."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(section_cls)}


def literal_choices(annotation: Any) -> tuple | None:
    """The values of a Literal[...] field type (also inside Optional), else None."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def field_types(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60
INT_MAX = 2**63 - 1  # what torch and numpy hold; a larger step count or size is a typo


def short_repr(value: Any) -> str:
    """repr for an error message, bounded however large or deeply nested (a YAML alias bomb) the value is."""
    return _SHORT.repr(value)


def convert_value(key: str, value: Any, annotation: Any) -> Any:
    """Convert a raw value (a command-line string, or a YAML/TOML scalar) to the field's declared type."""
    args = typing.get_args(annotation)
    optional = (typing.get_origin(annotation) in (typing.Union, types.UnionType)) and type(None) in args
    if optional:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        annotation = next(a for a in args if a is not type(None))
    if literal_choices(annotation) is not None:  # a choice: checked against its values by the section
        annotation = type(literal_choices(annotation)[0])
    expected = annotation.__name__
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
    elif annotation is int:
        number = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str):
            try:
                number = int(value.replace("_", ""))
            except ValueError:
                try:  # allow 1e6 when it is a whole number
                    as_float = float(value)
                    if as_float.is_integer():
                        number = int(as_float)
                except (ValueError, OverflowError):
                    pass
        if number is not None:
            if abs(number) > INT_MAX:
                raise ConfigError(f"{key}={short_repr(value)} is out of range (at most {INT_MAX:,})")
            return number
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)  # YAML's .inf and .nan are as wrong as the command line's
        if isinstance(value, str):
            try:
                number = float(value)
                if math.isfinite(number):
                    return number
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
    elif annotation is dict:  # options of one's own: a table of scalars, converted by whoever reads them
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, (str, int, float, bool))
                                           for k, v in value.items()):
            return dict(value)
        expected = "table of option = value (numbers, text or true/false)"
    raise ConfigError(f"{key}={short_repr(value)} is not a valid {expected}")


# Fields with a new name: the old one is still read (committed config.json files, checkpoints, command lines), into
# the new field. The nonlinear options size nlq's nonlinear projection wherever it sits, not only the query.
RENAMED = {"model": {"query_rank": "nonlinear_rank", "query_activation": "nonlinear_activation",
                     "query_in_norm": "nonlinear_in_norm", "query_out_norm": "nonlinear_out_norm"}}


def renamed(values: dict, prefix: str) -> dict:
    """A section's {field: value} with every old field name (RENAMED) read as its new one; both names at once is a
    one-line error."""
    old_names = RENAMED.get(prefix, {})
    out = {}
    for name, value in values.items():
        new = old_names.get(name, name)
        if new in out:
            former = next(k for k, v in old_names.items() if v == new)
            raise ConfigError(f"{prefix}.{former} is {prefix}.{new}'s old name, and both are given; give "
                              f"{prefix}.{new} alone")
        out[new] = value
    return out


def upgraded(raw: dict) -> dict:
    """A recorded {section: {field: value}} config (a run's config.json) with its old field names read as the new."""
    return {section: renamed(values, section) if isinstance(values, dict) else values
            for section, values in raw.items()}

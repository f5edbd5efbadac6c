"""Where a run's config values come from, in layers: a preset (or a resumed run's own config.json), then a
YAML/TOML/JSON file (--config), then --section.field=value arguments; and the help text of every field."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

from nlq.config import SECTIONS, RunConfig, update
from nlq.errors import ConfigError
from nlq.fields import field_help, field_types, literal_choices
from nlq.projections import ACTIVATION_MODULES, PROJECTIONS


def read_config_file(path: str | Path) -> dict:
    """The raw {section: {field: value}} of a .json, .yaml/.yml or .toml file: only the fields it sets, so it
    layers over a preset (or a run's own config) without resetting anything else."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path.suffix not in (".toml", ".yaml", ".yml", ".json"):
        raise ConfigError(f"config file {path} must end in .yaml, .yml, .toml or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (not UTF-8); give a YAML, TOML or JSON file") from None
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(text)
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text) or {}
    except Exception as e:  # a parse error in the user's file
        raise ConfigError(f"cannot parse config file {path}: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections (model, data, train, dist)")
    return raw


def load_config(path: str | Path) -> RunConfig:
    """A whole config from a file (a run's config.json, or YAML/TOML), over the defaults."""
    return RunConfig.from_dict(read_config_file(path))


def parse_overrides(args: list[str]) -> dict:
    """Turn ["--train.lr=1e-3", "--model.projections.k=nonlinear"] into
    {"train": {"lr": "1e-3"}, "model": {"projections": {"k": "nonlinear"}}}."""
    raw: dict = {}
    for arg in args:
        body = arg[2:] if arg.startswith("--") else arg
        key, sep, value = body.partition("=")
        path = key.split(".")
        if not arg.startswith("--") or not sep or len(path) < 2 or not all(path):
            raise ConfigError(f"cannot read argument {arg!r}; overrides look like --section.field=value")
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"argument {arg!r} sets a field inside {'.'.join(path[:-1])}, which is a value")
        node[path[-1]] = value
    return raw


def apply_overrides(config: RunConfig, args: list[str]) -> RunConfig:
    return update(config, parse_overrides(args))


def layered(base: RunConfig, config_file: str | None, overrides: list[str]) -> RunConfig:
    """One rule everywhere: the base (a preset, or a run's own config), then the file's fields, then overrides."""
    if config_file:
        base = update(base, read_config_file(config_file))
    return apply_overrides(base, overrides)


def field_choices() -> dict[str, tuple]:
    """The fixed choices of every field that has them: Literal types, and the projection/activation registries."""
    names = tuple(PROJECTIONS)
    choices = {f"model.{key}": names for key in ("query", "projections.q", "projections.k", "projections.v",
                                                 "projections.o")}
    choices["model.nonlinear_activation"] = tuple(ACTIVATION_MODULES)

    def visit(section_cls: type, prefix: str) -> None:
        for name, annotation in field_types(section_cls).items():
            if dataclasses.is_dataclass(annotation):
                visit(annotation, f"{prefix}.{name}")
            elif literal_choices(annotation) is not None:
                choices[f"{prefix}.{name}"] = literal_choices(annotation)

    for section, f in zip(SECTIONS, dataclasses.fields(RunConfig)):
        visit(field_types(RunConfig)[f.name], section)
    return choices


def describe_fields(config: RunConfig | None = None) -> list[str]:
    """Two lines per config field: --section.field=TYPE with its default (or the given config's value) and choices,
    then its help text."""
    config = config or RunConfig()
    choices, lines = field_choices(), []

    def kind_of(annotation) -> str:
        if literal_choices(annotation) is not None:
            return "STR"
        names = [a.__name__ for a in typing.get_args(annotation)] or [annotation.__name__]
        return " | ".join(names).upper().replace("NONETYPE", "none")

    def visit(obj, prefix: str) -> None:
        hints, helps = field_types(type(obj)), field_help(type(obj))
        for f in dataclasses.fields(obj):
            key, value = f"{prefix}.{f.name}", getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                visit(value, key)
                continue
            extra = f"; choices: {', '.join(map(str, choices[key]))}" if key in choices else ""
            lines.append(f"  --{key}={kind_of(hints[f.name])}  (default {value!r}{extra})")
            lines.append(f"      {helps[f.name]}")

    for section in SECTIONS:
        visit(getattr(config, section), section)
    return lines


def merge_changes(*changes: dict) -> dict:
    """Nested {section: {field: value}} changes in one dict, each later one on top of those before (a new dict: the
    inputs are not changed). The one merge of config changes: a study's run deltas, nlq train's shape of a source
    checkpoint under the command line's overrides."""
    out: dict = {}
    for change in changes:
        for section, values in change.items():
            if isinstance(values, dict):
                out[section] = {**out.get(section, {}), **values}
            else:
                out[section] = values
    return out

"""The names the command line offers (presets, studies, shipped plans), read from the package's source files
without importing them, so that `nlq --help` starts at once (torch and the studies are heavy)."""

from __future__ import annotations

import ast
from importlib import resources


def _dict_keys(package: str, module: str, name: str) -> list[str]:
    """A module-level dict literal's keys, from the source (no torch import: `nlq --help` stays fast); tested."""
    for node in ast.parse((resources.files(package) / module).read_text()).body:
        target = (node.target if isinstance(node, ast.AnnAssign)
                  else node.targets[0] if isinstance(node, ast.Assign) else None)
        if getattr(target, "id", None) == name:
            return [key.value for key in node.value.keys]
    return []


def preset_names() -> list[str]:
    return _dict_keys("nlq", "presets.py", "PRESETS")


def study_names() -> list[str]:  # every study is a plan: the shipped plans (nlq/plans/*.toml) by name
    return sorted(p.name[:-5] for p in (resources.files("nlq") / "plans").iterdir() if p.name.endswith(".toml"))

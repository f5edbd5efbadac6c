"""The shape of the package: imports point one way (no cycle among nlq's modules, none even through a
function-local import), no private name is imported across modules, and every file stays readable."""

import ast
from pathlib import Path

import nlq

PACKAGE = Path(nlq.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> list[tuple[str, list[str]]]:
    """(imported nlq module, the names taken from it) for every import statement in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.startswith("nlq")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nlq") and node.level == 0:
            names = [alias.name for alias in node.names]
            submodules = [f"{node.module}.{n}" for n in names if f"{node.module}.{n}" in modules]
            found += [(m, []) for m in submodules]
            found.append((node.module, [n for n in names if f"{node.module}.{n}" not in modules]))
    return found


def graph() -> tuple[dict[str, set[str]], list[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    edges, private = {}, []
    for f in files:
        name = module_name(f)
        edges[name] = set()
        for target, names in imports_of(f, modules):
            if target == name or target not in modules:
                continue
            if not name.startswith(target + ".") and target != "nlq":  # a package's own __init__ is no edge
                edges[name].add(target)
            private += [f"{name} imports {target}.{n}" for n in names if n.startswith("_")]
    return edges, private


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_among_nlq_modules():
    edges, _ = graph()
    assert len(edges) > 30  # the walk found the package
    assert find_cycle(edges) is None, " -> ".join(find_cycle(edges))


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_private_name_is_imported_across_modules():
    _, private = graph()
    assert not private, private


def test_every_source_file_is_short_or_says_why():
    long = [str(f.relative_to(PACKAGE)) for f in PACKAGE.rglob("*.py")
            if len(f.read_text().splitlines()) > 360 and "lines:" not in (ast.get_docstring(ast.parse(f.read_text())) or "")]
    assert not long, f"over 360 lines without a 'lines:' reason in the docstring: {long}"


def test_one_temp_then_rename_in_the_package():
    """Every file nlq writes atomically goes through fileio (one temporary-name pattern, one clean-up glob)."""
    offenders = []
    for f in PACKAGE.rglob("*.py"):
        text = f.read_text()
        if f.name != "fileio.py" and any(s in text for s in ("os.replace(", ".replace(path)", "mkdtemp(prefix=f\".",
                                                              ".rename(")):
            offenders.append(str(f.relative_to(PACKAGE)))
    assert not offenders, offenders


def test_study_help_lists_every_registered_study(capsys):
    import pytest

    from nlq.cli import main, study_names
    from nlq.studies.registry import STUDIES

    assert study_names() == list(STUDIES)
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, even inside a name
    assert all(name in help_text for name in STUDIES), help_text

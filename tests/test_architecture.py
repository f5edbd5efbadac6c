"""The shape of the package: imports point one way (down the README's Layout, and no cycle among nlq's modules,
none even through a function-local import), no private name is imported across modules, and every file stays
readable."""

import ast
import re
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


def readme_layers() -> list[list[str]]:
    """The Layout block of the README, top to bottom: per line, the nlq modules or packages it names."""
    readme = (PACKAGE.parents[1] / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    layers = []
    for line in block.splitlines():
        if line.startswith("src/nlq/"):
            names = re.split(r"\s{2,}", line, maxsplit=1)[0].removeprefix("src/nlq/").split(", ")
            layers.append(["nlq." + n.removesuffix(".py").rstrip("/") for n in names])
    return layers


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    top = ".".join(module.split(".")[:2])
    return next((i for i, names in enumerate(layers) if top in names), None)


def upward_imports(edges: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    return sorted(f"{a} imports {b}" for a, targets in edges.items() if a != "nlq" for b in targets
                  if layer_of(b, layers) > layer_of(a, layers))


def test_imports_point_down_the_readme_layout():
    """Every nlq module sits on one line of the README's Layout and imports only from its line or those above."""
    edges, _ = graph()
    layers = readme_layers()
    assert len(layers) > 10, layers
    unplaced = sorted(m for m in edges if m != "nlq" and layer_of(m, layers) is None)
    assert not unplaced, f"modules the README's Layout does not list: {unplaced}"
    assert not upward_imports(edges, layers), "imports that point up the README's Layout"


def test_the_layer_check_finds_an_upward_import():
    layers = [["nlq.errors"], ["nlq.config", "nlq.overrides"], ["nlq.studies"]]
    edges = {"nlq.config": {"nlq.errors", "nlq.overrides"}, "nlq.studies.definition.plan": {"nlq.config"}}
    assert upward_imports(edges, layers) == []  # down, or along one line
    edges["nlq.errors"] = {"nlq.studies.definition.plan"}
    assert upward_imports(edges, layers) == ["nlq.errors imports nlq.studies.definition.plan"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_private_name_is_imported_across_modules():
    _, private = graph()
    assert not private, private


def test_every_source_file_is_short_or_says_why():
    long = [str(f.relative_to(PACKAGE)) for f in PACKAGE.rglob("*.py")
            if len(f.read_text().splitlines()) > 360
            and "lines:" not in (ast.get_docstring(ast.parse(f.read_text())) or "")]
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


def test_reading_a_plan_and_writing_a_report_never_import_the_trainer():
    """A plan is read, dry-run and reported from its design alone: nlq.studies.definition.plan, the reports and the
    registry that names them load without nlq.training (its trainer, inputs and distributed setup)."""
    import subprocess
    import sys

    code = ("import sys, nlq.studies.definition.plan, nlq.studies.reports.plan_report, nlq.studies.running.engine, "
            "nlq.studies.registry; "
            "print(sorted(m for m in sys.modules if m == 'nlq.training' or m.startswith('nlq.training.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
    code = ("import sys, nlq.studies.definition.plan_design, nlq.studies.definition.design; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"the design as data imports {loaded}"  # arms, runs and a plan's design: no torch


STUDY_PARTS = ["inference", "definition", "running", "reports", ""]  # nlq.studies' parts, bottom to top ("": its own)


def study_part(module: str) -> int:
    rest = module.removeprefix("nlq.studies.").split(".")
    return STUDY_PARTS.index(rest[0] if len(rest) > 1 else "")


def test_the_studies_parts_import_only_down_their_order_and_stay_short():
    """src/nlq/studies is a package of parts (inference, spec, running, reports; registry and launch on top): a
    module imports only from its own part or those below, no file is over 400 lines, and every study is a plan file
    (no Python study definition: the registry holds the shipped plans alone)."""
    from nlq.studies.definition.plan import shipped_plans
    from nlq.studies.registry import STUDIES

    edges, _ = graph()
    inside = {a: {b for b in targets if b.startswith("nlq.studies.")} for a, targets in edges.items()
              if a.startswith("nlq.studies.")}
    upward = sorted(f"{a} imports {b}" for a, targets in inside.items() for b in targets
                    if study_part(b) > study_part(a))
    assert not upward, upward
    assert {m.split(".")[2] for m in inside if m.count(".") == 3} == set(STUDY_PARTS) - {""}
    studies = PACKAGE / "studies"
    long = [str(f.relative_to(studies)) for f in studies.rglob("*.py") if len(f.read_text().splitlines()) > 400]
    assert not long, long
    assert set(STUDIES) == set(shipped_plans())


def test_the_studies_part_check_finds_an_upward_import():
    assert study_part("nlq.studies.definition.design") < study_part("nlq.studies.running.engine")
    assert study_part("nlq.studies.reports.plan_report") < study_part("nlq.studies.registry")

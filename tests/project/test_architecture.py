"""The package's shape: layers that import only downwards, no import cycles, modules readable in one sitting."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "minipaged_cli"
# Each layer may import its own and lower layers only (errors and units serve everyone).
LAYERS = {"errors": 0, "units": 0, "memory": 1, "workloads": 1, "sim": 2, "dataplane": 2, "apps": 3, "fleet": 3,
          "cli": 4}
MAX_LINES = 330  # about 300; a longer module says why at its top ("Over 300 lines ...")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}  # a submodule imported by name
    return {name for name in found if name in known}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_layers_import_only_downwards() -> None:
    known = modules()
    upward = []
    for module, path in known.items():
        own = layer(module)
        if own is None:
            continue
        upward += [f"{module} -> {target}" for target in imports(path, known)
                   if (theirs := layer(target)) is not None and theirs > own]
    assert upward == []


def test_no_import_cycles() -> None:
    known = modules()
    graph = {module: imports(path, known) - {module} for module, path in known.items()}
    # a package's __init__ importing its own submodules is how Python packages re-export: not a cycle
    for module in graph:
        graph[module] = {t for t in graph[module] if not (known[module].name == "__init__.py"
                                                           and t.startswith(module + "."))}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_modules_are_readable_in_one_sitting() -> None:
    long = []
    for module, path in modules().items():
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if len(text.splitlines()) > MAX_LINES and "Over 300 lines" not in docstring:
            long.append(f"{module}: {len(text.splitlines())} lines")
    assert long == []


def test_the_readmes_python_examples_run() -> None:
    # The library examples of the README and of the Python API's page, in order, in one namespace (later ones use
    # earlier names).
    namespace: dict = {}
    for page in (ROOT / "README.md", ROOT / "docs" / "reference" / "python-api.md"):
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        assert blocks, page
        for block in blocks:
            exec(compile(block, str(page), "exec"), namespace)
    assert namespace["manager"].invariants_ok()

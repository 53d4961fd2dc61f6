"""The layers of app/ (docs/ARCHITECTURE.md, "Layers"): no import circles, and no import
against the direction of the layers, read from the source with ``ast``.

Every import counts, the ones inside functions too (a function-level import that closes a
circle still is one); only imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"

# package -> the packages of app/ it must never import (its own sub-packages are its own).
FORBIDDEN = {
    "app.formats": ("app.engine", "app.kernels", "app.quant", "app.server", "app.ui", "app.commands", "app.cli",
                    "app.settings", "app.model_import", "app.model_removal", "app.hub"),
    "app.kernels": ("app.engine", "app.quant", "app.server", "app.ui", "app.commands", "app.cli", "app.settings",
                    "app.model_import", "app.model_removal", "app.hub"),
    "app.engine": ("app.quant", "app.server", "app.ui", "app.commands", "app.cli", "app.settings",
                   "app.model_import", "app.model_removal", "app.hub"),
    "app.quant": ("app.server", "app.ui", "app.commands", "app.hub", "app.remote"),
    "app.server": ("app.ui", "app.quant", "app.commands", "app.hub", "app.remote"),
    # the remote endpoints' client (the tray's remote models, `ask --server`): on the engine's params only
    "app.remote": ("app.ui", "app.server", "app.quant", "app.commands", "app.cli", "app.settings", "app.hub",
                   "app.kernels", "app.formats"),
    # beside the engine: the CLI, the server and the tray read it; the engine takes settings as arguments
    "app.settings": ("app.engine", "app.kernels", "app.formats", "app.quant", "app.server", "app.ui",
                     "app.commands", "app.cli", "app.model_import", "app.model_removal", "app.hub"),
    # model downloads: on the engine's planner, the quantizer and the settings; the CLI and the tray drive it
    "app.hub": ("app.ui", "app.server", "app.commands", "app.cli", "app.remote"),
}
# package -> outside packages it must never import: no window system below the UI.
FORBIDDEN_EXTERNAL = {layer: ("PySide6", "shiboken6") for layer in
                      ("app.formats", "app.kernels", "app.engine", "app.quant", "app.server", "app.settings",
                       "app.hub", "app.remote")}


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (a package: app/ here)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _imported_names(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: resolved against the importing module's package
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [f"{module}.{alias.name}" for alias in node.names] + [module]


def _imports_of(path: Path, package: str) -> list[tuple[ast.AST, list[str]]]:
    """Each import statement of the file (but those under ``if TYPE_CHECKING:``) with the
    dotted names it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = _type_checking_nodes(tree)
    return [(node, _imported_names(node, package)) for node in ast.walk(tree)
            if id(node) not in skipped and isinstance(node, (ast.Import, ast.ImportFrom))]


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def external_imports(root: Path) -> dict[str, set[str]]:
    """Module -> the top-level names of the packages outside ``root`` it imports."""
    modules = module_files(root)
    inside = root.name
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        tops = {n.split(".")[0] for node, names in _imports_of(path, _package_of(name, path)) if not
                (isinstance(node, ast.ImportFrom) and node.level) for n in names}
        found[name] = {t for t in tops if t and t != inside}
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports. ``from pkg import name`` points at
    ``pkg.name`` when that is a module, else at ``pkg``."""
    modules = module_files(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node, names in _imports_of(path, _package_of(name, path)):
            if isinstance(node, ast.ImportFrom):  # the submodule if it is one, else the module itself
                *members, module = names
                targets = [m if m in modules else module for m in members]
            else:
                targets = names
            graph[name].update(t for t in map(resolve, targets) if t is not None and t != name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


@functools.cache
def app_graph() -> dict[str, set[str]]:
    return import_graph(APP)


@functools.cache
def app_external_imports() -> dict[str, set[str]]:
    return external_imports(APP)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_app_has_no_import_cycles():
    cycles = import_cycles(app_graph())
    assert not cycles, "import circles in app/: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downwards(layer):
    graph = app_graph()
    assert any(_within(m, layer) for m in graph), f"{layer}: no such package (update FORBIDDEN)"
    wrong = sorted(f"{module} imports {target}" for module, targets in graph.items() if _within(module, layer)
                   for target in targets for banned in FORBIDDEN[layer] if _within(target, banned))
    assert not wrong, f"{layer} must not import {', '.join(FORBIDDEN[layer])}: " + "; ".join(wrong)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_EXTERNAL))
def test_layer_imports_no_window_system(layer):
    wrong = sorted(f"{module} imports {top}" for module, tops in app_external_imports().items()
                   if _within(module, layer) for top in tops if top in FORBIDDEN_EXTERNAL[layer])
    assert not wrong, f"{layer} must not import {', '.join(FORBIDDEN_EXTERNAL[layer])}: " + "; ".join(wrong)


def test_the_graph_sees_imports_of_every_kind():
    """The checks above are only as good as the graph: known edges of each kind are found."""
    graph = app_graph()
    assert "app.engine.scheduler" in graph["app.engine.engine"]  # from a.b import name
    assert "app.formats.checkpoint" in graph["app.engine.loading"]  # from a import module
    assert "app.kernels.loader" in graph["app.kernels.gemv"]
    assert "app.quant.quantizer" in graph["app.quant.cli"]  # inside a function
    assert "PySide6" in app_external_imports()["app.ui.app"]  # an outside package


def test_cycle_finder_on_a_tree_with_known_circles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "def f():\n    from pkg.c import x\n",  # a function-level import still closes a circle
        "c.py": "import pkg.a\nx = 1\n",
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import y\n",
        "e.py": "from pkg.d import *\ny = 2\n",  # d -> e only for the type checker: no circle
        "sub/__init__.py": "",
        "sub/f.py": "from .. import a\nfrom . import g\n",
        "sub/g.py": "from pkg.sub.f import *\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["pkg.sub.f"] == {"pkg.a", "pkg.sub.g"}
    assert sorted(import_cycles(graph)) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.sub.f", "pkg.sub.g"]]

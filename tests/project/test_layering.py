"""The import graph points one way: foundation <- {coordinator, worker runtime} <- user API and
connectors <- Spark bridge <- CLI and demo, with no cycles.

Every import counts, including imports inside functions and under ``TYPE_CHECKING``: a cycle
hidden by a function-local import is still a cycle for a reader.

One exception, with its own rule: the foundation package's ``__init__`` is Snapflow's public API
(``from snapflow import Pipeline``), whose names live in the layers above it. It names them in
one lazy table (``_PUBLIC``: name -> home module), imports a home module only when one of its
names is first read (PEP 562 ``__getattr__``, through ``importlib``), and imports them statically
only under ``TYPE_CHECKING``, for type checkers. Those imports are exactly the table's, and are
not edges of the import graph: no module of a lower layer runs them.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import TypeGuard

import pytest

import snapflow

ROOT = Path(snapflow.__file__).resolve().parent.parent
PACKAGE = ROOT / "snapflow"

#: Layers from the bottom; a module may import its own layer and the layers below it only.
#: Peers in one layer (the coordinator and the worker runtime) may not import each other.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["snapflow"]),
    ("state", ["snapflow.worker.state"]),
    ("coordinator", ["snapflow.coordinator"]),
    ("runtime", ["snapflow.worker.runtime"]),
    ("user API", ["snapflow.worker.api"]),
    ("connectors", ["snapflow.worker.connectors"]),
    ("spark bridge", ["snapflow.spark_bridge"]),
    ("cli", ["snapflow.cli"]),
]
#: Layers that must not see each other although neither is above the other.
PEERS = {frozenset({"coordinator", "runtime"}), frozenset({"coordinator", "state"})}
#: Old top-level names that must never be imported: everything lives under ``snapflow.``.
FORBIDDEN_TOP_LEVEL = {"coordinator", "worker", "spark_bridge", "cli"}


def _module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    # The layer folders are symbolic links under snapflow/ (see docs/architecture.md): follow them.
    paths = [Path(d) / f for d, _, files in os.walk(PACKAGE, followlinks=True) for f in files]
    for path in sorted(p for p in paths if p.suffix == ".py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts
        if "v1" in parts:  # generated code
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _layer_of(module: str) -> str:
    best, best_len = "", -1
    for layer, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = layer, len(prefix)
    return best


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import submodule`` imports the submodule
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            top = name.split(".")[0]
            if top in FORBIDDEN_TOP_LEVEL:
                found.add("!" + name)
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and not name.startswith("snapflow.v1"):
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _module_files()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    # The public API's lazy table: checked by its own test below, not edges of the graph.
    graph["snapflow"] -= set(_lazy_table().values())
    return graph


def _lazy_table() -> dict[str, str]:
    """The foundation package's ``_PUBLIC``: public name -> home module."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in targets):
                assert node.value is not None
                table: dict[str, str] = ast.literal_eval(node.value)
                return table
    raise AssertionError("snapflow/__init__.py has no _PUBLIC table")


def _is_type_checking(node: ast.stmt) -> TypeGuard[ast.If]:
    return isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"


def test_the_foundation_package_names_upper_layers_only_in_its_lazy_table() -> None:
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    table = _lazy_table()
    assert table, "the public API's table is empty"
    modules = _module_files()
    assert sorted({m for m in table.values() if m not in modules}) == [], "no such module"
    # Under TYPE_CHECKING: exactly the table's names, each from its home module.
    checked = [n for n in tree.body if _is_type_checking(n)]
    assert len(checked) == 1, "one TYPE_CHECKING block"
    assert all(isinstance(n, ast.ImportFrom) for n in checked[0].body), "only the table's names"
    typed = {
        alias.name: node.module
        for node in ast.walk(checked[0])
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == table
    # Everywhere else: no import of a module above the foundation, and the table's modules are
    # imported in __getattr__ only (importlib.import_module, on first access).
    runtime = [n for n in tree.body if not _is_type_checking(n)]
    above = [
        name
        for node in runtime
        for name in sorted(_imports_of(node))
        if _layer_of(name) not in ("", "foundation")
    ]
    assert above == []

    def dynamic_imports(scope: ast.AST) -> int:
        return sum(
            isinstance(n, ast.Call) and ast.unparse(n.func) == "importlib.import_module"
            for n in ast.walk(scope)
        )

    getattr_ = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    getattr_ = [f for f in getattr_ if f.name == "__getattr__"]
    assert len(getattr_) == 1
    assert dynamic_imports(getattr_[0]) == dynamic_imports(tree) == 1


def _imports_of(node: ast.AST) -> set[str]:
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            found.update(a.name for a in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            found.add(child.module)
    return found


def test_every_module_is_in_a_layer() -> None:
    assert [m for m in _module_files() if not _layer_of(m)] == []


def test_no_import_of_the_old_top_level_packages() -> None:
    bad = {m: sorted(i[1:] for i in deps if i.startswith("!")) for m, deps in _graph().items()}
    assert {m: v for m, v in bad.items() if v} == {}


def test_no_module_imports_a_higher_layer_or_a_peer() -> None:
    rank = {layer: i for i, (layer, _) in enumerate(LAYERS)}
    violations = []
    for module, deps in _graph().items():
        mine = _layer_of(module)
        for dep in deps:
            if dep.startswith("!") or dep == "snapflow":
                continue
            theirs = _layer_of(dep)
            if rank[theirs] > rank[mine] or frozenset({mine, theirs}) in PEERS:
                violations.append(f"{module} ({mine}) imports {dep} ({theirs})")
    assert violations == []


def test_no_import_cycles() -> None:
    graph = {m: {d for d in deps if not d.startswith("!")} for m, deps in _graph().items()}
    # Tarjan's strongly connected components; a component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("module", sorted(_module_files()))
def test_every_module_imports(module: str) -> None:
    __import__(module)

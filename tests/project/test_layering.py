"""The import graph points one way: foundation <- {coordinator, worker runtime} <- user API and
connectors <- Spark bridge <- CLI and demo, with no cycles.

Every import counts, including imports inside functions and under ``TYPE_CHECKING``: a cycle
hidden by a function-local import is still a cycle for a reader.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

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
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


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

"""The worker's pure cores are pure and sealed.

``barriers.py``, ``task_lifecycle.py`` and ``watermark_valve.py`` take events and return actions
or values: no I/O, no clock, no thread, so that their exact-sequence tests are the whole story.
They import nothing but the standard library modules they use today, each other, and the
shared vocabulary (``snapflow.checkpointing``, ``snapflow.event_time``), which itself imports no
more than that.
And ``check_invariants`` can only guard state that changes inside them, so outside the cores no
worker module assigns to an attribute of a lifecycle, a barrier handler or a watermark valve,
nor reaches a private member of one (as ``test_core_boundary.py`` checks for the coordinator's
cores).
"""

from __future__ import annotations

import ast
from pathlib import Path

import snapflow

ROOT = Path(snapflow.__file__).resolve().parent.parent
WORKER = ROOT / "worker"
CORES = [
    WORKER / "runtime" / name for name in ("barriers.py", "task_lifecycle.py", "watermark_valve.py")
]
#: A core may use another core's values (the lifecycle takes the handler's ``TriggerSnapshot``).
CORE_MODULES = {"snapflow.worker.runtime.barriers"}
#: The foundation modules a core may import: vocabulary, no behaviour.
VOCABULARY = {
    "snapflow.checkpointing": ROOT / "snapflow" / "checkpointing.py",
    "snapflow.event_time": ROOT / "snapflow" / "event_time.py",
}
#: Everything the cores and the vocabulary import today; a new import is a decision to review.
ALLOWED_IMPORTS = {
    *CORE_MODULES,
    "__future__",
    "abc",
    "collections.abc",
    "dataclasses",
    "enum",
    *VOCABULARY,
}
#: I/O, clocks, threads and the libraries that do them: never in a core.
IO_MODULES = {
    "asyncio",
    "socket",
    "grpc",
    "redis",
    "os",
    "time",
    "threading",
    "pyarrow",
    "structlog",
}
#: How the shell names a core object (``lifecycle``, ``self.handler``, ``shell._valve``, ...).
CORE_NAMES = {"lifecycle", "handler", "valve"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-local, ``TYPE_CHECKING``);
    ``from package import module`` names the module, relative imports keep their dots."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if module == "snapflow":
                found.update(f"snapflow.{alias.name}" for alias in node.names)
            else:
                found.add(module)
    return found


def _core_and_vocabulary_imports() -> dict[str, set[str]]:
    """The imports of every core and of every vocabulary module one of them imports."""
    result = {path.name: _imports(path) for path in CORES}
    reached = {name for imports in result.values() for name in imports if name in VOCABULARY}
    for name in sorted(reached):
        result[name] = _imports(VOCABULARY[name])
    return result


def test_cores_import_no_io_and_nothing_of_snapflow_but_the_vocabulary() -> None:
    violations = []
    for where, imports in _core_and_vocabulary_imports().items():
        for module in sorted(imports):
            if module.split(".")[0] in IO_MODULES:
                violations.append(f"{where}: imports {module} (I/O)")
            elif module.startswith(".") or (
                module.split(".")[0] == "snapflow"
                and module not in VOCABULARY
                and module not in CORE_MODULES
            ):
                violations.append(f"{where}: imports {module} (not the shared vocabulary)")
    assert violations == []


def test_cores_import_only_what_they_import_today() -> None:
    imports = _core_and_vocabulary_imports()
    assert {"barriers.py", "task_lifecycle.py", "watermark_valve.py"} <= imports.keys()
    violations = [
        f"{where}: imports {module}"
        for where, modules in imports.items()
        for module in sorted(modules - ALLOWED_IMPORTS)
    ]
    assert violations == []


def _is_core(node: ast.expr) -> bool:
    """``lifecycle``, ``x.handler``, ``x.y._valve`` (a leading underscore is the same name)."""
    if isinstance(node, ast.Name):
        return node.id.lstrip("_") in CORE_NAMES
    return isinstance(node, ast.Attribute) and node.attr.lstrip("_") in CORE_NAMES


def _violations(path: Path, root: Path = WORKER) -> list[str]:
    where = path.relative_to(root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute) or not _is_core(node.value):
            continue
        if isinstance(node.ctx, ast.Store | ast.Del):
            found.append(f"{where}:{node.lineno}: assigns a core's {node.attr}")
        elif node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{where}:{node.lineno}: uses a core's private member {node.attr}")
    return found


def test_worker_code_never_writes_core_state_or_private_members() -> None:
    shell_modules = sorted(p for p in WORKER.rglob("*.py") if p not in CORES)
    assert len(shell_modules) > 20, "no worker modules found"
    violations = [v for path in shell_modules for v in _violations(path)]
    assert violations == []


def test_the_check_sees_an_assignment_and_a_private_read(tmp_path: Path) -> None:
    """The check finds what it is there for, so its passing on the worker means something."""
    module = tmp_path / "shell.py"
    module.write_text(
        "def f(shell, handler):\n"
        "    shell.lifecycle.phase = None\n"
        "    handler.blocked += 1\n"
        "    self_valve = shell._valve._current\n"
        "    shell.lifecycle = None\n"
    )
    found = [v.split(": ", 1)[1] for v in sorted(_violations(module, tmp_path))]
    assert found == [
        "assigns a core's phase",
        "assigns a core's blocked",
        "uses a core's private member _current",
    ]

"""The coordinator's pure cores are sealed: shell code changes their state only through events.

``check_invariants`` of ``CheckpointCoordinator`` and ``JobExecution`` can only guard state that
changes inside them. So outside the cores no module assigns to an attribute of a core (``core``
or ``execution``), and no module reads or calls a private member (``_name``) of another object.
"""

from __future__ import annotations

import ast
from pathlib import Path

import snapflow

COORDINATOR = Path(snapflow.__file__).resolve().parent.parent / "coordinator"
CORES = {"checkpoint_coordinator.py", "checkpoint_failure_manager.py", "execution.py"}
CORE_NAMES = {"core", "execution", "cc"}
#: Public API despite the underscore (namedtuple methods).
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make"}


def _shell_modules() -> list[Path]:
    return sorted(p for p in COORDINATOR.glob("*.py") if p.name not in CORES)


def _is_core(node: ast.expr) -> bool:
    """``core``, ``x.core``, ``x.y.core`` (and the same for ``execution``)."""
    if isinstance(node, ast.Name):
        return node.id in CORE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in CORE_NAMES


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and _is_core(target.value):
                found.append(f"{path.name}:{target.lineno}: assigns a core's {target.attr}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in PUBLIC_UNDERSCORED
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.name}:{node.lineno}: uses private member {node.attr}")
    return found


def test_shell_code_never_writes_core_state_or_private_members() -> None:
    assert _shell_modules(), "no coordinator modules found"
    violations = [v for path in _shell_modules() for v in _violations(path)]
    assert violations == []

"""One conversion edge: the enum constants of the generated ``snapflow.v1`` modules (proto enum
numbers such as ``pb.JOB_STATE_RUNNING`` or ``cpb.ACK_RESULT_SUCCESS``) are named only where the
vocabulary is mapped to and from them:

* ``snapflow/wire.py``: the shared vocabulary (``snapflow.checkpointing``, ``snapflow.jobgraph``);
* ``snapflow/coordinator/convert.py``: the coordinator's proto conversion (its own enums, such as
  ``AckResult``, and the validation of what clients send).

Everywhere else in the package, code speaks the vocabulary and converts through those modules
(``wire.JOB_STATE.from_pb_or(info.state, None) is JobState.FINISHED``), so adding a member
touches the proto, the enum and its one mapping.

What counts: ``X.NAME`` or ``X.Enum.NAME`` where ``X`` is bound to a ``snapflow.v1`` ``*_pb2``
module by any import form (aliases, full dotted paths, function-local imports), ``from
snapflow.v1.<module>_pb2 import NAME``, and ``NAME`` as a string literal (``getattr``,
``Enum.Value``), ``NAME`` being an enum value of a generated module (top level or nested in a
message). Not counted: the enum types themselves (``pb.JobState.Name(n)``: the CLI prints the
name of any number, known to this version or not), messages, and other protocols' generated
modules (grpc's health service). Tests, benchmarks and the chaos suite are clients that build
wire messages and are not checked.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import snapflow
import snapflow.v1

ROOT = Path(snapflow.__file__).resolve().parent.parent
PACKAGE = ROOT / "snapflow"
GENERATED = "snapflow.v1"
#: The conversion edges (paths relative to the repository, through the layer symlinks).
ALLOWED = {"snapflow/wire.py", "snapflow/coordinator/convert.py"}


def _generated_modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"{GENERATED}.{info.name}")
        for info in pkgutil.iter_modules(snapflow.v1.__path__)
        if info.name.endswith("_pb2")
    ]


def _enum_values(enums: Any, messages: Any) -> set[str]:
    """The enum value names of ``enums`` and of ``messages`` (descriptors), nested included."""
    names = {v.name for e in enums for v in e.values}
    for m in messages:
        names |= _enum_values(m.enum_types, m.nested_types)
    return names


ENUM_VALUES = frozenset(
    name
    for module in _generated_modules()
    for name in _enum_values(
        module.DESCRIPTOR.enum_types_by_name.values(),
        module.DESCRIPTOR.message_types_by_name.values(),
    )
)


def _is_generated(name: str) -> bool:
    """``name`` is a generated module of ``snapflow.v1`` or something inside one."""
    return name.startswith(GENERATED + ".") and name.split(".")[2].endswith("_pb2")


def _absolute(module: str | None, level: int, package: str) -> str:
    """The absolute name of a ``from`` import's module (``level`` dots, inside ``package``)."""
    if level == 0:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None if the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def violations(source: str, filename: str, package: str = "snapflow") -> list[str]:
    """Where ``source`` names a generated enum constant (``file:line: what``)."""
    tree = ast.parse(source, filename)
    # Local name -> the dotted name it is bound to, for every import in the file.
    bound: dict[str, str] = {}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:  # ``import a.b.c`` binds ``a``; attribute chains spell the rest
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, package)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                if _is_generated(module) and alias.name in ENUM_VALUES:
                    found.append(f"{filename}:{node.lineno}: imports {full}")
                bound[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENUM_VALUES:
            parts = _dotted(node)
            if parts is None or parts[0] not in bound:
                continue
            full = ".".join([bound[parts[0]], *parts[1:]])
            if _is_generated(full.rsplit(".", 1)[0]):  # a module's or a nested enum's value
                found.append(f"{filename}:{node.lineno}: {'.'.join(parts)}")
        elif isinstance(node, ast.Constant) and node.value in ENUM_VALUES:
            found.append(f"{filename}:{node.lineno}: the string {node.value!r}")
    return found


def _package_files() -> dict[str, Path]:
    """Every module of the installed package but the generated code, by repository path."""
    files: dict[str, Path] = {}
    for d, _, names in os.walk(PACKAGE, followlinks=True):
        for name in names:
            path = Path(d) / name
            rel = path.relative_to(ROOT)
            if path.suffix == ".py" and "v1" not in rel.parts:
                files[rel.as_posix()] = path
    return files


def _package_of(rel: str) -> str:
    parts = Path(rel).with_suffix("").parts
    return ".".join(parts if parts[-1] == "__init__" else parts[:-1])


def test_the_generated_modules_have_enum_constants() -> None:
    # Guards the check itself: an empty set would let everything pass.
    assert {"JOB_STATE_RUNNING", "ACK_RESULT_SUCCESS", "TASK_STATE_FAILED"} <= ENUM_VALUES
    assert all(name.isupper() for name in ENUM_VALUES)


def test_the_allowed_modules_exist_and_are_conversion_edges() -> None:
    files = _package_files()
    assert ALLOWED.issubset(files)
    # Each edge really maps numbers; an allowance nobody needs should be removed.
    for rel in ALLOWED:
        assert violations(files[rel].read_text(), rel, _package_of(rel)), rel


def test_proto_enum_constants_appear_only_at_the_conversion_edges() -> None:
    files = _package_files()
    assert len(files) > 50, "the package was not found"
    found = [
        v
        for rel, path in sorted(files.items())
        if rel not in ALLOWED
        for v in violations(path.read_text(), rel, _package_of(rel))
    ]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "from snapflow.v1 import common_pb2 as pb\nx = pb.JOB_STATE_RUNNING",
        "from snapflow.v1 import coordinator_pb2\nx = coordinator_pb2.ACK_RESULT_SUCCESS",
        "import snapflow.v1.common_pb2\nx = snapflow.v1.common_pb2.TASK_STATE_FAILED",
        "import snapflow.v1.common_pb2 as pb\nx = pb.JobState.JOB_STATE_FAILED",
        "from snapflow.v1.common_pb2 import JOB_STATE_FAILED",
        "from snapflow.v1.common_pb2 import JobState\nx = JobState.JOB_STATE_FAILED",
        "def f():\n    from snapflow.v1 import common_pb2 as p\n    return p.PARTITIONER_KIND_HASH",
        "from .v1 import common_pb2 as pb\nx = pb.JOB_STATE_RUNNING",
        "from snapflow.v1 import common_pb2 as pb\nx = pb.JobState.Value('JOB_STATE_RUNNING')",
    ],
)
def test_the_check_finds_every_spelling(source: str) -> None:
    assert violations(source, "m.py"), source


@pytest.mark.parametrize(
    "source",
    [
        "from snapflow.v1 import common_pb2 as pb\nx = pb.JobState.Name(2)",
        "from snapflow.v1 import common_pb2 as pb\nx = pb.CheckpointOptions()",
        "from snapflow import wire\nfrom snapflow.jobgraph import JobState\n"
        "x = wire.JOB_STATE.to_pb(JobState.RUNNING)",
        "from grpc_health.v1 import health_pb2\nx = health_pb2.HealthCheckResponse.SERVING",
        "class pb:\n    JOB_STATE_RUNNING = 2\nx = pb.JOB_STATE_RUNNING",
    ],
)
def test_the_check_leaves_the_vocabulary_and_enum_types_alone(source: str) -> None:
    assert violations(source, "m.py") == []

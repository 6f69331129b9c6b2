"""Snapflow's public API stays importable: ``from snapflow import Pipeline, FileSource, ...``.

Every public name resolves to the object of its home module, ``import snapflow`` alone stays
light (the names are imported on first access), and the examples, the files users copy, import
nothing from Snapflow's internal modules.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import snapflow

ROOT = Path(snapflow.__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
#: The table itself (internal): public name -> home module.
TABLE: dict[str, str] = snapflow._PUBLIC


def test_all_lists_the_table() -> None:
    assert sorted(snapflow.__all__) == sorted(TABLE)
    assert len(snapflow.__all__) == len(set(snapflow.__all__))


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_public_name_is_the_object_of_its_home_module(name: str) -> None:
    home = importlib.import_module(TABLE[name])
    assert getattr(snapflow, name) is getattr(home, name)


def test_dir_lists_the_public_names() -> None:
    assert set(snapflow.__all__) <= set(dir(snapflow))


def test_an_unknown_name_raises_attribute_error_with_a_hint() -> None:
    with pytest.raises(AttributeError, match=r"no attribute 'Pipelin'; did you mean Pipeline"):
        getattr(snapflow, "Pipelin")  # noqa: B009 (type checkers refuse the typo itself)
    with pytest.raises(AttributeError, match=r"snapflow.__all__"):
        getattr(snapflow, "NoSuchThing")  # noqa: B009
    assert not hasattr(snapflow, "NoSuchThing")


def test_submodules_still_import_through_the_package() -> None:
    # ``from snapflow import <module>`` asks the package's __getattr__ first; it must stay an
    # AttributeError for modules, so that the import system imports them.
    from snapflow import jobgraph, limits

    assert jobgraph.__name__ == "snapflow.jobgraph"
    assert limits.__name__ == "snapflow.limits"


def _imported_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported after running ``code``."""
    script = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {modules!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return imported


HEAVY = ("pyspark", "pyarrow", "numpy", "rocksdict", "snapflow.spark_bridge", "snapflow.worker")


def test_importing_snapflow_alone_imports_nothing_heavy() -> None:
    code = "import snapflow\nassert 'Pipeline' in dir(snapflow) and 'Pipeline' in snapflow.__all__"
    assert _imported_after(code, HEAVY) == []


def test_a_public_name_imports_its_home_module_on_first_access() -> None:
    code = "import snapflow\nsnapflow.Pipeline"
    assert _imported_after(code, ("snapflow.spark_bridge.pipeline",)) == [
        "snapflow.spark_bridge.pipeline"
    ]


def _snapflow_imports(path: Path) -> list[str]:
    """Every module a file imports from Snapflow (``snapflow`` itself or a submodule)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "snapflow"]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "snapflow"
        ):
            found.append(node.module or "")
    return found


def test_there_are_examples() -> None:
    assert EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_import_only_the_public_api(path: Path) -> None:
    imports = _snapflow_imports(path)
    assert imports, f"{path.name} imports nothing from snapflow"
    assert [m for m in imports if m != "snapflow"] == []

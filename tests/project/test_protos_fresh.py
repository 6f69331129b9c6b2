"""The generated code in snapflow/v1 is checked in; it must match protos/ exactly.

The generation command is the one of ``make proto``: both run protos/generate.py, here into a
temporary output directory, which does not appear in the generated code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "snapflow" / "v1"
GENERATED_DIR = ROOT / "snapflow" / "v1"
GENERATE = PROTO_ROOT / "generate.py"
# What protos/generate.py writes per .proto (its GENERATED_SUFFIXES).
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
STALE_HINT = "run `make proto` and commit the regenerated files in snapflow/v1"


def _protos() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def _checked_in_generated() -> set[str]:
    return {
        p.name
        for p in GENERATED_DIR.iterdir()
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """snapflow/v1 regenerated from protos/ into a temporary directory."""
    out = tmp_path_factory.mktemp("protoc")
    assert _protos(), f"no .proto files found in {PROTO_DIR}"
    result = subprocess.run(
        [sys.executable, str(GENERATE), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"protos/generate.py failed (exit {result.returncode}):\n{result.stdout}{result.stderr}"
    )
    return out / "snapflow" / "v1"


def test_generated_code_matches_protos(regenerated: Path) -> None:
    fresh = sorted(p.name for p in regenerated.iterdir() if p.is_file())
    assert fresh, "protoc generated nothing"
    missing = [name for name in fresh if not (GENERATED_DIR / name).is_file()]
    assert not missing, f"generated files missing from snapflow/v1: {missing}; {STALE_HINT}"
    differing = [
        name
        for name in fresh
        if (regenerated / name).read_bytes() != (GENERATED_DIR / name).read_bytes()
    ]
    assert not differing, (
        f"snapflow/v1 is stale: {differing} differ from what protos/ generates; {STALE_HINT}"
    )
    extra = sorted(_checked_in_generated() - set(fresh))
    assert not extra, (
        f"snapflow/v1 has generated files with no .proto in {PROTO_DIR}: {extra}; delete them "
        f"(or restore their .proto) and {STALE_HINT}"
    )


def test_every_proto_has_generated_code() -> None:
    # Every .proto anywhere under protos/, not only the ones `make proto` compiles today:
    # protos/<pkg>/<name>.proto generates <pkg>/<name>_pb2.py at the repository root.
    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    assert protos, f"no .proto files found under {PROTO_ROOT}"
    missing = [
        str(generated.relative_to(ROOT))
        for p in protos
        for suffix in GENERATED_SUFFIXES
        if not (generated := ROOT / p.relative_to(PROTO_ROOT).with_name(p.stem + suffix)).is_file()
    ]
    assert not missing, f"no generated code for: {missing}; {STALE_HINT}"

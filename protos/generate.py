"""Generate snapflow/v1 from protos/: the one protoc invocation of the project.

``make proto`` runs it into the repository root; tests/project/test_protos_fresh.py runs it into a
temporary directory and compares, so the checked-in code cannot go stale unnoticed.

Per ``protos/<pkg>/<name>.proto`` it writes, under the output directory:

- ``<pkg>/<name>_pb2.py`` and ``<name>_pb2.pyi``: messages, with protoc's own typed stubs;
- ``<pkg>/<name>_pb2_grpc.py``: service stubs and servicers (grpcio-tools' plugin);
- ``<pkg>/<name>_pb2_grpc.pyi``: their typed stubs (mypy-protobuf's ``protoc-gen-mypy_grpc``),
  which the grpcio-tools plugin does not write.

Usage: ``python protos/generate.py [--out DIR]`` (default: the repository root). Needs the dev
extras (grpcio-tools, mypy-protobuf), pinned in pyproject.toml so the output is reproducible.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
ROOT = PROTO_ROOT.parent
#: What the invocation writes per .proto, next to each other.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def protos() -> list[Path]:
    """Every .proto under protos/, sorted."""
    return sorted(PROTO_ROOT.rglob("*.proto"))


def _plugin(name: str) -> str:
    # The plugin is a console script of the interpreter's environment; a venv need not be on PATH.
    local = Path(sys.executable).parent / name
    found = str(local) if local.is_file() else shutil.which(name)
    if not found:
        raise SystemExit(
            f"error: {name} not found; install the dev extras (pip install -e '.[dev]')"
        )
    return found


def command(out: Path) -> list[str]:
    """The protoc command line writing into ``out``; paths relative to the repository root, so
    the output directory does not appear in the generated code."""
    sources = [str(p.relative_to(ROOT)) for p in protos()]
    if not sources:
        raise SystemExit(f"error: no .proto files under {PROTO_ROOT}")
    return [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        str(PROTO_ROOT.relative_to(ROOT)),
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        *sources,
    ]


def generate(out: Path) -> subprocess.CompletedProcess[str]:
    """Run protoc into ``out`` (created if missing); the caller checks the return code."""
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        command(out.resolve()), cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: %(default)s)")
    args = parser.parse_args(argv)
    result = generate(args.out)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        print(f"error: protoc failed (exit {result.returncode})", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())

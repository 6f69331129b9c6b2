"""The ``snapflow`` command stays light: building its parser, ``snapflow coordinator`` and the
client commands import neither Spark nor the Spark bridge nor the worker and its state backends
(RocksDB, pyarrow and the numpy it brings); only ``run``, ``demo`` and ``worker`` import them,
when they run. Each check runs in a fresh interpreter, so nothing this test process imported
counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = (
    "pyspark",
    "snapflow.spark_bridge",
    "snapflow.worker",
    "snapflow.worker.state.rocksdb_backend",
    "rocksdict",
    "pyarrow",
    "numpy",
)


def _imported_after(code: str) -> list[str]:
    """The HEAVY modules that a fresh interpreter has imported after running ``code``."""
    script = (
        f"{code}\nimport json, sys\nprint(json.dumps([n for n in {HEAVY!r} if n in sys.modules]))"
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


def test_building_the_parser_imports_no_spark_and_no_worker() -> None:
    code = "import snapflow.cli.main\nfrom snapflow.cli.parser import build_parser\nbuild_parser()"
    assert _imported_after(code) == []


def test_the_coordinator_and_client_commands_import_no_spark_and_no_worker() -> None:
    # The coordinator command imports the service, then stops at the bad flag (exit 2); the
    # client command fails to connect to a port bound but not listening (exit 1).
    code = "\n".join(
        [
            "import socket, sys",
            "from snapflow.cli.main import main",
            "assert main(['coordinator', '--port', 'not-a-port']) == 2",
            "assert 'snapflow.coordinator.server' in sys.modules",  # it got as far as its imports
            "closed = socket.socket()",
            "closed.bind(('127.0.0.1', 0))",
            "address = '127.0.0.1:%d' % closed.getsockname()[1]",
            "assert main(['jobs', '--address', address, '--timeout', '10']) == 1",
            "closed.close()",
        ]
    )
    assert _imported_after(code) == []

"""Shared pieces of the benchmarks: results files, environment description, processes."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pyspark import cloudpickle

from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.tls import sync_channel
from snapflow.v1 import common_pb2 as pb

RESULTS_DIR = Path(__file__).parent / "results"


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
    }


def write_results(name: str, metrics: dict[str, float], **extra: Any) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {
        "metrics": metrics,
        **extra,
        "environment": environment(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


def op_spec(operator_id: str, operator: Any) -> pb.OperatorSpec:
    """One operator of a job graph built by hand (named after its id, pickled as Spark would)."""
    return pb.OperatorSpec(
        operator_id=operator_id,
        name=operator_id,
        kind=type(operator).__name__,
        payload=cloudpickle.dumps(operator),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_coordinator(
    redis_url: str,
    storage_root: str,
    port: int,
    security: SecuritySettings = PLAINTEXT,
    settings: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``snapflow coordinator`` in its own process, waited for until gRPC health says SERVING.

    The coordinator reads its security settings from the ``SNAPFLOW_*`` environment it
    inherits; ``security`` is what the health check connects with (TLS when it serves TLS).
    ``settings``: more ``SNAPFLOW_*`` variables for it (e.g. ``SNAPFLOW_HISTORY_SIZE``)."""
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR", **(settings or {})}
    process = subprocess.Popen(
        [
            sys.executable, "-m", "snapflow.cli", "coordinator",
            "--host", "127.0.0.1", "--port", str(port), "--redis-url", redis_url,
            "--storage-root", storage_root, "--metrics-port", "-1", "--log-level", "warning",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    with sync_channel(f"127.0.0.1:{port}", security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"coordinator exited with {process.returncode}")
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return process
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("coordinator did not become healthy within 30 s")
            time.sleep(0.1)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

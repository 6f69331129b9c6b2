"""`snapflow coordinator` as a child process on 127.0.0.1 (tracked by PID, killed by the test).

``CoordinatorProcess.start`` runs ``python -m snapflow.cli coordinator`` with JSON logs to a
file; ``events()`` reads the structured events it logged; ``kill()`` sends SIGKILL to that one
PID and reaps it; ``stop()`` sends SIGTERM and waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``SNAPFLOW_*`` settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    env["GRPC_VERBOSITY"] = "ERROR"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class CoordinatorProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        redis_url: str,
        namespace: str,
        storage_root: Path,
        log_path: Path,
        port: int = 0,
        **settings: str,
    ) -> CoordinatorProcess:
        """``settings``: extra ``SNAPFLOW_<NAME>`` variables (``heartbeat_timeout_s="1"``)."""
        port = port or free_port()
        env = child_env(
            SNAPFLOW_SHUTDOWN_GRACE_S="1",
            **{f"SNAPFLOW_{k.upper()}": v for k, v in settings.items()},
        )
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "snapflow.cli",
                    "coordinator",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--redis-url",
                    redis_url,
                    "--redis-namespace",
                    namespace,
                    "--metrics-port",
                    "-1",
                    "--storage-root",
                    str(storage_root),
                    "--log-format",
                    "json",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=log_path.parent,
            )
        return cls(proc, log_path, port)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and "event" in event:
                out.append(event)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(timeout=10)


def worker_argv(address: str, job_id: str, slot: int, slots: int, log_level: str) -> list[str]:
    """The command line of one ``snapflow worker`` for ``slot`` of ``slots``."""
    return [
        sys.executable, "-m", "snapflow.cli", "worker", "--coordinator", address,
        "--job", job_id, "--slot", str(slot), "--slots", str(slots), "--log-level", log_level,
    ]  # fmt: skip


def start_worker(
    address: str, job_id: str, slot: int, slots: int, log_path: Path
) -> subprocess.Popen[bytes]:
    """One ``snapflow worker`` process for ``slot`` of ``slots`` (logs to ``log_path``)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            worker_argv(address, job_id, slot, slots, "info"),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=log_path.parent,
        )


class Processes:
    """Child processes of one test, each killed by its PID and reaped at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

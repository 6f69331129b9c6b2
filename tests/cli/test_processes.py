"""``snapflow coordinator`` and ``snapflow worker`` as processes: a JSON log is JSON on every
line (gRPC's C core included), start-up errors are named events, and a worker waits for its
coordinator with back-off, prints errors without gRPC debug strings and exits 0 when its job
is canceled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from kit.coordinator import Running, is_serving, running_coordinator
from kit.polling import wait_until
from kit.processes import child_env, free_port
from kit.workers import count_graph

from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink
from snapflow.worker.connectors.split_sources import GeneratorSource

T = TypeVar("T")
PROCESS_TIMEOUT_S = 60


def _events(stderr: str) -> list[dict[str, Any]]:
    """Every line parsed as a JSON object; fails naming the first line that is not."""
    events = []
    for number, line in enumerate(stderr.splitlines(), 1):
        try:
            event = json.loads(line)
        except ValueError:
            raise AssertionError(f"stderr line {number} is not JSON: {line!r}") from None
        assert isinstance(event, dict) and "event" in event, f"line {number}: {line!r}"
        events.append(event)
    return events


def _coordinator(port: int, redis_url: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "snapflow.cli",
            "coordinator",
            "--port",
            str(port),
            "--redis-url",
            redis_url,
            "--redis-namespace",
            f"json-log-{uuid.uuid4().hex[:8]}",
            "--metrics-port",
            "-1",
            "--storage-root",
            str(tmp_path / "cp"),
            "--log-format",
            "json",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(SNAPFLOW_SHUTDOWN_GRACE_S="1", **env),
        cwd=tmp_path,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Wait for the process and for everything it wrote (its log relay included)."""
    try:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    return proc.returncode, out, err


def test_a_json_log_stays_json_with_grpc_core_logging_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # GRPC_VERBOSITY=debug makes the C core write its own absl-format lines to stderr.
    port = free_port()
    proc = _coordinator(port, redis_server.url, tmp_path, GRPC_VERBOSITY="debug")
    try:
        wait_until(
            lambda: is_serving(f"127.0.0.1:{port}"),
            "the coordinator SERVING",
            timeout_s=30,
            interval_s=0.2,
            procs=[proc],
        )
        proc.send_signal(signal.SIGTERM)
    finally:
        code, out, err = _finish(proc)
    assert code == 0, err[-2000:]
    assert out == ""
    events = _events(err)
    names = [e["event"] for e in events]
    assert "coordinator.started" in names and names[-1] == "coordinator.stopped", names[-5:]
    core = [e for e in events if e["event"] == "grpc.core_log"]
    assert core, "GRPC_VERBOSITY=debug wrote no C-core line (the test would prove nothing)"
    assert {e["level"] for e in core} <= {"debug", "info", "warning", "error", "critical"}
    assert all(e["source"] and e["message"] is not None for e in core)


def test_a_busy_port_is_a_named_json_event(redis_server: RedisServer, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = _finish(_coordinator(port, redis_server.url, tmp_path))
    assert code == 1 and out == ""
    [failed] = [e for e in _events(err) if e["event"] == "coordinator.failed"]
    assert f"could not bind the gRPC port 127.0.0.1:{port}: it is in use" in failed["error"]
    assert failed["level"] == "error"


# --- snapflow worker --------------------------------------------------------------------------------


class Output:
    """Reads a process's stdout and stderr while it runs (so a test can wait for a line)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _read(stream: Any, lines: list[str]) -> None:
        with stream:
            for line in stream:
                lines.append(line)

    def finish(self) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=PROCESS_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for thread in self._threads:
            thread.join(10)
        return code, "".join(self.out), "".join(self.err)


def _worker(address: str, job_id: str, wait_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "snapflow.cli",
            "worker",
            "--coordinator",
            address,
            "--job",
            job_id,
            "--wait-for-coordinator",
            str(wait_s),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def test_worker_without_a_coordinator_gives_up_cleanly_after_its_wait() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err = _finish(_worker(address, uuid.uuid4().hex, 1.5))
    assert code == 1 and out == ""
    lines = err.splitlines()
    waits = [json.loads(line) for line in lines if "worker.waiting_for_coordinator" in line]
    assert len(waits) >= 2, err
    delays = [w["retry_in_s"] for w in waits]
    assert delays[1] > delays[0], f"no back-off: {delays}"
    assert "snapflow worker: UNAVAILABLE: " in err
    assert f"hint: is the coordinator running at {address}?" in err
    assert "debug_error_string" not in err and "Traceback" not in err


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


def test_worker_waits_for_a_late_coordinator_and_exits_0_when_its_job_is_canceled(
    redis_server: RedisServer, tmp_path: Path, loop: LoopThread
) -> None:
    port = free_port()
    job_id = uuid.uuid4().hex
    worker = _worker(f"127.0.0.1:{port}", job_id, 60)
    output = Output(worker)
    stack = contextlib.AsyncExitStack()
    try:
        wait_until(
            lambda: sum("worker.waiting_for_coordinator" in line for line in output.err) >= 2,
            "the worker retrying twice",
            timeout_s=30,
            interval_s=0.1,
            procs=[worker],
        )

        async def start() -> Running:
            return await stack.enter_async_context(
                running_coordinator(
                    redis_server.url,
                    str(tmp_path / "cp"),
                    port=port,
                    redis_namespace=f"late-{job_id[:8]}",
                )
            )

        running = loop.run(start())
        source = GeneratorSource(total_records=None, rate_per_s=2000, num_keys=10)
        graph = count_graph(
            source, KeyedCount("key"), TransactionalFileSink(str(tmp_path / "out")), parallelism=1
        )

        async def submit_and_wait_running() -> None:
            await running.stub.SubmitJob(
                cpb.SubmitJobRequest(
                    job_id=job_id, graph=graph, checkpoint_config=pb.CheckpointConfig()
                ),
                timeout=10,
            )
            deadline = time.monotonic() + 30
            while True:
                job = await running.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                if job.state == pb.JOB_STATE_RUNNING:
                    return
                assert time.monotonic() < deadline, f"job not RUNNING: {job.state}"
                assert worker.poll() is None, "the worker exited before the job ran"
                await asyncio.sleep(0.1)

        loop.run(submit_and_wait_running(), 60)

        async def cancel() -> None:
            await running.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=10)

        loop.run(cancel())
        code, out, err = output.finish()
    finally:
        if worker.poll() is None:
            worker.kill()
            output.finish()
        loop.run(stack.aclose())
    assert code == 0, err[-3000:]
    assert f"job {job_id} is CANCELED" in out
    assert "Traceback" not in err and "debug_error_string" not in err, err[-3000:]
    assert "worker.waiting_for_coordinator" in err


def test_worker_errors_name_the_status_without_debug_strings(
    redis_server: RedisServer, tmp_path: Path, loop: LoopThread
) -> None:
    stack = contextlib.AsyncExitStack()

    async def start() -> Running:
        return await stack.enter_async_context(
            running_coordinator(redis_server.url, str(tmp_path / "cp"), redis_namespace="w-err")
        )

    running = loop.run(start())
    try:
        code, out, err = _finish(_worker(running.address, uuid.uuid4().hex, 5))
    finally:
        loop.run(stack.aclose())
    assert code == 1 and out == ""
    assert "snapflow worker: NOT_FOUND: " in err
    assert "debug_error_string" not in err and "Traceback" not in err
    assert grpc.StatusCode.NOT_FOUND.name in err

"""The ``snapflow`` CLI against a real coordinator (the session's Redis, simulated agents).

The client commands run in-process (``snapflow.cli.main``) against a coordinator whose asyncio
loop runs in a background thread; ``snapflow coordinator`` itself runs as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import structlog
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from kit.coordinator import Running, is_serving, running_coordinator, submit, two_vertex_graph
from kit.polling import wait_until
from kit.simulated_agent import SimulatedAgent

from snapflow.cli.formatting import format_bytes
from snapflow.cli.main import main
from snapflow.cli.parser import build_parser
from snapflow.logging import configure_logging
from snapflow.redis_server import RedisServer
from snapflow.v1 import coordinator_pb2 as cpb

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
CALL_TIMEOUT_S = 15.0


class LoopThread:
    """An asyncio loop in a daemon thread; ``run`` executes a coroutine there, bounded."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="cli-test-loop")
        self.thread.daemon = True
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self.loop.shutdown_asyncgens(), 5)
            self.run(self.loop.shutdown_default_executor(), 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


@dataclass
class Env:
    loop: LoopThread
    coordinator: Running
    job_id: str
    tmp: Path
    agents: list[SimulatedAgent] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.coordinator.address

    def new_job(self, name: str = "cli-job") -> str:
        """A job with two agents hosting its four subtasks, all RUNNING."""

        async def go() -> str:
            job_id = await submit(self.coordinator.stub, two_vertex_graph(name=name))
            for i in range(2):
                agent = SimulatedAgent(self.address, job_id, [("src", i), ("map", i)])
                self.agents.append(agent)
                await agent.start()
                await agent.register_all()
            return job_id

        return self.loop.run(go())


@pytest.fixture(scope="module")
def env(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One coordinator for the module, with a running job that has completed checkpoint 1."""
    redis_server.flushall()
    tmp = tmp_path_factory.mktemp("cli")
    loop = LoopThread()
    stack = contextlib.AsyncExitStack()
    agents: list[SimulatedAgent] = []

    async def start() -> Running:
        return await stack.enter_async_context(
            running_coordinator(redis_server.url, str(tmp / "cp"))
        )

    async def trigger(running: Running, job_id: str) -> cpb.CheckpointSummary:
        return await running.stub.TriggerCheckpoint(
            cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
        )

    async def shutdown() -> None:
        for agent in agents:
            await agent.stop()
        await stack.aclose()

    saved_logging = structlog.get_config()
    root = logging.getLogger()
    root_level = root.level
    # The coordinator's log lines must not mix with the CLI's captured stdout.
    log_lines = io.StringIO()
    configure_logging("info", "json", stream=log_lines)
    try:
        running = loop.run(start())
        env = Env(loop, running, "", tmp, agents)
        env.job_id = env.new_job("cli-main")
        assert loop.run(trigger(running, env.job_id)).checkpoint_id == 1
        yield env
    finally:
        try:
            loop.run(shutdown())
        finally:
            loop.close()
            configure_logging("info", "auto")  # cached loggers: back to stderr
            structlog.configure(**saved_logging)
            for handler in list(root.handlers):
                if type(handler).__module__ == "snapflow.logging":
                    root.removeHandler(handler)
            root.setLevel(root_level)
    internal = [line for line in log_lines.getvalue().splitlines() if "internal_error" in line]
    assert not internal, internal


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def client(env: Env, command: str, *argv: str) -> list[str]:
    """``command ... --address <env> --timeout 10`` (subcommand words, then its arguments)."""
    return [*command.split(), *argv, "--address", env.address, "--timeout", "10"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- reading ---------------------------------------------------------------------------------------


def test_jobs_lists_the_running_job(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, *client(env, "jobs"))
    assert (code, err) == (0, "")
    line = next(line for line in out.splitlines() if env.job_id in line)
    assert "cli-main" in line and "RUNNING" in line and "4/4" in line


def test_jobs_json_parses(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, *client(env, "jobs", "--json"))
    assert code == 0
    jobs = {j["job_id"]: j for j in json.loads(out)["jobs"]}
    assert jobs[env.job_id]["state"] == "JOB_STATE_RUNNING"
    assert jobs[env.job_id]["running_tasks"] == 4


def test_job_shows_details_and_tasks(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, *client(env, "job", env.job_id))
    assert code == 0
    assert env.job_id in out and "RUNNING" in out
    task_lines = [line for line in out.splitlines() if re.search(r"\b(src|map)\b.*RUNNING", line)]
    assert len(task_lines) == 4

    code, out, _ = cli(capsys, *client(env, "job", env.job_id, "--json"))
    data = json.loads(out)
    assert data["job"]["job_id"] == env.job_id
    assert len(data["tasks"]) == 4


def test_checkpoints_list_shows_history_and_summary(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, *client(env, "checkpoints list", env.job_id))
    assert (code, err) == (0, "")
    assert re.search(r"completed [1-9]", out)
    row = next(line for line in out.splitlines() if re.match(r"\W*1\s.*CHECKPOINT", line))
    assert "COMPLETED" in row and "4/4" in row and "256 B" in row
    assert str(env.tmp / "cp" / env.job_id / "chk-1") in row
    assert "p99" in out and "End-to-end duration" in out

    code, out, _ = cli(capsys, *client(env, "checkpoints list", env.job_id, "--json"))
    stats = json.loads(out)
    assert int(stats["counts"]["completed"]) >= 1
    assert any(int(h["checkpoint_id"]) == 1 for h in stats["history"])


def test_checkpoints_show_lists_the_subtasks(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, *client(env, "checkpoints show", env.job_id, "1"))
    assert code == 0
    assert "COMPLETED" in out
    for task in ("src#0@1", "src#1@1", "map#0@1", "map#1@1"):
        row = next(line for line in out.splitlines() if task in line)
        assert "yes" in row and "64 B" in row

    code, out, _ = cli(capsys, *client(env, "checkpoints show", env.job_id, "1", "--json"))
    assert len(json.loads(out)["subtasks"]) == 4


# --- acting --------------------------------------------------------------------------------------


def test_trigger_prints_the_new_checkpoint(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, *client(env, "trigger", env.job_id))
    assert (code, err) == (0, "")
    match = re.search(r"Checkpoint (\d+) completed", out)
    assert match and int(match.group(1)) > 1
    assert "4/4 tasks" in out

    code, out, _ = cli(capsys, *client(env, "trigger", env.job_id, "--json"))
    summary = json.loads(out)
    assert summary["status"] == "CHECKPOINT_STATUS_COMPLETED"
    assert int(summary["checkpoint_id"]) > int(match.group(1))


def test_savepoint_to_a_relative_target_then_dispose(
    env: Env,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, *client(env, "savepoint", env.job_id, "--target", "sp"))
    assert (code, err) == (0, "")
    path = out.rsplit(": ", 1)[1].strip()
    assert path.startswith(str(tmp_path / "sp")), out
    assert os.path.isdir(path)

    code, out, err = cli(capsys, *client(env, "dispose-savepoint", path))
    assert (code, err) == (0, "")
    assert not os.path.exists(path)


def test_detached_savepoint_prints_a_request_id_to_poll(
    env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = str(tmp_path / "detached")
    code, out, err = cli(
        capsys, *client(env, "savepoint", env.job_id, "--target", target, "--detach", "--json")
    )
    assert (code, err) == (0, "")
    started = json.loads(out)
    assert started["status"] in (
        "SAVEPOINT_OPERATION_STATUS_IN_PROGRESS",
        "SAVEPOINT_OPERATION_STATUS_COMPLETED",
    )
    request_id = started["request_id"]

    def status() -> str:
        code, out, _ = cli(
            capsys, *client(env, "savepoint-status", env.job_id, request_id, "--json")
        )
        assert code == 0, out
        return str(json.loads(out)["status"])

    wait_until(lambda: status() == "SAVEPOINT_OPERATION_STATUS_COMPLETED", "savepoint done")
    code, out, err = cli(capsys, *client(env, "savepoint-status", env.job_id, request_id))
    assert (code, err) == (0, "")
    assert "Savepoint" in out and target in out.replace("\n", "")
    # The text form of --detach names the command to poll with.
    code, out, err = cli(capsys, *client(env, "savepoint", env.job_id, "--detach"))
    assert (code, err) == (0, "")
    assert f"snapflow savepoint-status {env.job_id} " in " ".join(out.split())
    code, out, err = cli(capsys, *client(env, "savepoint-status", env.job_id, "f" * 32))
    assert code == 1 and err.startswith("error: NOT_FOUND: ")


def test_cancel_then_cancel_again_is_a_failed_precondition(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = env.new_job("to-[bold]cancel[/bold] :smile:")
    code, out, _ = cli(capsys, *client(env, "jobs"))
    assert "to-[bold]cancel[/bold] :smile:" in out  # names are printed verbatim, no markup
    code, out, err = cli(capsys, *client(env, "cancel", job_id))
    assert (code, err) == (0, "")
    assert job_id in out and "CANCELED" in out

    code, out, err = cli(capsys, *client(env, "cancel", job_id))
    assert code == 1 and out == ""
    assert err.startswith("error: FAILED_PRECONDITION: ")
    assert "already" in err


def test_stop_with_savepoint(env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    job_id = env.new_job("to-stop")
    target = str(tmp_path / "stop")
    code, out, err = cli(capsys, *client(env, "stop", job_id, "--target", target, "--json"))
    assert (code, err) == (0, "")
    summary = json.loads(out)
    assert summary["kind"] == "CHECKPOINT_KIND_SAVEPOINT_SUSPEND"
    assert summary["external_path"].startswith(target)


# --- errors ----------------------------------------------------------------------------------------


def test_unknown_job_is_not_found(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, *client(env, "job", "0" * 32))
    assert (code, out) == (1, "")
    assert err.startswith("error: NOT_FOUND: ")


def test_malformed_job_id_is_invalid_argument(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, *client(env, "checkpoints list", "not-a-job"))
    assert code == 1
    assert err.startswith("error: INVALID_ARGUMENT: ") and "malformed" in err


def test_no_coordinator_is_unavailable_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    code, out, err = cli(capsys, "jobs", "--address", address, "--timeout", "5")
    assert (code, out) == (1, "")
    # UNAVAILABLE, not DEADLINE_EXCEEDED: it failed fast instead of waiting for its deadline.
    assert err.startswith("error: UNAVAILABLE: ")
    assert f"is the coordinator running at {address}?" in err


def test_address_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("SNAPFLOW_ADDRESS", address)
    code, _, err = cli(capsys, "jobs", "--timeout", "5")
    assert code == 1 and f"running at {address}?" in err


def test_coordinator_with_a_bad_port_is_a_config_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SNAPFLOW_CONFIG", raising=False)
    code, _, err = cli(capsys, "coordinator", "--port", "70000")
    assert code == 2
    assert "port" in err and "70000" in err and "out of range" in err


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("snapflow ")
    with pytest.raises(SystemExit) as exit_:
        main(["jobs", "--timeout", "-1"])
    assert exit_.value.code == 2
    capsys.readouterr()


def test_parser_knows_every_command() -> None:
    parser = build_parser()
    args = parser.parse_args(["coordinator", "--host", "0.0.0.0", "--metrics-port", "-1"])
    assert (args.host, args.metrics_port, args.port) == ("0.0.0.0", "-1", None)
    args = parser.parse_args(["stop", "j", "--drain", "--target", "/x"])
    assert (args.drain, args.target, args.timeout, args.json) == (True, "/x", 30.0, False)
    args = parser.parse_args(["demo"])
    assert (args.interval_ms, args.storage_root) == (1000, "./data/demo")
    assert not hasattr(args, "simulated")  # the simulated demo is gone (its agents are a test kit)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 2**20)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "5.0 MiB",
    ]


# --- snapflow coordinator ---------------------------------------------------------------------------


def _list_services(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = stub.ServerReflectionInfo(iter([request]), timeout=5)
        first = next(iter(responses))
        return [s.name for s in first.list_services_response.service]


def test_coordinator_command_serves_and_stops_gracefully_on_sigterm(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPFLOW_")}
    child_env["SNAPFLOW_SHUTDOWN_GRACE_S"] = "1"
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    log_path = tmp_path / "coordinator.log"
    with open(log_path, "wb") as log:
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
                redis_server.url,
                "--redis-namespace",
                "cli-test",
                "--metrics-port",
                "0",
                "--storage-root",
                str(tmp_path / "cp"),
                "--log-format",
                "json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env,
            cwd=tmp_path,
        )
    try:
        wait_until(
            lambda: is_serving(address),
            "the coordinator SERVING",
            timeout_s=20,
            interval_s=0.1,
            procs=[proc],
        )
        assert "snapflow.v1.CoordinatorService" in _list_services(address)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        events = [json.loads(line)["event"] for line in log_path.read_text().splitlines()]
        assert "coordinator.started" in events and "coordinator.stopped" in events
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


# --- JSON numbers, tables that fit, discarded checkpoints, ended jobs ---------------------------


def _int64_fields_are_numbers(value: Any, path: str = "") -> None:
    """No JSON string in the output is a number in disguise (the proto3 mapping of int64)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _int64_fields_are_numbers(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _int64_fields_are_numbers(v, f"{path}[{i}]")
    else:
        assert not (isinstance(value, str) and re.fullmatch(r"-?\d+", value)), (
            f"{path} is the string {value!r}, not a number"
        )


def test_json_prints_64_bit_integers_as_numbers(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = cli(capsys, *client(env, "checkpoints list", env.job_id, "--json"))
    assert code == 0
    stats = json.loads(out)
    _int64_fields_are_numbers(stats)
    assert isinstance(stats["counts"]["completed"], int) and stats["counts"]["completed"] >= 1
    first = stats["history"][-1]
    assert isinstance(first["checkpoint_id"], int) and first["trigger_timestamp_ms"] > 0
    for command in ("jobs", "job", "info", "checkpoints show"):
        args = {"jobs": (), "checkpoints show": (env.job_id, "1")}.get(command, (env.job_id,))
        code, out, _ = cli(capsys, *client(env, command, *args, "--json"))
        assert code == 0, command
        _int64_fields_are_numbers(json.loads(out), command)
    code, out, _ = cli(capsys, *client(env, "job", env.job_id, "--json"))
    assert isinstance(json.loads(out)["job"]["created_at_ms"], int)


def _last_cells(out: str) -> str:
    """The text of the last column of every table row, joined: a wrapped path comes back
    whole (its other columns are blank on the continuation lines)."""
    cells = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("│")]
        inner = [p for p in parts[1:-1]] if len(parts) > 2 else []
        if inner:
            cells.append(inner[-1])
    return "".join(cells)


def test_tables_fit_80_columns_without_cutting_ids_states_or_paths(
    env: Env, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    job_id = env.new_job("a-job-with-a-rather-long-name-" + "x" * 40)
    for _ in range(2):
        cli(capsys, *client(env, "trigger", job_id))
    commands = {
        "jobs": (),
        "job": (job_id,),
        "info": (job_id,),
        "checkpoints list": (job_id,),
        "checkpoints show": (job_id, "2"),
    }
    outputs = {}
    for command, args in commands.items():
        code, out, err = cli(capsys, *client(env, command, *args))
        assert (code, err) == (0, ""), command
        wide = [line for line in out.splitlines() if len(line) > 80]
        assert not wide, f"{command}: {len(wide)} lines wider than 80 columns: {wide[0]!r}"
        assert "…" not in out, f"{command} cut something:\n{out}"
        outputs[command] = out
    assert job_id in outputs["jobs"] and "RUNNING" in outputs["jobs"]
    assert job_id in outputs["job"]
    for state in ("RUNNING",):
        assert state in outputs["job"]
    stats = json.loads(cli(capsys, *client(env, "checkpoints list", job_id, "--json"))[1])
    paths = [s["external_path"] for s in stats["history"]]
    assert paths and all(p and p in _last_cells(outputs["checkpoints list"]) for p in paths)
    for kind in ("CHECKPOINT",):
        assert kind in outputs["checkpoints list"]
    assert "map#1@1" in outputs["checkpoints show"] and "src#0@1" in outputs["checkpoints show"]


def test_history_marks_checkpoints_discarded_by_retention(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = env.new_job("retention")  # retained: 1 (the default)
    for _ in range(3):
        assert cli(capsys, *client(env, "trigger", job_id))[0] == 0
    code, out, _ = cli(capsys, *client(env, "checkpoints list", job_id, "--json"))
    history = json.loads(out)["history"]
    assert [(s["checkpoint_id"], s["discarded"]) for s in history] == [
        (3, False),
        (2, True),
        (1, True),
    ]
    gone = [s["external_path"] for s in history if s["discarded"]]
    # Retention deletes their directories in the job's I/O queue, after the completion.
    wait_until(
        lambda: not any(os.path.exists(p) for p in gone),
        "the discarded checkpoints' directories deleted",
        timeout_s=10,
        interval_s=0.05,
    )
    code, out, _ = cli(capsys, *client(env, "checkpoints list", job_id))
    assert code == 0
    rows = {line.split()[1]: line for line in out.splitlines() if re.match(r"^│\s+\d ", line)}
    assert "DISCARDED" in rows["1"] and "DISCARDED" in rows["2"]
    assert "COMPLETED" in rows["3"] and "DISCARDED" not in rows["3"]
    assert "deleted by retention" in out


def test_trigger_on_an_ended_job_names_its_state(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = env.new_job("ended")
    assert cli(capsys, *client(env, "cancel", job_id))[0] == 0
    for command in ("trigger", "savepoint"):
        code, out, err = cli(capsys, *client(env, command, job_id))
        assert (code, out) == (1, "")
        assert err.startswith("error: FAILED_PRECONDITION: CHECKPOINT_COORDINATOR_SHUTDOWN: ")
        assert f"job {job_id} is CANCELED" in err, err
        assert "is shut down" not in err


def test_counts_and_latest_agree_after_a_coordinator_restart(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = f"cli-restart-{os.getpid()}"
    storage = str(tmp_path / "cp")
    loop = LoopThread()

    async def first_run() -> str:
        async with running_coordinator(redis_server.url, storage, redis_namespace=namespace) as c:
            job_id = await submit(c.stub, two_vertex_graph(1, 1), retained=2)
            agent = SimulatedAgent(c.address, job_id, [("src", 0), ("map", 0)])
            await agent.start()
            try:
                await agent.register_all()
                for _ in range(3):
                    await c.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                    )
            finally:
                await agent.stop()
            return job_id

    saved = structlog.get_config()
    configure_logging("warning", "json", stream=io.StringIO())
    try:
        job_id = loop.run(first_run(), 60)
        stack = contextlib.AsyncExitStack()

        async def restart() -> Running:
            return await stack.enter_async_context(
                running_coordinator(redis_server.url, storage, redis_namespace=namespace)
            )

        running = loop.run(restart())
        try:
            argv = ["--address", running.address, "--timeout", "10"]
            code, out, _ = cli(capsys, "checkpoints", "list", job_id, *argv, "--json")
            stats = json.loads(out)
            assert code == 0
            # Retained checkpoints 2 and 3 come back from Redis: counted, listed and latest.
            assert stats["counts"]["completed"] == stats["counts"]["triggered"] == 2
            assert [s["checkpoint_id"] for s in stats["history"]] == [3, 2]
            assert stats["latest_completed"]["checkpoint_id"] == 3
            code, out, _ = cli(capsys, "checkpoints", "list", job_id, *argv)
            assert "completed 2" in out and "#3 CHECKPOINT COMPLETED" in out
        finally:
            loop.run(stack.aclose())
    finally:
        loop.close()
        configure_logging("info", "auto")
        structlog.configure(**saved)

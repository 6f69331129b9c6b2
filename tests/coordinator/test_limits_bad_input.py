"""Input limits (snapflow/limits.py) over real gRPC: huge fields get INVALID_ARGUMENT at once
with a bounded message, and the same channel keeps serving; paths too long for any file
system are a client error, never a retry-later one; names, durations and vertices without
operators are refused with clear messages.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from kit.coordinator import running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import Code, Env, T, expect_error, fresh_namespace

from snapflow import limits
from snapflow.coordinator.grpc_errors import status_for
from snapflow.errors import InvalidArgumentError, StorageError
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

HUGE = 64 * 1024
# What the client accepts as the status message header; every message must stay far below.
MAX_STATUS_BYTES = limits.MAX_ERROR_MESSAGE_BYTES


def _bounded(error: grpc.aio.AioRpcError) -> str:
    details = error.details() or ""
    assert len(details.encode()) <= MAX_STATUS_BYTES, (
        f"{len(details.encode())} bytes: {details:.200}"
    )
    return details


# --- status messages are bounded ------------------------------------------------------------------


def test_status_messages_are_cut_and_the_full_text_is_logged() -> None:
    for text in ("x" * 100_000, "é" * 50_000, "\U0001f600" * 30_000):
        with structlog.testing.capture_logs() as logs:
            code, message = status_for(StorageError(f"cannot write {text}"))
        assert code is grpc.StatusCode.UNAVAILABLE
        assert len(message.encode()) <= MAX_STATUS_BYTES
        assert message.startswith("cannot write ") and message.endswith("bytes, cut)")
        [event] = [e for e in logs if e["event"] == "rpc.error_message_cut"]
        assert len(event["message"]) <= limits.MAX_LOGGED_VALUE_CHARS
        assert event["message"].startswith("cannot write " + text[:100])
    # A message that fits is passed through unchanged and not logged.
    with structlog.testing.capture_logs() as logs:
        assert status_for(InvalidArgumentError("job_id is required")) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "job_id is required",
        )
    assert logs == []


# --- 64 KiB fields: INVALID_ARGUMENT at once, the channel keeps serving -----------------------------


def test_64_kib_fields_are_refused_at_once_and_the_channel_keeps_serving(env: Env) -> None:
    async def body() -> None:
        stub = env.stub
        job_id = await submit(stub, two_vertex_graph(1, 1))
        huge_path = "/" + "d/" * (HUGE // 2)
        huge_name = "n" * HUGE
        calls: list[Awaitable[Any]] = [
            stub.GetJob(cpb.GetJobRequest(job_id=huge_name), timeout=T),
            stub.TriggerSavepoint(
                cpb.TriggerSavepointRequest(job_id=job_id, target_directory=huge_path), timeout=T
            ),
            stub.StopWithSavepoint(
                cpb.StopWithSavepointRequest(job_id=job_id, target_directory=huge_path), timeout=T
            ),
            stub.DisposeSavepoint(cpb.DisposeSavepointRequest(savepoint_path=huge_path), timeout=T),
            stub.SubmitJob(
                cpb.SubmitJobRequest(graph=two_vertex_graph(1, 1, name=huge_name)), timeout=T
            ),
            stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=two_vertex_graph(1, 1),
                    restore=cpb.RestoreSettings(savepoint_path=huge_path),
                ),
                timeout=T,
            ),
            stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=two_vertex_graph(1, 1),
                    checkpoint_config=pb.CheckpointConfig(storage_uri=huge_path),
                ),
                timeout=T,
            ),
            stub.RegisterTask(
                cpb.RegisterTaskRequest(job_id=job_id, vertex_id="src", address=huge_name),
                timeout=T,
            ),
        ]
        # INVALID_ARGUMENT each: none waited for its deadline (that would be DEADLINE_EXCEEDED).
        errors = [await expect_error(call, Code.INVALID_ARGUMENT) for call in calls]
        details = [_bounded(e) for e in errors]
        assert "is malformed" in details[0]
        assert all("bytes long" in d for d in details[1:4] + details[5:7]), details
        assert "graph.name has 65536 characters; at most 256" in details[4]
        assert "address has 65536 characters" in details[7]
        # The same channel serves the next calls.
        listed = await stub.ListJobs(cpb.ListJobsRequest(), timeout=T)
        assert job_id in [j.job_id for j in listed.jobs]
        info = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
        assert info.state == pb.JOB_STATE_CREATED
        await stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)

    env.loop.run(body())


def test_a_path_too_long_for_any_file_system_is_invalid_not_unavailable(env: Env) -> None:
    async def body() -> None:
        stub = env.stub
        long_path = str(env.storage_root) + ("/" + "d" * 200) * 41  # > 8 KiB
        long_segment = str(env.storage_root / ("s" * 300))
        for path, fragment in ((long_path, "PATH_MAX"), (long_segment, "NAME_MAX")):
            error = await expect_error(
                stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        graph=two_vertex_graph(1, 1),
                        restore=cpb.RestoreSettings(savepoint_path=path),
                    ),
                    timeout=T,
                ),
                Code.INVALID_ARGUMENT,
                "restore.savepoint_path",
                fragment,
            )
            _bounded(error)
            error = await expect_error(
                stub.DisposeSavepoint(cpb.DisposeSavepointRequest(savepoint_path=path), timeout=T),
                Code.INVALID_ARGUMENT,
                "savepoint_path",
                fragment,
            )
            _bounded(error)
        key = "s3://bucket/" + "k" * (limits.MAX_OBJECT_KEY_BYTES + 1)
        await expect_error(
            stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=two_vertex_graph(1, 1),
                    checkpoint_config=pb.CheckpointConfig(storage_uri=key),
                ),
                timeout=T,
            ),
            Code.INVALID_ARGUMENT,
            "checkpoint_config.storage_uri has an object key of 1025 bytes",
        )

    env.loop.run(body())


# --- names, sizes, durations ------------------------------------------------------------------------


def _graph_with(**changes: object) -> pb.JobGraph:
    graph = two_vertex_graph(1, 1)
    for path, value in changes.items():
        target: object = graph
        *parents, leaf = path.split("__")
        for part in parents:
            target = (
                getattr(target, part[:-1])[int(part[-1])]
                if part[-1].isdigit()
                else getattr(target, part)
            )
        setattr(target, leaf, value)
    return graph


@pytest.mark.parametrize(
    ("graph", "config", "fragments"),
    [
        (
            _graph_with(vertices0__name="v" * 4097),
            {},
            ("vertex 'src' name has 4097 characters; at most 4096",),
        ),
        (
            _graph_with(vertices1__operators0__name="o" * 1000),
            {},
            ("operator 'map-op' name has 1000 characters",),
        ),
        (
            _graph_with(vertices1__operators0__kind="k" * 300),
            {},
            ("operator 'map-op' kind has 300 characters",),
        ),
        (
            _graph_with(edges0__key_field="f" * 300),
            {},
            ("graph.edges[0].key_field has 300 characters",),
        ),
        (
            _graph_with(vertices0__vertex_id="v" * 201),
            {},
            ("graph.vertices[0].vertex_id", "characters)", "use 1-200 characters"),
        ),
        (
            None,
            {"interval_ms": 2**63 - 1},
            ("checkpoint_config.interval_ms", "maximum of 2147483647"),
        ),
        (None, {"timeout_ms": 2**31}, ("checkpoint_config.timeout_ms", "maximum")),
        (None, {"min_pause_ms": 2**40}, ("checkpoint_config.min_pause_ms", "maximum")),
        (
            None,
            {"aligned_checkpoint_timeout_ms": 2**62},
            ("checkpoint_config.aligned_checkpoint_timeout_ms", "maximum"),
        ),
        (None, {"max_concurrent": 1001}, ("checkpoint_config.max_concurrent 1001", "1000")),
        (None, {"retained": 2**31 - 1}, ("checkpoint_config.retained", "maximum of 1000")),
    ],
)
def test_names_sizes_and_durations_are_validated(
    env: Env, graph: pb.JobGraph | None, config: dict[str, int], fragments: tuple[str, ...]
) -> None:
    async def body() -> None:
        checkpoint_config = pb.CheckpointConfig()
        for name, value in config.items():
            setattr(checkpoint_config, name, value)
        request = cpb.SubmitJobRequest(
            graph=graph or two_vertex_graph(1, 1), checkpoint_config=checkpoint_config
        )
        error = await expect_error(
            env.stub.SubmitJob(request, timeout=T), Code.INVALID_ARGUMENT, *fragments
        )
        _bounded(error)

    env.loop.run(body())


def test_a_vertex_without_operators_is_refused(env: Env) -> None:
    async def body() -> None:
        graph = two_vertex_graph(1, 1)
        del graph.vertices[1].operators[:]
        await expect_error(
            env.stub.SubmitJob(cpb.SubmitJobRequest(graph=graph), timeout=T),
            Code.INVALID_ARGUMENT,
            "vertex 'map' has no operators",
        )

    env.loop.run(body())


def test_the_limits_themselves_are_accepted(env: Env) -> None:
    async def body() -> None:
        graph = _graph_with(name="j" * limits.MAX_NAME_CHARS, vertices0__name="v" * 256)
        job_id = await submit(
            env.stub,
            graph,
            interval_ms=limits.MAX_DURATION_MS,
            timeout_ms=limits.MAX_DURATION_MS,
            max_concurrent=limits.MAX_CONCURRENT_CHECKPOINTS,
            retained=limits.MAX_RETAINED_CHECKPOINTS,
        )
        info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
        assert info.checkpoint_config.interval_ms == limits.MAX_DURATION_MS
        assert info.name == "j" * 256
        await env.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)

    env.loop.run(body())


def test_a_1_mib_job_name_is_refused_below_the_message_size_limit(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # The default message limit (16 MiB) lets a 1 MiB name through to the validation. The
    # session's Redis directly (``redis_url`` would flush the shared coordinator's epoch).
    async def main() -> None:
        async with running_coordinator(
            redis_server.url, str(tmp_path / "cp"), redis_namespace=fresh_namespace()
        ) as c:
            graph = two_vertex_graph(1, 1, name="n" * (1 << 20))
            error = await expect_error(
                c.stub.SubmitJob(cpb.SubmitJobRequest(graph=graph), timeout=T),
                Code.INVALID_ARGUMENT,
                "graph.name has 1048576 characters; at most 256",
            )
            _bounded(error)
            listed = await c.stub.ListJobs(cpb.ListJobsRequest(), timeout=T)
            assert list(listed.jobs) == []

    asyncio.run(main())


def test_task_failures_and_decline_messages_are_kept_cut_not_refused(env: Env) -> None:
    async def body() -> None:
        stub = env.stub
        job_id = await submit(stub, two_vertex_graph(1, 1))
        attempts = []
        for vertex in ("src", "map"):
            registered = await stub.RegisterTask(
                cpb.RegisterTaskRequest(job_id=job_id, vertex_id=vertex, address="127.0.0.1:1"),
                timeout=T,
            )
            attempts.append(registered.attempt)
        await stub.UpdateTaskState(
            cpb.UpdateTaskStateRequest(
                job_id=job_id,
                attempt=attempts[0],
                state=pb.TASK_STATE_FAILED,
                failure="Traceback\n" + "x" * HUGE,
            ),
            timeout=T,
        )
        tasks = await stub.ListTasks(cpb.ListTasksRequest(job_id=job_id), timeout=T)
        [failed] = [t for t in tasks.tasks if t.state == pb.TASK_STATE_FAILED]
        assert len(failed.failure) == limits.MAX_FAILURE_CHARS
        assert failed.failure.startswith("Traceback\nxxx") and failed.failure.endswith(", cut)")
        await stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)

    env.loop.run(body())

"""The coordinator's bad-input matrix kit: one coordinator shared by a test module on a loop
thread, Redis snapshots to prove nothing changed, and helpers that drive jobs, acks and errors.

Used by the ``tests/coordinator/test_*_bad_input.py`` modules (every malformed, impossible or
stale request gets a precise status and a helpful message, and leaves nothing corrupted
behind). gRPC asyncio objects are bound to the loop that created them, so the shared
coordinator cannot be shared across ``asyncio.run`` calls: test bodies are coroutines run on
``env.loop`` with a hard time limit. The session's ``redis_server`` is used directly: the
``redis_url`` fixture would FLUSHALL the shared coordinator's epoch key between tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kit.coordinator import Running, running_coordinator, submit, two_vertex_graph
from kit.polling import wait_until_async
from kit.simulated_agent import SimulatedAgent, always_ack
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

T = 5.0  # deadline of every RPC a test makes (seconds)
TEST_BUDGET_S = 30.0  # hard limit of one test body
MAX_MESSAGE_BYTES = 1_048_576
SERVICE = "/snapflow.v1.CoordinatorService/"

Code = grpc.StatusCode
R = TypeVar("R")


# ---------------------------------------------------------------------------------------------
# Infrastructure: a loop thread, the shared coordinator, Redis snapshots
# ---------------------------------------------------------------------------------------------


class LoopThread:
    """An asyncio loop running in a daemon thread; ``run`` executes a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="bad-input-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, R], timeout_s: float = TEST_BUDGET_S) -> R:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"test body did not finish within {timeout_s} s") from None

    def close(self) -> None:
        async def drain() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        try:
            self.run(drain(), 15)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(15)
            self.loop.close()


@dataclass
class Env:
    loop: LoopThread
    redis_url: str
    namespace: str
    storage_root: Path
    coordinator: Running

    @property
    def stub(self) -> cgrpc.CoordinatorServiceAsyncStub:
        return self.coordinator.stub

    @property
    def address(self) -> str:
        return self.coordinator.address

    def job_dir(self, job_id: str) -> Path:
        return self.storage_root / job_id

    def job_keys(self, job_id: str) -> dict[str, Any]:
        return redis_snapshot(self.redis_url, f"{self.namespace}:job:{job_id}*")

    def jobs_set(self) -> dict[str, Any]:
        return redis_snapshot(self.redis_url, f"{self.namespace}:jobs")


def fresh_namespace() -> str:
    return f"badinput-{uuid.uuid4().hex[:10]}"


def open_env(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The module-scoped ``env`` fixture's body (tests/coordinator/conftest.py): one coordinator
    on a loop thread, under a fresh Redis namespace, shared by a test module."""
    loop = LoopThread()
    try:
        namespace = fresh_namespace()
        root = Path(os.path.realpath(tmp_path_factory.mktemp("bad-input"))) / "cp"
        cm = running_coordinator(
            redis_server.url,
            str(root),
            redis_namespace=namespace,
            max_message_bytes=MAX_MESSAGE_BYTES,
        )
        running = loop.run(cm.__aenter__())
        try:
            yield Env(loop, redis_server.url, namespace, root, running)
        finally:
            loop.run(cm.__aexit__(None, None, None))
    finally:
        loop.close()


def redis_snapshot(url: str, pattern: str) -> dict[str, Any]:
    """Every key matching ``pattern`` with its full value (by type)."""
    client = redis.Redis.from_url(url)
    try:
        out: dict[str, Any] = {}
        for key in sorted(client.scan_iter(match=pattern, count=1000)):
            kind = client.type(key)
            if kind == b"string":
                value: Any = client.get(key)
            elif kind == b"hash":
                value = client.hgetall(key)
            elif kind == b"zset":
                value = client.zrange(key, 0, -1, withscores=True)
            elif kind == b"set":
                value = client.smembers(key)
            else:
                value = client.dump(key)
            out[key.decode()] = value
        return out
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


async def expect_error(
    call: Awaitable[Any], code: grpc.StatusCode, *fragments: str
) -> grpc.aio.AioRpcError:
    """Await ``call``; it must fail with ``code`` and details containing every fragment."""
    try:
        result = await call
    except grpc.aio.AioRpcError as error:
        details = error.details() or ""
        assert error.code() == code, f"expected {code.name}, got {error.code().name}: {details!r}"
        for fragment in fragments:
            assert fragment.lower() in details.lower(), f"{fragment!r} not in {details!r}"
        return error
    raise AssertionError(f"expected {code.name}, but the call succeeded: {result!r:.300}")


def write_file(path: Path | str, data: bytes = b"state") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def ignore_all(task: pb.TaskAttempt, checkpoint_id: int) -> str:
    return "ignore"


def decline_all(task: pb.TaskAttempt, checkpoint_id: int) -> str:
    return "decline"


def attempt(vertex_id: str = "src", subtask_index: int = 0, number: int = 1) -> pb.TaskAttempt:
    return pb.TaskAttempt(vertex_id=vertex_id, subtask_index=subtask_index, attempt=number)


def ack_request(
    job_id: str,
    task: pb.TaskAttempt,
    checkpoint_id: int,
    *paths: str,
    metrics: pb.SubtaskCheckpointMetrics | None = None,
    size_bytes: int = 5,
) -> cpb.AcknowledgeCheckpointRequest:
    handles = [pb.StateHandle(path=p, size_bytes=size_bytes, kind="operator") for p in paths]
    return cpb.AcknowledgeCheckpointRequest(
        job_id=job_id,
        attempt=task,
        checkpoint_id=checkpoint_id,
        operator_states=[
            pb.OperatorSubtaskState(operator_id=f"{task.vertex_id}-op", handles=handles)
        ],
        metrics=metrics or pb.SubtaskCheckpointMetrics(sync_duration_ms=1),
    )


async def ack(
    stub: cgrpc.CoordinatorServiceAsyncStub,
    job_id: str,
    task: pb.TaskAttempt,
    checkpoint_id: int,
    *paths: str,
) -> int:
    response = await stub.AcknowledgeCheckpoint(
        ack_request(job_id, task, checkpoint_id, *paths), timeout=T
    )
    return int(response.result)


async def checkpoint_details(
    stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str, checkpoint_id: int
) -> cpb.CheckpointDetails:
    """GetCheckpointDetails of one checkpoint of the job."""
    return await stub.GetCheckpointDetails(
        cpb.GetCheckpointDetailsRequest(job_id=job_id, checkpoint_id=checkpoint_id), timeout=T
    )


async def ack_all_by_hand(
    stub: cgrpc.CoordinatorServiceAsyncStub,
    job_id: str,
    agent: SimulatedAgent,
    checkpoint_id: int,
    location: str,
) -> None:
    """Acknowledge ``checkpoint_id`` for every task of ``agent`` with a real file each."""
    for (vertex_id, index), task in agent.attempts.items():
        path = write_file(Path(location) / f"manual-{vertex_id}-{index}-{task.attempt}.state")
        assert await ack(stub, job_id, task, checkpoint_id, str(path)) == cpb.ACK_RESULT_SUCCESS


@dataclass
class JobUnderTest:
    id: str
    agent: SimulatedAgent
    dir: Path

    def task(self, vertex_id: str = "src", index: int = 0) -> pb.TaskAttempt:
        return self.agent.attempts[(vertex_id, index)]


@contextlib.asynccontextmanager
async def job_with_agent(
    c: Running,
    storage_root: Path,
    *,
    policy: Callable[[pb.TaskAttempt, int], str] = always_ack,
    register: bool = True,
    running: bool = True,
    **config: Any,
) -> AsyncIterator[JobUnderTest]:
    """A job ``src(1) -> map(1)`` with one SimulatedAgent hosting both subtasks. On exit the
    job is canceled (aborting anything pending) and the agent stopped."""
    job_id = await submit(c.stub, two_vertex_graph(1, 1), **config)
    agent = SimulatedAgent(c.address, job_id, [("src", 0), ("map", 0)], policy=policy)
    await agent.start()
    try:
        if register:
            await agent.register_all(running=running)
        yield JobUnderTest(job_id, agent, storage_root / job_id)
    finally:
        canceled_before = agent.canceled
        try:
            await c.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)
        except grpc.aio.AioRpcError:
            pass  # already canceled or failed by the test
        else:
            if agent.attempts:  # let the CancelTask RPC land before the agent goes away
                with contextlib.suppress(AssertionError):
                    await wait_until_async(
                        lambda: agent.canceled > canceled_before, "cancel", timeout_s=1.0
                    )
        await agent.stop()


async def checkpoint_completes(
    stub: cgrpc.CoordinatorServiceAsyncStub, job: JobUnderTest
) -> cpb.CheckpointSummary:
    """The job still works: a manual checkpoint completes end to end."""
    job.agent.policy = always_ack
    summary = await stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job.id), timeout=10)
    assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
    assert summary.num_acknowledged == summary.num_tasks == 2
    assert os.path.isfile(os.path.join(summary.external_path, "_metadata"))
    return summary


async def start_pending_checkpoint(
    stub: cgrpc.CoordinatorServiceAsyncStub, job: JobUnderTest, timeout_s: float = 10
) -> tuple[asyncio.Task[cpb.CheckpointSummary], int]:
    """Trigger a checkpoint that nobody acknowledges (the agent's policy must ignore it);
    returns the waiting TriggerCheckpoint call and the checkpoint id."""
    before = len(job.agent.triggered)

    async def trigger() -> cpb.CheckpointSummary:
        return await stub.TriggerCheckpoint(
            cpb.TriggerCheckpointRequest(job_id=job.id), timeout=timeout_s
        )

    task = asyncio.create_task(trigger())
    try:
        await wait_until_async(
            lambda: len(job.agent.triggered) > before, "trigger reached the agent"
        )
    except BaseException:
        task.cancel()
        raise
    return task, job.agent.triggered[-1]


async def finish(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` if still running and swallow its outcome (test clean-up)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def health_status(channel: grpc.aio.Channel) -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=T
    )
    return int(response.status)


async def _status_is(channel: grpc.aio.Channel, wanted: int) -> bool:
    return await health_status(channel) == wanted


def ack_outcome(outcome: cpb.AckOutcome) -> tuple[str, str]:
    """(result name, or status name of the error; error message) of one batched ack."""
    if outcome.error_code:
        code = next(c for c in Code if c.value[0] == outcome.error_code)
        return code.name, outcome.error_message
    return cpb.AckResult.Name(outcome.result), ""

"""Bad input over real gRPC: every malformed, impossible or stale request gets a precise status
and a helpful message, and leaves nothing corrupted behind (Redis keys unchanged, no file outside
the job's storage touched, the job can still complete a checkpoint).

One coordinator is shared by the module: it runs on an event loop in a background thread (gRPC
asyncio objects are bound to the loop that created them, so it cannot be shared across
``asyncio.run`` calls), under its own Redis namespace, and every test works on its own job. Test
bodies are coroutines run on that loop with a hard time limit. Tests that need a coordinator of
their own (fencing, coordinator restart, poisoned ListJobs) start it on the same loop under a
fresh namespace. The session's ``redis_server`` is used directly: the ``redis_url`` fixture
would FLUSHALL the shared coordinator's epoch key between tests.

Bugs this matrix found were fixed; their tests now guard against regressions.
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

from snapflow.coordinator.config import load_settings
from snapflow.coordinator.server import Coordinator
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.runtime.simulated_agent import SimulatedAgent, always_ack

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
    def stub(self) -> cgrpc.CoordinatorServiceStub:
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


@pytest.fixture(scope="module")
def env(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
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


async def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)


async def stays_true(predicate: Callable[[], bool], what: str, duration_s: float = 0.2) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + duration_s
    while loop.time() < end:
        assert predicate(), what
        await asyncio.sleep(0.01)


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
    stub: cgrpc.CoordinatorServiceStub,
    job_id: str,
    task: pb.TaskAttempt,
    checkpoint_id: int,
    *paths: str,
) -> int:
    response = await stub.AcknowledgeCheckpoint(
        ack_request(job_id, task, checkpoint_id, *paths), timeout=T
    )
    return int(response.result)


async def ack_all_by_hand(
    stub: cgrpc.CoordinatorServiceStub,
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
                    await wait_until(lambda: agent.canceled > canceled_before, "cancel", 1.0)
        await agent.stop()


async def checkpoint_completes(
    stub: cgrpc.CoordinatorServiceStub, job: JobUnderTest
) -> cpb.CheckpointSummary:
    """The job still works: a manual checkpoint completes end to end."""
    job.agent.policy = always_ack
    summary = await stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job.id), timeout=10)
    assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
    assert summary.num_acknowledged == summary.num_tasks == 2
    assert os.path.isfile(os.path.join(summary.external_path, "_metadata"))
    return summary


async def start_pending_checkpoint(
    stub: cgrpc.CoordinatorServiceStub, job: JobUnderTest, timeout_s: float = 10
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
        await wait_until(lambda: len(job.agent.triggered) > before, "trigger reached the agent")
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


async def wait_until_async_status(
    channel: grpc.aio.Channel, wanted: int, timeout_s: float = 5
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    status = await health_status(channel)
    while status != wanted:
        if loop.time() > deadline:
            raise AssertionError(f"health status {status}, expected {wanted}")
        await asyncio.sleep(0.01)
        status = await health_status(channel)


# ---------------------------------------------------------------------------------------------
# 1. Job ids: unknown (NOT_FOUND) and malformed (INVALID_ARGUMENT) for every job-scoped RPC
# ---------------------------------------------------------------------------------------------


async def _watch_first(stub: cgrpc.CoordinatorServiceStub, job_id: str) -> Any:
    call = stub.WatchJob(cpb.WatchJobRequest(job_id=job_id), timeout=T)
    try:
        return await call.read()
    finally:
        call.cancel()


JobRpc = Callable[[cgrpc.CoordinatorServiceStub, str], Awaitable[Any]]

JOB_RPCS: dict[str, JobRpc] = {
    "GetJob": lambda s, j: s.GetJob(cpb.GetJobRequest(job_id=j), timeout=T),
    "CancelJob": lambda s, j: s.CancelJob(cpb.CancelJobRequest(job_id=j), timeout=T),
    "WatchJob": _watch_first,
    "RegisterTask": lambda s, j: s.RegisterTask(
        cpb.RegisterTaskRequest(job_id=j, vertex_id="src", subtask_index=0, address="127.0.0.1:9"),
        timeout=T,
    ),
    "UpdateTaskState": lambda s, j: s.UpdateTaskState(
        cpb.UpdateTaskStateRequest(job_id=j, attempt=attempt(), state=pb.TASK_STATE_RUNNING),
        timeout=T,
    ),
    "ListTasks": lambda s, j: s.ListTasks(cpb.ListTasksRequest(job_id=j), timeout=T),
    "AcknowledgeCheckpoint": lambda s, j: s.AcknowledgeCheckpoint(
        ack_request(j, attempt(), 1), timeout=T
    ),
    "DeclineCheckpoint": lambda s, j: s.DeclineCheckpoint(
        cpb.DeclineCheckpointRequest(job_id=j, attempt=attempt(), checkpoint_id=1), timeout=T
    ),
    "TriggerCheckpoint": lambda s, j: s.TriggerCheckpoint(
        cpb.TriggerCheckpointRequest(job_id=j), timeout=T
    ),
    "TriggerSavepoint": lambda s, j: s.TriggerSavepoint(
        cpb.TriggerSavepointRequest(job_id=j), timeout=T
    ),
    "StopWithSavepoint": lambda s, j: s.StopWithSavepoint(
        cpb.StopWithSavepointRequest(job_id=j), timeout=T
    ),
    "GetCheckpointStats": lambda s, j: s.GetCheckpointStats(
        cpb.GetCheckpointStatsRequest(job_id=j), timeout=T
    ),
    "GetCheckpointDetails": lambda s, j: s.GetCheckpointDetails(
        cpb.GetCheckpointDetailsRequest(job_id=j, checkpoint_id=1), timeout=T
    ),
}


@pytest.mark.parametrize("rpc", list(JOB_RPCS))
def test_unknown_job_id_is_not_found(env: Env, rpc: str) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            JOB_RPCS[rpc](env.stub, job_id), Code.NOT_FOUND, job_id, "does not exist"
        )
        # nothing was created for the unknown id
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert await asyncio.to_thread(env.jobs_set) == jobs_before
        assert not env.job_dir(job_id).exists()

    env.loop.run(main())


MALFORMED_JOB_IDS = {
    "empty": ("", "job_id is required"),
    "xyz": ("xyz", "malformed"),
    "33-chars": (uuid.UUID(int=7).hex + "a", "malformed"),
    "upper-case-hex": (uuid.UUID(int=0xABCDEF).hex.upper(), "malformed"),
    "path-traversal": ("../../" + "0" * 26, "malformed"),
}


@pytest.mark.parametrize("rpc", list(JOB_RPCS))
@pytest.mark.parametrize("bad_id", list(MALFORMED_JOB_IDS))
def test_malformed_job_id_is_invalid_argument(env: Env, bad_id: str, rpc: str) -> None:
    async def main() -> None:
        value, fragment = MALFORMED_JOB_IDS[bad_id]
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            JOB_RPCS[rpc](env.stub, value), Code.INVALID_ARGUMENT, "job_id", fragment
        )
        assert await asyncio.to_thread(env.jobs_set) == jobs_before

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 2. SubmitJob: invalid graphs, configs, job ids, restore settings, duplicates
# ---------------------------------------------------------------------------------------------


def vertex(
    vertex_id: str,
    parallelism: int = 1,
    *,
    source: bool = False,
    max_parallelism: int = 0,
    operators: tuple[str, ...] | None = None,
) -> pb.JobVertex:
    ops = operators if operators is not None else (f"{vertex_id}-op",)
    return pb.JobVertex(
        vertex_id=vertex_id,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        is_source=source,
        operators=[pb.OperatorSpec(operator_id=o, kind="map") for o in ops],
    )


def edge(src: str, dst: str, partitioner: int = pb.PARTITIONER_KIND_HASH) -> pb.JobEdge:
    return pb.JobEdge(source_vertex_id=src, target_vertex_id=dst, partitioner=partitioner)  # type: ignore[arg-type]


def graph(vertices: list[pb.JobVertex], edges: list[pb.JobEdge] | None = None) -> pb.JobGraph:
    return pb.JobGraph(name="bad", vertices=vertices, edges=edges or [])


SRC = vertex("src", source=True)

INVALID_GRAPHS = [
    pytest.param(graph([]), "graph.vertices is empty", id="no-vertices"),
    pytest.param(graph([SRC, vertex("src")]), "'src' is duplicated", id="duplicate-vertex-id"),
    pytest.param(
        graph([vertex("src", 0, source=True)]), "parallelism 0 out of range", id="parallelism-0"
    ),
    pytest.param(
        graph([vertex("src", -3, source=True)]),
        "parallelism -3 out of range",
        id="negative-parallelism",
    ),
    pytest.param(
        graph([vertex("src", 9, source=True, max_parallelism=8)]),
        "parallelism 9 out of range 1..8",
        id="parallelism-above-max-parallelism",
    ),
    pytest.param(
        graph([vertex("src", 1, source=True, max_parallelism=32_769)]),
        "max_parallelism 32769 out of range 1..32768",
        id="max-parallelism-above-32768",
    ),
    pytest.param(
        graph([vertex("src", 1, source=True, max_parallelism=-1)]),
        "max_parallelism -1 out of range",
        id="negative-max-parallelism",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "ghost")]),
        "unknown vertex 'ghost'",
        id="edge-to-unknown-vertex",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("ghost", "map")]),
        "unknown vertex 'ghost'",
        id="edge-from-unknown-vertex",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "map"), edge("map", "map")]),
        "self loop on 'map'",
        id="self-loop",
    ),
    pytest.param(
        graph(
            [SRC, vertex("a"), vertex("b")],
            [edge("src", "a"), edge("a", "b"), edge("b", "a")],
        ),
        "cycle",
        id="cycle",
    ),
    pytest.param(
        graph([vertex("a"), vertex("b")], [edge("a", "b")]), "no source vertex", id="no-source"
    ),
    pytest.param(
        graph([SRC, vertex("map", 2)], [edge("src", "map", pb.PARTITIONER_KIND_FORWARD)]),
        "FORWARD needs equal parallelism",
        id="forward-unequal-parallelism",
    ),
    pytest.param(
        graph([SRC, vertex("src2", source=True)], [edge("src", "src2")]),
        "points into source vertex 'src2'",
        id="edge-into-source",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "map", pb.PARTITIONER_KIND_UNSPECIFIED)]),
        "partitioner must be FORWARD, HASH, REBALANCE or BROADCAST",
        id="unspecified-partitioner",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "map", 99)]),
        "partitioner must be",
        id="unknown-partitioner-99",
    ),
    pytest.param(
        graph([vertex("a/b", source=True)]), "'a/b' is invalid", id="vertex-id-with-slash"
    ),
    pytest.param(
        graph([vertex("a b", source=True)]), "'a b' is invalid", id="vertex-id-with-space"
    ),
    pytest.param(graph([vertex("../x", source=True)]), "is invalid", id="vertex-id-path-traversal"),
    pytest.param(graph([vertex("", source=True)]), "vertex_id is required", id="empty-vertex-id"),
    pytest.param(graph([vertex("v" * 201, source=True)]), "is invalid", id="vertex-id-too-long"),
    pytest.param(
        graph([vertex("src", source=True, operators=("op", "op"))]),
        "operator_id 'op' is duplicated",
        id="duplicate-operator-id",
    ),
    pytest.param(
        graph([vertex("src", source=True, operators=("op;rm -rf",))]),
        "is invalid",
        id="bad-operator-id",
    ),
    pytest.param(
        graph([vertex("src", source=True, operators=("",))]),
        "operator_id is required",
        id="empty-operator-id",
    ),
    pytest.param(
        graph([vertex(f"v{i}", source=True) for i in range(1001)]),
        "at most 1000",
        id="too-many-vertices",
    ),
]


@pytest.mark.parametrize(("bad_graph", "fragment"), INVALID_GRAPHS)
def test_submit_invalid_graph_is_invalid_argument(
    env: Env, bad_graph: pb.JobGraph, fragment: str
) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(cpb.SubmitJobRequest(job_id=job_id, graph=bad_graph), timeout=T),
            Code.INVALID_ARGUMENT,
            fragment,
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert await asyncio.to_thread(env.jobs_set) == jobs_before
        await expect_error(
            env.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T), Code.NOT_FOUND
        )

    env.loop.run(main())


INVALID_CONFIGS = [
    pytest.param({"interval_ms": -1}, "interval_ms must be >= 0", id="negative-interval"),
    pytest.param(
        {"interval_ms": 5}, "interval_ms 5 is below the minimum of 10 ms", id="interval-5ms"
    ),
    pytest.param({"timeout_ms": 5}, "timeout_ms 5 is below the minimum of 10 ms", id="timeout-5ms"),
    pytest.param({"timeout_ms": -100}, "timeout_ms must be >= 0", id="negative-timeout"),
    pytest.param({"min_pause_ms": -1}, "min_pause_ms must be >= 0", id="negative-min-pause"),
    pytest.param(
        {"max_concurrent": -1}, "max_concurrent must be >= 0", id="negative-max-concurrent"
    ),
    pytest.param(
        {"tolerable_failures": -2},
        "tolerable_failures must be >= 0",
        id="negative-tolerable-failures",
    ),
    pytest.param({"retained": -1}, "retained must be >= 0", id="negative-retained"),
    pytest.param({"mode": 99}, "mode 99 is not a known CheckpointMode", id="unknown-mode-99"),
    pytest.param(
        {"mode": pb.CHECKPOINT_MODE_UNALIGNED, "aligned_checkpoint_timeout_ms": 100},
        "applies only to ALIGNED",
        id="aligned-timeout-with-unaligned",
    ),
    pytest.param(
        {"mode": pb.CHECKPOINT_MODE_AT_LEAST_ONCE, "aligned_checkpoint_timeout_ms": 100},
        "applies only to ALIGNED",
        id="aligned-timeout-with-at-least-once",
    ),
    pytest.param(
        {"aligned_checkpoint_timeout_ms": -5},
        "aligned_checkpoint_timeout_ms must be >= 0",
        id="negative-aligned-timeout",
    ),
    pytest.param(
        {"storage_uri": "s3://bucket/checkpoints"},
        "only local or shared file systems",
        id="storage-uri-s3",
    ),
    pytest.param(
        {"storage_uri": "hdfs://nn:8020/cp"},
        "only local or shared file systems",
        id="storage-uri-hdfs",
    ),
    pytest.param(
        {"storage_uri": "file://otherhost/checkpoints"},
        "names the host",
        id="storage-uri-file-with-host",
    ),
    pytest.param(
        {"storage_uri": "file:///tmp/checkpoints?x=1"},
        "query",
        id="storage-uri-file-with-query",
    ),
    pytest.param(
        {"storage_uri": "/tmp/check\x00points"},
        "NUL byte",
        id="storage-uri-nul-byte",
    ),
    pytest.param(
        {"storage_uri": "relative/checkpoints"},
        "absolute",
        id="storage-uri-relative",
    ),
    pytest.param(
        {"storage_uri": "file://"},
        "absolute",
        id="storage-uri-bare-file-scheme",
    ),
]


@pytest.mark.parametrize(("config", "fragment"), INVALID_CONFIGS)
def test_submit_invalid_checkpoint_config_is_invalid_argument(
    env: Env, config: dict[str, Any], fragment: str
) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        request = cpb.SubmitJobRequest(
            job_id=job_id, graph=two_vertex_graph(), checkpoint_config=pb.CheckpointConfig(**config)
        )
        await expect_error(
            env.stub.SubmitJob(request, timeout=T),
            Code.INVALID_ARGUMENT,
            "checkpoint_config" if "storage_uri" not in config else "storage",
            fragment,
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}, "a job record was left in Redis"
        assert await asyncio.to_thread(env.jobs_set) == jobs_before
        # the id is still free: a valid submission with it succeeds
        response = await env.stub.SubmitJob(
            cpb.SubmitJobRequest(job_id=job_id, graph=two_vertex_graph()), timeout=T
        )
        assert response.job.job_id == job_id
        await env.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)

    env.loop.run(main())


def test_rejected_storage_uri_does_not_break_the_next_coordinator_start(
    env: Env, tmp_path: Path
) -> None:
    async def main() -> None:
        namespace = fresh_namespace()
        root = str(tmp_path / "cp")
        async with running_coordinator(env.redis_url, root, redis_namespace=namespace) as c:
            await expect_error(
                c.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        graph=two_vertex_graph(),
                        checkpoint_config=pb.CheckpointConfig(storage_uri="file://otherhost/cp"),
                    ),
                    timeout=T,
                ),
                Code.INVALID_ARGUMENT,
                "names the host",
            )
        # Started by hand, not with running_coordinator: when start() fails, the half-started
        # coordinator must still be stopped (its Redis connection would leak otherwise).
        restarted = Coordinator(
            load_settings(
                overrides={
                    "host": "127.0.0.1",
                    "port": 0,
                    "metrics_port": -1,
                    "redis_url": env.redis_url,
                    "redis_namespace": namespace,
                    "storage_root": root,
                    "shutdown_grace_s": 0.5,
                },
                environ={},
            )
        )
        try:
            try:
                await restarted.start()
            except Exception as error:  # the coordinator cannot even start
                raise AssertionError(
                    f"coordinator restart failed: {type(error).__name__}: {error}"
                ) from None
            assert restarted.manager is not None and restarted.manager.jobs == {}
        finally:
            await restarted.stop()

    env.loop.run(main())


INVALID_SUBMIT_IDS = [
    pytest.param("xyz", "malformed", id="job-id-xyz"),
    pytest.param(uuid.UUID(int=1).hex + "0", "malformed", id="job-id-33-chars"),
    pytest.param(uuid.UUID(int=0xFEED).hex.upper(), "malformed", id="job-id-upper-case"),
    pytest.param("../" + "a" * 29, "malformed", id="job-id-path-traversal"),
]


@pytest.mark.parametrize(("job_id", "fragment"), INVALID_SUBMIT_IDS)
def test_submit_malformed_job_id_is_invalid_argument(env: Env, job_id: str, fragment: str) -> None:
    async def main() -> None:
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(job_id=job_id, graph=two_vertex_graph()), timeout=T
            ),
            Code.INVALID_ARGUMENT,
            "job_id",
            fragment,
        )
        assert await asyncio.to_thread(env.jobs_set) == jobs_before

    env.loop.run(main())


INVALID_RESTORES = [
    pytest.param(
        cpb.RestoreSettings(latest=True),
        Code.INVALID_ARGUMENT,
        "restore.latest needs an existing job",
        id="latest-for-new-job",
    ),
    pytest.param(
        cpb.RestoreSettings(checkpoint_id=3),
        Code.INVALID_ARGUMENT,
        "restore.checkpoint_id",
        id="checkpoint-id-for-new-job",
    ),
    pytest.param(
        cpb.RestoreSettings(checkpoint_id=-1),
        Code.INVALID_ARGUMENT,
        "checkpoint_id must be >= 1",
        id="negative-checkpoint-id",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path=""),
        Code.INVALID_ARGUMENT,
        "empty",
        id="empty-savepoint-path",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path="/nonexistent/savepoint-abc"),
        Code.NOT_FOUND,
        "no checkpoint metadata",
        id="missing-savepoint",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path="s3://bucket/savepoint-abc"),
        Code.INVALID_ARGUMENT,
        "URI scheme",
        id="s3-savepoint",
    ),
]


@pytest.mark.parametrize(("restore", "code", "fragment"), INVALID_RESTORES)
def test_submit_invalid_restore_settings(
    env: Env, restore: cpb.RestoreSettings, code: grpc.StatusCode, fragment: str
) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(job_id=job_id, graph=two_vertex_graph(), restore=restore),
                timeout=T,
            ),
            code,
            fragment,
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert await asyncio.to_thread(env.jobs_set) == jobs_before

    env.loop.run(main())


def test_submit_restore_from_garbage_metadata_is_invalid_argument(env: Env, tmp_path: Path) -> None:
    async def main() -> None:
        savepoint = tmp_path / "savepoint-bogus"
        write_file(savepoint / "_metadata", b"\x00\x01 not json")
        job_id = uuid.uuid4().hex
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(
                    job_id=job_id,
                    graph=two_vertex_graph(),
                    restore=cpb.RestoreSettings(savepoint_path=str(savepoint)),
                ),
                timeout=T,
            ),
            Code.INVALID_ARGUMENT,
            "invalid checkpoint metadata",
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert (savepoint / "_metadata").read_bytes() == b"\x00\x01 not json"

    env.loop.run(main())


def test_duplicate_job_id_is_already_exists_and_leaves_the_running_job_alone(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            info_before = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            other = graph([vertex("x", 3, source=True)])
            await expect_error(
                env.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        job_id=job.id,
                        graph=other,
                        checkpoint_config=pb.CheckpointConfig(interval_ms=10),
                    ),
                    timeout=T,
                ),
                Code.ALREADY_EXISTS,
                job.id,
                "already exists",
            )
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info_after = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info_after == info_before
            assert info_after.state == pb.JOB_STATE_RUNNING
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 3. RegisterTask and UpdateTaskState
# ---------------------------------------------------------------------------------------------

REGISTER_CASES = [
    pytest.param(
        {"vertex_id": "ghost"},
        Code.FAILED_PRECONDITION,
        "'ghost' is not part of the job graph",
        id="unknown-vertex",
    ),
    pytest.param(
        {"subtask_index": 1},
        Code.FAILED_PRECONDITION,
        "subtask index 1 is out of range for vertex 'src' (parallelism 1)",
        id="subtask-index-out-of-range",
    ),
    pytest.param(
        {"subtask_index": 2**31 - 1},
        Code.FAILED_PRECONDITION,
        "out of range",
        id="subtask-index-int32-max",
    ),
    pytest.param(
        {"subtask_index": -1},
        Code.INVALID_ARGUMENT,
        "subtask_index must be >= 0",
        id="negative-index",
    ),
    pytest.param({"address": ""}, Code.INVALID_ARGUMENT, "address is required", id="empty-address"),
    pytest.param(
        {"vertex_id": ""}, Code.INVALID_ARGUMENT, "vertex_id is required", id="empty-vertex-id"
    ),
]


@pytest.mark.parametrize(("override", "code", "fragment"), REGISTER_CASES)
def test_register_task_bad_input(
    env: Env, override: dict[str, Any], code: grpc.StatusCode, fragment: str
) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            tasks_before = await env.stub.ListTasks(cpb.ListTasksRequest(job_id=job.id), timeout=T)
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            fields: dict[str, Any] = {
                "job_id": job.id,
                "vertex_id": "src",
                "subtask_index": 0,
                "address": job.agent.address,
                **override,
            }
            await expect_error(
                env.stub.RegisterTask(cpb.RegisterTaskRequest(**fields), timeout=T), code, fragment
            )
            # no redeployment happened: same attempts, all still running, Redis untouched
            tasks_after = await env.stub.ListTasks(cpb.ListTasksRequest(job_id=job.id), timeout=T)
            assert tasks_after == tasks_before
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert (info.state, info.restarts, info.running_tasks) == (pb.JOB_STATE_RUNNING, 0, 2)
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


UPDATE_CASES = [
    pytest.param(
        {"attempt": attempt("src", 0, 0)},
        Code.INVALID_ARGUMENT,
        "attempt.attempt must be >= 1",
        id="attempt-0",
    ),
    pytest.param(
        {"attempt": attempt("src", 0, -4)},
        Code.INVALID_ARGUMENT,
        "attempt.attempt must be >= 1",
        id="negative-attempt",
    ),
    pytest.param(
        {"attempt": attempt("src", -1, 1)},
        Code.INVALID_ARGUMENT,
        "subtask_index must be >= 0",
        id="negative-subtask-index",
    ),
    pytest.param(
        {"attempt": None},
        Code.INVALID_ARGUMENT,
        "attempt.vertex_id is required",
        id="missing-attempt",
    ),
    pytest.param(
        {"attempt": attempt("ghost", 0, 1)},
        Code.FAILED_PRECONDITION,
        "not part of the job graph",
        id="unknown-vertex",
    ),
    pytest.param(
        {"attempt": attempt("src", 5, 1)},
        Code.FAILED_PRECONDITION,
        "not part of the job graph",
        id="subtask-index-out-of-range",
    ),
    pytest.param(
        {"attempt": attempt("src", 0, 7)},
        Code.FAILED_PRECONDITION,
        "attempt 7 of task src#0 is not current",
        id="future-attempt",
    ),
    pytest.param(
        {"state": pb.TASK_STATE_UNSPECIFIED},
        Code.INVALID_ARGUMENT,
        "state must be RUNNING, FINISHED, FAILED or CANCELED",
        id="state-unspecified",
    ),
    pytest.param(
        {"state": pb.TASK_STATE_DEPLOYING},
        Code.INVALID_ARGUMENT,
        "state must be RUNNING, FINISHED, FAILED or CANCELED",
        id="state-deploying",
    ),
    pytest.param(
        {"state": 99},
        Code.INVALID_ARGUMENT,
        "state must be RUNNING, FINISHED, FAILED or CANCELED",
        id="state-99",
    ),
]


@pytest.mark.parametrize(("override", "code", "fragment"), UPDATE_CASES)
def test_update_task_state_bad_input(
    env: Env, override: dict[str, Any], code: grpc.StatusCode, fragment: str
) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            tasks_before = await env.stub.ListTasks(cpb.ListTasksRequest(job_id=job.id), timeout=T)
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            fields: dict[str, Any] = {
                "job_id": job.id,
                "attempt": job.task("src", 0),
                "state": pb.TASK_STATE_FAILED,  # would restart the job if it were accepted
                "failure": "bogus",
                **override,
            }
            if fields["attempt"] is None:
                del fields["attempt"]
            await expect_error(
                env.stub.UpdateTaskState(cpb.UpdateTaskStateRequest(**fields), timeout=T),
                code,
                fragment,
            )
            assert (
                await env.stub.ListTasks(cpb.ListTasksRequest(job_id=job.id), timeout=T)
            ) == tasks_before
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert (info.state, info.restarts) == (pb.JOB_STATE_RUNNING, 0)
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


def test_stale_attempt_is_refused_ignored_and_its_state_discarded(env: Env) -> None:
    """After a redeployment (attempt 2), messages of attempt 1: UpdateTaskState is
    FAILED_PRECONDITION, an ack is UNKNOWN (its state deleted), a decline changes nothing."""

    async def main() -> None:
        async with job_with_agent(
            env.coordinator, env.storage_root, tolerable_failures_unlimited=True
        ) as job:
            await job.agent.set_state(pb.TASK_STATE_FAILED, "boom", only=("map", 0))
            await job.agent.register_all()  # deployment 2
            assert job.task().attempt == 2
            stale = attempt("src", 0, 1)
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            for state in (pb.TASK_STATE_FAILED, pb.TASK_STATE_RUNNING, pb.TASK_STATE_FINISHED):
                await expect_error(
                    env.stub.UpdateTaskState(
                        cpb.UpdateTaskStateRequest(job_id=job.id, attempt=stale, state=state),
                        timeout=T,
                    ),
                    Code.FAILED_PRECONDITION,
                    "attempt 1 of task src#0 is not current (current attempt is 2)",
                )
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert (info.state, info.restarts, info.running_tasks) == (pb.JOB_STATE_RUNNING, 1, 2)

            job.agent.policy = ignore_all
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                stale_file = write_file(job.dir / "taskowned" / "stale-attempt.state")
                assert (
                    await ack(env.stub, job.id, stale, checkpoint_id, str(stale_file))
                    == cpb.ACK_RESULT_UNKNOWN
                )
                await wait_until(lambda: not stale_file.exists(), "stale ack's state deleted")
                await env.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=job.id, attempt=stale, checkpoint_id=checkpoint_id, message="stale"
                    ),
                    timeout=T,
                )
                assert not trigger.done(), "a stale decline aborted the checkpoint"
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                assert details.summary.status == pb.CHECKPOINT_STATUS_IN_PROGRESS
                assert details.summary.num_acknowledged == 0
                location = details.summary.external_path
                await ack_all_by_hand(env.stub, job.id, job.agent, checkpoint_id, location)
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 4. AcknowledgeCheckpoint / DeclineCheckpoint
# ---------------------------------------------------------------------------------------------


def test_ack_for_unknown_checkpoint_is_unknown_and_its_state_is_discarded(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await checkpoint_completes(env.stub, job)  # checkpoint 1
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            state = write_file(job.dir / "taskowned" / "unknown-999.state")
            assert (
                await ack(env.stub, job.id, job.task(), 999, str(state)) == cpb.ACK_RESULT_UNKNOWN
            )
            await wait_until(lambda: not state.exists(), "state of the unknown ack deleted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            stats = await env.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.id), timeout=T
            )
            assert (stats.counts.completed, stats.counts.failed, stats.counts.in_progress) == (
                1,
                0,
                0,
            )
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_late_ack_for_expired_checkpoint_is_discarded_and_its_state_deleted(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(
            env.coordinator,
            env.storage_root,
            policy=ignore_all,
            timeout_ms=250,
            tolerable_failures_unlimited=True,
        ) as job:
            await expect_error(
                env.stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job.id), timeout=T),
                Code.ABORTED,
                "EXPIRED",
            )
            chk = job.dir / "chk-1"
            await wait_until(lambda: not chk.exists(), "expired checkpoint's directory cleaned up")
            await wait_until(
                lambda: not redis_snapshot(env.redis_url, f"{env.namespace}:job:{job.id}:pending"),
                "pending record removed",
            )
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            late = write_file(job.dir / "taskowned" / "late-1.state")
            assert await ack(env.stub, job.id, job.task(), 1, str(late)) == cpb.ACK_RESULT_DISCARDED
            await wait_until(lambda: not late.exists(), "late ack's state deleted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info.state == pb.JOB_STATE_RUNNING
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_duplicate_ack_of_a_completed_checkpoint_keeps_its_state(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            summary = await checkpoint_completes(env.stub, job)
            original = Path(summary.external_path) / "src-0-1.state"
            assert original.is_file()
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            extra = write_file(job.dir / "taskowned" / "duplicate-extra.state")
            result = await ack(
                env.stub, job.id, job.task(), summary.checkpoint_id, str(original), str(extra)
            )
            assert result == cpb.ACK_RESULT_DUPLICATE
            await wait_until(lambda: not extra.exists(), "duplicate ack's new state deleted")
            await stays_true(original.is_file, "the completed checkpoint's state was deleted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_duplicate_ack_of_a_pending_checkpoint_is_duplicate(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                location = Path(details.summary.external_path)
                first = write_file(location / "src-first.state")
                assert (
                    await ack(env.stub, job.id, job.task(), checkpoint_id, str(first))
                    == cpb.ACK_RESULT_SUCCESS
                )
                again = write_file(location / "src-again.state")
                for paths in ((str(first),), (str(first), str(again))):
                    assert (
                        await ack(env.stub, job.id, job.task(), checkpoint_id, *paths)
                        == cpb.ACK_RESULT_DUPLICATE
                    )
                await wait_until(lambda: not again.exists(), "duplicate's new state deleted")
                assert first.is_file(), "the first ack's state was deleted by its duplicate"
                task_map = job.task("map", 0)
                map_state = write_file(location / "map.state")
                assert (
                    await ack(env.stub, job.id, task_map, checkpoint_id, str(map_state))
                    == cpb.ACK_RESULT_SUCCESS
                )
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
                assert summary.num_acknowledged == 2
                assert first.is_file() and map_state.is_file()
            finally:
                await finish(trigger)
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


ACK_FIELD_CASES = [
    pytest.param({"checkpoint_id": 0}, "checkpoint_id must be >= 1, got 0", id="checkpoint-id-0"),
    pytest.param(
        {"checkpoint_id": -5}, "checkpoint_id must be >= 1, got -5", id="negative-checkpoint-id"
    ),
    pytest.param(
        {"metrics": pb.SubtaskCheckpointMetrics(sync_duration_ms=-1)},
        "metrics: sync_duration_ms must be >= 0",
        id="negative-sync-duration",
    ),
    pytest.param(
        {"metrics": pb.SubtaskCheckpointMetrics(state_size_bytes=-1)},
        "state_size_bytes must be >= 0",
        id="negative-state-size",
    ),
    pytest.param(
        {"metrics": pb.SubtaskCheckpointMetrics(persisted_in_flight_bytes=-(2**40))},
        "persisted_in_flight_bytes must be >= 0",
        id="negative-in-flight-bytes",
    ),
    pytest.param({"size_bytes": -1}, "size_bytes must be >= 0", id="negative-handle-size"),
    pytest.param({"attempt": attempt("src", 0, 0)}, "attempt.attempt must be >= 1", id="attempt-0"),
]


@pytest.mark.parametrize(("override", "fragment"), ACK_FIELD_CASES)
def test_ack_with_invalid_fields_is_invalid_argument(
    env: Env, override: dict[str, Any], fragment: str
) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                state = write_file(Path(details.summary.external_path) / "src-bad-ack.state")
                request = ack_request(
                    job.id,
                    override.get("attempt", job.task()),
                    override.get("checkpoint_id", checkpoint_id),
                    str(state),
                    metrics=override.get("metrics"),
                    size_bytes=override.get("size_bytes", 5),
                )
                keys_before = await asyncio.to_thread(env.job_keys, job.id)
                await expect_error(
                    env.stub.AcknowledgeCheckpoint(request, timeout=T),
                    Code.INVALID_ARGUMENT,
                    fragment,
                )
                assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                assert details.summary.num_acknowledged == 0, "the invalid ack was counted"
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)

    env.loop.run(main())


@dataclass
class PathContext:
    job_dir: Path
    victim: Path
    other_victim: Path
    link: Path


BAD_STATE_PATHS = [
    pytest.param(lambda x: str(x.victim), "lies outside", id="absolute-path-outside-storage"),
    pytest.param(
        lambda x: os.path.join(x.job_dir, "chk-1", os.path.relpath(x.victim, x.job_dir / "chk-1")),
        "lies outside",
        id="dotdot-escape-from-job-dir",
    ),
    pytest.param(lambda x: str(x.other_victim), "lies outside", id="other-jobs-dir"),
    pytest.param(lambda x: str(x.link), "lies outside", id="symlink-in-job-dir-to-outside"),
    pytest.param(lambda x: f"file://{x.victim}", "lies outside", id="file-uri-outside"),
    pytest.param(lambda x: "chk-1/src-0-1.state", "is relative", id="relative-path"),
    pytest.param(lambda x: "../../etc/passwd", "is relative", id="relative-dotdot-etc-passwd"),
    pytest.param(lambda x: "s3://bucket/state", "URI scheme", id="s3-uri"),
    pytest.param(lambda x: f"{x.victim}\x00.state", "NUL byte", id="nul-byte"),
    pytest.param(lambda x: str(x.job_dir), "lies outside", id="the-job-dir-itself"),
    pytest.param(lambda x: "", "empty path", id="empty-path"),
    pytest.param(lambda x: "   ", "empty", id="blank-path"),
]


@pytest.mark.parametrize(("make_path", "fragment"), BAD_STATE_PATHS)
def test_ack_with_state_path_outside_the_job_storage_is_refused_and_never_deleted(
    env: Env, tmp_path: Path, make_path: Callable[[PathContext], str], fragment: str
) -> None:
    """The victim files are real files outside the job's directory (stand-ins for /etc/passwd:
    the tests run as root, so the real one is never offered). They must survive an invalid ack,
    the checkpoint's completion and an aborted checkpoint."""

    async def main() -> None:
        async with job_with_agent(
            env.coordinator, env.storage_root, policy=ignore_all, tolerable_failures_unlimited=True
        ) as job:
            victim = write_file(tmp_path / "outside" / "passwd", b"root:x:0:0")
            other_job = await submit(env.stub, two_vertex_graph(1, 1))
            other_victim = write_file(env.job_dir(other_job) / "chk-1" / "src-0-1.state", b"theirs")
            link = job.dir / "taskowned" / "link.state"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(victim)
            ctx = PathContext(job.dir, victim, other_victim, link)
            bad = make_path(ctx)
            victims = {victim: victim.read_bytes(), other_victim: other_victim.read_bytes()}

            def untouched() -> bool:
                return all(p.is_file() and p.read_bytes() == d for p, d in victims.items())

            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                keys_before = await asyncio.to_thread(env.job_keys, job.id)
                for target_id in (checkpoint_id, 999):  # a pending and an unknown checkpoint
                    await expect_error(
                        env.stub.AcknowledgeCheckpoint(
                            ack_request(job.id, job.task(), target_id, bad), timeout=T
                        ),
                        Code.INVALID_ARGUMENT,
                        fragment,
                    )
                assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                assert details.summary.num_acknowledged == 0
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)
            assert untouched()

            # the same refused ack into a checkpoint that then aborts (declined)
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                await expect_error(
                    env.stub.AcknowledgeCheckpoint(
                        ack_request(job.id, job.task(), checkpoint_id, bad), timeout=T
                    ),
                    Code.INVALID_ARGUMENT,
                    fragment,
                )
                await env.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=job.id,
                        attempt=job.task("map", 0),
                        checkpoint_id=checkpoint_id,
                        reason=cpb.DECLINE_REASON_SNAPSHOT_FAILED,
                        message="test decline",
                    ),
                    timeout=T,
                )
                await expect_error(trigger, Code.ABORTED, "DECLINED")
            finally:
                await finish(trigger)
            chk = job.dir / f"chk-{checkpoint_id}"
            await wait_until(lambda: not chk.exists(), "aborted checkpoint cleaned up")
            await stays_true(untouched, "a file outside the job's storage was touched")
            assert link.is_symlink()
            await env.stub.CancelJob(cpb.CancelJobRequest(job_id=other_job), timeout=T)

    env.loop.run(main())


@pytest.mark.parametrize(
    "alias",
    [
        pytest.param(
            lambda chk: os.path.join(chk, "_metadata"),
            id="metadata-of-retained-checkpoint",
        ),
        pytest.param(
            lambda chk: os.path.join(chk, ".", "src-0-1.state"),
            id="dot-alias-of-retained-state",
        ),
        pytest.param(
            lambda chk: chk.replace("/chk-", "//chk-") + "/src-0-1.state",
            id="double-slash-alias-of-retained-state",
        ),
        pytest.param(
            lambda chk: os.path.join(chk, "src-0-1.state"),
            id="exact-path-of-retained-state",
        ),
    ],
)
def test_unknown_ack_never_deletes_files_of_a_retained_checkpoint(
    env: Env, alias: Callable[[str], str]
) -> None:

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            summary = await checkpoint_completes(env.stub, job)
            chk = summary.external_path
            files = {p: p.read_bytes() for p in Path(chk).iterdir()}
            assert Path(chk, "_metadata") in files and Path(chk, "src-0-1.state") in files
            result = await ack(env.stub, job.id, job.task(), 999, alias(chk))
            assert result == cpb.ACK_RESULT_UNKNOWN
            # a sentinel discarded after the bogus ack marks when its discard has run
            sentinel = write_file(job.dir / "taskowned" / "sentinel.state")
            assert (
                await ack(env.stub, job.id, job.task(), 998, str(sentinel))
                == cpb.ACK_RESULT_UNKNOWN
            )
            await wait_until(lambda: not sentinel.exists(), "sentinel discarded")
            missing = sorted(str(p) for p in files if not p.is_file())
            assert not missing, (
                f"files of retained checkpoint {summary.checkpoint_id} deleted: {missing}"
            )
            assert await checkpoint_completes(env.stub, job)

    env.loop.run(main())


def _outcome(outcome: cpb.AckOutcome) -> tuple[str, str]:
    """(result name, or status name of the error; error message) of one batched ack."""
    if outcome.error_code:
        code = next(c for c in Code if c.value[0] == outcome.error_code)
        return code.name, outcome.error_message
    return cpb.AckResult.Name(outcome.result), ""


def test_batched_acks_are_judged_one_by_one(env: Env, tmp_path: Path) -> None:
    """AcknowledgeCheckpoints: every ack of a batch gets its own outcome (the bad ones the status
    the unary RPC would give), the good ones still count, and no bad path is ever deleted."""

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                location = Path(details.summary.external_path)
                good = write_file(location / "src-batched.state")
                victim = write_file(tmp_path / "outside" / "victim", b"keep me")
                unknown_state = write_file(job.dir / "taskowned" / "batched-unknown.state")
                src = job.task("src", 0)
                bad_metrics = pb.SubtaskCheckpointMetrics(start_delay_ms=-1)
                cases = [
                    (ack_request(job.id, src, checkpoint_id, str(good)), "ACK_RESULT_SUCCESS", ""),
                    (ack_request(uuid.uuid4().hex, src, checkpoint_id), "NOT_FOUND", "not exist"),
                    (ack_request("XYZ", src, checkpoint_id), "INVALID_ARGUMENT", "malformed"),
                    (
                        ack_request(job.id, src, checkpoint_id, str(victim)),
                        "INVALID_ARGUMENT",
                        "lies outside",
                    ),
                    (ack_request(job.id, src, 0), "INVALID_ARGUMENT", "checkpoint_id must be >= 1"),
                    (
                        ack_request(job.id, src, checkpoint_id, metrics=bad_metrics),
                        "INVALID_ARGUMENT",
                        "start_delay_ms must be >= 0",
                    ),
                    (
                        ack_request(job.id, attempt("src", 0, 0), checkpoint_id),
                        "INVALID_ARGUMENT",
                        "attempt.attempt must be >= 1",
                    ),
                    (ack_request(job.id, src, 999, str(unknown_state)), "ACK_RESULT_UNKNOWN", ""),
                    (
                        ack_request(job.id, src, checkpoint_id, str(good)),
                        "ACK_RESULT_DUPLICATE",
                        "",
                    ),
                ]
                response = await env.stub.AcknowledgeCheckpoints(
                    cpb.AcknowledgeCheckpointsRequest(acks=[c[0] for c in cases]), timeout=T
                )
                assert len(response.outcomes) == len(cases)
                for i, ((_, want, fragment), outcome) in enumerate(
                    zip(cases, response.outcomes, strict=True)
                ):
                    got, message = _outcome(outcome)
                    assert got == want, (i, got, message)
                    assert fragment.lower() in message.lower(), (i, message)
                await wait_until(lambda: not unknown_state.exists(), "unknown ack's state deleted")
                assert good.is_file() and victim.read_bytes() == b"keep me"

                # too many acks in one call: refused as a whole, none of them applied
                map_task = job.task("map", 0)
                flood = [ack_request(job.id, map_task, checkpoint_id)] * 4097
                await expect_error(
                    env.stub.AcknowledgeCheckpoints(
                        cpb.AcknowledgeCheckpointsRequest(acks=flood), timeout=T
                    ),
                    Code.INVALID_ARGUMENT,
                    "4097 acks in one call; at most 4096",
                )
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                assert details.summary.num_acknowledged == 1
                map_state = write_file(location / "map-batched.state")
                response = await env.stub.AcknowledgeCheckpoints(
                    cpb.AcknowledgeCheckpointsRequest(
                        acks=[ack_request(job.id, map_task, checkpoint_id, str(map_state))]
                    ),
                    timeout=T,
                )
                assert _outcome(response.outcomes[0]) == ("ACK_RESULT_SUCCESS", "")
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
                assert good.is_file() and map_state.is_file() and victim.is_file()
            finally:
                await finish(trigger)

    env.loop.run(main())


def test_decline_with_invalid_fields_is_invalid_argument(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                for fields, fragment in (
                    ({"checkpoint_id": 0}, "checkpoint_id must be >= 1"),
                    ({"checkpoint_id": -1}, "checkpoint_id must be >= 1"),
                    ({"attempt": attempt("src", 0, 0)}, "attempt.attempt must be >= 1"),
                    ({"attempt": pb.TaskAttempt()}, "attempt.vertex_id is required"),
                ):
                    request = cpb.DeclineCheckpointRequest(
                        job_id=job.id,
                        attempt=fields.get("attempt", job.task()),
                        checkpoint_id=fields.get("checkpoint_id", checkpoint_id),
                        message="bad",
                    )
                    await expect_error(
                        env.stub.DeclineCheckpoint(request, timeout=T),
                        Code.INVALID_ARGUMENT,
                        fragment,
                    )
                # an unknown task's decline is ignored: the checkpoint stays pending
                await env.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=job.id, attempt=attempt("ghost", 0, 1), checkpoint_id=checkpoint_id
                    ),
                    timeout=T,
                )
                assert not trigger.done()
                details = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                    timeout=T,
                )
                assert details.summary.status == pb.CHECKPOINT_STATUS_IN_PROGRESS
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                assert (
                    await asyncio.wait_for(trigger, 10)
                ).status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 5. Trigger refusals, declines, deadlines
# ---------------------------------------------------------------------------------------------

TRIGGERS: dict[str, Callable[[cgrpc.CoordinatorServiceStub, str, str, float], Awaitable[Any]]] = {
    "TriggerCheckpoint": lambda s, j, target, t: s.TriggerCheckpoint(
        cpb.TriggerCheckpointRequest(job_id=j), timeout=t
    ),
    "TriggerSavepoint": lambda s, j, target, t: s.TriggerSavepoint(
        cpb.TriggerSavepointRequest(job_id=j, target_directory=target), timeout=t
    ),
    "StopWithSavepoint": lambda s, j, target, t: s.StopWithSavepoint(
        cpb.StopWithSavepointRequest(job_id=j, target_directory=target), timeout=t
    ),
}


@pytest.mark.parametrize("rpc", list(TRIGGERS))
@pytest.mark.parametrize("phase", ["not-registered", "deploying", "one-task-failed"])
def test_trigger_before_all_tasks_run_is_refused(env: Env, phase: str, rpc: str) -> None:
    async def main() -> None:
        async with job_with_agent(
            env.coordinator,
            env.storage_root,
            register=phase != "not-registered",
            running=phase == "one-task-failed",
        ) as job:
            if phase == "one-task-failed":
                await job.agent.set_state(pb.TASK_STATE_FAILED, "boom", only=("map", 0))
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            await expect_error(
                TRIGGERS[rpc](env.stub, job.id, "", T),
                Code.FAILED_PRECONDITION,
                "NOT_ALL_REQUIRED_TASKS_RUNNING",
            )
            # refused before an id was allocated: no counter, no pending record, no directory
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            assert not list(job.dir.glob("chk-*"))
            # a refused stop-with-savepoint leaves nothing behind: the job still checkpoints
            await job.agent.register_all()
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 1

    env.loop.run(main())


def test_canceled_job_refuses_triggers_registration_and_a_second_cancel(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await env.stub.CancelJob(cpb.CancelJobRequest(job_id=job.id), timeout=T)
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            for rpc, trigger in TRIGGERS.items():
                error = await expect_error(
                    trigger(env.stub, job.id, "", T),
                    Code.FAILED_PRECONDITION,
                    "CHECKPOINT_COORDINATOR_SHUTDOWN",
                )
                assert error.details(), rpc
            await expect_error(
                env.stub.CancelJob(cpb.CancelJobRequest(job_id=job.id), timeout=T),
                Code.FAILED_PRECONDITION,
                "already canceled",
            )
            await expect_error(
                env.stub.RegisterTask(
                    cpb.RegisterTaskRequest(
                        job_id=job.id, vertex_id="src", subtask_index=0, address=job.agent.address
                    ),
                    timeout=T,
                ),
                Code.FAILED_PRECONDITION,
                "cannot register",
            )
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info.state == pb.JOB_STATE_CANCELED

    env.loop.run(main())


@pytest.mark.parametrize("rpc", ["TriggerSavepoint", "StopWithSavepoint"])
@pytest.mark.parametrize(
    "target",
    [
        pytest.param("relative-savepoint-target", id="relative"),
        pytest.param("./sp", id="dot-relative"),
        pytest.param("file://relative-savepoint-target", id="file-uri-relative"),
        pytest.param("s3://bucket/savepoints", id="s3-uri"),
    ],
)
def test_savepoint_with_bad_target_is_invalid_argument(env: Env, target: str, rpc: str) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            await expect_error(
                TRIGGERS[rpc](env.stub, job.id, target, T),
                Code.INVALID_ARGUMENT,
                "target_directory",
                "must be an absolute path",
            )
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            assert not Path("relative-savepoint-target").exists()
            # a refused stop-with-savepoint did not stop the job
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info.state == pb.JOB_STATE_RUNNING
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


def test_declined_checkpoint_is_aborted_with_declined(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(
            env.coordinator, env.storage_root, policy=decline_all, tolerable_failures_unlimited=True
        ) as job:
            await expect_error(
                env.stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job.id), timeout=T),
                Code.ABORTED,
                "DECLINED",
                "simulated snapshot failure",
            )
            await wait_until(
                lambda: not (job.dir / "chk-1").exists(), "declined checkpoint cleaned"
            )
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info.state == pb.JOB_STATE_RUNNING
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_trigger_with_short_client_deadline_is_deadline_exceeded(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            await expect_error(
                env.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job.id), timeout=0.3
                ),
                Code.DEADLINE_EXCEEDED,
            )
            # the checkpoint is still pending and may still complete
            details = await env.stub.GetCheckpointDetails(
                cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=1), timeout=T
            )
            assert details.summary.status == pb.CHECKPOINT_STATUS_IN_PROGRESS
            await ack_all_by_hand(env.stub, job.id, job.agent, 1, details.summary.external_path)

            async def completed() -> bool:
                d = await env.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=1), timeout=T
                )
                return d.summary.status == pb.CHECKPOINT_STATUS_COMPLETED

            for _ in range(200):
                if await completed():
                    break
                await asyncio.sleep(0.01)
            assert await completed()
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 6. Stats, details, DisposeSavepoint
# ---------------------------------------------------------------------------------------------


def test_checkpoint_details_and_stats_bad_input(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await checkpoint_completes(env.stub, job)
            for checkpoint_id, code, fragment in (
                (42, Code.NOT_FOUND, "checkpoint 42"),
                (2**62, Code.NOT_FOUND, f"checkpoint {2**62}"),
                (0, Code.INVALID_ARGUMENT, "checkpoint_id must be >= 1"),
                (-1, Code.INVALID_ARGUMENT, "checkpoint_id must be >= 1"),
            ):
                await expect_error(
                    env.stub.GetCheckpointDetails(
                        cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                        timeout=T,
                    ),
                    code,
                    fragment,
                )
            for size in (-1, 1001, 5000, -(2**31)):
                await expect_error(
                    env.stub.GetCheckpointStats(
                        cpb.GetCheckpointStatsRequest(job_id=job.id, history_size=size), timeout=T
                    ),
                    Code.INVALID_ARGUMENT,
                    "history_size must be in 0..1000",
                )
            stats = await env.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.id, history_size=1000), timeout=T
            )
            assert stats.counts.completed == 1

    env.loop.run(main())


@pytest.mark.parametrize(
    ("make_path", "code", "fragment"),
    [
        pytest.param(lambda d: "", Code.INVALID_ARGUMENT, "savepoint_path is required", id="empty"),
        pytest.param(lambda d: "savepoints/sp-1", Code.INVALID_ARGUMENT, "absolute", id="relative"),
        pytest.param(
            lambda d: "file://sp-1", Code.INVALID_ARGUMENT, "absolute", id="file-uri-relative"
        ),
        pytest.param(lambda d: "s3://bucket/sp-1", Code.INVALID_ARGUMENT, "s3://", id="s3-uri"),
        pytest.param(
            lambda d: str(d / "missing"), Code.NOT_FOUND, "no checkpoint metadata", id="missing-dir"
        ),
        pytest.param(
            lambda d: str(write_file(d / "garbage" / "_metadata", b"{not json").parent),
            Code.INVALID_ARGUMENT,
            "invalid checkpoint metadata",
            id="garbage-metadata",
        ),
        pytest.param(
            lambda d: str(write_file(d / "plain" / "data.bin").parent),
            Code.INVALID_ARGUMENT,
            "not a savepoint",
            id="plain-dir-without-metadata",
        ),
    ],
)
def test_dispose_savepoint_bad_input(
    env: Env,
    tmp_path: Path,
    make_path: Callable[[Path], str],
    code: grpc.StatusCode,
    fragment: str,
) -> None:
    async def main() -> None:
        path = make_path(tmp_path)
        before = sorted(p for p in tmp_path.rglob("*"))
        await expect_error(
            env.stub.DisposeSavepoint(cpb.DisposeSavepointRequest(savepoint_path=path), timeout=T),
            code,
            fragment,
        )
        assert sorted(p for p in tmp_path.rglob("*")) == before, "something was deleted"

    env.loop.run(main())


def test_dispose_of_a_checkpoint_dir_is_refused_and_a_disposed_savepoint_is_gone(
    env: Env, tmp_path: Path
) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            summary = await checkpoint_completes(env.stub, job)
            files = sorted(Path(summary.external_path).iterdir())
            await expect_error(
                env.stub.DisposeSavepoint(
                    cpb.DisposeSavepointRequest(savepoint_path=summary.external_path), timeout=T
                ),
                Code.INVALID_ARGUMENT,
                f"checkpoint {summary.checkpoint_id}, not a savepoint",
            )
            assert sorted(Path(summary.external_path).iterdir()) == files
            savepoint = await env.stub.TriggerSavepoint(
                cpb.TriggerSavepointRequest(job_id=job.id, target_directory=str(tmp_path / "sp")),
                timeout=10,
            )
            await env.stub.DisposeSavepoint(
                cpb.DisposeSavepointRequest(savepoint_path=savepoint.external_path), timeout=T
            )
            assert not os.path.exists(savepoint.external_path)
            await expect_error(
                env.stub.DisposeSavepoint(
                    cpb.DisposeSavepointRequest(savepoint_path=savepoint.external_path), timeout=T
                ),
                Code.NOT_FOUND,
                "no checkpoint metadata",
            )
            # the retained checkpoint survived all of it and the job still checkpoints
            assert sorted(Path(summary.external_path).iterdir()) == files
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 7. Wire-level abuse: oversized messages, garbage bytes
# ---------------------------------------------------------------------------------------------


def big_graph(payload_bytes: int, name: str = "big") -> pb.JobGraph:
    g = two_vertex_graph(1, 1, name=name)
    g.vertices[0].operators[0].payload = b"x" * payload_bytes
    return g


def test_oversized_submit_is_resource_exhausted_and_the_server_keeps_serving(env: Env) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(job_id=job_id, graph=big_graph(2 * MAX_MESSAGE_BYTES)),
                timeout=T,
            ),
            Code.RESOURCE_EXHAUSTED,
            "larger than max",
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert await asyncio.to_thread(env.jobs_set) == jobs_before
        await expect_error(
            env.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T), Code.NOT_FOUND
        )
        # the same channel and server still work
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


def test_submit_just_under_the_message_limit_is_answered_or_refused_cleanly(
    env: Env, tmp_path: Path
) -> None:
    async def main() -> None:
        ns = fresh_namespace()
        async with running_coordinator(
            env.redis_url,
            str(tmp_path / "cp"),
            redis_namespace=ns,
            max_message_bytes=MAX_MESSAGE_BYTES,
        ) as c:
            job_id = uuid.uuid4().hex
            base = cpb.SubmitJobRequest(job_id=job_id, graph=big_graph(0)).ByteSize()
            request = cpb.SubmitJobRequest(
                job_id=job_id, graph=big_graph(MAX_MESSAGE_BYTES - base - 60)
            )
            assert request.ByteSize() < MAX_MESSAGE_BYTES
            try:
                await c.stub.SubmitJob(request, timeout=T)
            except grpc.aio.AioRpcError as error:
                assert error.code() in (Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED)
                # refused: then the job must not exist
                exists = bool(
                    await asyncio.to_thread(redis_snapshot, env.redis_url, f"{ns}:job:{job_id}")
                )
                assert not exists, (
                    f"SubmitJob failed with {error.code().name} ({error.details()}) "
                    f"but job {job_id} was created"
                )
            else:
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
                assert info.job_id == job_id

    env.loop.run(main())


def test_list_jobs_survives_jobs_whose_graphs_together_exceed_the_message_limit(
    env: Env, tmp_path: Path
) -> None:
    async def main() -> None:
        async with running_coordinator(
            env.redis_url,
            str(tmp_path / "cp"),
            redis_namespace=fresh_namespace(),
            max_message_bytes=MAX_MESSAGE_BYTES,
        ) as c:
            for i in range(3):  # each submission is well within the limit
                await c.stub.SubmitJob(
                    cpb.SubmitJobRequest(graph=big_graph(MAX_MESSAGE_BYTES // 2, name=f"j{i}")),
                    timeout=T,
                )
            try:
                jobs = await c.stub.ListJobs(cpb.ListJobsRequest(), timeout=T)
            except grpc.aio.AioRpcError as error:
                raise AssertionError(
                    f"ListJobs failed: {error.code().name} {error.details()}"
                ) from None
            assert len(jobs.jobs) == 3

    env.loop.run(main())


GARBAGE = b"\xff\xff\xff garbage"


@pytest.mark.parametrize(
    ("method", "streaming"),
    [
        pytest.param("GetJob", False, id="GetJob"),
        pytest.param("SubmitJob", False, id="SubmitJob"),
        pytest.param("AcknowledgeCheckpoint", False, id="AcknowledgeCheckpoint"),
        pytest.param("TriggerCheckpoint", False, id="TriggerCheckpoint"),
        pytest.param("WatchJob", True, id="WatchJob-stream"),
    ],
)
def test_garbage_bytes_are_rejected_and_the_server_survives(
    env: Env, method: str, streaming: bool
) -> None:
    """gRPC Python (aio) rejects an undecodable request itself, before the servicer (and its
    DecodeError -> INVALID_ARGUMENT mapping) runs: the status is UNKNOWN with the parse error."""

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            channel = env.coordinator.channel
            try:
                if streaming:
                    call = channel.unary_stream(SERVICE + method)(GARBAGE, timeout=T)
                    try:
                        await call.read()
                    finally:
                        call.cancel()
                else:
                    await channel.unary_unary(SERVICE + method)(GARBAGE, timeout=T)
            except grpc.aio.AioRpcError as error:
                assert error.code() in (Code.INVALID_ARGUMENT, Code.INTERNAL, Code.UNKNOWN), error
                details = (error.details() or "").lower()
                assert "pars" in details or "deserializ" in details, details
            else:
                raise AssertionError("garbage request was accepted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            # the server survives: the next valid calls work
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info.state == pb.JOB_STATE_RUNNING
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


# ---------------------------------------------------------------------------------------------
# 8. Fencing: a superseded coordinator refuses every mutation and stops serving
# ---------------------------------------------------------------------------------------------


def _fenced_mutations(
    stub: cgrpc.CoordinatorServiceStub, job_id: str, task: pb.TaskAttempt, address: str
) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "SubmitJob": lambda: stub.SubmitJob(
            cpb.SubmitJobRequest(graph=two_vertex_graph()), timeout=T
        ),
        "CancelJob": lambda: stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T),
        "RegisterTask": lambda: stub.RegisterTask(
            cpb.RegisterTaskRequest(
                job_id=job_id, vertex_id="src", subtask_index=0, address=address
            ),
            timeout=T,
        ),
        "UpdateTaskState": lambda: stub.UpdateTaskState(
            cpb.UpdateTaskStateRequest(job_id=job_id, attempt=task, state=pb.TASK_STATE_FAILED),
            timeout=T,
        ),
        "AcknowledgeCheckpoint": lambda: stub.AcknowledgeCheckpoint(
            ack_request(job_id, task, 1), timeout=T
        ),
        "DeclineCheckpoint": lambda: stub.DeclineCheckpoint(
            cpb.DeclineCheckpointRequest(job_id=job_id, attempt=task, checkpoint_id=1), timeout=T
        ),
        "TriggerCheckpoint": lambda: stub.TriggerCheckpoint(
            cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
        ),
        "TriggerSavepoint": lambda: stub.TriggerSavepoint(
            cpb.TriggerSavepointRequest(job_id=job_id), timeout=T
        ),
        "StopWithSavepoint": lambda: stub.StopWithSavepoint(
            cpb.StopWithSavepointRequest(job_id=job_id), timeout=T
        ),
        "DisposeSavepoint": lambda: stub.DisposeSavepoint(
            cpb.DisposeSavepointRequest(savepoint_path="/nonexistent/savepoint-x"), timeout=T
        ),
    }


@pytest.mark.parametrize("first", ["SubmitJob", "CancelJob", "RegisterTask"])
def test_stale_coordinator_is_fenced(env: Env, tmp_path: Path, first: str) -> None:
    async def main() -> None:
        namespace = fresh_namespace()
        root = str(tmp_path / "cp")
        async with contextlib.AsyncExitStack() as stack:
            a = await stack.enter_async_context(
                running_coordinator(env.redis_url, root, redis_namespace=namespace)
            )
            job_id = await submit(a.stub, two_vertex_graph(1, 1))
            old_agent = SimulatedAgent(a.address, job_id, [("src", 0), ("map", 0)])
            await old_agent.start()
            stack.push_async_callback(old_agent.stop)
            await old_agent.register_all()
            task = old_agent.attempts[("src", 0)]

            b = await stack.enter_async_context(
                running_coordinator(env.redis_url, root, redis_namespace=namespace)
            )
            snapshot_before = await asyncio.to_thread(
                redis_snapshot, env.redis_url, f"{namespace}:*"
            )

            # A learns it is stale on its first Redis mutation
            calls = _fenced_mutations(a.stub, job_id, task, old_agent.address)
            await expect_error(calls.pop(first)(), Code.FAILED_PRECONDITION, "epoch")
            await wait_until_async_status(a.channel, health_pb2.HealthCheckResponse.NOT_SERVING)
            # from then on every mutation is refused before touching anything
            for name, call in calls.items():
                error = await expect_error(call(), Code.FAILED_PRECONDITION, "epoch")
                assert "superseded" in (error.details() or ""), (name, error.details())
            batch = await a.stub.AcknowledgeCheckpoints(
                cpb.AcknowledgeCheckpointsRequest(acks=[ack_request(job_id, task, 1)]), timeout=T
            )
            got, message = _outcome(batch.outcomes[0])
            assert (got, "superseded" in message) == ("FAILED_PRECONDITION", True), message
            snapshot_after = await asyncio.to_thread(
                redis_snapshot, env.redis_url, f"{namespace}:*"
            )
            assert snapshot_after == snapshot_before, "the fenced coordinator changed Redis"

            # B is the coordinator now: it serves, and the job runs and checkpoints under it
            assert await health_status(b.channel) == health_pb2.HealthCheckResponse.SERVING
            info = await b.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
            assert info.state == pb.JOB_STATE_RESTARTING
            new_agent = SimulatedAgent(b.address, job_id, [("src", 0), ("map", 0)])
            await new_agent.start()
            stack.push_async_callback(new_agent.stop)
            await new_agent.register_all()
            assert new_agent.epoch > old_agent.epoch
            summary = await b.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
            )
            assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            jobs = await b.stub.ListJobs(cpb.ListJobsRequest(), timeout=T)
            assert [j.job_id for j in jobs.jobs] == [job_id]  # A's refused SubmitJob left nothing

    env.loop.run(main())

"""Start a real coordinator (gRPC on 127.0.0.1:0, the test session's Redis) for a test."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kit.polling import wait_until_async
from snapflow.coordinator.embedded import local_settings
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.server import Coordinator
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.tls import aio_channel, sync_channel
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc


@dataclass
class Running:
    coordinator: Coordinator
    stub: cgrpc.CoordinatorServiceAsyncStub
    channel: grpc.aio.Channel
    address: str

    @property
    def manager(self) -> JobManager:
        """The job manager of this coordinator, which must lead (no high availability here)."""
        manager = self.coordinator.manager
        assert manager is not None, "the coordinator leads (no high availability here)"
        return manager


@contextlib.asynccontextmanager
async def running_coordinator(
    redis_url: str, storage_root: str, client: SecuritySettings = PLAINTEXT, **overrides: Any
) -> AsyncIterator[Running]:
    # On this test's loop (its objects are reachable), with the settings of an embedded one;
    # ``client``: TLS and token of the yielded stub (tests/kit/tls.py makes them).
    coordinator = Coordinator(local_settings(redis_url, storage_root, **overrides))
    await coordinator.start()
    address = f"127.0.0.1:{coordinator.port}"
    channel = aio_channel(address, client)
    try:
        yield Running(coordinator, cgrpc.CoordinatorServiceStub(channel), channel, address)
    finally:
        await channel.close()
        await coordinator.stop()


def two_vertex_graph(sources: int = 2, maps: int = 2, name: str = "test-job") -> pb.JobGraph:
    return pb.JobGraph(
        name=name,
        vertices=[
            pb.JobVertex(
                vertex_id="src",
                name="source",
                parallelism=sources,
                is_source=True,
                operators=[pb.OperatorSpec(operator_id="src-op", kind="source")],
            ),
            pb.JobVertex(
                vertex_id="map",
                name="count",
                parallelism=maps,
                max_parallelism=128,
                operators=[pb.OperatorSpec(operator_id="map-op", kind="process")],
            ),
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id="src", target_vertex_id="map", partitioner=pb.PARTITIONER_KIND_HASH
            )
        ],
    )


def source_to_sink_graph(name: str = "to-a-sink") -> pb.JobGraph:
    """One source subtask forwarding to one sink subtask (a sink may hold uncommitted
    output, so the job may finish only after a final checkpoint)."""
    return pb.JobGraph(
        name=name,
        vertices=[
            pb.JobVertex(
                vertex_id="src",
                name="source",
                parallelism=1,
                is_source=True,
                operators=[pb.OperatorSpec(operator_id="src-op", kind="source")],
            ),
            pb.JobVertex(
                vertex_id="sink",
                name="sink",
                parallelism=1,
                operators=[pb.OperatorSpec(operator_id="sink-op", kind="sink")],
            ),
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id="src",
                target_vertex_id="sink",
                partitioner=pb.PARTITIONER_KIND_FORWARD,
            )
        ],
    )


async def submit(
    stub: cgrpc.CoordinatorServiceAsyncStub, graph: pb.JobGraph | None = None, **config: Any
) -> str:
    response = await stub.SubmitJob(
        cpb.SubmitJobRequest(
            graph=graph or two_vertex_graph(), checkpoint_config=pb.CheckpointConfig(**config)
        ),
        timeout=10,
    )
    return str(response.job.job_id)


def is_serving(address: str, security: SecuritySettings | None = None) -> bool:
    """Whether the gRPC health service at ``address`` answers SERVING (False while unreachable);
    ``security``: the client's TLS settings for a TLS server."""
    with sync_channel(address, security or PLAINTEXT) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


async def pending_ids(redis_url: str, namespace: str, job_id: str) -> list[int]:
    """The ids of ``job_id``'s pending checkpoint records in Redis under ``namespace``."""
    async with CheckpointStore.from_url(redis_url, namespace) as store:
        return [p.checkpoint_id for p in await store.list_pending(job_id)]


# A coordinator that is down or restarting: the polls below go on (any other error fails).
_NOT_ANSWERING = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def job_state(stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str) -> int | None:
    """The job's state (a ``pb.JobState`` number), or None while the coordinator does not answer."""
    try:
        info = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
    except grpc.aio.AioRpcError as e:
        if e.code() in _NOT_ANSWERING:
            return None
        raise
    return int(info.state)


async def wait_job_state(
    stub: cgrpc.CoordinatorServiceAsyncStub,
    job_id: str,
    states: set[int],
    *,
    timeout_s: float = 60.0,
    procs: Sequence[subprocess.Popen[Any]] = (),
) -> int:
    """Poll until the job is in one of ``states``; the state it reached."""

    async def reached() -> int | None:
        state = await job_state(stub, job_id)
        return state if state in states else None

    names = sorted(pb.JobState.Name(s) for s in states)
    state = await wait_until_async(
        reached, f"job {job_id} in {names}", timeout_s=timeout_s, interval_s=0.05, procs=procs
    )
    assert state is not None  # for the type checker: a reached value is truthy
    return state


async def wait_checkpoints_completed(
    stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str, at_least: int, timeout_s: float = 30.0
) -> int:
    """Poll until at least ``at_least`` checkpoints of the job completed; how many did."""

    async def completed() -> int:
        try:
            stats = await stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
        except grpc.aio.AioRpcError as e:
            if e.code() in _NOT_ANSWERING:
                return 0
            raise
        return int(stats.counts.completed) if stats.counts.completed >= at_least else 0

    count: int = await wait_until_async(
        completed, f"{at_least} checkpoints completed", timeout_s=timeout_s, interval_s=0.02
    )
    return count

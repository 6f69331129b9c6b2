"""Start a real coordinator (gRPC on 127.0.0.1:0, the test session's Redis) for a test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapflow.coordinator.embedded import local_settings
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.server import Coordinator
from snapflow.security import PLAINTEXT, SecuritySettings, aio_channel, sync_channel
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

"""A checkpoint whose pending record cannot be written to Redis is never triggered (issue 8).

The rule: a checkpoint's pending record is in Redis before any trigger RPC is sent, so that a
crashed coordinator's successor can abort it. The record is written while the checkpoint is
prepared (with its id and directory); a failed write fails the preparation as Flink's
``IO_EXCEPTION`` (counted by the failure manager), the id's directory goes, and nothing is
logged as an unexpected I/O failure.

Real coordinator, real ``redis-server`` started and stopped by the test (never the session's):
the record write alone is made to fail by revoking ``HSET`` for the coordinator's Redis user
(the id's ``INCR`` still succeeds, exactly the case of a Redis that fails between the two), then
Redis is stopped for a whole preparation.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from kit.coordinator import pending_ids, running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import fresh_namespace
from kit.polling import wait_until_async
from kit.processes import free_port
from kit.simulated_agent import SimulatedAgent

from snapflow.jobgraph import TaskState
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

pytestmark = pytest.mark.timeout(90)

T = 10.0
TASKS = [("src", 0), ("map", 0)]


async def _acl(url: str, rule: str) -> None:
    client = aioredis.from_url(url)
    try:
        await client.execute_command("ACL", "SETUSER", "default", rule)
    finally:
        await client.aclose()


def test_a_pending_record_that_cannot_be_written_stops_the_trigger(
    tmp_path: Path, capfd: Any
) -> None:
    port = free_port()
    data = str(tmp_path / "redis")
    servers = [RedisServer(data_dir=data, port=port).start()]

    async def main() -> None:
        namespace = fresh_namespace()
        root = tmp_path / "cp"
        url = servers[0].url
        async with contextlib.AsyncExitStack() as stack:
            c = await stack.enter_async_context(
                running_coordinator(
                    url, str(root), redis_namespace=namespace, orphan_sweep_interval_s=0.0
                )
            )
            job_id = await submit(c.stub, two_vertex_graph(1, 1), tolerable_failures=5)
            agent = SimulatedAgent(c.address, job_id, TASKS)
            await agent.start()
            stack.push_async_callback(agent.stop)
            await agent.register_all()
            manager = c.manager
            failures = manager.jobs[job_id].core.failure_manager

            async def trigger_refused() -> str:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await c.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
                    )
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                return refused.value.details() or ""

            first = await c.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
            )
            assert first.checkpoint_id == 1 and agent.triggered == [1]

            # 1. Id 2 is allocated (INCR), its record cannot be written (HSET refused).
            await _acl(url, "-hset")
            try:
                details = await trigger_refused()
            finally:
                await _acl(url, "+hset")
            assert "IO_EXCEPTION" in details and "add_pending" in details, details
            assert agent.triggered == [1]  # no trigger for a checkpoint Redis does not know
            assert failures.consecutive_failures == 1  # counted, as Flink's IO_EXCEPTION
            assert manager.jobs[job_id].core.pending_count() == 0
            chk2 = root / job_id / "chk-2"
            await wait_until_async(lambda: not chk2.exists(), "the burnt id's directory goes")
            assert await pending_ids(url, namespace, job_id) == []

            # 2. Redis down for the whole preparation: refused the same way, nothing sent.
            servers[-1].stop()
            details = await trigger_refused()
            assert "IO_EXCEPTION" in details, details
            assert agent.triggered == [1]
            assert failures.consecutive_failures == 2

            # Redis back: the job was never failed over and checkpoints on.
            servers.append(await asyncio.to_thread(RedisServer(data_dir=data, port=port).start))
            third = await c.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
            )
            assert third.status == pb.CHECKPOINT_STATUS_COMPLETED
            assert third.checkpoint_id == 3 and agent.triggered == [1, 3]
            assert failures.consecutive_failures == 0
            assert all(
                t.state == TaskState.RUNNING for t in manager.jobs[job_id].execution.tasks.values()
            )
            assert await pending_ids(url, namespace, job_id) == []
            # Retention 1: chk-3 replaced chk-1; nothing of the two refused ids is left. The
            # retention deletion is queued after the commit the trigger's reply waited for.
            await manager.jobs[job_id].io.join()
            assert sorted(p.name for p in (root / job_id).iterdir()) == ["chk-3"]

    try:
        asyncio.run(main())
    finally:
        for server in servers:
            server.stop()
    out = capfd.readouterr()
    text = out.out + out.err
    # The failure is a refused checkpoint, not an unexpected I/O error with a traceback.
    assert "io_failed" not in text and "Traceback" not in text, text[-3000:]

"""A straggler of a replaced Spark stage cannot end the live deployment (issue 8).

Each stage the driver submits carries a launch number (1, 2, ...) in every registration. Here,
over real gRPC against a real coordinator and Redis: the tasks of launch 2 run the job; a task
of launch 1 that registers late (one Spark was still killing) gets FAILED_PRECONDITION naming
both launches, and the deployment, its attempts and the job state are unchanged.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from kit.coordinator import running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import fresh_namespace

from snapflow.v1 import coordinator_pb2 as cpb

T = 10.0
KEYS = [("src", 0), ("map", 0)]


def _register(job_id: str, key: tuple[str, int], launch: int) -> cpb.RegisterTaskRequest:
    return cpb.RegisterTaskRequest(
        job_id=job_id,
        vertex_id=key[0],
        subtask_index=key[1],
        address=f"127.0.0.1:{1000 + launch}",
        launch=launch,
    )


def test_a_task_of_an_older_launch_is_refused_and_changes_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with running_coordinator(
            redis_url, str(tmp_path), redis_namespace=fresh_namespace()
        ) as c:
            job_id = await submit(c.stub, two_vertex_graph(1, 1))
            first = await c.stub.RegisterTask(_register(job_id, KEYS[0], 1), timeout=T)
            assert first.attempt.attempt == 1
            # Launch 2 replaces launch 1 (its first task starts deployment 2).
            attempts = [
                (await c.stub.RegisterTask(_register(job_id, key, 2), timeout=T)).attempt.attempt
                for key in KEYS
            ]
            assert attempts == [2, 2]
            before = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await c.stub.RegisterTask(_register(job_id, KEYS[1], 1), timeout=T)
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "launch 1" in (refused.value.details() or "")
            assert "superseded by launch 2" in (refused.value.details() or "")
            after = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
            assert (after.state, after.restarts) == (before.state, before.restarts)
            # A negative launch is garbage: INVALID_ARGUMENT.
            with pytest.raises(grpc.aio.AioRpcError) as garbage:
                await c.stub.RegisterTask(_register(job_id, KEYS[0], -1), timeout=T)
            assert garbage.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(main())

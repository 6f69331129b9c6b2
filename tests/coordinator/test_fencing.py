"""Fencing: a coordinator superseded by a newer one (a higher epoch in Redis) refuses every
mutation before touching anything and stops serving.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2
from kit.coordinator import running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import (
    Code,
    Env,
    T,
    _status_is,
    ack_outcome,
    ack_request,
    expect_error,
    fresh_namespace,
    health_status,
    redis_snapshot,
)
from kit.polling import wait_until_async
from kit.simulated_agent import SimulatedAgent

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

# ---------------------------------------------------------------------------------------------
# 8. Fencing: a superseded coordinator refuses every mutation and stops serving
# ---------------------------------------------------------------------------------------------


def _fenced_mutations(
    stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str, task: pb.TaskAttempt, address: str
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
            await wait_until_async(
                lambda: _status_is(a.channel, health_pb2.HealthCheckResponse.NOT_SERVING),
                "health NOT_SERVING",
                timeout_s=5,
            )
            # from then on every mutation is refused before touching anything
            for name, call in calls.items():
                error = await expect_error(call(), Code.FAILED_PRECONDITION, "epoch")
                assert "superseded" in (error.details() or ""), (name, error.details())
            batch = await a.stub.AcknowledgeCheckpoints(
                cpb.AcknowledgeCheckpointsRequest(acks=[ack_request(job_id, task, 1)]), timeout=T
            )
            got, message = ack_outcome(batch.outcomes[0])
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

"""Checkpoint and savepoint triggers over real gRPC: refusals before the tasks run and after a
cancel, bad savepoint targets, declines and short client deadlines.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kit.coordinator_env import (
    Code,
    Env,
    T,
    ack_all_by_hand,
    attempt,
    checkpoint_completes,
    checkpoint_details,
    decline_all,
    expect_error,
    ignore_all,
    job_with_agent,
)
from kit.polling import wait_until_async

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

# ---------------------------------------------------------------------------------------------
# 5. Trigger refusals, declines, deadlines
# ---------------------------------------------------------------------------------------------

TRIGGERS: dict[
    str, Callable[[cgrpc.CoordinatorServiceAsyncStub, str, str, float], Awaitable[Any]]
] = {
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
        pytest.param("gs://bucket/savepoints", id="gs-uri"),
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
            await wait_until_async(
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
            details = await checkpoint_details(env.stub, job.id, 1)
            assert details.summary.status == pb.CHECKPOINT_STATUS_IN_PROGRESS
            await ack_all_by_hand(env.stub, job.id, job.agent, 1, details.summary.external_path)

            async def completed() -> bool:
                d = await checkpoint_details(env.stub, job.id, 1)
                return d.summary.status == pb.CHECKPOINT_STATUS_COMPLETED

            await wait_until_async(completed, "checkpoint 1 completed after the late acks")
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


@pytest.mark.parametrize(
    ("ended", "code", "fragment"),
    [
        pytest.param(attempt("", 0, 1), Code.INVALID_ARGUMENT, "vertex_id", id="no-vertex"),
        pytest.param(attempt("src", -1, 1), Code.INVALID_ARGUMENT, "subtask_index", id="index"),
        pytest.param(attempt("src", 0, 0), Code.INVALID_ARGUMENT, "attempt", id="attempt-0"),
        pytest.param(
            attempt("map", 0, 1), Code.FAILED_PRECONDITION, "NOT_A_RUNNING_SOURCE", id="not-src"
        ),
        pytest.param(
            attempt("src", 0, 7), Code.FAILED_PRECONDITION, "NOT_A_RUNNING_SOURCE", id="stale"
        ),
    ],
)
def test_a_final_checkpoint_request_naming_no_running_source_is_refused(
    env: Env, ended: pb.TaskAttempt, code: Any, fragment: str
) -> None:
    """``input_ended`` (an ended source asking for the final checkpoint) must name a source
    subtask attempt of the running deployment; nothing is triggered otherwise, and the same
    request from the running source triggers the checkpoint at once (it is the only source)."""

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await expect_error(
                env.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job.id, input_ended=ended), timeout=T
                ),
                code,
                fragment,
            )
            stats = await env.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.id), timeout=T
            )
            assert stats.counts.completed + stats.counts.in_progress == 0
            summary = await env.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job.id, input_ended=job.task()), timeout=T
            )
            assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            assert summary.checkpoint_id == 1

    env.loop.run(main())

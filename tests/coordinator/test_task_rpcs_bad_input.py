"""The agent-facing task RPCs over real gRPC: RegisterTask and UpdateTaskState refuse bad input,
and a stale attempt is refused, ignored and its state discarded.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from kit.coordinator_env import (
    Code,
    Env,
    T,
    ack,
    ack_all_by_hand,
    attempt,
    checkpoint_completes,
    checkpoint_details,
    expect_error,
    finish,
    ignore_all,
    job_with_agent,
    start_pending_checkpoint,
    write_file,
)
from kit.polling import wait_until_async

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

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
    pytest.param(
        {"data_ended": True},
        Code.INVALID_ARGUMENT,
        "data_ended is reported with state RUNNING, not failed",
        id="data-ended-with-failed",
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
                await wait_until_async(lambda: not stale_file.exists(), "stale ack's state deleted")
                await env.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=job.id, attempt=stale, checkpoint_id=checkpoint_id, message="stale"
                    ),
                    timeout=T,
                )
                assert not trigger.done(), "a stale decline aborted the checkpoint"
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
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

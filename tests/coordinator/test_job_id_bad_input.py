"""Job ids over real gRPC: an unknown id is NOT_FOUND and a malformed one INVALID_ARGUMENT, for
every job-scoped RPC of the coordinator API (request parsing and the job lookup).

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kit.coordinator_env import (
    Code,
    Env,
    T,
    ack_request,
    attempt,
    expect_error,
)

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

# ---------------------------------------------------------------------------------------------
# 1. Job ids: unknown (NOT_FOUND) and malformed (INVALID_ARGUMENT) for every job-scoped RPC
# ---------------------------------------------------------------------------------------------


async def _watch_first(stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str) -> Any:
    call = stub.WatchJob(cpb.WatchJobRequest(job_id=job_id), timeout=T)
    try:
        return await call.read()
    finally:
        call.cancel()


# The async stub exists in the typed stubs (.pyi) only, hence the quotes.
JobRpc = Callable[["cgrpc.CoordinatorServiceAsyncStub", str], Awaitable[Any]]

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

"""The coordinator server's wire level: oversized messages and garbage bytes are refused and the
server keeps serving.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from kit.coordinator import running_coordinator, two_vertex_graph
from kit.coordinator_env import (
    MAX_MESSAGE_BYTES,
    SERVICE,
    Code,
    Env,
    T,
    checkpoint_completes,
    expect_error,
    fresh_namespace,
    job_with_agent,
    redis_snapshot,
)

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

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
            # Untyped on purpose: raw bytes go out with no request serializer.
            channel: Any = env.coordinator.channel
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

"""The coordinator with its checkpoint storage on S3 (moto's real server), over real gRPC, with
the session's Redis and simulated agents that write their state files through the file store:
checkpoints complete, retention deletes without LIST within a request budget, savepoints are
disposed and restored, and a missing bucket fails the checkpoint with a message naming it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from kit.coordinator import running_coordinator, submit
from kit.polling import wait_until_async
from kit.s3 import S3Server
from kit.simulated_agent import SimulatedAgent

from snapflow.filestore import FileStore
from snapflow.filestore_registry import store_for
from snapflow.s3_filestore import S3Settings
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

# The coordinator gets S3 settings of its own, so its store (and request counts) are apart
# from the agents' (which use the default settings, through the AWS_* variables).
COORDINATOR_MAX_ATTEMPTS = 4


def coordinator_store() -> FileStore:
    return store_for("s3://any", S3Settings(max_attempts=COORDINATOR_MAX_ATTEMPTS))


def agents_store() -> FileStore:
    return store_for("s3://any")


@contextlib.asynccontextmanager
async def _agents(address: str, job_id: str, **kwargs: Any) -> AsyncIterator[list[SimulatedAgent]]:
    """Two simulated agents, agent i hosting ``src`` and ``map`` subtask i, their tasks
    registered; stopped on exit."""
    agents = [SimulatedAgent(address, job_id, [("src", i), ("map", i)], **kwargs) for i in range(2)]
    try:
        for agent in agents:
            await agent.start()
            await agent.register_all()
        yield agents
    finally:
        for agent in agents:
            await agent.stop()


def _coordinator(redis_url: str, root: str) -> Any:
    return running_coordinator(redis_url, root, s3_max_attempts=COORDINATOR_MAX_ATTEMPTS)


def test_checkpoints_complete_on_s3_within_the_request_budget(
    redis_url: str, s3: S3Server, s3_bucket: str
) -> None:
    root = f"s3://{s3_bucket}/checkpoints"

    async def main() -> None:
        async with _coordinator(redis_url, root) as c:
            job_id = await submit(c.stub, retained=1)
            counts = []
            summaries = []
            async with _agents(c.address, job_id):
                for _ in range(3):
                    before = coordinator_store().requests.snapshot()
                    summaries.append(
                        await c.stub.TriggerCheckpoint(
                            cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                        )
                    )
                    checkpoint_id = summaries[-1].checkpoint_id
                    if checkpoint_id > 1:  # retention of the previous one runs after the commit
                        retired = f"{root}/{job_id}/chk-{checkpoint_id - 1}/_metadata"

                        def retired_deleted(path: str = retired) -> bool:
                            return not agents_store().exists(path)

                        await wait_until_async(retired_deleted, "the retired checkpoint deleted")
                    # Everything the checkpoint queued (its retention's DELETE too) has run.
                    await c.manager.runner(job_id).io.join()
                    after = coordinator_store().requests.snapshot()
                    counts.append({k: after[k] - before[k] for k in after})

        first = summaries[0]
        assert first.status == pb.CHECKPOINT_STATUS_COMPLETED
        assert first.external_path == f"{root}/{job_id}/chk-1"
        assert first.num_acknowledged == first.num_tasks == 4
        # Per checkpoint on the coordinator side: the _metadata PUT; from the second on, one
        # batched DELETE of the retired checkpoint. Never a LIST, GET or HEAD.
        assert counts[0] == {"put": 1, "get": 0, "head": 0, "list": 0, "delete": 0}
        for later in counts[1:]:
            assert later == {"put": 1, "get": 0, "head": 0, "list": 0, "delete": 1}
        store = agents_store()
        assert store.list(f"{root}/{job_id}/chk-1") == []
        assert store.list(f"{root}/{job_id}/chk-2") == []
        kept = store.list(f"{root}/{job_id}/chk-3")
        assert len(kept) == 5 and f"{root}/{job_id}/chk-3/_metadata" in kept

    asyncio.run(main())


def test_savepoint_on_s3_restores_a_new_job_and_is_disposed(
    redis_url: str, s3: S3Server, s3_bucket: str
) -> None:
    root = f"s3://{s3_bucket}/checkpoints"

    async def main() -> None:
        async with _coordinator(redis_url, root) as c:
            job_id = await submit(c.stub)
            target = f"s3://{s3_bucket}/savepoints"
            async with _agents(c.address, job_id):
                savepoint = await c.stub.TriggerSavepoint(
                    cpb.TriggerSavepointRequest(job_id=job_id, target_directory=target),
                    timeout=10,
                )
                path = savepoint.external_path
                assert path.startswith(f"{target}/savepoint-{job_id[:6]}-")
                assert len(agents_store().list(path)) == 5  # 4 state files and _metadata

            # A new job restores from the savepoint: the tasks get its state, paths on S3.
            response = await c.stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=(await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id))).graph,
                    checkpoint_config=pb.CheckpointConfig(),
                    restore=cpb.RestoreSettings(savepoint_path=path),
                ),
                timeout=10,
            )
            restored_job = response.job.job_id
            async with _agents(c.address, restored_job) as agents:
                restore = agents[0].restores[("map", 0)]
                assert restore.checkpoint_id == savepoint.checkpoint_id
                handle_paths = [
                    h.path for v in restore.vertex_state for o in v.operators for h in o.handles
                ]
                assert handle_paths and all(p.startswith(f"{path}/") for p in handle_paths)

            await c.stub.DisposeSavepoint(
                cpb.DisposeSavepointRequest(savepoint_path=path), timeout=10
            )
            assert agents_store().list(path) == []

    asyncio.run(main())


@pytest.mark.parametrize("write_state", [False, True], ids=["finalize", "task-write"])
def test_a_missing_bucket_fails_the_checkpoint_naming_it(
    redis_url: str, s3: S3Server, write_state: bool
) -> None:
    bucket = "snapflow-no-such-bucket"
    root = f"s3://{bucket}/checkpoints"

    async def main() -> None:
        async with _coordinator(redis_url, root) as c:
            job_id = await submit(c.stub, tolerable_failures_unlimited=True)
            async with _agents(c.address, job_id, write_state=write_state):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                    )
                assert err.value.code() == grpc.StatusCode.ABORTED
                details = err.value.details() or ""
                reason = "DECLINED" if write_state else "FINALIZE_FAILED"
                assert details.startswith(reason)
                assert bucket in details and "put_object" in details and "does not exist" in details
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
                )
                assert stats.latest_failed.failure_reason == reason
                assert bucket in stats.latest_failed.failure_message
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.state == pb.JOB_STATE_RUNNING

    asyncio.run(main())

"""Fencing of checkpoint storage: a coordinator deletes nothing unless a fenced step proves it
is still the current epoch, and never anything a newer epoch references (issue 8, item 4).

The scenario of the issue: coordinator A is superseded by B on the same Redis and storage but
has not noticed yet; acknowledgements sent to A for checkpoint ids it does not know (and for
ids it does) name the files of B's retained checkpoint. A must delete 0 files, and B's
checkpoint must still restore. Real coordinators, real Redis, real files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from kit.coordinator import Running, running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import ack_request, fresh_namespace, write_file
from kit.simulated_agent import SimulatedAgent

from snapflow import wire
from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator.checkpoint_io import SweepOrphans, dispose_savepoint
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.model import (
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobGraph,
    JobRecord,
    JobState,
    JobVertex,
    OperatorSubtaskState,
    PendingCheckpointRecord,
    StateHandle,
    SubtaskAck,
)
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.errors import StaleEpochError
from snapflow.jobgraph import TaskState
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

pytestmark = pytest.mark.timeout(60)

T = 10.0
TASKS = [("src", 0), ("map", 0)]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def _job_with_agent(
    stack: contextlib.AsyncExitStack, redis_url: str, root: Path, namespace: str, retained: int
) -> tuple[Running, str, SimulatedAgent]:
    """A coordinator on ``root``, a two-vertex job retaining ``retained`` checkpoints and one
    simulated agent with its tasks registered (all closed with ``stack``)."""
    a = await stack.enter_async_context(
        running_coordinator(redis_url, str(root), redis_namespace=namespace)
    )
    job_id = await submit(a.stub, two_vertex_graph(1, 1), retained=retained)
    agent = SimulatedAgent(a.address, job_id, TASKS)
    await agent.start()
    stack.push_async_callback(agent.stop)
    await agent.register_all()
    return a, job_id, agent


def test_a_stale_coordinator_deletes_no_file_of_the_current_epoch(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def main() -> None:
        namespace = fresh_namespace()
        root = tmp_path / "cp"
        async with contextlib.AsyncExitStack() as stack:
            a, job_id, old = await _job_with_agent(stack, redis_server.url, root, namespace, 2)
            first = await a.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
            )
            assert first.checkpoint_id == 1

            # B takes over and checkpoints (retained 2: A's chk-1 and B's).
            b = await stack.enter_async_context(
                running_coordinator(redis_server.url, str(root), redis_namespace=namespace)
            )
            new = SimulatedAgent(b.address, job_id, TASKS)
            await new.start()
            stack.push_async_callback(new.stop)
            await new.register_all()
            latest = await b.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
            )
            await b.manager.jobs[job_id].io.join()
            b_dir = Path(latest.external_path)
            b_files = sorted(str(p) for p in b_dir.iterdir() if p.name != "_metadata")
            assert len(b_files) == 2 and latest.checkpoint_id > 1
            job_dir = root / job_id
            stray = write_file(job_dir / "taskowned" / "stray.state")
            before = _files(job_dir)

            # A has not noticed: every ack below is handled as by a live coordinator.
            runner_a = a.manager.jobs[job_id]
            assert not a.manager.fenced
            task = old.attempts[("src", 0)]
            results = []
            a_files = [str(p) for p in (job_dir / "chk-1").iterdir()]
            for checkpoint_id in (999, latest.checkpoint_id, 1):
                response = await a.stub.AcknowledgeCheckpoint(
                    ack_request(job_id, task, checkpoint_id, *b_files, *a_files), timeout=T
                )
                results.append(response.result)
            assert results == [
                cpb.ACK_RESULT_UNKNOWN,
                cpb.ACK_RESULT_UNKNOWN,  # above A's highest id: A never allocated it
                cpb.ACK_RESULT_DUPLICATE,  # the old task is part of A's checkpoint 1
            ]
            await runner_a.io.join()
            # Refused by the id rule alone: A never even needed Redis to say no.
            assert not a.manager.fenced
            # A file no checkpoint directory holds passes A's own checks: the fenced claim
            # in Redis refuses it, and A learns it was superseded.
            response = await a.stub.AcknowledgeCheckpoint(
                ack_request(job_id, task, 999, str(stray)), timeout=T
            )
            assert response.result == cpb.ACK_RESULT_UNKNOWN
            await runner_a.io.join()
            assert a.manager.fenced
            # A fenced coordinator's sweep and clean-ups do nothing either.
            runner_a.io.submit(SweepOrphans(100))
            await runner_a.io.join()
            assert _files(job_dir) == before, "the stale coordinator deleted files"

            # B's checkpoint restores: a failure redeploys from it, with every file in place.
            await new.set_state(wire.TASK_STATE.to_pb(TaskState.FAILED), "test", ("map", 0))
            again = SimulatedAgent(b.address, job_id, TASKS)
            await again.start()
            stack.push_async_callback(again.stop)
            await again.register_all()
            for restore in again.restores.values():
                assert restore.checkpoint_id == latest.checkpoint_id
                paths = [
                    h.path for v in restore.vertex_state for o in v.operators for h in o.handles
                ]
                assert paths and all(os.path.isfile(p) for p in paths)
            done = await b.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
            )
            assert done.status == pb.CHECKPOINT_STATUS_COMPLETED

    asyncio.run(main())


def test_the_claim_is_fenced_and_refuses_what_redis_retains(redis_server: RedisServer) -> None:
    """``claim_deletions``: a stale epoch claims nothing; the current one gets every id that
    Redis does not hold as retained or savepoint, and (decided) their pending records go."""

    async def main() -> None:
        namespace = fresh_namespace()
        job = "ab" * 16
        graph = JobGraph("g", (JobVertex("src", "source", 1, is_source=True),), ())
        async with (
            CheckpointStore.from_url(redis_server.url, namespace) as old,
            CheckpointStore.from_url(redis_server.url, namespace) as new,
        ):
            await old.acquire_epoch()
            await old.create_job(JobRecord(job, graph, CheckpointConfig(), JobState.RUNNING, 1))
            for cid in (1, 2, 3, 4):
                await old.add_pending(
                    PendingCheckpointRecord(job, cid, CheckpointKind.CHECKPOINT, 1, f"/x/chk-{cid}")
                )
            cp = CompletedCheckpoint(job, 2, CheckpointKind.CHECKPOINT, 1, 2, "/x/chk-2", ())
            await old.commit_completed(cp, retained=5)
            sp = CompletedCheckpoint(job, 3, CheckpointKind.SAVEPOINT, 1, 2, "/x/sp", ())
            await old.commit_completed(sp, retained=5)
            assert await old.claim_deletions(job, [1, 2, 3, 4], decided=False) == {1, 4}
            assert [p.checkpoint_id for p in await old.list_pending(job)] == [1, 4]
            assert await old.claim_deletions(job, [1, 2, 3], decided=True) == {1}
            assert [p.checkpoint_id for p in await old.list_pending(job)] == [4]

            await new.acquire_epoch()
            with pytest.raises(StaleEpochError, match="claim_deletions refused"):
                await old.claim_deletions(job, [4], decided=True)
            assert [p.checkpoint_id for p in await new.list_pending(job)] == [4]
            assert await new.claim_deletions(job, [4], decided=True) == {4}
            assert await new.list_pending(job) == []

    asyncio.run(main())


def test_a_lost_commit_reply_never_deletes_the_committed_checkpoint(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Redis committed checkpoint n but the coordinator believes it failed (the reply was lost):
    its directory and files survive the coordinator's abort clean-up and its sweeps, because
    the fenced claim asks Redis, not the coordinator's memory."""

    async def main() -> None:
        namespace = fresh_namespace()
        root = tmp_path / "cp"
        async with contextlib.AsyncExitStack() as stack:
            a, job_id, agent = await _job_with_agent(stack, redis_server.url, root, namespace, 3)
            for _ in range(2):
                done = await a.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
                )
            manager = a.manager
            runner = manager.jobs[job_id]
            # Commit a checkpoint 2's twin as "3" behind the coordinator's back, as if the
            # reply to its commit had been lost, under the same epoch.
            chk3 = root / job_id / "chk-3"
            state = write_file(chk3 / "src-0-1.state")
            async with CheckpointStore.from_url(redis_server.url, namespace) as twin:
                twin.epoch = manager.epoch
                record = await twin.get_completed(job_id, done.checkpoint_id)
                assert record is not None
                assert await twin.next_checkpoint_id(job_id) == 3
                await twin.commit_completed(
                    replace(record, checkpoint_id=3, external_path=str(chk3)), retained=3
                )
            # The coordinator's own view: 3 is no snapshot of its; allocate past it.
            await a.stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T)
            assert runner.core.highest_id >= 3 and runner.core.find_snapshot(3) is None
            response = await a.stub.AcknowledgeCheckpoint(
                ack_request(job_id, agent.attempts[("src", 0)], 3, str(state)), timeout=T
            )
            assert response.result == cpb.ACK_RESULT_DISCARDED
            runner.io.submit(SweepOrphans(100))
            await runner.io.join()
            assert state.is_file(), "a checkpoint Redis holds as completed lost a file"
            assert not manager.fenced

    asyncio.run(main())


def test_a_superseded_coordinator_disposes_no_savepoint_and_the_leader_does(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """``DisposeSavepoint`` is a fenced deletion through the job's I/O queue: a coordinator
    superseded without noticing deletes nothing and learns it is stale; the current one
    disposes, and its core and Redis forget the savepoint."""

    async def main() -> None:
        namespace = fresh_namespace()
        root = tmp_path / "cp"
        async with contextlib.AsyncExitStack() as stack:
            a, job_id, _ = await _job_with_agent(stack, redis_server.url, root, namespace, 1)
            sp = await a.stub.TriggerSavepoint(
                cpb.TriggerSavepointRequest(job_id=job_id, target_directory=str(tmp_path / "sp")),
                timeout=T,
            )
            b = await stack.enter_async_context(
                running_coordinator(redis_server.url, str(root), redis_namespace=namespace)
            )
            before = _files(tmp_path / "sp")
            assert any(p.endswith("_metadata") for p in before)
            assert not a.manager.fenced
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await a.stub.DisposeSavepoint(
                    cpb.DisposeSavepointRequest(savepoint_path=sp.external_path), timeout=T
                )
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert a.manager.fenced
            assert _files(tmp_path / "sp") == before, "the stale coordinator deleted files"

            runner_b = b.manager.jobs[job_id]
            assert [s.checkpoint_id for s in runner_b.core.savepoints] == [sp.checkpoint_id]
            await b.stub.DisposeSavepoint(
                cpb.DisposeSavepointRequest(savepoint_path=sp.external_path), timeout=T
            )
            assert not os.path.exists(sp.external_path)
            assert runner_b.core.savepoints == []
            async with CheckpointStore.from_url(redis_server.url, namespace) as store:
                assert await store.list_savepoints(job_id) == []
            assert not b.manager.fenced

    asyncio.run(main())


def test_a_savepoint_of_a_job_not_hosted_is_disposed_fenced(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """No runner, no queue (a savepoint from another cluster): ``dispose_savepoint`` still
    proves the epoch in Redis before it deletes anything."""

    async def main() -> None:
        namespace = fresh_namespace()
        storage = CheckpointStorage(str(tmp_path / "cp"))
        directory = tmp_path / "foreign" / "savepoint-fefefe-000000000001"
        state = write_file(directory / "src-0.state")
        handle = StateHandle(str(state), 5)
        ack = SubtaskAck(ExecutionAttempt("src", 0, 1), 5, (OperatorSubtaskState("op", (handle,)),))
        sp = CompletedCheckpoint(
            "fe" * 16, 3, CheckpointKind.SAVEPOINT, 1, 2, str(directory), (ack,)
        )
        storage.write_metadata(sp.external_path, sp)
        before = _files(directory)
        async with (
            CheckpointStore.from_url(redis_server.url, namespace) as old,
            CheckpointStore.from_url(redis_server.url, namespace) as new,
        ):
            await old.acquire_epoch()
            await new.acquire_epoch()
            with pytest.raises(StaleEpochError):
                await dispose_savepoint(old, storage, sp, str(directory))
            assert _files(directory) == before
            forgotten: list[int] = []
            await dispose_savepoint(new, storage, sp, str(directory), forgotten.append)
            assert forgotten == [3]
            assert not directory.exists()

    asyncio.run(main())

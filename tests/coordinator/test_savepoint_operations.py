"""Asynchronous savepoints (Flink REST's trigger id and status polling).

* The pure table: exact sequences with ``check_invariants`` after every step (eviction of the
  oldest ended operation, refusal when every slot is in progress, one end per operation).
* Over real gRPC and Redis with simulated agents: ``StartSavepoint`` answers IN_PROGRESS at once
  while an agent holds its acknowledgement back, ``GetSavepointOperation`` reports COMPLETED with
  the savepoint's path once it acknowledges; a refused request ends FAILED with the reason;
  an unknown id is NOT_FOUND; ``drain`` without ``stop`` is INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from kit.coordinator import running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import fresh_namespace
from kit.polling import wait_until_async
from kit.simulated_agent import SimulatedAgent

from snapflow.checkpointing import CheckpointKind, SavepointOperationStatus
from snapflow.coordinator.model import CompletedCheckpoint
from snapflow.coordinator.savepoint_operations import SavepointOperations
from snapflow.errors import NotFoundError, ResourceExhaustedError
from snapflow.v1 import coordinator_pb2 as cpb

T = 10.0
IN_PROGRESS = SavepointOperationStatus.IN_PROGRESS
COMPLETED = SavepointOperationStatus.COMPLETED
FAILED = SavepointOperationStatus.FAILED


def _savepoint(checkpoint_id: int) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        job_id="j",
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.SAVEPOINT,
        trigger_timestamp_ms=0,
        completion_timestamp_ms=1,
        external_path=f"/sp/savepoint-{checkpoint_id}",
        subtask_states=(),
    )


def test_the_table_keeps_operations_until_evicted_oldest_ended_first() -> None:
    table = SavepointOperations(capacity=2)
    table.start("a", CheckpointKind.SAVEPOINT)
    table.check_invariants()
    table.start("b", CheckpointKind.SAVEPOINT_SUSPEND)
    table.check_invariants()
    with pytest.raises(ResourceExhaustedError, match=r"2 savepoint requests .* in progress"):
        table.start("c", CheckpointKind.SAVEPOINT)
    table.failed("b", "declined")
    table.check_invariants()
    table.start("c", CheckpointKind.SAVEPOINT)  # evicts b (ended), keeps a (in progress)
    table.check_invariants()
    assert [table.get(r).status for r in ("a", "c")] == [IN_PROGRESS, IN_PROGRESS]
    with pytest.raises(NotFoundError, match="no savepoint request 'b'"):
        table.get("b")
    table.completed("a", _savepoint(4))
    table.failed("a", "too late")  # an operation ends once
    table.check_invariants()
    a = table.get("a")
    assert (a.status, a.savepoint, a.failure) == (COMPLETED, _savepoint(4), "")


def test_the_table_refuses_checkpoints_and_reused_ids() -> None:
    table = SavepointOperations()
    with pytest.raises(ValueError, match="not a savepoint"):
        table.start("a", CheckpointKind.CHECKPOINT)
    table.start("a", CheckpointKind.SAVEPOINT)
    with pytest.raises(ValueError, match="already in use"):
        table.start("a", CheckpointKind.SAVEPOINT)


def test_start_then_poll_over_grpc(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running_coordinator(
            redis_url, str(tmp_path / "cp"), redis_namespace=fresh_namespace()
        ) as c:
            job_id = await submit(c.stub, two_vertex_graph(1, 1), timeout_ms=1500)
            target = str(tmp_path / "savepoints")

            async def poll(request_id: str) -> cpb.SavepointOperation:
                request = cpb.GetSavepointOperationRequest(job_id=job_id, request_id=request_id)
                op: cpb.SavepointOperation = await c.stub.GetSavepointOperation(request, timeout=T)
                return op

            async def ended(request_id: str) -> cpb.SavepointOperation:
                async def check() -> cpb.SavepointOperation | None:
                    op = await poll(request_id)
                    in_progress = op.status == cpb.SAVEPOINT_OPERATION_STATUS_IN_PROGRESS
                    return None if in_progress else op

                op = await wait_until_async(check, "the operation ended")
                assert op is not None
                return op

            start = cpb.StartSavepointRequest(job_id=job_id, target_directory=target)
            # Not running yet: the request is refused, and the operation says why.
            refused = await ended((await c.stub.StartSavepoint(start, timeout=T)).request_id)
            assert refused.status == cpb.SAVEPOINT_OPERATION_STATUS_FAILED
            assert "NOT_ALL_REQUIRED_TASKS_RUNNING" in refused.failure

            acking = False
            agent = SimulatedAgent(
                c.address,
                job_id,
                [("src", 0), ("map", 0)],
                policy=lambda task, cid: "ack" if acking else "ignore",
            )
            await agent.start()
            try:
                await agent.register_all()
                # The agents hold their acks back: in progress, then expired (timeout 1.5 s).
                started = await c.stub.StartSavepoint(start, timeout=T)
                assert started.status == cpb.SAVEPOINT_OPERATION_STATUS_IN_PROGRESS
                assert len(started.request_id) == 32 and started.job_id == job_id
                await wait_until_async(lambda: agent.triggered, "the savepoint was triggered")
                still = await poll(started.request_id)
                assert still.status == cpb.SAVEPOINT_OPERATION_STATUS_IN_PROGRESS
                expired = await ended(started.request_id)
                assert expired.status == cpb.SAVEPOINT_OPERATION_STATUS_FAILED
                assert "EXPIRED" in expired.failure

                acking = True
                second = await c.stub.StartSavepoint(start, timeout=T)
                done = await ended(second.request_id)
                assert done.status == cpb.SAVEPOINT_OPERATION_STATUS_COMPLETED, done.failure
                assert done.savepoint.external_path.startswith(target)
                assert (Path(done.savepoint.external_path) / "_metadata").is_file()
                assert done.failure == ""
                # The first operation is still there, unchanged.
                assert (await poll(started.request_id)).status == expired.status

                with pytest.raises(grpc.aio.AioRpcError) as unknown:
                    await poll("0" * 32)
                assert unknown.value.code() is grpc.StatusCode.NOT_FOUND
                # Refused before it was queued (a relative target): INVALID_ARGUMENT, and the
                # operation it had opened ended, so it holds no in-progress slot.
                with pytest.raises(grpc.aio.AioRpcError) as relative:
                    await c.stub.StartSavepoint(
                        cpb.StartSavepointRequest(job_id=job_id, target_directory="rel/sp"),
                        timeout=T,
                    )
                assert relative.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                table = c.manager.jobs[job_id].requests.savepoint_operations
                assert len(table) == 4  # refused, expired, completed, the relative one
                assert all(op.status is not IN_PROGRESS for op in table._ops.values())
                with pytest.raises(grpc.aio.AioRpcError) as drain:
                    await c.stub.StartSavepoint(
                        cpb.StartSavepointRequest(job_id=job_id, drain=True), timeout=T
                    )
                assert drain.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            finally:
                await agent.stop()

    asyncio.run(main())

"""``Subtask`` (worker/runtime/task.py) on its own: in-process channels in and out, the ack and
decline callbacks recorded. Every frame is queued before the task runs, so each test is one
deterministic run of the task until its inputs end."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.checkpointing import BarrierOptions, CheckpointMode, DeclineReason
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.runtime import barriers as b
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    WatermarkFrame,
)
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport
from snapflow.worker.runtime.task_state import RestoreData

NAME = "v#0@1"
# Once every input ended: the maximum watermark, then the end of the output partition.
END = [WatermarkFrame(MAX_WATERMARK), EndOfPartitionFrame()]


class FailingSnapshot(Operator):
    def snapshot_state(self, checkpoint_id: int) -> None:
        raise RuntimeError("boom")


def test_aligned_barriers_snapshot_forward_the_barrier_behind_the_data_and_ack(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        h = harness([])
        options = BarrierOptions(target_location=str(tmp_path))
        data = batch(1, 2, 3)
        await h.inputs[0].output.send(DataFrame(data))
        for channel in h.inputs:
            await channel.output.send(BarrierFrame(1, 1_000, options))
            await channel.output.close()
        await h.task.run()

        assert await h.outputs() == [
            DataFrame(data),
            BarrierFrame(1, 1_000, options),
            *END,
        ]
        assert h.declines == []
        [report] = h.acks
        assert report.checkpoint_id == 1
        assert report.operator_states == []  # no operator, no state
        assert report.unaligned is False
        assert report.persisted_in_flight_bytes == 0
        assert report.records_in == 3
        assert report.input_ended is False

    run(main())


def test_a_cancel_marker_forwards_a_marker_and_declines_as_alignment_canceled() -> None:
    async def main() -> None:
        h = harness([])
        await h.inputs[0].output.send(BarrierFrame(1, 1_000, BarrierOptions()))
        h.inputs[1].output.send_priority(CancelMarkerFrame(1))
        for channel in h.inputs:
            await channel.output.close()
        await h.task.run()

        assert await h.outputs() == [CancelMarkerFrame(1), *END]
        assert h.declines == [(1, DeclineReason.ALIGNMENT_CANCELED, f"{NAME}: canceled_by_marker")]
        assert h.acks == []

    run(main())


def test_a_newer_barrier_declines_the_older_checkpoint_as_subsumed(tmp_path: Path) -> None:
    async def main() -> None:
        h = harness([], num_inputs=2)
        options = BarrierOptions(target_location=str(tmp_path))
        await h.inputs[0].output.send(BarrierFrame(1, 1_000, options))
        await h.inputs[0].output.send(BarrierFrame(2, 2_000, options))
        await h.inputs[1].output.send(BarrierFrame(2, 2_000, options))
        for channel in h.inputs:
            await channel.output.close()
        await h.task.run()

        assert h.declines == [(1, DeclineReason.SUBSUMED, f"{NAME}: subsumed")]
        assert [r.checkpoint_id for r in h.acks] == [2]
        assert await h.outputs() == [
            CancelMarkerFrame(1),
            BarrierFrame(2, 2_000, options),
            *END,
        ]

    run(main())


def test_a_failing_snapshot_declines_as_snapshot_failed_and_cancels_its_barrier(
    tmp_path: Path,
) -> None:
    """The barrier goes downstream before the state is taken (Flink's order); when taking it
    fails, a cancel marker chases it, and the task declines."""

    async def main() -> None:
        h = harness([FailingSnapshot()], num_inputs=1)
        options = BarrierOptions(target_location=str(tmp_path))
        await h.inputs[0].output.send(BarrierFrame(1, 1_000, options))
        await h.inputs[0].output.close()
        await h.task.run()

        assert h.declines == [(1, DeclineReason.SNAPSHOT_FAILED, f"{NAME}: boom")]
        assert h.acks == []
        # the marker is a priority frame: it overtakes the barrier still queued downstream
        assert await h.outputs() == [CancelMarkerFrame(1), BarrierFrame(1, 1_000, options), *END]

    run(main())


@dataclass(frozen=True)
class NotAnAction:
    checkpoint_id: int


def test_an_unknown_action_fails_the_task_instead_of_being_dropped() -> None:
    async def main() -> None:
        h = harness([])
        assert h.task.input_loop is not None
        with pytest.raises(
            TypeError, match=r"^unknown barrier action: NotAnAction\(checkpoint_id=1\)$"
        ):
            await h.task.input_loop.execute([NotAnAction(1)])  # type: ignore[list-item]

    run(main())


@pytest.mark.parametrize(
    ("reason", "declined_as"),
    [
        (b.BarrierAbortReason.SUBSUMED, DeclineReason.SUBSUMED),
        (b.BarrierAbortReason.TOO_MANY_PENDING, DeclineReason.SUBSUMED),
        (b.BarrierAbortReason.CANCELED_BY_MARKER, DeclineReason.ALIGNMENT_CANCELED),
    ],
)
def test_every_barrier_abort_declines_with_its_decline_reason(
    reason: b.BarrierAbortReason, declined_as: DeclineReason
) -> None:
    async def main() -> None:
        h = harness([])
        assert h.task.input_loop is not None
        await h.task.input_loop.execute([b.AbortCheckpoint(7, reason)])
        assert h.declines == [(7, declined_as, f"{NAME}: {reason.value}")]
        await h.output.output.close()
        assert await h.outputs() == [CancelMarkerFrame(7), EndOfPartitionFrame()]

    run(main())


class SplitRows(Operator):
    """Emits every row of a batch as a batch of its own: several outputs for one input."""

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return [batch.slice(i, 1) for i in range(batch.num_rows)]


def _keys(frames: list[Frame]) -> list[int]:
    return [k for f in frames if isinstance(f, DataFrame) for k in f.batch.column(0).to_pylist()]


def test_an_unaligned_barrier_taken_while_blocked_keeps_all_output_of_the_input(
    tmp_path: Path,
) -> None:
    """All batches one input produced go before the barrier: those it overtakes are output
    channel state; none may follow it (its input is already behind the snapshot)."""
    options = BarrierOptions(mode=CheckpointMode.UNALIGNED, target_location=str(tmp_path))
    taken: dict[str, Any] = {}

    async def snapshot() -> None:
        # One credit and one queued frame: batch 1 is delivered, 2 queues, 3 queues and the
        # task waits (backpressure) with 4 still to send when the barrier comes.
        h = harness([SplitRows()], output_credits=1, output_queue=1)
        running = asyncio.create_task(h.task.run())
        await h.inputs[1].output.send(DataFrame(batch(1, 2, 3, 4)))
        # Taking the batch in (``records_in``) is not enough: the chain may still be splitting
        # it (the task thread); wait until the output really holds the batch queued.
        async with asyncio.timeout(5):
            while h.task.records_in < 4 or h.output.output.queued_data < 1:
                await asyncio.sleep(0.005)
        for channel in h.inputs:
            channel.output.send_priority(BarrierFrame(1, 1_000, options))
        # Nothing reads the output until the snapshot is taken: a consumer draining it first
        # would unblock the task, and the barrier would then rightly follow all four.
        async with asyncio.timeout(5):
            while not h.acks:
                await asyncio.sleep(0.005)
        for channel in h.inputs:
            await channel.output.close()
        frames, _ = await asyncio.gather(h.outputs(), running)
        [report] = h.acks
        taken["report"] = report
        taken["out"] = _keys(frames)

    run(snapshot())
    report: SnapshotReport = taken["report"]
    assert report.unaligned
    assert taken["out"] == [1, 2, 3, 4]

    # Restore: the output channel state replays exactly what the barrier overtook.
    async def restore() -> None:
        by_op = {op_id: {0: hs} for op_id, hs in report.operator_states}
        data = RestoreData(checkpoint_id=1, previous_parallelism=1, handles=by_op)
        h = harness([SplitRows()], output_credits=1, output_queue=1, restore=data)
        for channel in h.inputs:
            await channel.output.close()
        frames, _ = await asyncio.gather(h.outputs(), h.task.run())
        taken["replayed"] = _keys(frames)

    run(restore())
    # Batch 1 had the one credit (it is in the receiver, which persists it if its barrier
    # overtakes it there); 2 and 3 were queued and 4 was produced by the same input: all three
    # are the sender's output channel state, so a restore loses none of them.
    assert taken["replayed"] == [2, 3, 4]


def test_an_unaligned_snapshot_aborted_before_its_other_barriers_lets_the_task_finish(
    tmp_path: Path,
) -> None:
    """Unaligned checkpoint 1 is taken at its first barrier and waits for the other channel's;
    a cancel marker there aborts it. Its asynchronous part must settle (no ack), so that the
    task finishes after checkpoint 2 completed and its inputs ended, instead of waiting for
    the aborted one forever."""

    async def main() -> None:
        h = harness([])
        options = BarrierOptions(mode=CheckpointMode.UNALIGNED, target_location=str(tmp_path))
        aligned = BarrierOptions(target_location=str(tmp_path))
        await h.inputs[0].output.send(BarrierFrame(1, 1_000, options))
        await h.inputs[1].output.send(CancelMarkerFrame(1))
        for channel in h.inputs:
            await channel.output.send(BarrierFrame(2, 2_000, aligned))
            await channel.output.close()
        async with asyncio.timeout(10):
            await h.task.run()
        assert [report.checkpoint_id for report in h.acks] == [2]
        assert [(cid, reason) for cid, reason, _ in h.declines] == [
            (1, DeclineReason.ALIGNMENT_CANCELED)
        ]

    run(main())

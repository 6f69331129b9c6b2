"""``Subtask`` (worker/runtime/task.py) on its own: in-process channels in and out, the ack and
decline callbacks recorded. Every frame is queued before the task runs, so each test is one
deterministic run of the task until its inputs end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from kit.channels import run

from snapflow.checkpointing import BarrierOptions, CheckpointMode, DeclineReason
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.runtime import barriers as b
from snapflow.worker.runtime.channels import InputGate, LocalChannel
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    WatermarkFrame,
)
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.partitioners import ForwardPartitioner
from snapflow.worker.runtime.task import OutputEdge, RestoreData, SnapshotReport, Subtask

NAME = "v#0@1"
# Once every input ended: the maximum watermark, then the end of the output partition.
END = [WatermarkFrame(MAX_WATERMARK), EndOfPartitionFrame()]


@dataclass
class Harness:
    """A subtask ``v#0@1`` with ``inputs`` in-process input channels and one output channel."""

    task: Subtask
    inputs: list[LocalChannel]
    output: LocalChannel
    acks: list[SnapshotReport] = field(default_factory=list)
    declines: list[tuple[int, DeclineReason, str]] = field(default_factory=list)

    async def outputs(self) -> list[Frame]:
        """Every frame the task sent downstream, end of partition included."""
        gate = InputGate([self.output.input])
        frames = []
        while (item := await gate.next()) is not None:
            frames.append(item[1])
        return frames


def harness(operators: list[Operator], num_inputs: int = 2) -> Harness:
    inputs = [LocalChannel(4, name=f"in{i}") for i in range(num_inputs)]
    output = LocalChannel(16, output_queue=64, name="out")
    h: Harness

    async def ack(report: SnapshotReport) -> None:
        h.acks.append(report)
        h.task.notify_complete(report.checkpoint_id)  # lets the task finish after its snapshot

    async def decline(checkpoint_id: int, reason: DeclineReason, message: str) -> None:
        h.declines.append((checkpoint_id, reason, message))

    task = Subtask(
        job_id="job",
        vertex_id="v",
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=1,
        operators=operators,
        key_field=None,
        gate=InputGate([c.input for c in inputs]),
        outputs=[OutputEdge(ForwardPartitioner(), [output.output])],
        mode=CheckpointMode.ALIGNED,
        restore=RestoreData(),
        ack=ack,
        decline=decline,
    )
    h = Harness(task, inputs, output)
    task.open()
    return h


def batch(*keys: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": list(keys)})


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


def test_a_failing_snapshot_declines_as_snapshot_failed_and_forwards_no_barrier(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        h = harness([FailingSnapshot()], num_inputs=1)
        options = BarrierOptions(target_location=str(tmp_path))
        await h.inputs[0].output.send(BarrierFrame(1, 1_000, options))
        await h.inputs[0].output.close()
        await h.task.run()

        assert h.declines == [(1, DeclineReason.SNAPSHOT_FAILED, f"{NAME}: boom")]
        assert h.acks == []
        assert await h.outputs() == END

    run(main())


@dataclass(frozen=True)
class NotAnAction:
    checkpoint_id: int


def test_an_unknown_action_fails_the_task_instead_of_being_dropped() -> None:
    async def main() -> None:
        h = harness([])
        with pytest.raises(
            TypeError, match=r"^unknown barrier action: NotAnAction\(checkpoint_id=1\)$"
        ):
            await h.task._execute([NotAnAction(1)])  # type: ignore[list-item]

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
        await h.task._execute([b.AbortCheckpoint(7, reason)])
        assert h.declines == [(7, declined_as, f"{NAME}: {reason.value}")]
        await h.output.output.close()
        assert await h.outputs() == [CancelMarkerFrame(7), EndOfPartitionFrame()]

    run(main())

"""One ``Subtask`` on its own, for the worker runtime tests: in-process channels in and out,
the ack and decline callbacks recorded."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from snapflow.checkpointing import CheckpointMode, DeclineReason
from snapflow.worker.runtime.frames import Frame
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.partitioners import ForwardPartitioner
from snapflow.worker.runtime.placement import PlacementSettings
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport
from snapflow.worker.runtime.task import Subtask
from snapflow.worker.runtime.task_output import OutputEdge
from snapflow.worker.runtime.task_state import RestoreData


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


def harness(
    operators: list[Operator],
    num_inputs: int = 2,
    *,
    output_credits: int = 16,
    output_queue: int = 64,
    restore: RestoreData | None = None,
    placement: PlacementSettings | None = None,
    input_of: list[int] | None = None,
    key_fields: tuple[str | None, ...] = (),
) -> Harness:
    """An opened aligned subtask ``v#0@1`` of job ``job`` chaining ``operators``; every ack
    notifies the checkpoint complete at once (which lets the task finish after its snapshot).
    ``output_credits`` bounds what the output channel delivers before the rest queues up;
    ``output_queue`` how many data frames queue before ``send`` waits (backpressure);
    ``input_of`` which logical input each input channel belongs to (default: all input 0);
    ``key_fields`` the key field of each input (keyed state when any is set)."""
    inputs = [LocalChannel(4, name=f"in{i}") for i in range(num_inputs)]
    output = LocalChannel(output_credits, output_queue=output_queue, name="out")
    h: Harness

    async def ack(report: SnapshotReport) -> None:
        h.acks.append(report)
        h.task.notify_complete(report.checkpoint_id)

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
        key_fields=key_fields,
        gate=InputGate([c.input for c in inputs], input_of),
        outputs=[OutputEdge(ForwardPartitioner(), [output.output])],
        mode=CheckpointMode.ALIGNED,
        restore=restore or RestoreData(),
        ack=ack,
        decline=decline,
        placement=placement,
    )
    h = Harness(task, inputs, output)
    task.open()
    return h


def batch(*keys: int) -> pa.RecordBatch:
    """One ``key`` column of these keys."""
    return pa.RecordBatch.from_pydict({"key": list(keys)})

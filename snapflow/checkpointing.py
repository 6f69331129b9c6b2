"""The checkpoint vocabulary shared by the coordinator and the workers.

One Python name per concept of the ``snapflow.v1`` checkpoint messages: what a checkpoint is
for (``CheckpointKind``), how barriers are handled (``CheckpointMode``), the options every
barrier carries (``BarrierOptions``) and why a task declines a checkpoint (``DeclineReason``).
The coordinator builds barrier options and reads declines; the worker reads barrier options
and sends declines. Concepts only one side has stay on that side: the coordinator's
``AbortReason`` (why a pending checkpoint failed), the barrier handler's ``BarrierAbortReason``
(why an input gate gave up on a checkpoint).

Values are plain data; ``snapflow.wire`` is the only place that maps them to and from the
proto enum numbers. Enum values are the lower-case names, which the Redis records store.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "BarrierOptions",
    "CheckpointKind",
    "CheckpointMode",
    "DeclineReason",
    "SavepointOperationStatus",
]


class CheckpointKind(enum.Enum):
    """What a checkpoint is for (proto ``CheckpointKind``)."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"
    SAVEPOINT_SUSPEND = "savepoint_suspend"
    """Stop-with-savepoint: the tasks finish once it completes."""
    SAVEPOINT_TERMINATE = "savepoint_terminate"
    """Stop-with-savepoint with drain: sources emit the maximum watermark first."""

    @property
    def is_savepoint(self) -> bool:
        """Every kind but a checkpoint: never subsumed, kept until disposed."""
        return self is not CheckpointKind.CHECKPOINT

    @property
    def is_synchronous(self) -> bool:
        """Stop-with-savepoint: the job ends once this savepoint completes."""
        return self in (CheckpointKind.SAVEPOINT_SUSPEND, CheckpointKind.SAVEPOINT_TERMINATE)


class SavepointOperationStatus(enum.Enum):
    """Where an asynchronous savepoint request stands (proto ``SavepointOperationStatus``;
    Flink's REST API reports ``IN_PROGRESS`` and ``COMPLETED``, with a failure cause)."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


class CheckpointMode(enum.Enum):
    """How operators handle barriers on their input gates (proto ``CheckpointMode``).

    Aligned with a timeout is not a mode of its own: it is ``ALIGNED`` with
    ``BarrierOptions.aligned_checkpoint_timeout_ms > 0``, as in Flink.
    """

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    AT_LEAST_ONCE = "at_least_once"


class DeclineReason(enum.Enum):
    """Why a task declines a checkpoint (proto ``DeclineReason``)."""

    UNSPECIFIED = "unspecified"
    """No reason given, or one this version does not know."""
    SNAPSHOT_FAILED = "snapshot_failed"
    """Taking or writing the snapshot failed."""
    TASK_NOT_READY = "task_not_ready"
    """The task could not take part (not running yet)."""
    SUBSUMED = "subsumed"
    """A newer checkpoint's barrier overtook it on the task's input."""
    ALIGNMENT_CANCELED = "alignment_canceled"
    """A cancel marker for it arrived on an input channel."""
    IO_ERROR = "io_error"
    """The task's I/O failed."""


@dataclass(frozen=True)
class BarrierOptions:
    """The options a barrier carries (proto ``CheckpointOptions``), chosen by the coordinator
    per checkpoint and forwarded unchanged by every task, except when an aligned checkpoint
    switches to unaligned."""

    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    """What the checkpoint is for."""
    mode: CheckpointMode = CheckpointMode.ALIGNED
    """How the receiving task handles the barrier."""
    aligned_checkpoint_timeout_ms: int = 0
    """ALIGNED checkpoints only: switch to unaligned this long after the barrier's creation;
    0 = never. Savepoints never switch."""
    target_location: str = ""
    """The directory the snapshot is written under."""

    @property
    def is_unaligned(self) -> bool:
        """An unaligned barrier: a priority frame on the wire (it overtakes queued data)."""
        return self.mode is CheckpointMode.UNALIGNED

    @property
    def is_timeoutable(self) -> bool:
        """Aligned, switching to unaligned after ``aligned_checkpoint_timeout_ms``."""
        return (
            self.mode is CheckpointMode.ALIGNED
            and self.aligned_checkpoint_timeout_ms > 0
            and not self.kind.is_savepoint
        )

"""The checkpoint vocabulary shared by the coordinator and the workers.

One Python name per concept of the ``snapflow.v1`` checkpoint messages: what a checkpoint is
for (``CheckpointKind``), how barriers are handled (``CheckpointMode``), the options every
barrier carries (``BarrierOptions``), why a task declines a checkpoint (``DeclineReason``) and
where a checkpoint or a savepoint request stands (``CheckpointStatus``,
``SavepointOperationStatus``). The coordinator builds barrier options, reads declines and
reports statuses; the worker reads barrier options and sends declines; API clients (the CLI)
read statuses. A snapshot's files are ``StateHandle`` records (proto ``StateHandle``), whose
``kind`` is one of the handle kind names below: the workers write them, the coordinator stores
them in its Redis records and ``_metadata`` and hands them back on restore. Concepts only one
side has stay on that side: the coordinator's ``AbortReason`` (why a pending checkpoint
failed), the barrier handler's ``BarrierAbortReason`` (why an input gate gave up on a
checkpoint), the state file format's kind codes (``snapflow.worker.state.state_files``).

Values are plain data; ``snapflow.wire`` is the only place that maps them to and from the
proto (enum numbers, the barrier-option and state-handle messages). Enum values are the
lower-case names, which the Redis records store.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "BROADCAST",
    "CHANNEL_INPUT",
    "CHANNEL_OUTPUT",
    "INCREMENTAL",
    "KEYED",
    "OPERATOR",
    "SHARED",
    "SHARED_NEW",
    "TIMERS",
    "UNION",
    "BarrierOptions",
    "CheckpointKind",
    "CheckpointMode",
    "CheckpointStatus",
    "DeclineReason",
    "SavepointOperationStatus",
    "StateHandle",
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


class CheckpointStatus(enum.Enum):
    """Where a checkpoint stands (proto ``CheckpointStatus``)."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


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
    inline_state_threshold_bytes: int = 0
    """A subtask's snapshot of at most this many bytes is sent inline (``StateHandle.data``)
    instead of written under ``target_location``; 0 = always files."""

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


# The kinds of state handles. A kind is a string on the wire and in the Redis records, so a
# kind this version does not know (a newer worker's) passes through the coordinator unchanged.
KEYED = "keyed"
"""Keyed state of one key-group range (a canonical snapshot, any backend)."""
TIMERS = "timers"
"""The event-time timers of one key-group range."""
OPERATOR = "operator"
"""Operator list state, redistributed in chunks on rescaling (Flink's SPLIT_DISTRIBUTE)."""
UNION = "union"
"""Operator union list state: every new subtask gets all lists (Flink's UNION)."""
BROADCAST = "broadcast"
"""Broadcast state (maps by name): every subtask checkpoints its own copy; on a rescale new
subtask ``i`` gets old subtask ``i % old parallelism``'s copy (Flink's BROADCAST mode)."""
INCREMENTAL = "incremental"
"""The manifest of an incremental checkpoint of the disk (RocksDB) backend."""
SHARED = "shared"
"""A file shared between checkpoints (an SST file) that an earlier checkpoint uploaded."""
SHARED_NEW = "shared-new"
"""A file shared between checkpoints that this checkpoint uploaded."""
CHANNEL_INPUT = "channel_input"
"""In-flight input data of an unaligned checkpoint; ``key_group_start`` is the channel index."""
CHANNEL_OUTPUT = "channel_output"
"""In-flight output data of an unaligned checkpoint; ``key_group_start`` is the channel index."""


@dataclass(frozen=True, slots=True)
class StateHandle:
    """One state file of an operator's snapshot, or its byte range inside a merged object
    (proto ``StateHandle``). Operator and union handles have the empty key-group range
    ``0..-1``. The coordinator's Redis records store it as a JSON object of these fields."""

    path: str
    """Absolute path or URI of the file, or of the object that holds it."""
    size_bytes: int
    """Length of the file in bytes (of its byte range when ``offset`` > 0)."""
    kind: str = KEYED
    """What the file holds: one of the kind names of this module."""
    key_group_start: int = 0
    """First key group of the file (inclusive); channel state: the channel index."""
    key_group_end: int = 0
    """Last key group of the file (inclusive)."""
    offset: int = 0
    """Where the file starts inside the object at ``path``; 0: it is the whole object. Several
    handles of one subtask's checkpoint may share an object (file merging, as Flink's segment
    file handles do)."""
    data: bytes = field(default=b"", repr=False)
    """Inline state: the file's bytes themselves, carried by the acknowledgement and stored in
    the checkpoint's records and ``_metadata`` (Flink's ``ByteStreamStateHandle``); nothing
    exists at ``path``, which only names the state. Empty: the bytes are in the file."""

    @property
    def is_inline(self) -> bool:
        """The bytes are in the handle, not in storage (nothing to read, check or delete)."""
        return bool(self.data)

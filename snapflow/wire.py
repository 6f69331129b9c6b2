"""The one place where the checkpoint vocabulary meets proto enum numbers and messages.

Every enum of ``snapflow.checkpointing`` and ``snapflow.jobgraph`` has one ``EnumMapping``
here, and ``BarrierOptions``, ``StateHandle``, a task's ``TaskMetrics``
(``snapflow.task_metrics``), a job's ``CheckpointConfig``
(``snapflow.checkpoint_config``) and its ``StateBackendOptions``
(``snapflow.state_backend_options``) have their message conversions; the
coordinator, the workers and the API clients (the Spark bridge, the CLI) convert through them
and compare nothing else against ``snapflow.v1`` enum numbers for these concepts
(``tests/project/test_vocabulary.py`` checks that no other module names a proto enum
constant; the coordinator's own enums are mapped in ``coordinator/convert.py``). Adding a member means adding it to the proto, to the enum and
to its mapping here (the mapping refuses to be built if a member or a proto number is
missing).

Numbers that are not in a mapping:

* ``CHECKPOINT_MODE_UNSPECIFIED`` is ``ALIGNED``, as the proto documents.
* Any other unspecified or unknown number raises ``UnknownEnumValueError`` (an
  ``InvalidArgumentError``: ``INVALID_ARGUMENT`` if it reaches a gRPC caller), unless the caller
  asks for a default with ``from_pb_or``.
* A barrier's options are never refused: ``barrier_options_from_pb`` reads an unknown or
  unspecified kind as ``CHECKPOINT`` and an unknown mode as ``ALIGNED``.

A state handle's ``kind`` is a string, not an enum: it passes through as it is, an empty one
read as ``keyed``. Validating what a client sends is ``coordinator/convert.py``'s job, except
for a job's checkpoint config, which validates itself: ``checkpoint_config_from_pb`` reads the
proto's zeros as the defaults and names the field of any refusal (``checkpoint_config.<field>``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.checkpointing import (
    KEYED,
    BarrierOptions,
    CheckpointKind,
    CheckpointMode,
    CheckpointStatus,
    DeclineReason,
    SavepointOperationStatus,
    StateHandle,
)
from snapflow.errors import InvalidArgumentError, InvalidFieldError
from snapflow.jobgraph import JobState, PartitionerKind, TaskState
from snapflow.state_backend_options import StateBackendOptions, parse_state_backend
from snapflow.task_metrics import MS_PER_SECOND, TaskMetrics
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_MODE",
    "CHECKPOINT_STATUS",
    "DECLINE_REASON",
    "JOB_STATE",
    "MAPPINGS",
    "PARTITIONER_KIND",
    "SAVEPOINT_OPERATION_STATUS",
    "TASK_STATE",
    "EnumMapping",
    "UnknownEnumValueError",
    "barrier_options_from_pb",
    "barrier_options_to_pb",
    "checkpoint_config_from_pb",
    "checkpoint_config_to_pb",
    "state_backend_options_from_pb",
    "state_backend_options_to_pb",
    "state_handle_from_pb",
    "state_handle_to_pb",
    "task_metrics_from_pb",
    "task_metrics_to_pb",
]

E = TypeVar("E", bound=enum.Enum)
V = TypeVar("V", bound=int)
D = TypeVar("D")


class UnknownEnumValueError(InvalidArgumentError):
    """A proto enum number this version does not know (or UNSPECIFIED where it means nothing)."""

    def __init__(self, field: str, value: int, proto_name: str) -> None:
        super().__init__(f"{field} {value} is not a known {proto_name}")
        self.value = value


class EnumMapping(Generic[E, V]):
    """One Python enum and its proto enum: a bijection between members and numbers."""

    def __init__(
        self,
        enum_type: type[E],
        proto_type: EnumTypeWrapper,
        numbers: Mapping[E, V],
        *,
        unspecified: E | None = None,
    ) -> None:
        self.enum_type = enum_type
        self.proto_name: str = proto_type.DESCRIPTOR.name
        """The proto enum's name, for error messages."""
        self.unspecified = unspecified
        """What UNSPECIFIED (0) means; None: it is refused like an unknown number."""
        self._to_pb = dict(numbers)
        self._from_pb: dict[int, E] = {int(v): k for k, v in numbers.items()}
        # A mapping that misses a member or a proto number is a bug: fail at import.
        if set(self._to_pb) != set(enum_type):
            raise TypeError(f"{self.proto_name}: members {set(enum_type) - set(self._to_pb)}")
        proto_numbers = {int(v) for v in proto_type.values()}
        if len(self._from_pb) != len(self._to_pb) or set(self._from_pb) | {0} != proto_numbers:
            raise TypeError(f"{self.proto_name}: numbers {sorted(self._from_pb)}")

    def to_pb(self, member: E) -> V:
        """The proto number of ``member``."""
        return self._to_pb[member]

    def from_pb(self, value: int, *, field: str = "value") -> E:
        """The member of a proto number; ``UnknownEnumValueError`` naming ``field`` if none."""
        member = self._from_pb.get(value)
        if member is not None:
            return member
        if value == 0 and self.unspecified is not None:
            return self.unspecified
        raise UnknownEnumValueError(field, value, self.proto_name)

    def from_pb_or(self, value: int, default: D) -> E | D:
        """The member of a proto number, or ``default`` where ``from_pb`` would raise."""
        try:
            return self.from_pb(value)
        except UnknownEnumValueError:
            return default


CHECKPOINT_KIND: EnumMapping[CheckpointKind, pb.CheckpointKind] = EnumMapping(
    CheckpointKind,
    pb.CheckpointKind,
    {
        CheckpointKind.CHECKPOINT: pb.CHECKPOINT_KIND_CHECKPOINT,
        CheckpointKind.SAVEPOINT: pb.CHECKPOINT_KIND_SAVEPOINT,
        CheckpointKind.SAVEPOINT_SUSPEND: pb.CHECKPOINT_KIND_SAVEPOINT_SUSPEND,
        CheckpointKind.SAVEPOINT_TERMINATE: pb.CHECKPOINT_KIND_SAVEPOINT_TERMINATE,
    },
)
CHECKPOINT_MODE: EnumMapping[CheckpointMode, pb.CheckpointMode] = EnumMapping(
    CheckpointMode,
    pb.CheckpointMode,
    {
        CheckpointMode.ALIGNED: pb.CHECKPOINT_MODE_ALIGNED,
        CheckpointMode.UNALIGNED: pb.CHECKPOINT_MODE_UNALIGNED,
        CheckpointMode.AT_LEAST_ONCE: pb.CHECKPOINT_MODE_AT_LEAST_ONCE,
    },
    unspecified=CheckpointMode.ALIGNED,  # the proto: "treated as ALIGNED"
)
CHECKPOINT_STATUS: EnumMapping[CheckpointStatus, pb.CheckpointStatus] = EnumMapping(
    CheckpointStatus,
    pb.CheckpointStatus,
    {
        CheckpointStatus.IN_PROGRESS: pb.CHECKPOINT_STATUS_IN_PROGRESS,
        CheckpointStatus.COMPLETED: pb.CHECKPOINT_STATUS_COMPLETED,
        CheckpointStatus.FAILED: pb.CHECKPOINT_STATUS_FAILED,
    },
)
DECLINE_REASON: EnumMapping[DeclineReason, cpb.DeclineReason] = EnumMapping(
    DeclineReason,
    cpb.DeclineReason,
    {
        DeclineReason.UNSPECIFIED: cpb.DECLINE_REASON_UNSPECIFIED,
        DeclineReason.SNAPSHOT_FAILED: cpb.DECLINE_REASON_SNAPSHOT_FAILED,
        DeclineReason.TASK_NOT_READY: cpb.DECLINE_REASON_TASK_NOT_READY,
        DeclineReason.SUBSUMED: cpb.DECLINE_REASON_SUBSUMED,
        DeclineReason.ALIGNMENT_CANCELED: cpb.DECLINE_REASON_ALIGNMENT_CANCELED,
        DeclineReason.IO_ERROR: cpb.DECLINE_REASON_IO_ERROR,
    },
)
PARTITIONER_KIND: EnumMapping[PartitionerKind, pb.PartitionerKind] = EnumMapping(
    PartitionerKind,
    pb.PartitionerKind,
    {
        PartitionerKind.FORWARD: pb.PARTITIONER_KIND_FORWARD,
        PartitionerKind.HASH: pb.PARTITIONER_KIND_HASH,
        PartitionerKind.REBALANCE: pb.PARTITIONER_KIND_REBALANCE,
        PartitionerKind.BROADCAST: pb.PARTITIONER_KIND_BROADCAST,
    },
)
TASK_STATE: EnumMapping[TaskState, pb.TaskState] = EnumMapping(
    TaskState,
    pb.TaskState,
    {
        TaskState.DEPLOYING: pb.TASK_STATE_DEPLOYING,
        TaskState.RUNNING: pb.TASK_STATE_RUNNING,
        TaskState.FINISHED: pb.TASK_STATE_FINISHED,
        TaskState.FAILED: pb.TASK_STATE_FAILED,
        TaskState.CANCELED: pb.TASK_STATE_CANCELED,
    },
)
JOB_STATE: EnumMapping[JobState, pb.JobState] = EnumMapping(
    JobState,
    pb.JobState,
    {
        JobState.CREATED: pb.JOB_STATE_CREATED,
        JobState.RUNNING: pb.JOB_STATE_RUNNING,
        JobState.RESTARTING: pb.JOB_STATE_RESTARTING,
        JobState.FINISHED: pb.JOB_STATE_FINISHED,
        JobState.CANCELED: pb.JOB_STATE_CANCELED,
        JobState.FAILED: pb.JOB_STATE_FAILED,
    },
)
SAVEPOINT_OPERATION_STATUS: EnumMapping[SavepointOperationStatus, cpb.SavepointOperationStatus] = (
    EnumMapping(
        SavepointOperationStatus,
        cpb.SavepointOperationStatus,
        {
            SavepointOperationStatus.IN_PROGRESS: cpb.SAVEPOINT_OPERATION_STATUS_IN_PROGRESS,
            SavepointOperationStatus.COMPLETED: cpb.SAVEPOINT_OPERATION_STATUS_COMPLETED,
            SavepointOperationStatus.FAILED: cpb.SAVEPOINT_OPERATION_STATUS_FAILED,
        },
    )
)
MAPPINGS: tuple[EnumMapping[Any, Any], ...] = (
    CHECKPOINT_KIND,
    CHECKPOINT_MODE,
    CHECKPOINT_STATUS,
    DECLINE_REASON,
    JOB_STATE,
    PARTITIONER_KIND,
    SAVEPOINT_OPERATION_STATUS,
    TASK_STATE,
)
"""Every mapping of this module."""


def barrier_options_to_pb(
    options: BarrierOptions, out: pb.CheckpointOptions | None = None
) -> pb.CheckpointOptions:
    """Fill ``out`` (a new message if None) from ``options`` and return it. In place, so a
    frame's nested message is not copied."""
    if out is None:
        out = pb.CheckpointOptions()
    out.kind = CHECKPOINT_KIND.to_pb(options.kind)
    out.mode = CHECKPOINT_MODE.to_pb(options.mode)
    out.aligned_checkpoint_timeout_ms = options.aligned_checkpoint_timeout_ms
    out.target_location = options.target_location
    out.inline_state_threshold_bytes = options.inline_state_threshold_bytes
    return out


def barrier_options_from_pb(msg: pb.CheckpointOptions) -> BarrierOptions:
    """The options of a barrier or trigger. Never refused: a barrier already in flight is
    handled with the defaults (a checkpoint, aligned) where a number is not known."""
    return BarrierOptions(
        kind=CHECKPOINT_KIND.from_pb_or(msg.kind, CheckpointKind.CHECKPOINT),
        mode=CHECKPOINT_MODE.from_pb_or(msg.mode, CheckpointMode.ALIGNED),
        aligned_checkpoint_timeout_ms=msg.aligned_checkpoint_timeout_ms,
        target_location=msg.target_location,
        inline_state_threshold_bytes=max(0, msg.inline_state_threshold_bytes),
    )


def state_handle_to_pb(handle: StateHandle) -> pb.StateHandle:
    """The message of ``handle``."""
    return pb.StateHandle(
        path=handle.path,
        size_bytes=handle.size_bytes,
        kind=handle.kind,
        key_group_start=handle.key_group_start,
        key_group_end=handle.key_group_end,
        offset=handle.offset,
        data=handle.data,
    )


def state_handle_from_pb(msg: pb.StateHandle) -> StateHandle:
    """The handle of a message; an unset kind is ``keyed`` (the dataclass's default)."""
    return StateHandle(
        path=msg.path,
        size_bytes=msg.size_bytes,
        kind=msg.kind or KEYED,
        key_group_start=msg.key_group_start,
        key_group_end=msg.key_group_end,
        offset=msg.offset,
        data=msg.data,
    )


def state_backend_options_to_pb(options: StateBackendOptions) -> pb.StateBackendOptions:
    """The message of ``options``: the fields it sets (``None`` stays unset)."""
    chosen = {name: getattr(options, name) for name in StateBackendOptions.field_names()}
    return pb.StateBackendOptions(**{k: v for k, v in chosen.items() if v is not None})


def state_backend_options_from_pb(msg: pb.StateBackendOptions) -> StateBackendOptions:
    """The options a message sets (a compaction style in any case); ``InvalidFieldError``
    naming ``state_backend_options.<field>`` when one is out of range."""
    values = {
        name: getattr(msg, name) for name in StateBackendOptions.field_names() if msg.HasField(name)
    }
    if "compaction_style" in values:
        values["compaction_style"] = values["compaction_style"].strip().lower()
    try:
        return StateBackendOptions(**values)
    except InvalidFieldError as e:
        raise e.within("state_backend_options") from None


def task_metrics_to_pb(metrics: TaskMetrics) -> cpb.TaskMetrics:
    """The message of ``metrics`` (no watermark yet: ``has_watermark`` false)."""
    return cpb.TaskMetrics(
        busy_ms_per_second=metrics.busy_ms_per_second,
        backpressured_ms_per_second=metrics.backpressured_ms_per_second,
        has_watermark=metrics.watermark_ms is not None,
        watermark_ms=metrics.watermark_ms or 0,
        period_ms=metrics.period_ms,
    )


def task_metrics_from_pb(msg: cpb.TaskMetrics) -> TaskMetrics:
    """The metrics an agent sent; ``InvalidFieldError`` when a time is not a number >= 0 or the
    period is negative. A time above 1000 ms per second (rounding) reads as 1000."""
    times = {}
    for name in ("busy_ms_per_second", "backpressured_ms_per_second"):
        value = getattr(msg, name)
        if not math.isfinite(value) or value < 0:
            raise InvalidFieldError(name, f"{name} must be a number >= 0, got {value!r}")
        times[name] = min(value, MS_PER_SECOND)
    if msg.period_ms < 0:
        raise InvalidFieldError("period_ms", f"period_ms must be >= 0, got {msg.period_ms}")
    return TaskMetrics(
        watermark_ms=msg.watermark_ms if msg.has_watermark else None,
        period_ms=msg.period_ms,
        **times,
    )


def checkpoint_config_to_pb(config: CheckpointConfig) -> pb.CheckpointConfig:
    """The message of ``config`` (``tolerable_failures=None`` is the ``unlimited`` flag)."""
    return pb.CheckpointConfig(
        interval_ms=config.interval_ms,
        timeout_ms=config.timeout_ms,
        min_pause_ms=config.min_pause_ms,
        max_concurrent=config.max_concurrent,
        mode=CHECKPOINT_MODE.to_pb(config.mode),
        aligned_checkpoint_timeout_ms=config.aligned_checkpoint_timeout_ms,
        tolerable_failures=config.tolerable_failures or 0,
        tolerable_failures_unlimited=config.tolerable_failures is None,
        retained=config.retained,
        storage_uri=config.storage_uri,
        state_backend=config.state_backend,
        state_backend_options=state_backend_options_to_pb(config.state_backend_options),
        inline_state_threshold_bytes=config.inline_state_threshold_bytes,
    )


def checkpoint_config_from_pb(msg: pb.CheckpointConfig) -> CheckpointConfig:
    """The config a client sent. The proto's zeros mean "unset": ``timeout_ms``,
    ``max_concurrent`` and ``retained`` then take the defaults, an empty ``state_backend`` is
    heap (a name is read in any case) and UNSPECIFIED mode is ALIGNED. A refusal is an
    ``InvalidFieldError`` naming ``checkpoint_config.<field>`` and what would be accepted."""
    defaults = CheckpointConfig()
    mode = CHECKPOINT_MODE.from_pb(msg.mode, field="checkpoint_config.mode")
    try:
        return CheckpointConfig(
            interval_ms=msg.interval_ms,
            timeout_ms=msg.timeout_ms or defaults.timeout_ms,
            min_pause_ms=msg.min_pause_ms,
            max_concurrent=msg.max_concurrent or defaults.max_concurrent,
            mode=mode,
            aligned_checkpoint_timeout_ms=msg.aligned_checkpoint_timeout_ms,
            tolerable_failures=None if msg.tolerable_failures_unlimited else msg.tolerable_failures,
            retained=msg.retained or defaults.retained,
            storage_uri=msg.storage_uri,
            state_backend=parse_state_backend(msg.state_backend),
            state_backend_options=state_backend_options_from_pb(msg.state_backend_options),
            inline_state_threshold_bytes=(
                msg.inline_state_threshold_bytes
                if msg.HasField("inline_state_threshold_bytes")
                else defaults.inline_state_threshold_bytes
            ),
        )
    except InvalidFieldError as e:
        raise e.within("checkpoint_config") from None

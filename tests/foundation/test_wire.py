"""The conversion edge (``snapflow.wire``): every member of the shared checkpoint vocabulary
round-trips through its proto number, and numbers outside a mapping are handled as documented;
barrier options and state handles round-trip through their messages."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from snapflow import wire
from snapflow.checkpointing import (
    BarrierOptions,
    CheckpointKind,
    CheckpointMode,
    CheckpointStatus,
    DeclineReason,
    SavepointOperationStatus,
    StateHandle,
)
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import JobState, PartitionerKind, TaskState
from snapflow.task_metrics import TaskMetrics
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

UNKNOWN = 99  # no proto enum of this version has a 99


@pytest.mark.parametrize(
    ("mapping", "enum_type", "proto_enum"),
    [
        (wire.CHECKPOINT_KIND, CheckpointKind, pb.CheckpointKind),
        (wire.CHECKPOINT_MODE, CheckpointMode, pb.CheckpointMode),
        (wire.DECLINE_REASON, DeclineReason, cpb.DeclineReason),
        (wire.CHECKPOINT_STATUS, CheckpointStatus, pb.CheckpointStatus),
        (wire.JOB_STATE, JobState, pb.JobState),
        (wire.PARTITIONER_KIND, PartitionerKind, pb.PartitionerKind),
        (wire.TASK_STATE, TaskState, pb.TaskState),
        (wire.SAVEPOINT_OPERATION_STATUS, SavepointOperationStatus, cpb.SavepointOperationStatus),
    ],
)
def test_every_member_round_trips_and_every_proto_number_has_a_member(
    mapping: wire.EnumMapping[Any, Any], enum_type: type[enum.Enum], proto_enum: Any
) -> None:
    numbers = [mapping.to_pb(member) for member in enum_type]
    assert [mapping.from_pb(n) for n in numbers] == list(enum_type)
    assert len(set(numbers)) == len(numbers)
    # Every named proto number but UNSPECIFIED is some member's.
    assert set(proto_enum.values()) - {0} <= set(numbers)


def test_mappings_lists_every_mapping() -> None:
    assert {m.enum_type for m in wire.MAPPINGS} == {
        CheckpointKind,
        CheckpointMode,
        CheckpointStatus,
        DeclineReason,
        JobState,
        PartitionerKind,
        SavepointOperationStatus,
        TaskState,
    }


def test_the_proto_names_match_the_member_names() -> None:
    assert [pb.CheckpointKind.Name(wire.CHECKPOINT_KIND.to_pb(k)) for k in CheckpointKind] == [
        f"CHECKPOINT_KIND_{k.name}" for k in CheckpointKind
    ]
    assert [pb.CheckpointMode.Name(wire.CHECKPOINT_MODE.to_pb(m)) for m in CheckpointMode] == [
        f"CHECKPOINT_MODE_{m.name}" for m in CheckpointMode
    ]
    assert [cpb.DeclineReason.Name(wire.DECLINE_REASON.to_pb(r)) for r in DeclineReason] == [
        f"DECLINE_REASON_{r.name}" for r in DeclineReason
    ]
    assert [
        pb.CheckpointStatus.Name(wire.CHECKPOINT_STATUS.to_pb(s)) for s in CheckpointStatus
    ] == [f"CHECKPOINT_STATUS_{s.name}" for s in CheckpointStatus]
    assert [pb.JobState.Name(wire.JOB_STATE.to_pb(s)) for s in JobState] == [
        f"JOB_STATE_{s.name}" for s in JobState
    ]
    statuses = SavepointOperationStatus
    assert [
        cpb.SavepointOperationStatus.Name(wire.SAVEPOINT_OPERATION_STATUS.to_pb(s))
        for s in statuses
    ] == [f"SAVEPOINT_OPERATION_STATUS_{s.name}" for s in statuses]


def test_an_unspecified_mode_is_aligned_as_the_proto_says() -> None:
    assert wire.CHECKPOINT_MODE.from_pb(pb.CHECKPOINT_MODE_UNSPECIFIED) is CheckpointMode.ALIGNED
    # ALIGNED is written as ALIGNED, never as UNSPECIFIED.
    assert wire.CHECKPOINT_MODE.to_pb(CheckpointMode.ALIGNED) == pb.CHECKPOINT_MODE_ALIGNED


def test_an_unspecified_decline_reason_is_its_own_member() -> None:
    assert wire.DECLINE_REASON.from_pb(0) is DeclineReason.UNSPECIFIED


@pytest.mark.parametrize("mapping", wire.MAPPINGS, ids=lambda m: m.proto_name)
def test_an_unknown_number_is_an_invalid_argument_naming_the_field(
    mapping: wire.EnumMapping[Any, Any],
) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        mapping.from_pb(UNKNOWN, field="request.thing")
    assert isinstance(caught.value, wire.UnknownEnumValueError)
    assert caught.value.value == UNKNOWN
    assert str(caught.value) == f"request.thing {UNKNOWN} is not a known {mapping.proto_name}"


def test_an_unspecified_kind_is_refused_unless_a_default_is_asked_for() -> None:
    with pytest.raises(
        wire.UnknownEnumValueError, match=r"^value 0 is not a known CheckpointKind$"
    ):
        wire.CHECKPOINT_KIND.from_pb(0)
    assert wire.CHECKPOINT_KIND.from_pb_or(0, None) is None
    assert wire.CHECKPOINT_KIND.from_pb_or(UNKNOWN, CheckpointKind.CHECKPOINT) is (
        CheckpointKind.CHECKPOINT
    )
    # A known number never takes the default.
    assert (
        wire.CHECKPOINT_KIND.from_pb_or(pb.CHECKPOINT_KIND_SAVEPOINT, None)
        is CheckpointKind.SAVEPOINT
    )


def test_a_mapping_that_misses_a_member_or_a_number_is_refused_at_construction() -> None:
    with pytest.raises(TypeError, match="CheckpointMode"):
        wire.EnumMapping(
            CheckpointMode,
            pb.CheckpointMode,
            {
                CheckpointMode.ALIGNED: pb.CHECKPOINT_MODE_ALIGNED,
                CheckpointMode.UNALIGNED: pb.CHECKPOINT_MODE_UNALIGNED,
            },
        )
    with pytest.raises(TypeError, match="CheckpointMode"):
        wire.EnumMapping(
            CheckpointMode,
            pb.CheckpointMode,
            {
                CheckpointMode.ALIGNED: pb.CHECKPOINT_MODE_ALIGNED,
                CheckpointMode.UNALIGNED: pb.CHECKPOINT_MODE_ALIGNED,
                CheckpointMode.AT_LEAST_ONCE: pb.CHECKPOINT_MODE_AT_LEAST_ONCE,
            },
        )


def _all_barrier_options() -> list[BarrierOptions]:
    return [
        BarrierOptions(kind, mode, timeout, location, inline)
        for kind in CheckpointKind
        for mode in CheckpointMode
        for timeout in (0, 250)
        for location, inline in (("", 0), ("/tmp/chk-7", 20 * 1024))
    ]


@pytest.mark.parametrize("options", _all_barrier_options(), ids=str)
def test_barrier_options_round_trip(options: BarrierOptions) -> None:
    msg = wire.barrier_options_to_pb(options)
    assert msg == pb.CheckpointOptions(
        kind=wire.CHECKPOINT_KIND.to_pb(options.kind),
        mode=wire.CHECKPOINT_MODE.to_pb(options.mode),
        aligned_checkpoint_timeout_ms=options.aligned_checkpoint_timeout_ms,
        target_location=options.target_location,
        inline_state_threshold_bytes=options.inline_state_threshold_bytes,
    )
    decoded = wire.barrier_options_from_pb(pb.CheckpointOptions.FromString(msg.SerializeToString()))
    assert decoded == options


def test_barrier_options_fill_a_given_message_in_place() -> None:
    out = pb.CheckpointOptions()
    returned = wire.barrier_options_to_pb(
        BarrierOptions(CheckpointKind.SAVEPOINT, CheckpointMode.UNALIGNED, 5, "/x"), out
    )
    assert returned is out
    assert out == pb.CheckpointOptions(
        kind=pb.CHECKPOINT_KIND_SAVEPOINT,
        mode=pb.CHECKPOINT_MODE_UNALIGNED,
        aligned_checkpoint_timeout_ms=5,
        target_location="/x",
    )


def test_barrier_options_with_unknown_or_unspecified_numbers_are_read_as_the_defaults() -> None:
    empty = wire.barrier_options_from_pb(pb.CheckpointOptions())
    assert empty == BarrierOptions()
    odd = pb.CheckpointOptions(aligned_checkpoint_timeout_ms=9, target_location="/t")
    odd.kind = UNKNOWN  # type: ignore[assignment]  # a number a newer peer might send
    odd.mode = UNKNOWN  # type: ignore[assignment]
    assert wire.barrier_options_from_pb(odd) == BarrierOptions(
        CheckpointKind.CHECKPOINT, CheckpointMode.ALIGNED, 9, "/t"
    )


@pytest.mark.parametrize(
    "handle",
    [
        StateHandle("/chk/chk-3/op-keyed-kg0-63.state", 1024, "keyed", 0, 63),
        StateHandle("s3://b/chk-3/sub.merged", 40, "channel_output", 2, 2, 512),
        StateHandle("/chk/op.state", 7, "operator", 0, -1),
        StateHandle("/chk/shared/x.sst", 4096, "a-kind-of-a-newer-worker"),
        StateHandle("/chk/chk-3/op/keyed.state", 3, "keyed", 0, 127, 0, b"\x00\xffS"),
    ],
)
def test_state_handles_round_trip(handle: StateHandle) -> None:
    msg = wire.state_handle_to_pb(handle)
    assert wire.state_handle_from_pb(pb.StateHandle.FromString(msg.SerializeToString())) == handle


def test_a_state_handle_without_a_kind_is_keyed() -> None:
    assert wire.state_handle_from_pb(pb.StateHandle(path="/p", size_bytes=3)) == StateHandle(
        "/p", 3, "keyed", 0, 0, 0
    )


@pytest.mark.parametrize(
    "metrics",
    [
        TaskMetrics(),
        TaskMetrics(250.5, 700.0, watermark_ms=1_700_000_000_000, period_ms=2000),
        TaskMetrics(0.0, 0.0, watermark_ms=0, period_ms=1),  # a watermark of 0 is one
        TaskMetrics(1000.0, 0.0, watermark_ms=-(1 << 62), period_ms=5),
    ],
)
def test_task_metrics_round_trip(metrics: TaskMetrics) -> None:
    assert wire.task_metrics_from_pb(wire.task_metrics_to_pb(metrics)) == metrics


def test_task_metrics_refuse_what_no_measure_gives_and_cap_rounding() -> None:
    for field, message in [
        ("busy_ms_per_second", cpb.TaskMetrics(busy_ms_per_second=-1.0)),
        ("busy_ms_per_second", cpb.TaskMetrics(busy_ms_per_second=float("nan"))),
        ("backpressured_ms_per_second", cpb.TaskMetrics(backpressured_ms_per_second=float("inf"))),
        ("period_ms", cpb.TaskMetrics(period_ms=-1)),
    ]:
        with pytest.raises(InvalidArgumentError, match=f"^{field} must be"):
            wire.task_metrics_from_pb(message)
    capped = wire.task_metrics_from_pb(cpb.TaskMetrics(busy_ms_per_second=1000.4))
    assert capped.busy_ms_per_second == 1000.0
    assert capped.watermark_ms is None

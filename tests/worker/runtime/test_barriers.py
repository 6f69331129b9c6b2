"""Exact event -> action sequences for the input gate's barrier handlers.

Every step is followed by ``check_invariants``. The randomized test at the end drives a small
simulated task (channels with queued data and barriers, a clock) and checks, besides the
invariants, that every checkpoint completed on the input is a consistent cut: the operator state
at the snapshot plus the persisted channel state hold exactly the data each channel sent before
its barrier.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace

import pytest

from snapflow.checkpointing import BarrierOptions, CheckpointKind, CheckpointMode
from snapflow.worker.runtime.barriers import (
    AbortCheckpoint,
    Action,
    AtLeastOnceBarrierTracker,
    Barrier,
    BarrierAbortReason,
    BarrierHandler,
    BlockChannel,
    CheckpointCompleteOnInput,
    PersistOvertakenData,
    SingleCheckpointBarrierHandler,
    StartPersistingChannel,
    StopPersistingChannel,
    SwitchToUnaligned,
    TriggerSnapshot,
    UnblockChannels,
    create_barrier_handler,
)

ALIGNED = BarrierOptions()
UNALIGNED = BarrierOptions(mode=CheckpointMode.UNALIGNED)
TIMEOUT = BarrierOptions(aligned_checkpoint_timeout_ms=100)
SAVEPOINT = BarrierOptions(kind=CheckpointKind.SAVEPOINT)
AT_LEAST_ONCE = BarrierOptions(mode=CheckpointMode.AT_LEAST_ONCE)

SUBSUMED = BarrierAbortReason.SUBSUMED
CANCELED = BarrierAbortReason.CANCELED_BY_MARKER


class Gate:
    """Calls a handler and checks its invariants after every step."""

    def __init__(self, handler: BarrierHandler) -> None:
        self.h = handler
        handler.check_invariants()

    def step(self, actions: list[Action]) -> list[Action]:
        self.h.check_invariants()
        return actions

    def barrier(
        self, channel: int, cid: int, now: int, options: BarrierOptions = ALIGNED, ts: int = 1000
    ) -> list[Action]:
        return self.step(self.h.on_barrier(channel, Barrier(cid, ts, options), now))

    def cancel(self, channel: int, cid: int, now: int) -> list[Action]:
        return self.step(self.h.on_cancel_marker(channel, cid, now))

    def eop(self, channel: int, now: int) -> list[Action]:
        return self.step(self.h.on_end_of_partition(channel, now))

    def timer(self, now: int) -> list[Action]:
        return self.step(self.h.on_timer(now))

    def persisting(self) -> dict[int, int]:
        return {
            c: cid
            for c in range(self.h.num_channels)
            if (cid := self.h.must_persist(c)) is not None
        }


def single(num_channels: int) -> Gate:
    return Gate(SingleCheckpointBarrierHandler(num_channels))


def tracker(num_channels: int, max_pending: int = 50) -> Gate:
    return Gate(AtLeastOnceBarrierTracker(num_channels, max_pending))


def trigger(
    cid: int,
    options: BarrierOptions = ALIGNED,
    *,
    unaligned: bool = False,
    alignment: int = 0,
    delay: int = 0,
    ts: int = 1000,
) -> TriggerSnapshot:
    return TriggerSnapshot(cid, ts, options, unaligned, alignment, delay)


def pending_id(g: Gate) -> int | None:
    assert isinstance(g.h, SingleCheckpointBarrierHandler)
    return g.h.pending_checkpoint_id()


# --- 1. aligned ----------------------------------------------------------------------------


def test_aligned_blocks_each_channel_then_triggers_and_unblocks() -> None:
    g = single(3)
    assert g.barrier(1, 1, now=1010) == [BlockChannel(1)]
    assert g.h.blocked_channels() == {1}
    assert g.barrier(0, 1, now=1015) == [BlockChannel(0)]
    assert g.h.blocked_channels() == {0, 1}
    assert g.h.next_deadline_ms() is None
    assert g.barrier(2, 1, now=1030) == [
        trigger(1, alignment=20, delay=10),
        UnblockChannels((0, 1)),
        CheckpointCompleteOnInput(1),
    ]
    assert g.h.blocked_channels() == frozenset()
    assert pending_id(g) is None
    assert g.persisting() == {}


def test_single_channel_gate_triggers_at_once_with_zero_alignment() -> None:
    g = single(1)
    assert g.barrier(0, 1, now=1005) == [
        trigger(1, alignment=0, delay=5),
        CheckpointCompleteOnInput(1),
    ]
    assert g.barrier(0, 2, now=1100, ts=1090) == [
        trigger(2, alignment=0, delay=10, ts=1090),
        CheckpointCompleteOnInput(2),
    ]


def test_start_delay_is_never_negative() -> None:
    g = single(1)
    # The task's clock lags the coordinator's.
    assert g.barrier(0, 1, now=990) == [trigger(1), CheckpointCompleteOnInput(1)]


def test_duplicate_barrier_on_the_same_channel_is_ignored() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1001) == [BlockChannel(0)]
    assert g.barrier(0, 1, now=1002) == []
    assert g.h.blocked_channels() == {0}
    assert g.barrier(1, 1, now=1003) == [
        trigger(1, alignment=2, delay=1),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]
    # ... and after completion a late duplicate is ignored too.
    assert g.barrier(1, 1, now=1004) == []
    assert g.h.blocked_channels() == frozenset()


def test_a_barrier_marked_unaligned_is_handled_unaligned_whatever_its_kind() -> None:
    # The coordinator never sends this, but the channel layer has already delivered the barrier
    # as a priority frame: only an unaligned snapshot can hold the data it overtook.
    g = single(2)
    odd = BarrierOptions(kind=CheckpointKind.SAVEPOINT, mode=CheckpointMode.UNALIGNED)
    assert g.barrier(0, 1, now=1000, options=odd) == [
        trigger(1, odd, unaligned=True),
        PersistOvertakenData(0, 1),
        StartPersistingChannel(1, 1),
    ]


# --- 2. newer and older barriers -----------------------------------------------------------


def test_newer_barrier_during_alignment_subsumes_and_starts_aligning_the_new_one() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1001) == [BlockChannel(0)]
    assert g.barrier(1, 1, now=1002) == [BlockChannel(1)]
    assert g.barrier(2, 2, now=2005, ts=2000) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0, 1)),
        BlockChannel(2),
    ]
    assert pending_id(g) == 2
    assert g.h.blocked_channels() == {2}
    # Channel 2 skipped barrier 1; barrier 1 arriving late elsewhere is ignored, not blocked.
    assert g.barrier(0, 1, now=2006) == []
    assert g.h.blocked_channels() == {2}
    assert g.barrier(0, 2, now=2007, ts=2000) == [BlockChannel(0)]
    assert g.barrier(1, 2, now=2010, ts=2000) == [
        trigger(2, alignment=5, delay=5, ts=2000),
        UnblockChannels((0, 2)),
        CheckpointCompleteOnInput(2),
    ]


def test_newer_barrier_on_a_blocked_channel_subsumes() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.barrier(0, 2, now=1001) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0,)),
        BlockChannel(0),
    ]


def test_newer_barrier_completing_at_once_on_a_single_open_channel() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.eop(0, now=1001) == []
    assert g.barrier(1, 2, now=1002) == [
        AbortCheckpoint(1, SUBSUMED),
        trigger(2, delay=2),
        CheckpointCompleteOnInput(2),
    ]


def test_older_barrier_during_alignment_is_ignored_and_its_channel_not_blocked() -> None:
    g = single(3)
    assert g.barrier(0, 5, now=1000) == [BlockChannel(0)]
    assert g.barrier(1, 4, now=1001) == []
    assert g.barrier(1, 3, now=1002, options=UNALIGNED) == []
    assert g.h.blocked_channels() == {0}
    assert pending_id(g) == 5
    assert g.persisting() == {}


def test_checkpoint_ids_strictly_increase_after_completion() -> None:
    g = single(2)
    g.barrier(0, 3, now=1000)
    assert g.barrier(1, 3, now=1000)[-1] == CheckpointCompleteOnInput(3)
    for stale in (3, 2, 1):
        for channel in (0, 1):
            assert g.barrier(channel, stale, now=1001) == []
    assert g.h.blocked_channels() == frozenset()
    assert g.barrier(1, 4, now=1002) == [BlockChannel(1)]


def test_barrier_of_an_aborted_checkpoint_is_ignored() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.cancel(1, 1, now=1001) == [AbortCheckpoint(1, CANCELED), UnblockChannels((0,))]
    assert g.barrier(1, 1, now=1002) == []
    assert g.barrier(2, 1, now=1003) == []
    assert g.barrier(0, 1, now=1004) == []
    assert g.h.blocked_channels() == frozenset()
    assert pending_id(g) is None


# --- 3. cancel markers ---------------------------------------------------------------------


def test_cancel_marker_for_the_current_checkpoint_aborts_and_unblocks() -> None:
    g = single(3)
    g.barrier(0, 1, now=1000)
    g.barrier(2, 1, now=1001)
    assert g.cancel(1, 1, now=1002) == [AbortCheckpoint(1, CANCELED), UnblockChannels((0, 2))]
    assert g.h.blocked_channels() == frozenset()
    # Markers for the same checkpoint from the other upstreams are stale now.
    assert g.cancel(0, 1, now=1003) == []
    assert g.cancel(2, 1, now=1003) == []


def test_cancel_marker_for_a_newer_checkpoint_during_alignment() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.cancel(1, 2, now=1001) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0,)),
        AbortCheckpoint(2, CANCELED),
    ]
    assert g.barrier(0, 2, now=1002) == []
    assert g.h.blocked_channels() == frozenset()
    assert g.barrier(0, 3, now=1003) == [BlockChannel(0)]


def test_cancel_marker_for_a_newer_checkpoint_without_alignment_marks_it_aborted() -> None:
    g = single(2)
    assert g.cancel(0, 4, now=1000) == [AbortCheckpoint(4, CANCELED)]
    assert g.barrier(1, 4, now=1001) == []
    assert g.barrier(0, 4, now=1002) == []
    assert g.cancel(1, 4, now=1003) == []
    assert g.h.blocked_channels() == frozenset()
    assert pending_id(g) is None
    assert g.barrier(1, 5, now=1004) == [BlockChannel(1)]


def test_stale_cancel_markers_are_ignored() -> None:
    g = single(2)
    g.barrier(0, 2, now=1000)
    g.barrier(1, 2, now=1000)  # 2 completes
    assert g.cancel(0, 2, now=1001) == []
    assert g.cancel(0, 1, now=1001) == []
    assert g.barrier(0, 5, now=1002) == [BlockChannel(0)]
    assert g.cancel(1, 4, now=1003) == []
    assert g.cancel(1, 2, now=1003) == []
    assert g.h.blocked_channels() == {0}
    assert pending_id(g) == 5


def test_cancel_marker_on_a_closed_channel_is_ignored() -> None:
    g = single(3)
    g.eop(2, now=999)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.cancel(2, 1, now=1001) == []
    assert g.cancel(2, 7, now=1001) == []
    assert pending_id(g) == 1


# --- 4. end of partition -------------------------------------------------------------------


def test_end_of_the_last_missing_channel_triggers_now() -> None:
    g = single(3)
    g.barrier(0, 1, now=1010)
    g.barrier(1, 1, now=1020)
    assert g.eop(2, now=1050) == [
        trigger(1, alignment=40, delay=10),
        UnblockChannels((0, 1)),
        CheckpointCompleteOnInput(1),
    ]
    assert g.h.open_channels() == {0, 1}
    assert g.eop(2, now=1051) == []  # already closed


def test_alignment_waits_only_for_open_channels() -> None:
    g = single(3)
    assert g.eop(1, now=999) == []
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.barrier(2, 1, now=1003) == [
        trigger(1, alignment=3),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]
    assert g.eop(2, now=1004) == []
    # One open channel left: the next barrier triggers at once.
    assert g.barrier(0, 2, now=1005) == [trigger(2, delay=5), CheckpointCompleteOnInput(2)]


def test_end_of_an_unrelated_channel_during_alignment() -> None:
    g = single(4)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.eop(3, now=1001) == []
    assert g.barrier(1, 1, now=1002) == [BlockChannel(1)]
    assert g.barrier(2, 1, now=1004) == [
        trigger(1, alignment=4),
        UnblockChannels((0, 1)),
        CheckpointCompleteOnInput(1),
    ]


def test_blocked_channel_that_ends_is_simply_closed() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.eop(0, now=1001) == []
    assert g.h.blocked_channels() == frozenset()
    assert g.h.open_channels() == {1, 2}
    assert pending_id(g) == 1
    assert g.barrier(1, 1, now=1002) == [BlockChannel(1)]
    assert g.barrier(2, 1, now=1003) == [
        trigger(1, alignment=3),
        UnblockChannels((1,)),
        CheckpointCompleteOnInput(1),
    ]


def test_when_all_channels_end_nothing_else_triggers() -> None:
    g = single(2)
    assert g.eop(0, now=1000) == []
    assert g.eop(1, now=1001) == []
    assert g.h.open_channels() == frozenset()
    assert g.barrier(0, 1, now=1002) == []  # a barrier on a closed channel is ignored
    assert g.barrier(1, 1, now=1002, options=UNALIGNED) == []
    assert g.cancel(0, 2, now=1003) == []
    assert g.eop(0, now=1004) == []
    assert g.timer(10**9) == []
    assert g.h.next_deadline_ms() is None
    assert pending_id(g) is None


def test_checkpoint_waiting_only_for_ended_channels_triggers_at_the_last_end() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.eop(0, now=1001) == []
    assert g.eop(1, now=1002) == [trigger(1, alignment=2), CheckpointCompleteOnInput(1)]
    assert g.barrier(1, 2, now=1003) == []


def test_channel_numbers_are_validated() -> None:
    g = single(2)
    with pytest.raises(ValueError, match="channel 2"):
        g.h.on_barrier(2, Barrier(1, 0), 0)
    with pytest.raises(ValueError):
        g.h.on_end_of_partition(-1, 0)
    with pytest.raises(ValueError):
        g.h.on_cancel_marker(5, 1, 0)
    with pytest.raises(ValueError):
        g.h.must_persist(2)
    with pytest.raises(ValueError):
        SingleCheckpointBarrierHandler(0)
    with pytest.raises(ValueError):
        AtLeastOnceBarrierTracker(1, max_pending=0)


# --- 5. unaligned --------------------------------------------------------------------------


def test_unaligned_triggers_at_the_first_barrier_and_persists_the_other_channels() -> None:
    g = single(3)
    assert g.barrier(1, 1, now=1010, options=UNALIGNED) == [
        trigger(1, UNALIGNED, unaligned=True, delay=10),
        PersistOvertakenData(1, 1),
        StartPersistingChannel(0, 1),
        StartPersistingChannel(2, 1),
    ]
    assert g.h.blocked_channels() == frozenset()
    assert g.persisting() == {0: 1, 2: 1}
    assert g.barrier(2, 1, now=1020, options=UNALIGNED) == [
        PersistOvertakenData(2, 1),
        StopPersistingChannel(2, 1),
    ]
    assert g.persisting() == {0: 1}
    assert g.h.blocked_channels() == frozenset()
    assert g.barrier(0, 1, now=1030, options=UNALIGNED) == [
        PersistOvertakenData(0, 1),
        StopPersistingChannel(0, 1),
        CheckpointCompleteOnInput(1),
    ]
    assert g.persisting() == {}
    assert pending_id(g) is None
    assert g.barrier(0, 1, now=1031, options=UNALIGNED) == []


def test_unaligned_single_channel() -> None:
    g = single(1)
    assert g.barrier(0, 1, now=1000, options=UNALIGNED) == [
        trigger(1, UNALIGNED, unaligned=True),
        PersistOvertakenData(0, 1),
        CheckpointCompleteOnInput(1),
    ]


def test_unaligned_duplicate_barrier_is_ignored() -> None:
    g = single(2)
    g.barrier(0, 1, now=1000, options=UNALIGNED)
    assert g.barrier(0, 1, now=1001, options=UNALIGNED) == []
    assert g.persisting() == {1: 1}


def test_newer_barrier_while_persisting_aborts_and_restarts_persisting() -> None:
    g = single(3)
    g.barrier(0, 1, now=1000, options=UNALIGNED)
    assert g.barrier(1, 1, now=1001, options=UNALIGNED) == [
        PersistOvertakenData(1, 1),
        StopPersistingChannel(1, 1),
    ]
    assert g.persisting() == {2: 1}
    assert g.barrier(1, 2, now=1010, options=UNALIGNED, ts=1008) == [
        AbortCheckpoint(1, SUBSUMED),
        trigger(2, UNALIGNED, unaligned=True, delay=2, ts=1008),
        PersistOvertakenData(1, 2),
        StartPersistingChannel(0, 2),
        StartPersistingChannel(2, 2),
    ]
    assert g.persisting() == {0: 2, 2: 2}
    # Channel 2's late barrier 1 is stale: its data stays channel state of 2.
    assert g.barrier(2, 1, now=1011, options=UNALIGNED) == []
    assert g.persisting() == {0: 2, 2: 2}
    assert g.barrier(2, 2, now=1012, options=UNALIGNED) == [
        PersistOvertakenData(2, 2),
        StopPersistingChannel(2, 2),
    ]
    assert g.barrier(0, 2, now=1013, options=UNALIGNED) == [
        PersistOvertakenData(0, 2),
        StopPersistingChannel(0, 2),
        CheckpointCompleteOnInput(2),
    ]


def test_aligned_savepoint_subsumes_an_unaligned_checkpoint() -> None:
    g = single(2)
    g.barrier(0, 1, now=1000, options=UNALIGNED)
    assert g.barrier(1, 2, now=1001, options=SAVEPOINT) == [
        AbortCheckpoint(1, SUBSUMED),
        BlockChannel(1),
    ]
    assert g.persisting() == {}
    assert g.barrier(0, 2, now=1002, options=SAVEPOINT) == [
        trigger(2, SAVEPOINT, alignment=1, delay=1),
        UnblockChannels((1,)),
        CheckpointCompleteOnInput(2),
    ]


def test_cancel_marker_while_persisting() -> None:
    g = single(3)
    g.barrier(0, 1, now=1000, options=UNALIGNED)
    assert g.cancel(1, 1, now=1001) == [AbortCheckpoint(1, CANCELED)]
    assert g.persisting() == {}
    assert g.h.blocked_channels() == frozenset()
    assert g.barrier(2, 1, now=1002, options=UNALIGNED) == []
    assert g.persisting() == {}


def test_end_of_a_persisted_channel_stops_persisting_and_may_complete() -> None:
    g = single(4)
    g.barrier(0, 1, now=1000, options=UNALIGNED)
    assert g.persisting() == {1: 1, 2: 1, 3: 1}
    assert g.eop(0, now=1001) == []  # already delivered its barrier
    assert g.eop(1, now=1002) == [StopPersistingChannel(1, 1)]
    assert g.barrier(3, 1, now=1003, options=UNALIGNED) == [
        PersistOvertakenData(3, 1),
        StopPersistingChannel(3, 1),
    ]
    assert g.eop(2, now=1004) == [StopPersistingChannel(2, 1), CheckpointCompleteOnInput(1)]
    assert g.persisting() == {}
    assert g.h.open_channels() == {3}


# --- 6. aligned with timeout ---------------------------------------------------------------

SWITCHED = replace(TIMEOUT, mode=CheckpointMode.UNALIGNED)


def test_alignment_timer_switches_to_unaligned() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.h.next_deadline_ms() == 1100  # barrier timestamp + timeout
    assert g.timer(1099) == []
    assert g.barrier(1, 1, now=1050, options=TIMEOUT) == [BlockChannel(1)]
    assert g.timer(1100) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=90, delay=10),
        StartPersistingChannel(2, 1),
        UnblockChannels((0, 1)),
    ]
    assert g.h.next_deadline_ms() is None
    assert g.h.blocked_channels() == frozenset()
    # The blocked channels' queued data came after their barrier: not channel state.
    assert g.persisting() == {2: 1}
    assert g.timer(2000) == []
    assert g.barrier(2, 1, now=1200, options=TIMEOUT) == [
        StopPersistingChannel(2, 1),
        CheckpointCompleteOnInput(1),
    ]
    assert g.h.next_deadline_ms() is None


def test_alignment_timeout_detected_when_a_barrier_arrives() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.barrier(1, 1, now=1150, options=TIMEOUT) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=140, delay=10),
        StartPersistingChannel(2, 1),
        UnblockChannels((0,)),
    ]
    assert g.persisting() == {2: 1}


def test_first_barrier_already_timed_out_goes_unaligned_at_once() -> None:
    g = single(3)
    assert g.barrier(1, 1, now=1200, options=TIMEOUT) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=0, delay=200),
        StartPersistingChannel(0, 1),
        StartPersistingChannel(2, 1),
    ]
    assert g.h.blocked_channels() == frozenset()


def test_completing_barrier_after_the_deadline_still_triggers_aligned() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.barrier(1, 1, now=1500, options=TIMEOUT) == [
        trigger(1, TIMEOUT, alignment=490, delay=10),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]
    g1 = single(1)
    assert g1.barrier(0, 1, now=5000, options=TIMEOUT) == [
        trigger(1, TIMEOUT, delay=4000),
        CheckpointCompleteOnInput(1),
    ]


@pytest.mark.parametrize(
    "options",
    [
        BarrierOptions(kind=CheckpointKind.SAVEPOINT, aligned_checkpoint_timeout_ms=100),
        BarrierOptions(kind=CheckpointKind.SAVEPOINT_SUSPEND, aligned_checkpoint_timeout_ms=100),
        BarrierOptions(aligned_checkpoint_timeout_ms=0),
    ],
)
def test_savepoints_and_zero_timeout_never_switch(options: BarrierOptions) -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1010, options=options) == [BlockChannel(0)]
    assert g.h.next_deadline_ms() is None
    assert g.timer(10**9) == []
    assert g.barrier(1, 1, now=10**9, options=options) == [
        trigger(1, options, alignment=10**9 - 1010, delay=10),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]


def test_cancel_marker_after_timing_out_to_unaligned() -> None:
    g = single(3)
    g.barrier(0, 1, now=1010, options=TIMEOUT)
    assert [type(a) for a in g.timer(1100)] == [
        SwitchToUnaligned,
        TriggerSnapshot,
        StartPersistingChannel,
        StartPersistingChannel,
        UnblockChannels,
    ]
    assert g.persisting() == {1: 1, 2: 1}
    assert g.cancel(2, 1, now=1101) == [AbortCheckpoint(1, CANCELED)]
    assert g.persisting() == {}
    assert g.h.blocked_channels() == frozenset()
    assert g.barrier(1, 1, now=1102, options=TIMEOUT) == []
    assert g.timer(5000) == []


def test_newer_barrier_while_aligning_with_timeout_moves_the_deadline() -> None:
    g = single(2)
    g.barrier(0, 1, now=1010, options=TIMEOUT)
    assert g.h.next_deadline_ms() == 1100
    assert g.barrier(1, 2, now=2005, options=TIMEOUT, ts=2000) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0,)),
        BlockChannel(1),
    ]
    assert g.h.next_deadline_ms() == 2100
    assert g.timer(2099) == []
    assert g.timer(2100)[:2] == [
        SwitchToUnaligned(2),
        trigger(2, SWITCHED, unaligned=True, alignment=95, delay=5, ts=2000),
    ]


def test_end_of_a_persisted_channel_after_the_switch() -> None:
    g = single(3)
    g.barrier(0, 1, now=1010, options=TIMEOUT)
    g.barrier(1, 1, now=1020, options=TIMEOUT)
    g.timer(1100)
    assert g.persisting() == {2: 1}
    assert g.eop(2, now=1101) == [StopPersistingChannel(2, 1), CheckpointCompleteOnInput(1)]
    assert pending_id(g) is None


def test_cancel_marker_while_aligning_with_timeout_clears_the_deadline() -> None:
    g = single(2)
    g.barrier(0, 1, now=1010, options=TIMEOUT)
    assert g.cancel(1, 1, now=1011) == [AbortCheckpoint(1, CANCELED), UnblockChannels((0,))]
    assert g.h.next_deadline_ms() is None
    assert g.timer(5000) == []


def test_unaligned_barrier_from_a_timed_out_upstream_switches_the_alignment() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.barrier(1, 1, now=1020, options=SWITCHED) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=10, delay=10),
        PersistOvertakenData(1, 1),
        StartPersistingChannel(2, 1),
        UnblockChannels((0,)),
    ]
    # A barrier from an upstream that did not time out came in order: nothing overtaken.
    assert g.barrier(2, 1, now=1030, options=TIMEOUT) == [
        StopPersistingChannel(2, 1),
        CheckpointCompleteOnInput(1),
    ]


def test_unaligned_barrier_completing_an_alignment_still_switches() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.barrier(1, 1, now=1020, options=SWITCHED) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=10, delay=10),
        PersistOvertakenData(1, 1),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]


def test_handlers_refuse_barriers_of_the_other_guarantee() -> None:
    g = single(2)
    with pytest.raises(ValueError, match="AtLeastOnceBarrierTracker"):
        g.h.on_barrier(0, Barrier(1, 0, AT_LEAST_ONCE), 0)
    t = tracker(2)
    with pytest.raises(ValueError, match="UNALIGNED"):
        t.h.on_barrier(0, Barrier(1, 0, UNALIGNED), 0)
    # An aligned barrier in an at-least-once job is fine: it came in order.
    assert t.barrier(0, 1, now=0, options=ALIGNED) == []


# --- 7. at least once ----------------------------------------------------------------------


def test_at_least_once_never_blocks_and_triggers_when_all_barriers_are_in() -> None:
    g = tracker(3)
    assert g.barrier(0, 1, now=1010, options=AT_LEAST_ONCE) == []
    assert g.barrier(2, 1, now=1015, options=AT_LEAST_ONCE) == []
    assert g.h.blocked_channels() == frozenset()
    assert g.persisting() == {}
    assert g.barrier(1, 1, now=1030, options=AT_LEAST_ONCE) == [
        trigger(1, AT_LEAST_ONCE, alignment=20, delay=10),
        CheckpointCompleteOnInput(1),
    ]
    assert g.barrier(1, 1, now=1031, options=AT_LEAST_ONCE) == []
    assert g.h.next_deadline_ms() is None
    assert g.timer(10**9) == []


def test_at_least_once_single_channel_triggers_at_once() -> None:
    g = tracker(1)
    assert g.barrier(0, 1, now=1000, options=AT_LEAST_ONCE) == [
        trigger(1, AT_LEAST_ONCE),
        CheckpointCompleteOnInput(1),
    ]


def test_at_least_once_tracks_several_checkpoints_and_drops_older_ones() -> None:
    g = tracker(3)
    g.barrier(0, 1, now=1000)
    g.barrier(0, 2, now=1001, ts=1001)
    g.barrier(1, 2, now=1002, ts=1001)
    g.barrier(1, 1, now=1003)
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == (1, 2)
    # 1 is dropped silently, as in Flink: the coordinator subsumes it when 2 completes.
    assert g.barrier(2, 2, now=1004, ts=1001) == [
        trigger(2, alignment=3, ts=1001),
        CheckpointCompleteOnInput(2),
    ]
    assert g.h.pending_checkpoint_ids() == ()
    assert g.barrier(2, 1, now=1005) == []  # dropped: ignored
    assert g.barrier(2, 2, now=1005) == []  # completed: ignored


def test_at_least_once_duplicate_barrier_is_not_counted_twice() -> None:
    g = tracker(2)
    assert g.barrier(0, 1, now=1000) == []
    assert g.barrier(0, 1, now=1001) == []
    assert g.barrier(1, 1, now=1002) == [trigger(1, alignment=2), CheckpointCompleteOnInput(1)]


def test_at_least_once_cancel_marker_aborts_older_tracked_ones_first() -> None:
    g = tracker(3)
    g.barrier(0, 1, now=1000)
    g.barrier(0, 2, now=1000)
    g.barrier(1, 1, now=1001)
    # Flink's processCancellationBarrier: every older tracked id is aborted at once, ascending.
    assert g.cancel(1, 2, now=1001) == [AbortCheckpoint(1, CANCELED), AbortCheckpoint(2, CANCELED)]
    assert g.cancel(1, 2, now=1002) == []  # already aborted: only counted
    assert g.barrier(0, 2, now=1002) == []
    assert g.barrier(2, 1, now=1004) == []  # 1 was aborted and forgotten
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == (2,)
    assert g.barrier(2, 2, now=1005) == []  # aborted: no trigger; seen everywhere: forgotten
    assert g.h.pending_checkpoint_ids() == ()


def test_at_least_once_cancel_marker_for_an_unknown_newer_id() -> None:
    g = tracker(3)
    assert g.cancel(0, 3, now=1000) == [AbortCheckpoint(3, CANCELED)]
    assert g.barrier(1, 3, now=1001) == []
    assert g.barrier(2, 3, now=1002) == []  # seen everywhere: forgotten
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == ()
    assert g.barrier(0, 3, now=1003) == []
    assert g.barrier(0, 2, now=1003) == []  # older than the latest id
    assert g.cancel(0, 3, now=1003) == []
    assert g.barrier(0, 4, now=1004) == []
    assert g.h.pending_checkpoint_ids() == (4,)


def test_at_least_once_cancel_marker_of_a_new_id_aborts_older_ones_at_once() -> None:
    g = tracker(2)
    assert g.barrier(0, 1, now=1000) == []
    # Channel 0 will deliver nothing more of 1: it cannot complete, so it aborts now, first.
    assert g.cancel(0, 2, now=1001) == [AbortCheckpoint(1, CANCELED), AbortCheckpoint(2, CANCELED)]
    assert g.cancel(1, 2, now=1002) == []
    assert g.barrier(1, 1, now=1003) == []


def test_at_least_once_marker_of_an_untracked_older_id_aborts_only_older_tracked_ones() -> None:
    g = tracker(2)
    g.barrier(0, 1, now=1000)
    g.barrier(0, 3, now=1000)
    # 2 was never seen and is older than 3: it is not aborted, but 1 is (as in Flink).
    assert g.cancel(1, 2, now=1001) == [AbortCheckpoint(1, CANCELED)]
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == (3,)


def test_at_least_once_bounds_the_tracked_checkpoints() -> None:
    too_many = BarrierAbortReason.TOO_MANY_PENDING
    g = tracker(2, max_pending=2)
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.barrier(0, 1, now=1000) == []
    assert g.barrier(0, 2, now=1000) == []
    assert g.barrier(0, 3, now=1000) == [AbortCheckpoint(1, too_many)]
    assert g.h.pending_checkpoint_ids() == (2, 3)
    assert g.barrier(1, 1, now=1001) == []  # evicted: ignored
    assert g.barrier(1, 4, now=1002) == [AbortCheckpoint(2, too_many)]
    assert g.barrier(1, 3, now=1003) == [trigger(3, alignment=3), CheckpointCompleteOnInput(3)]
    assert g.h.pending_checkpoint_ids() == (4,)
    assert g.cancel(0, 5, now=1004) == [AbortCheckpoint(4, CANCELED), AbortCheckpoint(5, CANCELED)]
    assert g.barrier(0, 6, now=1005) == []
    assert g.barrier(0, 7, now=1005) == []  # evicts 5, already aborted: silent
    assert g.h.pending_checkpoint_ids() == (6, 7)


def test_at_least_once_end_of_partition_completes_pending_checkpoints() -> None:
    g = tracker(3)
    g.barrier(0, 1, now=1000)
    g.barrier(0, 2, now=1001)
    g.barrier(1, 1, now=1002)
    assert g.eop(2, now=1005) == [trigger(1, alignment=5), CheckpointCompleteOnInput(1)]
    assert g.barrier(1, 2, now=1006) == [
        trigger(2, alignment=5, delay=1),
        CheckpointCompleteOnInput(2),
    ]


def test_at_least_once_end_of_partition_completing_several_triggers_only_the_newest() -> None:
    """Flink's checkAlignmentOnEndOfPartitionIfEnabled: the newest complete checkpoint is
    triggered, the older complete one is dropped silently (the coordinator subsumes it)."""
    g = tracker(2)
    g.barrier(0, 1, now=1000)
    g.barrier(0, 2, now=1001)
    assert g.eop(1, now=1004) == [trigger(2, alignment=3, delay=1), CheckpointCompleteOnInput(2)]
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == ()
    assert g.barrier(0, 1, now=1005) == []  # older than the newest seen: ignored


def test_at_least_once_end_of_partition_drops_older_incomplete_ones() -> None:
    g = tracker(3)
    g.barrier(0, 1, now=1000)
    g.barrier(1, 2, now=1001)
    g.barrier(0, 2, now=1002)
    assert g.eop(2, now=1003) == [
        trigger(2, alignment=2, delay=1),
        CheckpointCompleteOnInput(2),
    ]


def test_at_least_once_ignores_closed_channels_and_all_ended() -> None:
    g = tracker(2)
    assert g.eop(0, now=1000) == []
    assert g.barrier(0, 1, now=1001) == []
    assert g.cancel(0, 1, now=1001) == []
    assert g.eop(1, now=1002) == []
    assert g.barrier(1, 1, now=1003) == []
    assert g.h.open_channels() == frozenset()


# --- Flink's scenarios, ported (Flink 1.18 and 1.20 tests; the sequences are Flink's) ----


def _outcomes(actions: list[Action]) -> list[int]:
    """Flink's CheckpointSequenceValidator: +id triggered, -id aborted, in order."""
    out: list[int] = []
    for a in actions:
        if isinstance(a, TriggerSnapshot):
            out.append(a.checkpoint_id)
        elif isinstance(a, AbortCheckpoint):
            out.append(-a.checkpoint_id)
    return out


def _run(g: Gate, events: list[tuple[str, int, int]]) -> list[int]:
    """("b" | "c", checkpoint id, channel): barriers and cancel markers in order."""
    seen: list[int] = []
    for now, (kind, cid, channel) in enumerate(events, start=1000):
        if kind == "b":
            seen += _outcomes(g.barrier(channel, cid, now=now, options=AT_LEAST_ONCE))
        else:
            seen += _outcomes(g.cancel(channel, cid, now=now))
    return seen


def test_flink_tracker_single_channel_abort_checkpoint() -> None:
    """CheckpointBarrierTrackerTest.testSingleChannelAbortCheckpoint: (1, 2, -4, 5, -6)."""
    events = [("b", 1, 0), ("b", 2, 0), ("c", 4, 0), ("b", 5, 0), ("c", 6, 0)]
    assert _run(tracker(1), events) == [1, 2, -4, 5, -6]


def test_flink_tracker_multi_channel_abort_checkpoint() -> None:
    """CheckpointBarrierTrackerTest.testMultiChannelAbortCheckpoint: (1, -2, 3, -4, 5, -6)."""
    events = [
        *[("b", 1, 0), ("b", 1, 1), ("b", 1, 2)],
        *[("b", 2, 0), ("b", 2, 2), ("c", 2, 1)],  # aborted on the last barrier
        *[("b", 3, 1), ("b", 3, 2), ("b", 3, 0)],
        *[("c", 4, 1), ("b", 4, 2), ("b", 4, 0)],  # aborted on the first barrier
        *[("b", 5, 2), ("b", 5, 1), ("b", 5, 0)],
        *[("c", 6, 1), ("c", 6, 2), ("b", 6, 0)],  # several markers, then a barrier
    ]
    g = tracker(3)
    assert _run(g, events) == [1, -2, 3, -4, 5, -6]
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == ()


def test_flink_tracker_interleaved_cancellation_barriers() -> None:
    """CheckpointBarrierTrackerTest.testInterleavedCancellationBarriers: (-1, -2)."""
    events = [("b", 1, 0), ("c", 2, 0), ("c", 1, 1), ("c", 2, 1), ("c", 1, 2), ("c", 2, 2)]
    assert _run(tracker(3), events) == [-1, -2]


def test_flink_tracker_multi_channel_skipping_checkpoints() -> None:
    """Modelled on CheckpointBarrierTrackerTest.testMultiChannelSkippingCheckpoints (no buffers):
    (1, 3, 4); the incomplete 2 is dropped silently when 3 completes, its late barrier ignored."""
    events = [
        *[("b", 1, 1), ("b", 1, 2), ("b", 1, 0)],
        *[("b", 2, 0), ("b", 2, 1)],
        *[("b", 3, 2), ("b", 3, 0), ("b", 3, 1)],
        ("b", 2, 2),
        *[("b", 4, 1), ("b", 4, 2), ("b", 4, 0)],
    ]
    assert _run(tracker(3), events) == [1, 3, 4]


def _run_with_eop(
    g: Gate, events: list[tuple[str, int, int]], options: BarrierOptions
) -> list[int]:
    """Like ``_run``, with ("e", 0, channel) for an end of partition."""
    seen: list[int] = []
    for now, (kind, cid, channel) in enumerate(events, start=1000):
        if kind == "b":
            seen += _outcomes(g.barrier(channel, cid, now=now, options=options))
        elif kind == "c":
            seen += _outcomes(g.cancel(channel, cid, now=now))
        else:
            seen += _outcomes(g.eop(channel, now=now))
    return seen


def test_flink_tracker_trigger_checkpoints_with_end_of_partition() -> None:
    """CheckpointBarrierTrackerTest.testTriggerCheckpointsWithEndOfPartition: only 4 is
    triggered, 5 stays tracked."""
    events = [("b", 1, 0), ("b", 2, 0), ("b", 2, 1), ("b", 3, 0), ("b", 4, 0), ("b", 4, 1)]
    events += [("b", 5, 1), ("e", 0, 2)]
    g = tracker(3)
    assert _run_with_eop(g, events, AT_LEAST_ONCE) == [4]
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == (5,)
    assert g.h.open_channels() == frozenset({0, 1})


def test_flink_tracker_end_of_partition_scenarios() -> None:
    """CheckpointBarrierTrackerTest: testDeduplicateChannelsWithBothBarrierAndEndOfPartition
    (2), testTriggerCheckpointsAfterReceivedEndOfPartition (6, 7),
    testCompleteAndRemoveAbortedCheckpointWithEndOfPartition (-4, 5 still tracked),
    testAbortCheckpointsAfterEndOfPartitionReceived (-5, -6, -7),
    testNoFastPathWithChannelFinishedDuringCheckpoints(Cancel) (1; -1)."""
    g = tracker(3)
    assert _run_with_eop(g, [("b", 2, 0), ("b", 2, 1), ("e", 0, 1)], AT_LEAST_ONCE) == []
    assert _run_with_eop(g, [("b", 2, 2)], AT_LEAST_ONCE) == [2]
    events = [("e", 0, 2), ("b", 5, 0), ("b", 6, 0), ("b", 6, 1), ("e", 0, 1), ("b", 7, 0)]
    assert _run_with_eop(tracker(3), events, AT_LEAST_ONCE) == [6, 7]
    g = tracker(3)
    events = [("c", 4, 0), ("b", 4, 1), ("b", 5, 1), ("e", 0, 2)]
    assert _run_with_eop(g, events, AT_LEAST_ONCE) == [-4]
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == (5,)
    events = [("e", 0, 2), ("b", 5, 0), ("b", 6, 0), ("c", 6, 1), ("e", 0, 1), ("c", 7, 0)]
    assert _run_with_eop(tracker(3), events, AT_LEAST_ONCE) == [-5, -6, -7]
    g = tracker(2)
    assert _run_with_eop(g, [("b", 1, 0), ("e", 0, 0), ("b", 1, 1)], AT_LEAST_ONCE) == [1]
    g = tracker(2)
    assert _run_with_eop(g, [("b", 1, 0), ("e", 0, 0), ("c", 1, 1)], AT_LEAST_ONCE) == [-1]
    assert isinstance(g.h, AtLeastOnceBarrierTracker)
    assert g.h.pending_checkpoint_ids() == ()


def test_flink_aligned_and_unaligned_end_of_partition_scenarios() -> None:
    """AlignedCheckpointsTest and UnalignedCheckpointsTest: testTriggerCheckpointsWith
    EndOfPartition (1), testDeduplicateChannelsWithBothBarrierAndEndOfPartition (2),
    testTriggerCheckpointsAfterReceivedEndOfPartition (6, 7; unaligned: 3)."""
    for options in (ALIGNED, UNALIGNED):
        g = single(3)
        assert _run_with_eop(g, [("b", 1, 0), ("b", 1, 1), ("e", 0, 2)], options) == [1]
        assert pending_id(g) is None
        g = single(3)
        assert _run_with_eop(g, [("b", 2, 0), ("b", 2, 1), ("e", 0, 1)], options) == (
            [] if options is ALIGNED else [2]
        )
        # the last barrier aligns 2 (unaligned: it completes the input of 2, triggered already)
        assert _run_with_eop(g, [("b", 2, 2)], options) == ([2] if options is ALIGNED else [])
        assert pending_id(g) is None
    events = [("e", 0, 2), ("b", 6, 0), ("b", 6, 1), ("e", 0, 1), ("b", 7, 0)]
    assert _run_with_eop(single(3), events, ALIGNED) == [6, 7]
    g = single(3)
    events = [("e", 0, 0), ("b", 3, 1), ("e", 0, 1), ("b", 3, 2)]
    assert _run_with_eop(g, events, UNALIGNED) == [3]
    assert pending_id(g) is None


def test_checkpoint_id_zero_is_valid_and_negative_ids_are_refused() -> None:
    g = single(2)
    assert g.barrier(0, 0, now=1000) == [BlockChannel(0)]
    assert g.barrier(1, 0, now=1001) == [
        trigger(0, alignment=1),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(0),
    ]
    u = single(1)
    assert u.cancel(0, 0, now=1000) == [AbortCheckpoint(0, CANCELED)]
    assert u.barrier(0, 0, now=1000) == []  # aborted by the marker
    t = tracker(1)
    assert t.barrier(0, 0, now=1000, options=AT_LEAST_ONCE) == [
        trigger(0, AT_LEAST_ONCE),
        CheckpointCompleteOnInput(0),
    ]
    for handler in (SingleCheckpointBarrierHandler(2), AtLeastOnceBarrierTracker(2)):
        options = AT_LEAST_ONCE if isinstance(handler, AtLeastOnceBarrierTracker) else ALIGNED
        with pytest.raises(ValueError, match="checkpoint id -1 is negative"):
            handler.on_barrier(0, Barrier(-1, 0, options), 0)
        with pytest.raises(ValueError, match="checkpoint id -1 is negative"):
            handler.on_cancel_marker(0, -1, 0)
        handler.check_invariants()


def test_end_of_partition_after_the_aligned_timeout_switches_without_a_timer() -> None:
    """Flink's endOfPartitionReceived checks isTimedOut after allBarriersReceived."""
    g = single(3)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    # No timer ran; the deadline (1100) has passed when channel 2 ends.
    assert g.eop(2, now=1150) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=140, delay=10),
        StartPersistingChannel(1, 1),
        UnblockChannels((0,)),
    ]
    assert g.barrier(1, 1, now=1160, options=TIMEOUT) == [
        StopPersistingChannel(1, 1),
        CheckpointCompleteOnInput(1),
    ]


def test_end_of_partition_completing_the_alignment_after_the_timeout_stays_aligned() -> None:
    g = single(2)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.eop(1, now=1500) == [
        trigger(1, TIMEOUT, alignment=490, delay=10),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]


def test_end_of_partition_before_the_timeout_neither_switches_nor_completes() -> None:
    g = single(3)
    assert g.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert g.eop(2, now=1099) == []
    assert g.h.next_deadline_ms() == 1100
    assert g.timer(1100)[0] == SwitchToUnaligned(1)


def test_cancel_marker_for_a_newer_checkpoint_declines_the_pending_one_too() -> None:
    """AlignedCheckpointsTest.testMissingCancellationBarriers' sequence. Flink notifies only the
    marker's checkpoint (2, then 3); Snapflow also declines 1, SUBSUMED (a documented
    difference: the coordinator aborts 1 at once, uncounted, instead of letting it expire)."""
    g = single(2)
    assert g.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert g.cancel(0, 2, now=1001) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0,)),
        AbortCheckpoint(2, CANCELED),
    ]
    assert g.cancel(0, 3, now=1002) == [AbortCheckpoint(3, CANCELED)]
    assert g.cancel(1, 3, now=1003) == []
    assert g.h.blocked_channels() == frozenset()
    assert pending_id(g) is None


# --- factory and invariants ----------------------------------------------------------------


def test_factory_picks_the_handler_from_the_job_mode() -> None:
    aligned = create_barrier_handler(CheckpointMode.ALIGNED, 2)
    unaligned = create_barrier_handler(CheckpointMode.UNALIGNED, 3)
    alo = create_barrier_handler(CheckpointMode.AT_LEAST_ONCE, 4, max_pending=7)
    assert type(aligned) is SingleCheckpointBarrierHandler
    assert type(unaligned) is SingleCheckpointBarrierHandler
    assert isinstance(alo, AtLeastOnceBarrierTracker)
    assert alo.max_pending == 7
    assert [h.num_channels for h in (aligned, unaligned, alo)] == [2, 3, 4]
    assert unaligned.open_channels() == {0, 1, 2}


def test_check_invariants_detects_inconsistent_bookkeeping() -> None:
    h = SingleCheckpointBarrierHandler(3)
    h.on_barrier(0, Barrier(1, 0), 0)
    h.check_invariants()
    h._blocked.add(2)
    with pytest.raises(AssertionError, match="blocked channels inconsistent"):
        h.check_invariants()
    h = SingleCheckpointBarrierHandler(3)
    h.on_barrier(0, Barrier(1, 0, UNALIGNED), 0)
    h._persisting.discard(1)
    with pytest.raises(AssertionError, match="persisted channels inconsistent"):
        h.check_invariants()
    t = AtLeastOnceBarrierTracker(2)
    t.on_barrier(0, Barrier(1, 0), 0)
    t._pending[1].arrived.add(1)
    with pytest.raises(AssertionError, match="complete checkpoint is still tracked"):
        t.check_invariants()


# --- randomized: a simulated task ----------------------------------------------------------

Frame = tuple[str, object]
"""("data", seq) | ("barrier", (Barrier, data sent before it)) | ("cancel", id) | ("eop", None)"""


def _is_priority(frame: Frame) -> bool:
    kind, payload = frame
    if kind == "barrier":
        assert isinstance(payload, tuple)
        return bool(payload[0].options.is_unaligned)
    return kind == "cancel"


@dataclass
class SimulatedTask:
    """Upstreams write frames into channels; the task reads them as the handler allows.

    Like ``snapflow.worker.runtime.input_gate``, a channel hands over priority frames (unaligned
    barriers, cancel markers) ahead of the data still queued in it; a blocked channel hands over
    nothing.
    """

    rng: random.Random
    handler: BarrierHandler
    job_mode: str
    now: int = 0
    checkpoints: list[Barrier] = field(default_factory=list)
    queues: list[deque[Frame]] = field(default_factory=list)
    upstream_ended: list[bool] = field(default_factory=list)
    next_barrier: list[int] = field(default_factory=list)  # index into checkpoints
    next_seq: int = 0
    sent: list[list[int]] = field(default_factory=list)  # data sent per channel, in order
    read: list[list[int]] = field(default_factory=list)  # data read per channel, in order
    barrier_pos: list[dict[int, int]] = field(default_factory=list)  # id -> len(sent) at barrier
    overtaken: list[int] = field(default_factory=list)  # data the last priority frame overtook
    processed: set[tuple[int, int]] = field(default_factory=set)
    snapshots: dict[int, frozenset[tuple[int, int]]] = field(default_factory=dict)
    persisted: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    blocked: set[int] = field(default_factory=set)
    persisting: dict[int, int] = field(default_factory=dict)
    status: dict[int, str] = field(default_factory=dict)
    last_triggered: int = 0

    def __post_init__(self) -> None:
        n = self.handler.num_channels
        self.queues = [deque() for _ in range(n)]
        self.upstream_ended = [False] * n
        self.next_barrier = [0] * n
        self.sent = [[] for _ in range(n)]
        self.read = [[] for _ in range(n)]
        self.barrier_pos = [{} for _ in range(n)]

    @property
    def exactly_once(self) -> bool:
        return isinstance(self.handler, SingleCheckpointBarrierHandler)

    # --- the outside world -----------------------------------------------------------------

    def random_options(self) -> BarrierOptions:
        r = self.rng
        kind = r.choice([CheckpointKind.CHECKPOINT] * 4 + [CheckpointKind.SAVEPOINT])
        if self.job_mode == "at_least_once":
            return BarrierOptions(kind, CheckpointMode.AT_LEAST_ONCE)
        if self.job_mode == "aligned":
            timeout = r.choice([0, r.randint(5, 40), r.randint(40, 300)])
            return BarrierOptions(kind, CheckpointMode.ALIGNED, 0 if kind.is_savepoint else timeout)
        if self.job_mode == "unaligned" and not kind.is_savepoint:
            return BarrierOptions(kind, CheckpointMode.UNALIGNED)
        if self.job_mode == "unaligned":
            return BarrierOptions(kind, CheckpointMode.ALIGNED)
        mode = r.choice([CheckpointMode.ALIGNED, CheckpointMode.UNALIGNED])
        return BarrierOptions(kind, mode, r.choice([0, r.randint(1, 40), r.randint(40, 300)]))

    def new_checkpoint(self, options: BarrierOptions | None = None) -> Barrier:
        last = self.checkpoints[-1].checkpoint_id if self.checkpoints else 0
        cid = last + self.rng.choice([1, 1, 1, 2])
        barrier = Barrier(cid, self.now, options or self.random_options())
        self.checkpoints.append(barrier)
        return barrier

    def send_data(self, c: int) -> None:
        if not self.upstream_ended[c]:
            self.queues[c].append(("data", self.next_seq))
            self.sent[c].append(self.next_seq)
            self.next_seq += 1

    def send_barrier(self, c: int, barrier: Barrier) -> None:
        self.queues[c].append(("barrier", (barrier, len(self.sent[c]))))

    def upstream_emit_control(self, c: int) -> None:
        if self.upstream_ended[c] or self.next_barrier[c] >= len(self.checkpoints):
            return
        barrier = self.checkpoints[self.next_barrier[c]]
        self.next_barrier[c] += 1
        r = self.rng.random()
        if r < 0.1:
            self.queues[c].append(("cancel", barrier.checkpoint_id))
        elif r < 0.15:
            pass  # this upstream never got the checkpoint
        else:
            if barrier.options.is_timeoutable and self.rng.random() < 0.3:
                # An upstream that timed out forwards the barrier unaligned.
                barrier = replace(barrier, options=replace(barrier.options, mode=UNALIGNED.mode))
            self.send_barrier(c, barrier)
            if self.rng.random() < 0.05:
                self.send_barrier(c, barrier)

    # --- the task --------------------------------------------------------------------------

    def readable(self) -> list[int]:
        return [
            c
            for c in sorted(self.handler.open_channels())
            if c not in self.blocked and self.queues[c]
        ]

    def take(self, c: int) -> Frame:
        """The next frame the channel hands over: the first priority frame, else the head."""
        queue = self.queues[c]
        for i, frame in enumerate(queue):
            if _is_priority(frame):
                del queue[i]
                self.overtaken = [
                    x for k, x in list(queue)[:i] if k == "data" and isinstance(x, int)
                ]
                return frame
        self.overtaken = []
        return queue.popleft()

    def read_frame(self, c: int) -> None:
        kind, payload = self.take(c)
        if kind == "data":
            assert isinstance(payload, int)
            target = self.handler.must_persist(c)
            assert target == self.persisting.get(c)
            if target is not None:
                self.persisted[target].add((c, payload))
            self.processed.add((c, payload))
            self.read[c].append(payload)
        elif kind == "barrier":
            assert isinstance(payload, tuple)
            barrier, pos = payload
            self.barrier_pos[c].setdefault(barrier.checkpoint_id, pos)
            self.apply(self.handler.on_barrier(c, barrier, self.now), c, barrier)
        elif kind == "cancel":
            assert isinstance(payload, int)
            self.apply(self.handler.on_cancel_marker(c, payload, self.now), c, None)
        else:
            self.apply(self.handler.on_end_of_partition(c, self.now), c, None)

    def close_abruptly(self, c: int) -> None:
        """The channel is gone (its queued frames with it), blocked or not."""
        self.queues[c].clear()
        self.upstream_ended[c] = True
        self.blocked.discard(c)  # a closed channel is no longer blocked, without an action
        self.apply(self.handler.on_end_of_partition(c, self.now), c, None)

    # --- the oracle ------------------------------------------------------------------------

    def apply(self, actions: list[Action], channel: int | None, barrier: Barrier | None) -> None:
        h = self.handler
        open_now = h.open_channels()
        aligned_trigger = False
        for i, a in enumerate(actions):
            if isinstance(a, BlockChannel):
                assert self.exactly_once and barrier is not None and a.channel == channel
                assert a.channel in open_now and a.channel not in self.blocked
                self.blocked.add(a.channel)
            elif isinstance(a, UnblockChannels):
                assert a.channels and list(a.channels) == sorted(set(a.channels))
                assert set(a.channels) <= self.blocked
                self.blocked -= set(a.channels)
            elif isinstance(a, TriggerSnapshot):
                n = a.checkpoint_id
                assert n not in self.status and n > self.last_triggered
                self.status[n] = "triggered"
                self.last_triggered = n
                self.snapshots[n] = frozenset(self.processed)
                self.persisted[n] = set()
                if a.unaligned:
                    assert self.exactly_once and a.options.mode is CheckpointMode.UNALIGNED
                    assert any(n in pos for pos in self.barrier_pos)
                else:
                    # Barrier n was seen on every channel open at this moment.
                    assert all(n in self.barrier_pos[c] for c in open_now), (n, open_now)
                    aligned_trigger = True
            elif isinstance(a, StartPersistingChannel):
                assert self.status.get(a.checkpoint_id) == "triggered"
                assert a.channel in open_now and a.channel not in self.persisting
                assert a.checkpoint_id not in self.barrier_pos[a.channel]
                self.persisting[a.channel] = a.checkpoint_id
            elif isinstance(a, PersistOvertakenData):
                n = a.checkpoint_id
                assert barrier is not None and barrier.options.is_unaligned
                assert a.channel == channel and n == barrier.checkpoint_id
                assert self.status.get(n) == "triggered"
                overtaken = {(a.channel, s) for s in self.overtaken}
                assert not overtaken & self.processed
                self.persisted[n] |= overtaken
            elif isinstance(a, StopPersistingChannel):
                assert self.persisting.pop(a.channel) == a.checkpoint_id
                assert a.checkpoint_id in self.barrier_pos[a.channel] or a.channel not in open_now
            elif isinstance(a, SwitchToUnaligned):
                n = a.checkpoint_id
                assert n not in self.status
                follows = actions[i + 1]
                assert isinstance(follows, TriggerSnapshot) and follows.unaligned
                assert follows.checkpoint_id == n
                created = next(b for b in self.checkpoints if b.checkpoint_id == n)
                assert created.options.is_timeoutable
                deadline = created.timestamp_ms + created.options.aligned_checkpoint_timeout_ms
                assert self.now >= deadline or (
                    barrier is not None and barrier.options.is_unaligned
                )
            elif isinstance(a, AbortCheckpoint):
                assert self.status.get(a.checkpoint_id) in (None, "triggered")
                self.status[a.checkpoint_id] = "aborted"
                self.persisting = {c: n for c, n in self.persisting.items() if n != a.checkpoint_id}
            else:
                assert isinstance(a, CheckpointCompleteOnInput)
                self.complete(a.checkpoint_id, open_now)
        h.check_invariants()
        assert h.blocked_channels() == self.blocked
        if aligned_trigger:
            assert not self.blocked
        for c in range(h.num_channels):
            assert h.must_persist(c) == self.persisting.get(c)
        if not self.exactly_once:
            assert not self.blocked and not self.persisting

    def complete(self, n: int, open_now: frozenset[int]) -> None:
        assert self.status.get(n) == "triggered"
        self.status[n] = "completed"
        assert n not in self.persisting.values()
        expected: set[tuple[int, int]] = set()
        for c in range(self.handler.num_channels):
            if n in self.barrier_pos[c]:
                expected.update((c, s) for s in self.sent[c][: self.barrier_pos[c][n]])
            else:
                assert c not in open_now, f"checkpoint {n} completed without channel {c}"
                expected.update((c, s) for s in self.read[c])
        snapshot, persisted = self.snapshots[n], self.persisted[n]
        if self.exactly_once:
            # A consistent cut: exactly the data sent before each channel's barrier.
            assert not snapshot & persisted
            assert snapshot | persisted == expected
        else:
            assert snapshot >= expected and not persisted

    # --- driving ---------------------------------------------------------------------------

    def step(self) -> None:
        r = self.rng
        self.now += r.randint(0, 3)
        num = self.handler.num_channels
        choice = r.random()
        if choice < 0.25:
            self.send_data(r.randrange(num))
        elif choice < 0.33:
            self.new_checkpoint()
        elif choice < 0.5:
            self.upstream_emit_control(r.randrange(num))
        elif choice < 0.85:
            readable = self.readable()
            if readable:
                self.read_frame(r.choice(readable))
        elif choice < 0.865:
            c = r.randrange(num)
            if not self.upstream_ended[c]:
                self.upstream_ended[c] = True
                self.queues[c].append(("eop", None))
        elif choice < 0.87:
            c = r.randrange(num)
            if c in self.handler.open_channels():
                self.close_abruptly(c)
        else:
            self.now += r.randint(1, 30)
            deadline = self.handler.next_deadline_ms()
            if (deadline is not None and self.now >= deadline) or r.random() < 0.2:
                self.apply(self.handler.on_timer(self.now), None, None)

    def drain(self) -> None:
        """A last checkpoint every live upstream delivers; reading everything must finish it."""
        final = self.new_checkpoint()
        live = [c for c in range(self.handler.num_channels) if not self.upstream_ended[c]]
        for c in live:
            self.send_barrier(c, final)
        while readable := self.readable():
            self.read_frame(self.rng.choice(readable))
        for c in self.handler.open_channels():
            assert not self.queues[c], f"channel {c} stuck"
        if live:
            assert self.status.get(final.checkpoint_id) == "completed"
        assert not self.blocked and not self.persisting
        # Every checkpoint that showed up in an action ended exactly once.
        assert set(self.status.values()) <= {"completed", "aborted"}, self.status
        if isinstance(self.handler, SingleCheckpointBarrierHandler):
            assert self.handler.pending_checkpoint_id() is None


@pytest.mark.parametrize("seed", range(200))
def test_random_event_sequences_are_consistent_cuts(seed: int) -> None:
    rng = random.Random(seed)
    job_mode = ["aligned", "unaligned", "mixed", "at_least_once"][seed % 4]
    num_channels = rng.randint(1, 4)
    mode = {
        "aligned": CheckpointMode.ALIGNED,
        "unaligned": CheckpointMode.UNALIGNED,
        "mixed": CheckpointMode.ALIGNED,
        "at_least_once": CheckpointMode.AT_LEAST_ONCE,
    }[job_mode]
    handler = create_barrier_handler(mode, num_channels, max_pending=rng.choice([2, 50]))
    sim = SimulatedTask(rng, handler, job_mode)
    handler.check_invariants()
    for _ in range(200):
        sim.step()
    sim.drain()


def test_timed_out_switch_persists_only_data_sent_before_the_missing_barriers() -> None:
    """The consistent-cut oracle on a scripted run: blocked channels' queued data is not state."""
    sim = SimulatedTask(random.Random(0), SingleCheckpointBarrierHandler(2), "aligned")
    b = sim.new_checkpoint(TIMEOUT)  # created at now=0: deadline 100
    n = b.checkpoint_id
    sim.send_data(0)  # 0
    sim.send_barrier(0, b)
    sim.send_data(0)  # 1
    sim.send_data(1)  # 2
    sim.send_data(1)  # 3
    sim.send_barrier(1, b)
    sim.read_frame(0)
    sim.read_frame(0)
    assert sim.blocked == {0}
    sim.read_frame(1)
    sim.now = 100
    sim.apply(sim.handler.on_timer(sim.now), None, None)
    assert sim.blocked == set() and sim.persisting == {1: n}
    sim.read_frame(0)  # sent after barrier n: belongs to the next checkpoint
    sim.read_frame(1)  # sent before barrier n, processed after the snapshot: channel state
    sim.read_frame(1)  # barrier n: complete, checked as a consistent cut
    assert sim.status[n] == "completed"
    assert sim.snapshots[n] == {(0, 0), (1, 2)}
    assert sim.persisted[n] == {(1, 3)}


def test_overtaken_data_of_a_priority_barrier_is_channel_state() -> None:
    """Unaligned barriers overtake queued data; that data belongs to the checkpoint."""
    sim = SimulatedTask(random.Random(0), SingleCheckpointBarrierHandler(2), "unaligned")
    b = sim.new_checkpoint(UNALIGNED)
    n = b.checkpoint_id
    sim.send_data(0)  # 0: overtaken by the first barrier
    sim.send_barrier(0, b)
    sim.send_data(0)  # 1: after the barrier
    sim.send_data(1)  # 2: queued when persisting starts
    sim.send_data(1)  # 3: overtaken by the second barrier
    sim.read_frame(0)  # the barrier, ahead of data 0
    assert sim.persisted[n] == {(0, 0)} and sim.persisting == {1: n}
    sim.read_frame(1)  # data 2, persisted as it is taken
    sim.send_barrier(1, b)
    sim.read_frame(1)  # the barrier, ahead of data 3
    assert sim.status[n] == "completed"
    assert sim.snapshots[n] == frozenset()
    assert sim.persisted[n] == {(0, 0), (1, 2), (1, 3)}
    for _ in range(2):
        sim.read_frame(0)
    sim.read_frame(1)
    assert sim.processed == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert sim.persisted[n] == {(0, 0), (1, 2), (1, 3)}  # nothing written twice

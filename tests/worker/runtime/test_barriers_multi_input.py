"""The barrier handler over a task with several logical inputs: exact event -> action sequences.

The task numbers its channels across all inputs (``InputGate(channels, input_of)``) and one
handler aligns them all, as Flink's ``CheckpointedInputGate`` does over the union of a
two-input task's gates. The scenarios are those of Flink's two-input tests (barriers on both
inputs, a newer barrier on one input while the other aligns, cancel markers, end of partition on
one input, unaligned capture per input, aligned with timeout, at least once). After every step
the handler's own invariants hold, and so do the ones that concern inputs: a finished input is
neither blocked nor persisted, and counts as aligned for every later checkpoint.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.checkpointing import BarrierOptions, CheckpointMode
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
)
from snapflow.worker.runtime.frames import BarrierFrame, DataFrame
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport
from snapflow.worker.runtime.task_state import RestoreData

ALIGNED = BarrierOptions()
UNALIGNED = BarrierOptions(mode=CheckpointMode.UNALIGNED)
TIMEOUT = BarrierOptions(aligned_checkpoint_timeout_ms=100)
SWITCHED = replace(TIMEOUT, mode=CheckpointMode.UNALIGNED)
SUBSUMED = BarrierAbortReason.SUBSUMED
CANCELED = BarrierAbortReason.CANCELED_BY_MARKER

# Input 0 has channels 0 and 1, input 1 has channels 2 and 3 (a two-input task after two
# edges of parallelism 2).
TWO_BY_TWO = [0, 0, 1, 1]


class Task:
    """The handler of a task whose channel ``c`` belongs to input ``input_of[c]``; checks the
    invariants after every step."""

    def __init__(self, handler: BarrierHandler, input_of: list[int]) -> None:
        assert handler.num_channels == len(input_of)
        self.h = handler
        self.input_of = input_of
        self.ended: set[int] = set()
        self.check()

    def channels_of(self, index: int) -> list[int]:
        return [c for c, i in enumerate(self.input_of) if i == index]

    def check(self) -> None:
        self.h.check_invariants()
        assert self.h.open_channels() == set(range(self.h.num_channels)) - self.ended
        for index in set(self.input_of):
            channels = set(self.channels_of(index))
            if channels <= self.ended:  # a finished input holds nothing back
                assert not channels & self.h.blocked_channels()
                assert all(self.h.must_persist(c) is None for c in channels)
        assert not self.h.blocked_channels() & set(self.persisting())

    def step(self, actions: list[Action]) -> list[Action]:
        self.check()
        return actions

    def barrier(
        self, channel: int, cid: int, now: int, options: BarrierOptions = ALIGNED, ts: int = 1000
    ) -> list[Action]:
        return self.step(self.h.on_barrier(channel, Barrier(cid, ts, options), now))

    def cancel(self, channel: int, cid: int, now: int) -> list[Action]:
        return self.step(self.h.on_cancel_marker(channel, cid, now))

    def eop(self, channel: int, now: int) -> list[Action]:
        self.ended.add(channel)
        return self.step(self.h.on_end_of_partition(channel, now))

    def timer(self, now: int) -> list[Action]:
        return self.step(self.h.on_timer(now))

    def persisting(self) -> dict[int, int]:
        return {
            c: cid
            for c in range(self.h.num_channels)
            if (cid := self.h.must_persist(c)) is not None
        }

    def persisting_inputs(self) -> set[int]:
        return {self.input_of[c] for c in self.persisting()}

    def blocked_inputs(self) -> set[int]:
        return {self.input_of[c] for c in self.h.blocked_channels()}


def exactly_once(input_of: list[int]) -> Task:
    return Task(SingleCheckpointBarrierHandler(len(input_of)), input_of)


def at_least_once(input_of: list[int]) -> Task:
    return Task(AtLeastOnceBarrierTracker(len(input_of)), input_of)


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


# --- aligned: barriers on both inputs -----------------------------------------------------


def test_aligned_waits_for_every_channel_of_both_inputs() -> None:
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(2, 1, now=1010) == [BlockChannel(2)]
    # input 1 half blocked: its other channel and all of input 0 keep flowing
    assert t.blocked_inputs() == {1}
    assert t.barrier(0, 1, now=1012) == [BlockChannel(0)]
    assert t.barrier(3, 1, now=1015) == [BlockChannel(3)]
    assert t.h.blocked_channels() == {0, 2, 3}
    assert t.barrier(1, 1, now=1040) == [
        trigger(1, alignment=30, delay=10),
        UnblockChannels((0, 2, 3)),
        CheckpointCompleteOnInput(1),
    ]
    assert t.h.blocked_channels() == frozenset()
    # the next checkpoint starts on the other input
    assert t.barrier(1, 2, now=2005, ts=2000) == [BlockChannel(1)]
    assert t.barrier(3, 2, now=2006, ts=2000) == [BlockChannel(3)]
    assert t.barrier(2, 2, now=2007, ts=2000) == [BlockChannel(2)]
    assert t.barrier(0, 2, now=2009, ts=2000) == [
        trigger(2, alignment=4, delay=5, ts=2000),
        UnblockChannels((1, 2, 3)),
        CheckpointCompleteOnInput(2),
    ]


def test_two_single_channel_inputs_block_the_first_until_the_second_delivers() -> None:
    t = exactly_once([0, 1])
    assert t.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert t.blocked_inputs() == {0}
    assert t.barrier(0, 1, now=1001) == []  # a duplicate on the blocked input
    assert t.barrier(1, 1, now=1050) == [
        trigger(1, alignment=50),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]


# --- a newer barrier on one input while the other aligns ----------------------------------


def test_newer_barrier_on_the_other_input_subsumes_the_alignment() -> None:
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(0, 1, now=1010) == [BlockChannel(0)]
    assert t.barrier(1, 1, now=1011) == [BlockChannel(1)]
    assert t.blocked_inputs() == {0}  # input 0 aligned on 1, input 1 has not started
    assert t.barrier(3, 2, now=1020, ts=1015) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0, 1)),
        BlockChannel(3),
    ]
    assert t.blocked_inputs() == {1}
    # input 1's late barrier of 1 and a replayed one of 1 on input 0 are ignored, not blocked
    assert t.barrier(2, 1, now=1021) == []
    assert t.barrier(0, 1, now=1022) == []
    assert t.h.blocked_channels() == {3}
    assert t.barrier(2, 2, now=1030, ts=1015) == [BlockChannel(2)]
    assert t.barrier(0, 2, now=1031, ts=1015) == [BlockChannel(0)]
    assert t.barrier(1, 2, now=1040, ts=1015) == [
        trigger(2, alignment=20, delay=5, ts=1015),
        UnblockChannels((0, 2, 3)),
        CheckpointCompleteOnInput(2),
    ]


def test_newer_barrier_on_the_aligning_input_itself() -> None:
    """Input 1 already delivered 1 on one channel; its other channel brings 3: the pending
    checkpoint is subsumed and 3 starts there (Flink's skipped checkpoints)."""
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(2, 1, now=1000) == [BlockChannel(2)]
    assert t.barrier(0, 1, now=1001) == [BlockChannel(0)]
    assert t.barrier(3, 3, now=1002) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0, 2)),
        BlockChannel(3),
    ]
    for channel in (0, 1, 2):
        t.barrier(channel, 2, now=1003)  # checkpoint 2 was skipped upstream of input 1
    assert t.h.blocked_channels() == {3}
    assert t.barrier(0, 3, now=1004) == [BlockChannel(0)]
    assert t.barrier(1, 3, now=1005) == [BlockChannel(1)]
    assert t.barrier(2, 3, now=1006) == [
        trigger(3, alignment=4, delay=2),
        UnblockChannels((0, 1, 3)),
        CheckpointCompleteOnInput(3),
    ]


# --- cancel markers -------------------------------------------------------------------------


def test_cancel_marker_on_one_input_aborts_the_alignment_of_the_other() -> None:
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert t.barrier(1, 1, now=1001) == [BlockChannel(1)]
    assert t.cancel(2, 1, now=1002) == [AbortCheckpoint(1, CANCELED), UnblockChannels((0, 1))]
    assert t.h.blocked_channels() == frozenset()
    # the rest of checkpoint 1 on input 1 (barrier and marker) is ignored
    assert t.barrier(3, 1, now=1003) == []
    assert t.cancel(3, 1, now=1004) == []
    assert t.h.blocked_channels() == frozenset()
    # checkpoint 2 aligns normally over both inputs
    for channel in (3, 2, 1):
        assert t.barrier(channel, 2, now=1010) == [BlockChannel(channel)]
    assert t.barrier(0, 2, now=1010) == [
        trigger(2, delay=10),
        UnblockChannels((1, 2, 3)),
        CheckpointCompleteOnInput(2),
    ]


def test_cancel_marker_of_a_newer_checkpoint_on_the_idle_input() -> None:
    """Input 0 aligns on 1 while input 1 sends a marker for 2: 1 is subsumed, 2 is declined
    once, and 2's barriers on input 0 are ignored afterwards."""
    t = exactly_once([0, 0, 1])
    assert t.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert t.cancel(2, 2, now=1001) == [
        AbortCheckpoint(1, SUBSUMED),
        UnblockChannels((0,)),
        AbortCheckpoint(2, CANCELED),
    ]
    assert t.barrier(0, 2, now=1002) == []
    assert t.barrier(1, 2, now=1003) == []
    assert t.cancel(0, 2, now=1004) == []
    assert t.h.blocked_channels() == frozenset()


# --- end of partition on one input ----------------------------------------------------------


def test_an_input_that_ended_counts_as_aligned_for_the_checkpoints_that_follow() -> None:
    t = exactly_once(TWO_BY_TWO)
    assert t.eop(2, now=900) == []
    assert t.eop(3, now=901) == []  # input 1 finished
    assert t.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert t.barrier(1, 1, now=1005) == [
        trigger(1, alignment=5),
        UnblockChannels((0,)),
        CheckpointCompleteOnInput(1),
    ]
    assert t.barrier(1, 2, now=2000, options=UNALIGNED, ts=2000) == [
        trigger(2, UNALIGNED, unaligned=True, ts=2000),
        PersistOvertakenData(1, 2),
        StartPersistingChannel(0, 2),  # only input 0: input 1 has nothing in flight
    ]
    assert t.persisting_inputs() == {0}
    assert t.barrier(0, 2, now=2001, options=UNALIGNED, ts=2000) == [
        PersistOvertakenData(0, 2),
        StopPersistingChannel(0, 2),
        CheckpointCompleteOnInput(2),
    ]


def test_the_other_input_ending_completes_the_alignment() -> None:
    """Input 0 delivered all its barriers and is blocked; input 1 had delivered one of two and
    its other channel ends: the checkpoint triggers at that end of partition."""
    t = exactly_once(TWO_BY_TWO)
    for channel in (0, 1, 2):
        assert t.barrier(channel, 1, now=1000 + channel) == [BlockChannel(channel)]
    assert t.eop(3, now=1010) == [
        trigger(1, alignment=10),
        UnblockChannels((0, 1, 2)),
        CheckpointCompleteOnInput(1),
    ]
    # the next checkpoint does not wait for the ended channel
    assert t.barrier(2, 2, now=1100) == [BlockChannel(2)]
    assert t.barrier(0, 2, now=1101) == [BlockChannel(0)]
    assert t.barrier(1, 2, now=1102) == [
        trigger(2, alignment=2, delay=100),
        UnblockChannels((0, 2)),
        CheckpointCompleteOnInput(2),
    ]


def test_an_input_ending_while_its_channel_is_blocked() -> None:
    """A blocked channel of input 1 ends (Flink: end of partition after the barrier); the
    alignment goes on waiting for input 0 only."""
    t = exactly_once([0, 1])
    assert t.barrier(1, 1, now=1000) == [BlockChannel(1)]
    assert t.eop(1, now=1001) == []
    assert t.h.blocked_channels() == frozenset()
    assert t.barrier(0, 1, now=1002) == [
        trigger(1, alignment=2),
        CheckpointCompleteOnInput(1),
    ]


def test_an_input_ending_while_persisted_stops_persisting_and_completes() -> None:
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(0, 1, now=1000, options=UNALIGNED) == [
        trigger(1, UNALIGNED, unaligned=True),
        PersistOvertakenData(0, 1),
        StartPersistingChannel(1, 1),
        StartPersistingChannel(2, 1),
        StartPersistingChannel(3, 1),
    ]
    assert t.barrier(1, 1, now=1001, options=UNALIGNED) == [
        PersistOvertakenData(1, 1),
        StopPersistingChannel(1, 1),
    ]
    assert t.persisting_inputs() == {1}
    assert t.eop(2, now=1002) == [StopPersistingChannel(2, 1)]
    assert t.eop(3, now=1003) == [StopPersistingChannel(3, 1), CheckpointCompleteOnInput(1)]
    assert t.persisting() == {}


def test_every_input_ended_nothing_triggers_any_more() -> None:
    t = exactly_once([0, 1])
    assert t.barrier(0, 1, now=1000) == [BlockChannel(0)]
    assert t.eop(0, now=1001) == []
    assert t.eop(1, now=1002) == [trigger(1, alignment=2), CheckpointCompleteOnInput(1)]
    assert t.h.open_channels() == frozenset()


# --- unaligned: capture per input ---------------------------------------------------------


def test_unaligned_first_barrier_on_the_second_input_persists_every_other_channel() -> None:
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(3, 1, now=1004, options=UNALIGNED) == [
        trigger(1, UNALIGNED, unaligned=True, delay=4),
        PersistOvertakenData(3, 1),
        StartPersistingChannel(0, 1),
        StartPersistingChannel(1, 1),
        StartPersistingChannel(2, 1),
    ]
    assert t.persisting() == {0: 1, 1: 1, 2: 1}
    assert t.h.blocked_channels() == frozenset()  # never blocks: both inputs keep flowing
    assert t.barrier(0, 1, now=1005, options=UNALIGNED) == [
        PersistOvertakenData(0, 1),
        StopPersistingChannel(0, 1),
    ]
    assert t.persisting_inputs() == {0, 1}
    assert t.barrier(2, 1, now=1006, options=UNALIGNED) == [
        PersistOvertakenData(2, 1),
        StopPersistingChannel(2, 1),
    ]
    assert t.persisting_inputs() == {0}  # input 1's in-flight data is complete
    assert t.barrier(1, 1, now=1007, options=UNALIGNED) == [
        PersistOvertakenData(1, 1),
        StopPersistingChannel(1, 1),
        CheckpointCompleteOnInput(1),
    ]
    assert t.persisting() == {}


def test_unaligned_newer_barrier_on_the_other_input_restarts_the_capture() -> None:
    t = exactly_once([0, 1])
    t.barrier(0, 1, now=1000, options=UNALIGNED)
    assert t.persisting() == {1: 1}
    assert t.barrier(1, 2, now=1001, options=UNALIGNED, ts=1001) == [
        AbortCheckpoint(1, SUBSUMED),
        trigger(2, UNALIGNED, unaligned=True, ts=1001),
        PersistOvertakenData(1, 2),
        StartPersistingChannel(0, 2),
    ]
    assert t.persisting() == {0: 2}


def test_cancel_marker_on_the_other_input_stops_the_capture() -> None:
    t = exactly_once([0, 1])
    t.barrier(1, 1, now=1000, options=UNALIGNED)
    assert t.cancel(0, 1, now=1001) == [AbortCheckpoint(1, CANCELED)]
    assert t.persisting() == {}
    assert t.barrier(0, 1, now=1002, options=UNALIGNED) == []


# --- aligned with timeout switching to unaligned ------------------------------------------


def test_timeout_switches_and_persists_only_the_input_still_missing() -> None:
    """Input 0 delivered its barriers and is blocked, input 1 lags: at the deadline the
    checkpoint goes unaligned, input 1's channels become channel state, input 0 is unblocked
    (what it queued came after its barriers)."""
    t = exactly_once(TWO_BY_TWO)
    assert t.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert t.barrier(1, 1, now=1020, options=TIMEOUT) == [BlockChannel(1)]
    assert t.barrier(2, 1, now=1030, options=TIMEOUT) == [BlockChannel(2)]
    assert t.h.next_deadline_ms() == 1100
    assert t.timer(1099) == []
    assert t.timer(1100) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=90, delay=10),
        StartPersistingChannel(3, 1),
        UnblockChannels((0, 1, 2)),
    ]
    assert t.persisting() == {3: 1}
    assert t.blocked_inputs() == set()
    assert t.barrier(3, 1, now=1200, options=TIMEOUT) == [
        StopPersistingChannel(3, 1),
        CheckpointCompleteOnInput(1),
    ]


def test_unaligned_barrier_from_a_timed_out_upstream_of_the_other_input_switches() -> None:
    """Input 1's upstream timed out and forwarded the barrier unaligned while input 0 is
    aligning: the task switches at once (Flink's barrierReceived on an unaligned barrier)."""
    t = exactly_once([0, 0, 1])
    assert t.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert t.barrier(2, 1, now=1020, options=SWITCHED) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=10, delay=10),
        PersistOvertakenData(2, 1),
        StartPersistingChannel(1, 1),
        UnblockChannels((0,)),
    ]
    assert t.persisting_inputs() == {0}
    assert t.barrier(1, 1, now=1030, options=TIMEOUT) == [
        StopPersistingChannel(1, 1),
        CheckpointCompleteOnInput(1),
    ]


def test_the_lagging_input_ending_after_the_deadline_switches_without_a_timer() -> None:
    t = exactly_once([0, 1, 1])
    assert t.barrier(0, 1, now=1010, options=TIMEOUT) == [BlockChannel(0)]
    assert t.eop(1, now=1150) == [
        SwitchToUnaligned(1),
        trigger(1, SWITCHED, unaligned=True, alignment=140, delay=10),
        StartPersistingChannel(2, 1),
        UnblockChannels((0,)),
    ]
    assert t.eop(2, now=1160) == [StopPersistingChannel(2, 1), CheckpointCompleteOnInput(1)]


# --- at least once --------------------------------------------------------------------------


def test_at_least_once_counts_barriers_over_both_inputs_and_never_blocks() -> None:
    t = at_least_once(TWO_BY_TWO)
    assert t.barrier(0, 1, now=1000) == []
    assert t.barrier(2, 1, now=1001) == []
    assert t.barrier(3, 2, now=1002) == []  # input 1 is ahead: 2 is tracked as well
    assert t.h.blocked_channels() == frozenset()
    assert t.barrier(1, 1, now=1003) == []
    assert t.barrier(3, 1, now=1004) == [trigger(1, alignment=4), CheckpointCompleteOnInput(1)]
    for channel in (0, 1):
        assert t.barrier(channel, 2, now=1005) == []
    assert t.barrier(2, 2, now=1006) == [
        trigger(2, alignment=4, delay=2),
        CheckpointCompleteOnInput(2),
    ]


def test_at_least_once_an_input_ending_completes_what_it_held_back() -> None:
    t = at_least_once([0, 1, 1])
    assert t.barrier(0, 1, now=1000) == []
    assert t.barrier(1, 1, now=1001) == []
    assert t.eop(2, now=1002) == [trigger(1, alignment=2), CheckpointCompleteOnInput(1)]
    assert t.eop(1, now=1003) == []  # input 1 finished: input 0 alone from now on
    assert t.barrier(0, 2, now=1004) == [trigger(2, delay=4), CheckpointCompleteOnInput(2)]


def test_at_least_once_cancel_marker_on_one_input() -> None:
    t = at_least_once([0, 1])
    assert t.barrier(0, 1, now=1000) == []
    assert t.cancel(1, 1, now=1001) == [AbortCheckpoint(1, CANCELED)]
    assert t.barrier(1, 2, now=1002) == []
    assert t.barrier(0, 2, now=1003) == [
        trigger(2, alignment=1, delay=2),
        CheckpointCompleteOnInput(2),
    ]


# --- a task: unaligned in-flight data goes back to its input on restore -------------------


def test_in_flight_data_of_input_1_is_replayed_to_input_1(tmp_path: Path) -> None:
    """An unaligned checkpoint of a task with inputs 0 (channel 0) and 1 (channels 1 and 2)
    captures data overtaken on channels 0 and 2; the restored task replays each batch as data
    of the input its channel belongs to, before any new input."""
    options = BarrierOptions(mode=CheckpointMode.UNALIGNED, target_location=str(tmp_path))
    input_of = [0, 1, 1]
    taken: dict[str, Any] = {}

    async def snapshot() -> None:
        h = harness([], num_inputs=3, input_of=input_of)
        await h.inputs[0].output.send(DataFrame(batch(1)))
        await h.inputs[2].output.send(DataFrame(batch(7, 8)))
        for channel in h.inputs:  # each barrier overtakes the data queued ahead of it
            channel.output.send_priority(BarrierFrame(1, 1_000, options))
            await channel.output.close()
        await asyncio.gather(h.outputs(), h.task.run())
        [report] = h.acks
        assert report.unaligned and report.persisted_in_flight_bytes > 0
        taken["report"] = report

    run(snapshot())
    report: SnapshotReport = taken["report"]

    async def restore() -> None:
        by_op = {op_id: {0: hs} for op_id, hs in report.operator_states}
        data = RestoreData(checkpoint_id=1, previous_parallelism=1, handles=by_op)
        h = harness([], num_inputs=3, input_of=input_of, restore=data)
        loop = h.task.input_loop
        assert loop is not None
        process_input = loop.process_input
        replayed: list[tuple[int, list[int]]] = []

        async def spy(input_index: int, b: pa.RecordBatch) -> None:
            replayed.append((input_index, b.column(0).to_pylist()))
            await process_input(input_index, b)

        loop.process_input = spy  # type: ignore[method-assign,assignment]
        await h.inputs[1].output.send(DataFrame(batch(9)))  # new input after the replay
        for channel in h.inputs:
            await channel.output.close()
        frames, _ = await asyncio.gather(h.outputs(), h.task.run())
        taken["replayed"] = replayed
        taken["out"] = [
            k for f in frames if isinstance(f, DataFrame) for k in f.batch.column(0).to_pylist()
        ]

    run(restore())
    assert taken["replayed"] == [(0, [1]), (1, [7, 8]), (1, [9])]
    assert taken["out"] == [1, 7, 8, 9]

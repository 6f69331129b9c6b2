"""Exact event -> action sequences for the pure task lifecycle (``TaskLifecycle``).

Every step is followed by ``check_invariants``. No task, channel or thread: this is a unit
test of pure logic.
"""

from __future__ import annotations

import contextlib
import random

import pytest

from snapflow.checkpointing import BarrierOptions, CheckpointKind, CheckpointMode
from snapflow.worker.runtime.barriers import TriggerSnapshot
from snapflow.worker.runtime.task_lifecycle import (
    Action,
    AllPartitionsEnded,
    BarrierSnapshot,
    CheckpointAborted,
    CheckpointCompleted,
    CloseOperators,
    DataEnded,
    DeclineTrigger,
    Discard,
    EndData,
    EndInput,
    Event,
    FinalCheckpoint,
    InputEnded,
    InvalidTransitionError,
    NotifyAborted,
    NotifyComplete,
    Opened,
    OperatorsClosed,
    Phase,
    RequestFinalCheckpoint,
    RunEnded,
    RunStarted,
    SnapshotFailed,
    SnapshotSettled,
    SourceExhausted,
    SourceStep,
    TakeSnapshot,
    TaskLifecycle,
    TriggerAtSource,
)

ALIGNED = BarrierOptions(target_location="/chk")
UNALIGNED = BarrierOptions(mode=CheckpointMode.UNALIGNED, target_location="/chk")
TIMEOUT = BarrierOptions(aligned_checkpoint_timeout_ms=50, target_location="/chk")
SUSPEND = BarrierOptions(kind=CheckpointKind.SAVEPOINT_SUSPEND, target_location="/sp")
TERMINATE = BarrierOptions(kind=CheckpointKind.SAVEPOINT_TERMINATE, target_location="/sp")


def phase_of(lc: TaskLifecycle) -> Phase:
    """The phase, read through a call (mypy would otherwise keep an asserted phase)."""
    return lc.phase


def step(lc: TaskLifecycle, event: Event) -> list[Action]:
    actions = lc.handle(event)
    lc.check_invariants()
    return actions


def running_source(final: FinalCheckpoint = FinalCheckpoint.WAIT) -> TaskLifecycle:
    lc = TaskLifecycle(is_source=True, final_checkpoint=final)
    lc.check_invariants()
    assert step(lc, Opened()) == []
    assert step(lc, RunStarted()) == []
    assert phase_of(lc) is Phase.RUNNING
    return lc


def running_task(num_inputs: int = 1) -> TaskLifecycle:
    lc = TaskLifecycle(is_source=False, num_inputs=num_inputs)
    lc.check_invariants()
    assert step(lc, Opened()) == []
    assert step(lc, RunStarted()) == []
    return lc


def trigger(cid: int, options: BarrierOptions = ALIGNED, ts: int = 1000) -> TriggerAtSource:
    return TriggerAtSource(cid, ts, options, now_ms=ts + 7)


def snap(
    cid: int,
    options: BarrierOptions = ALIGNED,
    *,
    input_ended: bool = False,
    start_delay_ms: int = 7,
    alignment_duration_ms: int = 0,
) -> TakeSnapshot:
    unaligned = options.mode is CheckpointMode.UNALIGNED
    trigger = TriggerSnapshot(cid, 1000, options, unaligned, alignment_duration_ms, start_delay_ms)
    return TakeSnapshot(trigger, input_ended)


def barrier(
    cid: int, options: BarrierOptions = ALIGNED, alignment: int = 0, delay: int = 0
) -> BarrierSnapshot:
    unaligned = options.mode is CheckpointMode.UNALIGNED
    return BarrierSnapshot(TriggerSnapshot(cid, 1000, options, unaligned, alignment, delay))


def close(lc: TaskLifecycle, outcome: Phase) -> None:
    assert step(lc, RunEnded(outcome)) == [CloseOperators()]
    assert phase_of(lc) is Phase.CLOSING and not lc.accepts_notices
    assert step(lc, OperatorsClosed()) == []
    assert phase_of(lc) is outcome


# --- sources: end of data and the final checkpoint ----------------------------------------------


def test_a_source_ends_its_data_then_waits_for_the_final_checkpoint() -> None:
    lc = running_source()
    assert lc.source_step() is SourceStep.POLL
    assert step(lc, trigger(1)) == [snap(1)]
    assert step(lc, SnapshotSettled(1)) == []
    assert step(lc, CheckpointCompleted(1)) == [NotifyComplete(1)]
    assert step(lc, SourceExhausted()) == [EndData(run_end_input=True)]
    assert phase_of(lc) is Phase.ENDING_DATA and lc.defers_triggers
    assert step(lc, DataEnded()) == []
    assert phase_of(lc) is Phase.DATA_ENDED and lc.input_exhausted
    # Its snapshots now say the input ended, and are aligned without a timeout whatever the
    # trigger asked: the final checkpoint must carry no in-flight data.
    aligned = BarrierOptions(target_location="/chk", aligned_checkpoint_timeout_ms=0)
    assert step(lc, trigger(2, UNALIGNED)) == [snap(2, aligned, input_ended=True)]
    assert step(lc, SnapshotSettled(2)) == []
    assert step(lc, CheckpointCompleted(2)) == [NotifyComplete(2)]
    assert phase_of(lc) is Phase.DATA_ENDED  # not final: another source still runs
    assert step(lc, trigger(3, TIMEOUT)) == [snap(3, aligned, input_ended=True)]
    assert step(lc, CheckpointCompleted(3, final=True)) == [NotifyComplete(3)]
    assert phase_of(lc) is Phase.FINISHING
    close(lc, Phase.FINISHED)


def test_an_at_least_once_trigger_after_the_end_keeps_its_mode() -> None:
    lc = running_source()
    step(lc, SourceExhausted())
    step(lc, DataEnded())
    at_least_once = BarrierOptions(mode=CheckpointMode.AT_LEAST_ONCE, target_location="/c")
    assert step(lc, trigger(4, at_least_once)) == [snap(4, at_least_once, input_ended=True)]


def test_without_periodic_checkpoints_an_ended_source_asks_for_the_final_one() -> None:
    lc = running_source(FinalCheckpoint.REQUEST)
    step(lc, SourceExhausted())
    assert step(lc, DataEnded()) == [RequestFinalCheckpoint()]
    assert step(lc, trigger(1)) == [snap(1, input_ended=True)]
    assert step(lc, CheckpointCompleted(1, final=True)) == [NotifyComplete(1)]
    assert phase_of(lc) is Phase.FINISHING


def test_without_periodic_checkpoints_and_nobody_to_ask_a_source_ends_at_once() -> None:
    lc = running_source(FinalCheckpoint.NONE)
    step(lc, SourceExhausted())
    assert step(lc, DataEnded()) == []
    assert phase_of(lc) is Phase.FINISHING
    close(lc, Phase.FINISHED)


def test_a_source_restored_after_its_end_skips_end_input_but_ends_its_data_again() -> None:
    lc = TaskLifecycle(is_source=True)
    step(lc, Opened(restored_end_of_data=True))
    step(lc, RunStarted())
    assert lc.source_step() is SourceStep.END
    assert step(lc, SourceExhausted()) == [EndData(run_end_input=False)]
    assert step(lc, DataEnded()) == []
    assert phase_of(lc) is Phase.DATA_ENDED


def test_old_and_repeated_triggers_are_ignored() -> None:
    lc = running_source()
    assert step(lc, trigger(5)) == [snap(5)]
    assert step(lc, trigger(5)) == []
    assert step(lc, trigger(3)) == []
    assert lc.last_snapshot_id == 5


def test_a_failed_synchronous_part_gives_the_id_back() -> None:
    lc = running_source()
    step(lc, trigger(1))
    step(lc, SnapshotSettled(1))
    step(lc, trigger(2))
    assert step(lc, SnapshotFailed(2)) == []
    assert lc.last_snapshot_id == 1 and lc.in_flight == {}
    assert step(lc, trigger(2)) == [snap(2)]  # a retry with the same id is taken


def test_a_source_takes_no_trigger_while_its_data_ends() -> None:
    lc = running_source()
    step(lc, SourceExhausted())
    with pytest.raises(InvalidTransitionError, match="defers triggers"):
        lc.handle(trigger(1))


def test_a_trigger_that_arrived_while_the_data_ended_is_declined_when_the_coordinator_holds() -> (
    None
):
    """The coordinator sent it before it knew this source ended: its barrier would follow the
    end of data and wait behind the end of input downstream. Declined (not a failure); later
    triggers and savepoints are taken as before; without the hold nothing changes."""
    lc = TaskLifecycle(is_source=True, declines_ending_triggers=True)
    step(lc, Opened())
    step(lc, RunStarted())
    step(lc, SourceExhausted())
    step(lc, DataEnded())
    late = TriggerAtSource(4, 1000, ALIGNED, now_ms=1007, arrived_while_ending=True)
    actions = step(lc, late)
    assert [type(a) for a in actions] == [DeclineTrigger]
    assert isinstance(actions[0], DeclineTrigger) and actions[0].checkpoint_id == 4
    assert lc.last_snapshot_id == 0 and not lc.in_flight
    aligned = BarrierOptions(target_location="/chk", aligned_checkpoint_timeout_ms=0)
    assert step(lc, trigger(5)) == [snap(5, aligned, input_ended=True)]
    savepoint = BarrierOptions(CheckpointKind.SAVEPOINT, target_location="/sp")
    assert step(
        lc, TriggerAtSource(6, 1000, savepoint, now_ms=1007, arrived_while_ending=True)
    ) == [snap(6, savepoint, input_ended=True)]
    holds_not = running_source()
    step(holds_not, SourceExhausted())
    step(holds_not, DataEnded())
    assert step(holds_not, late) == [snap(4, aligned, input_ended=True)]


# --- stop-with-savepoint -------------------------------------------------------------------------


def test_stop_with_savepoint_without_drain_stops_once_it_completed() -> None:
    lc = running_source()
    assert step(lc, trigger(7, SUSPEND)) == [snap(7, SUSPEND)]
    assert lc.stopping_at == 7 and lc.source_step() is SourceStep.WAIT
    assert step(lc, CheckpointCompleted(6)) == [NotifyComplete(6)]  # an older one: still waits
    assert lc.source_step() is SourceStep.WAIT
    assert step(lc, CheckpointCompleted(7)) == [NotifyComplete(7)]
    assert phase_of(lc) is Phase.STOPPED and lc.source_step() is SourceStep.END
    close(lc, Phase.FINISHED)


def test_an_aborted_stop_without_drain_resumes() -> None:
    lc = running_source()
    step(lc, trigger(7, SUSPEND))
    assert step(lc, CheckpointAborted(7)) == [NotifyAborted(7)]
    assert lc.stopping_at == 0 and lc.source_step() is SourceStep.POLL
    assert phase_of(lc) is Phase.RUNNING


def test_stop_with_drain_ends_the_data_before_the_savepoint_barrier() -> None:
    lc = running_source()
    assert step(lc, trigger(8, TERMINATE)) == [EndData(run_end_input=True)]
    assert phase_of(lc) is Phase.ENDING_DATA and lc.stopping_at == 8
    # The savepoint's barrier follows end of data; a drain is not an exhausted input.
    assert step(lc, DataEnded(now_ms=1007)) == [snap(8, TERMINATE)]
    assert not lc.input_exhausted and lc.source_step() is SourceStep.WAIT
    assert step(lc, CheckpointCompleted(8)) == [NotifyComplete(8)]
    assert phase_of(lc) is Phase.STOPPED
    close(lc, Phase.FINISHED)


def test_an_aborted_drain_fails_the_source() -> None:
    lc = running_source()
    step(lc, trigger(8, TERMINATE))
    step(lc, DataEnded())
    assert step(lc, CheckpointAborted(8)) == [NotifyAborted(8)]
    assert lc.source_step() is SourceStep.FAIL
    close(lc, Phase.FAILED)


def test_a_drain_whose_savepoint_is_aborted_during_the_flush_fails_without_a_barrier() -> None:
    lc = running_source()
    step(lc, trigger(8, TERMINATE))
    assert step(lc, CheckpointAborted(8)) == [NotifyAborted(8)]  # e.g. it timed out
    assert step(lc, DataEnded()) == []  # no snapshot for an aborted checkpoint
    assert lc.source_step() is SourceStep.FAIL
    close(lc, Phase.FAILED)


def test_a_newer_stop_with_savepoint_is_the_one_waited_for() -> None:
    lc = running_source()
    step(lc, trigger(5, SUSPEND))
    assert step(lc, trigger(6, SUSPEND)) == [snap(6, SUSPEND)]
    assert lc.stopping_at == 6
    assert step(lc, CheckpointAborted(5)) == [NotifyAborted(5)]
    assert lc.source_step() is SourceStep.WAIT  # 6 is still pending: emit nothing
    step(lc, CheckpointCompleted(6))
    assert phase_of(lc) is Phase.STOPPED


def test_a_drains_start_delay_includes_the_flush() -> None:
    lc = running_source()
    step(lc, trigger(8, TERMINATE))  # taken at 1007
    [take] = step(lc, DataEnded(now_ms=1500))  # the flush took until 1500
    assert isinstance(take, TakeSnapshot) and take.trigger.start_delay_ms == 500


def test_a_savepoint_after_the_input_ended_stops_the_ended_source() -> None:
    lc = running_source()
    step(lc, SourceExhausted())
    step(lc, DataEnded())
    aligned_sp = BarrierOptions(
        kind=CheckpointKind.SAVEPOINT_TERMINATE,
        target_location="/sp",
        aligned_checkpoint_timeout_ms=0,
    )
    assert step(lc, trigger(9, TERMINATE)) == [snap(9, aligned_sp, input_ended=True)]
    step(lc, CheckpointCompleted(9))
    assert phase_of(lc) is Phase.STOPPED


# --- tasks with inputs ---------------------------------------------------------------------------


def test_a_task_ends_its_data_when_every_input_ended() -> None:
    lc = running_task(num_inputs=3)
    assert step(lc, InputEnded(1)) == [EndInput(1)]
    assert step(lc, InputEnded(0)) == [EndInput(0)]
    assert step(lc, InputEnded(1)) == []  # the same input again changes nothing
    assert phase_of(lc) is Phase.RUNNING
    assert step(lc, InputEnded(2)) == [EndInput(2), EndData(run_end_input=True)]
    assert step(lc, DataEnded()) == []
    assert phase_of(lc) is Phase.DATA_ENDED
    assert step(lc, barrier(4, alignment=12, delay=3)) == [
        snap(4, start_delay_ms=3, alignment_duration_ms=12)
    ]
    assert step(lc, AllPartitionsEnded()) == []
    assert phase_of(lc) is Phase.FINISHING and lc.waiting_for_checkpoints()
    assert step(lc, CheckpointCompleted(4)) == [NotifyComplete(4)]
    assert lc.waiting_for_checkpoints()  # its ack has not gone out yet
    assert step(lc, SnapshotSettled(4)) == []
    assert not lc.waiting_for_checkpoints()
    close(lc, Phase.FINISHED)


def test_a_task_restored_after_its_end_does_not_run_end_input_again() -> None:
    lc = TaskLifecycle(is_source=False, num_inputs=1)
    step(lc, Opened(restored_end_of_data=True))
    step(lc, RunStarted())
    assert step(lc, InputEnded(0)) == [EndData(run_end_input=False)]


def test_end_of_partition_without_end_of_data_finishes_without_end_input() -> None:
    lc = running_task()  # a stop-with-savepoint without drain upstream
    step(lc, barrier(2, SUSPEND))
    assert step(lc, AllPartitionsEnded()) == []
    assert phase_of(lc) is Phase.FINISHING and lc.waiting_for_checkpoints()
    step(lc, SnapshotSettled(2))
    step(lc, CheckpointCompleted(2))
    assert not lc.waiting_for_checkpoints()


def test_an_input_index_out_of_range_is_a_bug() -> None:
    lc = running_task(num_inputs=2)
    with pytest.raises(ValueError, match=r"no input 2 \(the task has 2\)"):
        lc.handle(InputEnded(2))


# --- cancel, failure, discard, notices ---------------------------------------------------------


def test_a_cancelled_task_closes_and_drops_later_notices() -> None:
    lc = running_source()
    step(lc, trigger(1))
    close(lc, Phase.CANCELED)
    assert step(lc, CheckpointCompleted(1)) == []
    assert step(lc, CheckpointAborted(2)) == []
    assert step(lc, trigger(3)) == []


def test_a_failed_run_closes_from_any_started_phase() -> None:
    sequences: list[list[Event]] = [[], [SourceExhausted()], [SourceExhausted(), DataEnded()]]
    for phase_events in sequences:
        lc = running_source()
        for event in phase_events:
            step(lc, event)
        close(lc, Phase.FAILED)


def test_a_run_cannot_finish_before_it_is_done() -> None:
    lc = running_source()
    with pytest.raises(InvalidTransitionError, match="RunEnded in phase running"):
        lc.handle(RunEnded(Phase.FINISHED))


def test_discard_closes_a_subtask_that_never_ran_once() -> None:
    lc = TaskLifecycle(is_source=True)
    assert step(lc, Discard()) == [CloseOperators()]  # open failed
    assert step(lc, Discard()) == []
    assert step(lc, OperatorsClosed()) == []
    assert phase_of(lc) is Phase.DISCARDED
    lc = running_source()
    assert step(lc, Discard()) == []  # it ran: run closes it
    opened = TaskLifecycle(is_source=False, num_inputs=1)
    step(opened, Opened())
    assert step(opened, Discard()) == [CloseOperators()]
    with pytest.raises(InvalidTransitionError, match="RunStarted in phase closing"):
        opened.handle(RunStarted())


def test_a_run_needs_an_opened_task() -> None:
    with pytest.raises(InvalidTransitionError, match="RunStarted in phase created"):
        TaskLifecycle(is_source=True).handle(RunStarted())


def test_events_of_the_other_kind_of_task_are_bugs() -> None:
    with pytest.raises(InvalidTransitionError):
        running_source().handle(InputEnded(0))
    with pytest.raises(InvalidTransitionError):
        running_task().handle(trigger(1))
    with pytest.raises(InvalidTransitionError):
        running_task().handle(SourceExhausted())
    with pytest.raises(ValueError, match="a source has no inputs"):
        TaskLifecycle(is_source=True, num_inputs=1)


def test_random_sequences_keep_the_invariants() -> None:
    """Any order of the events a shell may feed keeps the invariants (invalid ones raise and
    change nothing visible to them)."""
    rng = random.Random(20)
    for _ in range(300):
        source = rng.random() < 0.5
        lc = TaskLifecycle(is_source=source, num_inputs=0 if source else 2)
        step(lc, Opened(restored_end_of_data=rng.random() < 0.1))
        step(lc, RunStarted())
        for _ in range(30):
            cid = rng.randint(0, 8)
            options = rng.choice([ALIGNED, UNALIGNED, TIMEOUT, SUSPEND, TERMINATE])
            events: list[Event] = [
                trigger(cid, options),
                barrier(cid, options),
                SnapshotSettled(cid),
                SnapshotFailed(cid),
                CheckpointCompleted(cid, final=rng.random() < 0.3),
                CheckpointAborted(cid),
                SourceExhausted(),
                InputEnded(rng.randint(0, 1)),
                DataEnded(),
                AllPartitionsEnded(),
            ]
            event = rng.choice(events)
            with contextlib.suppress(InvalidTransitionError, ValueError):
                lc.handle(event)
            lc.check_invariants()

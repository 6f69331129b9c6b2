"""The lifecycle of one subtask: a pure state machine (the task's side of Flink's StreamTask
states, end of input after FLIP-147, stop-with-savepoint).

The subtask shell (``snapflow.worker.runtime.task`` and its loops) feeds in what happened as
*events* and executes the *actions* that come back, in order. The loops decide what to do next
by asking the machine (``source_step``, ``defers_triggers``, ``waiting_for_checkpoints``). There
is no I/O, no clock and no thread in here; times come in with the events.

Phases, in order (``Phase``)::

    CREATED --Opened--> OPENED --RunStarted--> RUNNING
    RUNNING --SourceExhausted / InputEnded(last input)--> ENDING_DATA   (EndData: the flush)
    RUNNING --TriggerAtSource(stop with drain)--------> ENDING_DATA   (EndData, then the snapshot)
    ENDING_DATA --DataEnded--> DATA_ENDED
    DATA_ENDED --(final checkpoint completed, or no final checkpoint to wait for)--> FINISHING
    RUNNING / DATA_ENDED --AllPartitionsEnded--> FINISHING            (tasks with inputs)
    RUNNING / DATA_ENDED --CheckpointCompleted(stop-with-savepoint)--> STOPPED   (sources)
    FINISHING / STOPPED --RunEnded(FINISHED)--> CLOSING
    any phase after RunStarted --RunEnded(CANCELED or FAILED)--> CLOSING
    CREATED / OPENED --Discard--> CLOSING
    CLOSING --OperatorsClosed--> FINISHED | CANCELED | FAILED | DISCARDED

End of input (docs/worker.md, "End of input"): a source whose input is exhausted, or a task whose
every input delivered end of data on all its channels, flushes its chain (``EndData``: the
operators' ``end_input``, not again after a restore from a snapshot taken after it) and sends
end of data downstream. A source then waits for the job's final checkpoint, the one the
coordinator marks final because every source had ended before it, so that two-phase-commit
sinks commit the last records; a task with inputs waits until its partitions ended and every
snapshot it took completed (``waiting_for_checkpoints``). Only then, in ``FINISHING``, does the
shell close its output partitions.

Stop-with-savepoint (sources): the savepoint's trigger marks the stop; the source emits nothing
more until the savepoint completed (``STOPPED``: close the partitions, nothing else) or was
aborted (the source resumes). With drain, end of data goes ahead of the savepoint's barrier; a
drain whose savepoint was aborted cannot resume (downstream ran ``end_input``) and fails the
task (``SourceStep.FAIL``), as Flink fails it too.

Notices (checkpoint complete or aborted) reach the operators only while the task is not closing
(``NotifyComplete``/``NotifyAborted`` are not returned from ``CLOSING`` on).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from snapflow.checkpointing import BarrierOptions, CheckpointKind, CheckpointMode
from snapflow.worker.runtime.barriers import TriggerSnapshot


class Phase(enum.Enum):
    CREATED = "created"
    OPENED = "opened"
    RUNNING = "running"
    ENDING_DATA = "ending-data"
    """The chain's ``end_input`` runs and end of data goes out; a source defers its triggers so
    that no barrier splits the flush's output from its end of data."""
    DATA_ENDED = "data-ended"
    FINISHING = "finishing"
    """Done: the output partitions close (a task with inputs first waits for its snapshots)."""
    STOPPED = "stopped"
    """A source's stop-with-savepoint completed: nothing more is emitted or committed."""
    CLOSING = "closing"
    FINISHED = "finished"
    CANCELED = "canceled"
    FAILED = "failed"
    DISCARDED = "discarded"
    """Opened (or tried to) but never run: a deployment that failed or was cancelled."""


#: How a run ended (``RunEnded.outcome``), and the phase the task ends in once closed.
OUTCOMES = frozenset({Phase.FINISHED, Phase.CANCELED, Phase.FAILED})
TERMINAL = frozenset({*OUTCOMES, Phase.DISCARDED})
_STARTED = frozenset(
    {
        Phase.RUNNING,
        Phase.ENDING_DATA,
        Phase.DATA_ENDED,
        Phase.FINISHING,
        Phase.STOPPED,
    }
)


class FinalCheckpoint(enum.Enum):
    """What an ended source does about the job's final checkpoint."""

    WAIT = "wait"
    """Periodic checkpoints: wait for the coordinator's final one."""
    REQUEST = "request"
    """No periodic checkpoints: ask the coordinator for one (``RequestFinalCheckpoint``), then
    wait for it."""
    NONE = "none"
    """No periodic checkpoints and nobody to ask: end at once; sinks commit nothing more."""


class SourceStep(enum.Enum):
    """What a source's loop does next (``TaskLifecycle.source_step``)."""

    POLL = "poll"
    WAIT = "wait"
    """A stop-with-savepoint is pending: emit nothing until it completes or is aborted."""
    END = "end"
    """The source emits nothing more: its input is exhausted (or ended before the snapshot it
    was restored from), or its stop-with-savepoint completed."""
    FAIL = "fail"
    """A stop-with-savepoint with drain was aborted after end of data went downstream."""


# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """The operators opened with their restored state; ``restored_end_of_data``: the snapshot
    restored from was taken after this subtask's ``end_input``."""

    restored_end_of_data: bool = False


@dataclass(frozen=True)
class RunStarted:
    pass


@dataclass(frozen=True)
class SourceExhausted:
    """The source's poll returned nothing more (or it ended before its restored snapshot)."""


@dataclass(frozen=True)
class InputEnded:
    """Every channel of logical input ``input_index`` delivered end of data."""

    input_index: int


@dataclass(frozen=True)
class DataEnded:
    """``EndData`` was executed: the flush ran and end of data is on every output channel."""

    now_ms: int = 0
    """When (a drain's savepoint trigger waited for the flush: its start delay includes it)."""


@dataclass(frozen=True)
class AllPartitionsEnded:
    """A task with inputs: every input channel delivered end of partition."""


@dataclass(frozen=True)
class TriggerAtSource:
    """A checkpoint trigger from the coordinator, taken by a source between two polls."""

    checkpoint_id: int
    timestamp_ms: int
    options: BarrierOptions
    now_ms: int
    arrived_while_ending: bool = False
    """It arrived while the source's end of data was going out (``defers_triggers``)."""


@dataclass(frozen=True)
class BarrierSnapshot:
    """A task with inputs is to snapshot: its barrier handler said so."""

    trigger: TriggerSnapshot


@dataclass(frozen=True)
class SnapshotFailed:
    """The synchronous part of ``checkpoint_id``'s snapshot failed (the task declined it)."""

    checkpoint_id: int


@dataclass(frozen=True)
class SnapshotSettled:
    """The snapshot of ``checkpoint_id`` was acknowledged, declined or aborted: nothing of it
    runs any more."""

    checkpoint_id: int


@dataclass(frozen=True)
class CheckpointCompleted:
    checkpoint_id: int
    final: bool = False
    """The coordinator's mark: every source of the job had ended before this checkpoint."""


@dataclass(frozen=True)
class CheckpointAborted:
    checkpoint_id: int


@dataclass(frozen=True)
class RunEnded:
    """The task's run ended: ``FINISHED`` (returned), ``CANCELED`` or ``FAILED`` (raised)."""

    outcome: Phase


@dataclass(frozen=True)
class Discard:
    """Give up a subtask whose run never started."""


@dataclass(frozen=True)
class OperatorsClosed:
    pass


Event = (
    Opened
    | RunStarted
    | SourceExhausted
    | InputEnded
    | DataEnded
    | AllPartitionsEnded
    | TriggerAtSource
    | BarrierSnapshot
    | SnapshotFailed
    | SnapshotSettled
    | CheckpointCompleted
    | CheckpointAborted
    | RunEnded
    | Discard
    | OperatorsClosed
)


# --- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EndInput:
    """One of several inputs ended: run the head operator's ``end_of_input(input_index)`` and
    emit what it flushes (tasks with one input only get ``EndData``)."""

    input_index: int


@dataclass(frozen=True)
class EndData:
    """Flush and end the data: run the chain's ``end_input`` (unless ``run_end_input`` is
    false: it ran before the restored snapshot), a source emits the maximum watermark, record
    the end in the snapshot state, send end of data on every output channel; then feed
    ``DataEnded``."""

    run_end_input: bool


@dataclass(frozen=True)
class TakeSnapshot:
    """Snapshot: barrier downstream, synchronous part, asynchronous part, ack."""

    trigger: TriggerSnapshot
    """What to snapshot and how (a source's, made here, alignment 0; else the handler's)."""
    input_ended: bool
    """The snapshot says the source's input ended (a final checkpoint may follow only such)."""

    @property
    def checkpoint_id(self) -> int:
        return self.trigger.checkpoint_id


@dataclass(frozen=True)
class DeclineTrigger:
    """Decline a source's trigger without a snapshot (``TASK_NOT_READY``)."""

    checkpoint_id: int
    message: str


@dataclass(frozen=True)
class RequestFinalCheckpoint:
    """Ask the coordinator for the final checkpoint (no periodic checkpoints)."""


@dataclass(frozen=True)
class NotifyComplete:
    checkpoint_id: int


@dataclass(frozen=True)
class NotifyAborted:
    checkpoint_id: int


@dataclass(frozen=True)
class CloseOperators:
    """Close the operators and dispose their state, where they run."""


Action = (
    EndInput
    | EndData
    | TakeSnapshot
    | DeclineTrigger
    | RequestFinalCheckpoint
    | NotifyComplete
    | NotifyAborted
    | CloseOperators
)


@dataclass
class _Stop:
    """A stop-with-savepoint this source took."""

    checkpoint_id: int
    drain: bool


class TaskFailedError(Exception):
    """The task cannot go on (the agent reports it failed and the job fails over)."""


class InvalidTransitionError(Exception):
    """An event that the phase does not allow: a bug in the shell that fed it."""


@dataclass
class TaskLifecycle:
    """One subtask's lifecycle; ``handle(event)`` is the only way its state changes."""

    is_source: bool
    num_inputs: int = 0
    """Logical inputs of a task with inputs (numbered from 0); 0 for a source."""
    final_checkpoint: FinalCheckpoint = FinalCheckpoint.WAIT
    """What an ended source does about the final checkpoint (ignored for other tasks)."""
    declines_ending_triggers: bool = False
    """The coordinator holds checkpoints while tasks end their input (this task reports the end
    of its data): a source declines a trigger that arrived while its end of data was going out
    (``TASK_NOT_READY``, not counted as a failure). The coordinator had sent it before it knew,
    its barrier would follow the end of data and wait behind the downstream end of input, and
    the final checkpoint is triggered once every task ended."""

    phase: Phase = Phase.CREATED
    last_snapshot_id: int = 0
    last_completed_id: int = 0
    restored_end_of_data: bool = False
    ended_inputs: set[int] = field(default_factory=set)
    input_exhausted: bool = False
    """A source's input ended by itself (not by a drain): its snapshots say so from now on."""
    final_completed: bool = False
    in_flight: dict[int, int] = field(default_factory=dict)
    """Snapshots started and not settled: checkpoint id -> the last snapshot id before it."""
    _stop: _Stop | None = None
    _drain_failed: bool = False
    _held_trigger: TriggerAtSource | None = None
    """A drain's savepoint trigger, taken once end of data went out."""
    _outcome: Phase | None = None

    def __post_init__(self) -> None:
        if self.is_source and self.num_inputs:
            raise ValueError("a source has no inputs")
        if not self.is_source and self.num_inputs < 1:
            raise ValueError(f"a task with inputs needs at least one, got {self.num_inputs}")

    # --- queries -------------------------------------------------------------------------------

    @property
    def accepts_notices(self) -> bool:
        """Notices and posted calls still reach the operators (not once closing)."""
        return self.phase not in (Phase.CLOSING, *TERMINAL)

    @property
    def defers_triggers(self) -> bool:
        """A source takes no trigger now: its flush and end of data are going out."""
        return self.phase is Phase.ENDING_DATA

    @property
    def stopping_at(self) -> int:
        """The stop-with-savepoint this source waits for; 0: none."""
        return self._stop.checkpoint_id if self._stop is not None else 0

    def source_step(self) -> SourceStep:
        if self._drain_failed:
            return SourceStep.FAIL
        if self.phase is Phase.STOPPED or self.input_exhausted:
            return SourceStep.END
        if self._stop is not None or self.phase is not Phase.RUNNING:
            return SourceStep.WAIT
        if self.restored_end_of_data:
            return SourceStep.END  # it ended before the snapshot it restored
        return SourceStep.POLL

    def waiting_for_checkpoints(self) -> bool:
        """A finishing task with inputs waits until every snapshot it took completed: its
        output before end of partition must be covered by a completed checkpoint."""
        return bool(self.in_flight) or self.last_snapshot_id > self.last_completed_id

    # --- the one entry point -------------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        match event:
            case Opened(restored_end_of_data=restored):
                self._expect(event, Phase.CREATED)
                self.restored_end_of_data = restored
                self.phase = Phase.OPENED
                return []
            case RunStarted():
                self._expect(event, Phase.OPENED)
                self.phase = Phase.RUNNING
                return []
            case SourceExhausted():
                return self._on_source_exhausted(event)
            case InputEnded(input_index=index):
                return self._on_input_ended(event, index)
            case DataEnded(now_ms=now):
                return self._on_data_ended(event, now)
            case AllPartitionsEnded():
                if self.is_source:
                    raise InvalidTransitionError("a source has no input partitions")
                self._expect(event, Phase.RUNNING, Phase.DATA_ENDED)
                self.phase = Phase.FINISHING
                return []
            case TriggerAtSource():
                return self._on_trigger(event)
            case BarrierSnapshot():
                return self._on_barrier_snapshot(event)
            case SnapshotFailed(checkpoint_id=cid):
                previous = self.in_flight.pop(cid, None)
                if previous is not None and self.last_snapshot_id == cid:
                    self.last_snapshot_id = max(previous, *self.in_flight, 0)
                return []
            case SnapshotSettled(checkpoint_id=cid):
                self.in_flight.pop(cid, None)
                return []
            case CheckpointCompleted(checkpoint_id=cid, final=final):
                return self._on_completed(cid, final)
            case CheckpointAborted(checkpoint_id=cid):
                return self._on_aborted(cid)
            case RunEnded(outcome=outcome):
                return self._on_run_ended(event, outcome)
            case Discard():
                if self.phase not in (Phase.CREATED, Phase.OPENED):
                    return []  # it ran (run closes it) or was discarded before
                self._outcome = Phase.DISCARDED
                self.phase = Phase.CLOSING
                return [CloseOperators()]
            case OperatorsClosed():
                self._expect(event, Phase.CLOSING)
                assert self._outcome is not None
                self.phase = self._outcome
                return []
        raise TypeError(f"unknown lifecycle event: {event!r}")

    # --- transitions ---------------------------------------------------------------------------

    def _on_source_exhausted(self, event: Event) -> list[Action]:
        if not self.is_source:
            raise InvalidTransitionError("only a source's input is exhausted")
        self._expect(event, Phase.RUNNING)
        if self._stop is not None:
            raise InvalidTransitionError("a stopping source polls nothing")
        self.phase = Phase.ENDING_DATA
        return [EndData(run_end_input=not self.restored_end_of_data)]

    def _on_input_ended(self, event: Event, index: int) -> list[Action]:
        if self.is_source:
            raise InvalidTransitionError("a source has no inputs")
        if not 0 <= index < self.num_inputs:
            raise ValueError(f"no input {index} (the task has {self.num_inputs})")
        self._expect(event, Phase.RUNNING)
        if index in self.ended_inputs:
            return []  # the same input again changes nothing
        self.ended_inputs.add(index)
        # Operators with several inputs hear of each one's end (Flink's
        # BoundedMultiInput.endInput(i)); not again after a restore past the whole end.
        actions: list[Action] = (
            [EndInput(index)] if self.num_inputs > 1 and not self.restored_end_of_data else []
        )
        if len(self.ended_inputs) < self.num_inputs:
            return actions
        self.phase = Phase.ENDING_DATA
        return [*actions, EndData(run_end_input=not self.restored_end_of_data)]

    def _on_data_ended(self, event: Event, now_ms: int) -> list[Action]:
        self._expect(event, Phase.ENDING_DATA)
        self.phase = Phase.DATA_ENDED
        if not self.is_source:
            return []
        held, self._held_trigger = self._held_trigger, None
        if held is not None:  # a drain: the savepoint's barrier follows end of data
            return self._snapshot_at_source(dataclasses.replace(held, now_ms=now_ms))
        if self._drain_failed:
            return []  # its savepoint was aborted during the flush: the task fails
        self.input_exhausted = True  # only now may a snapshot say so: its barrier follows
        if self.final_completed or self.final_checkpoint is FinalCheckpoint.NONE:
            self.phase = Phase.FINISHING  # nothing (more) to wait for
            return []
        if self.final_checkpoint is FinalCheckpoint.REQUEST:
            return [RequestFinalCheckpoint()]
        return []

    def _on_trigger(self, event: TriggerAtSource) -> list[Action]:
        if not self.is_source:
            raise InvalidTransitionError("only sources take triggers")
        self._check_id(event.checkpoint_id)
        if self.phase is Phase.ENDING_DATA:
            raise InvalidTransitionError("a source defers triggers while its data ends")
        if self.phase not in (Phase.RUNNING, Phase.DATA_ENDED) or self._drain_failed:
            return []  # finishing, stopped, failing or closing: nothing more to snapshot
        if event.checkpoint_id <= self.last_snapshot_id:
            return []
        if (
            event.arrived_while_ending
            and self.declines_ending_triggers
            and self.phase is Phase.DATA_ENDED
            and not event.options.kind.is_savepoint
        ):
            return [
                DeclineTrigger(
                    event.checkpoint_id,
                    "the trigger arrived while this source's end of data went out: its barrier "
                    "would wait behind the end of input downstream; the final checkpoint "
                    "follows once every task ended",
                )
            ]
        if event.options.kind is CheckpointKind.SAVEPOINT_TERMINATE and self.phase is Phase.RUNNING:
            # Drain, as Flink's: the maximum watermark (every event-time timer fires),
            # end_input and end of data go ahead of the savepoint's barrier.
            self._stop = _Stop(event.checkpoint_id, drain=True)
            self._held_trigger = event
            self.phase = Phase.ENDING_DATA
            return [EndData(run_end_input=not self.restored_end_of_data)]
        return self._snapshot_at_source(event)

    def _on_barrier_snapshot(self, event: BarrierSnapshot) -> list[Action]:
        if self.is_source:
            raise InvalidTransitionError("a source snapshots on triggers, not barriers")
        trigger = event.trigger
        self._check_id(trigger.checkpoint_id)
        self._expect(event, Phase.RUNNING, Phase.ENDING_DATA, Phase.DATA_ENDED)
        self._start_snapshot(trigger.checkpoint_id)
        return [TakeSnapshot(trigger, input_ended=False)]

    def _snapshot_at_source(self, event: TriggerAtSource) -> list[Action]:
        options = event.options
        if options.kind.is_synchronous:
            # The newest stop-with-savepoint is the one to wait for (a drain stays a drain).
            drained = self._stop is not None and self._stop.drain
            self._stop = _Stop(event.checkpoint_id, drain=drained)
        if self.input_exhausted and options.mode is not CheckpointMode.AT_LEAST_ONCE:
            # A checkpoint may be the job's final one only if every source had ended, and the
            # final one must carry no in-flight data: nothing checkpoints after it, so data in
            # channel state would never reach a committed transaction. Ended sources therefore
            # inject aligned barriers that do not time out.
            options = dataclasses.replace(
                options, mode=CheckpointMode.ALIGNED, aligned_checkpoint_timeout_ms=0
            )
        self._start_snapshot(event.checkpoint_id)
        trigger = TriggerSnapshot(
            event.checkpoint_id,
            event.timestamp_ms,
            options,
            unaligned=options.mode is CheckpointMode.UNALIGNED,
            alignment_duration_ms=0,
            start_delay_ms=max(0, event.now_ms - event.timestamp_ms),
        )
        return [TakeSnapshot(trigger, input_ended=self.input_exhausted)]

    def _start_snapshot(self, checkpoint_id: int) -> None:
        self.in_flight[checkpoint_id] = self.last_snapshot_id
        self.last_snapshot_id = max(self.last_snapshot_id, checkpoint_id)

    def _on_completed(self, checkpoint_id: int, final: bool) -> list[Action]:
        self._check_id(checkpoint_id)
        self.last_completed_id = max(self.last_completed_id, checkpoint_id)
        if final:
            self.final_completed = True
        held = self._held_trigger is not None  # its savepoint cannot complete before its ack
        if self._stop is not None and checkpoint_id >= self._stop.checkpoint_id and not held:
            self._stop = None
            if self.phase in (Phase.RUNNING, Phase.DATA_ENDED):
                self.phase = Phase.STOPPED
        elif self.is_source and final and self.phase is Phase.DATA_ENDED and self.input_exhausted:
            self.phase = Phase.FINISHING
        return [NotifyComplete(checkpoint_id)] if self.accepts_notices else []

    def _on_aborted(self, checkpoint_id: int) -> list[Action]:
        self._check_id(checkpoint_id)
        if self._stop is not None and self._stop.checkpoint_id == checkpoint_id:
            # A failed stop-with-savepoint: the job goes on, unless end of data went downstream.
            if self._stop.drain:
                self._drain_failed = True
            self._stop = None
            self._held_trigger = None  # aborted during the flush: no barrier for it
        return [NotifyAborted(checkpoint_id)] if self.accepts_notices else []

    def _on_run_ended(self, event: Event, outcome: Phase) -> list[Action]:
        if outcome not in OUTCOMES:
            raise ValueError(f"a run ends finished, canceled or failed, not {outcome.value}")
        if outcome is Phase.FINISHED:
            self._expect(event, Phase.FINISHING, Phase.STOPPED)
        elif self.phase not in _STARTED:
            self._expect(event, *_STARTED)
        self._outcome = outcome
        self.phase = Phase.CLOSING
        self._held_trigger = None
        return [CloseOperators()]

    # --- checks --------------------------------------------------------------------------------

    def _expect(self, event: Event, *phases: Phase) -> None:
        if self.phase not in phases:
            allowed = ", ".join(p.value for p in phases)
            raise InvalidTransitionError(
                f"{type(event).__name__} in phase {self.phase.value} (allowed in: {allowed})"
            )

    @staticmethod
    def _check_id(checkpoint_id: int) -> None:
        if checkpoint_id < 0:
            raise ValueError(f"checkpoint ids are >= 0, got {checkpoint_id}")

    def check_invariants(self) -> None:
        """What holds after every event (the tests call it after each step)."""
        assert self.last_completed_id >= 0
        assert self.last_snapshot_id >= 0
        for cid, previous in self.in_flight.items():
            assert previous >= 0 and 0 <= cid <= self.last_snapshot_id
        assert self.ended_inputs <= set(range(self.num_inputs))
        if self.is_source:
            assert not self.ended_inputs
        else:
            assert self._stop is None and not self.input_exhausted and self._held_trigger is None
        if self.input_exhausted:
            assert self.phase not in (Phase.CREATED, Phase.OPENED, Phase.RUNNING)
        if self.phase in (Phase.ENDING_DATA, Phase.DATA_ENDED) and not self.is_source:
            assert len(self.ended_inputs) == self.num_inputs
        if self._held_trigger is not None:
            assert self.phase is Phase.ENDING_DATA
            assert self._stop is not None and self._stop.drain
        if self._drain_failed:
            assert self._stop is None
        if self.phase is Phase.STOPPED:
            assert self._stop is None and self.is_source
        if self.phase is Phase.CLOSING or self.phase in TERMINAL:
            assert self._outcome is not None and self._held_trigger is None
        if self.phase in TERMINAL:
            assert self.phase is self._outcome

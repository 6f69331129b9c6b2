"""The pure checkpoint coordinator of one job (Flink's CheckpointCoordinator).

Events go in (trigger requests, acks, declines, ticks of an injected clock, task changes, the
outcome of asynchronous I/O the shell performed) and *actions* come out: plain dataclasses that
the shell (``coordinator.job_runner``) executes in order (Redis, storage, gRPC). There are no
sockets, no Redis, no clocks and no threads in here, so every behaviour can be pinned down with
exact event sequences. Only events change the state: the shell reads it through the queries
below and never writes it, so ``check_invariants`` covers every path.

Recovery contract (what the shell relies on):

* Triggering is two-step because checkpoint ids come from Redis: a request that passes the
  pre-checks yields ``AllocateCheckpointId``; the shell answers with ``on_checkpoint_id`` (or
  ``on_checkpoint_id_failed``). While an id is being allocated no other trigger starts
  (Flink's ``isTriggering``). A preparation that has not answered within the checkpoint timeout
  expires (``CHECKPOINT_EXPIRED``, counted); its late answer only burns the id, and no trigger
  is ever sent for it.
* Completion is two-step because the metadata and the Redis commit are I/O: the last ack yields
  ``FinalizeCheckpoint``; only after the shell wrote ``_metadata`` and committed the record does
  it call ``on_checkpoint_committed``, which yields ``NotifyComplete``. A failed finalisation is
  reported with ``on_finalize_failed`` and aborts the checkpoint; it counts as a failure, as
  Flink's ``FINALIZE_CHECKPOINT_FAILURE`` does.
* A source's request for the job's final checkpoint (``TriggerRequest.input_ended``, a job
  without periodic checkpoints) is held until every source of the running deployment asked;
  the final checkpoint answers the held ones (``RequestCovered``), a failover or shutdown
  refuses them as it refuses the queue. Which sources ended is not persisted: after a
  coordinator restart the sources, still waiting for their final checkpoint, ask again.
* Once every source reported the end of its data and some task has not yet
  (``on_task_data_ended``), no checkpoint is triggered: its barrier would only wait behind
  that task's end of input (the timers the maximum watermark fires, ``end_input``). Periodic
  requests are refused (``TASKS_ENDING_INPUT``), the others wait in the queue; when the last
  task reports, the final checkpoint is triggered at once. A report that never comes (a lost
  RPC) holds them for at most the checkpoint timeout.

Where this differs from Flink on purpose, and which Flink version it follows:
``docs/flink-differences.md``.
* State handed over in an ack that cannot be used (late, unknown, duplicate, aborted) is
  returned in ``DiscardState`` so it is never leaked, except paths that a retained completed
  checkpoint references, which are never discarded.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator.checkpoint_failure_manager import FailureManager, abort_reason_for_decline
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    BarrierOptions,
    CheckpointKind,
    CheckpointMode,
    CompletedCheckpoint,
    DeclineReason,
    ExecutionAttempt,
    JobGraph,
    OperatorSubtaskState,
    SubtaskAck,
    SubtaskMetrics,
    TriggerRefusal,
)
from snapflow.coordinator.restore_point import RestoreDecision, RestorePlan, choose_restore_point

# How many ids of ended checkpoints to remember for classifying late acks (Flink keeps 16).
RECENT_CHECKPOINTS_REMEMBERED = 16


class TaskView(Protocol):
    """What the coordinator needs to know about the job's tasks (``JobExecution`` provides it)."""

    def all_running(self) -> bool: ...

    def current_attempts(self) -> list[ExecutionAttempt]: ...

    def source_attempts(self) -> list[ExecutionAttempt]: ...

    def every_source_data_ended(self) -> bool: ...

    def all_data_ended(self) -> bool: ...


@dataclass(frozen=True)
class TriggerRequest:
    request_id: int
    kind: CheckpointKind
    periodic: bool = False
    target_directory: str = ""
    input_ended: ExecutionAttempt | None = None
    """Set when a source subtask whose input ended asks for the job's final checkpoint (a job
    without periodic checkpoints): held until every source subtask of the deployment asked."""


def _queue_rank(request: TriggerRequest) -> int:
    if request.kind.is_savepoint:
        return 0
    return 2 if request.periodic else 1


# --- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocateCheckpointId:
    request: TriggerRequest


@dataclass(frozen=True)
class RequestRefused:
    request: TriggerRequest
    refusal: TriggerRefusal


@dataclass(frozen=True)
class CheckpointTriggered:
    checkpoint_id: int
    request: TriggerRequest
    timestamp_ms: int
    external_path: str
    tasks: tuple[ExecutionAttempt, ...]


@dataclass(frozen=True)
class SendTrigger:
    checkpoint_id: int
    timestamp_ms: int
    options: BarrierOptions
    tasks: tuple[ExecutionAttempt, ...]


@dataclass(frozen=True)
class SubtaskAcknowledged:
    checkpoint_id: int
    ack: SubtaskAck


@dataclass(frozen=True)
class FinalizeCheckpoint:
    checkpoint: CompletedCheckpoint
    retained: int


@dataclass(frozen=True)
class CheckpointCompleted:
    checkpoint: CompletedCheckpoint
    request: TriggerRequest
    dropped_ids: tuple[int, ...]


@dataclass(frozen=True)
class RequestCovered:
    """A held request of an ended source (``TriggerRequest.input_ended``) is answered by the
    final checkpoint another source's request triggered."""

    request: TriggerRequest
    checkpoint: CompletedCheckpoint


@dataclass(frozen=True)
class EndCommitted:
    """A checkpoint after which the tasks end completed: the final one (every source had ended
    its input) or a stop-with-savepoint. The output of ``tasks`` is committed once they are
    notified, so the job may finish when they do (``JobExecution.end_committed``)."""

    checkpoint_id: int
    tasks: tuple[ExecutionAttempt, ...]


@dataclass(frozen=True)
class NotifyComplete:
    checkpoint_id: int
    tasks: tuple[ExecutionAttempt, ...]
    final: bool = False
    """Every source had ended its input: the tasks end after this notification."""


@dataclass(frozen=True)
class CheckpointAborted:
    checkpoint_id: int
    request: TriggerRequest
    reason: AbortReason
    message: str
    timestamp_ms: int
    trigger_timestamp_ms: int
    external_path: str
    discarded_paths: tuple[str, ...]


@dataclass(frozen=True)
class NotifyAborted:
    checkpoint_id: int
    tasks: tuple[ExecutionAttempt, ...]
    reason: AbortReason


@dataclass(frozen=True)
class DiscardState:
    paths: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class DeleteCompleted:
    """Retention dropped these checkpoints: delete them from storage (Redis already did)."""

    checkpoint_ids: tuple[int, ...]


@dataclass(frozen=True)
class FailJob:
    message: str


Action = (
    AllocateCheckpointId
    | RequestRefused
    | CheckpointTriggered
    | SendTrigger
    | SubtaskAcknowledged
    | FinalizeCheckpoint
    | CheckpointCompleted
    | EndCommitted
    | RequestCovered
    | NotifyComplete
    | CheckpointAborted
    | NotifyAborted
    | DiscardState
    | DeleteCompleted
    | FailJob
)


def _check_queue_bound(max_queued_requests: int) -> None:
    """Refused loudly here rather than misread later. (The config validated itself on
    construction: ``snapflow.checkpoint_config``.)"""
    if max_queued_requests < 1:
        raise ValueError(f"max_queued_requests {max_queued_requests} must be at least 1")


# --- state -------------------------------------------------------------------------------


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    request: TriggerRequest
    trigger_timestamp_ms: int
    deadline_ms: int
    external_path: str
    not_yet_acknowledged: set[ExecutionAttempt]
    acknowledged: dict[ExecutionAttempt, SubtaskAck] = field(default_factory=dict)
    finalizing: bool = False

    @property
    def kind(self) -> CheckpointKind:
        return self.request.kind

    @property
    def num_tasks(self) -> int:
        return len(self.not_yet_acknowledged) + len(self.acknowledged)

    def acked_paths(self) -> list[str]:
        """The files of the acknowledged state (inline state has none)."""
        return [
            h.path
            for a in self.acknowledged.values()
            for s in a.operator_states
            for h in s.handles
            if not h.is_inline
        ]


class CheckpointCoordinator:
    """Checkpoint bookkeeping of one job. Not thread-safe: the shell serialises calls."""

    def __init__(
        self,
        job_id: str,
        graph: JobGraph,
        config: CheckpointConfig,
        tasks: TaskView,
        rng: random.Random,
        max_queued_requests: int = 16,
    ) -> None:
        _check_queue_bound(max_queued_requests)
        self.job_id = job_id
        self.graph = graph
        self.config = config
        self.tasks = tasks
        self.rng = rng
        self.max_queued_requests = max_queued_requests
        self.pending: dict[int, PendingCheckpoint] = {}
        self.completed: list[CompletedCheckpoint] = []  # retained checkpoints, ascending id
        self.savepoints: list[CompletedCheckpoint] = []
        self.queue: deque[TriggerRequest] = deque()
        self.triggering: TriggerRequest | None = None
        self.triggering_deadline_ms: int | None = None
        """When the preparation of ``triggering`` (id, storage) expires."""
        self._expired_triggers: list[TriggerRequest] = []
        """Requests whose preparation expired and has not answered yet (by identity)."""
        self.failure_manager = FailureManager(config.tolerable_failures)
        self.last_completion_ms: int | None = None
        self.next_periodic_ms: int | None = None
        self.shutdown = False
        self.stopping_with_savepoint = False
        self.job_failed = False
        self.highest_id = 0
        self._recently_ended: deque[int] = deque(maxlen=RECENT_CHECKPOINTS_REMEMBERED)
        self._referenced_paths: set[str] = set()
        self.ended_sources: set[ExecutionAttempt] = set()
        """Source subtasks of the running deployment that asked for the final checkpoint."""
        self.held: dict[ExecutionAttempt, TriggerRequest] = {}
        """Their requests while some source still runs: one checkpoint, triggered once every
        source ended, answers them all (``RequestCovered``)."""
        self.ending_since_ms: int | None = None
        """Since when every source ended its data while some task has not yet: checkpoints
        wait (at most the checkpoint timeout from then)."""
        self.data_ended = False
        """Every task of the running deployment ended its data."""

    # --- recovery --------------------------------------------------------------------------

    def restore_completed(
        self,
        completed: list[CompletedCheckpoint],
        savepoints: list[CompletedCheckpoint],
        *,
        highest_id: int = 0,
        job_ended: bool = False,
    ) -> None:
        """Load what Redis holds after a coordinator restart or a job resubmission.

        ``highest_id``: ids up to it were handed out already (pending checkpoints lost in a
        restart, a restored savepoint), so late acks for them are ``DISCARDED``.
        ``job_ended``: the job is terminal; the coordinator starts shut down.
        """
        self.completed = sorted(completed, key=lambda c: c.checkpoint_id)
        self.savepoints = sorted(savepoints, key=lambda c: c.checkpoint_id)
        ids = [c.checkpoint_id for c in self.completed + self.savepoints]
        self.highest_id = max(self.highest_id, highest_id, *ids)
        if self.completed:
            self.failure_manager.on_success(self.completed[-1].checkpoint_id)
        if job_ended:
            self.shutdown = True
            self.next_periodic_ms = None
        self._recompute_referenced()

    def on_deployment_started(self) -> None:
        """A new deployment chose its restore point: a coordinator shut down by a completed
        stop-with-savepoint accepts requests again (its pending checkpoints were aborted by
        ``on_tasks_not_running`` first)."""
        self.shutdown = False

    def on_savepoint_disposed(self, checkpoint_id: int) -> None:
        """The savepoint was disposed (its files and Redis record are gone): forget it."""
        self.savepoints = [s for s in self.savepoints if s.checkpoint_id != checkpoint_id]
        self._recompute_referenced()

    # --- queries ---------------------------------------------------------------------------

    def latest_completed(self) -> CompletedCheckpoint | None:
        return self.completed[-1] if self.completed else None

    def last_recorded_savepoint(self) -> CompletedCheckpoint | None:
        """The savepoint recorded last: the latest completion in this incarnation, else the
        highest id loaded at recovery (savepoints may complete out of id order)."""
        return self.savepoints[-1] if self.savepoints else None

    def find_snapshot(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        """The retained checkpoint or recorded savepoint with this id."""
        for c in self.completed + self.savepoints:
            if c.checkpoint_id == checkpoint_id:
                return c
        return None

    def retained_ids(self) -> list[int]:
        return [c.checkpoint_id for c in self.completed + self.savepoints]

    def is_pending(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self.pending

    def pending_count(self) -> int:
        return len(self.pending)

    def savepoint_dirs(self) -> list[str]:
        """Directories of recorded and pending savepoints: acks may hold state inside them."""
        return [s.external_path for s in self.savepoints] + [
            p.external_path for p in self.pending.values() if p.kind.is_savepoint
        ]

    def snapshot_dirs(self) -> list[str]:
        """Directories of retained checkpoints and recorded savepoints."""
        return [c.external_path for c in self.completed + self.savepoints]

    def choose_restore_point(self, plan: RestorePlan) -> RestoreDecision:
        """Where a new deployment restores from (see ``restore_point``)."""
        return choose_restore_point(plan, self.job_id, self.completed, self.savepoints)

    def next_deadline_ms(self) -> int | None:
        """The earliest time ``on_tick`` has something to do (None: nothing scheduled)."""
        deadlines = [p.deadline_ms for p in self.pending.values() if not p.finalizing]
        if self.next_periodic_ms is not None:
            deadlines.append(self.next_periodic_ms)
        if self.triggering_deadline_ms is not None:
            deadlines.append(self.triggering_deadline_ms)
        if self.ending_since_ms is not None and self.queue:
            deadlines.append(self.ending_since_ms + self.config.timeout_ms)
        return min(deadlines) if deadlines else None

    def is_triggering(self, request: TriggerRequest) -> bool:
        """The preparation of this very request (by identity) is under way and not expired."""
        return self.triggering is request

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests after each step)."""
        last_completed = self.completed[-1].checkpoint_id if self.completed else 0
        for cid, p in self.pending.items():
            assert cid == p.checkpoint_id
            assert cid <= self.highest_id
            assert not (p.not_yet_acknowledged & set(p.acknowledged)), "attempt both acked and not"
            assert not p.finalizing or not p.not_yet_acknowledged, "finalizing with missing acks"
            assert p.kind.is_savepoint or cid > last_completed, "pending older than completed"
        ids = [c.checkpoint_id for c in self.completed]
        assert ids == sorted(set(ids)), "completed not strictly ascending"
        assert len(self.completed) <= max(1, self.config.retained), "retention exceeded"
        assert len(self.queue) <= self.max_queued_requests
        tolerable = self.failure_manager.tolerable
        assert (
            self.job_failed
            or tolerable is None
            or self.failure_manager.consecutive_failures <= tolerable
        ), "failure count over the limit without failing the job"
        assert all(r is not self.triggering for r in self.queue)
        assert (self.triggering is None) == (self.triggering_deadline_ms is None)
        assert all(r is not self.triggering for r in self._expired_triggers)
        assert self.failure_manager.last_succeeded_id <= self.highest_id
        retained = self.retained_ids()
        assert len(retained) == len(set(retained)), "snapshot id recorded twice"
        assert all(i <= self.highest_id for i in retained), "snapshot id never handed out"
        assert self._referenced_paths == {
            path for c in self.completed + self.savepoints for path in c.state_paths()
        }, "protected paths out of date"
        assert not self.stopping_with_savepoint or all(r.kind.is_savepoint for r in self.queue), (
            "checkpoint queued behind a stop-with-savepoint"
        )
        assert not self.shutdown or self.next_periodic_ms is None, "periodic timer while shut down"
        assert all(k == r.input_ended for k, r in self.held.items()), "held under another source"
        assert set(self.held) <= self.ended_sources, "held request of a source not ended"
        assert all(r.input_ended is None for r in self.queue) or self._every_source_ended(), (
            "final-checkpoint request queued while a source still runs"
        )
        assert self.ending_since_ms is None or not self.data_ended, "ending and ended at once"

    # --- triggering ------------------------------------------------------------------------

    def request(self, request: TriggerRequest, now_ms: int) -> list[Action]:
        """A trigger request (periodic, manual, savepoint, stop-with-savepoint)."""
        refusal = self._refuse_outright(request)
        if refusal is not None:
            return [RequestRefused(request, refusal)]
        actions: list[Action] = []
        if request.input_ended is not None:
            if request.input_ended not in self.tasks.source_attempts():
                return [RequestRefused(request, TriggerRefusal.NOT_A_RUNNING_SOURCE)]
            self.ended_sources.add(request.input_ended)
            older = self.held.pop(request.input_ended, None)
            if older is not None:  # the source asked again (its call timed out, say)
                actions.append(RequestRefused(older, TriggerRefusal.ASKED_AGAIN))
            if not self._every_source_ended():
                # One final checkpoint for the job rather than one per source as it ends.
                self.held[request.input_ended] = request
                return actions
        # A full queue makes room by dropping its last request if that one is periodic (the new
        # request itself when it ranks last); a queue of user requests refuses the new one
        # (Flink's CheckpointRequestDecider).
        if len(self.queue) >= self.max_queued_requests and not self.queue[-1].periodic:
            return [RequestRefused(request, TriggerRefusal.TOO_MANY_CHECKPOINT_REQUESTS)]
        if request.kind.is_synchronous:
            self.stopping_with_savepoint = True
            self.next_periodic_ms = None
        # Savepoints go first, then manual checkpoints, then periodic ones (Flink's request
        # queue); within a class, in arrival order.
        rank = _queue_rank(request)
        position = next(
            (i for i, r in enumerate(self.queue) if _queue_rank(r) > rank), len(self.queue)
        )
        self.queue.insert(position, request)
        if len(self.queue) > self.max_queued_requests:
            actions.append(
                RequestRefused(self.queue.pop(), TriggerRefusal.TOO_MANY_CHECKPOINT_REQUESTS)
            )
        if request.kind.is_synchronous:
            # Checkpoints queued before a stop-with-savepoint would only be refused later.
            for queued in [r for r in self.queue if not r.kind.is_savepoint]:
                self.queue.remove(queued)
                actions.append(RequestRefused(queued, TriggerRefusal.STOP_WITH_SAVEPOINT_PENDING))
        return actions + self._start_next(now_ms)

    def _every_source_ended(self) -> bool:
        return set(self.tasks.source_attempts()) <= self.ended_sources

    def _take_held(self) -> list[TriggerRequest]:
        held = sorted(self.held.values(), key=lambda r: r.request_id)
        self.held.clear()
        return held

    def _refuse_waiting(self, refusal: TriggerRefusal) -> list[Action]:
        """Refuse every request still waiting: the queued ones in order, then the held ones."""
        waiting = [*self.queue, *self._take_held()]
        self.queue.clear()
        return [RequestRefused(r, refusal) for r in waiting]

    def _refuse_outright(self, request: TriggerRequest) -> TriggerRefusal | None:
        if self.shutdown or self.job_failed:
            return TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN
        if self.stopping_with_savepoint:
            return TriggerRefusal.STOP_WITH_SAVEPOINT_PENDING
        if not self.tasks.all_running():
            return TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING
        return None

    def is_forced(self, request: TriggerRequest) -> bool:
        """Forced past max concurrent: savepoints, unless unaligned checkpoints are on (Flink's
        ``forSavepoint(!unalignedCheckpointsEnabled, ...)``), which here means ``UNALIGNED`` and
        also ``ALIGNED`` with an aligned timeout (Flink's unaligned checkpoints with
        ``aligned-checkpoint-timeout``): the savepoint's barriers would abort the checkpoint in
        flight on every task, and that checkpoint may be unaligned already."""
        unaligned_enabled = (
            self.config.mode is CheckpointMode.UNALIGNED
            or self.config.aligned_checkpoint_timeout_ms > 0
        )
        return request.kind.is_savepoint and not unaligned_enabled

    def _start_next(self, now_ms: int) -> list[Action]:
        """Flink's ``chooseRequestToExecute``, looped: the head of the queue starts, waits, or
        (periodic only, during the minimum pause) is dropped and the timer rescheduled."""
        actions: list[Action] = []
        while self.queue and self.triggering is None:
            request = self.queue[0]
            refusal = None
            if not self.tasks.all_running():
                refusal = TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING
            elif self._waits_for_end_of_data(request, now_ms):
                if not request.periodic:
                    break  # stays queued until every task ended its data (on_task_data_ended)
                refusal = TriggerRefusal.TASKS_ENDING_INPUT
            elif len(self.pending) >= self.config.max_concurrent and not self.is_forced(request):
                break  # stays queued until a pending checkpoint ends
            elif request.periodic and self._in_min_pause(now_ms):
                # Manual checkpoints and savepoints ignore the minimum pause, as in Flink.
                refusal = TriggerRefusal.MINIMUM_TIME_BETWEEN_CHECKPOINTS
                assert self.last_completion_ms is not None
                self.next_periodic_ms = self.last_completion_ms + self.config.min_pause_ms
            self.queue.popleft()
            if refusal is not None:
                actions.append(RequestRefused(request, refusal))
                continue
            self.triggering = request
            self.triggering_deadline_ms = now_ms + self.config.timeout_ms
            actions.append(AllocateCheckpointId(request))
        return actions

    def _waits_for_end_of_data(self, request: TriggerRequest, now_ms: int) -> bool:
        """Every source ended and some task is still ending its input: a checkpoint now would
        only wait behind it. Savepoints are not held (a user asked for exactly this point)."""
        return (
            self.ending_since_ms is not None
            and not request.kind.is_savepoint
            and now_ms < self.ending_since_ms + self.config.timeout_ms
        )

    def on_task_data_ended(self, now_ms: int) -> list[Action]:
        """A task of the running deployment reported the end of its data (FLIP-147's end of
        input: its ``end_input`` output and end of data went downstream)."""
        if self.data_ended or not self.tasks.every_source_data_ended():
            return []
        if not self.tasks.all_data_ended():
            if self.ending_since_ms is None:
                self.ending_since_ms = now_ms
            return []
        self.ending_since_ms = None
        self.data_ended = True
        if self.next_periodic_ms is not None:
            # The final checkpoint now: nothing is left to wait for, and the job ends sooner.
            self.next_periodic_ms = min(self.next_periodic_ms, now_ms)
        return self.on_tick(now_ms)

    def _in_min_pause(self, now_ms: int) -> bool:
        return (
            self.config.min_pause_ms > 0
            and self.last_completion_ms is not None
            and now_ms < self.last_completion_ms + self.config.min_pause_ms
        )

    def _take_triggering(self, request: TriggerRequest) -> bool:
        """End the preparation of ``request``: True if it was triggering, False if it had
        expired (its late answer); anything else is a bug of the caller."""
        if self.triggering is request:
            self.triggering = None
            self.triggering_deadline_ms = None
            return True
        for i, expired in enumerate(self._expired_triggers):
            if expired is request:
                del self._expired_triggers[i]
                return False
        raise ValueError(f"no trigger preparation under way for {request}")

    def on_checkpoint_id(
        self, request: TriggerRequest, checkpoint_id: int, external_path: str, now_ms: int
    ) -> list[Action]:
        """The shell allocated an id (Redis INCR) for the request being triggered."""
        if checkpoint_id < 1:
            raise ValueError(f"checkpoint ids start at 1 (as in Flink), not {checkpoint_id}")
        if not self._take_triggering(request):
            # Expired while preparing: the id is burnt, and no trigger is ever sent.
            self.highest_id = max(self.highest_id, checkpoint_id)
            self._recently_ended.append(checkpoint_id)
            return []
        if checkpoint_id <= self.highest_id:
            raise ValueError(
                f"checkpoint ids must strictly increase: {checkpoint_id} after {self.highest_id}"
            )
        self.highest_id = checkpoint_id
        refusal = None
        if self.shutdown or self.job_failed:
            refusal = TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN
        elif self.stopping_with_savepoint and not request.kind.is_synchronous:
            refusal = TriggerRefusal.STOP_WITH_SAVEPOINT_PENDING
        elif not self.tasks.all_running():
            refusal = TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING
        if refusal is not None:
            self._recently_ended.append(checkpoint_id)
            if request.kind.is_synchronous:
                self.stopping_with_savepoint = False
                self._schedule_periodic(now_ms)
            return [RequestRefused(request, refusal), *self._start_next(now_ms)]
        attempts = self.tasks.current_attempts()
        pending = PendingCheckpoint(
            checkpoint_id=checkpoint_id,
            request=request,
            trigger_timestamp_ms=now_ms,
            deadline_ms=now_ms + self.config.timeout_ms,
            external_path=external_path,
            not_yet_acknowledged=set(attempts),
        )
        self.pending[checkpoint_id] = pending
        options = self._barrier_options(request.kind, external_path)
        actions: list[Action] = [
            CheckpointTriggered(checkpoint_id, request, now_ms, external_path, tuple(attempts)),
            SendTrigger(checkpoint_id, now_ms, options, tuple(self.tasks.source_attempts())),
        ]
        actions.extend(self._start_next(now_ms))
        return actions

    def on_checkpoint_id_failed(
        self, request: TriggerRequest, now_ms: int, count_failure: bool = True
    ) -> list[Action]:
        """Allocating an id or preparing the storage failed (Redis down, I/O error): the request
        fails with ``IO_EXCEPTION``, counted for checkpoints as in Flink (``count_failure``
        False: the coordinator was fenced, which is no failure of the checkpoint)."""
        if not self._take_triggering(request):
            return []  # it had expired already, and was reported then
        return self._trigger_failed(request, TriggerRefusal.IO_EXCEPTION, now_ms, count_failure)

    def _trigger_failed(
        self, request: TriggerRequest, refusal: TriggerRefusal, now_ms: int, count_failure: bool
    ) -> list[Action]:
        if request.kind.is_synchronous:
            self.stopping_with_savepoint = False
            self._schedule_periodic(now_ms)
        actions: list[Action] = [RequestRefused(request, refusal)]
        if count_failure and self.failure_manager.on_failure(None, request.kind, refusal):
            actions.extend(self._fail_job(f"trigger {refusal.name}: {refusal.value}", now_ms))
        return actions + self._start_next(now_ms)

    def _expire_triggering(self, now_ms: int) -> list[Action]:
        """The preparation did not answer within the checkpoint timeout (Flink expires a
        checkpoint whose storage preparation hangs the same way)."""
        request = self.triggering
        assert request is not None
        self.triggering = None
        self.triggering_deadline_ms = None
        self._expired_triggers.append(request)
        return self._trigger_failed(request, TriggerRefusal.CHECKPOINT_EXPIRED, now_ms, True)

    def _barrier_options(self, kind: CheckpointKind, location: str) -> BarrierOptions:
        mode = self.config.mode
        timeout = self.config.aligned_checkpoint_timeout_ms
        if kind.is_savepoint and mode is CheckpointMode.UNALIGNED:
            mode, timeout = CheckpointMode.ALIGNED, 0  # savepoints are always aligned (Flink)
        if kind.is_savepoint:
            timeout = 0
        return BarrierOptions(
            kind, mode, timeout, location, self.config.inline_state_threshold_bytes
        )

    # --- periodic scheduling and time ------------------------------------------------------

    def on_tasks_running(self, now_ms: int) -> list[Action]:
        """Every task runs: start the periodic scheduler with a random first delay."""
        if self.config.interval_ms > 0 and not self.shutdown and not self.stopping_with_savepoint:
            # Flink's getRandomInitDelay: uniform in [min pause, base interval].
            low = self.config.min_pause_ms
            self.next_periodic_ms = now_ms + self.rng.randint(low, self._base_interval())
        return self._start_next(now_ms)

    def _schedule_periodic(self, now_ms: int) -> None:
        if self.config.interval_ms > 0 and not self.shutdown and self.tasks.all_running():
            self.next_periodic_ms = now_ms + self._base_interval()

    def _base_interval(self) -> int:
        """Flink's ``baseInterval``: the period, never shorter than the minimum pause."""
        return max(self.config.interval_ms, self.config.min_pause_ms)

    def on_tick(self, now_ms: int) -> list[Action]:
        actions: list[Action] = []
        for p in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            if p.checkpoint_id in self.pending and not p.finalizing and now_ms >= p.deadline_ms:
                actions.extend(
                    self._abort(
                        p, AbortReason.EXPIRED, f"expired after {self.config.timeout_ms} ms", now_ms
                    )
                )
        if self.triggering_deadline_ms is not None and now_ms >= self.triggering_deadline_ms:
            actions.extend(self._expire_triggering(now_ms))
        if self.next_periodic_ms is not None and now_ms >= self.next_periodic_ms:
            # Fixed rate from the scheduled time, as Flink's timer; periods that a late tick
            # missed are skipped rather than fired back to back.
            period = self._base_interval()
            missed = (now_ms - self.next_periodic_ms) // period
            self.next_periodic_ms += (missed + 1) * period
            actions.extend(
                self.request(TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True), now_ms)
            )
        actions.extend(self._start_next(now_ms))
        return actions

    def on_tasks_not_running(self, now_ms: int, message: str) -> list[Action]:
        """A task failed or the deployment changed: abort everything pending (Flink's failover)."""
        self.next_periodic_ms = None
        actions: list[Action] = []
        for p in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            if p.checkpoint_id in self.pending and not p.finalizing:
                actions.extend(self._abort(p, AbortReason.TASK_FAILURE, message, now_ms))
        actions.extend(self._refuse_waiting(TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING))
        self.ended_sources.clear()  # the next deployment's sources ask again as their input ends
        self.ending_since_ms = None
        self.data_ended = False
        if self.stopping_with_savepoint and not any(
            p.kind.is_synchronous for p in self.pending.values()
        ):
            self.stopping_with_savepoint = False
        return actions

    def shut_down(self, reason: AbortReason, now_ms: int) -> list[Action]:
        """Job canceled, failed or coordinator stopping: abort everything, refuse all requests."""
        self.shutdown = True
        self.next_periodic_ms = None
        actions: list[Action] = []
        for p in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            if not p.finalizing:  # fully acknowledged checkpoints still complete
                actions.extend(self._abort(p, reason, reason.value, now_ms, count_failure=False))
        actions.extend(self._refuse_waiting(TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN))
        return actions

    # --- acks and declines -----------------------------------------------------------------

    def on_ack(
        self,
        attempt: ExecutionAttempt,
        checkpoint_id: int,
        operator_states: tuple[OperatorSubtaskState, ...],
        metrics: SubtaskMetrics,
        now_ms: int,
        input_ended: bool = False,
        held_ms: int = 0,
    ) -> tuple[AckResult, list[Action]]:
        """``held_ms``: how long the agent held the ack (for its other subtasks' acks); the
        ack's time is its arrival minus that, never before the trigger. Completion is at
        ``now_ms``, when the last ack arrived."""
        # the files to discard if the ack is not taken (inline state has none)
        paths = [h.path for s in operator_states for h in s.handles if not h.is_inline]
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            completed = self.find_snapshot(checkpoint_id)
            if completed is not None and any(
                a.attempt == attempt for a in completed.subtask_states
            ):
                return AckResult.DUPLICATE, self._discard(
                    paths, "duplicate ack of a completed checkpoint"
                )
            if (
                completed is not None
                or checkpoint_id in self._recently_ended
                or (0 < checkpoint_id <= self.highest_id)
            ):
                return AckResult.DISCARDED, self._discard(paths, "late ack for an ended checkpoint")
            return AckResult.UNKNOWN, self._discard(paths, "ack for an unknown checkpoint")
        if attempt in pending.acknowledged:
            first = {
                h.path for s in pending.acknowledged[attempt].operator_states for h in s.handles
            }
            return AckResult.DUPLICATE, self._discard(
                [p for p in paths if p not in first], "duplicate ack"
            )
        if attempt not in pending.not_yet_acknowledged:
            return AckResult.UNKNOWN, self._discard(paths, f"ack from unexpected attempt {attempt}")
        acked_ms = max(pending.trigger_timestamp_ms, now_ms - held_ms)
        ack = SubtaskAck(attempt, acked_ms, operator_states, metrics, input_ended)
        pending.not_yet_acknowledged.discard(attempt)
        pending.acknowledged[attempt] = ack
        actions: list[Action] = [SubtaskAcknowledged(checkpoint_id, ack)]
        if not pending.not_yet_acknowledged:
            pending.finalizing = True
            actions.append(
                FinalizeCheckpoint(self._completed_candidate(pending, now_ms), self.config.retained)
            )
        return AckResult.SUCCESS, actions

    def on_decline(
        self,
        attempt: ExecutionAttempt,
        checkpoint_id: int,
        message: str,
        now_ms: int,
        reason: DeclineReason = DeclineReason.UNSPECIFIED,
    ) -> list[Action]:
        """A task declined: the checkpoint aborts (if it is pending and the attempt expected)
        with the reason of ``abort_reason_for_decline``. No actions: the decline was ignored."""
        pending = self.pending.get(checkpoint_id)
        if pending is None or pending.finalizing:
            return []
        if attempt not in pending.not_yet_acknowledged and attempt not in pending.acknowledged:
            return []
        actions = self._abort(
            pending,
            abort_reason_for_decline(reason),
            f"declined by {attempt}: {message}",
            now_ms,
            declined_by_task=True,
        )
        return actions + self._start_next(now_ms)

    def _completed_candidate(self, p: PendingCheckpoint, now_ms: int) -> CompletedCheckpoint:
        return CompletedCheckpoint(
            job_id=self.job_id,
            checkpoint_id=p.checkpoint_id,
            kind=p.kind,
            trigger_timestamp_ms=p.trigger_timestamp_ms,
            completion_timestamp_ms=now_ms,
            external_path=p.external_path,
            subtask_states=tuple(p.acknowledged[a] for a in sorted(p.acknowledged)),
            vertex_parallelism={v.vertex_id: v.parallelism for v in self.graph.vertices},
            vertex_max_parallelism={v.vertex_id: v.max_parallelism for v in self.graph.vertices},
        )

    # --- completion ------------------------------------------------------------------------

    def on_checkpoint_committed(
        self, checkpoint: CompletedCheckpoint, dropped_ids: list[int], now_ms: int
    ) -> list[Action]:
        """``_metadata`` is written and the Redis commit succeeded (dropped: trimmed by retention)."""
        pending = self.pending.pop(checkpoint.checkpoint_id)
        assert pending.finalizing
        self._recently_ended.append(checkpoint.checkpoint_id)
        actions: list[Action] = []
        if checkpoint.kind.is_savepoint:
            self.savepoints.append(checkpoint)
        else:
            self.completed = [c for c in self.completed if c.checkpoint_id not in dropped_ids]
            self.completed.append(checkpoint)
            self.completed.sort(key=lambda c: c.checkpoint_id)
        # Savepoints too, as in Flink: the minimum pause counts from them, and their success
        # clears the failure count.
        self.last_completion_ms = now_ms
        self.failure_manager.on_success(checkpoint.checkpoint_id)
        self._recompute_referenced()
        # Older pending checkpoints are subsumed by a checkpoint or a stop-with-savepoint, not
        # by an intermediate savepoint (Flink 1.15+); savepoints are never subsumed.
        subsumes = checkpoint.kind is CheckpointKind.CHECKPOINT or checkpoint.kind.is_synchronous
        for older in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
            if (
                subsumes
                and older.checkpoint_id < checkpoint.checkpoint_id
                and not older.kind.is_savepoint
            ):
                actions.extend(
                    self._abort(
                        older,
                        AbortReason.SUBSUMED,
                        f"subsumed by checkpoint {checkpoint.checkpoint_id}",
                        now_ms,
                    )
                )
        actions.append(CheckpointCompleted(checkpoint, pending.request, tuple(dropped_ids)))
        final = self._is_final(checkpoint)
        # Intermediate savepoints do not commit side effects (Flink 1.15+): only checkpoints and
        # stop-with-savepoint notify the tasks.
        if checkpoint.kind is CheckpointKind.CHECKPOINT or checkpoint.kind.is_synchronous:
            if final or checkpoint.kind.is_synchronous:
                actions.append(
                    EndCommitted(checkpoint.checkpoint_id, tuple(sorted(pending.acknowledged)))
                )
            actions.append(
                NotifyComplete(
                    checkpoint.checkpoint_id, tuple(sorted(pending.acknowledged)), final=final
                )
            )
        if dropped_ids:
            actions.append(DeleteCompleted(tuple(dropped_ids)))
        if checkpoint.kind.is_synchronous:
            self.shutdown = True  # the job ends; its tasks finish after the notification
            self.next_periodic_ms = None
            actions.extend(self._refuse_waiting(TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN))
        elif final and checkpoint.kind is CheckpointKind.CHECKPOINT:
            # Every source had ended: the tasks end once notified, so a request queued or held
            # meanwhile (a user's, the sources' asking for the final checkpoint of a job without
            # periodic checkpoints) would only be aborted when they do. This one covers them.
            while self.queue:
                actions.append(
                    RequestRefused(self.queue.popleft(), TriggerRefusal.FINAL_CHECKPOINT_COMPLETED)
                )
            actions.extend(RequestCovered(r, checkpoint) for r in self._take_held())
        else:
            actions.extend(self._start_next(now_ms))
        return actions

    def _is_final(self, checkpoint: CompletedCheckpoint) -> bool:
        """Every source subtask had reached the end of its input (bounded job, FLIP-147 style:
        the tasks keep checkpointing after their input ended, and end after this one)."""
        sources = {v.vertex_id for v in self.graph.vertices if v.is_source}
        acks = [a for a in checkpoint.subtask_states if a.attempt.vertex_id in sources]
        return bool(acks) and all(a.input_ended for a in acks)

    def on_finalize_failed(self, checkpoint_id: int, message: str, now_ms: int) -> list[Action]:
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return []
        return self._abort(pending, AbortReason.FINALIZE_FAILED, message, now_ms) + (
            self._start_next(now_ms)
        )

    # --- aborting --------------------------------------------------------------------------

    def _abort(
        self,
        p: PendingCheckpoint,
        reason: AbortReason,
        message: str,
        now_ms: int,
        count_failure: bool = True,
        declined_by_task: bool = False,
    ) -> list[Action]:
        del self.pending[p.checkpoint_id]
        self._recently_ended.append(p.checkpoint_id)
        discarded = tuple(path for path in p.acked_paths() if path not in self._referenced_paths)
        actions: list[Action] = [
            CheckpointAborted(
                checkpoint_id=p.checkpoint_id,
                request=p.request,
                reason=reason,
                message=message,
                timestamp_ms=now_ms,
                trigger_timestamp_ms=p.trigger_timestamp_ms,
                external_path=p.external_path,
                discarded_paths=discarded,
            ),
            NotifyAborted(
                p.checkpoint_id,
                tuple(sorted(p.acknowledged.keys() | p.not_yet_acknowledged)),
                reason,
            ),
        ]
        if p.kind.is_synchronous:
            # A failed stop-with-savepoint leaves the job running; resume periodic checkpoints.
            self.stopping_with_savepoint = False
            self._schedule_periodic(now_ms)
        if count_failure and self.failure_manager.on_failure(
            p.checkpoint_id, p.kind, reason, declined_by_task
        ):
            actions.extend(
                self._fail_job(f"checkpoint {p.checkpoint_id} {reason.name}: {message}", now_ms)
            )
        return actions

    def _fail_job(self, last: str, now_ms: int) -> list[Action]:
        """The failure manager's threshold was exceeded: fail the job, abort the rest."""
        self.job_failed = True
        self.shutdown = True
        self.next_periodic_ms = None
        fm = self.failure_manager
        actions: list[Action] = [
            FailJob(
                f"exceeded checkpoint tolerable failure threshold: {fm.consecutive_failures} "
                f"consecutive failures > {fm.tolerable} tolerable (last: {last})"
            )
        ]
        for other in sorted(self.pending.values(), key=lambda q: q.checkpoint_id):
            if other.finalizing:
                continue
            actions.extend(
                self._abort(
                    other, AbortReason.JOB_CANCELED, "job failed", now_ms, count_failure=False
                )
            )
        actions.extend(self._refuse_waiting(TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN))
        return actions

    # --- helpers ---------------------------------------------------------------------------

    def _discard(self, paths: list[str], why: str) -> list[Action]:
        keep = [p for p in paths if p not in self._referenced_paths]
        return [DiscardState(tuple(keep), why)] if keep else []

    def _recompute_referenced(self) -> None:
        self._referenced_paths = {
            path for c in self.completed + self.savepoints for path in c.state_paths()
        }

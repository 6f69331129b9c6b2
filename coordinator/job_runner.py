"""The I/O shell of one job: ``JobRunner`` feeds events into the pure cores and executes the
actions they return.

* ``JobExecution`` (tasks, deployments, job state) and ``CheckpointCoordinator`` (triggers,
  acks, completion, failure manager) decide; nothing here writes their state;
* bookkeeping actions (statistics, logs, metrics, watch events, waiting callers) run inline;
* ordered I/O (Redis, ``_metadata``, storage clean-up) goes to ``CheckpointIo`` as typed
  operations, and its outcomes come back as events of the core;
* RPCs to worker agents go through ``AgentGateway`` (``Agents``, the seam unit tests replace);
  API views come from ``JobViews``;
* the parts with a loop or a table of their own: agent liveness (``LivenessMonitor``), orphan
  sweep scheduling (``OrphanSweeper``), the requests of users and their waiting callers
  (``CheckpointRequests``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar, assert_never

import structlog

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator.agent_gateway import AgentClients, AgentGateway, ByAddress, TriggerFailed
from snapflow.coordinator.checkpoint_coordinator import (
    Action,
    AllocateCheckpointId,
    BarrierOptions,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointCoordinator,
    CheckpointTriggered,
    DeclineReason,
    DeleteCompleted,
    DiscardState,
    EndCommitted,
    FailJob,
    FinalizeCheckpoint,
    NotifyAborted,
    NotifyComplete,
    RequestCovered,
    RequestRefused,
    SendTrigger,
    SubtaskAcknowledged,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_io import (
    AllocateId,
    CheckpointIo,
    CleanUpAborted,
    CommitTimings,
    DeleteRetired,
    DeleteUnused,
    DiscardFiles,
    DisposeSavepoint,
    Finalize,
    SendTriggerRpc,
)
from snapflow.coordinator.checkpoint_requests import CheckpointRequests
from snapflow.coordinator.checkpoint_stats import CheckpointStatsTracker
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.config import CoordinatorSettings
from snapflow.coordinator.execution import JobExecution
from snapflow.coordinator.job_views import JobViews
from snapflow.coordinator.liveness import LivenessMonitor
from snapflow.coordinator.metrics import CoordinatorMetrics
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobRecord,
    JobState,
    OperatorSubtaskState,
    SubtaskMetrics,
    TaskKey,
    TriggerRefusal,
)
from snapflow.coordinator.orphan_sweep import OrphanSweeper
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.restore_point import (
    FreshStart,
    RestoreFromPath,
    RestoreFromSnapshot,
    RestorePlan,
    RestorePoint,
)
from snapflow.coordinator.savepoint_operations import SavepointOperation
from snapflow.coordinator.task_metrics_table import TaskMetricsTable
from snapflow.coordinator.watch import JobWatch
from snapflow.errors import (
    CheckpointFailedError,
    CheckpointRefusedError,
    FailedPreconditionError,
    StaleEpochError,
)
from snapflow.jobgraph import TaskState
from snapflow.task_metrics import TaskMetrics
from snapflow.v1 import coordinator_pb2 as cpb

log = structlog.get_logger("snapflow.coordinator")

T = TypeVar("T")

HELD_WARNING_EVERY_MS = 30_000
"""How long checkpoints are held for the end of data before a warning names what they wait
for, and how often it repeats."""


class JobHost(Protocol):
    """What a runner needs from the coordinator that hosts it (``JobManager``)."""

    settings: CoordinatorSettings
    store: CheckpointStore
    metrics: CoordinatorMetrics
    clock: Callable[[], int]
    rng: random.Random
    workers: AgentClients
    epoch: int
    fenced: bool

    def storage_for(self, config: CheckpointConfig) -> CheckpointStorage: ...

    def check_not_fenced(self) -> None: ...

    def on_fenced(self, error: StaleEpochError) -> None: ...

    async def guard(self, awaitable: Awaitable[T]) -> T: ...

    def in_progress_count(self) -> int: ...

    def refresh_job_gauges(self) -> None: ...


class Agents(Protocol):
    """The RPCs a runner sends to the agents hosting its tasks (``AgentGateway``)."""

    def trigger(
        self, by_address: ByAddress, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions
    ) -> None: ...

    def notify(
        self,
        by_address: ByAddress,
        checkpoint_id: int,
        complete: bool,
        reason: str = "",
        final: bool = False,
    ) -> None: ...

    def cancel(self, by_address: ByAddress) -> None: ...

    def close(self) -> None: ...


#: Builds a runner's ``Agents``: (job id, clients, current epoch, on trigger failed, log).
AgentsFactory = Callable[[str, AgentClients, Callable[[], int], TriggerFailed, Any], Agents]


def restore_plan(record: JobRecord) -> RestorePlan:
    return RestorePlan(
        run_start_checkpoint_id=record.run_start_checkpoint_id,
        savepoint_path=record.restore_savepoint_path,
        checkpoint_id=record.restore_checkpoint_id,
        latest=record.restore_latest,
    )


class JobRunner:
    """Everything the coordinator does for one job: the shell around its two cores."""

    def __init__(
        self,
        host: JobHost,
        record: JobRecord,
        completed: list[CompletedCheckpoint],
        savepoints: list[CompletedCheckpoint],
        highest_id: int = 0,
        *,
        agents: AgentsFactory = AgentGateway,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``highest_id``: checkpoint ids up to it were handed out already (pending checkpoints
        lost in a coordinator restart, the snapshot a new job starts from). ``agents``: the RPCs
        to the agents; ``monotonic``: the clock of the heartbeats (both replaced by tests)."""
        self.manager = host
        self.record = record
        self.job_id = record.job_id
        self.storage = host.storage_for(record.checkpoint_config)
        self.execution = JobExecution(
            record.graph,
            record.state,
            deployment=record.deployment,
            restarts=record.restarts,
            failure=record.failure,
        )
        self.core = CheckpointCoordinator(
            self.job_id,
            record.graph,
            record.checkpoint_config,
            self.execution,
            host.rng,
            host.settings.max_queued_trigger_requests,
        )
        # A resubmission's ids up to run_start_checkpoint_id were handed out already.
        self.core.restore_completed(
            completed,
            savepoints,
            highest_id=max(highest_id, record.run_start_checkpoint_id),
            job_ended=record.state.is_terminal,
        )
        self.stats = CheckpointStatsTracker(host.settings.history_size)
        self.task_metrics = TaskMetricsTable()
        self.views = JobViews(self.job_id, self.execution, self.core, self.stats, self.task_metrics)
        self.restore_point: RestorePoint | None = None
        self._log = log.bind(job_id=self.job_id)
        self.watchers = JobWatch(self.job_id, host.clock)
        self.agents = agents(
            self.job_id, host.workers, lambda: host.epoch, self._trigger_failed, self._log
        )
        self.io = CheckpointIo(
            self.job_id, host.store, self.storage, self, host, self._log, clock=host.clock
        )
        self.liveness = LivenessMonitor(
            self.execution, host.settings, self.update_task_state, self._log, monotonic
        )
        self.sweeps = OrphanSweeper(self.io, host.settings, host)
        self.requests = CheckpointRequests(
            self.job_id, host.check_not_fenced, self._request, lambda: self.execution.state
        )
        self._allocation_errors: dict[int, str] = {}
        self._held_warned_ms = -HELD_WARNING_EVERY_MS
        self._finalize_timings: dict[int, CommitTimings] = {}
        self._retiring: dict[int, CompletedCheckpoint] = {}
        """Checkpoints retention dropped, until their ``DeleteRetired`` is queued."""
        self._wake = asyncio.Event()
        self._register_lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._timer_loop(), name=f"timer-{self.job_id}"),
            asyncio.create_task(self.io.run(), name=f"io-{self.job_id}"),
            asyncio.create_task(
                self.liveness.run(lambda: self._closed or self.manager.fenced),
                name=f"heartbeats-{self.job_id}",
            ),
            asyncio.create_task(self.sweeps.run(), name=f"sweep-{self.job_id}"),
        ]

    async def sweep_orphans(self) -> list[int]:
        """One bounded, fenced orphan sweep now (at recovery, before the runner starts)."""
        return await self.sweeps.sweep_now()

    async def close(self, reason: AbortReason = AbortReason.COORDINATOR_SHUTDOWN) -> None:
        if self._closed:
            return
        self._process(self.core.shut_down(reason, self.manager.clock()))
        self._closed = True
        self.sweeps.close()
        self._wake.set()
        if not self.manager.fenced:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.manager.settings.shutdown_grace_s):
                    await self.io.join()  # let the clean-up of aborted checkpoints finish
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.io.stop()  # a disposal still queued is refused, not left waiting
        for task in list(self._background):
            task.cancel()
        self.agents.close()
        self.watchers.close()

    # --- views -------------------------------------------------------------------------------

    def job_info(self, include_payloads: bool = False) -> cpb.JobInfo:
        return self.views.job_info(self.record, include_payloads)

    def task_infos(self) -> list[cpb.TaskInfo]:
        return self.views.task_infos()

    def summary_pb(self, checkpoint_id: int) -> cpb.CheckpointSummary:
        return self.views.summary(checkpoint_id)

    def summary_of_completed(self, cp: CompletedCheckpoint) -> cpb.CheckpointSummary:
        return self.views.summary_of_completed(cp)

    def stats_pb(self, history_size: int) -> cpb.CheckpointStats:
        return self.views.checkpoint_stats(history_size)

    def details_pb(self, checkpoint_id: int) -> cpb.CheckpointDetails:
        return self.views.details(checkpoint_id)

    def watch(self) -> AsyncIterator[cpb.JobEvent]:
        return self.watchers.stream(lambda: self.execution.state)

    # --- task lifecycle ----------------------------------------------------------------------

    async def register_task(
        self, key: TaskKey, address: str, launch: int = 0
    ) -> tuple[ExecutionAttempt, RestorePoint | None]:
        async with self._register_lock:
            self.manager.check_not_fenced()
            registration = self.execution.register(key, address, launch)
            if registration.new_deployment:
                self.liveness.deployment_started()
                now = self.manager.clock()
                self._process(self.core.on_tasks_not_running(now, "the job is being redeployed"))
                self.restore_point = await self._resolve_restore_point()
                self.core.on_deployment_started()
                await self._persist_record()
                if self.restore_point is not None:
                    cp = self.restore_point.checkpoint
                    self.stats.on_restored(
                        cp.checkpoint_id, now, self.restore_point.is_savepoint, cp.external_path
                    )
                    self._log.info(
                        "job.restored",
                        checkpoint_id=cp.checkpoint_id,
                        path=cp.external_path,
                        savepoint=self.restore_point.is_savepoint,
                        deployment=self.execution.deployment,
                    )
                self.watchers.state_changed(
                    self.execution.state, f"deployment {self.execution.deployment} started"
                )
            self.liveness.task_registered(address)
            self._log.debug("task.registered", task=str(registration.attempt), address=address)
            return registration.attempt, self.restore_point

    async def _resolve_restore_point(self) -> RestorePoint | None:
        """Execute the core's restore decision (a path needs its ``_metadata`` read)."""
        decision = self.core.choose_restore_point(restore_plan(self.record))
        match decision:
            case RestoreFromSnapshot(checkpoint=checkpoint):
                return RestorePoint.of(checkpoint)
            case RestoreFromPath(path=path):
                return RestorePoint.of(await asyncio.to_thread(self.storage.read_metadata, path))
            case FreshStart():
                return None
            case _:
                assert_never(decision)

    async def update_task_state(
        self, attempt: ExecutionAttempt, state: TaskState, failure: str, data_ended: bool = False
    ) -> None:
        self.manager.check_not_fenced()
        before = self.execution.state
        transition = self.execution.update(attempt, state, failure, data_ended=data_ended)
        if before.is_terminal:
            return  # tasks confirming a cancel of a job that already ended
        now = self.manager.clock()
        if data_ended and transition.job_state_after is JobState.RUNNING:
            self._log.debug("task.data_ended", task=str(attempt))
            self._process(self.core.on_task_data_ended(now))
        to_cancel: list[ExecutionAttempt] = []
        if state in (TaskState.FAILED, TaskState.CANCELED):
            # The first failure of a deployment fails it over; later reports (tasks confirming
            # the cancel) only update their task.
            first = before is not JobState.RESTARTING
            if first or state is TaskState.FAILED:
                self.manager.metrics.record_task_failure()
                self._log.warning(
                    "task.failed", task=str(attempt), state=state.value, failure=failure
                )
                self.watchers.task_failed(attempt, failure)
            self._process(
                self.core.on_tasks_not_running(now, f"task {attempt} {state.value}: {failure}")
            )
            if first:
                to_cancel = [a for a in self.execution.current_attempts() if a != attempt]
        elif state is TaskState.FINISHED and transition.job_state_after is not JobState.FINISHED:
            self._process(self.core.on_tasks_not_running(now, f"task {attempt} finished"))
        if transition.job_state_after is not transition.job_state_before:
            after = transition.job_state_after
            if after is JobState.RUNNING:
                self._process(self.core.on_tasks_running(now))
            elif after is JobState.FINISHED:
                self._process(self.core.shut_down(AbortReason.JOB_FINISHED, now))
            elif after is JobState.FAILED:  # every task finished, their output uncommitted
                self._log.error("job.failed", failure=self.execution.failure)
                self._process(self.core.shut_down(AbortReason.JOB_FAILED, now))
            self._log.info(
                "job.state_changed", state=after.value, previous=transition.job_state_before.value
            )
            why = self.execution.failure if after is JobState.FAILED else ""
            self.watchers.state_changed(after, why or f"task {attempt} {state.value}")
            # Persisted before any task is cancelled: a superseded incarnation fails here.
            await self._persist_record()
            self.manager.refresh_job_gauges()
        self.agents.cancel(self.execution.group_by_address(to_cancel))

    def heartbeat(
        self,
        address: str,
        attempts: list[ExecutionAttempt],
        metrics: Sequence[tuple[ExecutionAttempt, TaskMetrics]] = (),
    ) -> bool:
        """An agent's heartbeat; whether every attempt it names is current and live here.
        The task metrics it carries are kept when so (of the attempts it names)."""
        self.manager.check_not_fenced()
        current = self.liveness.heartbeat(address, attempts)
        if current:
            named, now_ms = set(attempts), self.manager.clock()
            for attempt, m in metrics:
                if attempt in named:
                    self.task_metrics.record(attempt, m, now_ms)
        return current

    # --- job end -----------------------------------------------------------------------------

    async def cancel(self) -> None:
        self.manager.check_not_fenced()
        if self.execution.state.is_terminal:
            raise FailedPreconditionError(
                f"job {self.job_id} is already {self.execution.state.value}"
            )
        await self._end(JobState.CANCELED, "", AbortReason.JOB_CANCELED)

    async def _end(self, state: JobState, failure: str, reason: AbortReason) -> None:
        self._process(self.core.shut_down(reason, self.manager.clock()))
        attempts = self.execution.current_attempts()
        self.execution.end(state, failure)
        self._log.info("job.state_changed", state=state.value, failure=failure)
        self.watchers.state_changed(state, failure)
        # Persist first: a fenced (superseded) incarnation fails here and must not cancel tasks
        # that the current coordinator owns.
        await self._persist_record()
        if state is not JobState.FINISHED:
            self.agents.cancel(self.execution.group_by_address(attempts))
        self.manager.refresh_job_gauges()

    async def _persist_record(self) -> None:
        self.record = replace(
            self.record,
            state=self.execution.state,
            restarts=self.execution.restarts,
            failure=self.execution.failure,
            deployment=self.execution.deployment,
        )
        await self.manager.guard(self.manager.store.update_job(self.record))

    # --- checkpoints from tasks --------------------------------------------------------------

    def acknowledge(
        self,
        attempt: ExecutionAttempt,
        checkpoint_id: int,
        states: tuple[OperatorSubtaskState, ...],
        metrics: SubtaskMetrics,
        input_ended: bool = False,
        held_ms: int = 0,
    ) -> AckResult:
        """``held_ms``: how long the agent held the ack before sending it (validated >= 0)."""
        self.manager.check_not_fenced()
        self._validate_paths(states)
        result, actions = self.core.on_ack(
            attempt, checkpoint_id, states, metrics, self.manager.clock(), input_ended, held_ms
        )
        self.manager.metrics.record_ack(result)
        if result is not AckResult.SUCCESS:
            self._log.info(
                "checkpoint.ack_ignored",
                checkpoint_id=checkpoint_id,
                task=str(attempt),
                result=result.value,
            )
        self._process(actions)
        return result

    def decline(
        self, attempt: ExecutionAttempt, checkpoint_id: int, reason: DeclineReason, message: str
    ) -> None:
        self.manager.check_not_fenced()
        actions = self.core.on_decline(
            attempt, checkpoint_id, message, self.manager.clock(), reason
        )
        if not actions:
            self._log.info(
                "checkpoint.decline_ignored", checkpoint_id=checkpoint_id, task=str(attempt)
            )
        self._process(actions)

    def _trigger_failed(self, attempt: ExecutionAttempt, checkpoint_id: int, message: str) -> None:
        # The task never saw the barrier: aborted as if declined, not counted.
        self._process(
            self.core.on_decline(
                attempt, checkpoint_id, message, self.manager.clock(), DeclineReason.TASK_NOT_READY
            )
        )

    def _validate_paths(self, states: tuple[OperatorSubtaskState, ...]) -> None:
        extra = self.core.savepoint_dirs()
        for s in states:
            for h in s.handles:
                if not h.is_inline:  # nothing is read or deleted at an inline handle's path
                    self.storage.validate_state_path(self.job_id, h.path, extra)

    # --- checkpoints from users --------------------------------------------------------------

    async def trigger(
        self,
        kind: CheckpointKind,
        target_directory: str,
        timeout_s: float,
        input_ended: ExecutionAttempt | None = None,
    ) -> CompletedCheckpoint:
        return await self.requests.trigger(kind, target_directory, timeout_s, input_ended)

    def start_savepoint(self, kind: CheckpointKind, target_directory: str) -> SavepointOperation:
        return self.requests.start_savepoint(kind, target_directory)

    def savepoint_operation(self, request_id: str) -> SavepointOperation:
        return self.requests.savepoint_operation(request_id)

    async def dispose_savepoint(self, savepoint: CompletedCheckpoint, path: str) -> None:
        """Dispose one of this job's savepoints (``_metadata`` read and checked by the caller)
        through the job's fenced I/O queue, after the I/O queued before it (a savepoint's
        ``Finalize`` among it)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.io.submit(DisposeSavepoint(savepoint, path, done))
        await done

    def naming_the_job_state(self, refused: CheckpointRefusedError) -> CheckpointRefusedError:
        return self.requests.naming_the_job_state(refused)

    def _request(self, request: TriggerRequest) -> None:
        self._process(self.core.request(request, self.manager.clock()))

    # --- outcomes of the I/O executor (IoResults): events of the core -------------------------

    def checkpoint_id_allocated(
        self, request: TriggerRequest, checkpoint_id: int, location: str
    ) -> None:
        self._process(
            self.core.on_checkpoint_id(request, checkpoint_id, location, self.manager.clock())
        )
        if not self.core.is_pending(checkpoint_id):
            # Refused after the allocation, or its preparation had expired: nothing will ever
            # be written for this id, so its directory goes now.
            self.io.submit(DeleteUnused(checkpoint_id, location, request.kind.is_savepoint))

    def checkpoint_id_failed(self, request: TriggerRequest, message: str) -> None:
        if self.core.is_triggering(request):  # not a late answer of an expired preparation
            self._allocation_errors[request.request_id] = message
        # Counted by the failure manager (Flink's IO_EXCEPTION), unless this coordinator was
        # fenced: then the failure is its own, not the checkpoint's.
        self._process(
            self.core.on_checkpoint_id_failed(
                request, self.manager.clock(), count_failure=not self.manager.fenced
            )
        )

    def checkpoint_committed(
        self, checkpoint: CompletedCheckpoint, dropped_ids: list[int], timings: CommitTimings
    ) -> None:
        record = self.stats.get(checkpoint.checkpoint_id)
        if record is not None:
            record.completion_latency_ms = timings.completion_latency_ms
        self._finalize_timings[checkpoint.checkpoint_id] = timings
        # The core forgets the dropped checkpoints now; their files are deleted by name later.
        for dropped_id in dropped_ids:
            if (dropped := self.core.find_snapshot(dropped_id)) is not None:
                self._retiring[dropped_id] = dropped
        self._process(
            self.core.on_checkpoint_committed(checkpoint, dropped_ids, self.manager.clock())
        )

    def finalize_failed(self, checkpoint_id: int, message: str) -> None:
        self._process(self.core.on_finalize_failed(checkpoint_id, message, self.manager.clock()))

    def send_trigger(self, trigger: SendTrigger) -> None:
        self.agents.trigger(
            self.execution.group_by_address(trigger.tasks),
            trigger.checkpoint_id,
            trigger.timestamp_ms,
            trigger.options,
        )

    def is_pending(self, checkpoint_id: int) -> bool:
        return self.core.is_pending(checkpoint_id)

    def snapshot_dirs(self) -> list[str]:
        return self.core.snapshot_dirs()

    def savepoint_dirs(self) -> list[str]:
        return self.core.savepoint_dirs()

    def savepoint_ids(self) -> dict[str, int]:
        ids = {s.external_path: s.checkpoint_id for s in self.core.savepoints}
        for p in self.core.pending.values():
            if p.kind.is_savepoint:
                ids[p.external_path] = p.checkpoint_id
        return ids

    def busy_ids(self) -> set[int]:
        return {*self.core.retained_ids(), *self.core.pending}

    def highest_known_id(self) -> int:
        return self.core.highest_id

    def request_sweep(self) -> None:
        self.sweeps.request()

    def savepoint_disposed(self, checkpoint_id: int) -> None:
        self.core.on_savepoint_disposed(checkpoint_id)

    # --- action execution ----------------------------------------------------------------------

    def _warn_if_held_long(self) -> None:
        """Checkpoints held for the end of data for long (a task that never reports, or one
        busy for long ending its input): name the tasks the hold waits for, at most every
        ``HELD_WARNING_EVERY_MS``, so that an operator sees what a job that does not end
        waits for."""
        since = self.core.ending_since_ms
        now = self.manager.clock()
        if since is None or now - since < HELD_WARNING_EVERY_MS:
            return
        if now - self._held_warned_ms < HELD_WARNING_EVERY_MS:
            return
        self._held_warned_ms = now
        self._log.warning(
            "checkpoint.held_for_end_of_data",
            held_s=round((now - since) / 1000),
            waiting_for=self.execution.still_ending()[:20],
            until_s=round((since + self.core.config.timeout_ms - now) / 1000),
        )

    def _process(self, actions: Iterable[Action], wake_timer: bool = True) -> None:
        for action in actions:
            self._handle(action)
        if wake_timer:  # deadlines may have changed: the timer loop recomputes its sleep
            self._wake.set()

    def _handle(self, action: Action) -> None:
        metrics = self.manager.metrics
        match action:
            case AllocateCheckpointId(request=request):
                self.io.submit(AllocateId(request))
            case RequestRefused(request=request, refusal=refusal):
                metrics.record_refusal(refusal)
                level = self._log.debug if request.periodic else self._log.info
                level("checkpoint.refused", reason=refusal.name, kind=request.kind.value)
                if refusal is TriggerRefusal.TASKS_ENDING_INPUT:
                    self._warn_if_held_long()
                message = self._allocation_errors.pop(request.request_id, refusal.value)
                self.requests.resolve(
                    request.request_id, CheckpointRefusedError(refusal.name, message)
                )
            case CheckpointTriggered():
                metrics.record_triggered()
                self.stats.on_triggered(
                    action.checkpoint_id,
                    action.request.kind,
                    action.timestamp_ms,
                    action.external_path,
                    action.tasks,
                )
                metrics.set_in_progress(self.manager.in_progress_count())
                self._log.info(
                    "checkpoint.triggered",
                    checkpoint_id=action.checkpoint_id,
                    kind=action.request.kind.value,
                    periodic=action.request.periodic,
                    tasks=len(action.tasks),
                )
                # Its pending record is in Redis already (written while preparing the id).
            case SendTrigger():
                self.io.submit(SendTriggerRpc(action))
            case SubtaskAcknowledged(checkpoint_id=checkpoint_id, ack=ack):
                self.stats.on_acknowledged(checkpoint_id, ack)
            case FinalizeCheckpoint():
                self.io.submit(Finalize(action, last_ack_at=time.perf_counter()))
            case CheckpointCompleted(checkpoint=cp):
                self._completed(action.request, cp)
            case EndCommitted(checkpoint_id=checkpoint_id, tasks=tasks):
                if not self.execution.end_committed(checkpoint_id, tasks):
                    self._log.warning("job.end_commit_ignored", checkpoint_id=checkpoint_id)
            case RequestCovered(request=request, checkpoint=cp):
                self.requests.resolve(request.request_id, cp)
            case NotifyComplete():
                self.agents.notify(
                    self.execution.group_by_address(action.tasks),
                    action.checkpoint_id,
                    complete=True,
                    final=action.final,
                )
            case CheckpointAborted():
                self._aborted(action)
            case NotifyAborted():
                self.agents.notify(
                    self.execution.group_by_address(action.tasks),
                    action.checkpoint_id,
                    complete=False,
                    reason=action.reason.name,
                )
            case DiscardState(paths=paths, why=why):
                self._log.info("checkpoint.state_discarded", files=len(paths), why=why)
                self.io.submit(DiscardFiles(paths))
            case DeleteCompleted(checkpoint_ids=checkpoint_ids):
                retiring = (self._retiring.pop(i, None) for i in checkpoint_ids)
                self.io.submit(
                    DeleteRetired(checkpoint_ids, tuple(c for c in retiring if c is not None))
                )
            case FailJob(message=message):
                self._log.error("job.failed", failure=message)
                task = asyncio.create_task(
                    self._end(JobState.FAILED, message, AbortReason.JOB_FAILED)
                )
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            case _:
                assert_never(action)

    def _completed(self, request: TriggerRequest, cp: CompletedCheckpoint) -> None:
        metrics = self.manager.metrics
        self.stats.on_completed(cp)
        record = self.stats.get(cp.checkpoint_id)
        duration_ms = record.end_to_end_duration_ms if record else 0
        metrics.record_completed(duration_ms / 1000.0, cp.state_size_bytes)
        metrics.set_in_progress(self.manager.in_progress_count())
        timings = self._finalize_timings.pop(cp.checkpoint_id, None)
        self._log.info(
            "checkpoint.completed",
            checkpoint_id=cp.checkpoint_id,
            kind=cp.kind.value,
            bytes=cp.state_size_bytes,
            duration_ms=duration_ms,
            metadata_ms=timings.metadata_ms if timings else 0.0,
            commit_ms=timings.commit_ms if timings else 0.0,
            path=cp.external_path,
        )
        self.watchers.checkpoint_completed(lambda: self.views.summary(cp.checkpoint_id))
        self.requests.resolve(request.request_id, cp)

    def _aborted(self, action: CheckpointAborted) -> None:
        metrics = self.manager.metrics
        self.stats.on_failed(
            action.checkpoint_id, action.timestamp_ms, action.reason.name, action.message
        )
        metrics.record_failed(action.reason)
        metrics.set_in_progress(self.manager.in_progress_count())
        event = {
            AbortReason.EXPIRED: "checkpoint.expired",
            AbortReason.DECLINED: "checkpoint.declined",
        }.get(action.reason, "checkpoint.aborted")
        level = self._log.info if action.reason is AbortReason.SUBSUMED else self._log.warning
        level(
            event,
            checkpoint_id=action.checkpoint_id,
            reason=action.reason.name,
            message=action.message,
        )
        self.watchers.checkpoint_failed(lambda: self.views.summary(action.checkpoint_id))
        self.requests.resolve(
            action.request.request_id, CheckpointFailedError(action.reason.name, action.message)
        )
        self.io.submit(CleanUpAborted(action))

    # --- timers --------------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        while not self._closed:
            deadline = self.core.next_deadline_ms()
            timeout = (
                None if deadline is None else max(0.0, (deadline - self.manager.clock()) / 1000.0)
            )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            if self.manager.fenced or self._closed:
                return
            self._process(self.core.on_tick(self.manager.clock()), wake_timer=False)

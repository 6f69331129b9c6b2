"""The coordinator's I/O shell: one ``JobRunner`` per job around the pure cores.

``JobRunner`` feeds events into ``JobExecution`` and ``CheckpointCoordinator`` and executes
the actions they return:

* bookkeeping actions (stats, logs, metrics, watch events, waiters) run inline;
* I/O actions that must stay ordered (Redis writes, ``_metadata``, storage clean-up) go through
  one queue per job, drained by one task, so completion of checkpoint n is committed before n+1;
* RPCs to worker agents (trigger, notify, cancel) are fire-and-forget tasks with a deadline.

``JobManager`` owns the runners, recovery after a coordinator restart, and fencing: when Redis
reports a newer coordinator epoch, every runner stops and the service reports NOT_SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import grpc
import structlog

from snapflow.coordinator import convert
from snapflow.coordinator.checkpoint_coordinator import (
    Action,
    AllocateCheckpointId,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointCoordinator,
    CheckpointTriggered,
    DeleteCompleted,
    DiscardState,
    FailJob,
    FinalizeCheckpoint,
    NotifyAborted,
    NotifyComplete,
    RequestRefused,
    SendTrigger,
    SubtaskAcknowledged,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.config import CoordinatorSettings
from snapflow.coordinator.execution import JobExecution
from snapflow.coordinator.metrics import CoordinatorMetrics
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    CheckpointConfig,
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobGraph,
    JobRecord,
    JobState,
    OperatorSubtaskState,
    PendingCheckpointRecord,
    SubtaskMetrics,
    TaskKey,
    TaskState,
)
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.stats import CheckpointStatsTracker
from snapflow.errors import (
    AlreadyExistsError,
    CheckpointFailedError,
    CheckpointNotFoundError,
    CheckpointRefusedError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobNotFoundError,
    ResourceExhaustedError,
    SnapflowError,
    StaleEpochError,
)
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc

log = structlog.get_logger("snapflow.coordinator")

WATCH_QUEUE_BOUND = 1024  # events buffered per watch stream before it is closed as too slow


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class RestorePoint:
    checkpoint: CompletedCheckpoint
    is_savepoint: bool


class WorkerClients:
    """gRPC stubs for worker agents, one channel per address, with deadlines on every call."""

    def __init__(self, timeout_s: float, max_message_bytes: int) -> None:
        self.timeout_s = timeout_s
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, wgrpc.WorkerControlServiceStub] = {}

    def stub(self, address: str) -> wgrpc.WorkerControlServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=self._options)
            self._channels[address] = channel
            stub = self._stubs[address] = wgrpc.WorkerControlServiceStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()
        self._stubs.clear()


class JobRunner:
    """Everything the coordinator does for one job."""

    def __init__(
        self,
        manager: JobManager,
        record: JobRecord,
        completed: list[CompletedCheckpoint],
        savepoints: list[CompletedCheckpoint],
    ) -> None:
        self.manager = manager
        self.record = record
        self.job_id = record.job_id
        self.storage = manager.storage_for(record.checkpoint_config)
        self.execution = JobExecution(record.graph, record.state, deployment=record.deployment)
        self.execution.restarts = record.restarts
        self.execution.failure = record.failure
        self.core = CheckpointCoordinator(
            self.job_id,
            record.graph,
            record.checkpoint_config,
            self.execution,
            manager.rng,
            manager.settings.max_queued_trigger_requests,
        )
        self.core.restore_completed(completed, savepoints)
        if record.state.is_terminal:
            self.core.shutdown = True
        self.stats = CheckpointStatsTracker(manager.settings.history_size)
        self._source_vertices = {v.vertex_id for v in record.graph.vertices if v.is_source}
        self.restore_point: RestorePoint | None = None
        self._log = log.bind(job_id=self.job_id)
        self._io: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._waiters: dict[int, asyncio.Future[CompletedCheckpoint]] = {}
        self._allocation_errors: dict[int, str] = {}
        self._finalize_timings: dict[int, tuple[float, float]] = {}  # id -> (metadata, commit) ms
        self._last_ack_at: dict[int, float] = {}  # id -> perf_counter() when its last ack arrived
        self._watchers: set[asyncio.Queue[cpb.JobEvent | None]] = set()
        self._wake = asyncio.Event()
        self._register_lock = asyncio.Lock()
        self._next_request_id = 1
        self._background: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closed = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._timer_loop(), name=f"timer-{self.job_id}"),
            asyncio.create_task(self._io_loop(), name=f"io-{self.job_id}"),
        ]

    async def close(self, reason: AbortReason = AbortReason.COORDINATOR_SHUTDOWN) -> None:
        if self._closed:
            return
        self._process(self.core.shut_down(reason, self.manager.clock()))
        self._closed = True
        self._wake.set()
        if not self.manager.fenced:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.manager.settings.shutdown_grace_s):
                    await self._io.join()  # let the clean-up of aborted checkpoints finish
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in list(self._background):
            task.cancel()
        for watcher in list(self._watchers):
            watcher.put_nowait(None)

    # --- views -------------------------------------------------------------------------------

    def job_info(self, include_payloads: bool = False) -> cpb.JobInfo:
        """The job as the API shows it. Operator payloads (pickled user code, possibly large)
        are left out unless asked for, so responses stay far below the message size limit."""
        latest = self.core.latest_completed()
        return cpb.JobInfo(
            job_id=self.job_id,
            name=self.record.graph.name,
            state=convert.JOB_STATE_TO_PB[self.execution.state],  # type: ignore[arg-type]
            graph=convert.graph_to_pb(self.record.graph, include_payloads),
            checkpoint_config=convert.config_to_pb(self.record.checkpoint_config),
            created_at_ms=self.record.created_at_ms,
            restarts=self.execution.restarts,
            latest_completed_checkpoint_id=latest.checkpoint_id if latest else 0,
            failure=self.execution.failure,
            total_tasks=self.execution.total_tasks,
            running_tasks=self.execution.running_count(),
        )

    def task_infos(self) -> list[cpb.TaskInfo]:
        return [
            cpb.TaskInfo(
                attempt=convert.attempt_to_pb(t.attempt),
                state=convert.TASK_STATE_TO_PB[t.state],  # type: ignore[arg-type]
                address=t.address,
                failure=t.failure,
            )
            for _, t in sorted(self.execution.tasks.items())
        ]

    # --- task lifecycle ----------------------------------------------------------------------

    async def register_task(
        self, key: TaskKey, address: str
    ) -> tuple[ExecutionAttempt, RestorePoint | None]:
        async with self._register_lock:
            self.manager.check_not_fenced()
            registration = self.execution.register(key, address)
            if registration.new_deployment:
                now = self.manager.clock()
                self._process(self.core.on_tasks_not_running(now, "the job is being redeployed"))
                self.restore_point = await self._choose_restore_point()
                self.core.shutdown = False
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
                self._emit(
                    state_changed=cpb.JobStateChanged(
                        state=convert.JOB_STATE_TO_PB[self.execution.state],  # type: ignore[arg-type]
                        reason=f"deployment {self.execution.deployment} started",
                    )
                )
            self._log.debug("task.registered", task=str(registration.attempt), address=address)
            return registration.attempt, self.restore_point

    def _latest_restorable(self) -> CompletedCheckpoint | None:
        """The newest snapshot failover may restore from: the latest retained checkpoint, or a
        newer stop-with-savepoint (its completion committed side effects, so restoring from an
        older checkpoint would replay them). Intermediate savepoints never qualify."""
        candidates = [c for c in self.core.savepoints if c.kind.is_synchronous]
        latest = self.core.latest_completed()
        if latest is not None:
            candidates.append(latest)
        return max(candidates, key=lambda c: c.checkpoint_id, default=None)

    async def _choose_restore_point(self) -> RestorePoint | None:
        latest = self._latest_restorable()
        if latest is not None and latest.checkpoint_id > self.record.run_start_checkpoint_id:
            return RestorePoint(latest, latest.kind.is_savepoint)
        if self.record.restore_savepoint_path:
            cp = await asyncio.to_thread(
                self.storage.read_metadata, self.record.restore_savepoint_path
            )
            return RestorePoint(cp, cp.kind.is_savepoint)
        if self.record.restore_checkpoint_id:
            chosen = self.core._find_completed(self.record.restore_checkpoint_id)
            if chosen is None:
                raise CheckpointNotFoundError(
                    f"checkpoint {self.record.restore_checkpoint_id} of job {self.job_id} is not "
                    f"retained any more"
                )
            return RestorePoint(chosen, chosen.kind.is_savepoint)
        if self.record.restore_latest and latest is not None:
            return RestorePoint(latest, latest.kind.is_savepoint)
        return None

    async def update_task_state(
        self, attempt: ExecutionAttempt, state: TaskState, failure: str
    ) -> None:
        self.manager.check_not_fenced()
        before = self.execution.state
        transition = self.execution.update(attempt, state, failure)
        if before.is_terminal:
            return  # tasks confirming a cancel of a job that already ended
        now = self.manager.clock()
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
                self._emit(
                    task_failed=cpb.TaskFailed(
                        attempt=convert.attempt_to_pb(attempt), message=failure
                    )
                )
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
            self._log.info(
                "job.state_changed", state=after.value, previous=transition.job_state_before.value
            )
            self._emit(
                state_changed=cpb.JobStateChanged(
                    state=convert.JOB_STATE_TO_PB[after],  # type: ignore[arg-type]
                    reason=f"task {attempt} {state.value}",
                )
            )
            # Persisted before any task is cancelled: a superseded incarnation fails here.
            await self._persist_record()
            self.manager.refresh_job_gauges()
        self._cancel_tasks(to_cancel)

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
        self._emit(
            state_changed=cpb.JobStateChanged(
                state=convert.JOB_STATE_TO_PB[state],  # type: ignore[arg-type]
                reason=failure,
            )
        )
        # Persist first: a fenced (superseded) incarnation fails here and must not cancel tasks
        # that the current coordinator owns.
        await self._persist_record()
        if state is not JobState.FINISHED:
            self._cancel_tasks(attempts)
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
    ) -> AckResult:
        self.manager.check_not_fenced()
        self._validate_paths(states)
        result, actions = self.core.on_ack(
            attempt, checkpoint_id, states, metrics, self.manager.clock(), input_ended
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
        self, attempt: ExecutionAttempt, checkpoint_id: int, reason: int, message: str
    ) -> None:
        self.manager.check_not_fenced()
        # As in Flink, declines that say nothing about the checkpoint's health do not count
        # towards tolerable failures.
        abort_reason = {
            int(cpb.DECLINE_REASON_TASK_NOT_READY): AbortReason.TASK_NOT_READY,
            int(cpb.DECLINE_REASON_SUBSUMED): AbortReason.SUBSUMED,
            int(cpb.DECLINE_REASON_ALIGNMENT_CANCELED): AbortReason.ALIGNMENT_CANCELED,
        }.get(reason, AbortReason.DECLINED)
        actions = self.core.on_decline(
            attempt, checkpoint_id, message, self.manager.clock(), abort_reason
        )
        if not actions:
            self._log.info(
                "checkpoint.decline_ignored", checkpoint_id=checkpoint_id, task=str(attempt)
            )
        self._process(actions)

    def _validate_paths(self, states: tuple[OperatorSubtaskState, ...]) -> None:
        extra = [p.external_path for p in self.core.pending.values() if p.kind.is_savepoint]
        extra += [s.external_path for s in self.core.savepoints]
        for s in states:
            for h in s.handles:
                self.storage.validate_state_path(self.job_id, h.path, extra)

    # --- checkpoints from users --------------------------------------------------------------

    async def trigger(
        self, kind: CheckpointKind, target_directory: str, timeout_s: float
    ) -> CompletedCheckpoint:
        self.manager.check_not_fenced()
        if (
            kind.is_savepoint
            and target_directory
            and not os.path.isabs(convert_target := target_directory.removeprefix("file://"))
        ):
            raise InvalidArgumentError(
                f"target_directory {convert_target!r} must be an absolute path"
            )
        request = TriggerRequest(
            self._next_request_id, kind, periodic=False, target_directory=target_directory
        )
        self._next_request_id += 1
        future: asyncio.Future[CompletedCheckpoint] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = future
        self._process(self.core.request(request, self.manager.clock()))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise DeadlineExceededError(
                f"{kind.value} did not complete within {timeout_s:.1f} s; it may still complete "
                f"(see GetCheckpointStats)"
            ) from None
        finally:
            self._waiters.pop(request.request_id, None)

    # --- watch ---------------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[cpb.JobEvent]:
        queue: asyncio.Queue[cpb.JobEvent | None] = asyncio.Queue(WATCH_QUEUE_BOUND)
        self._watchers.add(queue)
        try:
            yield cpb.JobEvent(
                job_id=self.job_id,
                timestamp_ms=self.manager.clock(),
                job_state_changed=cpb.JobStateChanged(
                    state=convert.JOB_STATE_TO_PB[self.execution.state],
                    reason="current state",  # type: ignore[arg-type]
                ),
            )
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            self._watchers.discard(queue)

    def _emit(self, **event: Any) -> None:
        if not self._watchers:
            return
        message = cpb.JobEvent(job_id=self.job_id, timestamp_ms=self.manager.clock())
        key, value = next(iter(event.items()))
        field = {
            "state_changed": "job_state_changed",
            "task_failed": "task_failed",
            "completed": "checkpoint_completed",
            "failed": "checkpoint_failed",
        }[key]
        getattr(message, field).CopyFrom(value)
        for watcher in list(self._watchers):
            try:
                watcher.put_nowait(message)
            except asyncio.QueueFull:
                # A consumer that does not keep up is cut off rather than buffering forever.
                self._watchers.discard(watcher)
                watcher.get_nowait()
                watcher.put_nowait(None)

    # --- action execution ----------------------------------------------------------------------

    def _process(self, actions: Iterable[Action], wake_timer: bool = True) -> None:
        for action in actions:
            self._handle(action)
        if wake_timer:  # deadlines may have changed: the timer loop recomputes its sleep
            self._wake.set()

    def _handle(self, action: Action) -> None:
        metrics = self.manager.metrics
        if isinstance(action, AllocateCheckpointId):
            self._io.put_nowait(("allocate", action.request))
        elif isinstance(action, RequestRefused):
            metrics.record_refusal(action.refusal)
            level = self._log.debug if action.request.periodic else self._log.info
            level("checkpoint.refused", reason=action.refusal.name, kind=action.request.kind.value)
            message = self._allocation_errors.pop(action.request.request_id, action.refusal.value)
            self._resolve(
                action.request.request_id, CheckpointRefusedError(action.refusal.name, message)
            )
        elif isinstance(action, CheckpointTriggered):
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
            self._io.put_nowait(
                (
                    "add_pending",
                    PendingCheckpointRecord(
                        self.job_id,
                        action.checkpoint_id,
                        action.request.kind,
                        action.timestamp_ms,
                        action.external_path,
                    ),
                )
            )
        elif isinstance(action, SendTrigger):
            self._io.put_nowait(("send_trigger", action))
        elif isinstance(action, SubtaskAcknowledged):
            self.stats.on_acknowledged(action.checkpoint_id, action.ack)
        elif isinstance(action, FinalizeCheckpoint):
            self._last_ack_at[action.checkpoint.checkpoint_id] = time.perf_counter()
            self._io.put_nowait(("finalize", action))
        elif isinstance(action, CheckpointCompleted):
            cp = action.checkpoint
            self.stats.on_completed(cp)
            record = self.stats.get(cp.checkpoint_id)
            duration_ms = record.end_to_end_duration_ms if record else 0
            metrics.record_completed(duration_ms / 1000.0, cp.state_size_bytes)
            metrics.set_in_progress(self.manager.in_progress_count())
            metadata_ms, commit_ms = self._finalize_timings.pop(cp.checkpoint_id, (0.0, 0.0))
            self._log.info(
                "checkpoint.completed",
                checkpoint_id=cp.checkpoint_id,
                kind=cp.kind.value,
                bytes=cp.state_size_bytes,
                duration_ms=duration_ms,
                metadata_ms=metadata_ms,
                commit_ms=commit_ms,
                path=cp.external_path,
            )
            self._emit(completed=self.summary_pb(cp.checkpoint_id))
            self._resolve(action.request.request_id, cp)
        elif isinstance(action, NotifyComplete):
            self._notify(
                action.checkpoint_id, action.tasks, complete=True, reason="", final=action.final
            )
        elif isinstance(action, CheckpointAborted):
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
            self._emit(failed=self.summary_pb(action.checkpoint_id))
            self._resolve(
                action.request.request_id, CheckpointFailedError(action.reason.name, action.message)
            )
            self._io.put_nowait(("cleanup_aborted", action))
        elif isinstance(action, NotifyAborted):
            self._notify(
                action.checkpoint_id, action.tasks, complete=False, reason=action.reason.name
            )
        elif isinstance(action, DiscardState):
            self._log.info("checkpoint.state_discarded", files=len(action.paths), why=action.why)
            self._io.put_nowait(("discard", action.paths))
        elif isinstance(action, DeleteCompleted):
            self._io.put_nowait(("delete_completed", action.checkpoint_ids))
        elif isinstance(action, FailJob):
            self._log.error("job.failed", failure=action.message)
            task = asyncio.create_task(
                self._end(JobState.FAILED, action.message, AbortReason.JOB_FAILED)
            )
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:  # pragma: no cover - exhaustiveness guard
            raise AssertionError(f"unhandled action {action!r}")

    def _resolve(self, request_id: int, outcome: CompletedCheckpoint | SnapflowError) -> None:
        future = self._waiters.get(request_id)
        if future is None or future.done():
            return
        if isinstance(outcome, SnapflowError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    # --- loops ---------------------------------------------------------------------------------

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

    async def _io_loop(self) -> None:
        while True:
            kind, payload = await self._io.get()
            try:
                if not self.manager.fenced:
                    await self._run_io(kind, payload)
            except StaleEpochError as e:
                self.manager.on_fenced(e)
            except Exception as e:
                self._log.exception("coordinator.io_failed", operation=kind, error=str(e))
            finally:
                self._io.task_done()

    async def _run_io(self, kind: str, payload: Any) -> None:
        store = self.manager.store
        if kind == "allocate":
            request: TriggerRequest = payload
            try:
                checkpoint_id = await store.next_checkpoint_id(self.job_id)
                location = self._location(request, checkpoint_id)
                await asyncio.to_thread(self.storage.ensure_directory, location)
            except Exception as e:
                self._allocation_errors[request.request_id] = f"could not start the checkpoint: {e}"
                self._process(self.core.on_checkpoint_id_failed(request, self.manager.clock()))
                if isinstance(e, StaleEpochError):
                    raise
                return
            self._process(
                self.core.on_checkpoint_id(request, checkpoint_id, location, self.manager.clock())
            )
        elif kind == "add_pending":
            await store.add_pending(payload)
        elif kind == "send_trigger":
            self._send_trigger(payload)
        elif kind == "finalize":
            await self._finalize(payload)
        elif kind == "cleanup_aborted":
            action: CheckpointAborted = payload
            await store.remove_pending(self.job_id, action.checkpoint_id)
            await asyncio.to_thread(self._cleanup_aborted_storage, action)
        elif kind == "discard":
            await asyncio.to_thread(self._discard_unprotected, list(payload))
        elif kind == "delete_completed":
            for checkpoint_id in payload:
                await asyncio.to_thread(self.storage.delete_checkpoint, self.job_id, checkpoint_id)
                self._log.info(
                    "checkpoint.deleted", checkpoint_id=checkpoint_id, reason="retention"
                )

    def _extra_dirs(self) -> list[str]:
        return [s.external_path for s in self.core.savepoints] + [
            p.external_path for p in self.core.pending.values() if p.kind.is_savepoint
        ]

    def _location(self, request: TriggerRequest, checkpoint_id: int) -> str:
        if request.kind.is_savepoint:
            target = request.target_directory.removeprefix("file://")
            return self.storage.savepoint_dir(target, self.job_id, checkpoint_id)
        return self.storage.checkpoint_dir(self.job_id, checkpoint_id)

    def _protected_dirs(self) -> list[str]:
        """Directories of retained checkpoints and savepoints: nothing in them is discarded."""
        return [
            os.path.realpath(c.external_path) for c in self.core.completed + self.core.savepoints
        ]

    def _discard_unprotected(self, paths: list[str], extra_dirs: list[str] | None = None) -> None:
        """Discard state files, except anything inside a retained snapshot's directory. The core
        compares paths as strings; this compares resolved paths, so ``chk-1/./x`` or
        ``chk-1/_metadata`` in a late ack cannot delete what a completed checkpoint needs."""
        protected = self._protected_dirs()
        keep = []
        for path in paths:
            real = os.path.realpath(path.removeprefix("file://"))
            if any(real == d or real.startswith(d + os.sep) for d in protected):
                self._log.warning(
                    "checkpoint.discard_refused", path=path, why="inside a retained snapshot"
                )
                continue
            keep.append(path)
        if keep:
            self.storage.discard_state(
                self.job_id, keep, self._extra_dirs() if extra_dirs is None else extra_dirs
            )

    def _cleanup_aborted_storage(self, action: CheckpointAborted) -> None:
        extra = [action.external_path] if action.request.kind.is_savepoint else []
        self._discard_unprotected(list(action.discarded_paths), extra)
        if action.request.kind.is_savepoint:
            if not os.path.exists(os.path.join(action.external_path, "_metadata")):
                shutil.rmtree(action.external_path, ignore_errors=True)
        else:
            self.storage.delete_checkpoint(self.job_id, action.checkpoint_id)

    async def _finalize(self, action: FinalizeCheckpoint) -> None:
        cp = action.checkpoint
        last_ack_at = self._last_ack_at.pop(cp.checkpoint_id, time.perf_counter())
        if cp.checkpoint_id not in self.core.pending:
            return
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.storage.write_metadata, cp.external_path, cp)
            written = time.perf_counter()
            dropped_ids = await self.manager.store.commit_completed(cp, action.retained)
        except StaleEpochError:
            raise
        except Exception as e:
            self._process(
                self.core.on_finalize_failed(
                    cp.checkpoint_id, f"finalize failed: {e}", self.manager.clock()
                )
            )
            return
        committed = time.perf_counter()
        record = self.stats.get(cp.checkpoint_id)
        if record is not None:
            record.completion_latency_ms = (committed - last_ack_at) * 1000.0
        self._finalize_timings[cp.checkpoint_id] = (
            round((written - started) * 1000, 2),
            round((committed - written) * 1000, 2),
        )
        self._process(self.core.on_checkpoint_committed(cp, dropped_ids, self.manager.clock()))

    # --- RPCs to workers -----------------------------------------------------------------------

    def _by_address(self, tasks: Iterable[ExecutionAttempt]) -> dict[str, list[ExecutionAttempt]]:
        grouped: dict[str, list[ExecutionAttempt]] = {}
        for attempt in tasks:
            record = self.execution.tasks.get(attempt.key)
            if record is not None and record.attempt == attempt:
                grouped.setdefault(record.address, []).append(attempt)
        return grouped

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _send_trigger(self, action: SendTrigger) -> None:
        options = pb.CheckpointOptions(
            kind=convert.kind_to_pb(action.options.kind),  # type: ignore[arg-type]
            mode=convert.mode_to_pb(action.options.mode),  # type: ignore[arg-type]
            aligned_checkpoint_timeout_ms=action.options.aligned_checkpoint_timeout_ms,
            target_location=action.options.target_location,
        )
        for address, attempts in self._by_address(action.tasks).items():
            request = wpb.TriggerTaskCheckpointRequest(
                job_id=self.job_id,
                coordinator_epoch=self.manager.epoch,
                tasks=[convert.attempt_to_pb(a) for a in attempts],
                checkpoint_id=action.checkpoint_id,
                timestamp_ms=action.timestamp_ms,
                options=options,
            )
            self._spawn(self._trigger_rpc(address, request, action.checkpoint_id, attempts))

    async def _trigger_rpc(
        self,
        address: str,
        request: wpb.TriggerTaskCheckpointRequest,
        checkpoint_id: int,
        attempts: list[ExecutionAttempt],
    ) -> None:
        clients = self.manager.workers
        try:
            await clients.stub(address).TriggerCheckpoint(request, timeout=clients.timeout_s)
        except grpc.aio.AioRpcError as e:
            message = f"trigger RPC to {address} failed: {e.code().name} {e.details()}"
            self._log.warning(
                "checkpoint.trigger_failed",
                checkpoint_id=checkpoint_id,
                address=address,
                error=message,
            )
            self._process(
                self.core.on_decline(
                    attempts[0],
                    checkpoint_id,
                    message,
                    self.manager.clock(),
                    AbortReason.TASK_NOT_READY,
                )
            )

    def _notify(
        self,
        checkpoint_id: int,
        tasks: Iterable[ExecutionAttempt],
        complete: bool,
        reason: str,
        final: bool = False,
    ) -> None:
        for address, attempts in self._by_address(tasks).items():
            request = wpb.NotifyCheckpointRequest(
                job_id=self.job_id,
                coordinator_epoch=self.manager.epoch,
                tasks=[convert.attempt_to_pb(a) for a in attempts],
                checkpoint_id=checkpoint_id,
                reason=reason,
                final=final,
            )
            self._spawn(self._notify_rpc(address, request, complete))

    async def _notify_rpc(
        self, address: str, request: wpb.NotifyCheckpointRequest, complete: bool
    ) -> None:
        clients = self.manager.workers
        stub = clients.stub(address)
        call = stub.NotifyCheckpointComplete if complete else stub.NotifyCheckpointAborted
        try:
            await call(request, timeout=clients.timeout_s)
        except grpc.aio.AioRpcError as e:
            # A lost completion notice is tolerated by design: the next one commits everything.
            self._log.info(
                "checkpoint.notify_failed",
                checkpoint_id=request.checkpoint_id,
                address=address,
                code=e.code().name,
            )

    def _cancel_tasks(self, attempts: list[ExecutionAttempt]) -> None:
        for address, group in self._by_address(attempts).items():
            request = wpb.CancelTaskRequest(
                job_id=self.job_id,
                coordinator_epoch=self.manager.epoch,
                tasks=[convert.attempt_to_pb(a) for a in group],
            )
            self._spawn(self._cancel_rpc(address, request))

    async def _cancel_rpc(self, address: str, request: wpb.CancelTaskRequest) -> None:
        clients = self.manager.workers
        try:
            await clients.stub(address).CancelTask(request, timeout=clients.timeout_s)
        except grpc.aio.AioRpcError as e:
            self._log.info("task.cancel_failed", address=address, code=e.code().name)

    # --- stats ---------------------------------------------------------------------------------

    def summary_pb(self, checkpoint_id: int) -> cpb.CheckpointSummary:
        record = self.stats.get(checkpoint_id)
        if record is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {self.job_id} is not in the stats history"
            )
        return cpb.CheckpointSummary(
            checkpoint_id=record.checkpoint_id,
            kind=convert.kind_to_pb(record.kind),  # type: ignore[arg-type]
            status=convert.STATUS_TO_PB[record.status],  # type: ignore[arg-type]
            trigger_timestamp_ms=record.trigger_timestamp_ms,
            latest_ack_timestamp_ms=record.latest_ack_timestamp_ms,
            end_to_end_duration_ms=record.end_to_end_duration_ms,
            state_size_bytes=record.state_size_bytes,
            processed_during_alignment_bytes=record.processed_during_alignment_bytes,
            persisted_in_flight_bytes=record.persisted_in_flight_bytes,
            num_acknowledged=len(record.acks),
            num_tasks=len(record.tasks),
            external_path=record.external_path,
            failure_reason=record.failure_reason,
            failure_message=record.failure_message,
            unaligned=record.unaligned,
            completion_latency_ms=record.completion_latency_ms,
            source_records=sum(
                a.metrics.records_in
                for a in record.acks.values()
                if a.attempt.vertex_id in self._source_vertices
            ),
        )

    def summary_of_completed(self, cp: CompletedCheckpoint) -> cpb.CheckpointSummary:
        """Summary of a completed checkpoint that is no longer in the in-memory history."""
        if self.stats.get(cp.checkpoint_id) is not None:
            return self.summary_pb(cp.checkpoint_id)
        return cpb.CheckpointSummary(
            checkpoint_id=cp.checkpoint_id,
            kind=convert.kind_to_pb(cp.kind),  # type: ignore[arg-type]
            status=pb.CHECKPOINT_STATUS_COMPLETED,
            trigger_timestamp_ms=cp.trigger_timestamp_ms,
            latest_ack_timestamp_ms=max((a.ack_timestamp_ms for a in cp.subtask_states), default=0),
            end_to_end_duration_ms=max(0, cp.completion_timestamp_ms - cp.trigger_timestamp_ms),
            state_size_bytes=cp.state_size_bytes,
            num_acknowledged=len(cp.subtask_states),
            num_tasks=len(cp.subtask_states),
            external_path=cp.external_path,
        )

    def stats_pb(self, history_size: int) -> cpb.CheckpointStats:
        s = self.stats
        out = cpb.CheckpointStats(
            counts=cpb.CheckpointCounts(
                triggered=s.triggered,
                in_progress=s.in_progress,
                completed=s.completed,
                failed=s.failed,
                restored=s.restored,
            ),
            history=[self.summary_pb(r.checkpoint_id) for r in s.history(history_size or None)],
        )
        if s.latest_completed:
            out.latest_completed.CopyFrom(self.summary_pb(s.latest_completed.checkpoint_id))
        elif (latest := self.core.latest_completed()) is not None:
            out.latest_completed.CopyFrom(self.summary_of_completed(latest))
        if s.latest_failed:
            out.latest_failed.CopyFrom(self.summary_pb(s.latest_failed.checkpoint_id))
        if s.latest_savepoint:
            out.latest_savepoint.CopyFrom(self.summary_pb(s.latest_savepoint.checkpoint_id))
        elif self.core.savepoints:
            out.latest_savepoint.CopyFrom(self.summary_of_completed(self.core.savepoints[-1]))
        if s.latest_restore:
            r = s.latest_restore
            out.latest_restore.CopyFrom(
                cpb.RestoreInfo(
                    checkpoint_id=r.checkpoint_id,
                    restore_timestamp_ms=r.timestamp_ms,
                    is_savepoint=r.is_savepoint,
                    external_path=r.external_path,
                )
            )
        for name, q in s.summary().items():
            getattr(out, name).CopyFrom(
                cpb.Quantiles(min=q.min, avg=q.avg, p50=q.p50, p90=q.p90, p99=q.p99, max=q.max)
            )
        return out

    def details_pb(self, checkpoint_id: int) -> cpb.CheckpointDetails:
        record = self.stats.get(checkpoint_id)
        if record is None:
            cp = self.core._find_completed(checkpoint_id)
            if cp is None:
                raise CheckpointNotFoundError(
                    f"checkpoint {checkpoint_id} of job {self.job_id} is neither in the stats history "
                    f"nor retained"
                )
            acks = {a.attempt: a for a in cp.subtask_states}
            tasks: tuple[ExecutionAttempt, ...] = tuple(sorted(acks))
            summary, trigger = self.summary_of_completed(cp), cp.trigger_timestamp_ms
        else:
            acks, tasks = record.acks, record.tasks
            summary, trigger = self.summary_pb(checkpoint_id), record.trigger_timestamp_ms
        return cpb.CheckpointDetails(
            summary=summary,
            subtasks=[
                cpb.SubtaskCheckpointDetails(
                    attempt=convert.attempt_to_pb(a),
                    acknowledged=a in acks,
                    ack_timestamp_ms=acks[a].ack_timestamp_ms if a in acks else 0,
                    end_to_end_duration_ms=max(0, acks[a].ack_timestamp_ms - trigger)
                    if a in acks
                    else 0,
                    metrics=convert.metrics_to_pb(acks[a].metrics) if a in acks else None,
                )
                for a in tasks
            ],
        )


class JobManager:
    """All jobs of this coordinator incarnation."""

    def __init__(
        self,
        settings: CoordinatorSettings,
        store: CheckpointStore,
        metrics: CoordinatorMetrics,
        clock: Callable[[], int] = wall_clock_ms,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.rng = rng or random.Random()
        self.workers = WorkerClients(settings.worker_rpc_timeout_s, settings.max_message_bytes)
        self.jobs: dict[str, JobRunner] = {}
        self.epoch = 0
        self.fenced = False
        self.on_fenced_callbacks: list[Callable[[], None]] = []
        self._storages: dict[str, CheckpointStorage] = {}

    def storage_for(self, config: CheckpointConfig) -> CheckpointStorage:
        root = config.storage_uri or self.settings.storage_root
        storage = self._storages.get(root)
        if storage is None:
            storage = self._storages[root] = CheckpointStorage(root)
        return storage

    # --- fencing ---------------------------------------------------------------------------------

    def check_not_fenced(self) -> None:
        if self.fenced:
            raise StaleEpochError(
                f"this coordinator (epoch {self.epoch}) was superseded by a newer incarnation; "
                f"talk to the current coordinator"
            )

    def on_fenced(self, error: StaleEpochError) -> None:
        if self.fenced:
            return
        self.fenced = True
        log.error("coordinator.fenced", epoch=self.epoch, error=str(error))
        for callback in self.on_fenced_callbacks:
            callback()

    async def guard(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except StaleEpochError as e:
            self.on_fenced(e)
            raise

    # --- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Take a new epoch and recover every job from Redis."""
        self.epoch = await self.store.acquire_epoch()
        log.info("coordinator.epoch_acquired", epoch=self.epoch)
        for record in await self.store.list_jobs():
            try:
                await self._recover(record)
            except SnapflowError as e:
                # One bad record must not keep the control plane down; the job stays in Redis.
                log.error("job.recovery_failed", job_id=record.job_id, error=str(e))
        self.refresh_job_gauges()

    async def _recover(self, record: JobRecord) -> None:
        completed = await self.store.list_completed(record.job_id)
        savepoints = await self.store.list_savepoints(record.job_id)
        pending = await self.store.list_pending(record.job_id)
        if not record.state.is_terminal:
            # Tasks of the previous incarnation must register again; pending checkpoints are lost.
            record = replace(
                record, state=JobState.RESTARTING if record.deployment else JobState.CREATED
            )
            await self.store.update_job(record)
        runner = JobRunner(self, record, completed, savepoints)
        for p in pending:
            await self.store.remove_pending(record.job_id, p.checkpoint_id)
            runner.core.highest_id = max(runner.core.highest_id, p.checkpoint_id)
            log.info(
                "checkpoint.aborted",
                job_id=record.job_id,
                checkpoint_id=p.checkpoint_id,
                reason=AbortReason.COORDINATOR_RESTARTED.name,
            )
        keep = [c.checkpoint_id for c in completed]
        orphans = await asyncio.to_thread(runner.storage.cleanup_orphans, record.job_id, keep)
        savepoint_orphans = [p.external_path for p in pending if p.kind.is_savepoint]
        for path in savepoint_orphans:
            if not os.path.exists(os.path.join(path, "_metadata")):
                await asyncio.to_thread(_rmtree, path)
        self.jobs[record.job_id] = runner
        runner.start()
        log.info(
            "job.recovered",
            job_id=record.job_id,
            state=record.state.value,
            completed=len(completed),
            aborted_pending=len(pending),
            orphans_deleted=len(orphans),
        )

    async def close(self) -> None:
        for runner in list(self.jobs.values()):
            await runner.close()
        await self.workers.close()

    # --- jobs ----------------------------------------------------------------------------------

    def runner(self, job_id: str) -> JobRunner:
        runner = self.jobs.get(job_id)
        if runner is None:
            raise JobNotFoundError(f"job {job_id} does not exist on this coordinator")
        return runner

    async def submit(
        self,
        job_id: str,
        graph: JobGraph,
        config: CheckpointConfig,
        restore: cpb.RestoreSettings,
    ) -> JobRunner:
        self.check_not_fenced()
        self.storage_for(config)  # a bad storage location fails here, before anything is stored
        existing = self.jobs.get(job_id)
        restore_kind = restore.WhichOneof("source")
        if existing is not None:
            if not (
                existing.execution.state.is_terminal and restore_kind in ("latest", "checkpoint_id")
            ):
                raise AlreadyExistsError(
                    f"job {job_id} already exists ({existing.execution.state.value}); to run a "
                    f"finished, canceled or failed job again, submit it with restore.latest or "
                    f"restore.checkpoint_id"
                )
        elif len(self.jobs) >= self.settings.max_jobs:
            raise ResourceExhaustedError(
                f"this coordinator hosts {len(self.jobs)} jobs, the limit (max_jobs); remove old jobs first"
            )
        elif restore_kind == "latest":
            raise InvalidArgumentError(
                f"restore.latest needs an existing job: job {job_id} has no checkpoints on this coordinator"
            )
        savepoint_path = ""
        restore_checkpoint_id = 0
        if restore_kind == "savepoint_path":
            savepoint_path = restore.savepoint_path.removeprefix("file://")
            storage = self.storage_for(config)
            cp = await asyncio.to_thread(storage.read_metadata, savepoint_path)
            _check_compatible(graph, cp, restore.allow_non_restored_state)
        elif restore_kind == "checkpoint_id":
            restore_checkpoint_id = convert.checkpoint_id_from_pb(restore.checkpoint_id)
            if existing is None:
                raise InvalidArgumentError(
                    "restore.checkpoint_id names a checkpoint of this job id, which does not exist; "
                    "use restore.savepoint_path with the checkpoint's directory instead"
                )
            if existing.core._find_completed(restore_checkpoint_id) is None:
                retained = [
                    c.checkpoint_id for c in existing.core.completed + existing.core.savepoints
                ]
                raise CheckpointNotFoundError(
                    f"checkpoint {restore_checkpoint_id} of job {job_id} is not retained "
                    f"(retained: {retained or 'none'})"
                )
        now = self.clock()
        run_start = cp.checkpoint_id if restore_kind == "savepoint_path" else 0
        if existing is not None:
            await existing.close()
            record = replace(
                existing.record,
                graph=graph,
                checkpoint_config=config,
                state=JobState.CREATED,
                failure="",
                restore_checkpoint_id=restore_checkpoint_id,
                restore_savepoint_path=savepoint_path,
                restore_latest=restore_kind == "latest",
                run_start_checkpoint_id=max(run_start, existing.core.highest_id),
            )
            await self.guard(self.store.update_job(record))
            completed = await self.store.list_completed(job_id)
            savepoints = await self.store.list_savepoints(job_id)
        else:
            record = JobRecord(
                job_id=job_id,
                graph=graph,
                checkpoint_config=config,
                state=JobState.CREATED,
                created_at_ms=now,
                restore_checkpoint_id=restore_checkpoint_id,
                restore_savepoint_path=savepoint_path,
                run_start_checkpoint_id=run_start,
            )
            await self.guard(self.store.create_job(record))
            completed, savepoints = [], []
        if restore_kind == "savepoint_path":
            # Checkpoint ids continue after the savepoint's, as in Flink.
            await self.guard(self.store.ensure_checkpoint_id_at_least(job_id, cp.checkpoint_id))
        runner = JobRunner(self, record, completed, savepoints)
        if restore_kind == "savepoint_path":
            runner.core.highest_id = max(runner.core.highest_id, cp.checkpoint_id)
        self.jobs[job_id] = runner
        runner.start()
        log.info(
            "job.submitted",
            job_id=job_id,
            name=graph.name,
            tasks=len(graph.task_keys()),
            interval_ms=config.interval_ms,
            mode=config.mode.value,
            restore=restore_kind or "none",
        )
        self.refresh_job_gauges()
        return runner

    async def dispose_savepoint(self, path: str) -> None:
        self.check_not_fenced()
        path = path.removeprefix("file://")
        if not os.path.isabs(path):
            raise InvalidArgumentError(f"savepoint_path {path!r} must be an absolute path")
        storage = CheckpointStorage(os.path.dirname(path.rstrip("/")) or "/")
        if os.path.isdir(path) and not os.path.exists(os.path.join(path, "_metadata")):
            raise InvalidArgumentError(f"{path} has no _metadata: it is not a savepoint directory")
        cp = await asyncio.to_thread(storage.read_metadata, path)
        if not cp.kind.is_savepoint:
            raise InvalidArgumentError(
                f"{path} holds checkpoint {cp.checkpoint_id}, not a savepoint"
            )
        await asyncio.to_thread(storage.dispose_savepoint, path)
        runner = self.jobs.get(cp.job_id)
        if runner is not None:
            await self.guard(self.store.remove_savepoint(cp.job_id, cp.checkpoint_id))
            runner.core.savepoints = [
                s for s in runner.core.savepoints if s.checkpoint_id != cp.checkpoint_id
            ]
            runner.core._recompute_referenced()
        log.info("savepoint.disposed", job_id=cp.job_id, checkpoint_id=cp.checkpoint_id, path=path)

    def in_progress_count(self) -> int:
        return sum(len(r.core.pending) for r in self.jobs.values())

    def refresh_job_gauges(self) -> None:
        counts: dict[JobState | str, int] = {state: 0 for state in JobState}
        for runner in self.jobs.values():
            counts[runner.execution.state] += 1
        self.metrics.set_job_counts(counts)


def _check_compatible(graph: JobGraph, cp: CompletedCheckpoint, allow_non_restored: bool) -> None:
    """Every operator with state in the snapshot must exist in the new graph (Flink's rule)."""
    operators = {o.operator_id for v in graph.vertices for o in v.operators}
    vertices = {v.vertex_id for v in graph.vertices}
    missing = sorted(
        {
            s.operator_id
            for a in cp.subtask_states
            for s in a.operator_states
            if s.handles
            and (s.operator_id not in operators and a.attempt.vertex_id not in vertices)
        }
    )
    if missing and not allow_non_restored:
        raise InvalidArgumentError(
            f"the snapshot has state for operators not in the new graph: {', '.join(missing)}; "
            f"set restore.allow_non_restored_state to drop it"
        )


def _rmtree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)

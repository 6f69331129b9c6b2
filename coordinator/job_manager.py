"""All jobs of one coordinator incarnation: submit, recovery after a restart, fencing.

``JobManager`` owns one ``JobRunner`` (``coordinator.job_runner``) per job. At start it takes a
new epoch and recovers every job from Redis; when Redis reports a newer coordinator epoch, every
runner stops and the service reports NOT_SERVING.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator import checkpoint_io, convert
from snapflow.coordinator.agent_gateway import AgentClients
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.config import CoordinatorSettings
from snapflow.coordinator.job_runner import JobRunner
from snapflow.coordinator.metrics import CoordinatorMetrics
from snapflow.coordinator.model import (
    AbortReason,
    CompletedCheckpoint,
    JobGraph,
    JobRecord,
    JobState,
)
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    InvalidArgumentError,
    JobNotFoundError,
    ResourceExhaustedError,
    SnapflowError,
    StaleEpochError,
    UnavailableError,
)
from snapflow.filestore import is_object_store_uri
from snapflow.storage_location import s3_location
from snapflow.v1 import coordinator_pb2 as cpb

__all__ = ["JobManager", "JobRunner", "wall_clock_ms"]

log = structlog.get_logger("snapflow.coordinator")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
        self.workers = AgentClients(
            settings.worker_rpc_timeout_s, settings.max_message_bytes, settings.security()
        )
        self.jobs: dict[str, JobRunner] = {}
        self.epoch = 0
        self.fenced = False
        self.on_fenced_callbacks: list[Callable[[], None]] = []
        self._storages: dict[str, CheckpointStorage] = {}

    def storage_for(self, config: CheckpointConfig) -> CheckpointStorage:
        root = config.storage_uri or self.settings.storage_root
        storage = self._storages.get(root)
        if storage is None:
            storage = self._storages[root] = CheckpointStorage(root, self.settings.s3_settings())
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
        """Take a new epoch (unless the store has one: won with the leader lease, see
        coordinator/leader_election.py) and recover every job from Redis."""
        self.epoch = self.store.epoch or await self.store.acquire_epoch()
        log.info("coordinator.epoch_acquired", epoch=self.epoch)
        for record in await self.store.list_jobs():
            try:
                await self._recover(record)
            except (UnavailableError, StaleEpochError):
                # Redis unreachable or the epoch lost: not the record's fault. Skipping the job
                # would leave it unrun until the next start; fail the start (a leader then
                # gives up its lease and tries again).
                raise
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
        # Every id handed out so far (read under our epoch) is ended: late acks for the lost
        # pending checkpoints are DISCARDED, not UNKNOWN, and the sweep may remove their files.
        handed_out = await self.store.checkpoint_id_counter(record.job_id)
        lost_ids = max((p.checkpoint_id for p in pending), default=0)
        runner = JobRunner(
            self, record, completed, savepoints, highest_id=max(lost_ids, handed_out)
        )
        for p in pending:
            log.info(
                "checkpoint.aborted",
                job_id=record.job_id,
                checkpoint_id=p.checkpoint_id,
                reason=AbortReason.COORDINATOR_RESTARTED.name,
            )
        # The fenced, bounded orphan sweep removes the lost pending records with their
        # directories (a savepoint's only without _metadata) and every other orphan.
        orphans = await runner.sweep_orphans()
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
        existing = self.jobs.get(job_id)
        if not config.storage_uri:
            # The job's record names its storage: a later coordinator with another
            # storage_root (a changed setting, a standby configured apart) still finds its
            # checkpoints. A resubmitted job keeps the storage it had.
            recorded = existing.record.checkpoint_config.storage_uri if existing else ""
            config = replace(config, storage_uri=recorded or self.storage_for(config).root)
        self.storage_for(config)  # a bad storage location fails here, before anything is stored
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
            if existing.core.find_snapshot(restore_checkpoint_id) is None:
                retained = existing.core.retained_ids()
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
        # Ids up to the restored snapshot's are taken (the Redis counter was raised above).
        highest_id = cp.checkpoint_id if restore_kind == "savepoint_path" else 0
        runner = JobRunner(self, record, completed, savepoints, highest_id=highest_id)
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
        """Dispose a savepoint by path: fenced, through its job's I/O queue when the job is
        hosted here (``checkpoint_io.dispose_savepoint``; docs/coordinator.md)."""
        self.check_not_fenced()
        path = path.removeprefix("file://")
        if is_object_store_uri(path):
            # The root only picks the store and its settings; nothing is deleted outside path.
            path = s3_location(path, what="savepoint_path")
            storage = CheckpointStorage(path, self.settings.s3_settings())
        else:
            if not os.path.isabs(path):
                raise InvalidArgumentError(f"savepoint_path {path!r} must be an absolute path")
            storage = CheckpointStorage(os.path.dirname(path.rstrip("/")) or "/")
            if os.path.isdir(path) and not os.path.exists(os.path.join(path, "_metadata")):
                raise InvalidArgumentError(
                    f"{path} has no _metadata: it is not a savepoint directory"
                )
        cp = await asyncio.to_thread(storage.read_metadata, path)
        if not cp.kind.is_savepoint:
            raise InvalidArgumentError(
                f"{path} holds checkpoint {cp.checkpoint_id}, not a savepoint"
            )
        runner = self.jobs.get(cp.job_id)
        if runner is not None:
            # Every job hosted here (a finished one too) has a runner and its I/O queue.
            await runner.dispose_savepoint(cp, path)
        else:
            # No job here, so no queue and no core: the same fenced steps, directly.
            await self.guard(checkpoint_io.dispose_savepoint(self.store, storage, cp, path))
        log.info("savepoint.disposed", job_id=cp.job_id, checkpoint_id=cp.checkpoint_id, path=path)

    def in_progress_count(self) -> int:
        return sum(r.core.pending_count() for r in self.jobs.values())

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

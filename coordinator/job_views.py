"""Read-only API views of one job: ``JobInfo``, ``TaskInfo``, checkpoint summaries, statistics
and details, built from the cores (``JobExecution``, ``CheckpointCoordinator``) and the
statistics tracker. Nothing here changes state.

The statistics tracker lives in memory and starts empty with each runner (a coordinator
restart, a resubmission), while completed checkpoints and savepoints are durable. So the
statistics also cover the snapshots this runner *recovered* (those the checkpoint
coordinator held when the views were made): they are in the history, in ``triggered`` and
``completed``, and may be "latest", so the counts and "latest" always agree. Their failures
and the percentiles of earlier runs are not known. A completed checkpoint whose files are
gone (dropped by retention, a disposed savepoint) is marked ``discarded``, as in Flink's
checkpoint history.
"""

from __future__ import annotations

from snapflow import wire
from snapflow.coordinator import convert
from snapflow.coordinator.checkpoint_coordinator import CheckpointCoordinator
from snapflow.coordinator.checkpoint_stats import CheckpointStatsTracker, StateSizes
from snapflow.coordinator.execution import JobExecution
from snapflow.coordinator.model import (
    CheckpointStatus,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobRecord,
)
from snapflow.coordinator.task_metrics_table import TaskMetricsTable
from snapflow.errors import CheckpointNotFoundError
from snapflow.v1 import coordinator_pb2 as cpb


class JobViews:
    """The protos the API returns for one job."""

    def __init__(
        self,
        job_id: str,
        execution: JobExecution,
        core: CheckpointCoordinator,
        stats: CheckpointStatsTracker,
        task_metrics: TaskMetricsTable,
    ) -> None:
        self.job_id = job_id
        self.task_metrics = task_metrics
        self.execution = execution
        self.core = core
        self.stats = stats
        self._source_vertices = {v.vertex_id for v in execution.graph.vertices if v.is_source}
        # Newest first, like the history; made right after the core restored them.
        self._recovered = sorted(
            (*core.completed, *core.savepoints), key=lambda c: c.checkpoint_id, reverse=True
        )

    def job_info(self, record: JobRecord, include_payloads: bool = False) -> cpb.JobInfo:
        """The job as the API shows it. Operator payloads (pickled user code, possibly large)
        are left out unless asked for, so responses stay far below the message size limit."""
        latest = self.core.latest_completed()
        return cpb.JobInfo(
            job_id=self.job_id,
            name=record.graph.name,
            state=wire.JOB_STATE.to_pb(self.execution.state),
            graph=convert.graph_to_pb(record.graph, include_payloads),
            checkpoint_config=wire.checkpoint_config_to_pb(record.checkpoint_config),
            created_at_ms=record.created_at_ms,
            restarts=self.execution.restarts,
            latest_completed_checkpoint_id=latest.checkpoint_id if latest else 0,
            failure=self.execution.failure,
            total_tasks=self.execution.total_tasks,
            running_tasks=self.execution.running_count(),
        )

    def task_infos(self) -> list[cpb.TaskInfo]:
        """Every task of the current deployment, with the metrics its attempt reported last."""
        out = []
        for _, t in sorted(self.execution.tasks.items()):
            info = cpb.TaskInfo(
                attempt=convert.attempt_to_pb(t.attempt),
                state=wire.TASK_STATE.to_pb(t.state),
                address=t.address,
                failure=t.failure,
                data_ended=t.data_ended,
            )
            reported = self.task_metrics.latest(t.attempt)
            if reported is not None:
                info.metrics.CopyFrom(wire.task_metrics_to_pb(reported.metrics))
                info.metrics_timestamp_ms = reported.received_ms
            out.append(info)
        return out

    def summary(self, checkpoint_id: int) -> cpb.CheckpointSummary:
        """Summary of a checkpoint in the in-memory statistics history."""
        record = self.stats.get(checkpoint_id)
        if record is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {self.job_id} is not in the stats history"
            )
        sizes = record.sizes
        return cpb.CheckpointSummary(
            checkpoint_id=record.checkpoint_id,
            kind=wire.CHECKPOINT_KIND.to_pb(record.kind),
            status=wire.CHECKPOINT_STATUS.to_pb(record.status),
            trigger_timestamp_ms=record.trigger_timestamp_ms,
            latest_ack_timestamp_ms=record.latest_ack_timestamp_ms,
            end_to_end_duration_ms=record.end_to_end_duration_ms,
            state_size_bytes=sizes.state,
            incremental_size_bytes=sizes.incremental,
            shared_size_bytes=sizes.shared,
            max_alignment_duration_ms=record.max_alignment_duration_ms,
            processed_during_alignment_bytes=record.processed_during_alignment_bytes,
            persisted_in_flight_bytes=record.persisted_in_flight_bytes,
            num_acknowledged=len(record.acks),
            num_tasks=len(record.tasks),
            external_path=record.external_path,
            failure_reason=record.failure_reason,
            failure_message=record.failure_message,
            unaligned=record.unaligned,
            discarded=self._discarded(record.checkpoint_id, record.status),
            completion_latency_ms=record.completion_latency_ms,
            source_records=sum(
                a.metrics.records_in
                for a in record.acks.values()
                if a.attempt.vertex_id in self._source_vertices
            ),
        )

    def summary_of_completed(self, cp: CompletedCheckpoint) -> cpb.CheckpointSummary:
        """Summary of a completed checkpoint, also when it is no longer in the history."""
        if self.stats.get(cp.checkpoint_id) is not None:
            return self.summary(cp.checkpoint_id)
        sizes = StateSizes.of_acks(cp.subtask_states)
        return cpb.CheckpointSummary(
            checkpoint_id=cp.checkpoint_id,
            kind=wire.CHECKPOINT_KIND.to_pb(cp.kind),
            status=wire.CHECKPOINT_STATUS.to_pb(CheckpointStatus.COMPLETED),
            trigger_timestamp_ms=cp.trigger_timestamp_ms,
            latest_ack_timestamp_ms=max((a.ack_timestamp_ms for a in cp.subtask_states), default=0),
            end_to_end_duration_ms=max(0, cp.completion_timestamp_ms - cp.trigger_timestamp_ms),
            state_size_bytes=sizes.state,
            incremental_size_bytes=sizes.incremental,
            shared_size_bytes=sizes.shared,
            max_alignment_duration_ms=max(
                (a.metrics.alignment_duration_ms for a in cp.subtask_states), default=0
            ),
            num_acknowledged=len(cp.subtask_states),
            num_tasks=len(cp.subtask_states),
            external_path=cp.external_path,
            discarded=self._discarded(cp.checkpoint_id, CheckpointStatus.COMPLETED),
        )

    def _discarded(self, checkpoint_id: int, status: CheckpointStatus) -> bool:
        """A completed checkpoint or savepoint that is neither retained nor recorded any more."""
        return (
            status is CheckpointStatus.COMPLETED and self.core.find_snapshot(checkpoint_id) is None
        )

    def _recovered_only(self) -> list[CompletedCheckpoint]:
        """Recovered snapshots the tracker has no record of (all of them, unless a checkpoint
        with the same id was tracked since)."""
        return [c for c in self._recovered if self.stats.get(c.checkpoint_id) is None]

    def checkpoint_stats(self, history_size: int) -> cpb.CheckpointStats:
        s = self.stats
        recovered = self._recovered_only()
        history = [self.summary(r.checkpoint_id) for r in s.history()]
        history += [self.summary_of_completed(c) for c in recovered]  # older ids: after them
        out = cpb.CheckpointStats(
            counts=cpb.CheckpointCounts(
                triggered=s.triggered + len(recovered),
                in_progress=s.in_progress,
                completed=s.completed + len(recovered),
                failed=s.failed,
                restored=s.restored,
            ),
            history=history[: history_size or None],
        )
        recovered_savepoints = [c for c in recovered if c.kind.is_savepoint]
        if s.latest_completed:
            out.latest_completed.CopyFrom(self.summary(s.latest_completed.checkpoint_id))
        elif recovered:
            out.latest_completed.CopyFrom(self.summary_of_completed(recovered[0]))
        if s.latest_failed:
            out.latest_failed.CopyFrom(self.summary(s.latest_failed.checkpoint_id))
        if s.latest_savepoint:
            out.latest_savepoint.CopyFrom(self.summary(s.latest_savepoint.checkpoint_id))
        elif recovered_savepoints:
            out.latest_savepoint.CopyFrom(self.summary_of_completed(recovered_savepoints[0]))
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

    def details(self, checkpoint_id: int) -> cpb.CheckpointDetails:
        record = self.stats.get(checkpoint_id)
        if record is None:
            cp = self.core.find_snapshot(checkpoint_id)
            if cp is None:
                raise CheckpointNotFoundError(
                    f"checkpoint {checkpoint_id} of job {self.job_id} is neither in the stats "
                    f"history nor retained"
                )
            acks = {a.attempt: a for a in cp.subtask_states}
            tasks: tuple[ExecutionAttempt, ...] = tuple(sorted(acks))
            summary, trigger = self.summary_of_completed(cp), cp.trigger_timestamp_ms
        else:
            acks, tasks = record.acks, record.tasks
            summary, trigger = self.summary(checkpoint_id), record.trigger_timestamp_ms
        subtasks = []
        for a in tasks:
            ack = acks.get(a)
            if ack is None:
                subtasks.append(cpb.SubtaskCheckpointDetails(attempt=convert.attempt_to_pb(a)))
                continue
            sizes = StateSizes.of_ack(ack)
            subtasks.append(
                cpb.SubtaskCheckpointDetails(
                    attempt=convert.attempt_to_pb(a),
                    acknowledged=True,
                    ack_timestamp_ms=ack.ack_timestamp_ms,
                    end_to_end_duration_ms=max(0, ack.ack_timestamp_ms - trigger),
                    metrics=convert.metrics_to_pb(ack.metrics),
                    incremental_size_bytes=sizes.incremental,
                    shared_size_bytes=sizes.shared,
                )
            )
        return cpb.CheckpointDetails(summary=summary, subtasks=subtasks)

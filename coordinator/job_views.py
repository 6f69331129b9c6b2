"""Read-only API views of one job: ``JobInfo``, ``TaskInfo``, checkpoint summaries, statistics
and details, built from the cores (``JobExecution``, ``CheckpointCoordinator``) and the
statistics tracker. Nothing here changes state.
"""

from __future__ import annotations

from snapflow import wire
from snapflow.coordinator import convert
from snapflow.coordinator.checkpoint_coordinator import CheckpointCoordinator
from snapflow.coordinator.execution import JobExecution
from snapflow.coordinator.model import CompletedCheckpoint, ExecutionAttempt, JobRecord
from snapflow.coordinator.stats import CheckpointStatsTracker
from snapflow.errors import CheckpointNotFoundError
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb


class JobViews:
    """The protos the API returns for one job."""

    def __init__(
        self,
        job_id: str,
        execution: JobExecution,
        core: CheckpointCoordinator,
        stats: CheckpointStatsTracker,
    ) -> None:
        self.job_id = job_id
        self.execution = execution
        self.core = core
        self.stats = stats
        self._source_vertices = {v.vertex_id for v in execution.graph.vertices if v.is_source}

    def job_info(self, record: JobRecord, include_payloads: bool = False) -> cpb.JobInfo:
        """The job as the API shows it. Operator payloads (pickled user code, possibly large)
        are left out unless asked for, so responses stay far below the message size limit."""
        latest = self.core.latest_completed()
        return cpb.JobInfo(
            job_id=self.job_id,
            name=record.graph.name,
            state=convert.JOB_STATE_TO_PB[self.execution.state],
            graph=convert.graph_to_pb(record.graph, include_payloads),
            checkpoint_config=convert.config_to_pb(record.checkpoint_config),
            created_at_ms=record.created_at_ms,
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
                state=wire.TASK_STATE.to_pb(t.state),
                address=t.address,
                failure=t.failure,
            )
            for _, t in sorted(self.execution.tasks.items())
        ]

    def summary(self, checkpoint_id: int) -> cpb.CheckpointSummary:
        """Summary of a checkpoint in the in-memory statistics history."""
        record = self.stats.get(checkpoint_id)
        if record is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of job {self.job_id} is not in the stats history"
            )
        return cpb.CheckpointSummary(
            checkpoint_id=record.checkpoint_id,
            kind=wire.CHECKPOINT_KIND.to_pb(record.kind),
            status=convert.STATUS_TO_PB[record.status],
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
        """Summary of a completed checkpoint, also when it is no longer in the history."""
        if self.stats.get(cp.checkpoint_id) is not None:
            return self.summary(cp.checkpoint_id)
        return cpb.CheckpointSummary(
            checkpoint_id=cp.checkpoint_id,
            kind=wire.CHECKPOINT_KIND.to_pb(cp.kind),
            status=pb.CHECKPOINT_STATUS_COMPLETED,
            trigger_timestamp_ms=cp.trigger_timestamp_ms,
            latest_ack_timestamp_ms=max((a.ack_timestamp_ms for a in cp.subtask_states), default=0),
            end_to_end_duration_ms=max(0, cp.completion_timestamp_ms - cp.trigger_timestamp_ms),
            state_size_bytes=cp.state_size_bytes,
            num_acknowledged=len(cp.subtask_states),
            num_tasks=len(cp.subtask_states),
            external_path=cp.external_path,
        )

    def checkpoint_stats(self, history_size: int) -> cpb.CheckpointStats:
        s = self.stats
        out = cpb.CheckpointStats(
            counts=cpb.CheckpointCounts(
                triggered=s.triggered,
                in_progress=s.in_progress,
                completed=s.completed,
                failed=s.failed,
                restored=s.restored,
            ),
            history=[self.summary(r.checkpoint_id) for r in s.history(history_size or None)],
        )
        if s.latest_completed:
            out.latest_completed.CopyFrom(self.summary(s.latest_completed.checkpoint_id))
        elif (latest := self.core.latest_completed()) is not None:
            out.latest_completed.CopyFrom(self.summary_of_completed(latest))
        if s.latest_failed:
            out.latest_failed.CopyFrom(self.summary(s.latest_failed.checkpoint_id))
        if s.latest_savepoint:
            out.latest_savepoint.CopyFrom(self.summary(s.latest_savepoint.checkpoint_id))
        elif (savepoint := self.core.last_recorded_savepoint()) is not None:
            out.latest_savepoint.CopyFrom(self.summary_of_completed(savepoint))
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

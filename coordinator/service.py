"""gRPC servicer of ``snapflow.v1.CoordinatorService``: protos in, ``JobManager`` calls out.

Nothing here decides anything: requests are validated and converted (``coordinator.convert``)
against the bounds of ``snapflow.limits``, handed to the job manager, and errors become
statuses (``coordinator.grpc_errors``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from snapflow import limits, wire
from snapflow.coordinator import convert
from snapflow.coordinator.confinement import check_confined
from snapflow.coordinator.grpc_errors import grpc_errors, grpc_errors_stream, status_for
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.job_runner import JobRunner
from snapflow.coordinator.model import (
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    TaskKey,
)
from snapflow.coordinator.savepoint_operations import SavepointOperation
from snapflow.errors import CheckpointRefusedError, InvalidArgumentError, SnapflowError
from snapflow.jobgraph import TaskState
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

MAX_HISTORY = 1000
MAX_ACKS_PER_BATCH = 4096
MAX_HEARTBEAT_TASKS = limits.MAX_PARALLELISM


def _location(value: str, field: str) -> str:
    """A path a client sends, within the size limits (before confinement or any I/O)."""
    return limits.check_location(value, field)


def _address(value: str, field: str) -> str:
    return limits.check_length(value, limits.MAX_ADDRESS_CHARS, field)


class CoordinatorServicer(cgrpc.CoordinatorServiceServicer):
    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    def _runner(self, job_id: str) -> JobRunner:
        return self.manager.runner(convert.parse_job_id(job_id))

    def _deadline(self, context: grpc.aio.ServicerContext) -> float:
        """How long a blocking call may wait: the client's deadline, capped by the server's."""
        cap = self.manager.settings.default_rpc_deadline_s
        remaining = context.time_remaining()
        if remaining is None:
            return cap
        return max(0.0, min(cap, remaining - 0.05))

    # --- jobs ------------------------------------------------------------------------------------

    @grpc_errors
    async def SubmitJob(
        self, request: cpb.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SubmitJobResponse:
        job_id = convert.parse_job_id(request.job_id, allow_empty=True)
        graph = convert.graph_from_pb(request.graph)
        config = wire.checkpoint_config_from_pb(request.checkpoint_config)
        roots = self.manager.settings.allowed_roots()
        check_confined(config.storage_uri, roots, "checkpoint_config.storage_uri", allow_root=True)
        if request.restore.WhichOneof("source") == "savepoint_path":
            _location(request.restore.savepoint_path, "restore.savepoint_path")
            check_confined(request.restore.savepoint_path, roots, "restore.savepoint_path")
        runner = await self.manager.submit(job_id, graph, config, request.restore)
        return cpb.SubmitJobResponse(job=runner.job_info())

    @grpc_errors
    async def GetJob(
        self, request: cpb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> cpb.JobInfo:
        return self._runner(request.job_id).job_info(request.include_operator_payloads)

    @grpc_errors
    async def ListJobs(
        self, request: cpb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.ListJobsResponse:
        runners = sorted(
            self.manager.jobs.values(), key=lambda r: (r.record.created_at_ms, r.job_id)
        )
        jobs = []
        for runner in runners:
            info = runner.job_info()
            info.ClearField("graph")  # a summary: GetJob has the graph
            jobs.append(info)
        return cpb.ListJobsResponse(jobs=jobs)

    @grpc_errors
    async def CancelJob(
        self, request: cpb.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> cpb.JobInfo:
        runner = self._runner(request.job_id)
        await runner.cancel()
        return runner.job_info()

    @grpc_errors_stream
    async def WatchJob(
        self, request: cpb.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cpb.JobEvent]:
        runner = self._runner(request.job_id)
        async for event in runner.watch():
            yield event

    # --- tasks -----------------------------------------------------------------------------------

    @grpc_errors
    async def RegisterTask(
        self, request: cpb.RegisterTaskRequest, context: grpc.aio.ServicerContext
    ) -> cpb.RegisterTaskResponse:
        runner = self._runner(request.job_id)
        if request.subtask_index < 0:
            raise InvalidArgumentError(f"subtask_index must be >= 0, got {request.subtask_index}")
        if not request.vertex_id:
            raise InvalidArgumentError("vertex_id is required")
        limits.check_length(request.vertex_id, limits.MAX_ID_CHARS, "vertex_id")
        _address(request.address, "address")
        if request.launch < 0:
            raise InvalidArgumentError(f"launch must be >= 0, got {request.launch}")
        attempt, restore = await runner.register_task(
            TaskKey(request.vertex_id, request.subtask_index), request.address, request.launch
        )
        return cpb.RegisterTaskResponse(
            attempt=convert.attempt_to_pb(attempt),
            coordinator_epoch=self.manager.epoch,
            restore=convert.task_restore_to_pb(
                restore.checkpoint if restore else None, request.vertex_id
            ),
            checkpoint_config=wire.checkpoint_config_to_pb(runner.record.checkpoint_config),
            checkpoint_storage_uri=runner.storage.job_dir(runner.job_id),
            heartbeat_interval_ms=round(self.manager.settings.heartbeat_interval_s * 1000),
            heartbeat_timeout_ms=round(self.manager.settings.heartbeat_timeout_s * 1000),
        )

    @grpc_errors
    async def UpdateTaskState(
        self, request: cpb.UpdateTaskStateRequest, context: grpc.aio.ServicerContext
    ) -> cpb.UpdateTaskStateResponse:
        runner = self._runner(request.job_id)
        attempt = convert.attempt_from_pb(request.attempt)
        state = wire.TASK_STATE.from_pb_or(request.state, None)
        if state is None or state is TaskState.DEPLOYING:
            raise InvalidArgumentError("state must be RUNNING, FINISHED, FAILED or CANCELED")
        failure = limits.cut_chars(request.failure, limits.MAX_FAILURE_CHARS)
        await runner.update_task_state(attempt, state, failure, request.data_ended)
        return cpb.UpdateTaskStateResponse()

    @grpc_errors
    async def Heartbeat(
        self, request: cpb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> cpb.HeartbeatResponse:
        runner = self._runner(request.job_id)
        _address(request.address, "address")
        if len(request.tasks) > MAX_HEARTBEAT_TASKS:
            raise InvalidArgumentError(
                f"{len(request.tasks)} tasks in one heartbeat; at most {MAX_HEARTBEAT_TASKS}"
            )
        if len(request.task_metrics) > len(request.tasks):
            raise InvalidArgumentError(
                f"{len(request.task_metrics)} task_metrics in one heartbeat; at most one per "
                f"task ({len(request.tasks)})"
            )
        attempts = [convert.attempt_from_pb(a) for a in request.tasks]
        metrics = convert.task_metrics_reports_from_pb(request.task_metrics)
        settings = self.manager.settings
        return cpb.HeartbeatResponse(
            coordinator_epoch=self.manager.epoch,
            tasks_current=runner.heartbeat(request.address, attempts, metrics),
            heartbeat_interval_ms=round(settings.heartbeat_interval_s * 1000),
            heartbeat_timeout_ms=round(settings.heartbeat_timeout_s * 1000),
        )

    @grpc_errors
    async def ListTasks(
        self, request: cpb.ListTasksRequest, context: grpc.aio.ServicerContext
    ) -> cpb.ListTasksResponse:
        return cpb.ListTasksResponse(tasks=self._runner(request.job_id).task_infos())

    # --- checkpoints (task side) -------------------------------------------------------------------

    @grpc_errors
    async def AcknowledgeCheckpoint(
        self, request: cpb.AcknowledgeCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.AcknowledgeCheckpointResponse:
        runner = self._runner(request.job_id)
        attempt = convert.attempt_from_pb(request.attempt)
        checkpoint_id = convert.checkpoint_id_from_pb(request.checkpoint_id)
        states = convert.operator_states_from_pb(request.operator_states)
        metrics = convert.metrics_from_pb(request.metrics)
        held_ms = convert.held_ms_from_pb(request.held_ms)
        result = runner.acknowledge(
            attempt, checkpoint_id, states, metrics, request.input_ended, held_ms
        )
        return cpb.AcknowledgeCheckpointResponse(result=convert.ACK_RESULT.to_pb(result))

    @grpc_errors
    async def AcknowledgeCheckpoints(
        self, request: cpb.AcknowledgeCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.AcknowledgeCheckpointsResponse:
        if len(request.acks) > MAX_ACKS_PER_BATCH:
            raise InvalidArgumentError(
                f"{len(request.acks)} acks in one call; at most {MAX_ACKS_PER_BATCH}: split the batch"
            )
        outcomes = []
        for ack in request.acks:
            try:
                runner = self._runner(ack.job_id)
                result = runner.acknowledge(
                    convert.attempt_from_pb(ack.attempt),
                    convert.checkpoint_id_from_pb(ack.checkpoint_id),
                    convert.operator_states_from_pb(ack.operator_states),
                    convert.metrics_from_pb(ack.metrics),
                    ack.input_ended,
                    convert.held_ms_from_pb(ack.held_ms),
                )
            except SnapflowError as error:
                code, message = status_for(error)
                outcomes.append(cpb.AckOutcome(error_code=code.value[0], error_message=message))
            else:
                outcomes.append(cpb.AckOutcome(result=convert.ACK_RESULT.to_pb(result)))
        return cpb.AcknowledgeCheckpointsResponse(outcomes=outcomes)

    @grpc_errors
    async def DeclineCheckpoint(
        self, request: cpb.DeclineCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.DeclineCheckpointResponse:
        runner = self._runner(request.job_id)
        attempt = convert.attempt_from_pb(request.attempt)
        checkpoint_id = convert.checkpoint_id_from_pb(request.checkpoint_id)
        reason = convert.decline_reason_from_pb(request.reason)
        message = limits.cut_chars(request.message, limits.MAX_FAILURE_CHARS)
        runner.decline(attempt, checkpoint_id, reason, message)
        return cpb.DeclineCheckpointResponse()

    # --- checkpoints (user side) ---------------------------------------------------------------------

    async def _trigger(
        self,
        job_id: str,
        kind: CheckpointKind,
        target: str,
        context: grpc.aio.ServicerContext,
        input_ended: ExecutionAttempt | None = None,
    ) -> cpb.CheckpointSummary:
        runner = self._runner(job_id)
        _location(target, "target_directory")
        check_confined(target, self.manager.settings.allowed_roots(), "target_directory")
        try:
            cp: CompletedCheckpoint = await runner.trigger(
                kind, target, self._deadline(context), input_ended
            )
        except CheckpointRefusedError as refused:
            raise runner.naming_the_job_state(refused) from None
        return runner.summary_of_completed(cp)

    @grpc_errors
    async def TriggerCheckpoint(
        self, request: cpb.TriggerCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.CheckpointSummary:
        input_ended = (
            convert.attempt_from_pb(request.input_ended)
            if request.HasField("input_ended")
            else None
        )
        return await self._trigger(
            request.job_id, CheckpointKind.CHECKPOINT, "", context, input_ended
        )

    @grpc_errors
    async def TriggerSavepoint(
        self, request: cpb.TriggerSavepointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.CheckpointSummary:
        return await self._trigger(
            request.job_id, CheckpointKind.SAVEPOINT, request.target_directory, context
        )

    @grpc_errors
    async def StopWithSavepoint(
        self, request: cpb.StopWithSavepointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.CheckpointSummary:
        kind = (
            CheckpointKind.SAVEPOINT_TERMINATE
            if request.drain
            else CheckpointKind.SAVEPOINT_SUSPEND
        )
        return await self._trigger(request.job_id, kind, request.target_directory, context)

    @grpc_errors
    async def StartSavepoint(
        self, request: cpb.StartSavepointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SavepointOperation:
        runner = self._runner(request.job_id)
        if request.drain and not request.stop:
            raise InvalidArgumentError("drain applies only with stop (stop-with-savepoint)")
        _location(request.target_directory, "target_directory")
        check_confined(
            request.target_directory, self.manager.settings.allowed_roots(), "target_directory"
        )
        if not request.stop:
            kind = CheckpointKind.SAVEPOINT
        elif request.drain:
            kind = CheckpointKind.SAVEPOINT_TERMINATE
        else:
            kind = CheckpointKind.SAVEPOINT_SUSPEND
        operation = runner.start_savepoint(kind, request.target_directory)
        return _operation_pb(runner, operation)

    @grpc_errors
    async def GetSavepointOperation(
        self, request: cpb.GetSavepointOperationRequest, context: grpc.aio.ServicerContext
    ) -> cpb.SavepointOperation:
        runner = self._runner(request.job_id)
        if not request.request_id:
            raise InvalidArgumentError("request_id is required (StartSavepoint returns it)")
        limits.check_length(request.request_id, limits.MAX_ID_CHARS, "request_id")
        operation = runner.savepoint_operation(request.request_id)
        return _operation_pb(runner, operation)

    @grpc_errors
    async def DisposeSavepoint(
        self, request: cpb.DisposeSavepointRequest, context: grpc.aio.ServicerContext
    ) -> cpb.DisposeSavepointResponse:
        if not request.savepoint_path:
            raise InvalidArgumentError("savepoint_path is required")
        _location(request.savepoint_path, "savepoint_path")
        check_confined(
            request.savepoint_path, self.manager.settings.allowed_roots(), "savepoint_path"
        )
        await self.manager.dispose_savepoint(request.savepoint_path)
        return cpb.DisposeSavepointResponse()

    # --- stats ---------------------------------------------------------------------------------------

    @grpc_errors
    async def GetCheckpointStats(
        self, request: cpb.GetCheckpointStatsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.CheckpointStats:
        if not 0 <= request.history_size <= MAX_HISTORY:
            raise InvalidArgumentError(f"history_size must be in 0..{MAX_HISTORY} (0 = all kept)")
        return self._runner(request.job_id).stats_pb(request.history_size)

    @grpc_errors
    async def GetCheckpointDetails(
        self, request: cpb.GetCheckpointDetailsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.CheckpointDetails:
        runner = self._runner(request.job_id)
        return runner.details_pb(convert.checkpoint_id_from_pb(request.checkpoint_id))


def _operation_pb(runner: JobRunner, operation: SavepointOperation) -> cpb.SavepointOperation:
    summary = None
    if operation.savepoint is not None:
        summary = runner.summary_of_completed(operation.savepoint)
    return convert.savepoint_operation_to_pb(runner.job_id, operation, summary)


__all__ = ["CoordinatorServicer", "pb"]

from snapflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_RESULT_UNSPECIFIED: _ClassVar[AckResult]
    ACK_RESULT_SUCCESS: _ClassVar[AckResult]
    ACK_RESULT_DUPLICATE: _ClassVar[AckResult]
    ACK_RESULT_UNKNOWN: _ClassVar[AckResult]
    ACK_RESULT_DISCARDED: _ClassVar[AckResult]

class DeclineReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECLINE_REASON_UNSPECIFIED: _ClassVar[DeclineReason]
    DECLINE_REASON_SNAPSHOT_FAILED: _ClassVar[DeclineReason]
    DECLINE_REASON_TASK_NOT_READY: _ClassVar[DeclineReason]
    DECLINE_REASON_SUBSUMED: _ClassVar[DeclineReason]
    DECLINE_REASON_ALIGNMENT_CANCELED: _ClassVar[DeclineReason]
    DECLINE_REASON_IO_ERROR: _ClassVar[DeclineReason]

class SavepointOperationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAVEPOINT_OPERATION_STATUS_UNSPECIFIED: _ClassVar[SavepointOperationStatus]
    SAVEPOINT_OPERATION_STATUS_IN_PROGRESS: _ClassVar[SavepointOperationStatus]
    SAVEPOINT_OPERATION_STATUS_COMPLETED: _ClassVar[SavepointOperationStatus]
    SAVEPOINT_OPERATION_STATUS_FAILED: _ClassVar[SavepointOperationStatus]
ACK_RESULT_UNSPECIFIED: AckResult
ACK_RESULT_SUCCESS: AckResult
ACK_RESULT_DUPLICATE: AckResult
ACK_RESULT_UNKNOWN: AckResult
ACK_RESULT_DISCARDED: AckResult
DECLINE_REASON_UNSPECIFIED: DeclineReason
DECLINE_REASON_SNAPSHOT_FAILED: DeclineReason
DECLINE_REASON_TASK_NOT_READY: DeclineReason
DECLINE_REASON_SUBSUMED: DeclineReason
DECLINE_REASON_ALIGNMENT_CANCELED: DeclineReason
DECLINE_REASON_IO_ERROR: DeclineReason
SAVEPOINT_OPERATION_STATUS_UNSPECIFIED: SavepointOperationStatus
SAVEPOINT_OPERATION_STATUS_IN_PROGRESS: SavepointOperationStatus
SAVEPOINT_OPERATION_STATUS_COMPLETED: SavepointOperationStatus
SAVEPOINT_OPERATION_STATUS_FAILED: SavepointOperationStatus

class RestoreSettings(_message.Message):
    __slots__ = ("latest", "checkpoint_id", "savepoint_path", "allow_non_restored_state")
    LATEST_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    ALLOW_NON_RESTORED_STATE_FIELD_NUMBER: _ClassVar[int]
    latest: bool
    checkpoint_id: int
    savepoint_path: str
    allow_non_restored_state: bool
    def __init__(self, latest: _Optional[bool] = ..., checkpoint_id: _Optional[int] = ..., savepoint_path: _Optional[str] = ..., allow_non_restored_state: _Optional[bool] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("graph", "checkpoint_config", "restore", "job_id")
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    graph: _common_pb2.JobGraph
    checkpoint_config: _common_pb2.CheckpointConfig
    restore: RestoreSettings
    job_id: str
    def __init__(self, graph: _Optional[_Union[_common_pb2.JobGraph, _Mapping]] = ..., checkpoint_config: _Optional[_Union[_common_pb2.CheckpointConfig, _Mapping]] = ..., restore: _Optional[_Union[RestoreSettings, _Mapping]] = ..., job_id: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: JobInfo
    def __init__(self, job: _Optional[_Union[JobInfo, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "include_operator_payloads")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OPERATOR_PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    include_operator_payloads: bool
    def __init__(self, job_id: _Optional[str] = ..., include_operator_payloads: _Optional[bool] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("attempt", "state", "address", "failure", "metrics", "metrics_timestamp_ms", "data_ended")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    METRICS_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDED_FIELD_NUMBER: _ClassVar[int]
    attempt: _common_pb2.TaskAttempt
    state: _common_pb2.TaskState
    address: str
    failure: str
    metrics: TaskMetrics
    metrics_timestamp_ms: int
    data_ended: bool
    def __init__(self, attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.TaskState, str]] = ..., address: _Optional[str] = ..., failure: _Optional[str] = ..., metrics: _Optional[_Union[TaskMetrics, _Mapping]] = ..., metrics_timestamp_ms: _Optional[int] = ..., data_ended: _Optional[bool] = ...) -> None: ...

class TaskMetrics(_message.Message):
    __slots__ = ("busy_ms_per_second", "backpressured_ms_per_second", "has_watermark", "watermark_ms", "period_ms")
    BUSY_MS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURED_MS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    HAS_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    busy_ms_per_second: float
    backpressured_ms_per_second: float
    has_watermark: bool
    watermark_ms: int
    period_ms: int
    def __init__(self, busy_ms_per_second: _Optional[float] = ..., backpressured_ms_per_second: _Optional[float] = ..., has_watermark: _Optional[bool] = ..., watermark_ms: _Optional[int] = ..., period_ms: _Optional[int] = ...) -> None: ...

class TaskMetricsReport(_message.Message):
    __slots__ = ("attempt", "metrics")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    attempt: _common_pb2.TaskAttempt
    metrics: TaskMetrics
    def __init__(self, attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., metrics: _Optional[_Union[TaskMetrics, _Mapping]] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job_id", "name", "state", "graph", "checkpoint_config", "created_at_ms", "restarts", "latest_completed_checkpoint_id", "failure", "total_tasks", "running_tasks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LATEST_COMPLETED_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TASKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    name: str
    state: _common_pb2.JobState
    graph: _common_pb2.JobGraph
    checkpoint_config: _common_pb2.CheckpointConfig
    created_at_ms: int
    restarts: int
    latest_completed_checkpoint_id: int
    failure: str
    total_tasks: int
    running_tasks: int
    def __init__(self, job_id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., graph: _Optional[_Union[_common_pb2.JobGraph, _Mapping]] = ..., checkpoint_config: _Optional[_Union[_common_pb2.CheckpointConfig, _Mapping]] = ..., created_at_ms: _Optional[int] = ..., restarts: _Optional[int] = ..., latest_completed_checkpoint_id: _Optional[int] = ..., failure: _Optional[str] = ..., total_tasks: _Optional[int] = ..., running_tasks: _Optional[int] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "timestamp_ms", "job_state_changed", "task_failed", "checkpoint_completed", "checkpoint_failed")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    TASK_FAILED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FAILED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    timestamp_ms: int
    job_state_changed: JobStateChanged
    task_failed: TaskFailed
    checkpoint_completed: CheckpointSummary
    checkpoint_failed: CheckpointSummary
    def __init__(self, job_id: _Optional[str] = ..., timestamp_ms: _Optional[int] = ..., job_state_changed: _Optional[_Union[JobStateChanged, _Mapping]] = ..., task_failed: _Optional[_Union[TaskFailed, _Mapping]] = ..., checkpoint_completed: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., checkpoint_failed: _Optional[_Union[CheckpointSummary, _Mapping]] = ...) -> None: ...

class JobStateChanged(_message.Message):
    __slots__ = ("state", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.JobState
    reason: str
    def __init__(self, state: _Optional[_Union[_common_pb2.JobState, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class TaskFailed(_message.Message):
    __slots__ = ("attempt", "message")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    attempt: _common_pb2.TaskAttempt
    message: str
    def __init__(self, attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class RegisterTaskRequest(_message.Message):
    __slots__ = ("job_id", "vertex_id", "subtask_index", "address", "launch")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    SUBTASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    vertex_id: str
    subtask_index: int
    address: str
    launch: int
    def __init__(self, job_id: _Optional[str] = ..., vertex_id: _Optional[str] = ..., subtask_index: _Optional[int] = ..., address: _Optional[str] = ..., launch: _Optional[int] = ...) -> None: ...

class TaskRestore(_message.Message):
    __slots__ = ("checkpoint_id", "checkpoint_path", "vertex_state", "previous_parallelism")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    VERTEX_STATE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    checkpoint_path: str
    vertex_state: _containers.RepeatedCompositeFieldContainer[VertexSubtaskState]
    previous_parallelism: int
    def __init__(self, checkpoint_id: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., vertex_state: _Optional[_Iterable[_Union[VertexSubtaskState, _Mapping]]] = ..., previous_parallelism: _Optional[int] = ...) -> None: ...

class VertexSubtaskState(_message.Message):
    __slots__ = ("subtask_index", "operators")
    SUBTASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    subtask_index: int
    operators: _containers.RepeatedCompositeFieldContainer[_common_pb2.OperatorSubtaskState]
    def __init__(self, subtask_index: _Optional[int] = ..., operators: _Optional[_Iterable[_Union[_common_pb2.OperatorSubtaskState, _Mapping]]] = ...) -> None: ...

class RegisterTaskResponse(_message.Message):
    __slots__ = ("attempt", "coordinator_epoch", "restore", "checkpoint_config", "checkpoint_storage_uri", "heartbeat_interval_ms", "heartbeat_timeout_ms")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STORAGE_URI_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    attempt: _common_pb2.TaskAttempt
    coordinator_epoch: int
    restore: TaskRestore
    checkpoint_config: _common_pb2.CheckpointConfig
    checkpoint_storage_uri: str
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    def __init__(self, attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., coordinator_epoch: _Optional[int] = ..., restore: _Optional[_Union[TaskRestore, _Mapping]] = ..., checkpoint_config: _Optional[_Union[_common_pb2.CheckpointConfig, _Mapping]] = ..., checkpoint_storage_uri: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., heartbeat_timeout_ms: _Optional[int] = ...) -> None: ...

class UpdateTaskStateRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "state", "failure", "data_ended")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: _common_pb2.TaskAttempt
    state: _common_pb2.TaskState
    failure: str
    data_ended: bool
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., state: _Optional[_Union[_common_pb2.TaskState, str]] = ..., failure: _Optional[str] = ..., data_ended: _Optional[bool] = ...) -> None: ...

class UpdateTaskStateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("job_id", "address", "tasks", "task_metrics")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TASK_METRICS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    address: str
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskAttempt]
    task_metrics: _containers.RepeatedCompositeFieldContainer[TaskMetricsReport]
    def __init__(self, job_id: _Optional[str] = ..., address: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[_common_pb2.TaskAttempt, _Mapping]]] = ..., task_metrics: _Optional[_Iterable[_Union[TaskMetricsReport, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("coordinator_epoch", "tasks_current", "heartbeat_interval_ms", "heartbeat_timeout_ms")
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TASKS_CURRENT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    coordinator_epoch: int
    tasks_current: bool
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    def __init__(self, coordinator_epoch: _Optional[int] = ..., tasks_current: _Optional[bool] = ..., heartbeat_interval_ms: _Optional[int] = ..., heartbeat_timeout_ms: _Optional[int] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ...) -> None: ...

class AcknowledgeCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "checkpoint_id", "operator_states", "metrics", "input_ended", "held_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_STATES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    INPUT_ENDED_FIELD_NUMBER: _ClassVar[int]
    HELD_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: _common_pb2.TaskAttempt
    checkpoint_id: int
    operator_states: _containers.RepeatedCompositeFieldContainer[_common_pb2.OperatorSubtaskState]
    metrics: _common_pb2.SubtaskCheckpointMetrics
    input_ended: bool
    held_ms: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., checkpoint_id: _Optional[int] = ..., operator_states: _Optional[_Iterable[_Union[_common_pb2.OperatorSubtaskState, _Mapping]]] = ..., metrics: _Optional[_Union[_common_pb2.SubtaskCheckpointMetrics, _Mapping]] = ..., input_ended: _Optional[bool] = ..., held_ms: _Optional[int] = ...) -> None: ...

class AcknowledgeCheckpointResponse(_message.Message):
    __slots__ = ("result",)
    RESULT_FIELD_NUMBER: _ClassVar[int]
    result: AckResult
    def __init__(self, result: _Optional[_Union[AckResult, str]] = ...) -> None: ...

class AcknowledgeCheckpointsRequest(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[AcknowledgeCheckpointRequest]
    def __init__(self, acks: _Optional[_Iterable[_Union[AcknowledgeCheckpointRequest, _Mapping]]] = ...) -> None: ...

class AckOutcome(_message.Message):
    __slots__ = ("result", "error_code", "error_message")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    result: AckResult
    error_code: int
    error_message: str
    def __init__(self, result: _Optional[_Union[AckResult, str]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class AcknowledgeCheckpointsResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[AckOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[AckOutcome, _Mapping]]] = ...) -> None: ...

class DeclineCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "checkpoint_id", "reason", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: _common_pb2.TaskAttempt
    checkpoint_id: int
    reason: DeclineReason
    message: str
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., checkpoint_id: _Optional[int] = ..., reason: _Optional[_Union[DeclineReason, str]] = ..., message: _Optional[str] = ...) -> None: ...

class DeclineCheckpointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TriggerCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "input_ended")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_ENDED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    input_ended: _common_pb2.TaskAttempt
    def __init__(self, job_id: _Optional[str] = ..., input_ended: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ...) -> None: ...

class TriggerSavepointRequest(_message.Message):
    __slots__ = ("job_id", "target_directory")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    target_directory: str
    def __init__(self, job_id: _Optional[str] = ..., target_directory: _Optional[str] = ...) -> None: ...

class StopWithSavepointRequest(_message.Message):
    __slots__ = ("job_id", "target_directory", "drain")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    target_directory: str
    drain: bool
    def __init__(self, job_id: _Optional[str] = ..., target_directory: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...

class DisposeSavepointRequest(_message.Message):
    __slots__ = ("savepoint_path",)
    SAVEPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    savepoint_path: str
    def __init__(self, savepoint_path: _Optional[str] = ...) -> None: ...

class DisposeSavepointResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StartSavepointRequest(_message.Message):
    __slots__ = ("job_id", "target_directory", "stop", "drain")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    target_directory: str
    stop: bool
    drain: bool
    def __init__(self, job_id: _Optional[str] = ..., target_directory: _Optional[str] = ..., stop: _Optional[bool] = ..., drain: _Optional[bool] = ...) -> None: ...

class GetSavepointOperationRequest(_message.Message):
    __slots__ = ("job_id", "request_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class SavepointOperation(_message.Message):
    __slots__ = ("job_id", "request_id", "status", "savepoint", "failure")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request_id: str
    status: SavepointOperationStatus
    savepoint: CheckpointSummary
    failure: str
    def __init__(self, job_id: _Optional[str] = ..., request_id: _Optional[str] = ..., status: _Optional[_Union[SavepointOperationStatus, str]] = ..., savepoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., failure: _Optional[str] = ...) -> None: ...

class GetCheckpointStatsRequest(_message.Message):
    __slots__ = ("job_id", "history_size")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    history_size: int
    def __init__(self, job_id: _Optional[str] = ..., history_size: _Optional[int] = ...) -> None: ...

class GetCheckpointDetailsRequest(_message.Message):
    __slots__ = ("job_id", "checkpoint_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    checkpoint_id: int
    def __init__(self, job_id: _Optional[str] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class CheckpointSummary(_message.Message):
    __slots__ = ("checkpoint_id", "kind", "status", "trigger_timestamp_ms", "latest_ack_timestamp_ms", "end_to_end_duration_ms", "state_size_bytes", "processed_during_alignment_bytes", "persisted_in_flight_bytes", "num_acknowledged", "num_tasks", "external_path", "failure_reason", "failure_message", "unaligned", "completion_latency_ms", "source_records", "discarded", "incremental_size_bytes", "shared_size_bytes", "max_alignment_duration_ms")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    LATEST_ACK_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    END_TO_END_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_DURING_ALIGNMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_IN_FLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_PATH_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    FAILURE_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    UNALIGNED_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    INCREMENTAL_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ALIGNMENT_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    kind: _common_pb2.CheckpointKind
    status: _common_pb2.CheckpointStatus
    trigger_timestamp_ms: int
    latest_ack_timestamp_ms: int
    end_to_end_duration_ms: int
    state_size_bytes: int
    processed_during_alignment_bytes: int
    persisted_in_flight_bytes: int
    num_acknowledged: int
    num_tasks: int
    external_path: str
    failure_reason: str
    failure_message: str
    unaligned: bool
    completion_latency_ms: float
    source_records: int
    discarded: bool
    incremental_size_bytes: int
    shared_size_bytes: int
    max_alignment_duration_ms: int
    def __init__(self, checkpoint_id: _Optional[int] = ..., kind: _Optional[_Union[_common_pb2.CheckpointKind, str]] = ..., status: _Optional[_Union[_common_pb2.CheckpointStatus, str]] = ..., trigger_timestamp_ms: _Optional[int] = ..., latest_ack_timestamp_ms: _Optional[int] = ..., end_to_end_duration_ms: _Optional[int] = ..., state_size_bytes: _Optional[int] = ..., processed_during_alignment_bytes: _Optional[int] = ..., persisted_in_flight_bytes: _Optional[int] = ..., num_acknowledged: _Optional[int] = ..., num_tasks: _Optional[int] = ..., external_path: _Optional[str] = ..., failure_reason: _Optional[str] = ..., failure_message: _Optional[str] = ..., unaligned: _Optional[bool] = ..., completion_latency_ms: _Optional[float] = ..., source_records: _Optional[int] = ..., discarded: _Optional[bool] = ..., incremental_size_bytes: _Optional[int] = ..., shared_size_bytes: _Optional[int] = ..., max_alignment_duration_ms: _Optional[int] = ...) -> None: ...

class Quantiles(_message.Message):
    __slots__ = ("min", "avg", "p50", "p90", "p99", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    AVG_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P90_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    avg: float
    p50: float
    p90: float
    p99: float
    max: float
    def __init__(self, min: _Optional[float] = ..., avg: _Optional[float] = ..., p50: _Optional[float] = ..., p90: _Optional[float] = ..., p99: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class CheckpointCounts(_message.Message):
    __slots__ = ("triggered", "in_progress", "completed", "failed", "restored")
    TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    triggered: int
    in_progress: int
    completed: int
    failed: int
    restored: int
    def __init__(self, triggered: _Optional[int] = ..., in_progress: _Optional[int] = ..., completed: _Optional[int] = ..., failed: _Optional[int] = ..., restored: _Optional[int] = ...) -> None: ...

class RestoreInfo(_message.Message):
    __slots__ = ("checkpoint_id", "restore_timestamp_ms", "is_savepoint", "external_path")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    RESTORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    IS_SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_PATH_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    restore_timestamp_ms: int
    is_savepoint: bool
    external_path: str
    def __init__(self, checkpoint_id: _Optional[int] = ..., restore_timestamp_ms: _Optional[int] = ..., is_savepoint: _Optional[bool] = ..., external_path: _Optional[str] = ...) -> None: ...

class CheckpointStats(_message.Message):
    __slots__ = ("counts", "latest_completed", "latest_failed", "latest_savepoint", "latest_restore", "history", "end_to_end_duration_ms", "state_size_bytes", "processed_during_alignment_bytes", "persisted_in_flight_bytes", "incremental_size_bytes")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    LATEST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    LATEST_FAILED_FIELD_NUMBER: _ClassVar[int]
    LATEST_SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    LATEST_RESTORE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    END_TO_END_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_DURING_ALIGNMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_IN_FLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    INCREMENTAL_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    counts: CheckpointCounts
    latest_completed: CheckpointSummary
    latest_failed: CheckpointSummary
    latest_savepoint: CheckpointSummary
    latest_restore: RestoreInfo
    history: _containers.RepeatedCompositeFieldContainer[CheckpointSummary]
    end_to_end_duration_ms: Quantiles
    state_size_bytes: Quantiles
    processed_during_alignment_bytes: Quantiles
    persisted_in_flight_bytes: Quantiles
    incremental_size_bytes: Quantiles
    def __init__(self, counts: _Optional[_Union[CheckpointCounts, _Mapping]] = ..., latest_completed: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., latest_failed: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., latest_savepoint: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., latest_restore: _Optional[_Union[RestoreInfo, _Mapping]] = ..., history: _Optional[_Iterable[_Union[CheckpointSummary, _Mapping]]] = ..., end_to_end_duration_ms: _Optional[_Union[Quantiles, _Mapping]] = ..., state_size_bytes: _Optional[_Union[Quantiles, _Mapping]] = ..., processed_during_alignment_bytes: _Optional[_Union[Quantiles, _Mapping]] = ..., persisted_in_flight_bytes: _Optional[_Union[Quantiles, _Mapping]] = ..., incremental_size_bytes: _Optional[_Union[Quantiles, _Mapping]] = ...) -> None: ...

class SubtaskCheckpointDetails(_message.Message):
    __slots__ = ("attempt", "acknowledged", "ack_timestamp_ms", "end_to_end_duration_ms", "metrics", "incremental_size_bytes", "shared_size_bytes")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    ACK_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    END_TO_END_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    INCREMENTAL_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    attempt: _common_pb2.TaskAttempt
    acknowledged: bool
    ack_timestamp_ms: int
    end_to_end_duration_ms: int
    metrics: _common_pb2.SubtaskCheckpointMetrics
    incremental_size_bytes: int
    shared_size_bytes: int
    def __init__(self, attempt: _Optional[_Union[_common_pb2.TaskAttempt, _Mapping]] = ..., acknowledged: _Optional[bool] = ..., ack_timestamp_ms: _Optional[int] = ..., end_to_end_duration_ms: _Optional[int] = ..., metrics: _Optional[_Union[_common_pb2.SubtaskCheckpointMetrics, _Mapping]] = ..., incremental_size_bytes: _Optional[int] = ..., shared_size_bytes: _Optional[int] = ...) -> None: ...

class CheckpointDetails(_message.Message):
    __slots__ = ("summary", "subtasks")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SUBTASKS_FIELD_NUMBER: _ClassVar[int]
    summary: CheckpointSummary
    subtasks: _containers.RepeatedCompositeFieldContainer[SubtaskCheckpointDetails]
    def __init__(self, summary: _Optional[_Union[CheckpointSummary, _Mapping]] = ..., subtasks: _Optional[_Iterable[_Union[SubtaskCheckpointDetails, _Mapping]]] = ...) -> None: ...

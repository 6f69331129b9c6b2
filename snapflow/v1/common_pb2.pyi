from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CheckpointMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_MODE_UNSPECIFIED: _ClassVar[CheckpointMode]
    CHECKPOINT_MODE_ALIGNED: _ClassVar[CheckpointMode]
    CHECKPOINT_MODE_UNALIGNED: _ClassVar[CheckpointMode]
    CHECKPOINT_MODE_AT_LEAST_ONCE: _ClassVar[CheckpointMode]

class CheckpointKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_KIND_UNSPECIFIED: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_CHECKPOINT: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_SAVEPOINT: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_SAVEPOINT_SUSPEND: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_SAVEPOINT_TERMINATE: _ClassVar[CheckpointKind]

class CheckpointStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_STATUS_UNSPECIFIED: _ClassVar[CheckpointStatus]
    CHECKPOINT_STATUS_IN_PROGRESS: _ClassVar[CheckpointStatus]
    CHECKPOINT_STATUS_COMPLETED: _ClassVar[CheckpointStatus]
    CHECKPOINT_STATUS_FAILED: _ClassVar[CheckpointStatus]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_DEPLOYING: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_FINISHED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELED: _ClassVar[TaskState]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_CREATED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_RESTARTING: _ClassVar[JobState]
    JOB_STATE_FINISHED: _ClassVar[JobState]
    JOB_STATE_CANCELED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]

class PartitionerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITIONER_KIND_UNSPECIFIED: _ClassVar[PartitionerKind]
    PARTITIONER_KIND_FORWARD: _ClassVar[PartitionerKind]
    PARTITIONER_KIND_HASH: _ClassVar[PartitionerKind]
    PARTITIONER_KIND_REBALANCE: _ClassVar[PartitionerKind]
    PARTITIONER_KIND_BROADCAST: _ClassVar[PartitionerKind]
CHECKPOINT_MODE_UNSPECIFIED: CheckpointMode
CHECKPOINT_MODE_ALIGNED: CheckpointMode
CHECKPOINT_MODE_UNALIGNED: CheckpointMode
CHECKPOINT_MODE_AT_LEAST_ONCE: CheckpointMode
CHECKPOINT_KIND_UNSPECIFIED: CheckpointKind
CHECKPOINT_KIND_CHECKPOINT: CheckpointKind
CHECKPOINT_KIND_SAVEPOINT: CheckpointKind
CHECKPOINT_KIND_SAVEPOINT_SUSPEND: CheckpointKind
CHECKPOINT_KIND_SAVEPOINT_TERMINATE: CheckpointKind
CHECKPOINT_STATUS_UNSPECIFIED: CheckpointStatus
CHECKPOINT_STATUS_IN_PROGRESS: CheckpointStatus
CHECKPOINT_STATUS_COMPLETED: CheckpointStatus
CHECKPOINT_STATUS_FAILED: CheckpointStatus
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_DEPLOYING: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_FINISHED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELED: TaskState
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_CREATED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_RESTARTING: JobState
JOB_STATE_FINISHED: JobState
JOB_STATE_CANCELED: JobState
JOB_STATE_FAILED: JobState
PARTITIONER_KIND_UNSPECIFIED: PartitionerKind
PARTITIONER_KIND_FORWARD: PartitionerKind
PARTITIONER_KIND_HASH: PartitionerKind
PARTITIONER_KIND_REBALANCE: PartitionerKind
PARTITIONER_KIND_BROADCAST: PartitionerKind

class OperatorSpec(_message.Message):
    __slots__ = ("operator_id", "name", "kind", "payload")
    OPERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    operator_id: str
    name: str
    kind: str
    payload: bytes
    def __init__(self, operator_id: _Optional[str] = ..., name: _Optional[str] = ..., kind: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class JobVertex(_message.Message):
    __slots__ = ("vertex_id", "name", "parallelism", "max_parallelism", "operators", "is_source")
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    MAX_PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    IS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    vertex_id: str
    name: str
    parallelism: int
    max_parallelism: int
    operators: _containers.RepeatedCompositeFieldContainer[OperatorSpec]
    is_source: bool
    def __init__(self, vertex_id: _Optional[str] = ..., name: _Optional[str] = ..., parallelism: _Optional[int] = ..., max_parallelism: _Optional[int] = ..., operators: _Optional[_Iterable[_Union[OperatorSpec, _Mapping]]] = ..., is_source: _Optional[bool] = ...) -> None: ...

class JobEdge(_message.Message):
    __slots__ = ("source_vertex_id", "target_vertex_id", "partitioner", "key_field", "target_input", "output_tag")
    SOURCE_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONER_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_FIELD_NUMBER: _ClassVar[int]
    TARGET_INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAG_FIELD_NUMBER: _ClassVar[int]
    source_vertex_id: str
    target_vertex_id: str
    partitioner: PartitionerKind
    key_field: str
    target_input: int
    output_tag: str
    def __init__(self, source_vertex_id: _Optional[str] = ..., target_vertex_id: _Optional[str] = ..., partitioner: _Optional[_Union[PartitionerKind, str]] = ..., key_field: _Optional[str] = ..., target_input: _Optional[int] = ..., output_tag: _Optional[str] = ...) -> None: ...

class JobGraph(_message.Message):
    __slots__ = ("name", "vertices", "edges")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERTICES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    name: str
    vertices: _containers.RepeatedCompositeFieldContainer[JobVertex]
    edges: _containers.RepeatedCompositeFieldContainer[JobEdge]
    def __init__(self, name: _Optional[str] = ..., vertices: _Optional[_Iterable[_Union[JobVertex, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[JobEdge, _Mapping]]] = ...) -> None: ...

class CheckpointConfig(_message.Message):
    __slots__ = ("interval_ms", "timeout_ms", "min_pause_ms", "max_concurrent", "mode", "aligned_checkpoint_timeout_ms", "tolerable_failures", "retained", "storage_uri", "tolerable_failures_unlimited", "state_backend", "state_backend_options", "inline_state_threshold_bytes")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALIGNED_CHECKPOINT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOLERABLE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    STORAGE_URI_FIELD_NUMBER: _ClassVar[int]
    TOLERABLE_FAILURES_UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    STATE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    STATE_BACKEND_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    INLINE_STATE_THRESHOLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    timeout_ms: int
    min_pause_ms: int
    max_concurrent: int
    mode: CheckpointMode
    aligned_checkpoint_timeout_ms: int
    tolerable_failures: int
    retained: int
    storage_uri: str
    tolerable_failures_unlimited: bool
    state_backend: str
    state_backend_options: StateBackendOptions
    inline_state_threshold_bytes: int
    def __init__(self, interval_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., min_pause_ms: _Optional[int] = ..., max_concurrent: _Optional[int] = ..., mode: _Optional[_Union[CheckpointMode, str]] = ..., aligned_checkpoint_timeout_ms: _Optional[int] = ..., tolerable_failures: _Optional[int] = ..., retained: _Optional[int] = ..., storage_uri: _Optional[str] = ..., tolerable_failures_unlimited: _Optional[bool] = ..., state_backend: _Optional[str] = ..., state_backend_options: _Optional[_Union[StateBackendOptions, _Mapping]] = ..., inline_state_threshold_bytes: _Optional[int] = ...) -> None: ...

class StateBackendOptions(_message.Message):
    __slots__ = ("memory_budget_bytes", "cache_entries", "compaction_style", "compaction_trigger", "max_size_amplification_percent", "upload_threads", "local_recovery")
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_STYLE_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_TRIGGER_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_AMPLIFICATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_THREADS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RECOVERY_FIELD_NUMBER: _ClassVar[int]
    memory_budget_bytes: int
    cache_entries: int
    compaction_style: str
    compaction_trigger: int
    max_size_amplification_percent: int
    upload_threads: int
    local_recovery: bool
    def __init__(self, memory_budget_bytes: _Optional[int] = ..., cache_entries: _Optional[int] = ..., compaction_style: _Optional[str] = ..., compaction_trigger: _Optional[int] = ..., max_size_amplification_percent: _Optional[int] = ..., upload_threads: _Optional[int] = ..., local_recovery: _Optional[bool] = ...) -> None: ...

class TaskAttempt(_message.Message):
    __slots__ = ("vertex_id", "subtask_index", "attempt")
    VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    SUBTASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    vertex_id: str
    subtask_index: int
    attempt: int
    def __init__(self, vertex_id: _Optional[str] = ..., subtask_index: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class StateHandle(_message.Message):
    __slots__ = ("path", "size_bytes", "kind", "key_group_start", "key_group_end", "offset", "data")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUP_START_FIELD_NUMBER: _ClassVar[int]
    KEY_GROUP_END_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    kind: str
    key_group_start: int
    key_group_end: int
    offset: int
    data: bytes
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., kind: _Optional[str] = ..., key_group_start: _Optional[int] = ..., key_group_end: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class OperatorSubtaskState(_message.Message):
    __slots__ = ("operator_id", "handles")
    OPERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    operator_id: str
    handles: _containers.RepeatedCompositeFieldContainer[StateHandle]
    def __init__(self, operator_id: _Optional[str] = ..., handles: _Optional[_Iterable[_Union[StateHandle, _Mapping]]] = ...) -> None: ...

class SubtaskCheckpointMetrics(_message.Message):
    __slots__ = ("sync_duration_ms", "async_duration_ms", "alignment_duration_ms", "start_delay_ms", "state_size_bytes", "processed_during_alignment_bytes", "persisted_in_flight_bytes", "unaligned", "records_in")
    SYNC_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ASYNC_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    START_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_DURING_ALIGNMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_IN_FLIGHT_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNALIGNED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_IN_FIELD_NUMBER: _ClassVar[int]
    sync_duration_ms: int
    async_duration_ms: int
    alignment_duration_ms: int
    start_delay_ms: int
    state_size_bytes: int
    processed_during_alignment_bytes: int
    persisted_in_flight_bytes: int
    unaligned: bool
    records_in: int
    def __init__(self, sync_duration_ms: _Optional[int] = ..., async_duration_ms: _Optional[int] = ..., alignment_duration_ms: _Optional[int] = ..., start_delay_ms: _Optional[int] = ..., state_size_bytes: _Optional[int] = ..., processed_during_alignment_bytes: _Optional[int] = ..., persisted_in_flight_bytes: _Optional[int] = ..., unaligned: _Optional[bool] = ..., records_in: _Optional[int] = ...) -> None: ...

class CheckpointOptions(_message.Message):
    __slots__ = ("kind", "mode", "aligned_checkpoint_timeout_ms", "target_location", "inline_state_threshold_bytes")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ALIGNED_CHECKPOINT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LOCATION_FIELD_NUMBER: _ClassVar[int]
    INLINE_STATE_THRESHOLD_BYTES_FIELD_NUMBER: _ClassVar[int]
    kind: CheckpointKind
    mode: CheckpointMode
    aligned_checkpoint_timeout_ms: int
    target_location: str
    inline_state_threshold_bytes: int
    def __init__(self, kind: _Optional[_Union[CheckpointKind, str]] = ..., mode: _Optional[_Union[CheckpointMode, str]] = ..., aligned_checkpoint_timeout_ms: _Optional[int] = ..., target_location: _Optional[str] = ..., inline_state_threshold_bytes: _Optional[int] = ...) -> None: ...

from snapflow.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControlCommand(_message.Message):
    __slots__ = ("sequence", "trigger", "complete", "abort", "cancel")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    trigger: TriggerTaskCheckpointRequest
    complete: NotifyCheckpointRequest
    abort: NotifyCheckpointRequest
    cancel: CancelTaskRequest
    def __init__(self, sequence: _Optional[int] = ..., trigger: _Optional[_Union[TriggerTaskCheckpointRequest, _Mapping]] = ..., complete: _Optional[_Union[NotifyCheckpointRequest, _Mapping]] = ..., abort: _Optional[_Union[NotifyCheckpointRequest, _Mapping]] = ..., cancel: _Optional[_Union[CancelTaskRequest, _Mapping]] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("sequence", "code", "message")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    code: int
    message: str
    def __init__(self, sequence: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class TriggerTaskCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "coordinator_epoch", "tasks", "checkpoint_id", "timestamp_ms", "options")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    coordinator_epoch: int
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskAttempt]
    checkpoint_id: int
    timestamp_ms: int
    options: _common_pb2.CheckpointOptions
    def __init__(self, job_id: _Optional[str] = ..., coordinator_epoch: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[_common_pb2.TaskAttempt, _Mapping]]] = ..., checkpoint_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., options: _Optional[_Union[_common_pb2.CheckpointOptions, _Mapping]] = ...) -> None: ...

class NotifyCheckpointRequest(_message.Message):
    __slots__ = ("job_id", "coordinator_epoch", "tasks", "checkpoint_id", "reason", "final")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    coordinator_epoch: int
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskAttempt]
    checkpoint_id: int
    reason: str
    final: bool
    def __init__(self, job_id: _Optional[str] = ..., coordinator_epoch: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[_common_pb2.TaskAttempt, _Mapping]]] = ..., checkpoint_id: _Optional[int] = ..., reason: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("job_id", "coordinator_epoch", "tasks")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    coordinator_epoch: int
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.TaskAttempt]
    def __init__(self, job_id: _Optional[str] = ..., coordinator_epoch: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[_common_pb2.TaskAttempt, _Mapping]]] = ...) -> None: ...

class ChannelId(_message.Message):
    __slots__ = ("job_id", "producer_vertex_id", "producer_subtask", "consumer_vertex_id", "consumer_subtask", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_SUBTASK_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_SUBTASK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    producer_vertex_id: str
    producer_subtask: int
    consumer_vertex_id: str
    consumer_subtask: int
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., producer_vertex_id: _Optional[str] = ..., producer_subtask: _Optional[int] = ..., consumer_vertex_id: _Optional[str] = ..., consumer_subtask: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class ExchangeMessage(_message.Message):
    __slots__ = ("open", "frame")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    open: ChannelId
    frame: Frame
    def __init__(self, open: _Optional[_Union[ChannelId, _Mapping]] = ..., frame: _Optional[_Union[Frame, _Mapping]] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("batch", "barrier", "cancel_marker", "end_of_partition", "watermark", "latency_marker", "end_of_data", "watermark_status")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    CANCEL_MARKER_FIELD_NUMBER: _ClassVar[int]
    END_OF_PARTITION_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MARKER_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_STATUS_FIELD_NUMBER: _ClassVar[int]
    batch: DataBatch
    barrier: CheckpointBarrier
    cancel_marker: CancelCheckpointMarker
    end_of_partition: EndOfPartition
    watermark: Watermark
    latency_marker: LatencyMarker
    end_of_data: EndOfData
    watermark_status: WatermarkStatus
    def __init__(self, batch: _Optional[_Union[DataBatch, _Mapping]] = ..., barrier: _Optional[_Union[CheckpointBarrier, _Mapping]] = ..., cancel_marker: _Optional[_Union[CancelCheckpointMarker, _Mapping]] = ..., end_of_partition: _Optional[_Union[EndOfPartition, _Mapping]] = ..., watermark: _Optional[_Union[Watermark, _Mapping]] = ..., latency_marker: _Optional[_Union[LatencyMarker, _Mapping]] = ..., end_of_data: _Optional[_Union[EndOfData, _Mapping]] = ..., watermark_status: _Optional[_Union[WatermarkStatus, _Mapping]] = ...) -> None: ...

class DataBatch(_message.Message):
    __slots__ = ("arrow_ipc", "num_records")
    ARROW_IPC_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    arrow_ipc: bytes
    num_records: int
    def __init__(self, arrow_ipc: _Optional[bytes] = ..., num_records: _Optional[int] = ...) -> None: ...

class CheckpointBarrier(_message.Message):
    __slots__ = ("checkpoint_id", "timestamp_ms", "options")
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    timestamp_ms: int
    options: _common_pb2.CheckpointOptions
    def __init__(self, checkpoint_id: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., options: _Optional[_Union[_common_pb2.CheckpointOptions, _Mapping]] = ...) -> None: ...

class CancelCheckpointMarker(_message.Message):
    __slots__ = ("checkpoint_id",)
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    checkpoint_id: int
    def __init__(self, checkpoint_id: _Optional[int] = ...) -> None: ...

class EndOfPartition(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndOfData(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Watermark(_message.Message):
    __slots__ = ("timestamp_ms",)
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    timestamp_ms: int
    def __init__(self, timestamp_ms: _Optional[int] = ...) -> None: ...

class WatermarkStatus(_message.Message):
    __slots__ = ("idle",)
    IDLE_FIELD_NUMBER: _ClassVar[int]
    idle: bool
    def __init__(self, idle: _Optional[bool] = ...) -> None: ...

class LatencyMarker(_message.Message):
    __slots__ = ("marked_time_ms", "source_vertex_id", "source_subtask")
    MARKED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_VERTEX_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SUBTASK_FIELD_NUMBER: _ClassVar[int]
    marked_time_ms: int
    source_vertex_id: str
    source_subtask: int
    def __init__(self, marked_time_ms: _Optional[int] = ..., source_vertex_id: _Optional[str] = ..., source_subtask: _Optional[int] = ...) -> None: ...

class CreditGrant(_message.Message):
    __slots__ = ("credits",)
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    credits: int
    def __init__(self, credits: _Optional[int] = ...) -> None: ...

"""The frames a data channel carries, in memory and on the wire.

A channel carries one ordered stream of frames (docs/worker.md): data batches
(:class:`DataFrame`, one ``pyarrow.RecordBatch``) and events (:class:`BarrierFrame`,
:class:`CancelMarkerFrame`, :class:`EndOfDataFrame`, :class:`EndOfPartitionFrame`,
:class:`WatermarkFrame`, :class:`WatermarkStatusFrame`, :class:`LatencyMarkerFrame`). In-process
channels hand these objects over as they are; the gRPC transport converts them to and from
``snapflow.v1.Frame`` with :func:`frame_to_proto` and :func:`frame_from_proto`. A batch travels as Arrow IPC *stream* bytes holding exactly one
record batch (schema message + batch message + end-of-stream marker), so each message is
self-describing and decodes without any per-channel state; decoding is zero-copy over the
received bytes.

Flow-control classes (see ``snapflow.worker.runtime.output_channel``):

- only a :class:`DataFrame` occupies a buffer, i.e. needs one credit; events need none;
- :func:`is_priority` frames (barriers of *unaligned* checkpoints, cancel markers) overtake
  data that is still queued, on the producer's output queue and in the consumer's input
  channel. Every other frame keeps its place in the stream.

Batches bigger than one gRPC message are split by rows (:func:`encode_batch_chunks`); each
chunk is a DataFrame of its own (one credit each), and row order is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow as pa

from snapflow.checkpointing import BarrierOptions
from snapflow.errors import InvalidArgumentError
from snapflow.v1 import worker_pb2 as wpb
from snapflow.wire import barrier_options_from_pb, barrier_options_to_pb

__all__ = [
    "BarrierFrame",
    "CancelMarkerFrame",
    "DataFrame",
    "EndOfDataFrame",
    "EndOfPartitionFrame",
    "Frame",
    "FrameTooLargeError",
    "LatencyMarkerFrame",
    "WatermarkFrame",
    "WatermarkStatusFrame",
    "decode_batch",
    "encode_batch",
    "encode_batch_chunks",
    "frame_from_proto",
    "frame_to_proto",
    "is_event",
    "is_priority",
]


class FrameTooLargeError(InvalidArgumentError):
    """A single record does not fit in one message (splitting by rows cannot help)."""


# ---------------------------------------------------------------------------------------------
# In-memory frames
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataFrame:
    """A batch of records. Occupies one buffer of the receiving channel (one credit)."""

    batch: pa.RecordBatch

    @property
    def num_records(self) -> int:
        return int(self.batch.num_rows)

    @property
    def nbytes(self) -> int:
        return int(self.batch.nbytes)


@dataclass(frozen=True, slots=True)
class BarrierFrame:
    """Checkpoint barrier n. Unaligned barriers are priority frames."""

    checkpoint_id: int
    timestamp_ms: int
    options: BarrierOptions = field(default_factory=BarrierOptions)


@dataclass(frozen=True, slots=True)
class CancelMarkerFrame:
    """Checkpoint n was aborted upstream; a priority frame."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class EndOfDataFrame:
    """The producer's input ended and its chain ran ``end_input``: no data follows, only events
    (barriers, cancel markers, watermarks) and then end of partition (Flink's ``EndOfData``).
    A task ends its own input once every input channel delivered one."""


@dataclass(frozen=True, slots=True)
class EndOfPartitionFrame:
    """The last frame of a channel: the producer will send nothing more."""


@dataclass(frozen=True, slots=True)
class WatermarkFrame:
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class WatermarkStatusFrame:
    """The producer became idle or active again (Flink's ``WatermarkStatus``): an idle
    channel does not hold the consumer's watermark back. A producer sends active again before
    any data or watermark it emits after idle."""

    idle: bool


@dataclass(frozen=True, slots=True)
class LatencyMarkerFrame:
    marked_time_ms: int
    source_vertex_id: str
    source_subtask: int


Frame = (
    DataFrame
    | BarrierFrame
    | CancelMarkerFrame
    | EndOfDataFrame
    | EndOfPartitionFrame
    | WatermarkFrame
    | WatermarkStatusFrame
    | LatencyMarkerFrame
)
"""Any frame a channel carries."""


def is_event(frame: Frame) -> bool:
    """True for every frame but data (events need no credit)."""
    return type(frame) is not DataFrame


def is_priority(frame: Frame) -> bool:
    """True for frames that overtake queued data: unaligned barriers and cancel markers."""
    tp = type(frame)
    if tp is BarrierFrame:
        return frame.options.is_unaligned  # type: ignore[union-attr]
    return tp is CancelMarkerFrame


# ---------------------------------------------------------------------------------------------
# Arrow IPC codec for batches
# ---------------------------------------------------------------------------------------------

_IPC_OVERHEAD_ESTIMATE = 4096
"""Upper bound used to pre-check sizes: schema message, batch metadata, padding, EOS."""


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """Arrow IPC stream bytes holding the schema and exactly one record batch."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batch(data: bytes) -> pa.RecordBatch:
    """The one record batch of Arrow IPC stream bytes (zero-copy: it references ``data``)."""
    reader = pa.ipc.open_stream(data)
    batch = reader.read_next_batch()
    return batch


def encode_batch_chunks(
    batch: pa.RecordBatch, max_bytes: int
) -> list[tuple[pa.RecordBatch, bytes]]:
    """Encode ``batch`` as one or more IPC payloads of at most ``max_bytes`` each.

    The batch is split by rows (zero-copy slices, order kept) when its encoding would be too
    large. Returns ``(chunk, payload)`` pairs. Raises :class:`FrameTooLargeError` when one row
    alone does not fit.
    """
    if batch.nbytes + _IPC_OVERHEAD_ESTIMATE <= max_bytes:
        return [(batch, encode_batch(batch))]
    size = pa.ipc.get_record_batch_size(batch) + _IPC_OVERHEAD_ESTIMATE
    if size <= max_bytes:
        payload = encode_batch(batch)
        if len(payload) <= max_bytes:
            return [(batch, payload)]
    rows = batch.num_rows
    if rows <= 1:
        raise FrameTooLargeError(
            f"one record of {size} bytes exceeds the maximum message size of {max_bytes} bytes"
        )
    # aim at ~90% of the limit so that most chunks fit at the first try
    pieces = max(2, math.ceil(size / (0.9 * max_bytes)))
    step = math.ceil(rows / pieces)
    out: list[tuple[pa.RecordBatch, bytes]] = []
    for offset in range(0, rows, step):
        out.extend(encode_batch_chunks(batch.slice(offset, step), max_bytes))
    return out


# ---------------------------------------------------------------------------------------------
# Protobuf conversion
# ---------------------------------------------------------------------------------------------


def frame_to_proto(
    frame: Frame, out: wpb.Frame | None = None, payload: bytes | None = None
) -> wpb.Frame:
    """Fill ``out`` (a new ``snapflow.v1.Frame`` if None) from ``frame`` and return it.

    ``payload`` is the batch's IPC bytes when already encoded (see
    :func:`encode_batch_chunks`); the batch must then fit in one message. Fields are assigned
    in place: building nested messages through constructor keywords copies large payloads
    several times (milliseconds per megabyte with upb).
    """
    if out is None:
        out = wpb.Frame()
    tp = type(frame)
    if tp is DataFrame:
        batch = frame.batch  # type: ignore[union-attr]
        out.batch.arrow_ipc = encode_batch(batch) if payload is None else payload
        out.batch.num_records = batch.num_rows
    elif tp is BarrierFrame:
        assert isinstance(frame, BarrierFrame)
        out.barrier.checkpoint_id = frame.checkpoint_id
        out.barrier.timestamp_ms = frame.timestamp_ms
        barrier_options_to_pb(frame.options, out.barrier.options)
    elif tp is CancelMarkerFrame:
        assert isinstance(frame, CancelMarkerFrame)
        out.cancel_marker.checkpoint_id = frame.checkpoint_id
    elif tp is EndOfDataFrame:
        out.end_of_data.SetInParent()
    elif tp is EndOfPartitionFrame:
        out.end_of_partition.SetInParent()
    elif tp is WatermarkFrame:
        assert isinstance(frame, WatermarkFrame)
        out.watermark.timestamp_ms = frame.timestamp_ms
    elif tp is WatermarkStatusFrame:
        assert isinstance(frame, WatermarkStatusFrame)
        out.watermark_status.idle = frame.idle
    elif tp is LatencyMarkerFrame:
        assert isinstance(frame, LatencyMarkerFrame)
        out.latency_marker.marked_time_ms = frame.marked_time_ms
        out.latency_marker.source_vertex_id = frame.source_vertex_id
        out.latency_marker.source_subtask = frame.source_subtask
    else:
        raise TypeError(f"not a frame: {frame!r}")
    return out


def frame_from_proto(msg: wpb.Frame) -> Frame:
    """The in-memory frame of a ``snapflow.v1.Frame``; raises InvalidArgumentError if bad."""
    which = msg.WhichOneof("payload")
    if which == "batch":
        try:
            batch = decode_batch(msg.batch.arrow_ipc)
        except (pa.ArrowException, StopIteration) as e:
            raise InvalidArgumentError(f"undecodable Arrow IPC batch: {e}") from e
        if batch.num_rows != msg.batch.num_records:
            raise InvalidArgumentError(
                f"batch announces {msg.batch.num_records} records but holds {batch.num_rows}"
            )
        return DataFrame(batch)
    if which == "barrier":
        b = msg.barrier
        return BarrierFrame(b.checkpoint_id, b.timestamp_ms, barrier_options_from_pb(b.options))
    if which == "cancel_marker":
        return CancelMarkerFrame(msg.cancel_marker.checkpoint_id)
    if which == "end_of_data":
        return EndOfDataFrame()
    if which == "end_of_partition":
        return EndOfPartitionFrame()
    if which == "watermark":
        return WatermarkFrame(msg.watermark.timestamp_ms)
    if which == "watermark_status":
        return WatermarkStatusFrame(msg.watermark_status.idle)
    if which == "latency_marker":
        m = msg.latency_marker
        return LatencyMarkerFrame(m.marked_time_ms, m.source_vertex_id, m.source_subtask)
    raise InvalidArgumentError("empty frame (no payload set)")

"""A subtask's snapshot files: the asynchronous part's writing, and the reading of channel state.

Locally one file per state and per channel, as written. On an object store (``s3://``) all of a
subtask's files of one checkpoint (state files and Arrow IPC channel state) are merged into one
object, ``chk<id>-<uuid>.merged``, written with one PUT (none when there is no state); each
handle names its byte range in it. Channel state (the in-flight data of an unaligned
checkpoint) is Arrow IPC, one file per channel; its handles carry the channel index in
``key_group_start``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence

import pyarrow as pa

from snapflow.checkpointing import CHANNEL_INPUT, CHANNEL_OUTPUT, StateHandle
from snapflow.filestore import is_object_store_uri
from snapflow.filestore_registry import store_for
from snapflow.worker.state.snapshots import SnapshotInProgress
from snapflow.worker.state.state_files import MergedStateObject
from snapflow.worker.state.write_clock import timing

ChannelData = Sequence[tuple[int, pa.RecordBatch]]
"""(channel index, batch) in the order the batches were captured."""


def join_location(location: str, name: str) -> str:
    """``name`` under a local directory or an ``s3://`` prefix (object keys join with '/')."""
    if is_object_store_uri(location):
        return store_for(location).join(location, name)
    return os.path.join(location, name)


def write_snapshot(
    directory: str,
    checkpoint_id: int,
    snapshots: Sequence[tuple[str, SnapshotInProgress]],
    input_state: ChannelData,
    output_state: ChannelData,
    channel_state_owner: str,
) -> tuple[dict[str, list[StateHandle]], int, int]:
    """Write one subtask's snapshot under ``directory``: the state backends' snapshots (by
    operator id) and the channel state, which belongs to ``channel_state_owner``. Returns the
    handles by operator id, the total size and the size of the channel state."""
    merged = (
        MergedStateObject(
            join_location(directory, f"chk{checkpoint_id}-{uuid.uuid4().hex[:12]}.merged")
        )
        if is_object_store_uri(directory)
        else None
    )
    handles: dict[str, list[StateHandle]] = {}
    size = 0
    for op_id, snap in snapshots:
        written = snap.write(join_location(directory, op_id), into=merged)
        handles.setdefault(op_id, []).extend(written)
        size += sum(h.size_bytes for h in written)
    in_flight = 0
    channel_handles = []
    for kind, data in ((CHANNEL_INPUT, input_state), (CHANNEL_OUTPUT, output_state)):
        by_channel: dict[int, list[pa.RecordBatch]] = {}
        for channel, batch in data:
            if batch.num_rows:  # an empty batch replays as nothing: no file for it
                by_channel.setdefault(channel, []).append(batch)
        for channel, batches in sorted(by_channel.items()):
            offset = 0
            if merged is None:
                path = os.path.join(directory, f"{kind}-{channel}.arrow")
                with timing("write_s"):
                    written_bytes = _write_batches(path, batches)
            else:
                with timing("serialise_s"):
                    buffer = _batches_to_buffer(batches)
                path, offset = merged.path, merged.add([memoryview(buffer)])
                written_bytes = buffer.size
            in_flight += written_bytes
            channel_handles.append(StateHandle(path, written_bytes, kind, channel, channel, offset))
    if channel_handles:
        handles.setdefault(channel_state_owner, []).extend(channel_handles)
        size += in_flight
    if merged is not None:
        merged.write()
    return handles, size, in_flight


def read_channel_state(path: str, offset: int = 0, size: int = 0) -> list[pa.RecordBatch]:
    """Channel state written by :func:`write_snapshot`: a whole local file (memory mapped), or
    ``size`` bytes at ``offset`` of a file or object (one ranged GET)."""
    if not offset and not is_object_store_uri(path):
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]
    store = store_for(path)
    data = store.read_range(path, offset, size) if size else store.read(path)
    reader = pa.ipc.open_file(pa.py_buffer(data))
    return [reader.get_batch(i) for i in range(reader.num_record_batches)]


def _batches_to_buffer(batches: list[pa.RecordBatch]) -> pa.Buffer:
    """Channel state as an Arrow IPC file in memory (to be written whole to an object store)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def _write_batches(path: str, batches: list[pa.RecordBatch]) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    os.replace(tmp, path)
    return os.path.getsize(path)

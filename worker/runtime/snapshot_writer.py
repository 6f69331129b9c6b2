"""A subtask's snapshot files: the asynchronous part's encoding and writing, and the reading of
channel state.

A snapshot is first encoded in memory (:func:`encode_snapshot`), then stored
(:meth:`EncodedSnapshot.store`): inline in its handles when all of it is at most the
checkpoint's ``inline_state_threshold_bytes`` (docs/storage.md); else locally one durable file
per state and per channel, and on an object store (``s3://``) all of a subtask's files of one
checkpoint (state files and Arrow IPC channel state) merged into one object,
``chk<id>-<uuid>.merged``, written with one PUT (none when there is no state), each handle
naming its byte range in it. Channel state (the in-flight data of an unaligned checkpoint) is
Arrow IPC, one file per channel; its handles carry the channel index in ``key_group_start``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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


@dataclass
class EncodedSnapshot:
    """A subtask's snapshot encoded in memory (:func:`encode_snapshot`), not stored yet:
    :meth:`store` writes it (a thread's work, unless it :meth:`fits_inline`)."""

    merged: MergedStateObject
    handles: dict[str, list[StateHandle]]
    channel_state_owner: str

    def fits_inline(self, inline_threshold_bytes: int) -> bool:
        """Storing it writes nothing (it is inline, or empty)."""
        return self.merged.size <= inline_threshold_bytes

    def store(self, inline_threshold_bytes: int) -> tuple[dict[str, list[StateHandle]], int, int]:
        """Inline when at most ``inline_threshold_bytes`` (0: never), else one object on an
        object store, else one durable file each (``MergedStateObject.finish``). Returns the
        handles by operator id, the total size and the size of the channel state. Writes only
        when not :meth:`fits_inline`."""
        order = [(op_id, len(hs)) for op_id, hs in self.handles.items()]
        every = [h for hs in self.handles.values() for h in hs]
        final = iter(self.merged.finish(every, inline_threshold_bytes))
        handles = {op_id: [next(final) for _ in range(n)] for op_id, n in order}
        size = sum(h.size_bytes for h in every)
        channel = handles.get(self.channel_state_owner, ())
        in_flight = sum(h.size_bytes for h in channel if h.kind in _CHANNEL)
        return handles, size, in_flight


def encode_snapshot(
    directory: str,
    checkpoint_id: int,
    snapshots: Sequence[tuple[str, SnapshotInProgress]],
    input_state: ChannelData,
    output_state: ChannelData,
    channel_state_owner: str,
) -> EncodedSnapshot:
    """Encode one subtask's snapshot into memory: the state backends' snapshots (by operator
    id) and the channel state, which belongs to ``channel_state_owner``, as the files they
    would be under ``directory``. Files a backend writes itself (RocksDB's shared SST files)
    are uploaded here already and are never inline."""
    merged = MergedStateObject(
        join_location(directory, f"chk{checkpoint_id}-{uuid.uuid4().hex[:12]}.merged")
    )
    handles: dict[str, list[StateHandle]] = {}
    for op_id, snap in snapshots:
        written = snap.write(join_location(directory, op_id), into=merged)
        handles.setdefault(op_id, []).extend(written)
    channel_handles = []
    for kind, channel, batches in _channels(input_state, output_state):
        with timing("serialise_s"):
            buffer = _batches_to_buffer(batches)
        name = join_location(directory, f"{kind}-{channel}.arrow")
        offset = merged.add([memoryview(buffer)], name)
        channel_handles.append(
            StateHandle(merged.path, buffer.size, kind, channel, channel, offset)
        )
    if channel_handles:
        handles.setdefault(channel_state_owner, []).extend(channel_handles)
    return EncodedSnapshot(merged, handles, channel_state_owner)


def _channels(
    input_state: ChannelData, output_state: ChannelData
) -> Iterator[tuple[str, int, list[pa.RecordBatch]]]:
    """(kind, channel, batches) of the channel state, by channel; no empty batch (it replays
    as nothing: no file for it)."""
    for kind, data in ((CHANNEL_INPUT, input_state), (CHANNEL_OUTPUT, output_state)):
        by_channel: dict[int, list[pa.RecordBatch]] = {}
        for channel, batch in data:
            if batch.num_rows:
                by_channel.setdefault(channel, []).append(batch)
        for channel, batches in sorted(by_channel.items()):
            yield kind, channel, batches


_CHANNEL = (CHANNEL_INPUT, CHANNEL_OUTPUT)


def read_channel_state(handle: StateHandle) -> list[pa.RecordBatch]:
    """Channel state stored by :meth:`EncodedSnapshot.store`: inline bytes, a whole local file
    (memory mapped), or ``size_bytes`` at ``offset`` of a file or object (one ranged GET)."""
    path, offset, size = handle.path, handle.offset, handle.size_bytes
    if handle.is_inline:
        data: bytes = handle.data
    elif not offset and not is_object_store_uri(path):
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]
    else:
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

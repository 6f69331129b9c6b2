"""The worker's state backends: keyed state, timers and operator state, with snapshots.

This is Flink's ``HashMapStateBackend`` (keyed state on the heap) plus its
``OperatorStateBackend`` (list and union list state), in Python.

Keyed state
    :class:`KeyedStateBackend` owns one contiguous :class:`~snapflow.worker.state.keygroups.KeyGroupRange` of
    a vertex's ``max_parallelism`` key groups. Each registered state (:class:`ValueState`,
    :class:`ListState`, :class:`MapState`, :class:`ReducingState`, :class:`AggregatingState`)
    stores, per key group, a dict ``key -> value``. Record-at-a-time operators call
    :meth:`KeyedStateBackend.set_current_key` (the key group is computed once) and then use the
    states; vectorised operators use the bulk methods (``get_many`` / ``update_many`` /
    ``add_many`` / :meth:`ReducingState.add_batch`), which pre-aggregate an Arrow batch with
    Arrow kernels and touch the state once per distinct key. Event-time timers
    (:class:`TimerService`) are keyed state too: kept per key group, snapshotted and
    redistributed with it.

Operator state
    :class:`OperatorStateBackend` holds named lists for non-keyed operators (source positions,
    buffered elements). A *list* state is redistributed on restore (Flink's SPLIT_DISTRIBUTE);
    a *union* list state gives every subtask the union of all subtasks' lists (Flink's UNION).

Recovery contract
    * A snapshot (:meth:`KeyedStateBackend.snapshot`, :meth:`OperatorStateBackend.snapshot`)
      contains exactly the state as of the moment the snapshot was taken: every entry of every
      registered (or restored) state, every event-time timer, every operator list. Its
      synchronous part only freezes a copy-on-write view (O(states x key groups), no copying of
      entries); the asynchronous part, :meth:`SnapshotInProgress.write`, serialises that view
      while processing continues. Mutations after the synchronous part never reach the written
      files: a key group's dict is copied on its first write after a snapshot, and a list, map or
      aggregating accumulator is copied before its first in-place change.
    * Values are stored by reference. Values of value/reducing state and elements of lists and
      maps must be treated as immutable once stored (replace them with ``update`` / ``put``);
      ``reduce_fn`` must return a new value instead of mutating its arguments. Aggregating
      accumulators may be mutated in place by ``add_fn``: they are deep-copied before the first
      change after a snapshot.
    * Keyed state is written as one file per backend (its key-group range) plus one for timers.
      Each file has an index of key-group sections, so a restore reads only the sections of the
      key groups it owns: :meth:`KeyedStateBackend.restore` given *all* keyed handles of a vertex
      (any old parallelism, same ``max_parallelism``) restores exactly the entries and timers of
      its own key groups, each key group from exactly one file. Scaling up and down therefore
      neither loses nor duplicates state, and every key lands in the subtask that owns its key
      group. The watermark is not part of a snapshot (as in Flink): restored timers fire once
      the restored job's watermark passes them. Only event-time timers exist so far.
    * :meth:`OperatorStateBackend.restore` at an unchanged parallelism gives every subtask its own
      lists back; at a changed parallelism it concatenates every list state's lists in old
      subtask order and hands out contiguous, near-equal chunks (the first ``total % p`` subtasks
      get one more element). Union states are the concatenation of all old subtasks' lists, for
      every subtask, always.
    * Files are written atomically under unique names. Locally: temporary name, fsync, rename;
      a crash leaves no partial file under a final name. On an object store (``s3://``
      directories, handles carry the full URI) a file is built in memory and written whole with
      one PUT, which makes it visible whole or not at all; a subtask's files of one checkpoint
      may instead be appended to one :class:`MergedStateObject` (one PUT per subtask and
      checkpoint), each handle naming its byte range (``offset``, ``size_bytes``). Reading an
      object takes ranged GETs only: the file's last 256 KiB first (trailer, index and
      metadata; all of a small file), then the sections a restore needs in one coalesced range
      (and the 8-byte header when the tail did not hold it). Writing and restoring never LIST;
      a HEAD only for a handle without its size. Restore refuses, with a :class:`StateError`,
      files that are corrupt or truncated (magic, sizes, CRC-32 of every section), of an unknown
      format version, written with another ``max_parallelism`` or key hash, or whose state kind
      differs from the one registered. A missing or unreadable file raises
      :class:`~snapflow.errors.StorageError`.

State file format, version 1 (little endian; ``.state`` files, or a byte range of a merged
object; every offset below is relative to the file's first byte)::

    header   "SFST" | u16 format version (1) | u16 kind (1 keyed, 2 timers, 3 operator, 4 union)
    sections pickle (protocol 5) blobs, one per key group (keyed: {state name: {key: value}},
             timers: [(timestamp, key, namespace), ...]) or one section 0 (operator/union:
             {state name: [elements]})
    meta     UTF-8 JSON: format, version, kind, checkpoint_id, max_parallelism, key group range,
             key_hash (keyed/timers), states {name: kind}
    index    per section: i32 section id (key group), u64 offset, u64 length, u32 CRC-32
    trailer  u64 meta offset | u64 meta length | u64 index offset | u32 index entries |
             u32 CRC-32 of meta + index | "SFND"

Pickle runs arbitrary code on load: state files are trusted (checkpoint storage is the job's own).

Threading: a backend belongs to its task thread. Only :meth:`SnapshotInProgress.write` may run
on another thread, concurrently with processing.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import json
import os
import pickle
import re
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from typing import Any, BinaryIO, Generic, NamedTuple, TypeVar, overload
from urllib.parse import unquote, urlsplit

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from snapflow.checkpointing import (
    INCREMENTAL,
    KEYED,
    OPERATOR,
    SHARED,
    SHARED_NEW,
    TIMERS,
    UNION,
    BarrierOptions,
    StateHandle,
)
from snapflow.durable_files import fsync_dir
from snapflow.errors import StateError, StorageError
from snapflow.event_time import MIN_WATERMARK
from snapflow.filestore import FileStore, is_object_store_uri, store_for
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keygroups import KEY_HASH_VERSION, KeyGroupRange
from snapflow.worker.state.ttl import (
    TTL_KINDS,
    Clock,
    StateTtlConfig,
    TtlAggregatingState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
    ttl_kind,
)

__all__ = [
    "FORMAT_VERSION",
    "INCREMENTAL",
    "SHARED",
    "SHARED_NEW",
    "AggregatingState",
    "CorruptStateError",
    "IncompatibleStateError",
    "KeyGroupRangeError",
    "KeyedStateBackend",
    "ListState",
    "MapState",
    "MergedStateObject",
    "OperatorListState",
    "OperatorStateBackend",
    "ReducingState",
    "SnapshotInProgress",
    "StateError",
    "StateFormatVersionError",
    "Timer",
    "TimerService",
    "ValueState",
    "aggregate_batch",
    "wall_clock_ms",
]

T = TypeVar("T")

FORMAT_VERSION = 1
FORMAT_NAME = "snapflow-state"


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class CorruptStateError(StateError):
    """A state file is corrupt or truncated (bad magic, sizes or checksum; unreadable pickle)."""

    status = grpc.StatusCode.DATA_LOSS


class StateFormatVersionError(StateError):
    """A state file was written in a format version this code does not know."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class IncompatibleStateError(StateError):
    """State that cannot be used as asked: another max parallelism or key hash, a state name
    registered with another kind, a restore into a backend that already holds state."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class KeyGroupRangeError(StateError):
    """A key (or key group) outside the backend's key-group range."""

    status = grpc.StatusCode.FAILED_PRECONDITION


def _no_current_key() -> StateError:
    return StateError("no current key: call set_current_key(key) before using keyed state")


# ---------------------------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------------------------

# A state file is described by a ``snapflow.checkpointing.StateHandle``, whose kind names
# (KEYED, TIMERS, ...) are the foundation's. The codes in a file's header are this format's own.
_KIND_CODES = {KEYED: 1, TIMERS: 2, OPERATOR: 3, UNION: 4, INCREMENTAL: 5}


def _handle_fields(handle: Any, base_dir: str | os.PathLike[str] | None) -> StateHandle:
    """Normalise a handle given as a ``StateHandle`` or another dataclass, a mapping (older
    callers and tests pass dicts) or a protobuf message, resolving its path against
    ``base_dir``."""

    def field(name: str, default: Any) -> Any:
        if isinstance(handle, Mapping):
            return handle.get(name, default)
        return getattr(handle, name, default)

    path = field("path", "")
    if not isinstance(path, str) or not path:
        raise StateError(f"state handle without a path: {handle!r:.200}")
    if path.startswith("file://"):
        path = unquote(urlsplit(path).path)
    if base_dir is not None and not is_object_store_uri(path) and not os.path.isabs(path):
        base = os.fspath(base_dir)
        if is_object_store_uri(base):  # object keys join with '/', whatever the local OS does
            path = f"{base.rstrip('/')}/{path}"
        else:
            path = os.path.join(base, path)
    offset = int(field("offset", 0) or 0)
    size = int(field("size_bytes", 0) or 0)
    if offset < 0 or size < 0 or (offset and not size):
        raise StateError(
            f"state handle {path!r:.200}: offset {offset} and size {size} do not name a "
            "byte range (a handle with an offset needs its size)"
        )
    return StateHandle(
        path=path,
        size_bytes=size,
        kind=str(field("kind", "") or KEYED),
        key_group_start=int(field("key_group_start", 0) or 0),
        key_group_end=int(field("key_group_end", 0) or 0),
        offset=offset,
    )


# ---------------------------------------------------------------------------------------------
# State files
# ---------------------------------------------------------------------------------------------

_MAGIC = b"SFST"
_TAIL_MAGIC = b"SFND"
_HEADER = struct.Struct("<4sHH")
_INDEX_ENTRY = struct.Struct("<iQQI")
_TRAILER = struct.Struct("<QQQII4s")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class _Section(NamedTuple):
    section: int
    offset: int
    length: int
    crc: int


def _dumps(obj: Any, what: str) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as e:
        raise StateError(f"cannot serialise {what}: {e}") from e


class MergedStateObject:
    """The files of one subtask's checkpoint collected into one object, written with one
    request: on an object store every object costs a PUT, and a subtask may write several
    small files per checkpoint (keyed state, timers, operator state, channel state).

    As with Flink's file merging (FLIP-306), a handle names the shared object plus the byte
    range of its own file (``offset``, ``size_bytes``); every file keeps its own format, so it
    is read exactly as a file of its own. All files in one object belong to one checkpoint of
    one subtask, so the object is discarded as a whole, with that checkpoint."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._parts: list[bytes | memoryview] = []
        self.size = 0

    def add(self, parts: Iterable[bytes | memoryview]) -> int:
        """Append one file (given as consecutive parts); returns its offset in the object."""
        offset = self.size
        for part in parts:
            self._parts.append(part)
            self.size += len(part)
        return offset

    def write(self) -> bool:
        """Write the object (one PUT; nothing when no file was added). Returns whether it
        wrote."""
        if not self.size:
            return False
        store_for(self.path).write(self.path, b"".join(self._parts))
        self._parts = []
        return True


def _encode_state_file(
    write: Callable[[bytes], object],
    kind: str,
    meta: dict[str, Any],
    sections: Iterable[tuple[int, bytes]],
) -> int:
    """Write the file format (module docstring) through ``write``; returns the size."""
    write(_HEADER.pack(_MAGIC, FORMAT_VERSION, _KIND_CODES[kind]))
    pos = _HEADER.size
    index = bytearray()
    count = 0
    for section, blob in sections:
        write(blob)
        index += _INDEX_ENTRY.pack(section, pos, len(blob), zlib.crc32(blob))
        pos += len(blob)
        count += 1
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    write(meta_bytes)
    write(bytes(index))
    crc = zlib.crc32(index, zlib.crc32(meta_bytes))
    write(_TRAILER.pack(pos, len(meta_bytes), pos + len(meta_bytes), count, crc, _TAIL_MAGIC))
    return pos + len(meta_bytes) + len(index) + _TRAILER.size


def _write_state_file(
    directory: str,
    filename: str,
    kind: str,
    meta: dict[str, Any],
    sections: Iterable[tuple[int, bytes]],
    key_group_range: KeyGroupRange,
    into: MergedStateObject | None = None,
) -> StateHandle:
    """Write one state file; returns its handle. Locally the file is streamed to a temporary
    name, fsynced and renamed (atomic); on an object store it is built in memory and written
    whole with one PUT (an object appears whole or not at all), or appended to ``into``."""
    if into is None and not is_object_store_uri(directory):
        return _write_local_state_file(directory, filename, kind, meta, sections, key_group_range)
    parts: list[bytes] = []
    size = _encode_state_file(parts.append, kind, meta, sections)
    if into is not None:
        path, offset = into.path, into.add(parts)
    else:
        store = store_for(directory)
        path, offset = store.join(directory, filename), 0
        store.write(path, b"".join(parts))
    return StateHandle(
        path=path,
        size_bytes=size,
        kind=kind,
        key_group_start=key_group_range.start,
        key_group_end=key_group_range.end,
        offset=offset,
    )


def _write_local_state_file(
    directory: str,
    filename: str,
    kind: str,
    meta: dict[str, Any],
    sections: Iterable[tuple[int, bytes]],
    key_group_range: KeyGroupRange,
) -> StateHandle:
    final = os.path.join(directory, filename)
    tmp = os.path.join(directory, f".{filename}.{uuid.uuid4().hex[:8]}.inprogress")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "xb") as f:
            size = _encode_state_file(f.write, kind, meta, sections)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)  # the final name is unique: nothing is ever overwritten
    except BaseException as e:
        with suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise StorageError(f"cannot write state file {final}: {e}") from e
        raise
    fsync_dir(directory)
    return StateHandle(
        path=os.path.abspath(final),
        size_bytes=size,
        kind=kind,
        key_group_start=key_group_range.start,
        key_group_end=key_group_range.end,
        offset=0,
    )


def _discard_files(handles: Iterable[StateHandle]) -> None:
    """Best effort: remove the whole files of a snapshot whose write failed (files inside a
    merged object were never written: the object is written last)."""
    by_store: dict[int, tuple[FileStore, list[str]]] = {}
    for handle in handles:
        path = handle.path
        if handle.offset:
            continue
        if is_object_store_uri(path):
            store = store_for(path)
            by_store.setdefault(id(store), (store, []))[1].append(path)
        else:
            with suppress(OSError):
                os.unlink(path)
    for store, paths in by_store.values():
        with suppress(Exception):
            store.delete(paths)


#: What a reader of an object store fetches first, in one ranged GET: the end of the file, so
#: the trailer, index and metadata (and all of a small file) arrive with one request.
_TAIL_PREFETCH_BYTES = 256 * 1024


class _LocalBytes:
    """The bytes of a state file on a file system (a whole file, or a range of one)."""

    def __init__(self, handle: StateHandle, corrupt: Callable[[str], Exception]) -> None:
        self.path = handle.path
        try:
            self._f: BinaryIO = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as e:
            raise StorageError(f"cannot open state file {self.path}: {e}") from e
        try:
            file_size = os.fstat(self._f.fileno()).st_size
            self.base = handle.offset
            if not self.base:
                self.size = file_size
                if handle.size_bytes and handle.size_bytes != file_size:
                    raise corrupt(
                        f"the handle says {handle.size_bytes} bytes, the file has {file_size}"
                    )
            else:
                self.size = handle.size_bytes
                if file_size < self.base + self.size:
                    raise corrupt(
                        f"the handle says bytes {self.base}..{self.base + self.size}, the file "
                        f"has {file_size}"
                    )
        except BaseException:
            self._f.close()
            raise

    def read(self, offset: int, length: int) -> bytes:
        try:
            self._f.seek(self.base + offset)
            return self._f.read(length)
        except OSError as e:
            raise StorageError(f"cannot read state file {self.path}: {e}") from e

    def prefetch(self, offset: int, length: int) -> None:
        pass  # the page cache does this

    def close(self) -> None:
        self._f.close()


class _ObjectBytes:
    """The bytes of a state file in an object store, read with ranged GETs: the tail first
    (trailer, index, metadata), then the sections a restore needs, coalesced."""

    def __init__(self, handle: StateHandle, corrupt: Callable[[str], Exception]) -> None:
        self.path = handle.path
        self.base = handle.offset
        self._store = store_for(self.path)
        self._corrupt = corrupt
        self._cache: list[tuple[int, bytes]] = []
        # A handle always carries its size; a HEAD only for one written by hand without it.
        self.size = handle.size_bytes or self._request(lambda: self._store.size(self.path))
        if self.size >= _HEADER.size + _TRAILER.size:
            self.prefetch(max(0, self.size - _TAIL_PREFETCH_BYTES), _TAIL_PREFETCH_BYTES)

    def _request(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except FileNotFoundError as e:
            raise StorageError(f"cannot open state file {self.path}: no such object") from e
        except StorageError as e:
            if "InvalidRange" in str(e):  # the object is shorter than the handle says
                raise self._corrupt(f"the handle says {self.size} bytes") from None
            raise

    def prefetch(self, offset: int, length: int) -> None:
        length = min(length, self.size - offset)
        if any(s <= offset and offset + length <= s + len(d) for s, d in self._cache):
            return
        data = self._request(lambda: self._store.read_range(self.path, self.base + offset, length))
        if len(data) != length:
            raise self._corrupt(
                f"the handle says {self.size} bytes, the object ends {length - len(data)} "
                "bytes early"
            )
        self._cache.append((offset, data))

    def read(self, offset: int, length: int) -> bytes:
        for start, data in self._cache:
            if start <= offset and offset + length <= start + len(data):
                return data[offset - start : offset - start + length]
        return self._request(lambda: self._store.read_range(self.path, self.base + offset, length))

    def close(self) -> None:
        self._cache = []


class _StateFileReader:
    """Validating reader of one state file: header, trailer, meta and index up front; sections
    on demand (each checked against its CRC). A local file is read through its file handle, an
    object with ranged GETs (:class:`_ObjectBytes`)."""

    def __init__(self, handle: StateHandle) -> None:
        self.path = handle.path
        self._src: _LocalBytes | _ObjectBytes = (
            _ObjectBytes(handle, self._corrupt)
            if is_object_store_uri(self.path)
            else _LocalBytes(handle, self._corrupt)
        )
        try:
            self._parse(handle)
        except BaseException:
            self._src.close()
            raise

    def _corrupt(self, detail: str) -> CorruptStateError:
        return CorruptStateError(f"state file {self.path} is corrupt or truncated: {detail}")

    def _read_at(self, offset: int, length: int) -> bytes:
        data = self._src.read(offset, length)
        if len(data) != length:
            raise self._corrupt(f"expected {length} bytes at offset {offset}, got {len(data)}")
        return data

    def prefetch(self, entries: Sequence[_Section]) -> None:
        """Fetch the byte range spanning ``entries`` with one request (object stores), when
        they lie close together (a restore's key groups are contiguous in the file)."""
        if len(entries) < 2:
            return
        start = min(e.offset for e in entries)
        end = max(e.offset + e.length for e in entries)
        if end - start <= 2 * sum(e.length for e in entries):
            self._src.prefetch(start, end - start)

    def _parse(self, handle: StateHandle) -> None:
        size = self._src.size
        if size < _HEADER.size + _TRAILER.size:
            raise self._corrupt(f"only {size} bytes")
        magic, version, kind_code = _HEADER.unpack(self._read_at(0, _HEADER.size))
        if magic != _MAGIC:
            raise self._corrupt(f"not a Snapflow state file (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise StateFormatVersionError(
                f"state file {self.path} has format version {version}; this worker reads "
                f"version {FORMAT_VERSION}"
            )
        meta_off, meta_len, index_off, count, crc, tail = _TRAILER.unpack(
            self._read_at(size - _TRAILER.size, _TRAILER.size)
        )
        if tail != _TAIL_MAGIC:
            raise self._corrupt("no trailer (the file was cut short or overwritten)")
        if (
            meta_off < _HEADER.size
            or meta_off + meta_len != index_off
            or index_off + count * _INDEX_ENTRY.size != size - _TRAILER.size
        ):
            raise self._corrupt("the trailer's offsets do not match the file size")
        raw = self._read_at(meta_off, meta_len + count * _INDEX_ENTRY.size)
        if zlib.crc32(raw) != crc:
            raise self._corrupt("checksum mismatch in the metadata or index")
        try:
            meta = json.loads(raw[:meta_len])
        except ValueError as e:
            raise self._corrupt(f"unreadable metadata: {e}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise self._corrupt("metadata without the snapflow-state format marker")
        if meta.get("version") != FORMAT_VERSION:
            raise StateFormatVersionError(
                f"state file {self.path} has metadata version {meta.get('version')!r}; this "
                f"worker reads version {FORMAT_VERSION}"
            )
        kind = str(meta.get("kind"))
        if _KIND_CODES.get(kind) != kind_code or kind != handle.kind:
            raise self._corrupt(
                f"the handle says kind {handle.kind!r}, the file holds {kind!r} state"
            )
        self.meta: dict[str, Any] = meta
        self.sections: list[_Section] = []
        for i in range(count):
            entry = _Section(*_INDEX_ENTRY.unpack_from(raw, meta_len + i * _INDEX_ENTRY.size))
            if entry.offset < _HEADER.size or entry.offset + entry.length > meta_off:
                raise self._corrupt(f"section {entry.section} lies outside the data area")
            self.sections.append(entry)

    def read(self, entry: _Section) -> Any:
        blob = self._read_at(entry.offset, entry.length)
        if zlib.crc32(blob) != entry.crc:
            raise self._corrupt(f"checksum mismatch in section {entry.section}")
        try:
            return pickle.loads(blob)
        except Exception as e:
            raise self._corrupt(f"section {entry.section} cannot be unpickled: {e!r}") from None

    def close(self) -> None:
        self._src.close()

    def __enter__(self) -> _StateFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_name(prefix: str, kind: str, checkpoint_id: int, kg_range: KeyGroupRange | None) -> str:
    parts = [p for p in (_SAFE_NAME.sub("_", prefix), f"chk{checkpoint_id}", kind) if p]
    if kg_range is not None:
        parts.append(f"kg{kg_range.start}-{kg_range.end}")
    parts.append(uuid.uuid4().hex[:12])
    return "-".join(parts) + ".state"


# ---------------------------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------------------------


#: The asynchronous part of a snapshot: (directory, merged object or None) -> handles.
_Writer = Callable[[str, "MergedStateObject | None"], list[StateHandle]]


class SnapshotInProgress:
    """A snapshot whose synchronous part is done; :meth:`write` is the asynchronous part.

    ``write`` may run on another thread while the task keeps processing. Once written (or once
    the checkpoint is abandoned), call :meth:`release` from the task thread: the backend then
    stops copying on write until the next snapshot. Snapshots whose write returned or failed are
    released automatically when the backend takes its next snapshot.
    """

    def __init__(
        self,
        checkpoint_id: int,
        writer: _Writer,
        on_release: Callable[[SnapshotInProgress], None],
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.sync_duration_s = 0.0
        self.async_duration_s: float | None = None
        self.state_size_bytes = 0
        self.handles: list[StateHandle] | None = None
        self._writer: _Writer | None = writer
        self._on_release: Callable[[SnapshotInProgress], None] | None = on_release
        self._status = "pending"  # pending | writing | written | failed | released

    @property
    def done(self) -> bool:
        """True once :meth:`write` returned or raised."""
        return self._status in ("written", "failed")

    def write(
        self, directory: str | os.PathLike[str], *, into: MergedStateObject | None = None
    ) -> list[StateHandle]:
        """Serialise the snapshot into ``directory`` (a path, created if missing, or an
        ``s3://`` prefix); returns the handles of the files written (none for empty state).
        With ``into``, the files are appended to that object instead (the caller writes it).
        Idempotent once it succeeded."""
        if self._status == "written" and self.handles is not None:
            return list(self.handles)
        writer = self._writer
        if self._status in ("writing", "released") or writer is None:
            raise StateError(
                f"snapshot of checkpoint {self.checkpoint_id} cannot be written: {self._status}"
            )
        self._status = "writing"
        start = time.perf_counter()
        try:
            handles = writer(os.fspath(directory), into)
        except BaseException:
            self._status = "failed"
            raise
        self.async_duration_s = time.perf_counter() - start
        self.state_size_bytes = sum(h.size_bytes for h in handles)
        self.handles = handles
        self._writer = None  # drop the frozen view
        self._status = "written"
        return list(handles)

    def release(self) -> None:
        """The backend need not keep this snapshot's view isolated any longer (task thread)."""
        if self._status == "writing":
            raise StateError(
                f"snapshot of checkpoint {self.checkpoint_id} is being written; release it "
                "after write() returned"
            )
        if self._status == "released":
            return
        self._status = "released"
        self._writer = None
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release(self)


class _SnapshotTracker:
    """The snapshots a backend keeps copy-on-write views for."""

    def __init__(self, thaw: Callable[[], None]) -> None:
        self._active: list[SnapshotInProgress] = []
        self._thaw = thaw

    def reap(self) -> None:
        for snap in [s for s in self._active if s.done]:
            snap.release()

    def add(self, snap: SnapshotInProgress) -> None:
        self._active.append(snap)

    def release(self, snap: SnapshotInProgress) -> None:
        with suppress(ValueError):
            self._active.remove(snap)
        if not self._active:
            self._thaw()


# ---------------------------------------------------------------------------------------------
# Keyed state
# ---------------------------------------------------------------------------------------------

_MISSING: Any = object()


class _Table:
    """One state's storage: per key group (by index in the backend's range) a dict."""

    __slots__ = ("cow", "kind", "maps", "name", "owned", "shared")

    def __init__(self, name: str, kind: str, n: int) -> None:
        self.name = name
        self.kind = kind
        self.maps: list[dict[Any, Any]] = [{} for _ in range(n)]
        # shared[i]: maps[i] belongs to a snapshot view; copy it before the next write.
        self.shared = [False] * n
        # cow: a snapshot view is alive; owned[i]: keys whose container was copied (or created)
        # since the last snapshot, so it may be changed in place.
        self.cow = False
        self.owned: list[set[Any] | None] = [None] * n

    def writable(self, idx: int) -> dict[Any, Any]:
        m = self.maps[idx]
        if self.shared[idx]:
            m = self.maps[idx] = m.copy()
            self.shared[idx] = False
        return m

    def container(
        self, idx: int, key: Any, copier: Callable[[Any], Any]
    ) -> tuple[dict[Any, Any], Any]:
        """The writable dict of key group ``idx`` and ``key``'s container, copied first if a
        snapshot view may still reference it (``_MISSING`` if absent)."""
        m = self.writable(idx)
        c = m.get(key, _MISSING)
        if c is not _MISSING and self.cow:
            owned = self.owned[idx]
            if owned is None:
                owned = self.owned[idx] = set()
            if key not in owned:
                c = m[key] = copier(c)
                owned.add(key)
        return m, c

    def own(self, idx: int, key: Any) -> None:
        if self.cow:
            owned = self.owned[idx]
            if owned is None:
                owned = self.owned[idx] = set()
            owned.add(key)

    def freeze(self) -> list[dict[Any, Any]]:
        n = len(self.maps)
        self.shared = [True] * n
        self.owned = [None] * n
        self.cow = True
        return list(self.maps)

    def thaw(self) -> None:
        n = len(self.maps)
        self.shared = [False] * n
        self.owned = [None] * n
        self.cow = False

    def __len__(self) -> int:
        return sum(len(m) for m in self.maps)


def _pylist(values: Any) -> list[Any]:
    """``values`` as a list of Python objects (Arrow and numpy arrays converted)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.to_pylist()
    if hasattr(values, "__array__") and not isinstance(values, list | tuple):
        with suppress(pa.ArrowException, TypeError, ValueError):
            return pa.array(values).to_pylist()
    return list(values)


class _KeyedState:
    kind = ""

    def __init__(self, backend: KeyedStateBackend, table: _Table) -> None:
        self._backend = backend
        self._table = table

    @property
    def name(self) -> str:
        return self._table.name

    def clear(self) -> None:
        """Remove the current key's entry."""
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        t = self._table
        if b._current_key in t.maps[idx]:
            t.writable(idx).pop(b._current_key, None)

    def __len__(self) -> int:
        return len(self._table)


class ValueState(_KeyedState, Generic[T]):
    """One value per key (Flink's ``ValueState``)."""

    kind = "value"

    def __init__(self, backend: KeyedStateBackend, table: _Table, default: T | None) -> None:
        super().__init__(backend, table)
        self._default = default

    def value(self) -> T | None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        return self._table.maps[idx].get(b._current_key, self._default)

    def update(self, value: T | None) -> None:
        """Set the current key's value; ``None`` clears it (as in Flink)."""
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        if value is None:
            self.clear()
            return
        t = self._table
        m = t.writable(idx) if t.shared[idx] else t.maps[idx]
        m[b._current_key] = value

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        """The values of ``keys`` (the default for keys without one)."""
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        maps, default = self._table.maps, self._default
        return [maps[i].get(k, default) for k, i in zip(pykeys, idxs, strict=True)]

    def update_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        """Set ``keys[i]`` to ``values[i]`` (the last value wins for repeated keys; ``None``
        clears)."""
        t = self._table
        for idx, ks, vs in self._backend.runs_by_key_group(keys, values, key_groups):
            m = t.writable(idx)
            if None in vs:
                for k, v in zip(ks, vs, strict=True):
                    if v is None:
                        m.pop(k, None)
                    else:
                        m[k] = v
            else:
                m.update(zip(ks, vs, strict=True))


def _take(values: Any, order: pa.Array) -> list[Any]:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.take(order).to_pylist()
    return [values[i] for i in order.to_pylist()]


def _check_lengths(keys: Sequence[Any], values: Sequence[Any]) -> None:
    if len(keys) != len(values):
        raise StateError(f"{len(keys)} keys but {len(values)} values")


class ListState(_KeyedState, Generic[T]):
    """A list per key (Flink's ``ListState``)."""

    kind = "list"

    def _current(self) -> tuple[Any, int]:
        b = self._backend
        if b._current_idx < 0:
            raise _no_current_key()
        return b._current_key, b._current_idx

    def get(self) -> list[T]:
        """A copy of the current key's list (empty if none)."""
        key, idx = self._current()
        return list(self._table.maps[idx].get(key, ()))

    def add(self, value: T) -> None:
        key, idx = self._current()
        m, lst = self._table.container(idx, key, list)
        if lst is _MISSING:
            m[key] = [value]
            self._table.own(idx, key)
        else:
            lst.append(value)

    def add_all(self, values: Iterable[T]) -> None:
        key, idx = self._current()
        new = list(values)
        if not new:
            return
        m, lst = self._table.container(idx, key, list)
        if lst is _MISSING:
            m[key] = new
            self._table.own(idx, key)
        else:
            lst.extend(new)

    def update(self, values: Iterable[T]) -> None:
        """Replace the current key's list (an empty ``values`` clears it)."""
        key, idx = self._current()
        new = list(values)
        m = self._table.writable(idx)
        if new:
            m[key] = new
            self._table.own(idx, key)
        else:
            m.pop(key, None)


class MapState(_KeyedState):
    """A map per key (Flink's ``MapState``)."""

    kind = "map"

    def _current(self) -> tuple[Any, int]:
        b = self._backend
        if b._current_idx < 0:
            raise _no_current_key()
        return b._current_key, b._current_idx

    def _map(self) -> dict[Any, Any]:
        key, idx = self._current()
        m: dict[Any, Any] = self._table.maps[idx].get(key, {})
        return m

    def get(self, user_key: Any, default: Any = None) -> Any:
        return self._map().get(user_key, default)

    def contains(self, user_key: Any) -> bool:
        return user_key in self._map()

    def put(self, user_key: Any, value: Any) -> None:
        key, idx = self._current()
        m, c = self._table.container(idx, key, dict.copy)
        if c is _MISSING:
            m[key] = {user_key: value}
            self._table.own(idx, key)
        else:
            c[user_key] = value

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        if not entries:
            return
        key, idx = self._current()
        m, c = self._table.container(idx, key, dict.copy)
        if c is _MISSING:
            m[key] = dict(entries)
            self._table.own(idx, key)
        else:
            c.update(entries)

    def remove(self, user_key: Any) -> None:
        key, idx = self._current()
        if user_key not in self._table.maps[idx].get(key, ()):
            return
        m, c = self._table.container(idx, key, dict.copy)
        del c[user_key]
        if not c:
            del m[key]

    def keys(self) -> list[Any]:
        return list(self._map())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def is_empty(self) -> bool:
        return not self._map()


class ReducingState(_KeyedState, Generic[T]):
    """One value per key, combined with ``reduce_fn(old, new)`` on add (Flink's
    ``ReducingState``). ``reduce_fn`` must return a new value, not mutate its arguments."""

    kind = "reducing"

    def __init__(
        self, backend: KeyedStateBackend, table: _Table, reduce_fn: Callable[[T, T], T]
    ) -> None:
        super().__init__(backend, table)
        self._reduce = reduce_fn

    def get(self) -> T | None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        return self._table.maps[idx].get(b._current_key)

    def add(self, value: T) -> None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        t = self._table
        m = t.writable(idx) if t.shared[idx] else t.maps[idx]
        key = b._current_key
        old = m.get(key, _MISSING)
        m[key] = value if old is _MISSING else self._reduce(old, value)

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        maps = self._table.maps
        return [maps[i].get(k) for k, i in zip(pykeys, idxs, strict=True)]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        """Fold ``values[i]`` into the state of ``keys[i]``, in order. With distinct keys (e.g.
        the output of :func:`aggregate_batch`) every key is touched once."""
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        vals = _pylist(values)
        _check_lengths(pykeys, vals)
        t, fn = self._table, self._reduce
        maps, shared = t.maps, t.shared
        for k, i, v in zip(pykeys, idxs, vals, strict=True):
            m = t.writable(i) if shared[i] else maps[i]
            old = m.get(k, _MISSING)
            m[k] = v if old is _MISSING else fn(old, v)

    def add_batch(self, keys: Any, values: Any = None, agg: str = "sum") -> int:
        """Vectorised add of a whole batch: aggregate ``values`` per distinct key with the Arrow
        hash aggregation ``agg`` (``values=None`` counts rows), then fold each key's partial into
        the state once. ``agg`` must be the Arrow equivalent of ``reduce_fn`` ("sum" for
        addition, "min", "max", ...). Returns the number of distinct keys."""
        distinct, partials = aggregate_batch(keys, values, agg)
        self.add_many(distinct, partials)
        return len(distinct)


class AggregatingState(_KeyedState, Generic[T]):
    """An accumulator per key (Flink's ``AggregatingState``): ``add`` folds a value in with
    ``add_fn(value, accumulator) -> accumulator`` (which may mutate the accumulator), ``get``
    returns ``get_result_fn(accumulator)``."""

    kind = "aggregating"

    def __init__(
        self,
        backend: KeyedStateBackend,
        table: _Table,
        add_fn: Callable[[Any, Any], Any],
        get_result_fn: Callable[[Any], T],
        create_accumulator: Callable[[], Any],
    ) -> None:
        super().__init__(backend, table)
        self._add = add_fn
        self._result = get_result_fn
        self._create = create_accumulator

    def get(self) -> T | None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        acc = self._table.maps[idx].get(b._current_key, _MISSING)
        return None if acc is _MISSING else self._result(acc)

    def _fold(self, idx: int, key: Any, value: Any) -> None:
        t = self._table
        m, acc = t.container(idx, key, copy.deepcopy)
        if acc is _MISSING:
            acc = self._create()
        m[key] = self._add(value, acc)
        t.own(idx, key)

    def add(self, value: Any) -> None:
        b = self._backend
        if b._current_idx < 0:
            raise _no_current_key()
        self._fold(b._current_idx, b._current_key, value)

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        maps, result = self._table.maps, self._result
        out: list[T | None] = []
        for k, i in zip(pykeys, idxs, strict=True):
            acc = maps[i].get(k, _MISSING)
            out.append(None if acc is _MISSING else result(acc))
        return out

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        vals = _pylist(values)
        _check_lengths(pykeys, vals)
        for k, i, v in zip(pykeys, idxs, vals, strict=True):
            self._fold(i, k, v)


def aggregate_batch(keys: Any, values: Any = None, agg: str = "sum") -> tuple[pa.Array, pa.Array]:
    """Pre-aggregate a batch per distinct key with Arrow's hash aggregation: returns
    ``(distinct_keys, partials)`` in first-occurrence order. ``values=None`` counts rows per key;
    otherwise ``agg`` names an Arrow hash aggregation ("sum", "min", "max", "count", ...)."""
    key_arr = keys if isinstance(keys, pa.Array | pa.ChunkedArray) else pa.array(keys)
    if values is None:
        table = pa.table({"k": key_arr})
        out = table.group_by("k", use_threads=False).aggregate([([], "count_all")])
        column = "count_all"
    else:
        val_arr = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values)
        table = pa.table({"k": key_arr, "v": val_arr})
        out = table.group_by("k", use_threads=False).aggregate([("v", agg)])
        column = f"v_{agg}"
    return out.column("k").combine_chunks(), out.column(column).combine_chunks()


class Timer(NamedTuple):
    """An event-time timer: fires once the watermark reaches ``timestamp``."""

    timestamp: int
    key: Any
    namespace: Any
    key_group: int


class TimerService:
    """Event-time timers of a keyed backend (Flink's ``InternalTimerService``), per key group.

    A timer is ``(key, namespace, timestamp)``; registering it twice keeps one. Timers are
    snapshotted with the keyed state and restored by key group like any keyed state.
    """

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        n = len(backend.key_group_range)
        self._sets: list[set[tuple[int, Any, Any]]] = [set() for _ in range(n)]
        self._shared = [False] * n
        # (timestamp, sequence, key-group index, key, namespace); entries whose timer was
        # deleted (or fired through another entry) are skipped lazily.
        self._heap: list[tuple[int, int, int, Any, Any]] = []
        self._seq = itertools.count()
        self._watermark = MIN_WATERMARK
        self._count = 0

    @property
    def current_watermark(self) -> int:
        return self._watermark

    def _writable(self, idx: int) -> set[tuple[int, Any, Any]]:
        s = self._sets[idx]
        if self._shared[idx]:
            s = self._sets[idx] = set(s)
            self._shared[idx] = False
        return s

    def _add(self, idx: int, timestamp: int, key: Any, namespace: Any) -> None:
        entry = (timestamp, key, namespace)
        if entry in self._sets[idx]:
            return
        self._writable(idx).add(entry)
        self._count += 1
        heapq.heappush(self._heap, (timestamp, next(self._seq), idx, key, namespace))

    def register_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        """Register a timer for the current key at ``timestamp`` (in ``namespace``, e.g. a
        window). A timer at or below the current watermark fires on the next advance."""
        b = self._backend
        if b._current_idx < 0:
            raise _no_current_key()
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise StateError(f"timer timestamps are ints (ms), got {timestamp!r}")
        self._add(b._current_idx, timestamp, b._current_key, namespace)

    def delete_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise _no_current_key()
        entry = (timestamp, b._current_key, namespace)
        if entry in self._sets[idx]:
            self._writable(idx).discard(entry)
            self._count -= 1
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * self._count + 1024:
            self._heap = [e for e in self._heap if (e[0], e[3], e[4]) in self._sets[e[2]]]
            heapq.heapify(self._heap)

    def advance_watermark(self, watermark: int) -> list[Timer]:
        """Advance the watermark and return the timers with ``timestamp <= watermark``, in
        timestamp order (registration order among equal timestamps), removing them."""
        if watermark > self._watermark:
            self._watermark = watermark
        fired: list[Timer] = []
        heap, sets, start = self._heap, self._sets, self._backend.key_group_range.start
        while heap and heap[0][0] <= watermark:
            ts, _, idx, key, namespace = heapq.heappop(heap)
            entry = (ts, key, namespace)
            if entry in sets[idx]:
                self._writable(idx).discard(entry)
                self._count -= 1
                fired.append(Timer(ts, key, namespace, start + idx))
        return fired

    def next_timer_timestamp(self) -> int | None:
        heap, sets = self._heap, self._sets
        while heap:
            ts, _, idx, key, namespace = heap[0]
            if (ts, key, namespace) in sets[idx]:
                return ts
            heapq.heappop(heap)
        return None

    def num_timers(self) -> int:
        return self._count

    def timers(self) -> list[Timer]:
        """All registered timers, in timestamp order."""
        start = self._backend.key_group_range.start
        out = [
            Timer(ts, key, ns, start + idx) for idx, s in enumerate(self._sets) for ts, key, ns in s
        ]
        out.sort(key=lambda t: t.timestamp)
        return out

    def _freeze(self) -> list[set[tuple[int, Any, Any]]]:
        self._shared = [True] * len(self._sets)
        return list(self._sets)

    def _thaw(self) -> None:
        self._shared = [False] * len(self._sets)

    def _restore_group(self, idx: int, entries: Any, path: str) -> None:
        if not isinstance(entries, list):
            raise CorruptStateError(f"state file {path}: a timers section is not a list")
        for entry in entries:
            if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], int)):
                raise CorruptStateError(f"state file {path}: malformed timer {entry!r:.100}")
            self._add(idx, entry[0], entry[1], entry[2])


_STATE_KINDS = {"value", "list", "map", "reducing", "aggregating", *TTL_KINDS}


def wall_clock_ms() -> int:
    """Processing time in milliseconds (the default clock of state TTL)."""
    return time.time_ns() // 1_000_000


class KeyedStateBackend:
    """Keyed state and event-time timers of one subtask: the key groups ``key_group_range`` of
    ``max_parallelism``. See the module docstring for the recovery contract."""

    def __init__(
        self,
        max_parallelism: int,
        key_group_range: KeyGroupRange | tuple[int, int],
        *,
        name: str = "",
        clock: Clock | None = None,
    ) -> None:
        kgs.check_max_parallelism(max_parallelism)
        kg_range = (
            key_group_range
            if isinstance(key_group_range, KeyGroupRange)
            else KeyGroupRange(*key_group_range)
        )
        if not 0 <= kg_range.start <= kg_range.end < max_parallelism:
            raise StateError(
                f"key-group range {kg_range} is empty or outside [0, {max_parallelism - 1}]"
            )
        self.max_parallelism = max_parallelism
        self.key_group_range = kg_range
        self.name = name
        self._start = kg_range.start
        self._n = len(kg_range)
        self._tables: dict[str, _Table] = {}
        self._current_key: Any = None
        self._current_idx = -1
        self.timer_service = TimerService(self)
        self._snapshots = _SnapshotTracker(self._thaw)
        self.clock: Clock = clock or wall_clock_ms
        """Processing time in ms for state TTL (injectable for tests)."""

    @classmethod
    def for_subtask(
        cls, max_parallelism: int, parallelism: int, index: int, *, name: str = ""
    ) -> KeyedStateBackend:
        kg_range = kgs.key_group_range_for_subtask(max_parallelism, parallelism, index)
        return cls(max_parallelism, kg_range, name=name)

    # --- lifecycle (the disk backend needs these; the heap has nothing to do) ----------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """A checkpoint this backend took part in completed (incremental backends reuse its
        files from now on)."""

    def dispose(self) -> None:
        """The task ends: release local resources (files of the disk backend)."""

    # --- current key ------------------------------------------------------------------------

    def key_group_of(self, key: Any) -> int:
        return kgs.key_group_for_key(key, self.max_parallelism)

    def _index_of(self, key: Any, key_group: int | None = None) -> int:
        kg = kgs.key_group_for_key(key, self.max_parallelism) if key_group is None else key_group
        idx = kg - self._start
        if not 0 <= idx < self._n:
            raise KeyGroupRangeError(
                f"key {key!r:.100} is in key group {kg}, outside this backend's key groups "
                f"{self.key_group_range} (max parallelism {self.max_parallelism})"
            )
        return idx

    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Make ``key`` the key that state accesses refer to. ``key_group`` skips hashing when
        the caller already knows it (e.g. from the partitioner); it is not re-checked."""
        self._current_idx = self._index_of(key, key_group)
        self._current_key = key

    @property
    def current_key(self) -> Any:
        return self._current_key if self._current_idx >= 0 else None

    @property
    def current_key_group(self) -> int | None:
        return self._start + self._current_idx if self._current_idx >= 0 else None

    def _groups(self, keys: Any, key_groups: Any) -> tuple[Any, pa.Array]:
        """``keys`` (an Arrow array, or a list) and their validated key groups (int32 array)."""
        if not isinstance(keys, pa.Array | pa.ChunkedArray):
            keys = _pylist(keys)  # numpy keys become Python ints/strs, as Arrow keys do
        if key_groups is None:
            groups = kgs.key_groups(keys, self.max_parallelism)
        elif isinstance(key_groups, pa.ChunkedArray):
            groups = key_groups.combine_chunks()
        elif isinstance(key_groups, pa.Array):
            groups = key_groups
        else:
            groups = pa.array(_pylist(key_groups), pa.int32())
        if len(groups) != len(keys):
            raise StateError(f"{len(keys)} keys but {len(groups)} key groups")
        if len(groups) and groups.null_count:
            raise StateError("key groups must not be null")
        if len(groups):
            bounds = pc.min_max(groups)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo < self._start or hi >= self._start + self._n:
                for k, g in zip(_pylist(keys), groups.to_pylist(), strict=True):
                    if not 0 <= g - self._start < self._n:
                        raise KeyGroupRangeError(
                            f"key {k!r:.100} is in key group {g}, outside this backend's key "
                            f"groups {self.key_group_range}"
                        )
        return keys, groups

    def resolve_keys(self, keys: Any, key_groups: Any = None) -> tuple[list[Any], list[int]]:
        """Python keys and their key-group *indices* in this backend's range, for bulk access.
        ``keys``: an Arrow array, list or numpy array; ``key_groups`` (optional): their key
        groups, trusted (not re-hashed) but range-checked."""
        keys, groups = self._groups(keys, key_groups)
        idxs = pc.subtract(pc.cast(groups, pa.int64()), pa.scalar(self._start, pa.int64()))
        return _pylist(keys), _pylist(idxs)

    def runs_by_key_group(
        self, keys: Any, values: Any, key_groups: Any = None
    ) -> Iterator[tuple[int, list[Any], list[Any]]]:
        """``(key-group index, keys, values)`` per key group present, rows in their original
        order within a group (a stable sort by key group with Arrow kernels)."""
        keys, groups = self._groups(keys, key_groups)
        if not isinstance(values, pa.Array | pa.ChunkedArray):
            values = _pylist(values)
        if len(values) != len(groups):
            raise StateError(f"{len(groups)} keys but {len(values)} values")
        if not len(groups):
            return
        order = pc.sort_indices(groups)  # stable
        runs = pc.run_end_encode(groups.take(order))
        ends, group_ids = runs.run_ends.to_pylist(), runs.values.to_pylist()
        sorted_keys, sorted_values = _take(keys, order), _take(values, order)
        begin = 0
        for end, g in zip(ends, group_ids, strict=True):
            yield g - self._start, sorted_keys[begin:end], sorted_values[begin:end]
            begin = end

    # --- registration -----------------------------------------------------------------------

    def _table(self, name: str, kind: str) -> _Table:
        if not isinstance(name, str) or not name:
            raise StateError(f"state names are non-empty strings, got {name!r}")
        table = self._tables.get(name)
        if table is None:
            # Not in any live snapshot view: it needs no copy-on-write until the next snapshot.
            table = self._tables[name] = _Table(name, kind, self._n)
        elif table.kind != kind:
            raise IncompatibleStateError(
                f"state {name!r} is {table.kind} state, it cannot be used as {kind} state"
            )
        return table

    # Without a default the value type cannot be inferred from the call: Any.
    # The ``_new_*`` factories make the plain states; the disk backend overrides them, and the
    # TTL wrappers (snapflow.worker.state.ttl) sit on top of either backend's plain states.

    def _new_value(self, name: str, kind: str, default: Any) -> ValueState[Any]:
        return ValueState(self, self._table(name, kind), default)

    def _new_list(self, name: str, kind: str) -> ListState[Any]:
        return ListState(self, self._table(name, kind))

    def _new_map(self, name: str, kind: str) -> MapState:
        return MapState(self, self._table(name, kind))

    def _new_reducing(
        self, name: str, kind: str, reduce_fn: Callable[[Any, Any], Any]
    ) -> ReducingState[Any]:
        return ReducingState(self, self._table(name, kind), reduce_fn)

    def _new_aggregating(
        self,
        name: str,
        kind: str,
        add_fn: Callable[[Any, Any], Any],
        get_result_fn: Callable[[Any], Any],
        create_accumulator: Callable[[], Any],
    ) -> AggregatingState[Any]:
        return AggregatingState(
            self, self._table(name, kind), add_fn, get_result_fn, create_accumulator
        )

    # Without a default the value type cannot be inferred from the call: Any.
    @overload
    def get_value_state(
        self, name: str, *, ttl: StateTtlConfig | None = None
    ) -> ValueState[Any]: ...
    @overload
    def get_value_state(
        self, name: str, default: T, *, ttl: StateTtlConfig | None = None
    ) -> ValueState[T]: ...
    def get_value_state(
        self, name: str, default: Any = None, *, ttl: StateTtlConfig | None = None
    ) -> ValueState[Any]:
        """A value per key; with ``ttl``, values expire (snapflow.worker.state.ttl)."""
        if ttl is None:
            return self._new_value(name, "value", default)
        inner = self._new_value(name, ttl_kind("value"), None)
        return TtlValueState(self, inner, ttl, self.clock, default)  # type: ignore[return-value]

    def get_list_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> ListState[Any]:
        if ttl is None:
            return self._new_list(name, "list")
        inner = self._new_list(name, ttl_kind("list"))
        return TtlListState(self, inner, ttl, self.clock)  # type: ignore[return-value]

    def get_map_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> MapState:
        if ttl is None:
            return self._new_map(name, "map")
        inner = self._new_map(name, ttl_kind("map"))
        return TtlMapState(self, inner, ttl, self.clock)  # type: ignore[return-value]

    def get_reducing_state(
        self, name: str, reduce_fn: Callable[[T, T], T], *, ttl: StateTtlConfig | None = None
    ) -> ReducingState[T]:
        if ttl is None:
            return self._new_reducing(name, "reducing", reduce_fn)
        wrapped = TtlReducingState.wrap_reduce(reduce_fn, ttl, self.clock)
        inner = self._new_reducing(name, ttl_kind("reducing"), wrapped)
        return TtlReducingState(  # type: ignore[return-value]
            self, inner, ttl, self.clock, aggregate_batch
        )

    def get_aggregating_state(
        self,
        name: str,
        add_fn: Callable[[Any, Any], Any],
        get_result_fn: Callable[[Any], T],
        create_accumulator: Callable[[], Any],
        *,
        ttl: StateTtlConfig | None = None,
    ) -> AggregatingState[T]:
        if ttl is None:
            return self._new_aggregating(
                name, "aggregating", add_fn, get_result_fn, create_accumulator
            )
        add, identity, create = TtlAggregatingState.wrap_functions(
            add_fn, create_accumulator, ttl, self.clock
        )
        inner = self._new_aggregating(name, ttl_kind("aggregating"), add, identity, create)
        return TtlAggregatingState(  # type: ignore[return-value]
            self, inner, ttl, self.clock, get_result_fn
        )

    def _ttl_scan(self, name: str) -> Iterator[tuple[Any, int]]:
        """Every ``(key, key group)`` of state ``name``, for the incremental TTL clean-up;
        robust to changes while it is walked (each key group's keys are listed when reached)."""
        table = self._tables.get(name)
        if table is None:
            return
        for idx in range(self._n):
            for key in list(table.maps[idx]):
                if key in table.maps[idx]:
                    yield key, self._start + idx

    def state_names(self) -> list[str]:
        return sorted(self._tables)

    def entries(self, name: str) -> Iterator[tuple[Any, Any]]:
        """All ``(key, value)`` entries of state ``name`` (lists and maps as stored)."""
        table = self._tables.get(name)
        if table is None:
            return
        for m in table.maps:
            yield from m.items()

    def is_empty(self) -> bool:
        return (
            not any(len(t) for t in self._tables.values()) and not self.timer_service.num_timers()
        )

    # --- snapshots --------------------------------------------------------------------------

    def _thaw(self) -> None:
        for table in self._tables.values():
            table.thaw()
        self.timer_service._thaw()

    def snapshot(
        self, checkpoint_id: int, options: BarrierOptions | None = None
    ) -> SnapshotInProgress:
        """Synchronous part: freeze a copy-on-write view of every state and timer (no entry is
        copied). Returns the snapshot; its :meth:`~SnapshotInProgress.write` is the async part.
        The heap's snapshots are always in the canonical format, so ``options`` (the barrier's:
        checkpoint or savepoint, target location) change nothing here."""
        start = time.perf_counter()
        self._snapshots.reap()
        views = {name: (t.kind, t.freeze()) for name, t in self._tables.items()}
        timer_view = self.timer_service._freeze()
        writer = _KeyedSnapshotWriter(
            checkpoint_id, self.max_parallelism, self.key_group_range, self.name, views, timer_view
        )
        snap = SnapshotInProgress(checkpoint_id, writer, self._snapshots.release)
        self._snapshots.add(snap)
        snap.sync_duration_s = time.perf_counter() - start
        return snap

    # --- restore ----------------------------------------------------------------------------

    def restore(
        self, handles: Iterable[Any], *, base_dir: str | os.PathLike[str] | None = None
    ) -> int:
        """Restore this backend's key groups from the keyed and timer handles among ``handles``
        (typically all handles of the vertex; others are ignored). Only files whose key-group
        range overlaps this backend's are opened, and only their sections of its key groups are
        read. Returns the number of key-group sections restored."""
        if not self.is_empty():
            raise IncompatibleStateError("restore() needs a backend that holds no state yet")
        seen: dict[str, dict[int, str]] = {KEYED: {}, TIMERS: {}}
        restored = 0
        for raw in handles:
            handle = _handle_fields(raw, base_dir)
            kind = handle.kind
            if kind == INCREMENTAL:
                raise IncompatibleStateError(
                    f"{handle.path} is an incremental checkpoint of the rocksdb state "
                    "backend; restore it with state_backend('rocksdb'), or take a savepoint "
                    "(a canonical snapshot any backend restores)"
                )
            if kind not in (KEYED, TIMERS):
                continue
            file_range = KeyGroupRange(handle.key_group_start, handle.key_group_end)
            if not file_range.overlaps(self.key_group_range):
                continue
            with _StateFileReader(handle) as reader:
                self._check_meta(reader, file_range)
                states = reader.meta.get("states", {})
                wanted = []
                for entry in reader.sections:
                    kg = entry.section
                    if kg not in file_range:
                        raise reader._corrupt(f"key group {kg} lies outside the file's range")
                    if kg not in self.key_group_range:
                        continue
                    if kg in seen[kind]:
                        raise CorruptStateError(
                            f"key group {kg} appears in both {seen[kind][kg]} and "
                            f"{reader.path}: the handles are not one snapshot"
                        )
                    seen[kind][kg] = reader.path
                    wanted.append(entry)
                reader.prefetch(wanted)
                for entry in wanted:
                    kg = entry.section
                    data = reader.read(entry)
                    idx = kg - self._start
                    if kind == TIMERS:
                        self.timer_service._restore_group(idx, data, reader.path)
                    else:
                        self._restore_group(idx, data, states, reader.path)
                    restored += 1
        return restored

    def _check_meta(self, reader: _StateFileReader, file_range: KeyGroupRange) -> None:
        meta = reader.meta
        if meta.get("max_parallelism") != self.max_parallelism:
            raise IncompatibleStateError(
                f"state file {reader.path} was written with max parallelism "
                f"{meta.get('max_parallelism')}, this backend has {self.max_parallelism}; "
                "the max parallelism of a job with keyed state cannot change"
            )
        if meta.get("key_hash") != KEY_HASH_VERSION:
            raise IncompatibleStateError(
                f"state file {reader.path} uses key hash {meta.get('key_hash')!r}, this worker "
                f"uses {KEY_HASH_VERSION!r}"
            )
        if (meta.get("key_group_start"), meta.get("key_group_end")) != (
            file_range.start,
            file_range.end,
        ):
            raise CorruptStateError(
                f"state file {reader.path} holds key groups {meta.get('key_group_start')}.."
                f"{meta.get('key_group_end')}, its handle says {file_range}"
            )

    def _restore_group(self, idx: int, data: Any, kinds: Mapping[str, str], path: str) -> None:
        if not isinstance(data, dict):
            raise CorruptStateError(f"state file {path}: a key-group section is not a dict")
        for name, entries in data.items():
            kind = kinds.get(name)
            if kind not in _STATE_KINDS or not isinstance(entries, dict):
                raise CorruptStateError(f"state file {path}: malformed state {name!r:.100}")
            self._table(name, kind).writable(idx).update(entries)


class _KeyedSnapshotWriter:
    """The asynchronous part of a keyed snapshot: reads only the frozen view."""

    def __init__(
        self,
        checkpoint_id: int,
        max_parallelism: int,
        kg_range: KeyGroupRange,
        prefix: str,
        views: dict[str, tuple[str, list[dict[Any, Any]]]],
        timer_view: list[set[tuple[int, Any, Any]]],
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.max_parallelism = max_parallelism
        self.kg_range = kg_range
        self.prefix = prefix
        self.views = views
        self.timer_view = timer_view

    def _meta(self, kind: str) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": kind,
            "checkpoint_id": self.checkpoint_id,
            "max_parallelism": self.max_parallelism,
            "key_group_start": self.kg_range.start,
            "key_group_end": self.kg_range.end,
            "key_hash": KEY_HASH_VERSION,
        }

    def _keyed_sections(self) -> Iterator[tuple[int, bytes]]:
        for idx in range(len(self.kg_range)):
            group = {name: maps[idx] for name, (_, maps) in self.views.items() if maps[idx]}
            if group:
                kg = self.kg_range.start + idx
                yield kg, _dumps(group, f"the keyed state of key group {kg}")

    def _timer_sections(self) -> Iterator[tuple[int, bytes]]:
        for idx, timers in enumerate(self.timer_view):
            if timers:
                yield self.kg_range.start + idx, _dumps(list(timers), "timers")

    def __call__(self, directory: str, into: MergedStateObject | None = None) -> list[StateHandle]:
        handles: list[StateHandle] = []
        try:
            self._write(directory, handles, into)
        except BaseException:
            if into is None:
                _discard_files(handles)  # no orphans from a failed write
            raise
        return handles

    def _write(
        self, directory: str, handles: list[StateHandle], into: MergedStateObject | None
    ) -> None:
        if any(maps[i] for _, maps in self.views.values() for i in range(len(maps))):
            meta = self._meta(KEYED)
            meta["states"] = {name: kind for name, (kind, _) in self.views.items()}
            name = _file_name(self.prefix, KEYED, self.checkpoint_id, self.kg_range)
            handles.append(
                _write_state_file(
                    directory, name, KEYED, meta, self._keyed_sections(), self.kg_range, into
                )
            )
        if any(self.timer_view):
            name = _file_name(self.prefix, TIMERS, self.checkpoint_id, self.kg_range)
            handles.append(
                _write_state_file(
                    directory,
                    name,
                    TIMERS,
                    self._meta(TIMERS),
                    self._timer_sections(),
                    self.kg_range,
                    into,
                )
            )


# ---------------------------------------------------------------------------------------------
# Operator state
# ---------------------------------------------------------------------------------------------

SPLIT_DISTRIBUTE = "split"
UNION_DISTRIBUTE = "union"


class OperatorListState(Generic[T]):
    """A list of a non-keyed operator. ``mode`` is ``"split"`` (redistributed on restore) or
    ``"union"`` (every subtask gets all subtasks' elements on restore)."""

    def __init__(self, name: str, mode: str, items: list[T] | None = None) -> None:
        self.name = name
        self.mode = mode
        self._items: list[T] = items if items is not None else []

    def get(self) -> list[T]:
        return list(self._items)

    def add(self, value: T) -> None:
        self._items.append(value)

    def add_all(self, values: Iterable[T]) -> None:
        self._items.extend(values)

    def update(self, values: Iterable[T]) -> None:
        self._items = list(values)

    def clear(self) -> None:
        self._items = []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))


class OperatorStateBackend:
    """Operator (non-keyed) list and union list state of one subtask."""

    def __init__(self, *, name: str = "") -> None:
        self.name = name
        self._states: dict[str, OperatorListState[Any]] = {}

    def _get(self, name: str, mode: str) -> OperatorListState[Any]:
        if not isinstance(name, str) or not name:
            raise StateError(f"state names are non-empty strings, got {name!r}")
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = OperatorListState(name, mode)
        elif state.mode != mode:
            raise IncompatibleStateError(
                f"operator state {name!r} is {state.mode} list state, it cannot be used as "
                f"{mode} list state"
            )
        return state

    def get_list_state(self, name: str) -> OperatorListState[Any]:
        """List state redistributed on restore (Flink's SPLIT_DISTRIBUTE)."""
        return self._get(name, SPLIT_DISTRIBUTE)

    def get_union_list_state(self, name: str) -> OperatorListState[Any]:
        """List state broadcast as the union of all subtasks' lists on restore (Flink's UNION)."""
        return self._get(name, UNION_DISTRIBUTE)

    def state_names(self) -> list[str]:
        return sorted(self._states)

    def snapshot(self, checkpoint_id: int) -> SnapshotInProgress:
        """Synchronous part: a shallow copy of every list (operator state is small)."""
        start = time.perf_counter()
        split = {n: list(s._items) for n, s in self._states.items() if s.mode == SPLIT_DISTRIBUTE}
        union = {n: list(s._items) for n, s in self._states.items() if s.mode == UNION_DISTRIBUTE}
        prefix = self.name

        def write(directory: str, into: MergedStateObject | None) -> list[StateHandle]:
            handles = []
            for kind, lists in ((OPERATOR, split), (UNION, union)):
                if not any(lists.values()):
                    continue
                meta = {
                    "format": FORMAT_NAME,
                    "version": FORMAT_VERSION,
                    "kind": kind,
                    "checkpoint_id": checkpoint_id,
                    "states": {n: kind for n in lists},
                }
                sections = [(0, _dumps(lists, f"{kind} state"))]
                name = _file_name(prefix, kind, checkpoint_id, None)
                handles.append(
                    _write_state_file(
                        directory, name, kind, meta, sections, KeyGroupRange.empty(), into
                    )
                )
            return handles

        snap = SnapshotInProgress(checkpoint_id, write, lambda _snap: None)
        snap.sync_duration_s = time.perf_counter() - start
        return snap

    def restore(
        self,
        handles_by_old_subtask: Mapping[int, Iterable[Any]] | Sequence[Iterable[Any]],
        new_index: int,
        new_parallelism: int,
        *,
        old_parallelism: int | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Restore from the operator and union handles of every old subtask (other kinds are
        ignored). ``handles_by_old_subtask`` maps old subtask index -> handles (a sequence is
        indexed by position); ``old_parallelism`` defaults to the highest index + 1."""
        if not 0 <= new_index < new_parallelism:
            raise StateError(f"subtask index {new_index} outside [0, {new_parallelism})")
        if any(len(s) for s in self._states.values()):
            raise IncompatibleStateError("restore() needs a backend that holds no state yet")
        by_index: dict[int, Iterable[Any]] = (
            dict(handles_by_old_subtask)
            if isinstance(handles_by_old_subtask, Mapping)
            else dict(enumerate(handles_by_old_subtask))
        )
        old_p = old_parallelism if old_parallelism is not None else max(by_index, default=-1) + 1
        split_parts: dict[str, list[tuple[int, list[Any]]]] = {}
        union: dict[str, list[Any]] = {}
        for old_index in sorted(by_index):
            for raw in by_index[old_index]:
                handle = _handle_fields(raw, base_dir)
                kind = handle.kind
                if kind not in (OPERATOR, UNION):
                    continue
                with _StateFileReader(handle) as reader:
                    for entry in reader.sections:
                        data = reader.read(entry)
                        if not isinstance(data, dict) or not all(
                            isinstance(v, list) for v in data.values()
                        ):
                            raise reader._corrupt("an operator state section is not {name: list}")
                        for name, items in data.items():
                            if kind == UNION:
                                union.setdefault(name, []).extend(items)
                            else:
                                split_parts.setdefault(name, []).append((old_index, items))
        for name, items in union.items():
            self._get(name, UNION_DISTRIBUTE)._items = items
        for name, parts in split_parts.items():
            if old_p == new_parallelism:
                mine = [x for i, items in parts if i == new_index for x in items]
            else:
                everything = [x for _, items in parts for x in items]
                base, remainder = divmod(len(everything), new_parallelism)
                begin = new_index * base + min(new_index, remainder)
                mine = everything[begin : begin + base + (1 if new_index < remainder else 0)]
            self._get(name, SPLIT_DISTRIBUTE)._items = mine

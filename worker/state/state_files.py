"""State files: the format of the files snapshots write, and their writers and readers.

Files are written under unique names and named by a handle only once durable. Locally: encoded
in memory, then created exclusively under the final name with one write, fsync, and the
directory's fsync (no temporary name: a crash leaves at most a partial file no handle names). On an object store (``s3://`` directories,
handles carry the full URI) a file is built in memory and written whole with one PUT, which
makes it visible whole or not at all; a subtask's files of one checkpoint may instead be
appended to one :class:`MergedStateObject` (one PUT per subtask and checkpoint), each handle
naming its byte range (``offset``, ``size_bytes``). Reading an object takes ranged GETs only:
the file's last 256 KiB first (trailer, index and metadata; all of a small file), then the
sections a restore needs in one coalesced range (and the 8-byte header when the tail did not
hold it). Writing and restoring never LIST; a HEAD only for a handle without its size. Restore
refuses, with a :class:`~snapflow.errors.StateError`, files that are corrupt or truncated
(magic, sizes, CRC-32 of every section), of an unknown format version, written with another
``max_parallelism`` or key hash, or whose state kind differs from the one registered. A missing
or unreadable file raises :class:`~snapflow.errors.StorageError`.

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
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import replace
from typing import Any, BinaryIO, NamedTuple, TypeVar
from urllib.parse import unquote, urlsplit

from snapflow.checkpointing import (
    BROADCAST,
    INCREMENTAL,
    KEYED,
    OPERATOR,
    TIMERS,
    UNION,
    StateHandle,
)
from snapflow.durable_files import write_new_file
from snapflow.errors import StateError, StorageError
from snapflow.filestore import FileStore, is_object_store_uri
from snapflow.filestore_registry import store_for
from snapflow.worker.state import arrow_pickling
from snapflow.worker.state.errors import CorruptStateError, StateFormatVersionError
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.write_clock import timing

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MergedStateObject",
    "StateFileReader",
    "discard_files",
    "handle_fields",
    "pickle_section",
    "state_file_name",
    "write_state_file",
]

T = TypeVar("T")

FORMAT_VERSION = 1
FORMAT_NAME = "snapflow-state"

# A state file is described by a ``snapflow.checkpointing.StateHandle``, whose kind names
# (KEYED, TIMERS, ...) are the foundation's. The codes in a file's header are this format's own.
_KIND_CODES = {KEYED: 1, TIMERS: 2, OPERATOR: 3, UNION: 4, INCREMENTAL: 5, BROADCAST: 6}


def handle_fields(handle: Any, base_dir: str | os.PathLike[str] | None) -> StateHandle:
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
        data=bytes(field("data", b"") or b""),
    )


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


def pickle_section(obj: Any, what: str) -> bytes:
    """One section's blob (``what`` names it in the error when ``obj`` cannot be pickled)."""
    try:
        with timing("serialise_s"):
            return arrow_pickling.dumps(obj)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as e:
        raise StateError(f"cannot serialise {what}: {e}") from e


class MergedStateObject:
    """The files of one subtask's checkpoint collected in memory, to be stored together once
    all are encoded (:meth:`finish`): inline in their handles when they are small, else as one
    object with one request on an object store, else each as its own file.

    On an object store every object costs a PUT, and a subtask may write several small files
    per checkpoint (keyed state, timers, operator state, channel state). As with Flink's file
    merging (FLIP-306), a handle then names the shared object plus the byte range of its own
    file (``offset``, ``size_bytes``); every file keeps its own format, so it is read exactly as
    a file of its own. All files in one object belong to one checkpoint of one subtask, so the
    object is discarded as a whole, with that checkpoint.

    Inline (all the files together at most the checkpoint's ``inline_state_threshold_bytes``,
    Flink's ``state.storage.fs.memory-threshold``): no file at all; each handle carries its
    file's bytes (``StateHandle.data``) under the name its file would have had."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._parts: list[bytes | memoryview] = []
        self.size = 0
        self.names: dict[int, str] = {}
        """Offset in the object -> the path the file would have on its own."""

    def add(self, parts: Iterable[bytes | memoryview], name: str = "") -> int:
        """Append one file (given as consecutive parts) that would be ``name`` on its own;
        returns its offset in the object."""
        offset = self.size
        for part in parts:
            self._parts.append(part)
            self.size += len(part)
        self.names[offset] = name
        return offset

    def write(self) -> bool:
        """Write the object (one PUT; nothing when no file was added). Returns whether it
        wrote."""
        if not self.size:
            return False
        with timing("durable_s"):
            store_for(self.path).write(self.path, b"".join(self._parts))
        self._parts = []
        return True

    def finish(
        self, handles: Sequence[StateHandle], inline_threshold_bytes: int
    ) -> list[StateHandle]:
        """Store the files added here and return ``handles`` with those files' final handles:
        inline if the object is at most ``inline_threshold_bytes`` (0: never), else the object
        itself on an object store, else one durable file per handle locally. Handles of other
        files (a backend's own uploads) are returned as they are."""
        if not self.size:
            return list(handles)
        whole = b"".join(self._parts)
        self._parts = []
        if self.size <= inline_threshold_bytes:
            return [
                replace(
                    h,
                    path=self.names[h.offset],
                    offset=0,
                    data=whole[h.offset : h.offset + h.size_bytes],
                )
                if h.path == self.path
                else h
                for h in handles
            ]
        if is_object_store_uri(self.path):
            self._parts = [whole]
            self.write()
            return list(handles)
        written: list[StateHandle] = []
        try:
            for h in handles:
                if h.path != self.path:
                    written.append(h)
                    continue
                path = os.path.abspath(self.names[h.offset])
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with timing("durable_s"):
                        write_new_file(path, memoryview(whole)[h.offset : h.offset + h.size_bytes])
                except OSError as e:
                    raise StorageError(f"cannot write state file {path}: {e}") from e
                written.append(replace(h, path=path, offset=0))
        except BaseException:
            discard_files(
                [h for h, old in zip(written, handles, strict=False) if old.path == self.path]
            )
            raise
        return written


def _encode_state_file(
    write: Callable[[bytes], object],
    kind: str,
    meta: dict[str, Any],
    sections: Iterable[tuple[int, bytes]],
) -> int:
    """Write the file format (module docstring) through ``write`` (which collects the parts in
    memory: the writing to storage is timed where it happens); returns the size."""
    put = write
    put(_HEADER.pack(_MAGIC, FORMAT_VERSION, _KIND_CODES[kind]))
    pos = _HEADER.size
    index = bytearray()
    count = 0
    for section, blob in sections:
        put(blob)
        index += _INDEX_ENTRY.pack(section, pos, len(blob), zlib.crc32(blob))
        pos += len(blob)
        count += 1
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    put(meta_bytes)
    put(bytes(index))
    crc = zlib.crc32(index, zlib.crc32(meta_bytes))
    put(_TRAILER.pack(pos, len(meta_bytes), pos + len(meta_bytes), count, crc, _TAIL_MAGIC))
    return pos + len(meta_bytes) + len(index) + _TRAILER.size


def write_state_file(
    directory: str,
    filename: str,
    kind: str,
    meta: dict[str, Any],
    sections: Iterable[tuple[int, bytes]],
    key_group_range: KeyGroupRange,
    into: MergedStateObject | None = None,
) -> StateHandle:
    """Write one state file; returns its handle. Locally the file is encoded in memory and
    written durably under its unique final name (``write_new_file``); on an object store it is
    built in memory and written whole with one PUT (an object appears whole or not at all). With
    ``into`` it is only appended there, and stored by ``into.finish``."""
    if into is None and not is_object_store_uri(directory):
        return _write_local_state_file(directory, filename, kind, meta, sections, key_group_range)
    parts: list[bytes] = []
    size = _encode_state_file(parts.append, kind, meta, sections)
    if into is not None:
        path, offset = into.path, into.add(parts, _join(directory, filename))
    else:
        store = store_for(directory)
        path, offset = store.join(directory, filename), 0
        with timing("durable_s"):
            store.write(path, b"".join(parts))
    return StateHandle(
        path=path,
        size_bytes=size,
        kind=kind,
        key_group_start=key_group_range.start,
        key_group_end=key_group_range.end,
        offset=offset,
    )


def _join(directory: str, filename: str) -> str:
    if is_object_store_uri(directory):
        return store_for(directory).join(directory, filename)
    return os.path.join(directory, filename)


def _write_local_state_file(
    directory: str,
    filename: str,
    kind: str,
    meta: dict[str, Any],
    sections: Iterable[tuple[int, bytes]],
    key_group_range: KeyGroupRange,
) -> StateHandle:
    # Encoded in memory, then written with one write and made durable under its final, unique
    # name (``write_new_file``): few system calls, each of which hands the GIL to the task
    # thread and waits to get it back (docs/worker.md, "Where a slow checkpoint's time went").
    final = os.path.join(directory, filename)
    parts: list[bytes] = []
    size = _encode_state_file(parts.append, kind, meta, sections)
    try:
        os.makedirs(directory, exist_ok=True)
        with timing("durable_s"):
            write_new_file(final, b"".join(parts))
    except OSError as e:
        raise StorageError(f"cannot write state file {final}: {e}") from e
    return StateHandle(
        path=os.path.abspath(final),
        size_bytes=size,
        kind=kind,
        key_group_start=key_group_range.start,
        key_group_end=key_group_range.end,
        offset=0,
    )


def discard_files(handles: Iterable[StateHandle]) -> None:
    """Best effort: remove the whole files of a snapshot whose write failed (files inside a
    merged object were never written: the object is written last)."""
    by_store: dict[int, tuple[FileStore, list[str]]] = {}
    for handle in handles:
        path = handle.path
        if handle.offset or handle.is_inline:
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


class _InlineBytes:
    """The bytes of inline state: in the handle itself (``StateHandle.data``)."""

    def __init__(self, handle: StateHandle) -> None:
        self.path = handle.path
        self._data = handle.data
        self.base = 0
        self.size = len(handle.data)

    def read(self, offset: int, length: int) -> bytes:
        return self._data[offset : offset + length]

    def prefetch(self, offset: int, length: int) -> None:
        pass  # in memory already

    def close(self) -> None:
        pass


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


class StateFileReader:
    """Validating reader of one state file: header, trailer, meta and index up front; sections
    on demand (each checked against its CRC). A local file is read through its file handle, an
    object with ranged GETs (:class:`_ObjectBytes`), inline state from its handle."""

    def __init__(self, handle: StateHandle) -> None:
        self.path = handle.path
        self._src: _InlineBytes | _LocalBytes | _ObjectBytes
        if handle.is_inline:
            self._src = _InlineBytes(handle)
        elif is_object_store_uri(self.path):
            self._src = _ObjectBytes(handle, self.corrupt)
        else:
            self._src = _LocalBytes(handle, self.corrupt)
        try:
            self._parse(handle)
        except BaseException:
            self._src.close()
            raise

    def corrupt(self, detail: str) -> CorruptStateError:
        """The error naming this file and what is wrong with it (also for its readers' checks
        of the sections' contents)."""
        return CorruptStateError(f"state file {self.path} is corrupt or truncated: {detail}")

    def _read_at(self, offset: int, length: int) -> bytes:
        data = self._src.read(offset, length)
        if len(data) != length:
            raise self.corrupt(f"expected {length} bytes at offset {offset}, got {len(data)}")
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
            raise self.corrupt(f"only {size} bytes")
        magic, version, kind_code = _HEADER.unpack(self._read_at(0, _HEADER.size))
        if magic != _MAGIC:
            raise self.corrupt(f"not a Snapflow state file (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise StateFormatVersionError(
                f"state file {self.path} has format version {version}; this worker reads "
                f"version {FORMAT_VERSION}"
            )
        meta_off, meta_len, index_off, count, crc, tail = _TRAILER.unpack(
            self._read_at(size - _TRAILER.size, _TRAILER.size)
        )
        if tail != _TAIL_MAGIC:
            raise self.corrupt("no trailer (the file was cut short or overwritten)")
        if (
            meta_off < _HEADER.size
            or meta_off + meta_len != index_off
            or index_off + count * _INDEX_ENTRY.size != size - _TRAILER.size
        ):
            raise self.corrupt("the trailer's offsets do not match the file size")
        raw = self._read_at(meta_off, meta_len + count * _INDEX_ENTRY.size)
        if zlib.crc32(raw) != crc:
            raise self.corrupt("checksum mismatch in the metadata or index")
        try:
            meta = json.loads(raw[:meta_len])
        except ValueError as e:
            raise self.corrupt(f"unreadable metadata: {e}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise self.corrupt("metadata without the snapflow-state format marker")
        if meta.get("version") != FORMAT_VERSION:
            raise StateFormatVersionError(
                f"state file {self.path} has metadata version {meta.get('version')!r}; this "
                f"worker reads version {FORMAT_VERSION}"
            )
        kind = str(meta.get("kind"))
        if _KIND_CODES.get(kind) != kind_code or kind != handle.kind:
            raise self.corrupt(
                f"the handle says kind {handle.kind!r}, the file holds {kind!r} state"
            )
        self.meta: dict[str, Any] = meta
        self.sections: list[_Section] = []
        for i in range(count):
            entry = _Section(*_INDEX_ENTRY.unpack_from(raw, meta_len + i * _INDEX_ENTRY.size))
            if entry.offset < _HEADER.size or entry.offset + entry.length > meta_off:
                raise self.corrupt(f"section {entry.section} lies outside the data area")
            self.sections.append(entry)

    def read(self, entry: _Section) -> Any:
        blob = self._read_at(entry.offset, entry.length)
        if zlib.crc32(blob) != entry.crc:
            raise self.corrupt(f"checksum mismatch in section {entry.section}")
        try:
            return pickle.loads(blob)
        except Exception as e:
            raise self.corrupt(f"section {entry.section} cannot be unpickled: {e!r}") from None

    def close(self) -> None:
        self._src.close()

    def __enter__(self) -> StateFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def state_file_name(
    prefix: str, kind: str, checkpoint_id: int, kg_range: KeyGroupRange | None
) -> str:
    """A new file's name: unique, so that no write ever replaces another file."""
    parts = [p for p in (_SAFE_NAME.sub("_", prefix), f"chk{checkpoint_id}", kind) if p]
    if kg_range is not None:
        parts.append(f"kg{kg_range.start}-{kg_range.end}")
    parts.append(uuid.uuid4().hex[:12])
    return "-".join(parts) + ".state"

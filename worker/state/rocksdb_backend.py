"""The disk-backed keyed state backend: RocksDB through ``rocksdict``, with incremental
checkpoints (Flink's ``EmbeddedRocksDBStateBackend``).

Why RocksDB through rocksdict: docs/storage.md, "State larger than memory".

Layout
    One RocksDB instance per backend (one keyed subtask), in a directory of its own under the
    worker's local state directory, deleted by :meth:`RocksDBKeyedStateBackend.dispose`. Every
    entry's key starts with its key group, big-endian, so a key-group range is one contiguous
    key range (scanned, exported to an SST file and ingested on restore and rescale)::

        key group (u16 BE) | name length (u16 BE) | state name (UTF-8) | key
        map state:           ... | key length (u32 BE) | key | user key

    Keys are encoded by type (``s`` + UTF-8 for ``str``, ``i`` + 8 bytes for an int64, ``b`` +
    bytes, ``p`` + pickle otherwise); values are pickles. A list is one value (the whole list),
    a map one entry per user key. Event-time timers stay on the heap (Flink's
    ``state.backend.rocksdb.timer-service.factory: HEAP``) and are snapshotted as the heap's
    are; their number grows with windows in flight, not with the keys held.

Cache
    Value, reducing and aggregating states read and write through a write-back cache of
    decoded values (``cache_entries``; absent keys are cached too): a hot key costs a dict
    lookup, a bulk call one multi-get for the keys it misses, and repeated updates of a key
    reach RocksDB once per flush. The cache is flushed (one ``WriteBatch``) when it is full
    (the older half is then evicted), at every snapshot, and before any scan.

Snapshots (same recovery contract as the heap backend, see ``keyed_backend.py``)
    * A **checkpoint** is incremental. Synchronous part: flush the cache, then a RocksDB
      checkpoint (``Checkpoint.create_checkpoint``: the memtable is flushed, the live SST files
      are hard-linked, nothing is copied) and a copy-on-write view of the timers. Asynchronous
      part: every SST file that the last *completed* checkpoint (the last one whose completion
      this backend was told of, as Flink's ``RocksIncrementalSnapshotStrategy`` does) did not
      already upload goes to the job's shared directory (``<root>/<job>/shared/``),
      ``upload_threads`` at a time; then a small
      manifest (kind ``incremental``: the SST files by name, path, size and CRC-32, plus the
      few small files that describe the database) goes into the checkpoint's directory. The
      acknowledgement names every SST file too (kinds ``shared-new`` and ``shared``), so the
      coordinator can count references to them (``coordinator/shared_state.py``).
    * A **savepoint** (and a snapshot without barrier options) is canonical: the same
      key-group indexed ``keyed`` file the heap backend writes, read from a RocksDB snapshot
      (consistent, no copy) one key group at a time. Either backend restores it, at any
      parallelism.

Compaction
    What a checkpoint uploads is the flushed memtable plus every file compactions wrote since
    the last completed checkpoint, so the compaction style sets the bytes per checkpoint:
    universal by default, merging once ``compaction_trigger`` sorted runs accumulate
    (:class:`RocksDBTuning`; measurements and the trade-off in docs/storage.md).

Restore
    From canonical files (any backend's savepoint) the entries of the backend's key groups are
    written into the database. From incremental manifests: when one manifest covers exactly
    this backend's key groups, its files are downloaded and opened as the database; otherwise
    (rescaling) each overlapping manifest's database is downloaded to a temporary directory,
    the backend's key-group range is exported from it to an SST file and ingested. Every
    downloaded SST is checked against the size and CRC-32 its manifest recorded: a missing one
    raises :class:`~snapflow.errors.StorageError`, a wrong one :class:`CorruptStateError`, both
    naming the file. As with Flink's default restore mode (``NO_CLAIM``) the first checkpoint
    after a restore uploads all its files; later ones are incremental again.

Local recovery (off by default, as Flink's ``state.backend.local-recovery``)
    With ``local_recovery_dir`` set (one directory per job, vertex and subtask, outside the
    instance's directory so that it outlives the task), a checkpoint's RocksDB checkpoint
    directory (hard links) is kept after its upload instead of deleted; when the checkpoint
    completes it becomes the subtask's local copy (moved to ``chk-<id>`` there, with a small
    ``local-copy.json`` naming the checkpoint and key groups), and the copy of any older
    checkpoint is deleted: at most one per subtask. A restore of exactly this backend's key
    groups from one manifest uses the copy when it is of the manifest's checkpoint and every
    SST the manifest names is there with the manifest's size and CRC-32: the SSTs are
    hard-linked from it instead of downloaded (the manifest and the timers are still read
    from storage). Otherwise the restore downloads, logging ``state.local_recovery_miss``
    with the reason. :func:`discard_local_copies` deletes a job's copies (the agent calls it
    when it sees the job end).

Threading: as for the heap backend, the backend belongs to its task thread; only a snapshot's
``write`` runs on another thread (it reads the RocksDB checkpoint or snapshot, never the live
database's cache).
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import shutil
import struct
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
import rocksdict
import structlog

from snapflow.checkpointing import (
    INCREMENTAL,
    KEYED,
    SHARED,
    SHARED_NEW,
    TIMERS,
    BarrierOptions,
    StateHandle,
)
from snapflow.errors import StateError, StorageError
from snapflow.filestore import file_crc32, is_object_store_uri, store_for
from snapflow.worker.state.errors import (
    CorruptStateError,
    IncompatibleStateError,
    no_current_key,
)
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import (
    STATE_KINDS,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    check_lengths,
    pylist,
)
from snapflow.worker.state.keygroups import KEY_HASH_VERSION, KeyGroupRange
from snapflow.worker.state.snapshots import KeyedSnapshotWriter, SnapshotInProgress
from snapflow.worker.state.state_files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MergedStateObject,
    StateFileReader,
    discard_files,
    handle_fields,
    pickle_section,
    state_file_name,
    write_state_file,
)
from snapflow.worker.state.ttl import Clock

__all__ = [
    "COMPACTION_STYLES",
    "DEFAULT_CACHE_ENTRIES",
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "LEVEL",
    "UNIVERSAL",
    "RocksDBKeyedStateBackend",
    "RocksDBTuning",
    "SharedFile",
    "discard_local_copies",
    "local_copy_dir",
    "shared_dir_for",
]

DEFAULT_CACHE_ENTRIES = 100_000
DEFAULT_MEMORY_BUDGET_BYTES = 64 * 1024 * 1024
SHARED_DIR = "shared"
LOCAL_COPY_META = "local-copy.json"
"""In a local copy's directory: which checkpoint and key groups the copy is of."""

log = structlog.get_logger("snapflow.worker")

_KG = struct.Struct(">H")
_LEN32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_MAP_KINDS = {"map", "ttl-map"}
_LIST_KINDS = {"list", "ttl-list"}

_ABSENT: Any = object()  # cached: the key has no value
_MISS: Any = object()  # not in the cache


def shared_dir_for(checkpoint_location: str) -> str:
    """The job's shared-state directory for a checkpoint's target location
    ``<root>/<job>/chk-<id>``: ``<root>/<job>/shared`` (the layout of
    ``coordinator/checkpoint_storage.py``, ``CheckpointStorage.shared_dir``; a test checks
    that the two agree)."""
    location = checkpoint_location.rstrip("/")
    if is_object_store_uri(location):
        return f"{location.rsplit('/', 1)[0]}/{SHARED_DIR}"
    return os.path.join(os.path.dirname(location), SHARED_DIR)


# ---------------------------------------------------------------------------------------------
# Key and value encoding
# ---------------------------------------------------------------------------------------------


def _enc(key: Any) -> bytes:
    t = type(key)
    if t is str:
        return b"s" + key.encode()
    if t is int and -(1 << 63) <= key < (1 << 63):
        return b"i" + _I64.pack(key)
    if t is bytes:
        return b"b" + key
    return b"p" + pickle.dumps(key, protocol=5)


def _dec(data: bytes) -> Any:
    tag = data[:1]
    if tag == b"s":
        return data[1:].decode()
    if tag == b"i":
        return _I64.unpack(data[1:])[0]
    if tag == b"b":
        return bytes(data[1:])
    if tag == b"p":
        return pickle.loads(data[1:])
    raise CorruptStateError(f"unknown key encoding {tag!r} in the disk state backend")


def _dumps_value(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (len(prefix) + 1)
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _state_tag(name: str) -> bytes:
    raw = name.encode()
    if len(raw) > 0xFFFF:
        raise StateError(f"state name too long ({len(raw)} bytes, at most 65535)")
    return _KG.pack(len(raw)) + raw


def _parse_entry(key: bytes) -> tuple[int, bytes, bytes]:
    """``(key group, state name bytes, rest)`` of a database key."""
    (length,) = _KG.unpack_from(key, 2)
    return _KG.unpack_from(key)[0], key[4 : 4 + length], key[4 + length :]


def _split_map_key(rest: bytes) -> tuple[bytes, bytes]:
    (length,) = _LEN32.unpack_from(rest)
    return rest[4 : 4 + length], rest[4 + length :]


# ---------------------------------------------------------------------------------------------
# Shared files and the manifest
# ---------------------------------------------------------------------------------------------


class SharedFile(NamedTuple):
    """An SST file in the shared directory: its name in the database, where it was uploaded,
    its size and CRC-32."""

    name: str
    path: str
    size: int
    crc: int


def _read_manifest(reader: StateFileReader) -> dict[str, Any]:
    sections = reader.sections
    if len(sections) != 1:
        raise reader.corrupt(f"a manifest has one section, this one {len(sections)}")
    data = reader.read(sections[0])
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("ssts"), list)
        or not isinstance(data.get("files"), dict)
        or not isinstance(data.get("states"), dict)
    ):
        raise reader.corrupt("not an incremental-checkpoint manifest")
    try:
        data["ssts"] = [SharedFile(*entry) for entry in data["ssts"]]
    except TypeError:
        raise reader.corrupt("malformed SST entry in the manifest") from None
    return data


def _download(shared: SharedFile, target: str, manifest_path: str) -> None:
    """Copy a shared SST to ``target`` (streamed: never whole in memory), checking size and
    CRC-32."""
    try:
        size, crc = store_for(shared.path).download_file(shared.path, target)
    except FileNotFoundError:
        raise StorageError(
            f"shared state file {shared.path} is missing (named by the checkpoint manifest "
            f"{manifest_path}); the checkpoint cannot be restored"
        ) from None
    except OSError as e:
        raise StorageError(f"cannot read shared state file {shared.path}: {e}") from e
    if size != shared.size or crc != shared.crc:
        with suppress(OSError):
            os.unlink(target)
        raise CorruptStateError(
            f"shared state file {shared.path} is corrupt: the checkpoint manifest "
            f"{manifest_path} says {shared.size} bytes with CRC-32 {shared.crc:08x}, the file "
            f"has {size} bytes with CRC-32 {crc:08x}"
        )


# ---------------------------------------------------------------------------------------------
# Configuration of one instance
# ---------------------------------------------------------------------------------------------


LEVEL = "level"
UNIVERSAL = "universal"
COMPACTION_STYLES = (LEVEL, UNIVERSAL)


@dataclass(frozen=True)
class RocksDBTuning:
    """How one RocksDB instance is sized and compacted (a job chooses these fields in its
    ``snapflow.state_backend_options.StateBackendOptions``, documented there)."""

    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES
    compaction_style: str = UNIVERSAL
    compaction_trigger: int = 8
    max_size_amplification_percent: int = 200
    upload_threads: int = 4

    def __post_init__(self) -> None:
        if self.compaction_style not in COMPACTION_STYLES:
            raise StateError(
                f"unknown compaction style {self.compaction_style!r}: choose one of "
                f"{', '.join(COMPACTION_STYLES)}"
            )
        if (
            self.memory_budget_bytes <= 0
            or self.compaction_trigger < 2
            or self.max_size_amplification_percent < 1
            or self.upload_threads < 1
        ):
            raise StateError(
                "rocksdb tuning: memory_budget_bytes must be > 0, compaction_trigger >= 2, "
                "max_size_amplification_percent >= 1 and upload_threads >= 1"
            )

    def options(self) -> rocksdict.Options:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        # A quarter of the budget for memtables (two of them), half for the block cache.
        write_buffer = max(1 << 20, self.memory_budget_bytes // 8)
        opts.set_write_buffer_size(write_buffer)
        opts.set_max_write_buffer_number(2)
        opts.set_target_file_size_base(max(4 << 20, write_buffer))
        # Every checkpoint flushes the memtable, so each adds one small sorted run; the trigger
        # is how many runs accumulate before a compaction merges them (docs/storage.md).
        opts.set_level_zero_file_num_compaction_trigger(self.compaction_trigger)
        if self.compaction_style == UNIVERSAL:
            opts.set_compaction_style(rocksdict.DBCompactionStyle.universal())
            uco = rocksdict.UniversalCompactOptions()
            uco.max_size_amplification_percent = self.max_size_amplification_percent
            opts.set_universal_compaction_options(uco)
        else:
            opts.set_max_bytes_for_level_base(max(16 << 20, 4 * write_buffer))
        opts.set_compression_type(rocksdict.DBCompressionType.lz4())
        opts.set_max_background_jobs(2)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(rocksdict.Cache(max(1 << 20, self.memory_budget_bytes // 2)))
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        return opts


def _write_options() -> rocksdict.WriteOptions:
    # No write-ahead log: the database is rebuilt from a checkpoint after any failure (as in
    # Flink), and a RocksDB checkpoint flushes the memtable itself.
    opts = rocksdict.WriteOptions()
    setattr(opts, "disable_wal", True)  # noqa: B010 - a property; the stubs call it a method
    return opts


def _scan_range(source: Any, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The entries of ``source`` (a database or snapshot) with ``lower <= key < upper``."""
    opts = rocksdict.ReadOptions()
    opts.set_iterate_lower_bound(lower)
    opts.set_iterate_upper_bound(upper)
    # The bounds live in ``opts``: RocksDB keeps pointers to them, so ``opts`` must outlive the
    # iteration (this generator holds it); the key check guards against a binding that drops
    # the bound.
    for key, value in source.items(from_key=lower, read_opt=opts):
        if key >= upper:
            break
        yield key, value


# ---------------------------------------------------------------------------------------------
# States
# ---------------------------------------------------------------------------------------------


class _RocksTable:
    """One registered state: its name, kind and key prefix per key group of the backend."""

    __slots__ = ("_int_layout", "kind", "name", "prefixes")

    def __init__(self, name: str, kind: str, start: int, n: int) -> None:
        self.name = name
        self.kind = kind
        tag = _state_tag(name)
        self.prefixes = [_KG.pack(start + i) + tag for i in range(n)]
        self._int_layout: tuple[np.dtype[Any], np.ndarray[Any, Any]] | None = None

    def int_keys(self, idxs: np.ndarray[Any, Any], keys: np.ndarray[Any, Any]) -> list[bytes]:
        """Database keys of int64 keys, vectorised: the same bytes as ``prefix + _enc(k)``."""
        if self._int_layout is None:
            width = len(self.prefixes[0])
            layout = np.dtype([("p", f"S{width}"), ("t", "S1"), ("k", ">i8")])
            self._int_layout = (layout, np.array(self.prefixes, dtype=f"S{width}"))
        layout, prefixes = self._int_layout
        rows = np.empty(len(keys), dtype=layout)
        rows["p"] = prefixes[idxs]
        rows["t"] = b"i"
        rows["k"] = keys
        buf, size = rows.tobytes(), layout.itemsize
        return [buf[i : i + size] for i in range(0, len(buf), size)]


class _RocksStateMixin:
    _table: Any

    @property
    def _rocks(self) -> RocksDBKeyedStateBackend:
        return cast(RocksDBKeyedStateBackend, self._backend)  # type: ignore[attr-defined]

    def _key(self) -> bytes:
        b = self._rocks
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        prefix: bytes = self._table.prefixes[idx]
        return prefix + _enc(b._current_key)

    def _keys(self, keys: Any, key_groups: Any) -> list[bytes]:
        b = self._rocks
        memo = b._keys_memo
        # fold_and_get (and callers like it) add then read the same keys: encode them once.
        if (
            memo is not None
            and memo[0] is keys
            and memo[1] is key_groups
            and memo[2] is self._table
        ):
            return memo[3]
        if isinstance(keys, pa.Array) and pa.types.is_int64(keys.type) and not keys.null_count:
            arr, groups = b._groups(keys, key_groups)
            idxs = groups.to_numpy(zero_copy_only=False).astype(np.int64) - b._start
            out = self._table.int_keys(idxs, arr.to_numpy(zero_copy_only=False))
        else:
            pykeys, idxs_list = b.resolve_keys(keys, key_groups)
            prefixes = self._table.prefixes
            out = [prefixes[i] + _enc(k) for k, i in zip(pykeys, idxs_list, strict=True)]
        if isinstance(keys, pa.Array):  # immutable: safe to recognise by identity
            b._keys_memo = (keys, key_groups, self._table, out)
        return out

    @property
    def name(self) -> str:
        return str(self._table.name)

    def clear(self) -> None:
        self._rocks._delete_key(self._key(), self._table.kind)

    def __len__(self) -> int:
        return self._rocks._count(self._table)


class RocksValueState(_RocksStateMixin, ValueState[Any]):
    def value(self) -> Any:
        v = self._rocks._cget(self._key())
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        b = self._rocks
        b._cput(self._key(), _ABSENT if value is None else value)

    def get_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        default = self._default
        return [
            default if v is _ABSENT else v
            for v in self._rocks._cget_many(self._keys(keys, key_groups))
        ]

    def update_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        dbkeys = self._keys(keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        self._rocks._cput_many(dbkeys, [_ABSENT if v is None else v for v in vals])


class RocksReducingState(_RocksStateMixin, ReducingState[Any]):
    def get(self) -> Any:
        v = self._rocks._cget(self._key())
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        b, key = self._rocks, self._key()
        old = b._cget(key)
        b._cput(key, value if old is _ABSENT else self._reduce(old, value))

    def get_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        return [
            None if v is _ABSENT else v
            for v in self._rocks._cget_many(self._keys(keys, key_groups))
        ]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        dbkeys = self._keys(keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        fn = self._reduce
        self._rocks._fold_many(dbkeys, vals, lambda old, v: v if old is _ABSENT else fn(old, v))

    def fold_and_get_distinct(
        self, keys: Any, values: Any, key_groups: Any, reduce_fn: Callable[[Any, Any], Any]
    ) -> list[Any]:
        """``add_many`` then ``get_many`` in one pass over the cache (the keyed count's hot
        path, ``operators.fold_and_get``): one key encoding, hits folded in place, every miss
        read with one multi-get and folded after (in order, so a repeated key sees its earlier
        fold)."""
        b = self._rocks
        dbkeys = self._keys(keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        cache = b._cache
        out: list[Any] = []
        append = out.append
        absent, miss = _ABSENT, _MISS
        misses: list[int] = []
        for i, (k, v) in enumerate(zip(dbkeys, vals, strict=True)):
            old = cache.get(k, miss)
            if old is miss:  # folded below, after one multi-get of every miss
                misses.append(i)
                append(None)
                continue
            new = v if old is absent else reduce_fn(old, v)
            cache[k] = new
            append(new)
        if misses:
            b._prefetch([dbkeys[i] for i in misses])  # one multi-get into the cache
            for i in misses:  # in order: a repeated key sees its earlier fold
                k, v = dbkeys[i], vals[i]
                old = cache[k]
                new = v if old is absent else reduce_fn(old, v)
                cache[k] = new
                out[i] = new
        b._dirty.update(dbkeys)
        b._maybe_evict()
        return out


class RocksAggregatingState(_RocksStateMixin, AggregatingState[Any]):
    def get(self) -> Any:
        acc = self._rocks._cget(self._key())
        return None if acc is _ABSENT else self._result(acc)

    def _fold_one(self, acc: Any, value: Any) -> Any:
        return self._add(value, self._create() if acc is _ABSENT else acc)

    def add(self, value: Any) -> None:
        b, key = self._rocks, self._key()
        b._cput(key, self._fold_one(b._cget(key), value))

    def get_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        result = self._result
        return [
            None if a is _ABSENT else result(a)
            for a in self._rocks._cget_many(self._keys(keys, key_groups))
        ]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        dbkeys = self._keys(keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        self._rocks._fold_many(dbkeys, vals, self._fold_one)


class RocksListState(_RocksStateMixin, ListState[Any]):
    """The whole list is one value: ``add`` reads and rewrites it (RocksDB's merge operator,
    which Flink uses for lists, is not exposed by rocksdict)."""

    def _stored(self, key: bytes) -> list[Any]:
        raw = self._rocks._db.get(key)
        return [] if raw is None else list(pickle.loads(raw))

    def get(self) -> list[Any]:
        return self._stored(self._key())

    def add(self, value: Any) -> None:
        key = self._key()
        lst = self._stored(key)
        lst.append(value)
        self._rocks._db.put(key, _dumps_value(lst))

    def add_all(self, values: Iterable[Any]) -> None:
        new = list(values)
        if not new:
            return
        key = self._key()
        self._rocks._db.put(key, _dumps_value(self._stored(key) + new))

    def update(self, values: Iterable[Any]) -> None:
        key = self._key()
        new = list(values)
        if new:
            self._rocks._db.put(key, _dumps_value(new))
        else:
            self._rocks._db.delete(key)


class RocksMapState(_RocksStateMixin, MapState):
    """One database entry per user key, under the key's own prefix."""

    def _map_prefix(self) -> bytes:
        b = self._rocks
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        encoded = _enc(b._current_key)
        prefix: bytes = self._table.prefixes[idx]
        return prefix + _LEN32.pack(len(encoded)) + encoded

    def _scan(self) -> Iterator[tuple[bytes, bytes]]:
        prefix = self._map_prefix()
        return self._rocks._scan(prefix, _prefix_end(prefix))

    def get(self, user_key: Any, default: Any = None) -> Any:
        raw = self._rocks._db.get(self._map_prefix() + _enc(user_key))
        return default if raw is None else pickle.loads(raw)

    def contains(self, user_key: Any) -> bool:
        return self._rocks._db.get(self._map_prefix() + _enc(user_key)) is not None

    def put(self, user_key: Any, value: Any) -> None:
        self._rocks._db.put(self._map_prefix() + _enc(user_key), _dumps_value(value))

    def put_all(self, entries: Any) -> None:
        if not entries:
            return
        prefix = self._map_prefix()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for k, v in entries.items():
            batch.put(prefix + _enc(k), _dumps_value(v))
        self._rocks._db.write(batch)

    def remove(self, user_key: Any) -> None:
        self._rocks._db.delete(self._map_prefix() + _enc(user_key))

    def clear(self) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, _ in self._scan():
            batch.delete(key)
        self._rocks._db.write(batch)

    def items(self) -> list[tuple[Any, Any]]:
        n = len(self._map_prefix())
        return [(_dec(k[n:]), pickle.loads(v)) for k, v in self._scan()]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return next(iter(self._scan()), None) is None


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask in a local RocksDB instance (see the module docstring).

    The current key, the key-group math of the bulk API and the event-time timers are the
    heap backend's (inherited); every state lives in RocksDB. ``tuning`` sets the instance
    (``memory_budget_bytes`` is the short form of ``RocksDBTuning(memory_budget_bytes=...)``
    and is ignored when ``tuning`` is given)."""

    def __init__(
        self,
        max_parallelism: int,
        key_group_range: KeyGroupRange | tuple[int, int],
        *,
        name: str = "",
        local_dir: str | None = None,
        cache_entries: int = DEFAULT_CACHE_ENTRIES,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
        tuning: RocksDBTuning | None = None,
        clock: Clock | None = None,
        local_recovery_dir: str | None = None,
    ) -> None:
        """``local_recovery_dir``: where this subtask keeps its local copy (see "Local
        recovery" in the module docstring); ``None``: no local recovery."""
        super().__init__(max_parallelism, key_group_range, name=name, clock=clock)
        if cache_entries < 0:
            raise StateError(f"cache_entries must be >= 0, got {cache_entries}")
        root = local_dir or os.path.join(tempfile.gettempdir(), "snapflow-rocksdb")
        os.makedirs(root, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "keyed"
        self._dir = tempfile.mkdtemp(prefix=f"{safe}-", dir=root)
        self._db_path = os.path.join(self._dir, "db")
        self._tuning = tuning or RocksDBTuning(memory_budget_bytes=memory_budget_bytes)
        self._db = self._open(self._db_path)
        self._rtables: dict[str, _RocksTable] = {}
        self._kinds: dict[str, str] = {}  # registered or restored: state name -> kind
        self._names: dict[bytes, str] = {}  # state name bytes -> name (snapshot decoding)
        self._cache: dict[bytes, Any] = {}
        self._dirty: set[bytes] = set()
        self._cache_entries = cache_entries
        # checkpoint id -> the SST files its snapshot references, until it completes; then
        # the files of the newest completed one are reused by the next snapshots.
        self._uploaded: dict[int, dict[str, SharedFile]] = {}
        self._confirmed: dict[str, SharedFile] = {}
        self._recovery_dir = local_recovery_dir
        # checkpoint id -> its RocksDB checkpoint directory, uploaded and kept for local
        # recovery until the checkpoint completes (promoted) or a newer one does (deleted).
        self._kept: dict[int, str] = {}
        self.local_recovery_hits = 0
        """Restores that used the local copy instead of downloading (tests and stats)."""
        self.local_recovery_misses: list[str] = []
        """Why restores did not use the local copy, oldest first (tests and stats; also
        logged as ``state.local_recovery_miss``)."""
        self._disposed = False
        self._keys_memo: tuple[Any, Any, _RocksTable, list[bytes]] | None = None

    @classmethod
    def for_subtask(
        cls, max_parallelism: int, parallelism: int, index: int, *, name: str = "", **kwargs: Any
    ) -> RocksDBKeyedStateBackend:
        from snapflow.worker.state import keygroups as kgs

        kg_range = kgs.key_group_range_for_subtask(max_parallelism, parallelism, index)
        return cls(max_parallelism, kg_range, name=name, **kwargs)

    def _open(self, path: str) -> rocksdict.Rdict:
        db = rocksdict.Rdict(path, self._tuning.options())
        db.set_write_options(_write_options())
        return db

    @property
    def local_path(self) -> str:
        """The instance's local directory (deleted by :meth:`dispose`)."""
        return self._dir

    @property
    def tuning(self) -> RocksDBTuning:
        """The instance's sizing (its database's options, and those of the SST files it
        exports)."""
        return self._tuning

    @property
    def encoded_state_names(self) -> Mapping[bytes, str]:
        """Every registered or restored state's name by its UTF-8 bytes (as keys hold it)."""
        return self._names

    def dispose(self) -> None:
        if self._disposed:
            return
        self._disposed = True
        with suppress(Exception):
            self._db.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # --- registration -----------------------------------------------------------------------

    def _rtable(self, name: str, kind: str) -> _RocksTable:
        if not isinstance(name, str) or not name:
            raise StateError(f"state names are non-empty strings, got {name!r}")
        table = self._rtables.get(name)
        known = self._kinds.get(name)
        if known is not None and known != kind:
            raise IncompatibleStateError(
                f"state {name!r} is {known} state, it cannot be used as {kind} state"
            )
        if table is None:
            table = self._rtables[name] = _RocksTable(name, kind, self._start, self._n)
            self._kinds[name] = kind
            self._names[name.encode()] = name
        return table

    def _new_value(self, name: str, kind: str, default: Any) -> ValueState[Any]:
        return RocksValueState(self, cast(Any, self._rtable(name, kind)), default)

    def _new_list(self, name: str, kind: str) -> ListState[Any]:
        return RocksListState(self, cast(Any, self._rtable(name, kind)))

    def _new_map(self, name: str, kind: str) -> MapState:
        return RocksMapState(self, cast(Any, self._rtable(name, kind)))

    def _new_reducing(
        self, name: str, kind: str, reduce_fn: Callable[[Any, Any], Any]
    ) -> ReducingState[Any]:
        return RocksReducingState(self, cast(Any, self._rtable(name, kind)), reduce_fn)

    def _new_aggregating(
        self,
        name: str,
        kind: str,
        add_fn: Callable[[Any, Any], Any],
        get_result_fn: Callable[[Any], Any],
        create_accumulator: Callable[[], Any],
    ) -> AggregatingState[Any]:
        return RocksAggregatingState(
            self, cast(Any, self._rtable(name, kind)), add_fn, get_result_fn, create_accumulator
        )

    def state_names(self) -> list[str]:
        return sorted(self._kinds)

    # --- the cache ----------------------------------------------------------------------------

    def _cget(self, key: bytes) -> Any:
        cache = self._cache
        v = cache.get(key, _MISS)
        if v is _MISS:
            raw = self._db.get(key)
            v = _ABSENT if raw is None else pickle.loads(raw)
            cache[key] = v
            self._maybe_evict()
        return v

    def _prefetch(self, keys: Sequence[bytes]) -> None:
        cache = self._cache
        missing = [k for k in dict.fromkeys(keys) if k not in cache]
        if missing:
            loads = pickle.loads
            raws = cast(list[bytes | None], self._db.get(cast(Any, missing)))
            for k, raw in zip(missing, raws, strict=True):
                cache[k] = _ABSENT if raw is None else loads(raw)

    def _cget_many(self, keys: Sequence[bytes]) -> list[Any]:
        self._prefetch(keys)
        cache = self._cache
        out = [cache[k] for k in keys]
        self._maybe_evict()
        return out

    def _cput(self, key: bytes, value: Any) -> None:
        self._cache[key] = value
        self._dirty.add(key)
        self._maybe_evict()

    def _cput_many(self, keys: Sequence[bytes], values: Sequence[Any]) -> None:
        cache, dirty = self._cache, self._dirty
        for k, v in zip(keys, values, strict=True):
            cache[k] = v
        dirty.update(keys)
        self._maybe_evict()

    def _fold_many(
        self, keys: Sequence[bytes], values: Sequence[Any], fold: Callable[[Any, Any], Any]
    ) -> None:
        """``cache[k] = fold(cache[k], v)`` in order (a repeated key sees its earlier fold)."""
        self._prefetch(keys)
        cache = self._cache
        for k, v in zip(keys, values, strict=True):
            cache[k] = fold(cache[k], v)
        self._dirty.update(keys)
        self._maybe_evict()

    def _delete_key(self, key: bytes, kind: str) -> None:
        if kind in _MAP_KINDS:
            raise AssertionError("map state clears through its prefix")  # pragma: no cover
        if kind in _LIST_KINDS:
            self._db.delete(key)
        else:
            self._cput(key, _ABSENT)

    def _maybe_evict(self) -> None:
        if len(self._cache) > self._cache_entries:
            self._flush()
            cache = self._cache
            # A new dict rather than deletions: deleted slots would slow every later miss.
            self._cache = dict(
                itertools.islice(cache.items(), len(cache) - self._cache_entries // 2, None)
            )

    def _flush(self) -> None:
        """Write the dirty cache entries to RocksDB (one write batch)."""
        if not self._dirty:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        cache = self._cache
        for k in self._dirty:
            v = cache[k]
            if v is _ABSENT:
                batch.delete(k)
            else:
                batch.put(k, _dumps_value(v))
        self._db.write(batch)
        self._dirty.clear()

    # --- scans ------------------------------------------------------------------------------

    def _scan(
        self, lower: bytes, upper: bytes, source: Any = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return _scan_range(self._db if source is None else source, lower, upper)

    def _group_bounds(self, idx: int) -> tuple[bytes, bytes]:
        kg = self._start + idx
        return _KG.pack(kg), _KG.pack(kg + 1)  # key groups are < 2**15

    def _count(self, table: _RocksTable) -> int:
        self._flush()
        n = 0
        is_map = table.kind in _MAP_KINDS
        for prefix in table.prefixes:
            last = None
            for key, _ in self._scan(prefix, _prefix_end(prefix)):
                if is_map:
                    user = _split_map_key(key[len(prefix) :])[0]
                    if user == last:
                        continue
                    last = user
                n += 1
        return n

    def entries(self, name: str) -> Iterator[tuple[Any, Any]]:
        """All ``(key, value)`` entries of state ``name`` (lists as lists, maps as dicts)."""
        table = self._rtables.get(name)
        if table is None:
            if name not in self._kinds:
                return
            table = self._rtable(name, self._kinds[name])
        self._flush()
        is_map = table.kind in _MAP_KINDS
        for prefix in table.prefixes:
            n = len(prefix)
            if not is_map:
                for key, raw in self._scan(prefix, _prefix_end(prefix)):
                    yield _dec(key[n:]), pickle.loads(raw)
                continue
            current: Any = _MISS
            entries: dict[Any, Any] = {}
            for key, raw in self._scan(prefix, _prefix_end(prefix)):
                user, sub = _split_map_key(key[n:])
                if user != current:
                    if current is not _MISS:
                        yield _dec(current), entries
                    current, entries = user, {}
                entries[_dec(sub)] = pickle.loads(raw)
            if current is not _MISS:
                yield _dec(current), entries

    def _ttl_scan(self, name: str) -> Iterator[tuple[Any, int]]:
        table = self._rtables.get(name)
        if table is None:
            return
        is_map = table.kind in _MAP_KINDS
        for idx, prefix in enumerate(table.prefixes):
            self._flush()
            n = len(prefix)
            keys: list[bytes] = []
            for key, _ in self._scan(prefix, _prefix_end(prefix)):
                user = _split_map_key(key[n:])[0] if is_map else key[n:]
                if not keys or keys[-1] != user:
                    keys.append(user)
            for user in keys:
                yield _dec(user), self._start + idx

    def is_empty(self) -> bool:
        if self.timer_service.num_timers():
            return False
        self._flush()
        return next(iter(self._db.keys()), None) is None

    # --- key-group export and ingest ----------------------------------------------------------

    def export_key_groups(self, key_groups: KeyGroupRange, path: str) -> int:
        """Write every entry of ``key_groups`` (within this backend's range) to a new SST file
        at ``path``; returns the number of entries (no file when 0)."""
        self._flush()
        return _export(self._db, key_groups.intersection(self.key_group_range), path, self)

    def state_kinds(self) -> dict[str, str]:
        """State name -> kind, of every registered or restored state."""
        return dict(self._kinds)

    def ingest_key_groups(
        self, paths: Sequence[str], states: Mapping[str, str] | None = None
    ) -> None:
        """Ingest SST files written by :meth:`export_key_groups` (the files are moved in);
        ``states``: the exporting backend's :meth:`state_kinds`. Entries outside this backend's
        key groups are removed again and refused."""
        self._merge_kinds(dict(states or {}), ", ".join(paths))
        self._flush()
        self._ingest(list(paths))
        start, end = self.key_group_range.start, self.key_group_range.end
        for lower, upper in ((b"", _KG.pack(start)), (_KG.pack(end + 1), b"\xff\xff\xff")):
            stray = next(self._scan(lower, upper), None)
            if stray is not None:
                self._db.delete_range(lower, upper)
                raise IncompatibleStateError(
                    f"the ingested files hold key group {_KG.unpack_from(stray[0])[0]}, outside "
                    f"this backend's key groups {self.key_group_range}"
                )

    def _ingest(self, paths: list[str]) -> None:
        opts = rocksdict.IngestExternalFileOptions()
        opts.set_move_files(True)
        self._flush()
        self._cache.clear()  # cached values may predate the ingested entries
        self._db.ingest_external_file(paths, opts)

    # --- lifecycle ----------------------------------------------------------------------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        files = self._uploaded.pop(checkpoint_id, None)
        for older in [c for c in self._uploaded if c < checkpoint_id]:
            del self._uploaded[older]
        if files is not None:
            self._confirmed = files
        kept = self._kept.pop(checkpoint_id, None)
        for older in [c for c in self._kept if c < checkpoint_id]:
            shutil.rmtree(self._kept.pop(older), ignore_errors=True)
        if kept is not None and self._recovery_dir is not None:
            try:
                self._promote_local_copy(checkpoint_id, kept)
            except OSError as e:  # local recovery is an optimisation: the task goes on
                shutil.rmtree(kept, ignore_errors=True)
                log.warning(
                    "state.local_copy_failed",
                    backend=self.name,
                    checkpoint_id=checkpoint_id,
                    error=str(e),
                )

    def _promote_local_copy(self, checkpoint_id: int, kept: str) -> None:
        """Make ``kept`` (checkpoint ``checkpoint_id``'s RocksDB checkpoint) the subtask's
        local copy and delete the older ones. The metadata file goes in last: a copy without
        it (a crash in between) is never used."""
        root = cast(str, self._recovery_dir)
        os.makedirs(root, exist_ok=True)
        target = os.path.join(root, f"chk-{checkpoint_id}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.move(kept, target)  # a rename on one file system; a copy across two
        meta = {
            "checkpoint_id": checkpoint_id,
            "max_parallelism": self.max_parallelism,
            "key_group_start": self.key_group_range.start,
            "key_group_end": self.key_group_range.end,
        }
        tmp = os.path.join(target, f".{LOCAL_COPY_META}.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, os.path.join(target, LOCAL_COPY_META))
        for name in os.listdir(root):
            if name != f"chk-{checkpoint_id}":
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    # --- snapshots --------------------------------------------------------------------------

    def snapshot(
        self, checkpoint_id: int, options: BarrierOptions | None = None
    ) -> SnapshotInProgress:
        """Synchronous part: flush the cache; then a RocksDB checkpoint (hard links) for a
        checkpoint, a RocksDB snapshot for a savepoint (or without ``options``); and a
        copy-on-write view of the timers."""
        start = time.perf_counter()
        self._snapshots.reap()
        self._flush()
        timer_view = self.timer_service.freeze()
        timers = KeyedSnapshotWriter(
            checkpoint_id, self.max_parallelism, self.key_group_range, self.name, {}, timer_view
        )
        kinds = dict(self._kinds)
        writer: Callable[[str, MergedStateObject | None], list[StateHandle]]
        if options is None or options.kind.is_savepoint or not options.target_location:
            writer = _CanonicalWriter(self, checkpoint_id, self._db.snapshot(), kinds, timers)
        else:
            local = os.path.join(self._dir, f"chk-{checkpoint_id}-{uuid.uuid4().hex[:8]}")
            rocksdict.Checkpoint(self._db).create_checkpoint(local)
            writer = _IncrementalWriter(
                self,
                checkpoint_id,
                local,
                shared_dir_for(options.target_location),
                kinds,
                timers,
                dict(self._confirmed),
            )
        snap = SnapshotInProgress(checkpoint_id, writer, self._snapshots.release)
        self._snapshots.add(snap)
        snap.sync_duration_s = time.perf_counter() - start
        return snap

    def _meta(self, kind: str, checkpoint_id: int, kinds: dict[str, str]) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": kind,
            "checkpoint_id": checkpoint_id,
            "max_parallelism": self.max_parallelism,
            "key_group_start": self.key_group_range.start,
            "key_group_end": self.key_group_range.end,
            "key_hash": KEY_HASH_VERSION,
            "states": kinds,
        }

    # --- restore ----------------------------------------------------------------------------

    def restore(
        self, handles: Iterable[Any], *, base_dir: str | os.PathLike[str] | None = None
    ) -> int:
        """Restore this backend's key groups from canonical (``keyed``, ``timers``) and
        incremental (``incremental``) handles among ``handles`` (typically all of the vertex's;
        others are ignored). Returns the number of key-group sections restored (an incremental
        manifest counts each key group it supplies)."""
        if not self.is_empty():
            raise IncompatibleStateError("restore() needs a backend that holds no state yet")
        manifests: list[tuple[StateHandle, KeyGroupRange]] = []
        keyed: list[tuple[StateHandle, KeyGroupRange]] = []
        timers: list[tuple[StateHandle, KeyGroupRange]] = []
        for raw in handles:
            handle = handle_fields(raw, base_dir)
            file_range = KeyGroupRange(handle.key_group_start, handle.key_group_end)
            if not file_range.overlaps(self.key_group_range):
                continue
            kind = handle.kind
            if kind == INCREMENTAL:
                manifests.append((handle, file_range))
            elif kind == KEYED:
                keyed.append((handle, file_range))
            elif kind == TIMERS:
                timers.append((handle, file_range))
        owners: dict[int, str] = {}

        def claim(file_range: KeyGroupRange, path: str) -> None:
            for kg in file_range.intersection(self.key_group_range):
                if kg in owners:
                    raise CorruptStateError(
                        f"key group {kg} appears in both {owners[kg]} and {path}: the handles "
                        "are not one snapshot"
                    )
                owners[kg] = path

        restored = 0
        for handle, file_range in manifests:
            claim(file_range, handle.path)
        whole = len(manifests) == 1 and not keyed and manifests[0][1] == self.key_group_range
        for handle, file_range in manifests:
            restored += self._restore_manifest(handle, file_range, whole=whole)
        for handle, file_range in keyed:
            restored += self._restore_canonical(handle, file_range, claim)
        for handle, file_range in timers:
            restored += self._restore_timers(handle, file_range)
        return restored

    def _merge_kinds(self, kinds: dict[str, Any], path: str) -> None:
        for name, kind in kinds.items():
            known = self._kinds.get(name)
            if kind not in STATE_KINDS or (known is not None and known != kind):
                raise IncompatibleStateError(
                    f"state file {path}: state {name!r} is {kind!r} state, this backend has it "
                    f"as {known!r}"
                )
            self._kinds[name] = kind
            self._names[name.encode()] = name

    def _restore_manifest(
        self, handle: StateHandle, file_range: KeyGroupRange, *, whole: bool
    ) -> int:
        with StateFileReader(handle) as reader:
            self._check_meta(reader, file_range)
            manifest = _read_manifest(reader)
            checkpoint_id = reader.meta.get("checkpoint_id")
        path = handle.path
        self._merge_kinds(manifest["states"], path)
        if whole:
            self._db.close()
            shutil.rmtree(self._db_path, ignore_errors=True)
            if self._from_local_copy(manifest, checkpoint_id, path):
                self.local_recovery_hits += 1
            else:
                shutil.rmtree(self._db_path, ignore_errors=True)
                _materialise(manifest, self._db_path, path)
            self._db = self._open(self._db_path)
            return len(self.key_group_range)
        if self._recovery_dir is not None:
            self._local_miss(checkpoint_id, "the restore changes the key groups (rescaling)")
        scratch = os.path.join(self._dir, f"restore-{uuid.uuid4().hex[:8]}")
        try:
            _materialise(manifest, scratch, path)
            source = rocksdict.Rdict(
                scratch, self._tuning.options(), access_type=rocksdict.AccessType.read_only()
            )
            try:
                exported = os.path.join(self._dir, f"ingest-{uuid.uuid4().hex}.sst")
                mine = file_range.intersection(self.key_group_range)
                if _export(source, mine, exported, self):
                    self._ingest([exported])
            finally:
                source.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return len(file_range.intersection(self.key_group_range))

    def _local_miss(self, checkpoint_id: Any, reason: str) -> None:
        self.local_recovery_misses.append(reason)
        log.info(
            "state.local_recovery_miss",
            backend=self.name,
            checkpoint_id=checkpoint_id,
            reason=reason,
        )

    def _from_local_copy(self, manifest: dict[str, Any], checkpoint_id: Any, path: str) -> bool:
        """Build the database directory from the local copy when it is of ``checkpoint_id``
        and holds every SST of ``manifest`` with its size and CRC-32 (each checked after
        it is hard-linked: the check and the file opened are the same inode). The small files
        come from the manifest. False (the reason logged, the directory possibly partly
        built) when the copy cannot be used."""
        if self._recovery_dir is None:
            return False
        copy = os.path.join(self._recovery_dir, f"chk-{checkpoint_id}")
        reason = _local_copy_mismatch(
            copy, checkpoint_id, self.max_parallelism, self.key_group_range
        )
        if reason is None:
            reason = _link_local_copy(manifest, copy, self._db_path, path)
        if reason is not None:
            if os.path.isdir(self._recovery_dir) and not os.path.isdir(copy):
                others = sorted(os.listdir(self._recovery_dir))
                reason += f" (the local recovery directory holds {others[:3]})" if others else ""
            self._local_miss(checkpoint_id, reason)
            return False
        log.info("state.local_recovery_hit", backend=self.name, checkpoint_id=checkpoint_id)
        return True

    def _restore_canonical(
        self,
        handle: StateHandle,
        file_range: KeyGroupRange,
        claim: Callable[[KeyGroupRange, str], None],
    ) -> int:
        restored = 0
        with StateFileReader(handle) as reader:
            self._check_meta(reader, file_range)
            kinds = reader.meta.get("states", {})
            if not isinstance(kinds, dict):
                raise reader.corrupt("malformed state kinds")
            self._merge_kinds(kinds, reader.path)
            wanted = [e for e in reader.sections if e.section in self.key_group_range]
            for entry in reader.sections:
                if entry.section not in file_range:
                    raise reader.corrupt(f"key group {entry.section} lies outside its range")
            for entry in wanted:
                claim(KeyGroupRange(entry.section, entry.section), reader.path)
            reader.prefetch(wanted)
            for entry in wanted:
                data = reader.read(entry)
                if not isinstance(data, dict):
                    raise reader.corrupt("a key-group section is not a dict")
                batch = rocksdict.WriteBatch(raw_mode=True)
                for name, values in data.items():
                    kind = kinds.get(name)
                    if kind not in STATE_KINDS or not isinstance(values, dict):
                        raise reader.corrupt(f"malformed state {name!r:.100}")
                    prefix = self._rtable(name, kind).prefixes[entry.section - self._start]
                    for key, value in values.items():
                        encoded = _enc(key)
                        if kind in _MAP_KINDS:
                            head = prefix + _LEN32.pack(len(encoded)) + encoded
                            for user_key, v in value.items():
                                batch.put(head + _enc(user_key), _dumps_value(v))
                        else:
                            batch.put(prefix + encoded, _dumps_value(value))
                self._db.write(batch)
                restored += 1
        return restored

    def _restore_timers(self, handle: StateHandle, file_range: KeyGroupRange) -> int:
        restored = 0
        with StateFileReader(handle) as reader:
            self._check_meta(reader, file_range)
            wanted = [e for e in reader.sections if e.section in self.key_group_range]
            reader.prefetch(wanted)
            for entry in wanted:
                self.timer_service.restore_group(
                    entry.section - self._start, reader.read(entry), reader.path
                )
                restored += 1
        return restored


def _write_small_files(manifest: dict[str, Any], directory: str, manifest_path: str) -> None:
    """The files that describe the database (``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*``), as
    the manifest holds them."""
    os.makedirs(directory, exist_ok=True)
    for name, data in manifest["files"].items():
        if os.path.basename(name) != name or not isinstance(data, bytes):
            raise CorruptStateError(f"manifest {manifest_path}: malformed file entry {name!r}")
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def _materialise(manifest: dict[str, Any], directory: str, manifest_path: str) -> None:
    """A RocksDB directory from a manifest: its small files, and its SSTs downloaded."""
    _write_small_files(manifest, directory, manifest_path)
    for shared in manifest["ssts"]:
        if os.path.basename(shared.name) != shared.name:
            raise CorruptStateError(f"manifest {manifest_path}: malformed SST name")
        _download(shared, os.path.join(directory, shared.name), manifest_path)


def _local_copy_mismatch(
    copy: str, checkpoint_id: Any, max_parallelism: int, key_groups: KeyGroupRange
) -> str | None:
    """Why the local copy at ``copy`` is not one of ``checkpoint_id`` for these key groups
    (``None``: it is)."""
    try:
        with open(os.path.join(copy, LOCAL_COPY_META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        return f"no local copy of checkpoint {checkpoint_id}"
    except (OSError, ValueError) as e:
        return f"unreadable local copy metadata: {e}"
    expected = {
        "checkpoint_id": checkpoint_id,
        "max_parallelism": max_parallelism,
        "key_group_start": key_groups.start,
        "key_group_end": key_groups.end,
    }
    if not isinstance(meta, dict):
        return "malformed local copy metadata"
    for name, value in expected.items():
        if meta.get(name) != value:
            return f"the local copy has {name} {meta.get(name)!r:.40}, the restore {value!r}"
    return None


def _link_local_copy(
    manifest: dict[str, Any], copy: str, directory: str, manifest_path: str
) -> str | None:
    """The database directory of ``manifest`` with its SSTs hard-linked (copied where links
    fail) from ``copy``, each checked against the manifest's size and CRC-32. Returns why it
    could not be built (``None``: built)."""
    _write_small_files(manifest, directory, manifest_path)
    for shared in manifest["ssts"]:
        if os.path.basename(shared.name) != shared.name:
            raise CorruptStateError(f"manifest {manifest_path}: malformed SST name")
        source, target = os.path.join(copy, shared.name), os.path.join(directory, shared.name)
        try:
            try:
                os.link(source, target)
            except FileNotFoundError:
                return f"the local copy lacks {shared.name}"
            except OSError:  # another file system, or no hard links: copy
                shutil.copyfile(source, target)
            size, crc = file_crc32(target)
        except OSError as e:
            return f"cannot read {shared.name} of the local copy: {e}"
        if size != shared.size or crc != shared.crc:
            return (
                f"{shared.name} of the local copy has {size} bytes with CRC-32 {crc:08x}, the "
                f"manifest says {shared.size} bytes with CRC-32 {shared.crc:08x}"
            )
    return None


def discard_local_copies(root: str, job_id: str) -> None:
    """Delete every local copy of job ``job_id`` under the local recovery root ``root``
    (the job ended: no restore will need them)."""
    shutil.rmtree(os.path.join(root, _safe_name(job_id)), ignore_errors=True)


def local_copy_dir(root: str, job_id: str, backend_name: str, subtask_index: int) -> str:
    """Where one keyed subtask keeps its local copy: ``<root>/<job>/<backend>/<subtask>``."""
    return os.path.join(root, _safe_name(job_id), _safe_name(backend_name), str(subtask_index))


def _safe_name(name: str) -> str:
    """``name`` as one path component."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def _export(
    source: Any, key_groups: KeyGroupRange, path: str, backend: RocksDBKeyedStateBackend
) -> int:
    """Every entry of ``key_groups`` in ``source`` (a database) into a new SST file at
    ``path``; returns the count (no file when 0)."""
    if not len(key_groups):
        return 0
    lower = _KG.pack(key_groups.start)
    upper = _KG.pack(key_groups.end + 1)
    writer: Any = None
    count = 0
    try:
        for key, value in _scan_range(source, lower, upper):
            if writer is None:
                writer = rocksdict.SstFileWriter(options=backend.tuning.options())
                writer.open(path)
            writer[key] = value
            count += 1
        if writer is not None:
            writer.finish()
    except BaseException:
        with suppress(OSError):
            os.unlink(path)
        raise
    return count


class _CanonicalWriter:
    """The asynchronous part of a canonical snapshot: the heap's ``keyed`` file, read from a
    RocksDB snapshot one key group at a time; then the timers."""

    def __init__(
        self,
        backend: RocksDBKeyedStateBackend,
        checkpoint_id: int,
        view: Any,
        kinds: dict[str, str],
        timers: KeyedSnapshotWriter,
    ) -> None:
        self.backend = backend
        self.checkpoint_id = checkpoint_id
        self.view = view
        self.kinds = kinds
        self.names = dict(backend.encoded_state_names)
        self.timers = timers

    def _sections(self) -> Iterator[tuple[int, bytes]]:
        b = self.backend
        for idx in range(len(b.key_group_range)):
            lower, upper = b._group_bounds(idx)
            group: dict[str, dict[Any, Any]] = {}
            for key, raw in b._scan(lower, upper, self.view):
                _, name_bytes, rest = _parse_entry(key)
                name = self.names.get(name_bytes) or name_bytes.decode()
                kind = self.kinds.get(name)
                if kind is None:
                    raise CorruptStateError(f"state {name!r} has no registered kind")
                values = group.setdefault(name, {})
                if kind in _MAP_KINDS:
                    user, sub = _split_map_key(rest)
                    values.setdefault(_dec(user), {})[_dec(sub)] = pickle.loads(raw)
                else:
                    values[_dec(rest)] = pickle.loads(raw)
            if group:
                kg = b.key_group_range.start + idx
                yield kg, pickle_section(group, f"the keyed state of key group {kg}")

    def __call__(self, directory: str, into: MergedStateObject | None) -> list[StateHandle]:
        b = self.backend
        handles: list[StateHandle] = []
        try:
            lower, _ = b._group_bounds(0)
            _, upper = b._group_bounds(len(b.key_group_range) - 1)
            if next(b._scan(lower, upper, self.view), None) is not None:
                meta = b._meta(KEYED, self.checkpoint_id, self.kinds)
                name = state_file_name(b.name, KEYED, self.checkpoint_id, b.key_group_range)
                handles.append(
                    write_state_file(
                        directory, name, KEYED, meta, self._sections(), b.key_group_range, into
                    )
                )
            handles.extend(self.timers(directory, into))
        except BaseException:
            if into is None:
                discard_files(handles)
            raise
        finally:
            self.view = None  # releases the RocksDB snapshot
        return handles


class _IncrementalWriter:
    """The asynchronous part of an incremental checkpoint: upload the SST files the last
    completed checkpoint did not, write the manifest, then the timers."""

    def __init__(
        self,
        backend: RocksDBKeyedStateBackend,
        checkpoint_id: int,
        local: str,
        shared_dir: str,
        kinds: dict[str, str],
        timers: KeyedSnapshotWriter,
        confirmed: dict[str, SharedFile],
    ) -> None:
        self.backend = backend
        self.checkpoint_id = checkpoint_id
        self.local = local
        self.shared_dir = shared_dir
        self.kinds = kinds
        self.timers = timers
        self.confirmed = confirmed
        self.uploaded_bytes = 0
        self.reused_bytes = 0

    def _upload(self, name: str) -> SharedFile:
        local = os.path.join(self.local, name)
        # Streamed, never whole in memory: a compaction's output can be gigabytes.
        size, crc = file_crc32(local)
        store = store_for(self.shared_dir)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.backend.name)
        # The uploading checkpoint's id is part of the name: the coordinator's orphan sweep
        # tells the files of ended checkpoints from those of pending ones by it
        # (coordinator/shared_state.py, ``creator_id``).
        unique = f"{safe}-chk{self.checkpoint_id}-{uuid.uuid4().hex[:16]}-{name}"
        path = store.join(self.shared_dir, unique)
        try:
            store.upload_file(path, local)
        except OSError as e:
            raise StorageError(f"cannot upload shared state file {path}: {e}") from e
        if not is_object_store_uri(path):
            path = os.path.abspath(path)
        return SharedFile(name, path, size, crc)

    def _upload_all(
        self, plan: list[tuple[str, SharedFile | None]], handles: list[StateHandle]
    ) -> list[SharedFile]:
        """Upload the planned new files, ``upload_threads`` at a time (the store's latency,
        not its bandwidth, bounds one upload on an object store); append one handle per SST
        to ``handles`` in ``plan`` order, also for the uploads that finished when one fails
        (so that the caller removes them)."""
        kg = self.backend.key_group_range
        todo = [name for name, reused in plan if reused is None]
        uploaded: dict[str, SharedFile] = {}
        error: BaseException | None = None
        threads = min(self.backend.tuning.upload_threads, len(todo))
        if threads <= 1:
            try:
                for name in todo:
                    uploaded[name] = self._upload(name)
            except BaseException as e:  # re-raised below, after the handles are listed
                error = e
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="sst-upload") as pool:
                futures = {pool.submit(self._upload, name): name for name in todo}
                for future in as_completed(futures):
                    try:
                        uploaded[futures[future]] = future.result()
                    except BaseException as e:  # re-raised below, after the handles are listed
                        error = error or e
        ssts: list[SharedFile] = []
        for name, reused in plan:
            shared = reused if reused is not None else uploaded.get(name)
            if shared is None:
                continue
            if reused is not None:
                self.reused_bytes += shared.size
            else:
                self.uploaded_bytes += shared.size
            ssts.append(shared)
            handles.append(
                StateHandle(
                    path=shared.path,
                    size_bytes=shared.size,
                    kind=SHARED if reused is not None else SHARED_NEW,
                    key_group_start=kg.start,
                    key_group_end=kg.end,
                    offset=0,
                )
            )
        if error is not None:
            raise error
        return ssts

    def __call__(self, directory: str, into: MergedStateObject | None) -> list[StateHandle]:
        b = self.backend
        kg = b.key_group_range
        handles: list[StateHandle] = []
        keep = False
        try:
            files: dict[str, bytes] = {}
            plan: list[tuple[str, SharedFile | None]] = []  # (name, reused file or None)
            for name in sorted(os.listdir(self.local)):
                if not name.endswith(".sst"):
                    with open(os.path.join(self.local, name), "rb") as f:
                        files[name] = f.read()
                    continue
                size = os.path.getsize(os.path.join(self.local, name))
                previous = self.confirmed.get(name)
                reuse = previous is not None and previous.size == size
                plan.append((name, previous if reuse else None))
            ssts = self._upload_all(plan, handles)
            manifest = {"ssts": [tuple(s) for s in ssts], "files": files, "states": self.kinds}
            meta = b._meta(INCREMENTAL, self.checkpoint_id, self.kinds)
            handles.append(
                write_state_file(
                    directory,
                    state_file_name(b.name, INCREMENTAL, self.checkpoint_id, kg),
                    INCREMENTAL,
                    meta,
                    [(0, pickle_section(manifest, "the checkpoint manifest"))],
                    kg,
                    into,
                )
            )
            handles.extend(self.timers(directory, into))
            keep = b._recovery_dir is not None
        except BaseException:
            # No orphans from a failed write: new uploads and whole files written so far.
            discard_files([h for h in handles if h.kind != SHARED])
            raise
        finally:
            if not keep:
                shutil.rmtree(self.local, ignore_errors=True)
        b._uploaded[self.checkpoint_id] = {s.name: s for s in ssts}
        if keep:  # the local copy candidate, until the checkpoint completes
            b._kept[self.checkpoint_id] = self.local
        return handles

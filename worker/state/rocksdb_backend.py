"""The disk-backed keyed state backend: RocksDB through ``rocksdict``, with incremental
checkpoints (Flink's ``EmbeddedRocksDBStateBackend``): :class:`RocksDBKeyedStateBackend`. Its
states are ``rocksdb_state.py``'s.

Why RocksDB through rocksdict: docs/storage.md, "State larger than memory".

Layout
    One RocksDB instance per backend (one keyed subtask), in a directory of its own under the
    worker's local state directory, deleted by :meth:`RocksDBKeyedStateBackend.dispose`, sized
    by its :class:`~snapflow.worker.state.rocksdb_tuning.RocksDBTuning`. Entries are keyed by
    key group first (``rocksdb_layout.py``).

Timers
    Event-time timers are entries of the database too (a reserved state, ``rocksdb_timers.py``),
    so incremental checkpoints carry them with the SST files and rescaling moves them with
    their key groups; the heap's ``TimerService`` stays the index they fire from (all of them
    in memory, unlike Flink's RocksDB timer service, which caches only each key group's
    earliest). Changes reach the database in batches (one ``WriteBatch`` per flush).

Cache
    Value, reducing and aggregating states read and write through a write-back cache of
    decoded values (``cache_entries``; absent keys are cached too): a hot key costs a dict
    lookup, a bulk call one multi-get for the keys it misses, and repeated updates of a key
    reach RocksDB once per flush. The cache is flushed (one ``WriteBatch``) when it is full
    (the older half is then evicted), at every snapshot, and before any scan.

Snapshots (same recovery contract as the heap backend, see ``keyed_backend.py``)
    Synchronous part: flush the cache, then for a checkpoint a RocksDB checkpoint
    (``Checkpoint.create_checkpoint``: the memtable is flushed, the live SST files are
    hard-linked, nothing is copied), for a savepoint (or a snapshot without barrier options) a
    RocksDB snapshot. Both hold the timers (flushed with the cache), so nothing is frozen or
    copied on write. The asynchronous parts, an incremental upload or canonical ``keyed`` and
    ``timers`` files, are ``rocksdb_snapshots.py``'s.

Compaction
    What a checkpoint uploads is the flushed memtable plus every file compactions wrote since
    the last completed checkpoint, so the compaction style sets the bytes per checkpoint:
    universal by default, merging once ``compaction_trigger`` sorted runs accumulate
    (``rocksdb_tuning.py``; measurements and the trade-off in docs/storage.md).

Restore
    From canonical files (any backend's savepoint) the entries and timers of the backend's key
    groups are written into the database. From incremental manifests: when one manifest covers
    exactly this backend's key groups, its files are downloaded (``rocksdb_restore.py``) or linked
    from the local copy (``rocksdb_local_recovery.py``) and opened as the database; otherwise
    (rescaling) each overlapping manifest's database is downloaded to a temporary directory,
    the backend's key-group range is exported from it to an SST file and ingested. As with
    Flink's default restore mode (``NO_CLAIM``) the first checkpoint after a restore uploads
    all its files; later ones are incremental again. The timer index is then rebuilt from the
    database (a checkpoint of older versions, which wrote a ``timers`` file beside the
    manifest, restores its timers from that file).

Threading: as for the heap backend, the backend belongs to its task thread; only a snapshot's
``write`` runs on another thread (it reads the RocksDB checkpoint or snapshot, never the live
database's cache).
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from typing import Any, cast

import numpy as np
import pyarrow as pa
import rocksdict
import structlog

from snapflow.checkpointing import (
    INCREMENTAL,
    KEYED,
    TIMERS,
    BarrierOptions,
    StateHandle,
)
from snapflow.errors import StateError
from snapflow.worker.state.errors import (
    CorruptStateError,
    IncompatibleStateError,
)
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import (
    STATE_KINDS,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from snapflow.worker.state.keygroups import KEY_HASH_VERSION, KeyGroupRange
from snapflow.worker.state.rocksdb_layout import (
    KG,
    LEN32,
    LIST_KINDS,
    MAP_KINDS,
    TIMER_STATE,
    decode_key,
    encode_key,
    encode_value,
    export_key_groups,
    prefix_end,
    scan_range,
    split_map_key,
)
from snapflow.worker.state.rocksdb_local_recovery import (
    link_local_copy,
    local_copy_mismatch,
    promote_local_copy,
)
from snapflow.worker.state.rocksdb_restore import materialise
from snapflow.worker.state.rocksdb_snapshots import (
    CanonicalSnapshotWriter,
    IncrementalSnapshotWriter,
    SharedFile,
    read_manifest,
    shared_dir_for,
)
from snapflow.worker.state.rocksdb_state import (
    ABSENT,
    MISS,
    RocksAggregatingState,
    RocksListState,
    RocksMapState,
    RocksReducingState,
    RocksTable,
    RocksValueState,
)
from snapflow.worker.state.rocksdb_timers import RocksDBTimerMirror
from snapflow.worker.state.rocksdb_tuning import (
    DEFAULT_MEMORY_BUDGET_BYTES,
    RocksDBTuning,
    write_options,
)
from snapflow.worker.state.snapshots import SnapshotInProgress
from snapflow.worker.state.state_files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MergedStateObject,
    StateFileReader,
    handle_fields,
)
from snapflow.worker.state.timers import TimerService
from snapflow.worker.state.ttl import Clock

__all__ = ["DEFAULT_CACHE_ENTRIES", "RocksDBKeyedStateBackend"]

DEFAULT_CACHE_ENTRIES = 100_000

log = structlog.get_logger("snapflow.worker")


class RocksDBKeyedStateBackend(KeyedStateBackend):
    """Keyed state of one subtask in a local RocksDB instance (see the module docstring).

    The current key, the key-group math of the bulk API and the timer index are the heap
    backend's (inherited); every state, and every timer, lives in RocksDB. ``tuning`` sets the
    instance (``memory_budget_bytes`` is the short form of
    ``RocksDBTuning(memory_budget_bytes=...)`` and is ignored when ``tuning`` is given)."""

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
        """``local_recovery_dir``: where this subtask keeps its local copy (see
        ``rocksdb_local_recovery.py``); ``None``: no local recovery."""
        super().__init__(max_parallelism, key_group_range, name=name, clock=clock)
        if cache_entries < 0:
            raise StateError(f"cache_entries must be >= 0, got {cache_entries}")
        root = local_dir or os.path.join(tempfile.gettempdir(), "snapflow-rocksdb")
        os.makedirs(root, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "keyed"
        self._dir = tempfile.mkdtemp(prefix=f"{safe}-", dir=root)
        self._db_path = os.path.join(self._dir, "db")
        self._tuning = tuning or RocksDBTuning(memory_budget_bytes=memory_budget_bytes)
        self.db = self._open(self._db_path)
        self.timer_mirror = RocksDBTimerMirror(self, self.key_group_range)
        self.timer_service = TimerService(self, self.timer_mirror)
        self._rtables: dict[str, RocksTable] = {}
        self._kinds: dict[str, str] = {}  # registered or restored: state name -> kind
        self._names: dict[bytes, str] = {}  # state name bytes -> name (snapshot decoding)
        self.cache: dict[bytes, Any] = {}
        self.dirty: set[bytes] = set()
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
        self._keys_memo: tuple[Any, Any, RocksTable, list[bytes]] | None = None

    @classmethod
    def for_subtask(
        cls, max_parallelism: int, parallelism: int, index: int, *, name: str = "", **kwargs: Any
    ) -> RocksDBKeyedStateBackend:
        from snapflow.worker.state import keygroups as kgs

        kg_range = kgs.key_group_range_for_subtask(max_parallelism, parallelism, index)
        return cls(max_parallelism, kg_range, name=name, **kwargs)

    def _open(self, path: str) -> rocksdict.Rdict:
        db = rocksdict.Rdict(path, self._tuning.options())
        db.set_write_options(write_options())
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
            self.db.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # --- registration -----------------------------------------------------------------------

    def _rtable(self, name: str, kind: str) -> RocksTable:
        if not isinstance(name, str) or not name or name == TIMER_STATE:
            raise StateError(
                f"state names are non-empty strings (not {TIMER_STATE!r}), got {name!r}"
            )
        table = self._rtables.get(name)
        known = self._kinds.get(name)
        if known is not None and known != kind:
            raise IncompatibleStateError(
                f"state {name!r} is {known} state, it cannot be used as {kind} state"
            )
        if table is None:
            table = self._rtables[name] = RocksTable(name, kind, self._start, self._n)
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

    def db_keys(self, table: RocksTable, keys: Any, key_groups: Any) -> list[bytes]:
        """The database keys of ``table``'s entries for the bulk ``keys`` (with their
        ``key_groups``, as the bulk state API takes them)."""
        memo = self._keys_memo
        # fold_and_get (and callers like it) add then read the same keys: encode them once.
        if memo is not None and memo[0] is keys and memo[1] is key_groups and memo[2] is table:
            return memo[3]
        if isinstance(keys, pa.Array) and pa.types.is_int64(keys.type) and not keys.null_count:
            arr, groups = self._groups(keys, key_groups)
            idxs = groups.to_numpy(zero_copy_only=False).astype(np.int64) - self._start
            out = table.int_keys(idxs, arr.to_numpy(zero_copy_only=False))
        else:
            pykeys, idxs_list = self.resolve_keys(keys, key_groups)
            prefixes = table.prefixes
            out = [prefixes[i] + encode_key(k) for k, i in zip(pykeys, idxs_list, strict=True)]
        if isinstance(keys, pa.Array):  # immutable: safe to recognise by identity
            self._keys_memo = (keys, key_groups, table, out)
        return out

    # --- the cache (the states' reads and writes, ``rocksdb_state.py``) ------------------------

    def cached_get(self, key: bytes) -> Any:
        cache = self.cache
        v = cache.get(key, MISS)
        if v is MISS:
            raw = self.db.get(key)
            v = ABSENT if raw is None else pickle.loads(raw)
            cache[key] = v
            self.maybe_evict()
        return v

    def prefetch(self, keys: Sequence[bytes]) -> None:
        cache = self.cache
        missing = [k for k in dict.fromkeys(keys) if k not in cache]
        if missing:
            loads = pickle.loads
            raws = cast(list[bytes | None], self.db.get(cast(Any, missing)))
            for k, raw in zip(missing, raws, strict=True):
                cache[k] = ABSENT if raw is None else loads(raw)

    def cached_get_many(self, keys: Sequence[bytes]) -> list[Any]:
        self.prefetch(keys)
        cache = self.cache
        out = [cache[k] for k in keys]
        self.maybe_evict()
        return out

    def cached_pop_many(self, keys: Sequence[bytes]) -> list[Any]:
        """The cached values of ``keys`` (``ABSENT``: none), each then deleted (a repeated key
        reads ``ABSENT`` after its first). The misses are read with one multi-get and not
        cached: their deletion is what the cache keeps."""
        cache = self.cache
        missing = [k for k in dict.fromkeys(keys) if k not in cache]
        fetched: dict[bytes, Any] = {}
        if missing:
            loads = pickle.loads
            raws = cast(list[bytes | None], self.db.get(cast(Any, missing)))
            fetched = {
                k: ABSENT if r is None else loads(r) for k, r in zip(missing, raws, strict=True)
            }
        out: list[Any] = []
        append, absent = out.append, ABSENT
        for k in keys:
            v = cache.get(k, MISS)
            append(fetched[k] if v is MISS else v)
            cache[k] = absent
        self.dirty.update(keys)
        self.maybe_evict()
        return out

    def cached_put(self, key: bytes, value: Any) -> None:
        self.cache[key] = value
        self.dirty.add(key)
        self.maybe_evict()

    def cached_put_many(self, keys: Sequence[bytes], values: Sequence[Any]) -> None:
        cache, dirty = self.cache, self.dirty
        for k, v in zip(keys, values, strict=True):
            cache[k] = v
        dirty.update(keys)
        self.maybe_evict()

    def fold_many(
        self, keys: Sequence[bytes], values: Sequence[Any], fold: Callable[[Any, Any], Any]
    ) -> None:
        """``cache[k] = fold(cache[k], v)`` in order (a repeated key sees its earlier fold)."""
        self.prefetch(keys)
        cache = self.cache
        for k, v in zip(keys, values, strict=True):
            cache[k] = fold(cache[k], v)
        self.dirty.update(keys)
        self.maybe_evict()

    def delete_key(self, key: bytes, kind: str) -> None:
        if kind in MAP_KINDS:
            raise AssertionError("map state clears through its prefix")  # pragma: no cover
        if kind in LIST_KINDS:
            self.db.delete(key)
        else:
            self.cached_put(key, ABSENT)

    def maybe_evict(self) -> None:
        if len(self.cache) > self._cache_entries:
            self._flush()
            cache = self.cache
            # A new dict rather than deletions: deleted slots would slow every later miss.
            self.cache = dict(
                itertools.islice(cache.items(), len(cache) - self._cache_entries // 2, None)
            )

    def _flush(self) -> None:
        """Write the dirty cache entries, and the pending timer changes, to RocksDB (one write
        batch each)."""
        self.timer_mirror.flush()
        if not self.dirty:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        cache = self.cache
        for k in self.dirty:
            v = cache[k]
            if v is ABSENT:
                batch.delete(k)
            else:
                batch.put(k, encode_value(v))
        self.db.write(batch)
        self.dirty.clear()

    # --- scans ------------------------------------------------------------------------------

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
        return scan_range(self.db, lower, upper)

    def count_keys(self, table: RocksTable) -> int:
        self._flush()
        n = 0
        is_map = table.kind in MAP_KINDS
        for prefix in table.prefixes:
            last = None
            for key, _ in self.scan(prefix, prefix_end(prefix)):
                if is_map:
                    user = split_map_key(key[len(prefix) :])[0]
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
        is_map = table.kind in MAP_KINDS
        for prefix in table.prefixes:
            n = len(prefix)
            if not is_map:
                for key, raw in self.scan(prefix, prefix_end(prefix)):
                    yield decode_key(key[n:]), pickle.loads(raw)
                continue
            current: Any = MISS
            entries: dict[Any, Any] = {}
            for key, raw in self.scan(prefix, prefix_end(prefix)):
                user, sub = split_map_key(key[n:])
                if user != current:
                    if current is not MISS:
                        yield decode_key(current), entries
                    current, entries = user, {}
                entries[decode_key(sub)] = pickle.loads(raw)
            if current is not MISS:
                yield decode_key(current), entries

    def _ttl_scan(self, name: str) -> Iterator[tuple[Any, int]]:
        table = self._rtables.get(name)
        if table is None:
            return
        is_map = table.kind in MAP_KINDS
        for idx, prefix in enumerate(table.prefixes):
            self._flush()
            n = len(prefix)
            keys: list[bytes] = []
            for key, _ in self.scan(prefix, prefix_end(prefix)):
                user = split_map_key(key[n:])[0] if is_map else key[n:]
                if not keys or keys[-1] != user:
                    keys.append(user)
            for user in keys:
                yield decode_key(user), self._start + idx

    def is_empty(self) -> bool:
        if self.timer_service.num_timers():
            return False
        self._flush()
        return next(iter(self.db.keys()), None) is None

    # --- key-group export and ingest ----------------------------------------------------------

    def export_key_groups(self, key_groups: KeyGroupRange, path: str) -> int:
        """Write every entry of ``key_groups`` (within this backend's range) to a new SST file
        at ``path``; returns the number of entries (no file when 0)."""
        self._flush()
        mine = key_groups.intersection(self.key_group_range)
        return export_key_groups(self.db, mine, path, self._tuning)

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
        for lower, upper in ((b"", KG.pack(start)), (KG.pack(end + 1), b"\xff\xff\xff")):
            stray = next(self.scan(lower, upper), None)
            if stray is not None:
                self.db.delete_range(lower, upper)
                raise IncompatibleStateError(
                    f"the ingested files hold key group {KG.unpack_from(stray[0])[0]}, outside "
                    f"this backend's key groups {self.key_group_range}"
                )
        self._index_timers(", ".join(paths))

    def _ingest(self, paths: list[str]) -> None:
        opts = rocksdict.IngestExternalFileOptions()
        opts.set_move_files(True)
        self._flush()
        self.cache.clear()  # cached values may predate the ingested entries
        self.db.ingest_external_file(paths, opts)

    def _index_timers(self, path: str) -> int:
        """Add the database's timers to the timer index (after a restore or an ingest put
        them there); returns the number of key groups holding timers."""
        groups = 0
        for kg, timers in self.timer_mirror.scan(self.key_group_range):
            self.timer_service.restore_group(kg - self._start, timers, path, to_sink=False)
            groups += 1
        return groups

    # --- lifecycle ----------------------------------------------------------------------------

    def end_of_data(self) -> None:
        # The end of input's firing leaves many changes behind (Nexmark q5: a 0.5 s
        # synchronous part in the final checkpoint): the cache, the timers and the memtable
        # are written now, while the task waits for that checkpoint anyway.
        self._flush()
        self.db.flush()

    writes_ahead = True

    def write_ahead(self) -> None:
        """Write the pending changes into the database now, and drop them from the cache (not
        read again soon, they would only hold memory)."""
        written = list(self.dirty)
        self._flush()
        cache = self.cache
        for k in written:
            cache.pop(k, None)

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
                promote_local_copy(
                    self._recovery_dir,
                    checkpoint_id,
                    kept,
                    self.max_parallelism,
                    self.key_group_range,
                )
            except OSError as e:  # local recovery is an optimisation: the task goes on
                shutil.rmtree(kept, ignore_errors=True)
                log.warning(
                    "state.local_copy_failed",
                    backend=self.name,
                    checkpoint_id=checkpoint_id,
                    error=str(e),
                )

    def checkpoint_written(
        self, checkpoint_id: int, files: dict[str, SharedFile], local_copy: str | None
    ) -> None:
        """Called by checkpoint ``checkpoint_id``'s incremental writer (on the snapshot's
        thread) once its files are written: ``files``, the SST files its manifest names, are
        reused by later snapshots once it completes; ``local_copy``, its RocksDB checkpoint
        directory kept for local recovery (``None``: not kept), becomes the local copy then."""
        self._uploaded[checkpoint_id] = files
        if local_copy is not None:  # the local copy candidate, until the checkpoint completes
            self._kept[checkpoint_id] = local_copy

    # --- snapshots --------------------------------------------------------------------------

    def snapshot(
        self, checkpoint_id: int, options: BarrierOptions | None = None
    ) -> SnapshotInProgress:
        """Synchronous part: flush the cache and the timers; then a RocksDB checkpoint (hard
        links) for a checkpoint, a RocksDB snapshot for a savepoint (or without ``options``).
        Both hold the timers as of now: nothing is frozen."""
        start = time.perf_counter()
        self._snapshots.reap()
        self._flush()
        kinds = dict(self._kinds)
        writer: Callable[[str, MergedStateObject | None], list[StateHandle]]
        if options is None or options.kind.is_savepoint or not options.target_location:
            writer = CanonicalSnapshotWriter(self, checkpoint_id, self.db.snapshot(), kinds)
        else:
            local = os.path.join(self._dir, f"chk-{checkpoint_id}-{uuid.uuid4().hex[:8]}")
            rocksdict.Checkpoint(self.db).create_checkpoint(local)
            writer = IncrementalSnapshotWriter(
                self,
                checkpoint_id,
                local,
                shared_dir_for(options.target_location),
                kinds,
                dict(self._confirmed),
                keep=self._recovery_dir is not None,
            )
        snap = SnapshotInProgress(checkpoint_id, writer, self._snapshots.release)
        self._snapshots.add(snap)
        snap.sync_duration_s = time.perf_counter() - start
        return snap

    def snapshot_meta(
        self, kind: str, checkpoint_id: int, kinds: dict[str, str] | None
    ) -> dict[str, Any]:
        """The metadata of a state file of kind ``kind`` (``keyed``, ``timers`` or
        ``incremental``) that a snapshot writer (``rocksdb_snapshots.py``) writes for
        checkpoint ``checkpoint_id``, with ``kinds`` (state name -> kind) as of the snapshot
        (``None``: a timers file, which names no states)."""
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": kind,
            "checkpoint_id": checkpoint_id,
            "max_parallelism": self.max_parallelism,
            "key_group_start": self.key_group_range.start,
            "key_group_end": self.key_group_range.end,
            "key_hash": KEY_HASH_VERSION,
        }
        if kinds is not None:
            meta["states"] = kinds
        return meta

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
        if manifests:  # after every ingest: the database holds the restored timers
            self._index_timers(", ".join(h.path for h, _ in manifests))
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
            manifest = read_manifest(reader)
            checkpoint_id = reader.meta.get("checkpoint_id")
        path = handle.path
        self._merge_kinds(manifest["states"], path)
        if whole:
            self.db.close()
            shutil.rmtree(self._db_path, ignore_errors=True)
            if self._from_local_copy(manifest, checkpoint_id, path):
                self.local_recovery_hits += 1
            else:
                shutil.rmtree(self._db_path, ignore_errors=True)
                materialise(manifest, self._db_path, path)
            self.db = self._open(self._db_path)
            return len(self.key_group_range)
        if self._recovery_dir is not None:
            self._local_miss(checkpoint_id, "the restore changes the key groups (rescaling)")
        scratch = os.path.join(self._dir, f"restore-{uuid.uuid4().hex[:8]}")
        try:
            materialise(manifest, scratch, path)
            source = rocksdict.Rdict(
                scratch, self._tuning.options(), access_type=rocksdict.AccessType.read_only()
            )
            try:
                exported = os.path.join(self._dir, f"ingest-{uuid.uuid4().hex}.sst")
                mine = file_range.intersection(self.key_group_range)
                if export_key_groups(source, mine, exported, self._tuning):
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
        reason = local_copy_mismatch(
            copy, checkpoint_id, self.max_parallelism, self.key_group_range
        )
        if reason is None:
            reason = link_local_copy(manifest, copy, self._db_path, path)
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
                        encoded = encode_key(key)
                        if kind in MAP_KINDS:
                            head = prefix + LEN32.pack(len(encoded)) + encoded
                            for user_key, v in value.items():
                                batch.put(head + encode_key(user_key), encode_value(v))
                        else:
                            batch.put(prefix + encoded, encode_value(value))
                self.db.write(batch)
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

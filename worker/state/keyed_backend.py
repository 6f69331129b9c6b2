"""The worker's keyed state backend on the heap: keyed state and event-time timers, with
snapshots.

This is Flink's ``HashMapStateBackend`` (keyed state on the heap), in Python; the disk backend
(``rocksdb_backend.py``) extends it.

Keyed state
    :class:`KeyedStateBackend` owns one contiguous :class:`~snapflow.worker.state.keygroups.KeyGroupRange` of
    a vertex's ``max_parallelism`` key groups. Each registered state (``ValueState``,
    ``ListState``, ``MapState``, ``ReducingState``, ``AggregatingState``: ``keyed_state.py``)
    stores, per key group, a dict ``key -> value``. Event-time timers (``TimerService``:
    ``timers.py``) are keyed state too: kept per key group, snapshotted and redistributed with
    it.

Recovery contract
    What a snapshot holds, and how it is taken without stopping processing: ``snapshots.py``;
    how its files are written and read: ``state_files.py``; how values may be changed:
    ``keyed_state.py``.

    Keyed state is written as one file per backend (its key-group range) plus one for timers.
    Each file has an index of key-group sections, so a restore reads only the sections of the
    key groups it owns: :meth:`KeyedStateBackend.restore` given *all* keyed handles of a vertex
    (any old parallelism, same ``max_parallelism``) restores exactly the entries and timers of
    its own key groups, each key group from exactly one file. Scaling up and down therefore
    neither loses nor duplicates state, and every key lands in the subtask that owns its key
    group.

Threading: a backend belongs to its task thread. Only ``SnapshotInProgress.write`` may run on
another thread, concurrently with processing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar, overload

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.checkpointing import INCREMENTAL, KEYED, TIMERS, BarrierOptions
from snapflow.errors import StateError
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.errors import (
    CorruptStateError,
    IncompatibleStateError,
    KeyGroupRangeError,
)
from snapflow.worker.state.keyed_state import (
    STATE_KINDS,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    StateTable,
    ValueState,
    aggregate_batch,
    pylist,
)
from snapflow.worker.state.keygroups import KEY_HASH_VERSION, KeyGroupRange
from snapflow.worker.state.snapshots import (
    KeyedSnapshotWriter,
    SnapshotInProgress,
    SnapshotTracker,
)
from snapflow.worker.state.state_files import StateFileReader, handle_fields
from snapflow.worker.state.timers import TimerService
from snapflow.worker.state.ttl import (
    Clock,
    StateTtlConfig,
    TtlAggregatingState,
    TtlListState,
    TtlMapState,
    TtlReducingState,
    TtlValueState,
    ttl_kind,
)

__all__ = ["KeyedStateBackend", "wall_clock_ms"]

T = TypeVar("T")


def wall_clock_ms() -> int:
    """Processing time in milliseconds (the default clock of state TTL)."""
    return time.time_ns() // 1_000_000


def _take(values: Any, order: pa.Array) -> list[Any]:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.take(order).to_pylist()
    return [values[i] for i in order.to_pylist()]


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
        self._tables: dict[str, StateTable] = {}
        self._current_key: Any = None
        self._current_idx = -1
        self.timer_service = TimerService(self)
        self._snapshots = SnapshotTracker(self._thaw)
        self.clock: Clock = clock or wall_clock_ms
        """Processing time in ms for state TTL (injectable for tests)."""

    @classmethod
    def for_subtask(
        cls, max_parallelism: int, parallelism: int, index: int, *, name: str = ""
    ) -> KeyedStateBackend:
        kg_range = kgs.key_group_range_for_subtask(max_parallelism, parallelism, index)
        return cls(max_parallelism, kg_range, name=name)

    # --- lifecycle (the disk backend needs these; the heap has nothing to do) ----------------

    writes_ahead = False
    """Whether :meth:`write_ahead` takes work off the next checkpoint's synchronous part: on
    the disk backend it encodes and writes state into RocksDB; the heap's synchronous part
    copies nothing, so writing ahead gains nothing there."""

    def write_ahead(self) -> None:
        """Write the pending changes where the next snapshot finds them, now (the disk
        backend; the heap has nothing to do). Operators call it for state they wrote in bulk
        and will not read soon (a join's rows, ``join_checkpoint.py``)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """A checkpoint this backend took part in completed (incremental backends reuse its
        files from now on)."""

    def end_of_data(self) -> None:
        """The task's data ended (its last timers fired, ``end_input`` ran): nothing changes
        the state any more before the final checkpoint. The disk backend writes what it holds
        pending now, so that the final checkpoint's synchronous part finds nothing left."""

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

    def clear_current_key(self) -> None:
        """No current key: keyed state accesses raise ``NoCurrentKeyError`` until the next
        :meth:`set_current_key` (e.g. while a broadcast input, which has no key, is processed)."""
        self._current_idx = -1
        self._current_key = None

    @property
    def current_key(self) -> Any:
        return self._current_key if self._current_idx >= 0 else None

    @property
    def current_key_group(self) -> int | None:
        return self._start + self._current_idx if self._current_idx >= 0 else None

    def _groups(self, keys: Any, key_groups: Any) -> tuple[Any, pa.Array]:
        """``keys`` (an Arrow array, or a list) and their validated key groups (int32 array)."""
        if not isinstance(keys, pa.Array | pa.ChunkedArray):
            keys = pylist(keys)  # numpy keys become Python ints/strs, as Arrow keys do
        if key_groups is None:
            groups = kgs.key_groups(keys, self.max_parallelism)
        elif isinstance(key_groups, pa.ChunkedArray):
            groups = key_groups.combine_chunks()
        elif isinstance(key_groups, pa.Array):
            groups = key_groups
        else:
            groups = pa.array(pylist(key_groups), pa.int32())
        if len(groups) != len(keys):
            raise StateError(f"{len(keys)} keys but {len(groups)} key groups")
        if len(groups) and groups.null_count:
            raise StateError("key groups must not be null")
        if len(groups):
            bounds = pc.min_max(groups)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo < self._start or hi >= self._start + self._n:
                for k, g in zip(pylist(keys), groups.to_pylist(), strict=True):
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
        return pylist(keys), pylist(idxs)

    def runs_by_key_group(
        self, keys: Any, values: Any, key_groups: Any = None
    ) -> Iterator[tuple[int, list[Any], list[Any]]]:
        """``(key-group index, keys, values)`` per key group present, rows in their original
        order within a group (a stable sort by key group with Arrow kernels)."""
        keys, groups = self._groups(keys, key_groups)
        if not isinstance(values, pa.Array | pa.ChunkedArray):
            values = pylist(values)
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

    def _table(self, name: str, kind: str) -> StateTable:
        if not isinstance(name, str) or not name:
            raise StateError(f"state names are non-empty strings, got {name!r}")
        table = self._tables.get(name)
        if table is None:
            # Not in any live snapshot view: it needs no copy-on-write until the next snapshot.
            table = self._tables[name] = StateTable(name, kind, self._n)
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
        self.timer_service.thaw()

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
        timer_view = self.timer_service.freeze()
        writer = KeyedSnapshotWriter(
            checkpoint_id, self.max_parallelism, self.key_group_range, self.name, views, timer_view
        )
        snap = SnapshotInProgress(checkpoint_id, writer, self._snapshots.release)
        snap.count_entries = lambda: (
            sum(len(m) for _, maps in views.values() for m in maps)
            + sum(len(timers) for timers in timer_view)
        )
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
            handle = handle_fields(raw, base_dir)
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
            with StateFileReader(handle) as reader:
                self._check_meta(reader, file_range)
                states = reader.meta.get("states", {})
                wanted = []
                for entry in reader.sections:
                    kg = entry.section
                    if kg not in file_range:
                        raise reader.corrupt(f"key group {kg} lies outside the file's range")
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
                        self.timer_service.restore_group(idx, data, reader.path)
                    else:
                        self._restore_group(idx, data, states, reader.path)
                    restored += 1
        return restored

    def _check_meta(self, reader: StateFileReader, file_range: KeyGroupRange) -> None:
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
            if kind not in STATE_KINDS or not isinstance(entries, dict):
                raise CorruptStateError(f"state file {path}: malformed state {name!r:.100}")
            self._table(name, kind).writable(idx).update(entries)

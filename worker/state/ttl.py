"""State time-to-live (Flink's ``StateTtlConfig``), for every keyed state kind of both backends.

A state registered with a :class:`StateTtlConfig` stores each value with the time it was last
written (or, with :attr:`TtlUpdateType.ON_READ_AND_WRITE`, last read) as ``(value, ms)``; list
elements and map entries carry one timestamp each, as Flink's ``TtlListState`` and
``TtlMapState`` do. A value whose timestamp is ``ttl_ms`` or more in the past is expired: it is
never returned (Flink's ``NeverReturnExpired``, the only visibility offered) and it is removed
when it is met.

Time is processing time from the backend's injectable ``clock`` (milliseconds), so tests drive
expiry exactly.

Clean-up, two ways:

* **on access**: an expired value that a read meets is removed at once;
* **incrementally** (Flink's ``cleanupIncrementally``): every state access also examines the
  next ``cleanup_size`` keys of that state (a cursor that walks the whole state and starts
  again) and removes what expired. A key nobody reads is thus removed after about
  ``state size / cleanup_size`` accesses.

RocksDB's compaction-filter clean-up (Flink's ``cleanupInRocksdbCompactFilter``) needs a C++
compaction filter that ``rocksdict`` does not expose (it has no compaction-filter hook), so the
disk backend relies on the two ways above; RocksDB's own TTL mode (``AccessType.with_ttl``) is
per database, not per state, and may return expired values, so it is not used.

The wrappers work on the backends' ordinary states, registered under a TTL kind
(``ttl-value``, ``ttl-list``, ...): a state cannot change between TTL and no TTL across a
restore (an :class:`IncompatibleStateError`, as Flink refuses such a state migration), and the
canonical snapshot format is the same for both backends.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import pyarrow as pa

from snapflow.errors import StateError

# The backend and its state types (snapflow.worker.state.keyed_backend and keyed_state, which
# import this module) are typed as Any here: this module stays below them, without an import
# cycle.
KeyedStateBackend: TypeAlias = Any
ValueState: TypeAlias = Any
ListState: TypeAlias = Any
MapState: TypeAlias = Any
ReducingState: TypeAlias = Any
AggregatingState: TypeAlias = Any

__all__ = [
    "TTL_KINDS",
    "StateTtlConfig",
    "TtlAggregatingState",
    "TtlListState",
    "TtlMapState",
    "TtlReducingState",
    "TtlUpdateType",
    "TtlValueState",
    "ttl_kind",
]

T = TypeVar("T")

#: State kinds of TTL states (the stored values carry their timestamps).
TTL_KINDS = {f"ttl-{k}" for k in ("value", "list", "map", "reducing", "aggregating")}


def ttl_kind(kind: str) -> str:
    return f"ttl-{kind}"


class TtlUpdateType(enum.Enum):
    """When a value's timestamp is renewed (Flink's ``StateTtlConfig.UpdateType``)."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


@dataclass(frozen=True)
class StateTtlConfig:
    """Time to live of one state."""

    ttl_ms: int
    """A value expires this many milliseconds after its timestamp (> 0)."""
    update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE
    """Whether reads renew the timestamp too (writes always do)."""
    cleanup_size: int = 5
    """Keys examined for expiry per state access (Flink's default is 5); 0 turns the
    incremental clean-up off (expired values are still never returned)."""

    def __post_init__(self) -> None:
        if not isinstance(self.ttl_ms, int) or isinstance(self.ttl_ms, bool) or self.ttl_ms <= 0:
            raise StateError(f"ttl_ms must be a positive int (milliseconds), got {self.ttl_ms!r}")
        if not isinstance(self.update_type, TtlUpdateType):
            raise StateError(f"update_type must be a TtlUpdateType, got {self.update_type!r}")
        if not isinstance(self.cleanup_size, int) or self.cleanup_size < 0:
            raise StateError(f"cleanup_size must be an int >= 0, got {self.cleanup_size!r}")


_MISSING: Any = object()


class _Ttl:
    """What every TTL wrapper shares: the clock, expiry, and the incremental clean-up cursor."""

    def __init__(
        self, backend: KeyedStateBackend, inner: Any, config: StateTtlConfig, clock: Clock
    ) -> None:
        self._backend = backend
        self._inner = inner
        self._config = config
        self._clock = clock
        self._on_read = config.update_type is TtlUpdateType.ON_READ_AND_WRITE
        self._cursor: Iterator[tuple[Any, int]] | None = None

    @property
    def name(self) -> str:
        return str(self._inner.name)

    @property
    def ttl(self) -> StateTtlConfig:
        return self._config

    def _expired(self, ts: int, now: int) -> bool:
        return now - ts >= self._config.ttl_ms

    def __len__(self) -> int:
        """Stored keys, expired ones not yet cleaned up included."""
        return len(self._inner)

    def clear(self) -> None:
        self._inner.clear()

    # --- incremental clean-up ---------------------------------------------------------------

    def _cleanup(self, accesses: int = 1) -> None:
        budget = self._config.cleanup_size * accesses
        if not budget:
            return
        backend = self._backend
        saved_key, saved_group = backend.current_key, backend.current_key_group
        try:
            for _ in range(budget):
                if self._cursor is None:
                    self._cursor = backend._ttl_scan(self.name)
                item = next(self._cursor, None)
                if item is None:
                    self._cursor = None  # walked the whole state: start again next time
                    break
                key, group = item
                backend.set_current_key(key, group)
                self._purge_current(self._clock())
        finally:
            if saved_group is not None:
                backend.set_current_key(saved_key, saved_group)

    def _purge_current(self, now: int) -> None:
        """Remove what expired of the current key's value (no timestamp renewed)."""
        raise NotImplementedError


class _TtlSingle(_Ttl):
    """Value, reducing and aggregating state: one ``(value, ms)`` per key."""

    def _purge_current(self, now: int) -> None:
        raw = self._raw()
        if raw is not None and self._expired(raw[1], now):
            self._inner.clear()

    def _raw(self) -> tuple[Any, int] | None:
        raise NotImplementedError

    def _live(self, raw: tuple[Any, int] | None, now: int) -> Any:
        """The user value of ``raw`` (``_MISSING`` when absent or expired; expired is removed)."""
        if raw is None:
            return _MISSING
        if self._expired(raw[1], now):
            self._inner.clear()
            return _MISSING
        return raw[0]

    def _live_many(
        self, keys: Any, key_groups: Any, raws: list[Any], now: int
    ) -> tuple[list[Any], list[int]]:
        """User values of ``raws`` (``_MISSING`` for absent or expired) and the positions of
        the expired ones (removed here)."""
        out: list[Any] = []
        expired: list[int] = []
        for i, raw in enumerate(raws):
            if raw is None:
                out.append(_MISSING)
            elif self._expired(raw[1], now):
                out.append(_MISSING)
                expired.append(i)
            else:
                out.append(raw[0])
        if expired:
            self._remove_positions(keys, key_groups, expired)
        return out, expired

    def _remove_positions(self, keys: Any, key_groups: Any, positions: list[int]) -> None:
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        backend = self._backend
        saved_key, saved_group = backend.current_key, backend.current_key_group
        try:
            for i in positions:
                backend.set_current_key(pykeys[i], backend.key_group_range.start + idxs[i])
                self._inner.clear()
        finally:
            if saved_group is not None:
                backend.set_current_key(saved_key, saved_group)


class TtlValueState(_TtlSingle, Generic[T]):
    """``ValueState`` with a time to live."""

    kind = "value"

    def __init__(
        self,
        backend: KeyedStateBackend,
        inner: ValueState,
        config: StateTtlConfig,
        clock: Clock,
        default: T | None,
    ) -> None:
        super().__init__(backend, inner, config, clock)
        self._default = default

    def _raw(self) -> tuple[Any, int] | None:
        raw: tuple[Any, int] | None = self._inner.value()
        return raw

    def value(self) -> T | None:
        now = self._clock()
        value = self._live(self._raw(), now)
        self._cleanup()
        if value is _MISSING:
            return self._default
        if self._on_read:
            self._inner.update((value, now))
        result: T = value
        return result

    def update(self, value: T | None) -> None:
        self._inner.update(None if value is None else (value, self._clock()))
        self._cleanup()

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        now = self._clock()
        raws = self._inner.get_many(keys, key_groups)
        values, _ = self._live_many(keys, key_groups, raws, now)
        if self._on_read:
            live = [i for i, v in enumerate(values) if v is not _MISSING]
            if live:
                pykeys = _pylist(keys)
                groups = None if key_groups is None else _pylist(key_groups)
                self._inner.update_many(
                    [pykeys[i] for i in live],
                    [(values[i], now) for i in live],
                    None if groups is None else [groups[i] for i in live],
                )
        self._cleanup(_accesses(len(values)))
        default = self._default
        return [default if v is _MISSING else v for v in values]

    def update_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        now = self._clock()
        wrapped = [None if v is None else (v, now) for v in _pylist(values)]
        self._inner.update_many(keys, wrapped, key_groups)
        self._cleanup(_accesses(len(wrapped)))


class TtlReducingState(_TtlSingle, Generic[T]):
    """``ReducingState`` with a time to live: an expired value is not folded into (the new
    value starts afresh), as in Flink's ``TtlReducingState``."""

    kind = "reducing"

    @staticmethod
    def wrap_reduce(
        reduce_fn: Callable[[Any, Any], Any], config: StateTtlConfig, clock: Clock
    ) -> Callable[[Any, Any], Any]:
        ttl = config.ttl_ms

        def reduce(old: tuple[Any, int], new: tuple[Any, int]) -> tuple[Any, int]:
            if new[1] - old[1] >= ttl:
                return new
            return (reduce_fn(old[0], new[0]), new[1])

        return reduce

    def __init__(
        self,
        backend: KeyedStateBackend,
        inner: ReducingState,
        config: StateTtlConfig,
        clock: Clock,
        aggregate: Callable[[Any, Any, str], tuple[pa.Array, pa.Array]],
    ) -> None:
        super().__init__(backend, inner, config, clock)
        self._aggregate = aggregate

    def _raw(self) -> tuple[Any, int] | None:
        raw: tuple[Any, int] | None = self._inner.get()
        return raw

    def get(self) -> T | None:
        now = self._clock()
        value = self._live(self._raw(), now)
        self._cleanup()
        if value is _MISSING:
            return None
        if self._on_read:
            self._inner.clear()
            self._inner.add((value, now))
        result: T = value
        return result

    def add(self, value: T) -> None:
        self._inner.add((value, self._clock()))
        self._cleanup()

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        now = self._clock()
        values, _ = self._live_many(keys, key_groups, self._inner.get_many(keys, key_groups), now)
        self._cleanup(_accesses(len(values)))
        return [None if v is _MISSING else v for v in values]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        now = self._clock()
        self._inner.add_many(keys, [(v, now) for v in _pylist(values)], key_groups)
        self._cleanup(_accesses(len(values)))

    def add_batch(self, keys: Any, values: Any = None, agg: str = "sum") -> int:
        distinct, partials = self._aggregate(keys, values, agg)
        self.add_many(distinct, partials)
        return len(distinct)


class TtlAggregatingState(_TtlSingle, Generic[T]):
    """``AggregatingState`` with a time to live: an expired accumulator is replaced by a new one
    before the next value is folded in."""

    kind = "aggregating"

    @staticmethod
    def wrap_functions(
        add_fn: Callable[[Any, Any], Any],
        create_accumulator: Callable[[], Any],
        config: StateTtlConfig,
        clock: Clock,
    ) -> tuple[Callable[[Any, Any], Any], Callable[[Any], Any], Callable[[], Any]]:
        ttl = config.ttl_ms

        def add(value: Any, wrapped: tuple[Any, int] | None) -> tuple[Any, int]:
            now = clock()
            acc = create_accumulator() if wrapped is None or now - wrapped[1] >= ttl else wrapped[0]
            return (add_fn(value, acc), now)

        def identity(wrapped: Any) -> Any:
            return wrapped

        def create() -> None:
            return None  # "no accumulator yet": add() creates it with its timestamp

        return add, identity, create

    def __init__(
        self,
        backend: KeyedStateBackend,
        inner: AggregatingState,
        config: StateTtlConfig,
        clock: Clock,
        get_result_fn: Callable[[Any], T],
    ) -> None:
        super().__init__(backend, inner, config, clock)
        self._result = get_result_fn

    def _raw(self) -> tuple[Any, int] | None:
        raw: tuple[Any, int] | None = self._inner.get()
        return raw

    def get(self) -> T | None:
        now = self._clock()
        acc = self._live(self._raw(), now)
        self._cleanup()
        return None if acc is _MISSING else self._result(acc)

    def add(self, value: Any) -> None:
        self._inner.add(value)
        self._cleanup()

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        now = self._clock()
        accs, _ = self._live_many(keys, key_groups, self._inner.get_many(keys, key_groups), now)
        self._cleanup(_accesses(len(accs)))
        result = self._result
        return [None if a is _MISSING else result(a) for a in accs]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        self._inner.add_many(keys, values, key_groups)
        self._cleanup(_accesses(len(values)))


class TtlListState(_Ttl, Generic[T]):
    """``ListState`` with a time to live per element (Flink's ``TtlListState``)."""

    kind = "list"

    def __init__(
        self,
        backend: KeyedStateBackend,
        inner: ListState,
        config: StateTtlConfig,
        clock: Clock,
    ) -> None:
        super().__init__(backend, inner, config, clock)

    def _purge_current(self, now: int) -> None:
        stored = self._inner.get()
        live = [e for e in stored if not self._expired(e[1], now)]
        if len(live) != len(stored):
            self._inner.update(live)

    def get(self) -> list[T]:
        now = self._clock()
        stored = self._inner.get()
        live = [e for e in stored if not self._expired(e[1], now)]
        if self._on_read and live:
            live = [(v, now) for v, _ in live]
            self._inner.update(live)
        elif len(live) != len(stored):
            self._inner.update(live)
        self._cleanup()
        return [v for v, _ in live]

    def add(self, value: T) -> None:
        self._inner.add((value, self._clock()))
        self._cleanup()

    def add_all(self, values: Iterable[T]) -> None:
        now = self._clock()
        self._inner.add_all([(v, now) for v in values])
        self._cleanup()

    def update(self, values: Iterable[T]) -> None:
        now = self._clock()
        self._inner.update([(v, now) for v in values])
        self._cleanup()


class TtlMapState(_Ttl):
    """``MapState`` with a time to live per entry (Flink's ``TtlMapState``)."""

    kind = "map"

    def __init__(
        self, backend: KeyedStateBackend, inner: MapState, config: StateTtlConfig, clock: Clock
    ) -> None:
        super().__init__(backend, inner, config, clock)

    def _purge_current(self, now: int) -> None:
        for user_key, (_, ts) in self._inner.items():
            if self._expired(ts, now):
                self._inner.remove(user_key)

    def _live_items(self) -> list[tuple[Any, Any]]:
        now = self._clock()
        out = []
        for user_key, (value, ts) in self._inner.items():
            if self._expired(ts, now):
                self._inner.remove(user_key)
            else:
                out.append((user_key, value))
                if self._on_read:
                    self._inner.put(user_key, (value, now))
        self._cleanup()
        return out

    def get(self, user_key: Any, default: Any = None) -> Any:
        now = self._clock()
        raw = self._inner.get(user_key, _MISSING)
        self._cleanup()
        if raw is _MISSING:
            return default
        if self._expired(raw[1], now):
            self._inner.remove(user_key)
            return default
        if self._on_read:
            self._inner.put(user_key, (raw[0], now))
        return raw[0]

    def contains(self, user_key: Any) -> bool:
        return self.get(user_key, _MISSING) is not _MISSING

    def get_all(self, user_keys: Sequence[Any]) -> list[Any]:
        now = self._clock()
        out: list[Any] = []
        refreshed: dict[Any, Any] = {}
        for user_key, raw in zip(user_keys, self._inner.get_all(user_keys), strict=True):
            if raw is None:
                out.append(None)
            elif self._expired(raw[1], now):
                self._inner.remove(user_key)
                out.append(None)
            else:
                out.append(raw[0])
                if self._on_read:
                    refreshed[user_key] = (raw[0], now)
        if refreshed:
            self._inner.put_all(refreshed)
        self._cleanup()
        return out

    def put(self, user_key: Any, value: Any) -> None:
        self._inner.put(user_key, (value, self._clock()))
        self._cleanup()

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        now = self._clock()
        self._inner.put_all({k: (v, now) for k, v in entries.items()})
        self._cleanup()

    def remove(self, user_key: Any) -> None:
        self._inner.remove(user_key)
        self._cleanup()

    def keys(self) -> list[Any]:
        return [k for k, _ in self._live_items()]

    def values(self) -> list[Any]:
        return [v for _, v in self._live_items()]

    def items(self) -> list[tuple[Any, Any]]:
        return self._live_items()

    def is_empty(self) -> bool:
        return not self._live_items()


Clock = Callable[[], int]


def _accesses(n: int) -> int:
    """Clean-up steps a bulk call of ``n`` keys pays for: one per 64 keys (at least one), so
    the clean-up stays a small fraction of the bulk work."""
    return max(1, n // 64)


def _pylist(values: Any) -> list[Any]:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.to_pylist()
    if hasattr(values, "tolist") and not isinstance(values, list | tuple):
        return list(values.tolist())
    return list(values)

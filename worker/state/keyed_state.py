"""The keyed state types: value, list, map, reducing and aggregating state, per key group.

Each registered state stores, per key group, a dict ``key -> value`` (:class:`StateTable`).
Record-at-a-time operators call ``KeyedStateBackend.set_current_key`` (the key group is
computed once) and then use the states; vectorised operators use the bulk methods
(``get_many`` / ``update_many`` / ``add_many`` / :meth:`ReducingState.add_batch`), which
pre-aggregate an Arrow batch with Arrow kernels (:func:`aggregate_batch`) and touch the state
once per distinct key.

Values are stored by reference. Values of value/reducing state and elements of lists and maps
must be treated as immutable once stored (replace them with ``update`` / ``put``);
``reduce_fn`` must return a new value instead of mutating its arguments. Aggregating
accumulators may be mutated in place by ``add_fn``: they are deep-copied before the first
change after a snapshot.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from snapflow.errors import StateError
from snapflow.worker.state.errors import no_current_key
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.ttl import TTL_KINDS

__all__ = [
    "STATE_KINDS",
    "AggregatingState",
    "KeyContext",
    "ListState",
    "MapState",
    "ReducingState",
    "StateTable",
    "ValueState",
    "aggregate_batch",
    "check_lengths",
    "pylist",
]

T = TypeVar("T")

STATE_KINDS = {"value", "list", "map", "reducing", "aggregating", *TTL_KINDS}
"""The kinds a keyed state may be registered (and restored) as."""


class KeyContext(Protocol):
    """What the state types and the timer service use of their keyed backend: its current key
    and the resolution of bulk keys. A protocol, so that they sit below ``KeyedStateBackend``
    without an import cycle; the backend's own fields are read directly (the per-record path)."""

    key_group_range: KeyGroupRange
    _current_key: Any
    _current_idx: int

    def resolve_keys(self, keys: Any, key_groups: Any = None) -> tuple[list[Any], list[int]]: ...

    def runs_by_key_group(
        self, keys: Any, values: Any, key_groups: Any = None
    ) -> Iterator[tuple[int, list[Any], list[Any]]]: ...


_MISSING: Any = object()


class StateTable:
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


def pylist(values: Any) -> list[Any]:
    """``values`` as a list of Python objects (Arrow and numpy arrays converted)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.to_pylist()
    if hasattr(values, "__array__") and not isinstance(values, list | tuple):
        with suppress(pa.ArrowException, TypeError, ValueError):
            return pa.array(values).to_pylist()
    return list(values)


class _KeyedState:
    kind = ""

    def __init__(self, backend: KeyContext, table: StateTable) -> None:
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
            raise no_current_key()
        t = self._table
        if b._current_key in t.maps[idx]:
            t.writable(idx).pop(b._current_key, None)

    def __len__(self) -> int:
        return len(self._table)

    def _pop_many(self, keys: Any, key_groups: Any) -> list[Any]:
        """Each key's entry, removed (None for a key without one, so for a repeated key after
        its first): the bulk read-and-clear of a firing."""
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        t = self._table
        maps = t.maps
        return [
            t.writable(i).pop(k) if k in maps[i] else None
            for k, i in zip(pykeys, idxs, strict=True)
        ]


class ValueState(_KeyedState, Generic[T]):
    """One value per key (Flink's ``ValueState``)."""

    kind = "value"

    def __init__(self, backend: KeyContext, table: StateTable, default: T | None) -> None:
        super().__init__(backend, table)
        self._default = default

    def value(self) -> T | None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        return self._table.maps[idx].get(b._current_key, self._default)

    def update(self, value: T | None) -> None:
        """Set the current key's value; ``None`` clears it (as in Flink)."""
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
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


def check_lengths(keys: Sequence[Any], values: Sequence[Any]) -> None:
    if len(keys) != len(values):
        raise StateError(f"{len(keys)} keys but {len(values)} values")


class ListState(_KeyedState, Generic[T]):
    """A list per key (Flink's ``ListState``)."""

    kind = "list"

    def _current(self) -> tuple[Any, int]:
        b = self._backend
        if b._current_idx < 0:
            raise no_current_key()
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

    def pop_many(self, keys: Any, key_groups: Any = None) -> list[list[T]]:
        """The lists of ``keys`` (empty if none), each key cleared (a repeated key: empty after
        its first): a fired window's rows read and dropped in one pass."""
        return [[] if v is None else list(v) for v in self._pop_many(keys, key_groups)]

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
            raise no_current_key()
        return b._current_key, b._current_idx

    def _map(self) -> dict[Any, Any]:
        key, idx = self._current()
        m: dict[Any, Any] = self._table.maps[idx].get(key, {})
        return m

    def get(self, user_key: Any, default: Any = None) -> Any:
        return self._map().get(user_key, default)

    def contains(self, user_key: Any) -> bool:
        return user_key in self._map()

    def get_all(self, user_keys: Sequence[Any]) -> list[Any]:
        """The values of ``user_keys`` in the current key's map, None where absent (one
        multi-get on RocksDB): the bulk lookup of a vectorised function."""
        m = self._map()
        return [m.get(k) for k in user_keys]

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
        self, backend: KeyContext, table: StateTable, reduce_fn: Callable[[T, T], T]
    ) -> None:
        super().__init__(backend, table)
        self._reduce = reduce_fn

    def get(self) -> T | None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        return self._table.maps[idx].get(b._current_key)

    def add(self, value: T) -> None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        t = self._table
        m = t.writable(idx) if t.shared[idx] else t.maps[idx]
        key = b._current_key
        old = m.get(key, _MISSING)
        m[key] = value if old is _MISSING else self._reduce(old, value)

    def get_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        maps = self._table.maps
        return [maps[i].get(k) for k, i in zip(pykeys, idxs, strict=True)]

    def pop_many(self, keys: Any, key_groups: Any = None) -> list[T | None]:
        """The values of ``keys``, each key cleared (a repeated key: None after its first):
        a fired window's aggregate read and dropped in one pass."""
        return self._pop_many(keys, key_groups)

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        """Fold ``values[i]`` into the state of ``keys[i]``, in order. With distinct keys (e.g.
        the output of :func:`aggregate_batch`) every key is touched once."""
        pykeys, idxs = self._backend.resolve_keys(keys, key_groups)
        vals = pylist(values)
        check_lengths(pykeys, vals)
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
        backend: KeyContext,
        table: StateTable,
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
            raise no_current_key()
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
            raise no_current_key()
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
        vals = pylist(values)
        check_lengths(pykeys, vals)
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

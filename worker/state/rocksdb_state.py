"""The keyed states of the RocksDB backend (``rocksdb_backend.py``): value, reducing and
aggregating states read and write through the backend's write-back cache of decoded values;
list and map states go to RocksDB directly. Entries are laid out as ``rocksdb_layout.py`` says.

The states reach their backend through :class:`RocksStore`, a protocol, so that this module
sits below the backend without an import cycle; the per-record path reads the backend's fields
directly, as the heap backend's states do (``keyed_state.KeyContext``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, cast

import numpy as np
import rocksdict

from snapflow.worker.state.errors import no_current_key
from snapflow.worker.state.keyed_state import (
    AggregatingState,
    KeyContext,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    check_lengths,
    pylist,
)
from snapflow.worker.state.rocksdb_layout import (
    KG,
    LEN32,
    decode_key,
    encode_key,
    encode_value,
    prefix_end,
    state_tag,
)

__all__ = [
    "ABSENT",
    "MISS",
    "RocksAggregatingState",
    "RocksListState",
    "RocksMapState",
    "RocksReducingState",
    "RocksStore",
    "RocksTable",
    "RocksValueState",
]

ABSENT: Any = object()  # cached: the key has no value
MISS: Any = object()  # not in the cache


class RocksTable:
    """One registered state: its name, kind and key prefix per key group of the backend."""

    __slots__ = ("_int_layout", "kind", "name", "prefixes")

    def __init__(self, name: str, kind: str, start: int, n: int) -> None:
        self.name = name
        self.kind = kind
        tag = state_tag(name)
        self.prefixes = [KG.pack(start + i) + tag for i in range(n)]
        self._int_layout: tuple[np.dtype[Any], np.ndarray[Any, Any]] | None = None

    def int_keys(self, idxs: np.ndarray[Any, Any], keys: np.ndarray[Any, Any]) -> list[bytes]:
        """Database keys of int64 keys, vectorised: the same bytes as ``prefix + encode_key(k)``."""
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


class RocksStore(KeyContext, Protocol):
    """What the states use of their backend (``RocksDBKeyedStateBackend``): the database, the
    write-back cache and the key encoding of bulk calls."""

    db: rocksdict.Rdict
    cache: dict[bytes, Any]
    """Decoded values by database key (``ABSENT``: no value); flushed by the backend."""
    dirty: set[bytes]
    """Keys of the cache not yet written to the database."""

    def db_keys(self, table: RocksTable, keys: Any, key_groups: Any) -> list[bytes]: ...

    def cached_get(self, key: bytes) -> Any: ...

    def cached_get_many(self, keys: Sequence[bytes]) -> list[Any]: ...

    def cached_pop_many(self, keys: Sequence[bytes]) -> list[Any]: ...

    def cached_put(self, key: bytes, value: Any) -> None: ...

    def cached_put_many(self, keys: Sequence[bytes], values: Sequence[Any]) -> None: ...

    def fold_many(
        self, keys: Sequence[bytes], values: Sequence[Any], fold: Callable[[Any, Any], Any]
    ) -> None: ...

    def prefetch(self, keys: Sequence[bytes]) -> None: ...

    def maybe_evict(self) -> None: ...

    def delete_key(self, key: bytes, kind: str) -> None: ...

    def scan(self, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def count_keys(self, table: RocksTable) -> int: ...


class _RocksStateMixin:
    _table: Any

    @property
    def _rocks(self) -> RocksStore:
        return cast(RocksStore, self._backend)  # type: ignore[attr-defined]

    def _key(self) -> bytes:
        b = self._rocks
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        prefix: bytes = self._table.prefixes[idx]
        return prefix + encode_key(b._current_key)

    @property
    def name(self) -> str:
        return str(self._table.name)

    def clear(self) -> None:
        self._rocks.delete_key(self._key(), self._table.kind)

    def __len__(self) -> int:
        return self._rocks.count_keys(self._table)


class RocksValueState(_RocksStateMixin, ValueState[Any]):
    def value(self) -> Any:
        v = self._rocks.cached_get(self._key())
        return self._default if v is ABSENT else v

    def update(self, value: Any) -> None:
        b = self._rocks
        b.cached_put(self._key(), ABSENT if value is None else value)

    def get_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        default = self._default
        return [
            default if v is ABSENT else v
            for v in self._rocks.cached_get_many(self._rocks.db_keys(self._table, keys, key_groups))
        ]

    def update_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        dbkeys = self._rocks.db_keys(self._table, keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        self._rocks.cached_put_many(dbkeys, [ABSENT if v is None else v for v in vals])


class RocksReducingState(_RocksStateMixin, ReducingState[Any]):
    def get(self) -> Any:
        v = self._rocks.cached_get(self._key())
        return None if v is ABSENT else v

    def add(self, value: Any) -> None:
        b, key = self._rocks, self._key()
        old = b.cached_get(key)
        b.cached_put(key, value if old is ABSENT else self._reduce(old, value))

    def get_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        return [
            None if v is ABSENT else v
            for v in self._rocks.cached_get_many(self._rocks.db_keys(self._table, keys, key_groups))
        ]

    def pop_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        return [
            None if v is ABSENT else v
            for v in self._rocks.cached_pop_many(self._rocks.db_keys(self._table, keys, key_groups))
        ]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        dbkeys = self._rocks.db_keys(self._table, keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        fn = self._reduce
        self._rocks.fold_many(dbkeys, vals, lambda old, v: v if old is ABSENT else fn(old, v))

    def fold_and_get_distinct(
        self, keys: Any, values: Any, key_groups: Any, reduce_fn: Callable[[Any, Any], Any]
    ) -> list[Any]:
        """``add_many`` then ``get_many`` in one pass over the cache (the keyed count's hot
        path, ``keyed_operators.fold_and_get``): one key encoding, hits folded in place, every miss
        read with one multi-get and folded after (in order, so a repeated key sees its earlier
        fold)."""
        b = self._rocks
        dbkeys = self._rocks.db_keys(self._table, keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        cache = b.cache
        out: list[Any] = []
        append = out.append
        absent, miss = ABSENT, MISS
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
            b.prefetch([dbkeys[i] for i in misses])  # one multi-get into the cache
            for i in misses:  # in order: a repeated key sees its earlier fold
                k, v = dbkeys[i], vals[i]
                old = cache[k]
                new = v if old is absent else reduce_fn(old, v)
                cache[k] = new
                out[i] = new
        b.dirty.update(dbkeys)
        b.maybe_evict()
        return out


class RocksAggregatingState(_RocksStateMixin, AggregatingState[Any]):
    def get(self) -> Any:
        acc = self._rocks.cached_get(self._key())
        return None if acc is ABSENT else self._result(acc)

    def _fold_one(self, acc: Any, value: Any) -> Any:
        return self._add(value, self._create() if acc is ABSENT else acc)

    def add(self, value: Any) -> None:
        b, key = self._rocks, self._key()
        b.cached_put(key, self._fold_one(b.cached_get(key), value))

    def get_many(self, keys: Any, key_groups: Any = None) -> list[Any]:
        result = self._result
        return [
            None if a is ABSENT else result(a)
            for a in self._rocks.cached_get_many(self._rocks.db_keys(self._table, keys, key_groups))
        ]

    def add_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        dbkeys = self._rocks.db_keys(self._table, keys, key_groups)
        vals = pylist(values)
        check_lengths(dbkeys, vals)
        self._rocks.fold_many(dbkeys, vals, self._fold_one)


class RocksListState(_RocksStateMixin, ListState[Any]):
    """The whole list is one value: ``add`` reads and rewrites it (RocksDB's merge operator,
    which Flink uses for lists, is not exposed by rocksdict)."""

    def _stored(self, key: bytes) -> list[Any]:
        raw = self._rocks.db.get(key)
        return [] if raw is None else list(pickle.loads(raw))

    def get(self) -> list[Any]:
        return self._stored(self._key())

    def add(self, value: Any) -> None:
        key = self._key()
        lst = self._stored(key)
        lst.append(value)
        self._rocks.db.put(key, encode_value(lst))

    def add_all(self, values: Iterable[Any]) -> None:
        new = list(values)
        if not new:
            return
        key = self._key()
        self._rocks.db.put(key, encode_value(self._stored(key) + new))

    def update(self, values: Iterable[Any]) -> None:
        key = self._key()
        new = list(values)
        if new:
            self._rocks.db.put(key, encode_value(new))
        else:
            self._rocks.db.delete(key)

    def pop_many(self, keys: Any, key_groups: Any = None) -> list[list[Any]]:
        """One multi-get and one write batch of deletions for every key."""
        dbkeys = self._rocks.db_keys(self._table, keys, key_groups)
        if not dbkeys:
            return []
        db = self._rocks.db
        raws = cast(list[bytes | None], db.get(cast(Any, dbkeys)))
        batch = rocksdict.WriteBatch(raw_mode=True)
        out: list[list[Any]] = []
        seen: set[bytes] = set()
        for key, raw in zip(dbkeys, raws, strict=True):
            if raw is None or key in seen:
                out.append([])
                continue
            seen.add(key)
            out.append(list(pickle.loads(raw)))
            batch.delete(key)
        if seen:
            db.write(batch)
        return out


class RocksMapState(_RocksStateMixin, MapState):
    """One database entry per user key, under the key's own prefix."""

    def _map_prefix(self) -> bytes:
        b = self._rocks
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        encoded = encode_key(b._current_key)
        prefix: bytes = self._table.prefixes[idx]
        return prefix + LEN32.pack(len(encoded)) + encoded

    def _scan(self) -> Iterator[tuple[bytes, bytes]]:
        prefix = self._map_prefix()
        return self._rocks.scan(prefix, prefix_end(prefix))

    def get(self, user_key: Any, default: Any = None) -> Any:
        raw = self._rocks.db.get(self._map_prefix() + encode_key(user_key))
        return default if raw is None else pickle.loads(raw)

    def contains(self, user_key: Any) -> bool:
        return self._rocks.db.get(self._map_prefix() + encode_key(user_key)) is not None

    def get_all(self, user_keys: Sequence[Any]) -> list[Any]:
        if not user_keys:
            return []
        prefix = self._map_prefix()
        raws = cast(
            list[bytes | None],
            self._rocks.db.get(cast(Any, [prefix + encode_key(k) for k in user_keys])),
        )
        loads = pickle.loads
        return [None if raw is None else loads(raw) for raw in raws]

    def put(self, user_key: Any, value: Any) -> None:
        self._rocks.db.put(self._map_prefix() + encode_key(user_key), encode_value(value))

    def put_all(self, entries: Any) -> None:
        if not entries:
            return
        prefix = self._map_prefix()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for k, v in entries.items():
            batch.put(prefix + encode_key(k), encode_value(v))
        self._rocks.db.write(batch)

    def remove(self, user_key: Any) -> None:
        self._rocks.db.delete(self._map_prefix() + encode_key(user_key))

    def clear(self) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, _ in self._scan():
            batch.delete(key)
        self._rocks.db.write(batch)

    def items(self) -> list[tuple[Any, Any]]:
        n = len(self._map_prefix())
        return [(decode_key(k[n:]), pickle.loads(v)) for k, v in self._scan()]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def is_empty(self) -> bool:
        return next(iter(self._scan()), None) is None

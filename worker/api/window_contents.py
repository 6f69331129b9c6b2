"""How a window keeps what its records gave it, in keyed state under ``(key, window)`` (the
window is the namespace; the entry lives in the key's key group, so it is snapshotted and
redistributed with the key):

* :class:`BuiltinAggContents`: ``sum``/``count``/``min``/``max`` in ``ReducingState``, each
  batch pre-aggregated per ``(key, window)`` with Arrow's hash aggregation first (one state
  update per distinct window and batch);
* :class:`AggregateContents`: the accumulator of an ``AggregateFunction`` (Flink's
  incremental aggregation), folded row by row;
* :class:`RowsContents`: every row, as Arrow batches in ``ListState`` (Flink's
  ``ListState`` of a ``ProcessWindowFunction``), one batch per window and input batch.

The window operator groups a batch's rows per window with :attr:`WindowContents.aggregations`
(over the columns ``"v"``, the values, and ``"r"``, the row indices) and hands each contents
the grouped table.
"""

from __future__ import annotations

import copy
import operator as _op
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.functions import AggregateFunction
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import ListState, ReducingState, ValueState

__all__ = [
    "BUILTIN_AGGS",
    "AggregateContents",
    "BuiltinAggContents",
    "RowsContents",
    "WindowContents",
]

BUILTIN_AGGS: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    # name: (Arrow hash aggregation, reduce function of the state)
    "sum": ("sum", _op.add),
    "count": ("count_all", _op.add),
    "min": ("min", min),
    "max": ("max", max),
}


class WindowContents:
    """One input's contents of every window of an operator."""

    value_field: str | None = None
    """The column the operator passes as ``"v"`` (None: none)."""

    _backend: KeyedStateBackend
    _state: Any

    def __getstate__(self) -> dict[str, Any]:
        # the backend and the state exist only while running (set in open)
        return {k: v for k, v in self.__dict__.items() if k not in ("_backend", "_state")}

    def open(self, backend: KeyedStateBackend, state_name: str) -> None:
        self._backend = backend
        self._state = self._create_state(backend, state_name)

    def _create_state(self, backend: KeyedStateBackend, state_name: str) -> Any:
        """The keyed state that holds the contents, named ``state_name``."""
        raise NotImplementedError

    @property
    def state_name(self) -> str:
        name: str = self._state.name
        return name

    def aggregations(self) -> list[Any]:
        """Arrow hash aggregations per window over ``"v"``/``"r"``; their output columns, in
        order, are what :meth:`add` reads."""
        return [("r", "list")]

    def note_types(self, values: pa.DataType | None) -> None:
        """The value column's type, seen in the first batch."""

    def add(
        self,
        composites: list[Any],
        key_groups: list[int],
        grouped: pa.Table,
        batch: pa.RecordBatch,
    ) -> None:
        """Add the rows of ``batch`` grouped per window (``composites[i]`` = ``(key, window)``
        of row i of ``grouped``)."""
        raise NotImplementedError

    # The window operator passes ``composites`` as an iterator (``zip(keys, windows)``): the
    # ``(key, window)`` tuples of a watermark's many windows then never live all at once.

    def results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        """Each window's result (None: the window holds nothing of this input)."""
        raise NotImplementedError

    def take_results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        """:meth:`results`, clearing the windows (they fired for the last time)."""
        listed = list(composites)
        out = self.results(listed, key_groups)
        self.clear_many(listed, key_groups)
        return out

    def move(self, source: Any, target: Any, key_group: int) -> None:
        """Merge window ``source``'s contents into ``target``'s (sessions) and clear it."""
        raise NotImplementedError

    def clear(self, composite: Any, key_group: int) -> None:
        raise NotImplementedError

    def clear_many(self, composites: Iterable[Any], key_groups: Sequence[int]) -> None:
        for composite, group in zip(composites, key_groups, strict=True):
            self.clear(composite, group)

    def result_type(self) -> pa.DataType | None:
        return None


class BuiltinAggContents(WindowContents):
    """A built-in aggregation ``agg`` of ``value_field`` (unused by ``count``)."""

    _backend: KeyedStateBackend
    _state: ReducingState[Any]

    def __init__(self, agg: str, value_field: str | None) -> None:
        if agg not in BUILTIN_AGGS:
            raise InvalidArgumentError(f"agg must be one of {sorted(BUILTIN_AGGS)}, got {agg!r}")
        if agg != "count" and not value_field:
            raise InvalidArgumentError(f"agg {agg!r} needs a value_field")
        self.agg = agg
        self.value_field = value_field if agg != "count" else None
        self._value_type: pa.DataType | None = pa.int64() if agg == "count" else None

    def _create_state(self, backend: KeyedStateBackend, state_name: str) -> Any:
        return backend.get_reducing_state(state_name, BUILTIN_AGGS[self.agg][1])

    def aggregations(self) -> list[Any]:
        if self.value_field is None:
            return [([], "count_all")]
        return [("v", BUILTIN_AGGS[self.agg][0])]

    def note_types(self, values: pa.DataType | None) -> None:
        if self._value_type is None and values is not None:
            if self.agg == "sum":
                self._value_type = pa.float64() if pa.types.is_floating(values) else pa.int64()
            else:
                self._value_type = values

    def add(
        self,
        composites: list[Any],
        key_groups: list[int],
        grouped: pa.Table,
        batch: pa.RecordBatch,
    ) -> None:
        self._state.add_many(composites, grouped.column(grouped.num_columns - 1), key_groups)

    def results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        return self._state.get_many(list(composites), key_groups=key_groups)

    def take_results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        # one bulk read-and-clear (on RocksDB one multi-get): a watermark may fire hundreds of
        # thousands of windows, and a barrier waits behind their firing
        return self._state.pop_many(list(composites), key_groups=key_groups)

    def move(self, source: Any, target: Any, key_group: int) -> None:
        backend, state = self._backend, self._state
        backend.set_current_key(source, key_group)
        value = state.get()
        if value is None:
            return
        state.clear()
        backend.set_current_key(target, key_group)
        state.add(value)

    def clear(self, composite: Any, key_group: int) -> None:
        self._backend.set_current_key(composite, key_group)
        self._state.clear()

    def clear_many(self, composites: Iterable[Any], key_groups: Sequence[int]) -> None:
        set_key, clear = self._backend.set_current_key, self._state.clear
        for composite, group in zip(composites, key_groups, strict=True):
            set_key(composite, group)
            clear()

    def result_type(self) -> pa.DataType | None:
        return self._value_type


class AggregateContents(WindowContents):
    """An :class:`AggregateFunction`'s accumulator per window: every row's ``value_field``
    (the row as a ``dict`` when None) is folded in with ``function.add``, in arrival order."""

    _backend: KeyedStateBackend
    _state: ValueState[Any]

    def __init__(
        self,
        function: AggregateFunction,
        value_field: str | None = None,
        result_type: pa.DataType | None = None,
    ) -> None:
        if not isinstance(function, AggregateFunction):
            raise InvalidArgumentError(
                f"an AggregateFunction is needed (or a built-in name), got {function!r:.80}"
            )
        self.function = function
        self.value_field = value_field
        self._result_type = result_type

    def _create_state(self, backend: KeyedStateBackend, state_name: str) -> Any:
        return backend.get_value_state(state_name)

    def _accumulator(self) -> Any:
        # a copy: a snapshot may still be reading the stored one (copy on write)
        acc = self._state.value()
        return self.function.create_accumulator() if acc is None else copy.deepcopy(acc)

    def add(
        self,
        composites: list[Any],
        key_groups: list[int],
        grouped: pa.Table,
        batch: pa.RecordBatch,
    ) -> None:
        fn, backend, state = self.function, self._backend, self._state
        values: list[Any] = (
            batch.to_pylist()
            if self.value_field is None
            else batch.column(batch.schema.get_field_index(self.value_field)).to_pylist()
        )
        row_lists = grouped.column(grouped.num_columns - 1).to_pylist()
        for composite, group, rows in zip(composites, key_groups, row_lists, strict=True):
            backend.set_current_key(composite, group)
            acc = self._accumulator()
            for r in rows:
                acc = fn.add(values[r], acc)
            state.update(acc)

    def results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        accs = self._state.get_many(list(composites), key_groups=list(key_groups))
        fn = self.function
        return [None if acc is None else fn.get_result(acc) for acc in accs]

    def move(self, source: Any, target: Any, key_group: int) -> None:
        backend, state = self._backend, self._state
        backend.set_current_key(source, key_group)
        acc = state.value()
        if acc is None:
            return
        state.clear()
        backend.set_current_key(target, key_group)
        other = state.value()
        state.update(
            acc if other is None else self.function.merge(copy.deepcopy(other), copy.deepcopy(acc))
        )

    def clear(self, composite: Any, key_group: int) -> None:
        self._backend.set_current_key(composite, key_group)
        self._state.clear()

    def result_type(self) -> pa.DataType | None:
        return self._result_type


class RowsContents(WindowContents):
    """Every row of the window (for a ``ProcessWindowFunction`` or a co-group)."""

    _backend: KeyedStateBackend
    _state: ListState[Any]

    def _create_state(self, backend: KeyedStateBackend, state_name: str) -> Any:
        return backend.get_list_state(state_name)

    def add(
        self,
        composites: list[Any],
        key_groups: list[int],
        grouped: pa.Table,
        batch: pa.RecordBatch,
    ) -> None:
        backend, state = self._backend, self._state
        row_lists = grouped.column(grouped.num_columns - 1)
        for i, (composite, group) in enumerate(zip(composites, key_groups, strict=True)):
            backend.set_current_key(composite, group)
            # take: compact buffers, so the state never pickles the whole input batch
            state.add(batch.take(row_lists[i].values))

    def _rows(self) -> pa.RecordBatch | None:
        pieces = self._state.get()
        if not pieces:
            return None
        return pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)

    def results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        out = []
        for composite, group in zip(composites, key_groups, strict=True):
            self._backend.set_current_key(composite, group)
            out.append(self._rows())
        return out

    def take_results(self, composites: Iterable[Any], key_groups: Sequence[int]) -> list[Any]:
        # one bulk read-and-clear (on RocksDB one multi-get and one write batch)
        return [
            None if not pieces else pieces[0] if len(pieces) == 1 else pa.concat_batches(pieces)
            for pieces in self._state.pop_many(list(composites), key_groups=key_groups)
        ]

    def move(self, source: Any, target: Any, key_group: int) -> None:
        backend, state = self._backend, self._state
        backend.set_current_key(source, key_group)
        pieces = state.get()
        if not pieces:
            return
        pieces = list(pieces)
        state.clear()
        backend.set_current_key(target, key_group)
        state.add_all(pieces)

    def clear(self, composite: Any, key_group: int) -> None:
        self._backend.set_current_key(composite, key_group)
        self._state.clear()

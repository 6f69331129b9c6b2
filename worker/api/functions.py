"""User functions with a lifecycle and a runtime context; keyed functions with state.

* :class:`RichFunction`: any function object passed to ``map``, ``filter``, ``flat_map``,
  ``map_batches``, ``filter_batches``, ``flat_map_batches`` or a keyed process may subclass it:
  its ``open(ctx)`` runs once per subtask before the first record, with a
  :class:`RuntimeContext` (subtask index, parallelism, attempt number, metrics, and keyed state
  on a keyed vertex), and ``close()`` when the task ends (PyFlink's ``open(runtime_context)`` /
  ``close()``).
* :class:`KeyedProcessFunction`: record at a time, as in Flink: ``process_element(row, ctx)``
  per row with the row's key as the current key of ``ctx`` (a
  :class:`KeyedContext`: state and event-time timers), and
  ``on_timer(timestamp, ctx)``. Both return (or yield) output rows as dicts.
* :class:`KeyedBatchFunction`: vectorised: ``process_batch(batch, ctx)`` once per input batch
  (every row belongs to this subtask's key groups), with the bulk state API on ``ctx``
  (:class:`KeyedBatchContext`: ``get_value_state(name).get_many(keys)`` /
  ``update_many(keys, values)``; ``ctx.key_groups`` spares the re-hashing) and bulk timers;
  ``on_timers(timers, ctx)`` gets the due timers as one batch (``key``, ``timestamp``).

A function's metrics (``ctx.metrics``) are in :mod:`snapflow.worker.api.function_metrics`;
pandas conversions at the edge of a batch function in :mod:`snapflow.worker.api.pandas_batches`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.api.function_metrics import MetricGroup
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)

# ---------------------------------------------------------------------------------------------
# Keyed context and aggregate functions (used by snapflow.worker.api.keyed_operators)
# ---------------------------------------------------------------------------------------------


class AggregateFunction:
    """Flink's ``AggregateFunction``: ``create_accumulator() -> acc``, ``add(value, acc) ->
    acc`` (may mutate and return ``acc``), ``get_result(acc) -> result``, and ``merge(a, b)``
    for session windows. Subclass it, or build one from functions with :meth:`of`."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """One accumulator of two (session windows merge theirs); may mutate and return
        ``a`` or ``b``."""
        raise InvalidArgumentError(
            f"{type(self).__name__} has no merge(a, b): session windows merge accumulators, "
            f"so implement merge (or pass merge= to AggregateFunction.of)"
        )

    @staticmethod
    def of(
        create_accumulator: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        get_result: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any] | None = None,
    ) -> AggregateFunction:
        return _FnAggregate(create_accumulator, add, get_result, merge)


class _FnAggregate(AggregateFunction):
    def __init__(
        self,
        create_accumulator: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        get_result: Callable[[Any], Any],
        merge: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self._create, self._add, self._result = create_accumulator, add, get_result
        self._merge = merge

    def create_accumulator(self) -> Any:
        return self._create()

    def add(self, value: Any, accumulator: Any) -> Any:
        return self._add(value, accumulator)

    def get_result(self, accumulator: Any) -> Any:
        return self._result(accumulator)

    def merge(self, a: Any, b: Any) -> Any:
        if self._merge is None:
            return super().merge(a, b)
        return self._merge(a, b)


class _KeyedStateAccess:
    """What both keyed contexts share: an operator's keyed state, by names scoped to the
    operator (each state object created once), its timers' namespace and the watermark."""

    def __init__(self, backend: KeyedStateBackend, ctx: OperatorContext) -> None:
        self._backend = backend
        self._ctx = ctx
        self._states: dict[tuple[str, str], Any] = {}
        self._namespace = (ctx.operator_id, None)  # timers of this operator

    @property
    def current_watermark(self) -> int:
        return self._backend.timer_service.current_watermark

    @property
    def operator_id(self) -> str:
        """The operator whose state and timers these are."""
        return self._ctx.operator_id

    def _cached(self, kind: str, name: str, make: Callable[[str], Any]) -> Any:
        state = self._states.get((kind, name))
        if state is None:
            state = self._states[(kind, name)] = make(self._ctx.state_name(name))
        return state

    def get_value_state(self, name: str, default: Any = None) -> ValueState[Any]:
        return self._cached("value", name, lambda n: self._backend.get_value_state(n, default))

    def get_reducing_state(
        self, name: str, reduce_fn: Callable[[Any, Any], Any]
    ) -> ReducingState[Any]:
        return self._cached(
            "reducing", name, lambda n: self._backend.get_reducing_state(n, reduce_fn)
        )

    def get_aggregating_state(self, name: str, fn: AggregateFunction) -> AggregatingState[Any]:
        return self._cached(
            "aggregating",
            name,
            lambda n: self._backend.get_aggregating_state(
                n, fn.add, fn.get_result, fn.create_accumulator
            ),
        )

    def get_list_state(self, name: str) -> ListState[Any]:
        """A list per key: the current key's (in a batch function, :meth:`set_current_key`'s)."""
        return self._cached("list", name, self._backend.get_list_state)

    def get_map_state(self, name: str) -> MapState:
        """A map per key: the current key's (in a batch function, :meth:`set_current_key`'s);
        ``get_all`` looks up many entries at once."""
        return self._cached("map", name, self._backend.get_map_state)


class KeyedContext(_KeyedStateAccess):
    """What a :class:`KeyedProcess` function sees: the current key, its keyed state (names
    are scoped to the operator) and event-time timers for the current key."""

    def __init__(self, backend: KeyedStateBackend, ctx: OperatorContext) -> None:
        super().__init__(backend, ctx)
        self.timestamp: int | None = None  # the firing time inside on_timer, else None

    @property
    def current_key(self) -> Any:
        return self._backend.current_key

    @property
    def current_key_group(self) -> int | None:
        return self._backend.current_key_group

    @property
    def subtask_index(self) -> int:
        return self._ctx.subtask_index

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer`` for the current key once the watermark reaches ``timestamp``."""
        self._backend.timer_service.register_event_time_timer(int(timestamp), self._namespace)

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._backend.timer_service.delete_event_time_timer(int(timestamp), self._namespace)


# ---------------------------------------------------------------------------------------------
# Runtime context and lifecycle
# ---------------------------------------------------------------------------------------------


@dataclass
class RuntimeContext:
    """What a :class:`RichFunction` sees in ``open``.

    ``task_name``: the vertex's name (its id). ``operator_id``: the operator running the
    function. ``subtask_index``: this subtask, 0-based. ``parallelism``: subtasks of the
    vertex. ``max_parallelism``: key groups. ``attempt``: the deployment attempt numbered by the
    coordinator (it grows with every restart). ``restored_checkpoint_id``: the checkpoint the
    state came from (0: a fresh start). ``metrics``: this function's counters and gauges.
    """

    task_name: str
    operator_id: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    restored_checkpoint_id: int = 0
    metrics: MetricGroup = field(default_factory=MetricGroup)
    keyed: KeyedContext | None = None

    @property
    def is_restored(self) -> bool:
        return self.restored_checkpoint_id > 0

    def _keyed(self, what: str) -> KeyedContext:
        if self.keyed is None:
            raise InvalidArgumentError(
                f"{what}: keyed state exists only after key_by() (in a keyed process function)"
            )
        return self.keyed

    def get_value_state(self, name: str, default: Any = None) -> Any:
        """Keyed value state ``name`` (keyed functions only; PyFlink's ``get_state``)."""
        return self._keyed("get_value_state").get_value_state(name, default)

    def get_list_state(self, name: str) -> Any:
        return self._keyed("get_list_state").get_list_state(name)

    def get_map_state(self, name: str) -> Any:
        return self._keyed("get_map_state").get_map_state(name)

    def get_reducing_state(self, name: str, reduce_fn: Callable[[Any, Any], Any]) -> Any:
        return self._keyed("get_reducing_state").get_reducing_state(name, reduce_fn)


def runtime_context(ctx: OperatorContext, keyed: KeyedContext | None = None) -> RuntimeContext:
    """The :class:`RuntimeContext` of a function run by the operator opened with ``ctx``."""
    return RuntimeContext(
        task_name=ctx.vertex_id,
        operator_id=ctx.operator_id,
        subtask_index=ctx.subtask_index,
        parallelism=ctx.parallelism,
        max_parallelism=ctx.max_parallelism,
        attempt=ctx.attempt,
        restored_checkpoint_id=ctx.restored_checkpoint_id,
        metrics=MetricGroup(f"{ctx.vertex_id}#{ctx.subtask_index}/{ctx.operator_id}"),
        keyed=keyed,
    )


class RichFunction:
    """A function with a lifecycle: ``open(ctx)`` before the first record of a subtask,
    ``close()`` at its end. ``self.runtime_context`` is the context once open."""

    runtime_context: RuntimeContext | None = None

    def open(self, ctx: RuntimeContext) -> None:
        pass

    def close(self) -> None:
        pass


def open_function(fn: Any, ctx: RuntimeContext) -> None:
    """Open ``fn`` if it is a :class:`RichFunction` (plain functions have no lifecycle)."""
    if isinstance(fn, RichFunction):
        fn.runtime_context = ctx
        fn.open(ctx)


def close_function(fn: Any) -> None:
    if isinstance(fn, RichFunction):
        fn.close()


# ---------------------------------------------------------------------------------------------
# Keyed functions
# ---------------------------------------------------------------------------------------------

Rows = Iterable[dict[str, Any]] | None


class KeyedProcessFunction(RichFunction):
    """Record at a time with keyed state and event-time timers (Flink's and PyFlink's
    ``KeyedProcessFunction``): subclass it, use it with ``key_by(...).process_function(f)``.

    ``process_element(row, ctx)``: ``row`` a dict, ``ctx.current_key`` its key; state through
    ``ctx.get_value_state(name)`` (or the context given to ``open``), timers through
    ``ctx.register_event_time_timer(ts)``. ``on_timer(timestamp, ctx)``: a timer of
    ``ctx.current_key`` fired. Both return or yield output rows (dicts), or None.
    """

    def process_element(self, row: dict[str, Any], ctx: KeyedContext) -> Rows:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Rows:
        return None


class KeyedBatchContext(_KeyedStateAccess):
    """What a :class:`KeyedBatchFunction` sees: the bulk state API and bulk timers.

    ``keys`` and ``key_groups``: the key column of the current batch (or of the fired timers)
    and the key group of every row; pass ``key_groups`` to bulk state calls on those keys to
    skip hashing them again. State objects (:class:`snapflow.worker.state.keyed_state.ValueState`
    etc.) offer ``get_many(keys, key_groups=None)`` and ``update_many(keys, values,
    key_groups=None)`` (value state), ``add_many`` (reducing, aggregating).
    """

    def __init__(self, backend: KeyedStateBackend, ctx: OperatorContext) -> None:
        super().__init__(backend, ctx)
        self.keys: pa.Array = pa.array([])
        self.key_groups: pa.Array = pa.array([], pa.int32())

    @property
    def max_parallelism(self) -> int:
        return self._backend.max_parallelism

    def key_groups_of(self, keys: Any) -> pa.Array:
        """The key groups of ``keys`` (e.g. of the distinct keys of a batch)."""
        from snapflow.worker.state import keygroups as kgs

        return kgs.key_groups(
            keys if isinstance(keys, pa.Array) else pa.array(keys), self.max_parallelism
        )

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` (a key of the current batch) the current key of the per-key state
        calls: ``MapState`` and ``ListState`` of one key, ``get``/``update``. The bulk calls
        name their keys and do not need it."""
        self._backend.set_current_key(key, self.key_groups_of([key])[0].as_py())

    def register_event_time_timers(self, keys: Any, timestamps: Any) -> None:
        """A timer at ``timestamps[i]`` for ``keys[i]``; ``on_timers`` gets it once the
        watermark reaches it (one timer per key and timestamp)."""
        register = self._backend.timer_service.register_event_time_timer
        for t in self._each_key(keys, timestamps):
            register(t, self._namespace)

    def delete_event_time_timers(self, keys: Any, timestamps: Any) -> None:
        """Delete the timer at ``timestamps[i]`` of ``keys[i]``, if there is one (Flink's
        ``TimerService.deleteEventTimeTimer``, for a batch): e.g. a newer record moved a
        key's deadline."""
        delete = self._backend.timer_service.delete_event_time_timer
        for t in self._each_key(keys, timestamps):
            delete(t, self._namespace)

    def _each_key(self, keys: Any, timestamps: Any) -> Iterator[int]:
        """Make each key current in turn and yield its timestamp."""
        pykeys = keys.to_pylist() if isinstance(keys, pa.Array | pa.ChunkedArray) else list(keys)
        stamps = (
            timestamps.to_pylist()
            if isinstance(timestamps, pa.Array | pa.ChunkedArray)
            else list(timestamps)
        )
        if len(pykeys) != len(stamps):
            raise StateError(f"{len(pykeys)} keys but {len(stamps)} timestamps")
        groups = self.key_groups_of(pykeys).to_pylist() if pykeys else []
        b = self._backend
        for k, g, t in zip(pykeys, groups, stamps, strict=True):
            b.set_current_key(k, g)
            yield int(t)


class KeyedBatchFunction(RichFunction):
    """Vectorised keyed processing with the bulk state API: subclass it, use it with
    ``key_by(...).process_batches(f)``.

    ``process_batch(batch, ctx)``: once per input batch (``pyarrow.RecordBatch``; ``ctx.keys``
    its key column, ``ctx.key_groups`` their key groups); returns a RecordBatch, a list of
    them, a ``pyarrow.Table`` or None. ``on_timers(timers, ctx)``: the timers due at a
    watermark as one batch with columns ``key`` and ``timestamp`` (timestamp order); returns
    the same kinds.
    """

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        raise NotImplementedError

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        return None

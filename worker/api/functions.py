"""User functions with a lifecycle, a runtime context and metrics; keyed functions with state.

* :class:`RichFunction`: any function object passed to ``map``, ``filter``, ``flat_map``,
  ``map_batches``, ``filter_batches``, ``flat_map_batches`` or a keyed process may subclass it:
  its ``open(ctx)`` runs once per subtask before the first record, with a
  :class:`RuntimeContext` (subtask index, parallelism, attempt number, metrics, and keyed state
  on a keyed vertex), and ``close()`` when the task ends (PyFlink's ``open(runtime_context)`` /
  ``close()``).
* :class:`KeyedProcessFunction`: record at a time, as in Flink: ``process_element(row, ctx)``
  per row with the row's key as the current key of ``ctx`` (a
  :class:`snapflow.worker.api.operators.KeyedContext`: state and event-time timers), and
  ``on_timer(timestamp, ctx)``. Both return (or yield) output rows as dicts.
* :class:`KeyedBatchFunction`: vectorised: ``process_batch(batch, ctx)`` once per input batch
  (every row belongs to this subtask's key groups), with the bulk state API on ``ctx``
  (:class:`KeyedBatchContext`: ``get_value_state(name).get_many(keys)`` /
  ``update_many(keys, values)``; ``ctx.key_groups`` spares the re-hashing) and bulk timers;
  ``on_timers(timers, ctx)`` gets the due timers as one batch (``key``, ``timestamp``).
* pandas at the edge: :func:`to_pandas` / :func:`from_pandas` convert a batch; pandas is an
  optional extra (``pip install snapflow[pandas]``), imported only when called.

Metrics: :class:`MetricGroup` offers counters and gauges. The task runtime has no metrics
registry for user metrics yet, so their values stay readable in the process, from
``ctx.metrics.values()`` (e.g. in ``close()``, to log them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)

if TYPE_CHECKING:
    import pandas


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


class Counter:
    """A count that only goes up (``inc``); ``count`` is its value."""

    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"a counter goes up by an integer >= 0, got {n!r}")
        self.count += n


class Gauge:
    """A value read when asked: ``fn()``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    @property
    def value(self) -> Any:
        return self.fn()


class MetricGroup:
    """The metrics of one user function in one subtask: named counters and gauges. ``scope``
    names the subtask (``vertex#subtask``) and the operator."""

    def __init__(self, scope: str = "") -> None:
        self.scope = scope
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}

    def counter(self, name: str) -> Counter:
        """The counter ``name`` (created on first use; the same one afterwards)."""
        self._check(name, self._gauges)
        return self._counters.setdefault(name, Counter())

    def gauge(self, name: str, fn: Callable[[], Any]) -> Gauge:
        """Register ``fn`` as gauge ``name`` (replaces an earlier one of that name)."""
        self._check(name, self._counters)
        if not callable(fn):
            raise InvalidArgumentError(f"gauge {name!r} needs a callable, got {fn!r:.100}")
        gauge = self._gauges[name] = Gauge(fn)
        return gauge

    def values(self) -> dict[str, Any]:
        """Every metric's current value by name."""
        out: dict[str, Any] = {n: c.count for n, c in self._counters.items()}
        out.update((n, g.value) for n, g in self._gauges.items())
        return out

    @staticmethod
    def _check(name: str, other: dict[str, Any]) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"metric names are non-empty strings, got {name!r}")
        if name in other:
            raise InvalidArgumentError(f"metric {name!r} already exists as another kind")


# ---------------------------------------------------------------------------------------------
# Keyed context and aggregate functions (used by the operators of snapflow.worker.api.operators)
# ---------------------------------------------------------------------------------------------


class AggregateFunction:
    """Flink's ``AggregateFunction``: ``create_accumulator() -> acc``, ``add(value, acc) ->
    acc`` (may mutate and return ``acc``), ``get_result(acc) -> result``. Subclass it, or build
    one from three functions with :meth:`of`."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def of(
        create_accumulator: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        get_result: Callable[[Any], Any],
    ) -> AggregateFunction:
        return _FnAggregate(create_accumulator, add, get_result)


class _FnAggregate(AggregateFunction):
    def __init__(
        self,
        create_accumulator: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        get_result: Callable[[Any], Any],
    ) -> None:
        self._create, self._add, self._result = create_accumulator, add, get_result

    def create_accumulator(self) -> Any:
        return self._create()

    def add(self, value: Any, accumulator: Any) -> Any:
        return self._add(value, accumulator)

    def get_result(self, accumulator: Any) -> Any:
        return self._result(accumulator)


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

    def get_list_state(self, name: str) -> ListState[Any]:
        return self._cached("list", name, self._backend.get_list_state)

    def get_map_state(self, name: str) -> MapState:
        return self._cached("map", name, self._backend.get_map_state)

    def get_aggregating_state(self, name: str, fn: AggregateFunction) -> AggregatingState[Any]:
        return self._cached(
            "aggregating",
            name,
            lambda n: self._backend.get_aggregating_state(
                n, fn.add, fn.get_result, fn.create_accumulator
            ),
        )

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

    def register_event_time_timers(self, keys: Any, timestamps: Any) -> None:
        """A timer at ``timestamps[i]`` for ``keys[i]``; ``on_timers`` gets it once the
        watermark reaches it (one timer per key and timestamp)."""
        pykeys = keys.to_pylist() if isinstance(keys, pa.Array | pa.ChunkedArray) else list(keys)
        stamps = (
            timestamps.to_pylist()
            if isinstance(timestamps, pa.Array | pa.ChunkedArray)
            else list(timestamps)
        )
        if len(pykeys) != len(stamps):
            raise StateError(f"{len(pykeys)} keys but {len(stamps)} timestamps")
        groups = self.key_groups_of(pykeys).to_pylist() if pykeys else []
        b, ts = self._backend, self._backend.timer_service
        for k, g, t in zip(pykeys, groups, stamps, strict=True):
            b.set_current_key(k, g)
            ts.register_event_time_timer(int(t), self._namespace)


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


# ---------------------------------------------------------------------------------------------
# pandas at the edge
# ---------------------------------------------------------------------------------------------


def _pandas() -> Any:
    try:
        import pandas
    except ImportError as e:
        raise InvalidArgumentError(
            "this needs pandas, which Snapflow does not require: install it with "
            "`pip install 'snapflow[pandas]'` (or `pip install pandas`), or work on the "
            "pyarrow.RecordBatch directly"
        ) from e
    return pandas


def to_pandas(batch: pa.RecordBatch | pa.Table) -> pandas.DataFrame:
    """``batch`` as a pandas DataFrame (pandas must be installed)."""
    _pandas()
    return batch.to_pandas()


def from_pandas(df: pandas.DataFrame, schema: pa.Schema | None = None) -> pa.RecordBatch:
    """A pandas DataFrame as a record batch (the index is dropped); ``schema`` fixes the
    output types (recommended: pandas infers them per batch)."""
    pd = _pandas()
    if not isinstance(df, pd.DataFrame):
        raise InvalidArgumentError(f"from_pandas needs a pandas.DataFrame, got {type(df).__name__}")
    return pa.RecordBatch.from_pandas(df, schema=schema, preserve_index=False)

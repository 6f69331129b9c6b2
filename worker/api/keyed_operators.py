"""Keyed operators: per-key state on a keyed vertex.

The batch API (:class:`KeyedCount`, :class:`KeyedReduce` with a named aggregation,
:class:`KeyedBatchProcess`) is vectorised; the record API (:class:`KeyedProcess`,
:class:`Aggregate`, :func:`keyed_process_function`) wraps Python functions over ``dict`` rows.
Stateless operators are in :mod:`snapflow.worker.api.operators`.
"""

from __future__ import annotations

import contextlib
import operator as _op
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.api.functions import (
    AggregateFunction,
    KeyedBatchContext,
    KeyedBatchFunction,
    KeyedContext,
    KeyedProcessFunction,
    RichFunction,
    close_function,
    open_function,
    runtime_context,
)
from snapflow.worker.api.operators import RowEncoder, batches_of, non_empty_batches
from snapflow.worker.runtime.chain import fire_timers, run_steps
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import AggregatingState, ReducingState, aggregate_batch

STEP_ROWS = 2048
"""Rows (of whole keys) between two steps of :meth:`KeyedProcess.process_batch_steps`: a few
milliseconds of a Python record function here, below a task's loop slice."""


def key_column(batch: pa.RecordBatch, key_field: str, who: str) -> pa.Array:
    """The key column of ``batch``; a clear error naming ``who`` when it is missing."""
    idx = batch.schema.get_field_index(key_field)
    if idx < 0:
        raise InvalidArgumentError(
            f"{who}: key field {key_field!r} not in the input (columns: {batch.schema.names})"
        )
    return batch.column(idx)


def _column(batch: pa.RecordBatch, name: str, who: str) -> pa.Array:
    idx = batch.schema.get_field_index(name)
    if idx < 0:
        raise InvalidArgumentError(
            f"{who}: field {name!r} not in the input (columns: {batch.schema.names})"
        )
    return batch.column(idx)


def fold_and_get(
    state: ReducingState[Any],
    reduce_fn: Callable[[Any, Any], Any],
    keys: pa.Array,
    partials: Any,
    key_groups: pa.Array,
) -> list[Any]:
    """Fold ``partials[i]`` into the reducing state of the *distinct* ``keys[i]`` and return the
    new values, in one pass (one lookup and one store per key).

    Equivalent to ``state.add_many(keys, partials, key_groups)`` followed by
    ``state.get_many(keys, key_groups)`` -- which it falls back to -- at about half the cost: it
    uses the backend's per-key-group dicts with the same copy-on-write rule as
    ``ReducingState.add`` (a dict shared with a snapshot view is copied before its first write).
    """
    fused = getattr(state, "fold_and_get_distinct", None)
    if fused is not None:  # the disk backend's one pass over its cache
        return cast(list[Any], fused(keys, partials, key_groups, reduce_fn))
    table = getattr(state, "_table", None)
    backend = getattr(state, "_backend", None)
    if (
        table is None
        or backend is None
        or not all(hasattr(table, a) for a in ("maps", "shared", "writable"))
    ):
        state.add_many(keys, partials, key_groups=key_groups)
        return state.get_many(keys, key_groups=key_groups)
    pykeys, idxs = backend.resolve_keys(keys, key_groups)
    values = partials.to_pylist() if isinstance(partials, pa.Array | pa.ChunkedArray) else partials
    if len(values) != len(pykeys):
        raise StateError(f"{len(pykeys)} keys but {len(values)} values")
    maps, shared, writable = table.maps, table.shared, table.writable
    out: list[Any] = []
    append = out.append
    missing = _MISSING_VALUE
    for k, i, v in zip(pykeys, idxs, values, strict=True):
        m = writable(i) if shared[i] else maps[i]
        old = m.get(k, missing)
        new = v if old is missing else reduce_fn(old, v)
        m[k] = new
        append(new)
    return out


_MISSING_VALUE: Any = object()


class KeyedCount(Operator):
    """A running count per key (``ReducingState`` of ints), vectorised: each batch is counted per
    distinct key with Arrow's hash aggregation, then the state is touched once per distinct key.

    ``output="updates"``: every batch emits ``(key_field, count_field)`` rows with the new
    totals of the keys it updated, once each (order: Arrow's hash grouping, deterministic for a
    given batch but not first occurrence). ``output="final"``: nothing per
    batch; ``end_input`` emits the totals of every key of the subtask.
    """

    STATE = "count"

    def __init__(self, key_field: str, output: str = "updates", count_field: str = "count") -> None:
        if output not in ("updates", "final"):
            raise InvalidArgumentError(f"output must be 'updates' or 'final', got {output!r}")
        self.key_field = key_field
        self.output = output
        self.count_field = count_field
        self._key_type: pa.DataType | None = None

    _runtime_fields: tuple[str, ...] = ("_state", "_backend", "_state_name")

    def runs_on_loop(self) -> bool:
        return True  # Arrow's hash aggregation, then one state access per distinct key

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend = ctx.require_keyed_state(self.name)
        self._state_name = ctx.state_name(self.STATE)
        self._state: ReducingState[int] = self._backend.get_reducing_state(
            self._state_name, _op.add
        )

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        keys = key_column(batch, self.key_field, self.name)
        if self._key_type is None:
            self._key_type = keys.type
        distinct, counts = aggregate_batch(keys)
        groups = kgs.key_groups(distinct, self._backend.max_parallelism)
        if self.output != "updates":
            self._state.add_many(distinct, counts, key_groups=groups)
            return []
        totals = fold_and_get(self._state, _op.add, distinct, counts, groups)
        return [
            pa.RecordBatch.from_arrays(
                [distinct, pa.array(totals, pa.int64())], names=[self.key_field, self.count_field]
            )
        ]

    def end_input(self) -> list[pa.RecordBatch]:
        if self.output != "final":
            return []
        entries = list(self._backend.entries(self._state_name))
        if not entries:
            return []
        return [
            pa.RecordBatch.from_arrays(
                [
                    pa.array([k for k, _ in entries], self._key_type),
                    pa.array([v for _, v in entries], pa.int64()),
                ],
                names=[self.key_field, self.count_field],
            )
        ]


_REDUCERS: dict[str, Callable[[Any, Any], Any]] = {"sum": _op.add, "min": min, "max": max}


class KeyedReduce(Operator):
    """A running reduction of ``value_field`` per key (``ReducingState``). ``agg`` is ``"sum"``,
    ``"min"``, ``"max"`` (vectorised: pre-aggregated per batch with Arrow, then one state update
    per distinct key) or a callable ``reduce(a, b) -> c`` (folded row by row, in order).

    Every batch emits ``(key_field, value_field)`` rows with the new values of the keys it
    updated, once each (order as in :class:`KeyedCount`). ``min``/``max`` keep the input type; ``sum`` of integers
    is int64, of floats float64.
    """

    _runtime_fields: tuple[str, ...] = ("_state", "_backend")

    def __init__(
        self,
        key_field: str,
        value_field: str,
        agg: str | Callable[[Any, Any], Any] = "sum",
    ) -> None:
        if isinstance(agg, str) and agg not in _REDUCERS:
            raise InvalidArgumentError(
                f"agg must be one of {sorted(_REDUCERS)} or a callable, got {agg!r}"
            )
        if not isinstance(agg, str) and not callable(agg):
            raise InvalidArgumentError(f"agg must be a string or a callable, got {agg!r}")
        self.key_field = key_field
        self.value_field = value_field
        self.agg = agg

    def runs_on_loop(self) -> bool:
        return isinstance(self.agg, str)  # vectorised; a callable is user code, row by row

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend = ctx.require_keyed_state(self.name)
        fn = _REDUCERS[self.agg] if isinstance(self.agg, str) else self.agg
        self._state: ReducingState[Any] = self._backend.get_reducing_state(
            ctx.state_name("reduce"), fn
        )

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        keys = key_column(batch, self.key_field, self.name)
        values = _column(batch, self.value_field, self.name)
        if isinstance(self.agg, str):
            distinct, partials = aggregate_batch(keys, values, self.agg)
            groups = kgs.key_groups(distinct, self._backend.max_parallelism)
            results = fold_and_get(self._state, _REDUCERS[self.agg], distinct, partials, groups)
        else:
            groups_all = kgs.key_groups(keys, self._backend.max_parallelism)
            self._state.add_many(keys, values, key_groups=groups_all)
            distinct_table = (
                pa.table({"k": keys, "g": groups_all})
                .group_by(["k", "g"], use_threads=False)
                .aggregate([])
            )
            distinct = distinct_table.column("k").combine_chunks()
            groups = distinct_table.column("g").combine_chunks()
            results = self._state.get_many(distinct, key_groups=groups)
        value_type = values.type
        if self.agg in ("min", "max"):
            out_values = pa.array(results, value_type)
        elif self.agg == "sum":
            out_values = pa.array(
                results, pa.float64() if pa.types.is_floating(value_type) else pa.int64()
            )
        else:
            out_values = pa.array(results)
        return [
            pa.RecordBatch.from_arrays(
                [distinct, out_values], names=[self.key_field, self.value_field]
            )
        ]


RowsFn = Callable[[Any, list[dict[str, Any]], KeyedContext], Iterable[dict[str, Any]] | None]


TimerFn = Callable[[int, Any, KeyedContext], Iterable[dict[str, Any]] | None]


def rows_by_key(
    batch: pa.RecordBatch, keys: pa.Array, key_field: str, max_parallelism: int
) -> Iterator[tuple[Any, int, list[dict[str, Any]]]]:
    """``(key, key group, rows)`` per distinct key of ``batch``: keys in first-occurrence
    order, rows in arrival order. Grouped by Arrow (a dictionary encoding, whose codes follow
    first occurrence, and a stable sort of the codes), so Python touches every row once only,
    to build its dict. A generator: each key's list of rows is sliced when its turn comes and
    dropped after it. Made all at once, the lists of a batch cost the keyed-count function a
    third of its throughput (in process: 0.95 M against 1.4-1.6 M rows/s), most likely in the
    garbage collector, which runs by net allocations."""
    grouped = None
    if not (
        keys.null_count or pa.types.is_floating(keys.type) or pa.types.is_dictionary(keys.type)
    ):
        # a type without a kernel (view types in some pyarrow versions): grouped as below
        with contextlib.suppress(pa.ArrowNotImplementedError):
            grouped = _group_with_arrow(batch, keys, max_parallelism)
    if grouped is not None:
        distinct, groups, counts, rows = grouped
        start = 0
        for key, g, n in zip(distinct, groups, counts, strict=True):
            yield key, g, rows[start : start + n]
            start += n
        return
    # Python's equality decides (0.0 == -0.0; one key per decoded value); null keys are
    # refused by key_groups
    by_key: dict[Any, tuple[int, list[dict[str, Any]]]] = {}
    for row, g in zip(
        batch.to_pylist(), kgs.key_groups(keys, max_parallelism).to_pylist(), strict=True
    ):
        entry = by_key.get(row[key_field])
        if entry is None:
            by_key[row[key_field]] = (g, [row])
        else:
            entry[1].append(row)
    for key, (g, key_rows) in by_key.items():
        yield key, g, key_rows


def _group_with_arrow(
    batch: pa.RecordBatch, keys: pa.Array, max_parallelism: int
) -> tuple[list[Any], list[int], list[int], list[dict[str, Any]]]:
    """The distinct keys (first-occurrence order), their key groups and row counts, and the
    rows sorted by key (stably: arrival order within a key)."""
    encoded = pc.dictionary_encode(keys)
    codes, distinct = encoded.indices, encoded.dictionary
    counts = pc.value_counts(codes).field("counts").to_pylist()  # in code order
    rows = batch.take(pc.sort_indices(codes)).to_pylist()
    groups = kgs.key_groups(distinct, max_parallelism).to_pylist()
    return distinct.to_pylist(), groups, counts, rows


def keyed_rows_steps(
    batch: pa.RecordBatch,
    key_field: str,
    backend: KeyedStateBackend,
    call: Callable[[Any, list[dict[str, Any]]], Iterable[dict[str, Any]] | None],
    who: str,
) -> Generator[None, None, list[dict[str, Any]]]:
    """``call(key, rows)`` once per distinct key of ``batch`` (first-occurrence order, rows in
    arrival order) with the key set as ``backend``'s current key; the rows it returns, in
    that order. A step per about :data:`STEP_ROWS` rows, between two keys (the record
    operators' ``process_batch_steps``)."""
    if not batch.num_rows:
        return []
    keys = key_column(batch, key_field, who)
    out: list[dict[str, Any]] = []
    since_step = 0
    for key, g, rows in rows_by_key(batch, keys, key_field, backend.max_parallelism):
        backend.set_current_key(key, g)
        produced = call(key, rows)
        if produced is not None:
            out.extend(produced)
        since_step += len(rows)
        if since_step >= STEP_ROWS:
            since_step = 0
            yield
    return out


def fire_keyed_timers(
    backend: KeyedStateBackend,
    watermark_ms: int,
    kctx: KeyedContext,
    call: Callable[[int, Any], Iterable[dict[str, Any]] | None] | None,
) -> list[dict[str, Any]]:
    """Fire the timers of ``kctx``'s operator due at ``watermark_ms``: ``call(timestamp, key)``
    per timer in timestamp order, with its key current and ``kctx.timestamp`` set; the rows
    it returns (none when ``call`` is None: the timers are dropped)."""
    timers = fire_timers(backend, watermark_ms, kctx.operator_id)
    if not timers or call is None:
        return []
    out: list[dict[str, Any]] = []
    for timer in timers:
        backend.set_current_key(timer.key, timer.key_group)
        kctx.timestamp = timer.timestamp
        try:
            produced = call(timer.timestamp, timer.key)
        finally:
            kctx.timestamp = None
        if produced is not None:
            out.extend(produced)
    return out


def set_batch_keys(
    bctx: KeyedBatchContext, batch: pa.RecordBatch, key_field: str, who: str
) -> None:
    """Point ``bctx`` at ``batch``: its key column and their key groups."""
    keys = key_column(batch, key_field, who)
    bctx.keys = keys
    bctx.key_groups = kgs.key_groups(keys, bctx.max_parallelism)


def fired_timers_batch(
    backend: KeyedStateBackend, watermark_ms: int, bctx: KeyedBatchContext
) -> pa.RecordBatch | None:
    """The timers of ``bctx``'s operator due at ``watermark_ms`` as one batch (``key``,
    ``timestamp``; timestamp order), ``bctx`` pointed at their keys; None when none is due."""
    timers = fire_timers(backend, watermark_ms, bctx.operator_id)
    if not timers:
        return None
    keys = pa.array([t.key for t in timers])
    bctx.keys = keys
    bctx.key_groups = pa.array([t.key_group for t in timers], pa.int32())
    return pa.RecordBatch.from_arrays(
        [keys, pa.array([t.timestamp for t in timers], pa.int64())],
        names=["key", "timestamp"],
    )


class KeyedProcess(Operator):
    """Record-at-a-time keyed processing (Flink's ``KeyedProcessFunction``).

    For every batch, ``fn(key, rows, ctx)`` is called once per distinct key (keys in
    first-occurrence order) with that key's rows in arrival order, the key set as the current
    key of ``ctx`` (:class:`KeyedContext`: value/list/map/reducing/aggregating state, timers).
    It returns the output rows (an iterable of dicts, or None). Timers registered through
    ``ctx.register_event_time_timer(ts)`` call ``on_timer(ts, key, ctx)`` once the watermark
    reaches ``ts``; its rows are emitted by ``process_watermark``. Output order: per key, the
    order ``fn`` produced; across keys, the order the keys first appeared in the batch.
    """

    _runtime_fields: tuple[str, ...] = ("_encoder", "_kctx", "_backend")

    def __init__(
        self,
        key_field: str,
        fn: RowsFn,
        on_timer: TimerFn | None = None,
        output_schema: pa.Schema | None = None,
    ) -> None:
        self.key_field = key_field
        self.fn = fn
        self.on_timer = on_timer
        self.output_schema = output_schema
        self._encoder = RowEncoder(output_schema, self.name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._encoder = RowEncoder(self.output_schema, self.name)

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend = ctx.require_keyed_state(self.name)
        self._kctx = KeyedContext(self._backend, ctx)
        rctx = runtime_context(ctx, self._kctx)
        open_function(self.fn, rctx)
        if self.on_timer is not None and self.on_timer is not self.fn:
            open_function(self.on_timer, rctx)

    def close(self) -> None:
        close_function(self.fn)
        if self.on_timer is not None and self.on_timer is not self.fn:
            close_function(self.on_timer)

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return run_steps(self.process_batch_steps(batch))

    def process_batch_steps(
        self, batch: pa.RecordBatch
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        """A step per about :data:`STEP_ROWS` rows, between two keys: ``fn`` is still called
        once per key and batch (smaller batches would call it more often), and a task on its
        agent's loop can give the loop a turn between keys."""
        if type(self).process_batch is not KeyedProcess.process_batch:
            return self.process_batch(batch)  # a subclass's own processing: one step
        if not batch.num_rows:
            return []
        kctx, fn = self._kctx, self.fn
        out = yield from keyed_rows_steps(
            batch, self.key_field, self._backend, lambda key, rows: fn(key, rows, kctx), self.name
        )
        return non_empty_batches([self._encoder.encode(out)])

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        on_timer, kctx = self.on_timer, self._kctx
        out = fire_keyed_timers(
            self._backend,
            watermark_ms,
            kctx,
            None if on_timer is None else lambda ts, key: on_timer(ts, key, kctx),
        )
        return non_empty_batches([self._encoder.encode(out)])

    def end_input(self) -> list[pa.RecordBatch]:
        """Input ended: every remaining timer fires (as the final ``MAX_WATERMARK`` would)."""
        return self.process_watermark(MAX_WATERMARK)


class Aggregate(Operator):
    """A running aggregation per key in ``AggregatingState``: every row's ``value_field`` (the
    whole row as a dict when ``value_field`` is None) is folded in with ``function.add``, in
    order. Every batch emits ``(key_field, output_field)`` rows with ``get_result`` of the keys
    it updated, once each (order as in :class:`KeyedCount`; the result type is inferred, or
    ``result_type``)."""

    _runtime_fields: tuple[str, ...] = ("_state", "_backend")

    def __init__(
        self,
        key_field: str,
        function: AggregateFunction,
        value_field: str | None = None,
        output_field: str = "result",
        result_type: pa.DataType | None = None,
    ) -> None:
        if not isinstance(function, AggregateFunction):
            raise InvalidArgumentError("function must be an AggregateFunction")
        self.key_field = key_field
        self.function = function
        self.value_field = value_field
        self.output_field = output_field
        self.result_type = result_type

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend = ctx.require_keyed_state(self.name)
        fn = self.function
        self._state: AggregatingState[Any] = self._backend.get_aggregating_state(
            ctx.state_name("aggregate"), fn.add, fn.get_result, fn.create_accumulator
        )

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        keys = key_column(batch, self.key_field, self.name)
        groups = kgs.key_groups(keys, self._backend.max_parallelism)
        values: Any = (
            batch.to_pylist()
            if self.value_field is None
            else _column(batch, self.value_field, self.name)
        )
        self._state.add_many(keys, values, key_groups=groups)
        distinct_table = (
            pa.table({"k": keys, "g": groups}).group_by(["k", "g"], use_threads=False).aggregate([])
        )
        distinct = distinct_table.column("k").combine_chunks()
        results = self._state.get_many(
            distinct, key_groups=distinct_table.column("g").combine_chunks()
        )
        return [
            pa.RecordBatch.from_arrays(
                [distinct, pa.array(results, self.result_type)],
                names=[self.key_field, self.output_field],
            )
        ]


class PerElement(RichFunction):
    """A :class:`KeyedProcessFunction` as the ``fn``/``on_timer`` pair of :class:`KeyedProcess`:
    ``process_element`` once per row, in arrival order; ``on_timer`` per fired timer."""

    def __init__(self, function: KeyedProcessFunction) -> None:
        if not isinstance(function, KeyedProcessFunction):
            raise InvalidArgumentError(
                f"process_function needs a KeyedProcessFunction, got {function!r:.100}"
            )
        self.function = function

    def open(self, ctx: Any) -> None:
        open_function(self.function, ctx)

    def close(self) -> None:
        close_function(self.function)

    def __call__(
        self, key: Any, rows: list[dict[str, Any]], ctx: KeyedContext
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        process = self.function.process_element
        for row in rows:
            produced = process(row, ctx)
            if isinstance(produced, dict):
                # a lone row would extend ``out`` with its keys: say what to return instead
                raise InvalidArgumentError(
                    f"{type(self.function).__name__}.process_element returned a dict; return "
                    f"an iterable of rows (e.g. [row] or yield row), or None for nothing"
                )
            if produced is not None:
                out.extend(produced)
        return out

    def on_timer(
        self, timestamp: int, key: Any, ctx: KeyedContext
    ) -> Iterable[dict[str, Any]] | None:
        return self.function.on_timer(timestamp, ctx)


def keyed_process_function(
    key_field: str, function: KeyedProcessFunction, output_schema: pa.Schema | None = None
) -> KeyedProcess:
    """The operator running a :class:`KeyedProcessFunction` on a stream keyed by ``key_field``."""
    adapter = PerElement(function)
    return KeyedProcess(key_field, adapter, adapter.on_timer, output_schema)


class KeyedBatchProcess(Operator):
    """Vectorised keyed processing: a :class:`KeyedBatchFunction` gets every input batch and,
    at a watermark, the due timers as one batch (``key``, ``timestamp``), with the bulk state
    API on a :class:`KeyedBatchContext`. At the end of the input every remaining timer fires."""

    _runtime_fields: tuple[str, ...] = ("_backend", "_bctx")

    def __init__(self, key_field: str, function: KeyedBatchFunction) -> None:
        if not isinstance(function, KeyedBatchFunction):
            raise InvalidArgumentError(
                f"process_batches needs a KeyedBatchFunction, got {function!r:.100}"
            )
        self.key_field = key_field
        self.function = function

    @property
    def name(self) -> str:
        return f"KeyedBatchProcess({type(self.function).__name__})"

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend = ctx.require_keyed_state(self.name)
        self._bctx = KeyedBatchContext(self._backend, ctx)
        open_function(self.function, runtime_context(ctx, KeyedContext(self._backend, ctx)))

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        set_batch_keys(self._bctx, batch, self.key_field, self.name)
        return batches_of(self.function.process_batch(batch, self._bctx), self.name)

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        timers = fired_timers_batch(self._backend, watermark_ms, self._bctx)
        if timers is None:
            return []
        return batches_of(self.function.on_timers(timers, self._bctx), self.name)

    def end_input(self) -> list[pa.RecordBatch]:
        return self.process_watermark(MAX_WATERMARK)

    def close(self) -> None:
        close_function(self.function)

"""User functions: lifecycle and runtime context, metrics, keyed process functions (per record
and vectorised with the bulk state API), both with timers and snapshot/restore; pandas at the
edge."""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.api import functions
from snapflow.worker.api.function_metrics import MetricGroup
from snapflow.worker.api.functions import (
    KeyedBatchContext,
    KeyedBatchFunction,
    KeyedContext,
    KeyedProcessFunction,
    RichFunction,
    RuntimeContext,
)
from snapflow.worker.api.keyed_operators import KeyedBatchProcess, keyed_process_function
from snapflow.worker.api.operators import Map, MapBatches
from snapflow.worker.api.pandas_batches import from_pandas, to_pandas
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend


def keyed_ctx(backend: KeyedStateBackend | None = None, attempt: int = 3) -> OperatorContext:
    return OperatorContext(
        vertex_id="v1-key-by",
        operator_id="v1.0-process",
        subtask_index=1,
        parallelism=2,
        max_parallelism=128,
        attempt=attempt,
        keyed_state=backend or KeyedStateBackend(128, (0, 127)),
        key_field="k",
    )


def batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows)


def rows_of(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return sorted((r for b in batches for r in b.to_pylist()), key=lambda r: sorted(r.items()))


# ---------------------------------------------------------------------------------------------
# Lifecycle, runtime context, metrics
# ---------------------------------------------------------------------------------------------


class Scale(RichFunction):
    def __init__(self) -> None:
        self.events: list[str] = []

    def open(self, ctx: RuntimeContext) -> None:
        self.events.append(f"open {ctx.subtask_index}/{ctx.parallelism}@{ctx.attempt}")
        self.factor = ctx.subtask_index + 10
        self.seen = ctx.metrics.counter("seen")
        ctx.metrics.gauge("factor", lambda: self.factor)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        self.seen.inc()
        return {"x": row["x"] * self.factor}

    def close(self) -> None:
        self.events.append("close")


def test_rich_functions_get_open_with_the_runtime_context_and_close() -> None:
    fn = Scale()
    op = Map(fn)
    op.open(keyed_ctx())
    assert fn.events == ["open 1/2@3"]
    assert op.process_batch(batch([{"x": 1}, {"x": 2}]))[0].to_pylist() == [{"x": 11}, {"x": 22}]
    ctx = fn.runtime_context
    assert ctx is not None
    assert (ctx.task_name, ctx.operator_id, ctx.max_parallelism) == (
        "v1-key-by",
        "v1.0-process",
        128,
    )
    assert ctx.metrics.values() == {"seen": 2, "factor": 11}
    assert ctx.metrics.scope == "v1-key-by#1/v1.0-process"
    op.close()
    assert fn.events == ["open 1/2@3", "close"]
    # plain functions have no lifecycle; batch functions get it too
    plain = MapBatches(lambda b: b)
    plain.open(OperatorContext())
    plain.close()


def test_metric_group_refuses_bad_use() -> None:
    m = MetricGroup()
    m.counter("a").inc(2)
    assert m.counter("a").count == 2  # the same counter
    for bad in (lambda: m.counter("a").inc(-1), lambda: m.gauge("a", lambda: 1)):
        with pytest.raises(InvalidArgumentError):
            bad()
    with pytest.raises(InvalidArgumentError, match="callable"):
        m.gauge("g", 3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="keyed state exists only after key_by"):
        functions.runtime_context(OperatorContext()).get_value_state("x")


# ---------------------------------------------------------------------------------------------
# KeyedProcessFunction: per record, with state and timers
# ---------------------------------------------------------------------------------------------


class SessionCount(KeyedProcessFunction):
    """Counts the rows of a key; emits the count 100 ms after the key's last row."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_value_state("count", 0)
        self.last = ctx.get_value_state("last")
        self.emitted = ctx.metrics.counter("emitted")

    def process_element(self, row: dict[str, Any], ctx: KeyedContext) -> Any:
        self.count.update(self.count.value() + 1)
        previous = self.last.value()
        if previous is not None:
            ctx.delete_event_time_timer(previous + 100)
        self.last.update(row["ts"])
        ctx.register_event_time_timer(row["ts"] + 100)
        yield from ()  # a generator: outputs come from the timers

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> Any:
        self.emitted.inc()
        yield {"k": ctx.current_key, "count": self.count.value(), "at": timestamp}
        self.count.clear()
        self.last.clear()


def test_keyed_process_function_per_record_with_timers() -> None:
    fn = SessionCount()
    op = keyed_process_function("k", fn)
    ctx = keyed_ctx()
    op.open(ctx)
    assert (
        op.process_batch(batch([{"k": "a", "ts": 10}, {"k": "b", "ts": 20}, {"k": "a", "ts": 50}]))
        == []
    )
    assert [b.to_pylist() for b in op.process_watermark(130)] == [
        [{"k": "b", "count": 1, "at": 120}]
    ]
    # a shipped (pickled) copy of the operator on the same backend goes on with its state
    backend = ctx.keyed_state
    assert backend is not None
    copy = cloudpickle.loads(cloudpickle.dumps(keyed_process_function("k", SessionCount())))
    copy.open(keyed_ctx(backend))
    out = copy.end_input()
    assert [b.to_pylist() for b in out] == [[{"k": "a", "count": 2, "at": 150}]]
    assert fn.runtime_context is not None and fn.runtime_context.metrics.values() == {"emitted": 1}
    with pytest.raises(InvalidArgumentError, match="KeyedProcessFunction"):
        keyed_process_function("k", lambda row, ctx: None)  # type: ignore[arg-type]


class ReturnsARow(KeyedProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any) -> Any:
        return row  # a common slip: one row instead of an iterable of rows


def test_a_lone_row_returned_is_a_clear_error() -> None:
    op = keyed_process_function("k", ReturnsARow())
    op.open(keyed_ctx())
    with pytest.raises(InvalidArgumentError, match=r"returned a dict; return an iterable"):
        op.process_batch(batch([{"k": "a", "ts": 10}]))


# ---------------------------------------------------------------------------------------------
# KeyedBatchFunction: vectorised, bulk state, bulk timers
# ---------------------------------------------------------------------------------------------


class RunningSum(KeyedBatchFunction):
    """Per batch: the new running sum of every key it touched; at the end of a key's 1000 ms
    event-time window (a timer), the window's final sum."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> pa.RecordBatch:
        grouped = (
            pa.table({"k": ctx.keys, "v": batch.column("v")})
            .group_by("k")
            .aggregate([("v", "sum")])
        )
        keys = grouped.column("k").combine_chunks()
        groups = ctx.key_groups_of(keys)
        sums = ctx.get_value_state("sum", 0)
        totals = [
            old + new
            for old, new in zip(
                sums.get_many(keys, groups), grouped.column("v_sum").to_pylist(), strict=True
            )
        ]
        sums.update_many(keys, totals, groups)
        ends = pc.multiply(pc.add(pc.divide(batch.column("ts"), 1000), 1), 1000)
        ctx.register_event_time_timers(ctx.keys, ends)
        return pa.RecordBatch.from_arrays([keys, pa.array(totals, pa.int64())], names=["k", "sum"])

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedBatchContext) -> list[pa.RecordBatch]:
        sums = ctx.get_value_state("sum", 0)
        values = sums.get_many(ctx.keys, ctx.key_groups)
        sums.update_many(ctx.keys, [None] * len(values), ctx.key_groups)  # None clears
        return [
            pa.RecordBatch.from_arrays(
                [ctx.keys, timers.column("timestamp"), pa.array(values, pa.int64())],
                names=["k", "window_end", "final"],
            )
        ]


def test_keyed_batch_function_bulk_state_and_timers() -> None:
    op = KeyedBatchProcess("k", RunningSum())
    op.open(keyed_ctx())
    rows = [{"k": k, "v": v, "ts": ts} for k, v, ts in [("a", 1, 10), ("b", 2, 20), ("a", 3, 900)]]
    out = op.process_batch(batch(rows))
    assert rows_of(out) == [{"k": "a", "sum": 4}, {"k": "b", "sum": 2}]
    out = op.process_batch(batch([{"k": "b", "v": 5, "ts": 1500}]))
    assert [r for b in out for r in b.to_pylist()] == [{"k": "b", "sum": 7}]
    fired = op.process_watermark(1000)
    assert rows_of(fired) == [
        {"k": "a", "window_end": 1000, "final": 4},
        {"k": "b", "window_end": 1000, "final": 7},
    ]
    assert op.process_watermark(MAX_WATERMARK)[0].to_pylist() == [
        {"k": "b", "window_end": 2000, "final": 0}
    ]
    with pytest.raises(InvalidArgumentError, match="KeyedBatchFunction"):
        KeyedBatchProcess("k", RunningSum)  # type: ignore[arg-type]


class Deadline(KeyedBatchFunction):
    """A key's deadline is its last record's ts + 100: a newer record deletes the old timer
    (bulk delete) and sets a new one; a timer fires with the key's last value."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> None:
        last = ctx.get_value_state("last")
        olds = last.get_many(ctx.keys, ctx.key_groups)
        moved = [(k, o["ts"] + 100) for k, o in zip(ctx.keys.to_pylist(), olds, strict=True) if o]
        ctx.delete_event_time_timers([k for k, _ in moved], [t for _, t in moved])
        rows = batch.to_pylist()
        last.update_many(ctx.keys, rows, ctx.key_groups)
        ctx.register_event_time_timers(ctx.keys, [r["ts"] + 100 for r in rows])

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedBatchContext) -> list[pa.RecordBatch]:
        values = ctx.get_value_state("last").get_many(ctx.keys, ctx.key_groups)
        return [batch([{"k": v["k"], "v": v["v"], "due": v["ts"] + 100} for v in values if v])]


def test_keyed_batch_function_deletes_timers_in_bulk() -> None:
    op = KeyedBatchProcess("k", Deadline())
    op.open(keyed_ctx())
    op.process_batch(batch([{"k": "a", "v": 1, "ts": 10}, {"k": "b", "v": 2, "ts": 20}]))
    op.process_batch(batch([{"k": "a", "v": 3, "ts": 50}]))  # a's deadline 110 -> 150
    assert rows_of(op.process_watermark(120)) == [{"k": "b", "v": 2, "due": 120}]
    assert rows_of(op.process_watermark(MAX_WATERMARK)) == [{"k": "a", "v": 3, "due": 150}]
    octx = keyed_ctx()
    ctx = KeyedBatchContext(octx.require_keyed_state("test"), octx)
    ctx.delete_event_time_timers(["a"], [150])  # no such timer: a no-op, not an error
    with pytest.raises(StateError, match="1 keys but 2 timestamps"):
        ctx.delete_event_time_timers(["a"], [1, 2])


# ---------------------------------------------------------------------------------------------
# pandas at the edge
# ---------------------------------------------------------------------------------------------


def test_pandas_round_trip() -> None:
    pytest.importorskip("pandas")
    b = batch([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    df = to_pandas(b)
    df["v"] = df["v"] * 10
    assert from_pandas(df).to_pylist() == [{"k": "a", "v": 10}, {"k": "b", "v": 20}]
    schema = pa.schema([("k", pa.string()), ("v", pa.int32())])
    assert from_pandas(df, schema).schema == schema
    with pytest.raises(InvalidArgumentError, match=r"pandas\.DataFrame"):
        from_pandas(b)


def test_pandas_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(InvalidArgumentError, match=r"pip install 'snapflow\[pandas\]'"):
        to_pandas(batch([{"k": "a"}]))

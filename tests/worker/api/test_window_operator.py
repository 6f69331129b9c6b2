"""The window operator (worker/api/window_operator.py) beyond the built-in aggregations of
test_windows.py: sessions, late rows to a side output, window functions, processing time with
an injected clock, snapshot/restore and rescale, and the window join and co-group of two
inputs, each with exact outputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.functions import AggregateFunction
from snapflow.worker.api.window_assigners import (
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from snapflow.worker.api.window_contents import AggregateContents, RowsContents
from snapflow.worker.api.window_emitters import ProcessWindow
from snapflow.worker.api.window_functions import ProcessWindowFunction, WindowContext
from snapflow.worker.api.window_join import window_co_group, window_join
from snapflow.worker.api.window_operator import WindowAggregate, WindowOperator
from snapflow.worker.runtime.operator import OperatorContext, OutputTag
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend

LATE = OutputTag("late")


def ctx(
    backend: KeyedStateBackend | None = None, key_fields: tuple[str, ...] = ("key",)
) -> OperatorContext:
    return OperatorContext(
        operator_id="win",
        keyed_state=backend or KeyedStateBackend.for_subtask(128, 1, 0),
        key_field=key_fields[0],
        input_key_fields=key_fields,
    )


def batch(records: list[tuple[Any, int, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [r[0] for r in records],
            "ts": pa.array([r[1] for r in records], pa.int64()),
            "value": pa.array([r[2] for r in records], pa.int64()),
        }
    )


def rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b.to_pylist()]


def agg_rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, int, int, Any]]:
    return [(r["key"], r["window_start"], r["window_end"], r["value"]) for r in rows(batches)]


def side(op: WindowOperator) -> list[tuple[str, list[dict[str, Any]]]]:
    c = op.ctx
    assert c is not None
    out = [(name, b.to_pylist()) for name, b in c.side_outputs]
    c.side_outputs.clear()
    return out


def backend_of(op: WindowOperator) -> KeyedStateBackend:
    assert op.ctx is not None and op.ctx.keyed_state is not None
    return op.ctx.keyed_state


def assert_empty(op: WindowOperator) -> None:
    backend = backend_of(op)
    assert backend.timer_service.num_timers() == 0
    for name in backend.state_names():
        assert list(backend.entries(name)) == [], name


# --- sessions and late data ---------------------------------------------------------------


def test_session_count_merges_out_of_order_rows_and_sends_late_rows_aside() -> None:
    op = WindowAggregate(
        "key", "ts", None, EventTimeSessionWindows(10), "count", late_data_tag=LATE
    )
    op.open(ctx())
    assert op.process_batch(batch([("a", 0, 0), ("a", 25, 0), ("a", 5, 0), ("b", 3, 0)])) == []
    assert agg_rows(op.process_watermark(14)) == [("b", 3, 13, 1), ("a", 0, 15, 2)]
    # 16 reaches back to 25's session: [16, 35); the late 1 ([1, 11), past the watermark)
    # meets no session in state and goes to the side output, whole
    assert op.process_batch(batch([("a", 16, 7), ("a", 1, 9)])) == []
    assert side(op) == [("late", [{"key": "a", "ts": 1, "value": 9}])]
    assert op.num_late_records_dropped == 0
    assert agg_rows(op.process_watermark(33)) == []
    assert agg_rows(op.process_watermark(34)) == [("a", 16, 35, 2)]
    assert_empty(op)


def test_session_merge_moves_state_and_timers_and_refires_within_lateness() -> None:
    op = WindowAggregate(
        "key", "ts", "value", EventTimeSessionWindows(10), "sum", allowed_lateness_ms=20
    )
    op.open(ctx())
    op.process_batch(batch([("a", 0, 1), ("a", 30, 2)]))  # [0, 10) and [30, 40)
    assert agg_rows(op.process_watermark(9)) == [("a", 0, 10, 1)]
    # within the lateness ([0, 10) is kept until 9 + 20): the fired session takes the row and
    # fires again at once with the new sum
    assert agg_rows(op.process_batch(batch([("a", 0, 10)]))) == [("a", 0, 10, 11)]
    # 5, 14, 22 chain [0, 10) to [30, 40): one session [0, 40); the old windows' timers go
    assert op.process_batch(batch([("a", 5, 100), ("a", 14, 200), ("a", 22, 300)])) == []
    backend = backend_of(op)
    assert sorted(t.timestamp for t in backend.timer_service.timers()) == [39, 59]
    assert agg_rows(op.process_watermark(38)) == []
    assert agg_rows(op.process_watermark(39)) == [("a", 0, 40, 613)]
    assert agg_rows(op.process_watermark(59)) == []
    assert_empty(op)


def test_late_rows_of_sliding_windows_go_aside_once_even_in_gaps() -> None:
    op = WindowAggregate(
        "key", "ts", "value", SlidingEventTimeWindows(5, 8), "sum", late_data_tag=LATE
    )
    op.open(ctx())
    op.process_watermark(20)
    # windows [16, 21), [24, 29), ...: 6 lies in a gap and is late itself, 18 and 19 are in
    # [16, 21), which fired; 22 lies in a gap but is not late (dropped silently, as in Flink)
    op.process_batch(batch([("a", 6, 1), ("a", 18, 2), ("a", 19, 3), ("a", 22, 4), ("a", 25, 5)]))
    late = side(op)
    assert late == [
        (
            "late",
            [
                {"key": "a", "ts": 6, "value": 1},
                {"key": "a", "ts": 18, "value": 2},
                {"key": "a", "ts": 19, "value": 3},
            ],
        )
    ]
    assert agg_rows(op.end_input()) == [("a", 24, 29, 5)]


# --- window functions ---------------------------------------------------------------------


class Summary(ProcessWindowFunction):
    def process(self, key: Any, window: TimeWindow, elements: Any, ctx: WindowContext) -> Any:
        assert ctx.key == key and ctx.window == window
        return [
            {
                "key": key,
                "start": window.start,
                "end": window.end,
                "values": sorted(elements.column("value").to_pylist()),
                "wm": ctx.current_watermark,
            }
        ]


def test_process_window_function_sees_every_row_of_a_merged_session() -> None:
    op = WindowOperator(
        ("key",),
        ("ts",),
        EventTimeSessionWindows(5),
        (RowsContents(),),
        ProcessWindow(Summary(), None, single_result=False),
    )
    op.open(ctx())
    op.process_batch(batch([("a", 10, 1), ("a", 0, 2)]))
    op.process_batch(batch([("a", 4, 3), ("b", 2, 4)]))  # a: [0, 9) and [10, 15)
    op.process_batch(batch([("a", 7, 5)]))  # [7, 12) bridges [0, 9) and [10, 15)
    assert rows(op.process_watermark(100)) == [
        {"key": "b", "start": 2, "end": 7, "values": [4], "wm": 100},
        {"key": "a", "start": 0, "end": 15, "values": [1, 2, 3, 5], "wm": 100},
    ]
    assert_empty(op)


def test_aggregate_with_window_function_gets_the_result_and_the_window() -> None:
    mean = AggregateFunction.of(
        lambda: (0, 0),
        lambda v, acc: (acc[0] + v, acc[1] + 1),
        lambda acc: acc[0] / acc[1],
        merge=lambda a, b: (a[0] + b[0], a[1] + b[1]),
    )

    def describe(key: Any, window: TimeWindow, elements: Any, ctx: WindowContext) -> Any:
        return {"key": key, "window": f"{window.start}-{window.end}", "mean": elements[0]}

    op = WindowOperator(
        ("key",),
        ("ts",),
        EventTimeSessionWindows(10),
        (AggregateContents(mean, "value"),),
        ProcessWindow(describe, None, single_result=True),
    )
    op.open(ctx())
    op.process_batch(batch([("a", 0, 1), ("a", 30, 10)]))
    op.process_batch(batch([("a", 15, 2), ("a", 8, 3)]))  # a: [0, 25) and [30, 40)
    assert rows(op.process_watermark(1000)) == [
        {"key": "a", "window": "0-25", "mean": 2.0},
        {"key": "a", "window": "30-40", "mean": 10.0},
    ]
    # without merge, sessions refuse to merge accumulators, naming the fix
    op2 = WindowOperator(
        ("key",),
        ("ts",),
        EventTimeSessionWindows(10),
        (
            AggregateContents(
                AggregateFunction.of(lambda: 0, lambda v, a: a + v, lambda a: a), "value"
            ),
        ),
        ProcessWindow(describe, None, single_result=True),
    )
    op2.open(ctx())
    op2.process_batch(batch([("a", 0, 1), ("a", 20, 1)]))
    with pytest.raises(InvalidArgumentError, match="merge"):
        op2.process_batch(batch([("a", 10, 1)]))


# --- processing time ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_processing_time_tumbling_and_session_windows_with_an_injected_clock(tmp_path: Any) -> None:
    clock = Clock()
    op = WindowAggregate("key", None, None, TumblingProcessingTimeWindows(10), "count", clock=clock)
    op.open(ctx())
    clock.now = 3
    assert op.process_batch(batch([("a", 999, 0), ("b", -5, 0)])) == []  # ts fields unused
    clock.now = 8
    assert op.process_batch(batch([("a", 0, 0)])) == []
    clock.now = 10  # the clock passed [0, 10): the next call fires it, before its rows
    assert agg_rows(op.process_batch(batch([("a", 0, 0)]))) == [("a", 0, 10, 2), ("b", 0, 10, 1)]
    assert agg_rows(op.process_watermark(-1)) == []
    clock.now = 25
    assert agg_rows(op.process_watermark(-1)) == [("a", 10, 20, 1)]

    sessions = WindowAggregate(
        "key", None, None, ProcessingTimeSessionWindows(5), "count", clock=clock
    )
    sessions.open(ctx())
    clock.now = 100
    sessions.process_batch(batch([("a", 0, 0)]))
    clock.now = 103
    assert sessions.process_batch(batch([("a", 0, 0), ("b", 0, 0)])) == []
    # a: [100, 108) (merged); b: [103, 108)
    snap = backend_of(sessions).snapshot(1)
    clock.now = 108
    assert agg_rows(sessions.process_watermark(0)) == [("a", 100, 108, 2), ("b", 103, 108, 1)]
    # a restore rebuilds the due windows from the state: they fire on the first call
    restored = KeyedStateBackend.for_subtask(128, 1, 0)
    restored.restore(snap.write(tmp_path))
    again = cloudpickle.loads(
        cloudpickle.dumps(
            WindowAggregate(
                "key", None, None, ProcessingTimeSessionWindows(5), "count", clock=clock
            )
        )
    )
    again.clock = clock  # the shipped copy's clock is a copy too: drive this one
    again.open(ctx(restored))
    clock.now = 200
    assert sorted(agg_rows(again.process_batch(batch([("c", 0, 0)])))) == [
        ("a", 100, 108, 2),
        ("b", 103, 108, 1),
    ]
    assert agg_rows(again.end_input()) == [("c", 200, 205, 1)]  # end of input fires the rest
    with pytest.raises(InvalidArgumentError, match="event time only"):
        WindowAggregate(
            "key", None, None, TumblingProcessingTimeWindows(5), "count", allowed_lateness_ms=1
        )


# --- snapshot, restore, rescale -----------------------------------------------------------


def session_events() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for i in range(12):
        out.append(("batch", [(k, i * 7 + (k * 3) % 11, k + i) for k in range(6)]))
        out.append(("wm", i * 7 - 12))
    out.append(("wm", 10_000))
    return out


def run_events(
    ops: Sequence[WindowOperator], events: list[tuple[str, Any]]
) -> list[tuple[Any, ...]]:
    got: list[tuple[Any, ...]] = []
    for kind, payload in events:
        for op in ops:
            if kind == "wm":
                got += agg_rows(op.process_watermark(payload))
                continue
            backend = backend_of(op)
            mine = [
                r for r in payload if kgs.key_group_for_key(r[0], 128) in backend.key_group_range
            ]
            if mine:
                got += agg_rows(op.process_batch(batch(mine)))
    return got


def new_op() -> WindowAggregate:
    return WindowAggregate(
        "key", "ts", "value", EventTimeSessionWindows(6), "sum", allowed_lateness_ms=4
    )


def test_session_state_snapshot_restore_and_rescale(tmp_path: Any) -> None:
    events = session_events()
    full = new_op()
    full.open(ctx())
    expected = run_events([full], events)
    assert len(expected) > 10

    op = new_op()
    op.open(ctx())
    cut = len(events) // 2
    got = run_events([op], events[:cut])
    handles = backend_of(op).snapshot(1).write(tmp_path)
    last_wm = max(p for k, p in events[:cut] if k == "wm")
    for parallelism in (1, 2, 3):  # restore as it was, and rescaled up
        ops = []
        for i in range(parallelism):
            b = KeyedStateBackend.for_subtask(128, parallelism, i)
            b.restore(handles)
            o = new_op()
            o.open(ctx(b))
            ops.append(o)
        rest = run_events(ops, [("wm", last_wm), *events[cut:]])
        assert sorted(got + rest) == sorted(expected), parallelism


# --- window join and co-group -------------------------------------------------------------


def left(records: list[tuple[Any, int, str]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": [r[0] for r in records],
            "ts": pa.array([r[1] for r in records], pa.int64()),
            "x": [r[2] for r in records],
        }
    )


def right(records: list[tuple[Any, int, str]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "user": [r[0] for r in records],
            "ts": pa.array([r[1] for r in records], pa.int64()),
            "y": [r[2] for r in records],
        }
    )


def test_default_window_join_emits_pairs_with_prefixed_clashing_columns() -> None:
    op = window_join(("id", "user"), ("ts", "ts"), TumblingEventTimeWindows(10))
    op.open(ctx(key_fields=("id", "user")))
    op.process_input(0, left([(1, 1, "a"), (1, 5, "b"), (2, 3, "c"), (1, 12, "d")]))
    op.process_input(1, right([(1, 9, "P"), (3, 2, "Q"), (1, 15, "R")]))
    out = op.process_watermark(9)
    assert out[0].schema.names == ["id", "left_ts", "x", "user", "right_ts", "y"]
    assert rows(out) == [
        {"id": 1, "left_ts": 1, "x": "a", "user": 1, "right_ts": 9, "y": "P"},
        {"id": 1, "left_ts": 5, "x": "b", "user": 1, "right_ts": 9, "y": "P"},
    ]
    assert rows(op.end_input()) == [
        {"id": 1, "left_ts": 12, "x": "d", "user": 1, "right_ts": 15, "y": "R"}
    ]
    assert_empty(op)


def test_window_join_function_and_co_group_over_sessions_merged_across_inputs() -> None:
    join = window_join(
        ("id", "user"),
        ("ts", "ts"),
        EventTimeSessionWindows(5),
        lambda a, b: {"id": a["id"], "pair": a["x"] + b["y"]},
    )
    join.open(ctx(key_fields=("id", "user")))
    join.process_input(0, left([(1, 0, "a"), (1, 20, "b")]))
    join.process_input(1, right([(1, 4, "P"), (1, 12, "Q")]))  # 4 joins [0, 5): [0, 9)
    join.process_input(0, left([(1, 8, "c")]))  # [8, 13) bridges [0, 9) and [12, 17)
    assert rows(join.process_watermark(100)) == [
        {"id": 1, "pair": p} for p in ["aP", "aQ", "cP", "cQ"]
    ]

    def co_group(first: pa.RecordBatch, second: pa.RecordBatch, c: WindowContext) -> Any:
        return {
            "key": c.key,
            "window": [c.window.start, c.window.end],
            "first": sorted(first.column("x").to_pylist()) if first.num_rows else [],
            "second": sorted(second.column("y").to_pylist()) if second.num_rows else [],
        }

    cg = window_co_group(("id", "user"), ("ts", "ts"), EventTimeSessionWindows(5), co_group)
    cg.open(ctx(key_fields=("id", "user")))
    cg.process_input(0, left([(1, 0, "a"), (2, 0, "z")]))
    cg.process_input(1, right([(1, 3, "P"), (3, 50, "Q")]))
    assert rows(cg.end_input()) == [
        {"key": 2, "window": [0, 5], "first": ["z"], "second": []},
        {"key": 1, "window": [0, 8], "first": ["a"], "second": ["P"]},
        {"key": 3, "window": [50, 55], "first": [], "second": ["Q"]},
    ]


def test_a_processing_time_window_fires_in_its_task_while_no_input_arrives() -> None:
    """The task's processing-time timers: the window's end passes while the input stays open
    and silent, and the window fires then, not at the next batch or the end of input."""
    import asyncio

    from kit.subtasks import harness

    from snapflow.worker.runtime.frames import DataFrame, EndOfPartitionFrame
    from snapflow.worker.runtime.input_gate import InputGate

    async def main() -> None:
        op = WindowAggregate("key", None, None, TumblingProcessingTimeWindows(50), "count")
        h = harness([op], num_inputs=1, key_fields=("key",))
        run = asyncio.ensure_future(h.task.run())
        await h.inputs[0].output.send(DataFrame(batch([("a", 0, 0), ("a", 0, 0), ("b", 0, 0)])))
        out = InputGate([h.output.input])
        async with asyncio.timeout(10):
            _, frame = await out.next() or (0, None)
        assert isinstance(frame, DataFrame)
        assert sorted((r["key"], r["value"]) for r in frame.batch.to_pylist()) == [
            ("a", 2),
            ("b", 1),
        ]
        assert not run.done()  # the input is still open: the timer fired the window
        await h.inputs[0].output.close()
        async with asyncio.timeout(10):
            await run
            rest = []
            while (item := await out.next()) is not None:
                rest.append(item[1])
        assert [f for f in rest if isinstance(f, DataFrame)] == []
        assert isinstance(rest[-1], EndOfPartitionFrame)

    asyncio.run(main())

"""Event-time windows (worker/api/window_operator.py) against a brute-force reference."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.api.functions import KeyedContext
from snapflow.worker.api.keyed_operators import KeyedProcess
from snapflow.worker.api.window_assigners import (
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WindowAssigner,
)
from snapflow.worker.api.window_operator import WindowAggregate
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend

Row = tuple[Any, int, int, Any]  # key, window_start, window_end, value


def ctx(backend: KeyedStateBackend | None = None, operator_id: str = "win") -> OperatorContext:
    return OperatorContext(
        operator_id=operator_id,
        keyed_state=backend or KeyedStateBackend.for_subtask(128, 1, 0),
        key_field="key",
    )


def batch(records: list[tuple[Any, int, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [r[0] for r in records],
            "ts": pa.array([r[1] for r in records], pa.int64()),
            "value": pa.array([r[2] for r in records], pa.int64()),
        }
    )


def out_rows(batches: list[pa.RecordBatch], field: str = "value") -> list[Row]:
    return [
        (r["key"], r["window_start"], r["window_end"], r[field])
        for b in batches
        for r in b.to_pylist()
    ]


_PY_AGG: dict[str, Any] = {"sum": sum, "count": len, "min": min, "max": max}


def reference(
    events: list[Any], assigner: WindowAssigner, agg: str, lateness: int
) -> tuple[list[Row], int]:
    """Brute force, record by record: Flink's WindowOperator with the EventTimeTrigger."""
    size = assigner.size_ms
    wm = MIN_WATERMARK
    contents: dict[tuple[Any, int], list[Any]] = {}
    out: list[Row] = []
    dropped = 0
    for kind, payload in events:
        if kind == "batch":
            refire: set[tuple[Any, int]] = set()
            for k, ts, v in payload:
                kept = False
                for start in assigner.window_starts(ts):
                    max_ts = start + size - 1
                    if max_ts + lateness <= wm:
                        continue  # late window: skipped
                    kept = True
                    contents.setdefault((k, start), []).append(v)
                    if max_ts <= wm:
                        refire.add((k, start))
                dropped += not kept and ts + lateness <= wm
            out.extend((k, s, s + size, _PY_AGG[agg](contents[(k, s)])) for k, s in sorted(refire))
        else:
            new = payload
            if new <= wm:
                continue
            for (k, s), values in sorted(contents.items()):
                max_ts = s + size - 1
                if wm < max_ts <= new:
                    out.append((k, s, s + size, _PY_AGG[agg](values)))
            for k, s in [w for w in contents if w[1] + size - 1 + lateness <= new]:
                del contents[(k, s)]
            wm = new
    return out, dropped


def run(op: WindowAggregate, events: list[Any]) -> list[Row]:
    out = []
    for kind, payload in events:
        if kind == "batch":
            out.extend(op.process_batch(batch(payload)))
        else:
            out.extend(op.process_watermark(payload))
    return out_rows(out)


def random_events(seed: int, n_batches: int = 25, delay: int = 4) -> list[Any]:
    """Out-of-order records (jitter up to 12 ms behind the front) and watermarks that trail the
    front by only ``delay`` ms, so some records are late; a few are very late."""
    rng = random.Random(seed)
    events: list[Any] = []
    front = 1000
    for _ in range(n_batches):
        records = []
        for _ in range(rng.randint(0, 30)):
            front += rng.randint(0, 2)
            ts = front - rng.randint(0, 12)
            if rng.random() < 0.05:
                ts -= rng.randint(20, 60)  # very late
            records.append((rng.randint(0, 4), ts, rng.randint(-50, 50)))
        events.append(("batch", records))
        if rng.random() < 0.7:
            events.append(("wm", front - delay))
    events.append(("wm", front + 1000))
    return events


ASSIGNERS = {
    "tumbling10": lambda: TumblingEventTimeWindows(10),
    "tumbling7_offset3": lambda: TumblingEventTimeWindows(7, offset_ms=3),
    "sliding10_3": lambda: SlidingEventTimeWindows(10, 3),
    "sliding12_4": lambda: SlidingEventTimeWindows(12, 4),
    "sliding5_8_gaps": lambda: SlidingEventTimeWindows(5, 8),
}


@pytest.mark.parametrize("assigner_name", sorted(ASSIGNERS))
@pytest.mark.parametrize("agg", ["sum", "count", "min", "max"])
@pytest.mark.parametrize("lateness", [0, 9])
def test_window_aggregate_matches_brute_force(assigner_name: str, agg: str, lateness: int) -> None:
    for seed in range(3):
        events = random_events(seed * 31 + len(assigner_name))
        assigner = ASSIGNERS[assigner_name]()
        op = WindowAggregate("key", "ts", "value", assigner, agg=agg, allowed_lateness_ms=lateness)
        op.open(ctx())
        got = run(op, events)
        expected, dropped = reference(events, assigner, agg, lateness)
        assert sorted(got) == sorted(expected)
        assert op.num_late_records_dropped == dropped
        # everything fired and cleaned up at the end
        backend: Any = op.ctx.keyed_state  # type: ignore[union-attr]
        assert backend.timer_service.num_timers() == 0
        assert list(backend.entries("win/window")) == []


def test_tumbling_exact_rows_late_drop_and_lateness_refire() -> None:
    op = WindowAggregate(
        "key", "ts", "value", TumblingEventTimeWindows(10), "sum", allowed_lateness_ms=5
    )
    op.open(ctx())
    assert op.process_batch(batch([("a", 1, 1), ("a", 9, 2), ("b", 12, 5), ("a", 10, 7)])) == []
    assert out_rows(op.process_watermark(8)) == []
    assert out_rows(op.process_watermark(9)) == [("a", 0, 10, 3)]
    # late but within the allowed lateness: updated result at once
    assert out_rows(op.process_batch(batch([("a", 3, 10)]))) == [("a", 0, 10, 13)]
    assert out_rows(op.process_watermark(14)) == []  # cleanup of [0, 10) at 9 + 5 = 14
    assert op.process_batch(batch([("a", 4, 100)])) == []  # beyond the lateness: dropped
    assert op.num_late_records_dropped == 1
    assert sorted(out_rows(op.process_watermark(19))) == [("a", 10, 20, 7), ("b", 10, 20, 5)]
    assert op.end_input() == []


def test_count_without_value_field_and_output_field() -> None:
    op = WindowAggregate(
        "key", "ts", None, SlidingEventTimeWindows(4, 2), "count", output_field="n"
    )
    op.open(ctx())
    op.process_batch(batch([(1, 0, 0), (1, 1, 0), (1, 3, 0)]))
    out = op.end_input()
    assert out[0].schema.names == ["key", "window_start", "window_end", "n"]
    assert sorted(out_rows(out, "n")) == [(1, -2, 2, 2), (1, 0, 4, 3), (1, 2, 6, 1)]


def test_timestamp_column_and_output_types() -> None:
    op = WindowAggregate("key", "ts", "value", TumblingEventTimeWindows(1000), "max")
    op.open(ctx())
    b = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(["x", "x"], pa.string()),
            "ts": pa.array([1_500, 1_999], pa.timestamp("ms")),
            "value": pa.array([1.5, 0.5], pa.float32()),
        }
    )
    op.process_batch(b)
    out = op.process_watermark(1_999)
    assert out[0].schema.field("value").type == pa.float32()
    assert out[0].schema.field("key").type == pa.string()
    assert out_rows(out) == [("x", 1000, 2000, 1.5)]


def test_assigners_scalar_and_vectorised_agree() -> None:
    rng = random.Random(5)
    timestamps = [rng.randint(-1000, 1000) for _ in range(500)] + [0, -1, 9, 10, -10]
    arr = pa.array(timestamps, pa.int64())
    for assigner in [f() for f in ASSIGNERS.values()]:
        rows_idx, starts = assigner.assign(arr)
        pairs = (
            list(enumerate(starts.to_pylist()))
            if rows_idx is None
            else list(zip(rows_idx.to_pylist(), starts.to_pylist(), strict=True))
        )
        expected = [(i, s) for i, ts in enumerate(timestamps) for s in assigner.window_starts(ts)]
        assert sorted(pairs) == sorted(expected)
        for i, s in pairs:  # every window really contains its record
            assert s <= timestamps[i] < s + assigner.size_ms
    assert TumblingEventTimeWindows(10).window_starts(-1) == [-10]
    assert SlidingEventTimeWindows(10, 5).window_starts(7) == [5, 0]
    with pytest.raises(InvalidArgumentError):
        TumblingEventTimeWindows(0)
    with pytest.raises(InvalidArgumentError):
        SlidingEventTimeWindows(10, 5, offset_ms=5)
    with pytest.raises(InvalidArgumentError):
        WindowAggregate("key", "ts", None, TumblingEventTimeWindows(5), "sum")


def test_snapshot_restore_continues_exactly(tmp_path: Any) -> None:
    events = random_events(99, n_batches=30, delay=20)
    assigner = SlidingEventTimeWindows(10, 5)
    expected, _ = reference(events, assigner, "sum", 3)

    op = WindowAggregate("key", "ts", "value", assigner, "sum", allowed_lateness_ms=3)
    op.open(ctx())
    cut = len(events) // 2
    got = run(op, events[:cut])
    snap = op.ctx.keyed_state.snapshot(1)  # type: ignore[union-attr]
    run(op, events[cut : cut + 5])  # processed after the checkpoint, then lost in a crash
    handles = snap.write(tmp_path)

    restored_backend = KeyedStateBackend.for_subtask(128, 1, 0)
    restored_backend.restore(handles)
    op2 = cloudpickle.loads(
        cloudpickle.dumps(
            WindowAggregate("key", "ts", "value", assigner, "sum", allowed_lateness_ms=3)
        )
    )
    op2.open(ctx(restored_backend))
    last_wm = max([p for k, p in events[:cut] if k == "wm"], default=None)
    if last_wm is not None:  # watermarks are not snapshotted; upstream re-sends one
        got += out_rows(op2.process_watermark(last_wm))
    got += run(op2, events[cut:])
    assert sorted(got) == sorted(expected)


def test_window_and_process_timers_share_one_backend() -> None:
    def fn(key: Any, rows: list[dict[str, Any]], kctx: KeyedContext) -> list[dict[str, Any]]:
        kctx.register_event_time_timer(rows[0]["ts"] + 100)
        return [{"key": key, "ts": r["ts"], "value": r["value"]} for r in rows]

    def on_timer(ts: int, key: Any, kctx: KeyedContext) -> list[dict[str, Any]]:
        return [{"key": key, "ts": ts, "value": 1000}]

    process = KeyedProcess("key", fn, on_timer)
    window = WindowAggregate("key", "ts", "value", TumblingEventTimeWindows(50), "sum")
    chain = Chain([process, window])
    chain.open(ctx(operator_id="v"))
    chain.process_batch(batch([(1, 10, 1), (1, 20, 2)]))
    # the process timer (110) emits a row into window [100, 150); the window [0, 50) fires
    assert out_rows(chain.process_watermark(120)) == [(1, 0, 50, 3)]
    assert out_rows(chain.process_watermark(149)) == [(1, 100, 150, 1000)]

"""The interval join operator: exact pairs for inclusive and exclusive bounds, out-of-order and
late rows, the buffers' clean-up at the watermark (Flink's timer instants), key types,
snapshot and restore mid-stream, rescale 2 -> 3 of its keyed state, and the pair functions."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.api.interval_join import IntervalJoinOperator
from snapflow.worker.api.join_functions import (
    BatchJoinContext,
    BatchJoinFunction,
    JoinContext,
    ProcessJoinFunction,
)
from snapflow.worker.api.join_output import BatchPairs, PerPair, SelectPairs
from snapflow.worker.runtime.operator import OperatorContext, OutputTag
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend

MAXP = 128


def ctx(backend: KeyedStateBackend | None = None, restored: int = 0) -> OperatorContext:
    return OperatorContext(
        operator_id="join",
        keyed_state=backend or KeyedStateBackend.for_subtask(MAXP, 1, 0),
        input_key_fields=("k", "k"),
        restored_checkpoint_id=restored,
    )


def join(lower: int = -1, upper: int = 2, **kw: Any) -> IntervalJoinOperator:
    op = IntervalJoinOperator("k", "k", "ts", "ts", lower, upper, **kw)
    op.open(ctx())
    return op


def left(*rows: tuple[Any, int, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": k, "ts": t, "a": a} for k, t, a in rows])


def right(*rows: tuple[Any, int, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": k, "ts": t, "b": b} for k, t, b in rows])


def pairs(batches: list[pa.RecordBatch]) -> list[tuple[str, str]]:
    return [(r["a"], r["b"]) for b in batches for r in b.to_pylist()]


def test_inclusive_bounds_exact_pairs_and_columns() -> None:
    op = join(-1, 2)
    assert op.process_input(1, right((1, 9, "r9"), (1, 10, "r10"), (1, 12, "r12"))) == []
    assert op.process_input(1, right((1, 13, "r13"), (2, 10, "x"))) == []
    out = op.process_input(0, left((1, 10, "l10")))
    # r.ts in [10 - 1, 10 + 2]; key 2 never meets key 1
    assert pairs(out) == [("l10", "r9"), ("l10", "r10"), ("l10", "r12")]
    assert out[0].schema.names == ["k", "left_ts", "a", "right_ts", "b"]
    assert out[0].to_pylist()[0] == {"k": 1, "left_ts": 10, "a": "l10", "right_ts": 9, "b": "r9"}
    # a right row arriving later finds the left row
    assert pairs(op.process_input(1, right((1, 11, "r11"), (1, 8, "r8")))) == [("l10", "r11")]


def test_exclusive_bounds_move_by_one_ms() -> None:
    op = join(-1, 2, lower_inclusive=False, upper_inclusive=False)
    assert (op.lower_ms, op.upper_ms) == (0, 1)
    op.process_input(1, right((1, 9, "r9"), (1, 10, "r10"), (1, 11, "r11"), (1, 12, "r12")))
    assert sorted(pairs(op.process_input(0, left((1, 10, "l"))))) == [("l", "r10"), ("l", "r11")]
    # exclusive bounds may leave an empty range, as in Flink
    empty = join(0, 0, lower_inclusive=False)
    empty.process_input(1, right((1, 10, "r")))
    assert empty.process_input(0, left((1, 10, "l"))) == []


def test_out_of_order_rows_within_the_watermark_join() -> None:
    op = join(0, 5)
    op.process_watermark(100)
    op.process_input(0, left((1, 110, "l110"), (1, 101, "l101")))
    out = op.process_input(1, right((1, 104, "r104"), (1, 115, "r115"), (1, 100, "r100")))
    assert sorted(pairs(out)) == [("l101", "r104"), ("l110", "r115")]
    assert sorted(pairs(op.process_input(1, right((1, 106, "r106"))))) == [("l101", "r106")]


def test_late_rows_are_dropped_or_go_to_a_side_output() -> None:
    op = join(-5, 5)
    op.process_input(1, right((1, 50, "r50")))
    op.process_watermark(50)
    # 49 < watermark: late, dropped and counted; 50 is not late and still meets r50
    assert pairs(op.process_input(0, left((1, 49, "late"), (1, 50, "l50")))) == [("l50", "r50")]
    assert op.num_late_records_dropped == 1

    late_l, late_r = OutputTag("late-left"), OutputTag("late-right")
    op2 = join(0, 5, left_late=late_l, right_late=late_r)
    op2.process_watermark(50)
    op2.process_input(0, left((1, 10, "old")))
    op2.process_input(1, right((2, 20, "older")))
    assert op2.num_late_records_dropped == 0
    side = op2.ctx.side_outputs  # type: ignore[union-attr]
    assert [(tag, b.to_pylist()) for tag, b in side] == [
        ("late-left", [{"k": 1, "ts": 10, "a": "old"}]),
        ("late-right", [{"k": 2, "ts": 20, "b": "older"}]),
    ]


def test_buffers_are_cleaned_when_the_watermark_passes_flinks_timers() -> None:
    # left rows kept until wm >= ts + upper, right rows until wm >= ts - lower
    op = join(-3, 5)
    assert (op.retention_ms(0), op.retention_ms(1)) == (5, 3)
    op.process_input(0, left((1, 10, "l10"), (2, 20, "l20")))
    op.process_input(1, right((1, 10, "r10"), (2, 20, "r20")))
    assert (op.buffered(0), op.buffered(1)) == (2, 2)
    op.process_watermark(12)
    assert (op.buffered(0), op.buffered(1)) == (2, 2)
    op.process_watermark(13)  # r10 at 10 + 3
    assert (op.buffered(0), op.buffered(1)) == (2, 1)
    op.process_watermark(15)  # l10 at 10 + 5
    assert (op.buffered(0), op.buffered(1)) == (1, 1)
    op.process_watermark(23)  # r20 at 20 + 3
    assert (op.buffered(0), op.buffered(1)) == (1, 0)
    op.process_watermark(25)
    assert (op.buffered(0), op.buffered(1)) == (0, 0)
    # an expired row never matches again, even at the bound's edge (Flink has removed it):
    # a right row at ts 25 == watermark is not late, and l20 + 5 == 25, but l20 is gone
    assert op.process_input(1, right((2, 25, "edge"))) == []


def test_negative_upper_bound_keeps_left_rows_until_their_own_time() -> None:
    op = join(-10, -2)
    assert (op.retention_ms(0), op.retention_ms(1)) == (0, 10)
    op.process_input(0, left((1, 10, "l")))
    op.process_watermark(9)
    assert op.buffered(0) == 1
    op.process_watermark(10)
    assert op.buffered(0) == 0


def test_a_row_at_the_watermark_meets_rows_until_the_next_one() -> None:
    # upper 0: a left row at ts == watermark has its clean-up "timer" at the watermark; Flink
    # fires it at the next advance, so a right row at the same time still joins
    op = join(0, 0)
    op.process_watermark(10)
    op.process_input(0, left((1, 10, "l")))
    assert pairs(op.process_input(1, right((1, 10, "r")))) == [("l", "r")]
    op.process_watermark(11)
    assert (op.buffered(0), op.buffered(1)) == (0, 0)


def test_end_of_input_empties_the_buffers() -> None:
    op = join(0, 100)
    op.process_input(0, left((1, 10, "l")))
    assert op.end_input() == []
    assert op.buffered(0) == 0


@pytest.mark.parametrize(
    "make_key",
    [
        pytest.param(lambda i: f"user-{i}", id="string"),
        pytest.param(lambda i: i - 3, id="int64"),
        pytest.param(lambda i: f"k{i}".encode(), id="binary"),
    ],
)
def test_key_types_and_timestamp_columns(make_key: Any) -> None:
    op = IntervalJoinOperator("k", "k", "t", "t", 0, 1000)
    op.open(ctx())
    stamp = pa.timestamp("ms")
    lrows = pa.RecordBatch.from_pylist(
        [{"k": make_key(i), "t": 1_000 * i, "a": i} for i in range(6)],
        schema=pa.schema([("k", pa.array([make_key(0)]).type), ("t", stamp), ("a", pa.int64())]),
    )
    rrows = pa.RecordBatch.from_pylist(
        [{"k": make_key(i % 3), "t": 1_000 * i + 500, "b": i} for i in range(6)],
        schema=pa.schema([("k", pa.array([make_key(0)]).type), ("t", stamp), ("b", pa.int64())]),
    )
    op.process_input(0, lrows)
    got = sorted((r["a"], r["b"]) for b in op.process_input(1, rrows) for r in b.to_pylist())
    assert got == [(0, 0), (1, 1), (2, 2)]


def test_null_times_and_bad_bounds_are_refused() -> None:
    op = join()
    with pytest.raises(InvalidArgumentError, match="nulls"):
        op.process_input(0, pa.RecordBatch.from_pylist([{"k": 1, "ts": None, "a": "x"}]))
    with pytest.raises(InvalidArgumentError, match="lower <= upper"):
        IntervalJoinOperator("k", "k", "ts", "ts", 5, 1)
    with pytest.raises(InvalidArgumentError, match="two inputs"):
        op.process_input(2, left((1, 1, "x")))


# --- against a plain-Python reference ----------------------------------------------------------


def random_stream(seed: int, n: int = 400, keys: int = 7, delay: int = 6) -> list[Any]:
    """Batches of both inputs with out-of-order times and watermarks that make some rows late
    (``("wm", ts)`` entries)."""
    rnd = random.Random(seed)
    events: list[Any] = []
    now = 0
    for i in range(n // 10):
        side = rnd.randrange(2)
        rows = []
        for j in range(rnd.randrange(1, 12)):
            now += rnd.randrange(3)
            rows.append(
                {
                    "k": rnd.randrange(keys),
                    "ts": now - rnd.randrange(delay + 3),
                    "v": f"{side}-{i}-{j}",
                }
            )
        events.append((side, rows))
        if rnd.random() < 0.4:
            events.append(("wm", now - delay))
    return events


def reference(events: list[Any], lower: int, upper: int) -> list[tuple[str, str]]:
    """Flink's semantics in plain Python: drop late rows, then a pair when the second row
    arrives, unless the first was cleaned by its timer before."""
    wm = MAX_WATERMARK * -1 - 1
    kept: list[list[tuple[int, int, str, int]]] = [[], []]  # (key, ts, v, cleanup time)
    out = []
    for side, rows in events:
        if side == "wm":
            wm = max(wm, rows)
            kept = [[r for r in kept[i] if r[3] > wm] for i in range(2)]
            continue
        for row in rows:
            k, ts, v = row["k"], row["ts"], row["v"]
            if ts < wm:
                continue
            for ok, ots, ov, _ in kept[1 - side]:
                if ok != k:
                    continue
                lt, rt = (ts, ots) if side == 0 else (ots, ts)
                if lt + lower <= rt <= lt + upper:
                    out.append((v, ov) if side == 0 else (ov, v))
        for row in rows:
            if row["ts"] >= wm:
                ret = max(0, upper) if side == 0 else max(0, -lower)
                kept[side].append((row["k"], row["ts"], row["v"], row["ts"] + ret))
    return sorted(out)


def feed(op: IntervalJoinOperator, events: list[Any]) -> list[tuple[str, str]]:
    out = []
    for side, rows in events:
        if side == "wm":
            op.process_watermark(rows)
            continue
        name = "a" if side == 0 else "b"
        batch = pa.RecordBatch.from_pylist(
            [{"k": r["k"], "ts": r["ts"], name: r["v"]} for r in rows]
        )
        out += pairs(op.process_input(side, batch))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bounds", [(-3, 4), (0, 0), (2, 9), (-9, -2)])
def test_random_streams_match_the_reference(seed: int, bounds: tuple[int, int]) -> None:
    events = random_stream(seed)
    op = join(*bounds)
    assert sorted(feed(op, events)) == reference(events, *bounds)


def test_many_batches_merge_runs_and_stay_exact() -> None:
    events = random_stream(42, n=3000, keys=3, delay=40)
    events = [e for e in events if e[0] != "wm"]  # nothing expires: every run stays
    op = join(-20, 20)
    assert sorted(feed(op, events)) == reference(events, -20, 20)
    sizes = [len(r) for r in op._buffers[0].runs]
    # a binary counter: sizes at least double towards the oldest run, so few runs
    assert all(older >= 2 * newer for older, newer in itertools.pairwise(sizes))
    assert len(sizes) <= 1 + math.log2(sum(sizes))


def test_snapshot_restore_mid_stream_continues_exactly(tmp_path: Path) -> None:
    events = random_stream(7, n=600)
    expected = reference(events, -3, 4)
    op = join(-3, 4)
    cut = len(events) // 2
    got = feed(op, events[:cut])
    op.snapshot_state(1)
    snap = op.ctx.keyed_state.snapshot(1)  # type: ignore[union-attr]
    feed(op, events[cut : cut + 4])  # processed after the checkpoint, then lost in a crash
    handles = snap.write(tmp_path)

    backend = KeyedStateBackend.for_subtask(MAXP, 1, 0)
    backend.restore(handles)
    op2 = cloudpickle.loads(cloudpickle.dumps(IntervalJoinOperator("k", "k", "ts", "ts", -3, 4)))
    op2.open(ctx(backend, restored=1))
    assert op2.buffered(0) + op2.buffered(1) > 0
    last_wm = max((w for s, w in events[:cut] if s == "wm"), default=None)
    if last_wm is not None:  # watermarks are not snapshotted; upstream sends one again
        op2.process_watermark(last_wm)
    got += feed(op2, events[cut:])
    assert sorted(got) == expected


def test_rescale_from_two_subtasks_to_three(tmp_path: Path) -> None:
    events = random_stream(3, n=800, keys=40)
    expected = reference(events, -3, 4)
    cut = len(events) // 2

    def split(evs: list[Any], parallelism: int) -> list[list[Any]]:
        """Each subtask's share of ``evs``: rows by key group, every watermark to all."""
        per: list[list[Any]] = [[] for _ in range(parallelism)]
        for side, rows in evs:
            if side == "wm":
                for p in per:
                    p.append((side, rows))
                continue
            parts: list[list[Any]] = [[] for _ in range(parallelism)]
            for r in rows:
                parts[kgs.subtask_for_key(r["k"], MAXP, parallelism)].append(r)
            for p, rs in zip(per, parts, strict=True):
                if rs:
                    p.append((side, rs))
        return per

    got: list[tuple[str, str]] = []
    handles: list[Any] = []
    for i, share in enumerate(split(events[:cut], 2)):
        op = IntervalJoinOperator("k", "k", "ts", "ts", -3, 4)
        op.open(ctx(KeyedStateBackend.for_subtask(MAXP, 2, i)))
        got += feed(op, share)
        op.snapshot_state(1)
        handles += op.ctx.keyed_state.snapshot(1).write(tmp_path / f"old-{i}")  # type: ignore[union-attr]
    last_wm = max((w for s, w in events[:cut] if s == "wm"), default=None)
    for i, share in enumerate(split(events[cut:], 3)):
        backend = KeyedStateBackend.for_subtask(MAXP, 3, i)
        backend.restore(handles)
        op = IntervalJoinOperator("k", "k", "ts", "ts", -3, 4)
        op.open(ctx(backend, restored=1))
        if last_wm is not None:
            op.process_watermark(last_wm)
        got += feed(op, share)
    assert sorted(got) == expected


# --- pair functions -----------------------------------------------------------------------------


class Describe(ProcessJoinFunction):
    def process_element(
        self, left: dict[str, Any], right: dict[str, Any], ctx: JoinContext
    ) -> list[dict[str, Any]]:
        if right["b"] == "skip":
            ctx.output(OutputTag("skipped"), {"a": left["a"]})
            return []
        return [{"pair": f"{left['a']}+{right['b']}", "ts": ctx.timestamp}]


class Concat(BatchJoinFunction):
    def process_pairs(
        self, left: pa.RecordBatch, right: pa.RecordBatch, ctx: BatchJoinContext
    ) -> pa.RecordBatch:
        import pyarrow.compute as pc

        return pa.RecordBatch.from_arrays(
            [
                pc.binary_join_element_wise(left.column("a"), right.column("b"), "+"),
                pc.max_element_wise(ctx.left_timestamps, ctx.right_timestamps),
            ],
            names=["pair", "ts"],
        )


@pytest.mark.parametrize("emitter", [PerPair(Describe(), None), BatchPairs(Concat())])
def test_process_functions_per_pair_and_per_batch(emitter: Any) -> None:
    op = join(0, 5, emitter=emitter)
    op.process_input(1, right((1, 12, "r12"), (1, 3, "r3"), (1, 11, "skip")))
    rows = [r for b in op.process_input(0, left((1, 10, "l10"))) for r in b.to_pylist()]
    if isinstance(emitter, PerPair):
        assert rows == [{"pair": "l10+r12", "ts": 12}]
        side = op.ctx.side_outputs  # type: ignore[union-attr]
        assert [(t, b.to_pylist()) for t, b in side] == [("skipped", [{"a": "l10"}])]
    else:
        assert sorted(map(str, rows)) == sorted(
            map(str, [{"pair": "l10+skip", "ts": 11}, {"pair": "l10+r12", "ts": 12}])
        )


def test_prefixes_and_key_columns_of_the_joined_rows() -> None:
    op = IntervalJoinOperator(
        "user", "uid", "ts", "ts", 0, 0, emitter=SelectPairs("user", "uid", "l.", "r.")
    )
    op.open(ctx())
    op.process_input(0, pa.RecordBatch.from_pylist([{"user": 1, "ts": 5, "v": 1}]))
    out = op.process_input(1, pa.RecordBatch.from_pylist([{"uid": 1, "ts": 5, "v": 2}]))
    assert out[0].to_pylist() == [{"user": 1, "l.ts": 5, "l.v": 1, "uid": 1, "r.ts": 5, "r.v": 2}]
    clash = IntervalJoinOperator("k", "k", "ts", "ts", 0, 0, emitter=SelectPairs("k", "k", "", ""))
    clash.open(ctx())
    clash.process_input(0, left((1, 5, "x")))
    with pytest.raises(InvalidArgumentError, match="twice"):
        clash.process_input(1, pa.RecordBatch.from_pylist([{"k": 1, "ts": 5, "a": "y"}]))


def test_a_time_span_too_wide_for_offsets_uses_time_ranks() -> None:
    far = 1 << 61
    op = join(-5, 5)
    op.process_input(1, right((1, 0, "r0"), (2, far, "rfar"), (1, far + 3, "r1far")))
    assert op._buffers[1].runs[0].span == -1  # offsets would overflow: ranks instead
    got = pairs(op.process_input(0, left((1, far, "l1"), (2, far - 5, "l2"), (1, 4, "l0"))))
    assert sorted(got) == [("l0", "r0"), ("l1", "r1far"), ("l2", "rfar")]


def test_the_saved_buffer_holds_each_row_once() -> None:
    """Each key group's entry is a compact batch: pickling an Arrow slice would write its
    parent's whole buffers, so the snapshot would hold every row once per key group."""
    import pickle

    from snapflow.worker.api.join_buffer import JoinBuffer
    from snapflow.worker.api.join_checkpoint import BufferCheckpoint

    backend = KeyedStateBackend.for_subtask(128, 1, 0)
    buffer = JoinBuffer("key", "ts", "test")
    n = 5_000
    rows = pa.RecordBatch.from_pydict({"key": list(range(n)), "ts": list(range(n)), "v": [1] * n})
    buffer.add(buffer.sorted_run(rows, buffer.times_of(rows)))
    state = backend.get_value_state("op/left")
    BufferCheckpoint(buffer, state, backend).save()
    entries = list(backend.entries("op/left"))
    assert sum(rows.num_rows for _, (rows, _) in entries) == n
    blob = sum(len(pickle.dumps(rows)) for _, (rows, _) in entries)
    assert blob < 3 * n * 3 * 8  # about the rows' size, not 128 times it

"""Operators (worker/operators.py): exact outputs, keyed state, chains, pickling."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.api import keyed_operators as keyed_operators_module
from snapflow.worker.api.functions import AggregateFunction, KeyedContext
from snapflow.worker.api.keyed_operators import (
    Aggregate,
    KeyedCount,
    KeyedProcess,
    KeyedReduce,
    fold_and_get,
)
from snapflow.worker.api.operators import (
    Filter,
    FilterBatches,
    FlatMap,
    FlatMapBatches,
    Map,
    MapBatches,
)
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.operator_state import OperatorStateBackend


def keyed_ctx(
    operator_id: str = "op",
    *,
    parallelism: int = 1,
    index: int = 0,
    max_parallelism: int = 128,
    backend: KeyedStateBackend | None = None,
) -> OperatorContext:
    kb = backend or KeyedStateBackend.for_subtask(max_parallelism, parallelism, index)
    return OperatorContext(
        vertex_id="v",
        operator_id=operator_id,
        subtask_index=index,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        keyed_state=kb,
        key_field="key",
    )


def opened(op: Operator, ctx: OperatorContext | None = None) -> Operator:
    op.open(ctx or OperatorContext())
    return op


def rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b.to_pylist()]


def kv_batch(keys: list[Any], values: list[Any] | None = None) -> pa.RecordBatch:
    values = values if values is not None else list(range(len(keys)))
    return pa.RecordBatch.from_pydict({"key": keys, "value": values})


# ---------------------------------------------------------------------------------------------
# Batch API
# ---------------------------------------------------------------------------------------------


def test_map_batches_exact_output_and_empty_handling() -> None:
    op = opened(
        MapBatches(
            lambda b: pa.RecordBatch.from_arrays(
                [b["key"], pc.multiply(b["value"], 10)], names=["key", "v10"]
            )
        )
    )
    out = op.process_batch(kv_batch([1, 2, 3], [1, 2, 3]))
    assert rows(out) == [{"key": 1, "v10": 10}, {"key": 2, "v10": 20}, {"key": 3, "v10": 30}]
    assert op.process_batch(kv_batch([])) == []
    assert opened(MapBatches(lambda b: None)).process_batch(kv_batch([1])) == []
    assert opened(MapBatches(lambda b: b.slice(0, 0))).process_batch(kv_batch([1])) == []
    # a Table is accepted
    out = opened(MapBatches(lambda b: pa.Table.from_batches([b]))).process_batch(kv_batch([5]))
    assert rows(out) == [{"key": 5, "value": 0}]
    with pytest.raises(InvalidArgumentError):
        opened(MapBatches(lambda b: [1])).process_batch(kv_batch([1]))


def test_filter_batches_mask_nulls_and_errors() -> None:
    op = opened(FilterBatches(lambda b: pc.greater(b["value"], 1)))
    assert rows(op.process_batch(kv_batch([1, 2, 3], [0, 5, 2]))) == [
        {"key": 2, "value": 5},
        {"key": 3, "value": 2},
    ]
    assert op.process_batch(kv_batch([1], [0])) == []
    # python list of bools; a null counts as false
    op = opened(FilterBatches(lambda b: [True, None, True]))
    assert [r["key"] for r in rows(op.process_batch(kv_batch([7, 8, 9])))] == [7, 9]
    with pytest.raises(InvalidArgumentError):
        opened(FilterBatches(lambda b: [True])).process_batch(kv_batch([1, 2]))


def test_flat_map_batches() -> None:
    op = opened(FlatMapBatches(lambda b: [b.slice(0, 1), b.slice(0, 0), b.slice(1)]))
    out = op.process_batch(kv_batch([1, 2, 3]))
    assert [b.num_rows for b in out] == [1, 2]  # the empty batch is dropped
    assert rows(out) == rows([kv_batch([1, 2, 3])])
    assert opened(FlatMapBatches(lambda b: None)).process_batch(kv_batch([1])) == []


# ---------------------------------------------------------------------------------------------
# Record API
# ---------------------------------------------------------------------------------------------


def test_map_rows_schema_inferred_then_cached() -> None:
    op = opened(Map(lambda r: {"key": r["key"], "half": r["value"] / 2 if r["value"] else None}))
    out1 = op.process_batch(kv_batch([1, 2], [4, 6]))
    assert rows(out1) == [{"key": 1, "half": 2.0}, {"key": 2, "half": 3.0}]
    # all-null column in a later batch keeps the cached double type
    out2 = op.process_batch(kv_batch([3], [0]))
    assert out2[0].schema == out1[0].schema
    assert rows(out2) == [{"key": 3, "half": None}]


def test_map_all_null_first_batch_not_cached_and_explicit_schema() -> None:
    op = opened(Map(lambda r: {"x": r["value"] or None}))
    assert pa.types.is_null(op.process_batch(kv_batch([1], [0]))[0].schema.field("x").type)
    assert op.process_batch(kv_batch([1], [3]))[0].schema.field("x").type == pa.int64()
    schema = pa.schema([("x", pa.int32())])
    op = opened(Map(lambda r: {"x": r["value"]}, output_schema=schema))
    out = op.process_batch(kv_batch([1, 2], [5, 6]))
    assert out[0].schema == schema and rows(out) == [{"x": 5}, {"x": 6}]
    with pytest.raises(InvalidArgumentError, match="output schema"):
        opened(Map(lambda r: {"x": "text"}, output_schema=schema)).process_batch(kv_batch([1]))


def test_flat_map_and_filter_rows() -> None:
    op = opened(FlatMap(lambda r: [{"key": r["key"], "i": i} for i in range(r["value"])]))
    out = op.process_batch(kv_batch([1, 2, 3], [2, 0, 1]))
    assert rows(out) == [{"key": 1, "i": 0}, {"key": 1, "i": 1}, {"key": 3, "i": 0}]
    assert opened(FlatMap(lambda r: None)).process_batch(kv_batch([1])) == []
    f = opened(Filter(lambda r: r["key"] % 2 == 0))
    batch = pa.RecordBatch.from_pydict(
        {"key": pa.array([1, 2, 4], pa.int16()), "s": ["a", "b", "c"]}
    )
    out = f.process_batch(batch)
    assert out[0].schema == batch.schema  # input schema kept
    assert rows(out) == [{"key": 2, "s": "b"}, {"key": 4, "s": "c"}]
    assert f.process_batch(batch.slice(0, 1)) == []


# ---------------------------------------------------------------------------------------------
# Keyed
# ---------------------------------------------------------------------------------------------


def test_keyed_operators_need_keyed_state() -> None:
    with pytest.raises(InvalidArgumentError, match="keyed"):
        KeyedCount("key").open(OperatorContext())


def test_keyed_count_updates_exact() -> None:
    op = opened(KeyedCount("key"), keyed_ctx())
    out = op.process_batch(kv_batch(["b", "a", "b", "c"]))
    assert sorted(rows(out), key=lambda r: r["key"]) == [
        {"key": "a", "count": 1},
        {"key": "b", "count": 2},
        {"key": "c", "count": 1},
    ]
    out = op.process_batch(kv_batch(["c", "c"]))
    assert rows(out) == [{"key": "c", "count": 3}]
    assert out[0].schema.field("count").type == pa.int64()
    assert op.process_batch(kv_batch([])) == []


@pytest.mark.parametrize("key_kind", ["int", "str"])
def test_keyed_count_equals_python_count(key_kind: str) -> None:
    rng = random.Random(7)
    op = opened(KeyedCount("key"), keyed_ctx())
    expected: Counter[Any] = Counter()
    for _ in range(30):
        n = rng.randint(0, 500)
        keys: list[Any] = [rng.randint(-50, 300) for _ in range(n)]
        if key_kind == "str":
            keys = [f"k{k}" for k in keys]
        expected.update(keys)
        out = rows(op.process_batch(kv_batch(keys)))
        # one row per distinct key of the batch, with its new total
        assert sorted(r["key"] for r in out) == sorted(set(keys))
        assert all(r["count"] == expected[r["key"]] for r in out)
    backend: Any = op.ctx.keyed_state  # type: ignore[union-attr]
    assert dict(backend.entries("op/count")) == dict(expected)


def test_keyed_count_final_mode() -> None:
    op = opened(KeyedCount("key", output="final"), keyed_ctx())
    assert op.process_batch(kv_batch([1, 2, 1])) == []
    assert sorted(map(tuple, (r.values() for r in rows(op.end_input())))) == [(1, 2), (2, 1)]
    with pytest.raises(InvalidArgumentError):
        KeyedCount("key", output="bogus")


def _restore_keyed(handles: list[Any], parallelism: int, index: int) -> KeyedStateBackend:
    kb = KeyedStateBackend.for_subtask(128, parallelism, index)
    kb.restore(handles)
    return kb


def test_keyed_count_snapshot_restore_and_rescale(tmp_path: Any) -> None:
    rng = random.Random(3)
    batches = [kv_batch([rng.randint(0, 99) for _ in range(200)]) for _ in range(6)]
    # two subtasks, fed by key group
    from snapflow.worker.runtime.partitioners import KeyGroupPartitioner

    part = KeyGroupPartitioner("key", 128, 2)
    ops = [opened(KeyedCount("key"), keyed_ctx(parallelism=2, index=i)) for i in range(2)]
    for b in batches[:3]:
        for ch, piece in part.partition(b):
            ops[ch].process_batch(piece)
    snaps = [op.ctx.keyed_state.snapshot(1) for op in ops]  # type: ignore[union-attr]
    # keep processing after the synchronous snapshot: must not leak into the snapshot
    for b in batches[3:]:
        for ch, piece in part.partition(b):
            ops[ch].process_batch(piece)
    handles = [h for s in snaps for h in s.write(tmp_path)]
    # restore at parallelism 1 and replay the rest: the totals equal a count of everything
    restored = opened(KeyedCount("key"), keyed_ctx(backend=_restore_keyed(handles, 1, 0)))
    for b in batches[3:]:
        restored.process_batch(b)
    expected = Counter(k for b in batches for k in b["key"].to_pylist())
    assert dict(restored.ctx.keyed_state.entries("op/count")) == dict(expected)  # type: ignore[union-attr]


def test_fold_and_get_matches_public_api_and_respects_snapshots(tmp_path: Any) -> None:
    import operator

    kb = KeyedStateBackend.for_subtask(128, 1, 0)
    state = kb.get_reducing_state("s", operator.add)
    keys = pa.array([1, 2, 3])
    groups = kgs.key_groups(keys, 128)
    assert fold_and_get(state, operator.add, keys, pa.array([1, 1, 1]), groups) == [1, 1, 1]
    snap = kb.snapshot(1)
    assert fold_and_get(state, operator.add, keys, [5, 6, 7], groups) == [6, 7, 8]
    assert state.get_many(keys) == [6, 7, 8]
    restored = KeyedStateBackend.for_subtask(128, 1, 0)
    restored.restore(snap.write(tmp_path))
    assert dict(restored.entries("s")) == {1: 1, 2: 1, 3: 1}


def test_fold_and_get_on_the_disk_backend_folds_hits_misses_and_repeats(tmp_path: Any) -> None:
    """The disk backend's fused pass: cached keys fold in place, evicted ones are read back
    from RocksDB with one multi-get, a key repeated in a batch sees its earlier fold, and the
    result equals the heap backend's."""
    import operator

    from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend

    disk = RocksDBKeyedStateBackend(128, (0, 127), local_dir=str(tmp_path), cache_entries=8)
    heap = KeyedStateBackend(128, (0, 127))
    states = [b.get_reducing_state("s", operator.add) for b in (disk, heap)]
    rng = random.Random(5)
    try:
        for _ in range(40):  # 40 keys through an 8-entry cache: most batches miss
            keys = pa.array([rng.randint(0, 39) for _ in range(12)], pa.int64())
            values = [rng.randint(1, 9) for _ in range(12)]
            groups = kgs.key_groups(keys, 128)
            got = [fold_and_get(st, operator.add, keys, values, groups) for st in states]
            assert got[0] == got[1]
        every = pa.array(list(range(40)), pa.int64())
        assert states[0].get_many(every) == states[1].get_many(every)
    finally:
        disk.dispose()


@pytest.mark.parametrize("agg", ["sum", "min", "max", "callable"])
def test_keyed_reduce_equals_python(agg: str) -> None:
    rng = random.Random(11)
    fn: Any = (lambda a, b: (a * 31 + b) % 1_000_003) if agg == "callable" else agg
    op = opened(KeyedReduce("key", "value", fn), keyed_ctx())
    expected: dict[int, int] = {}
    py: Any = {
        "sum": lambda a, b: a + b,
        "min": min,
        "max": max,
        "callable": lambda a, b: (a * 31 + b) % 1_000_003,
    }[agg]
    for _ in range(10):
        keys = [rng.randint(0, 20) for _ in range(50)]
        values = [rng.randint(-100, 100) for _ in range(50)]
        for k, v in zip(keys, values, strict=True):
            expected[k] = v if k not in expected else py(expected[k], v)
        out = rows(op.process_batch(kv_batch(keys, values)))
        assert sorted(r["key"] for r in out) == sorted(set(keys))
        assert all(r["value"] == expected[r["key"]] for r in out)


def test_keyed_reduce_types() -> None:
    batch = pa.RecordBatch.from_pydict({"key": [1, 1], "value": pa.array([1.5, 2.0], pa.float32())})
    out = opened(KeyedReduce("key", "value", "min"), keyed_ctx()).process_batch(batch)
    assert out[0].schema.field("value").type == pa.float32() and rows(out) == [
        {"key": 1, "value": 1.5}
    ]
    out = opened(KeyedReduce("key", "value", "sum"), keyed_ctx()).process_batch(batch)
    assert out[0].schema.field("value").type == pa.float64() and rows(out)[0]["value"] == 3.5
    with pytest.raises(InvalidArgumentError):
        KeyedReduce("key", "value", "median")


def _session_fn(key: Any, rows_: list[dict[str, Any]], ctx: KeyedContext) -> list[dict[str, Any]]:
    seen: Any = ctx.get_value_state("seen", 0)
    items = ctx.get_list_state("items")
    last = ctx.get_map_state("last")
    out = []
    for r in rows_:
        seen.update(seen.value() + 1)
        items.add(r["value"])
        last.put("v", r["value"])
        out.append({"key": key, "n": seen.value()})
    ctx.register_event_time_timer(100 + key)
    return out


def _session_timer(ts: int, key: Any, ctx: KeyedContext) -> list[dict[str, Any]]:
    items = ctx.get_list_state("items")
    out = [{"key": key, "n": -sum(items.get())}]
    items.clear()
    assert ctx.timestamp == ts and ctx.current_key == key
    return out


def test_keyed_process_steps_between_whole_keys_and_returns_what_process_batch_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keyed_operators_module, "STEP_ROWS", 3)
    calls: list[Any] = []

    def fn(key: Any, rows_: list[dict[str, Any]], ctx: KeyedContext) -> list[dict[str, Any]]:
        calls.append(key)
        return [{"key": key, "n": len(rows_)}]

    keys = [1, 1, 2, 3, 3, 3, 4, 1, 5]
    stepped = opened(KeyedProcess("key", fn), keyed_ctx())
    steps = stepped.process_batch_steps(kv_batch(keys, list(range(len(keys)))))
    at_steps: list[list[Any]] = []
    with pytest.raises(StopIteration) as done:
        while True:
            next(steps)
            at_steps.append(list(calls))
    # keys 1 (3 rows) | 2, 3 (1 + 3) | 4, 5 (1 + 1, the end): a step once 3 rows were seen
    assert at_steps == [[1], [1, 2, 3]]
    whole = opened(KeyedProcess("key", fn), keyed_ctx())
    assert rows(done.value.value) == rows(whole.process_batch(kv_batch(keys, [0] * len(keys))))


@pytest.mark.parametrize(
    "keys",
    [
        ["b", "a", "b", "c", "a", "b"],  # strings: grouped by Arrow
        [5, -1, 5, 7, -1, 5],  # integers: grouped by Arrow
        [0.5, -0.0, 0.5, 0.0, -0.0, 0.5],  # floats: grouped by Python (0.0 == -0.0)
        pa.array(["b", "a", "b", "c", "a", "b"]).dictionary_encode(),  # decoded, by Python
        # no take kernel for views in this pyarrow: Arrow refuses, Python groups
        pa.array(["b", "a", "b", "c", "a", "b"]).cast(pa.string_view()),
        [True, False, True, True, False, True],
        [b"b", b"a", b"b", b"c", b"a", b"b"],
    ],
    ids=["string", "int", "float", "dictionary", "string_view", "bool", "binary"],
)
def test_keyed_process_groups_by_first_occurrence_in_arrival_order(keys: Any) -> None:
    seen: list[tuple[Any, list[int], int | None]] = []

    def fn(key: Any, rows_: list[dict[str, Any]], ctx: KeyedContext) -> None:
        seen.append((key, [r["value"] for r in rows_], ctx.current_key_group))

    op = opened(KeyedProcess("key", fn), keyed_ctx())
    op.process_batch(pa.RecordBatch.from_pydict({"key": keys, "value": list(range(6))}))
    python_keys = keys.to_pylist() if isinstance(keys, pa.Array) else keys
    distinct = list(dict.fromkeys(python_keys))  # first occurrence, Python equality
    assert [k for k, _, _ in seen] == distinct
    for key, values, group in seen:
        assert values == [i for i, k in enumerate(python_keys) if k == key]
        assert group == kgs.key_group_for_key(key, 128)


def test_a_keyed_process_subclass_with_its_own_process_batch_is_one_step() -> None:
    class Upper(KeyedProcess):
        def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
            return [pa.RecordBatch.from_pydict({"n": [batch.num_rows]})]

    op = opened(Upper("key", lambda key, rows_, ctx: None), keyed_ctx())
    steps = op.process_batch_steps(kv_batch([1, 2, 3]))
    with pytest.raises(StopIteration) as done:
        next(steps)  # no step in between: its own process_batch decides
    assert rows(done.value.value) == [{"n": 3}]


def test_keyed_process_refuses_null_keys() -> None:
    op = opened(KeyedProcess("key", lambda key, rows_, ctx: None), keyed_ctx())
    with pytest.raises(InvalidArgumentError, match="null"):
        op.process_batch(pa.RecordBatch.from_pydict({"key": [1, None], "value": [0, 1]}))


def test_keyed_process_state_and_timers() -> None:
    op = opened(KeyedProcess("key", _session_fn, _session_timer), keyed_ctx())
    out = op.process_batch(kv_batch([1, 2, 1], [10, 20, 30]))
    # grouped per key (first-occurrence order), arrival order within a key
    assert rows(out) == [{"key": 1, "n": 1}, {"key": 1, "n": 2}, {"key": 2, "n": 1}]
    assert rows(op.process_batch(kv_batch([2], [5]))) == [{"key": 2, "n": 2}]
    assert op.process_watermark(100) == []
    assert rows(op.process_watermark(101)) == [{"key": 1, "n": -40}]
    # the remaining timer fires at end of input
    assert rows(op.end_input()) == [{"key": 2, "n": -25}]
    assert op.process_watermark(MAX_WATERMARK) == []


def test_aggregate_function_average() -> None:
    avg = AggregateFunction.of(
        lambda: [0, 0],
        lambda v, acc: [acc[0] + v, acc[1] + 1],
        lambda acc: acc[0] / acc[1],
    )
    op = opened(Aggregate("key", avg, value_field="value", output_field="avg"), keyed_ctx())
    assert rows(op.process_batch(kv_batch([1, 2, 1], [2, 4, 4]))) == [
        {"key": 1, "avg": 3.0},
        {"key": 2, "avg": 4.0},
    ]
    assert rows(op.process_batch(kv_batch([1], [9]))) == [{"key": 1, "avg": 5.0}]
    # whole rows as values
    whole = AggregateFunction.of(lambda: 0, lambda row, acc: acc + row["value"], lambda acc: acc)
    op = opened(Aggregate("key", whole, result_type=pa.int32()), keyed_ctx())
    out = op.process_batch(kv_batch([3, 3], [1, 2]))
    assert rows(out) == [{"key": 3, "result": 3}] and out[0].schema.field(1).type == pa.int32()


# ---------------------------------------------------------------------------------------------
# Chain
# ---------------------------------------------------------------------------------------------


class _Recorder(Operator):
    """Records the order of what it sees."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        self.events.append(("batch", batch.num_rows))
        return [batch]

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        self.events.append(("wm", watermark_ms))
        return []

    def end_input(self) -> list[pa.RecordBatch]:
        self.events.append(("end",))
        return []

    def snapshot_state(self, checkpoint_id: int) -> None:
        self.events.append(("snap", checkpoint_id))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.events.append(("done", checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.events.append(("aborted", checkpoint_id))

    def close(self) -> None:
        self.events.append(("close",))


def test_chain_runs_operators_in_order() -> None:
    rec = _Recorder()
    chain = Chain(
        [
            Map(lambda r: {"key": r["key"], "value": r["value"] + 1}),
            Filter(lambda r: r["value"] % 2 == 0),
            KeyedProcess("key", _session_fn, _session_timer),
            rec,
        ]
    )
    chain.open(keyed_ctx("vtx"))
    assert [op.ctx.operator_id for op in chain.operators] == ["vtx.0", "vtx.1", "vtx.2", "vtx.3"]  # type: ignore[union-attr]
    out = chain.process_batch(kv_batch([1, 2, 3], [1, 2, 3]))  # values 2, 3, 4 -> keys 1, 3
    assert rows(out) == [{"key": 1, "n": 1}, {"key": 3, "n": 1}]
    # the timers' output reaches the recorder before the watermark itself
    assert rows(chain.process_watermark(200)) == [{"key": 1, "n": -2}, {"key": 3, "n": -4}]
    chain.snapshot_state(4)
    chain.notify_checkpoint_aborted(4)
    chain.notify_checkpoint_complete(5)
    assert chain.end_input() == []
    chain.close()
    assert rec.events == [
        ("batch", 2),
        ("batch", 2),
        ("wm", 200),
        ("snap", 4),
        ("aborted", 4),
        ("done", 5),
        ("end",),
        ("close",),
    ]


def test_chain_validation_and_explicit_ids() -> None:
    empty = Chain([])  # e.g. a source-only vertex whose task chains operators[1:]
    empty.open(OperatorContext())
    b = kv_batch([1])
    assert empty.process_batch(b) == [b] and empty.process_batch(kv_batch([])) == []
    assert empty.process_watermark(5) == [] and empty.end_input() == []
    empty.snapshot_state(1)
    empty.close()
    with pytest.raises(InvalidArgumentError):
        Chain([Map(lambda r: r), "not an operator"])  # type: ignore[list-item]
    chain = Chain([Map(lambda r: r), Map(lambda r: r)])
    with pytest.raises(InvalidArgumentError):
        chain.open(OperatorContext(), ["a", "a"])
    chain.open(OperatorContext(), ["a", "b"])
    assert [op.ctx.operator_id for op in chain.operators] == ["a", "b"]  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError):
        chain.poll_batch(10)  # not a source chain


def test_chain_close_closes_all_and_reraises_first() -> None:
    class Boom(Operator):
        def close(self) -> None:
            raise RuntimeError("boom")

    rec = _Recorder()
    chain = Chain([Boom(), rec])
    chain.open(OperatorContext())
    with pytest.raises(RuntimeError, match="boom"):
        chain.close()
    assert rec.events == [("close",)]


# ---------------------------------------------------------------------------------------------
# Pickling
# ---------------------------------------------------------------------------------------------


def _all_operators() -> list[tuple[Operator, bool]]:
    avg = AggregateFunction.of(lambda: 0, lambda v, acc: acc + v, lambda acc: acc)
    return [
        (MapBatches(lambda b: b), False),
        (FilterBatches(lambda b: pc.greater(b["value"], 0)), False),
        (FlatMapBatches(lambda b: [b]), False),
        (Map(lambda r: {"key": r["key"], "value": r["value"] * 2}), False),
        (FlatMap(lambda r: [r, r]), False),
        (Filter(lambda r: r["value"] > 0), False),
        (KeyedCount("key"), True),
        (KeyedReduce("key", "value", "max"), True),
        (KeyedReduce("key", "value", lambda a, b: a - b), True),
        (KeyedProcess("key", _session_fn, _session_timer), True),
        (Aggregate("key", avg, value_field="value"), True),
    ]


@pytest.mark.parametrize("index", range(11))
def test_cloudpickle_round_trip(index: int) -> None:
    op, keyed = _all_operators()[index]
    batch = kv_batch([1, 2, 1, 3], [1, 2, 3, 4])
    copy = cloudpickle.loads(cloudpickle.dumps(op))
    assert type(copy) is type(op)
    expected = opened(op, keyed_ctx() if keyed else None).process_batch(batch)
    # an opened operator pickles without its live backends (runtime fields are dropped)
    copy2 = cloudpickle.loads(cloudpickle.dumps(op))
    assert copy2.ctx is None
    for c in (copy, copy2):
        got = opened(c, keyed_ctx() if keyed else None).process_batch(batch)
        assert rows(got) == rows(expected)


def test_operator_state_backend_is_not_pickled_with_context() -> None:
    op = opened(Map(lambda r: r), OperatorContext(operator_state=OperatorStateBackend()))
    assert "ctx" not in op.__getstate__()

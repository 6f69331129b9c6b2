"""The joins of the builder: ``KeyedStream.interval_join(...).between(...)`` and
``KeyedStream.join`` in the job graph, their build-time checks, and a two-source keyed interval
join on local Spark into the transactional file sink, checked record by record against a
plain-Python join of the generated records."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow import (
    GeneratorSource,
    IntervalJoined,
    JobStatus,
    OutputTag,
    Pipeline,
    ProcessJoinFunction,
    TransactionalFileSink,
    read_committed,
)
from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge import FixedDelay
from snapflow.worker.api.interval_join import IntervalJoinOperator
from snapflow.worker.api.regular_join import RegularJoinOperator
from snapflow.worker.connectors.split_sources import GENERATOR_SCHEMA

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ORDERS = pa.schema([("user", pa.int64()), ("ts", pa.int64()), ("amount", pa.int64())])
USERS = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("name", pa.string())])


def _keyed(p: Pipeline, schema: pa.Schema, key: str, name: str) -> Any:
    stream = p.source(GeneratorSource(10), name=name).map(lambda r: r, output_schema=schema)
    return stream.key_by(key)


def _only_keyed_vertex(p: Pipeline) -> Any:
    graph = p.job_graph()
    heads = [
        v
        for v in graph.vertices
        if any(e.target_input == 1 for e in graph.edges if e.target_vertex_id == v.vertex_id)
    ]
    assert len(heads) == 1
    return graph, heads[0]


def test_interval_join_builds_one_keyed_vertex_of_two_inputs() -> None:
    p = Pipeline("j", parallelism=2)
    joined = (
        _keyed(p, ORDERS, "user", "orders")
        .interval_join(_keyed(p, USERS, "id", "users"))
        .between(-5, 10, left_time="ts")
        .upper_bound_exclusive()
        .select()
    )
    assert joined.schema is not None
    assert joined.schema.names == ["user", "left_ts", "amount", "id", "right_ts", "name"]
    joined.sink(TransactionalFileSink("/tmp/unused"))
    graph, vertex = _only_keyed_vertex(p)
    edges = [e for e in graph.edges if e.target_vertex_id == vertex.vertex_id]
    assert sorted((e.target_input, e.key_field) for e in edges) == [(0, "user"), (1, "id")]
    op = cloudpickle.loads(vertex.operators[0].payload)
    assert isinstance(op, IntervalJoinOperator)
    assert (op.lower_ms, op.upper_ms, op.left_time, op.right_time) == (-5, 9, "ts", "ts")


def test_regular_join_and_its_options() -> None:
    p = Pipeline("j", parallelism=2)
    joined = _keyed(p, ORDERS, "user", "orders").join(
        _keyed(p, USERS, "id", "users"), ttl_ms=60_000, left_prefix="o_", right_prefix="u_"
    )
    assert joined.schema is not None
    assert joined.schema.names == ["user", "o_ts", "amount", "id", "u_ts", "name"]
    joined.sink(TransactionalFileSink("/tmp/unused"))
    _, vertex = _only_keyed_vertex(p)
    op = cloudpickle.loads(vertex.operators[0].payload)
    assert isinstance(op, RegularJoinOperator) and op.ttl_ms == 60_000


def test_late_data_side_outputs_and_process_functions() -> None:
    class Fn(ProcessJoinFunction):
        def process_element(self, left: Any, right: Any, ctx: Any) -> Any:
            return [{"n": 1}]

    p = Pipeline("j", parallelism=1)
    joined = (
        _keyed(p, ORDERS, "user", "orders")
        .interval_join(_keyed(p, USERS, "id", "users"))
        .between(0, 0, left_time="ts", right_time="ts")
        .side_output_left_late_data(OutputTag("late-orders"))
    )
    assert isinstance(joined, IntervalJoined)
    out = joined.process(Fn(), output_schema=pa.schema([("n", pa.int64())]))
    out.side_output(OutputTag("late-orders")).sink(TransactionalFileSink("/tmp/late"))
    out.sink(TransactionalFileSink("/tmp/out"))
    _, vertex = _only_keyed_vertex(p)
    op = cloudpickle.loads(vertex.operators[0].payload)
    assert op.late_tags == (OutputTag("late-orders"), None)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda p: (
                _keyed(p, ORDERS, "user", "o")
                .interval_join(
                    _keyed(p, pa.schema([("id", pa.string()), ("ts", pa.int64())]), "id", "u")
                )
                .between(0, 1, left_time="ts")
                .select()
            ),
            "one type",
        ),
        (
            lambda p: (
                _keyed(p, ORDERS, "user", "o")
                .interval_join(_keyed(p, USERS, "id", "u"))
                .between(0, 1, left_time="when")
            ),
            "no field 'when'",
        ),
        (
            lambda p: (
                _keyed(p, ORDERS, "user", "o")
                .interval_join(_keyed(p, USERS, "id", "u"))
                .between(5, 1, left_time="ts")
            ),
            "lower bound must not exceed",
        ),
        (
            lambda p: _keyed(p, ORDERS, "user", "o").join(_keyed(p, USERS, "id", "u"), how="left"),
            "retract",
        ),
        (
            lambda p: _keyed(p, ORDERS, "user", "o").join(
                _keyed(p, USERS, "id", "u"), left_prefix="", right_prefix=""
            ),
            "twice",
        ),
        (
            lambda p: _keyed(p, ORDERS, "user", "o").interval_join(p.source(GeneratorSource(1))),
            "needs a KeyedStream",
        ),
    ],
)
def test_bad_joins_are_refused_at_build_time(build: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        build(Pipeline("bad", parallelism=1))


def test_a_keyed_stream_joins_once() -> None:
    p = Pipeline("j", parallelism=1)
    orders = _keyed(p, ORDERS, "user", "o")
    users = _keyed(p, USERS, "id", "u")
    orders.join(users)
    with pytest.raises(InvalidArgumentError, match="consumed"):
        orders.join(_keyed(p, USERS, "id", "u2"))


# ---------------------------------------------------------------------------------------------
# On local Spark
# ---------------------------------------------------------------------------------------------

RECORDS = 30_000
KEYS = 500
LOWER, UPPER = -40, 25


def _sources() -> tuple[GeneratorSource, GeneratorSource]:
    common: dict[str, Any] = {
        "rate_per_s": 30_000, "num_keys": KEYS, "batch_size": 1024, "max_out_of_orderness_ms": 30,
    }  # fmt: skip
    return (
        GeneratorSource(RECORDS, seed=1, **common),
        GeneratorSource(RECORDS, seed=2, value_range=10**6, **common),
    )


def _expected(parallelism: int) -> Counter[tuple[int, int, int, int, int]]:
    """Every pair of the generated records with equal keys and times in range: the sources'
    watermarks never make a record late, so the join emits each exactly once."""
    rows = []
    for source in _sources():
        sizes = [
            RECORDS // parallelism + (1 if s < RECORDS % parallelism else 0)
            for s in range(parallelism)
        ]
        rows.append([source.record(s, i) for s, n in enumerate(sizes) for i in range(n)])
    by_key: dict[int, list[dict[str, int]]] = {}
    for r in rows[1]:
        by_key.setdefault(r["key"], []).append(r)
    return Counter(
        (left["key"], left["value"], left["ts"], right["value"], right["ts"])
        for left in rows[0]
        for right in by_key.get(left["key"], ())
        if left["ts"] + LOWER <= right["ts"] <= left["ts"] + UPPER
    )


@pytest.mark.spark
@pytest.mark.slow
def test_two_source_interval_join_on_spark_record_by_record(spark: Any, tmp_path: Path) -> None:
    p = Pipeline("interval-join", parallelism=2, max_parallelism=128)
    first, second = _sources()
    left = p.source(first, name="left").map(lambda r: r, output_schema=GENERATOR_SCHEMA)
    right = p.source(second, name="right").map(lambda r: r, output_schema=GENERATOR_SCHEMA)
    joined = (
        left.key_by("key")
        .interval_join(right.key_by("key"))
        .between(LOWER, UPPER, left_time="ts")
        .select(name="join")
    )
    joined.sink(TransactionalFileSink(str(tmp_path / "out")))
    p.checkpointing(interval_ms=200, storage=tmp_path / "cp")
    p.restart_strategy(FixedDelay(attempts=1, delay_s=0.2))
    result = p.run(spark, timeout_s=120.0)
    assert result.state is JobStatus.FINISHED
    assert result.checkpoints_completed >= 1
    table = read_committed(tmp_path / "out")
    assert table.schema.names == ["key", "left_value", "left_ts", "right_value", "right_ts"]
    got = Counter(
        zip(
            *(
                table.column(n).to_pylist()
                for n in ("key", "left_value", "left_ts", "right_value", "right_ts")
            ),
            strict=True,
        )
    )
    expected = _expected(2)
    assert len(expected) > RECORDS // 5  # about a quarter of a pair per record
    assert got == expected

"""The window builders (spark_bridge/streams.py): WindowedStream, JoinedStreams and
CoGroupedStreams translated into the job graph, and their build-time errors (no Spark)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge import Pipeline
from snapflow.worker.api.functions import AggregateFunction
from snapflow.worker.api.window_assigners import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from snapflow.worker.api.window_contents import (
    AggregateContents,
    BuiltinAggContents,
    RowsContents,
)
from snapflow.worker.api.window_emitters import JoinWindow, ProcessWindow, ResultRows
from snapflow.worker.api.window_operator import WindowAggregate, WindowOperator
from snapflow.worker.connectors.debug_sinks import CollectSink
from snapflow.worker.connectors.split_sources import GENERATOR_SCHEMA, GeneratorSource
from snapflow.worker.runtime.operator import OutputTag


class Declared(GeneratorSource):
    """A generator whose stream knows its schema."""

    output_schema = GENERATOR_SCHEMA


def _head_ops(p: Pipeline) -> dict[str, Any]:
    graph = p.job_graph()
    return {
        v.vertex_id: [cloudpickle.loads(o.payload) for o in v.operators] for v in graph.vertices
    }


def test_windowed_stream_aggregate_process_and_late_side_output() -> None:
    p = Pipeline("windows", parallelism=2)
    events = p.source(GeneratorSource(total_records=10), name="events")
    late = OutputTag("late")
    counted = (
        events.key_by("key")
        .window(EventTimeSessionWindows(30), "ts")
        .allowed_lateness(5)
        .side_output_late_data(late)
        .aggregate("count", output_field="n")
    )
    counted.sink(CollectSink())
    counted.side_output(late).sink(CollectSink())
    mean = AggregateFunction.of(
        lambda: 0, lambda v, a: a + v, lambda a: a, merge=lambda a, b: a + b
    )
    p.source(GeneratorSource(total_records=10), name="more").key_by("key").window(
        SlidingEventTimeWindows(10, 5), "ts"
    ).aggregate(mean, lambda k, w, e, c: {"k": k}, value_field="value").sink(CollectSink())
    p.source(GeneratorSource(total_records=10), name="third").key_by("key").window(
        TumblingProcessingTimeWindows(100)
    ).process(lambda k, w, rows, c: None).sink(CollectSink())
    # the existing aggregation call still builds a WindowAggregate
    p.source(GeneratorSource(total_records=10), name="old").key_by("key").window(
        TumblingEventTimeWindows(10), "ts", "value", "max"
    ).sink(CollectSink())

    heads = {vid: ops[0] for vid, ops in _head_ops(p).items() if vid.startswith("v") and ops}
    windows = [op for op in heads.values() if isinstance(op, WindowOperator)]
    assert len(windows) == 4
    session, sliding, processing, old = windows
    assert isinstance(session.contents[0], BuiltinAggContents)
    assert session.contents[0].agg == "count"
    assert session.allowed_lateness_ms == 5 and session.late_data_tag == late
    assert isinstance(session.emitter, ResultRows) and session.emitter.output_field == "n"
    assert isinstance(sliding.contents[0], AggregateContents)
    assert isinstance(sliding.emitter, ProcessWindow) and sliding.emitter.single_result
    assert isinstance(processing.contents[0], RowsContents)
    assert processing.time_fields == (None,)
    assert isinstance(old, WindowAggregate) and old.contents[0].agg == "max"  # type: ignore[attr-defined]
    edges = {(e.source_vertex_id, e.output_tag) for e in p.job_graph().edges}
    assert any(tag == "late" for _, tag in edges)


def test_join_and_co_group_build_a_keyed_two_input_vertex() -> None:
    p = Pipeline("joins", parallelism=2)
    a = p.source(Declared(total_records=10), name="a")
    b = p.source(Declared(total_records=10), name="b")
    joined = (
        a.join(b).where("key").equal_to("key").window(TumblingEventTimeWindows(10), "ts").apply()
    )
    assert joined.schema is not None
    assert joined.schema.names == [
        "left_key",
        "left_value",
        "left_ts",
        "right_key",
        "right_value",
        "right_ts",
    ]
    joined.sink(CollectSink())
    c = p.source(GeneratorSource(total_records=10), name="c")
    d = p.source(GeneratorSource(total_records=10), name="d")
    c.co_group(d).where("key").equal_to("value").window(EventTimeSessionWindows(5), "ts").apply(
        lambda x, y, ctx: None
    ).sink(CollectSink())
    graph = p.job_graph()
    into: dict[str, list[tuple[int, str]]] = {}
    for e in graph.edges:
        into.setdefault(e.target_vertex_id, []).append((e.target_input, e.key_field))
    ops = _head_ops(p)
    join_vertex = next(
        v
        for v, o in ops.items()
        if o and isinstance(o[0], WindowOperator) and isinstance(o[0].emitter, JoinWindow)
    )
    assert sorted(into[join_vertex]) == [(0, "key"), (1, "key")]
    cg_vertex = next(
        v for v, o in ops.items() if o and isinstance(o[0], WindowOperator) and v != join_vertex
    )
    assert sorted(into[cg_vertex]) == [(0, "key"), (1, "value")]
    assert ops[join_vertex][0].key_fields == ("key", "key")


def test_window_builders_refuse_bad_arguments_at_build_time() -> None:
    p = Pipeline("bad")
    s = p.source(GeneratorSource(total_records=10), name="s")
    with pytest.raises(InvalidArgumentError, match="time field"):
        s.key_by("key").window(TumblingEventTimeWindows(10))
    with pytest.raises(InvalidArgumentError, match="window assigner"):
        p.source(GeneratorSource(total_records=10)).key_by("key").window(42, "ts")  # type: ignore[call-overload]
    with pytest.raises(InvalidArgumentError, match="no field 'nope'"):
        p.source(Declared(total_records=10)).key_by("key").window(
            TumblingEventTimeWindows(5), "nope"
        )
    with pytest.raises(InvalidArgumentError, match="aggregate"):
        p.source(GeneratorSource(total_records=10)).key_by("key").window(  # type: ignore[call-overload]
            TumblingEventTimeWindows(5), "ts", output_field="n"
        )
    t = p.source(GeneratorSource(total_records=10), name="t")
    u = p.source(GeneratorSource(total_records=10), name="u")
    with pytest.raises(InvalidArgumentError, match="where"):
        t.join(u).window(TumblingEventTimeWindows(10), "ts")
    with pytest.raises(InvalidArgumentError, match="before apply"):
        t.join(u).where("key").equal_to("key").apply()
    with pytest.raises(InvalidArgumentError, match="event time only"):
        p.source(GeneratorSource(total_records=10)).key_by("key").window(
            TumblingProcessingTimeWindows(10)
        ).allowed_lateness(5).aggregate("count")
    strings = p.source(GeneratorSource(total_records=10), name="v").map(
        lambda r: {"key": str(r["key"]), "ts": r["ts"]},
        output_schema=pa.schema([("key", pa.string()), ("ts", pa.int64())]),
    )
    with pytest.raises(InvalidArgumentError, match="one type"):
        strings.join(p.source(Declared(total_records=10), name="w")).where("key").equal_to(
            "key"
        ).window(TumblingEventTimeWindows(10), "ts").apply()

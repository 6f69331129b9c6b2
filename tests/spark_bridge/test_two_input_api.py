"""The builder's two-input functions (no Spark): connect with co-process functions (per record
and vectorised, keyed and not) and the broadcast state pattern, translated into the job graph
(edges into input 0 and 1, BROADCAST on input 1, the operator that runs each function), and
functions of the wrong kind for the connection refused at build time, naming the fix."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow import wire
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import PartitionerKind
from snapflow.spark_bridge import Pipeline
from snapflow.worker.api.broadcast_functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
)
from snapflow.worker.api.broadcast_operators import BroadcastProcess, KeyedBroadcastProcess
from snapflow.worker.api.co_functions import (
    CoBatchFunction,
    CoProcessFunction,
    KeyedCoBatchFunction,
    KeyedCoProcessFunction,
)
from snapflow.worker.api.co_operators import (
    CoBatchProcess,
    CoProcess,
    KeyedCoBatchProcess,
    KeyedCoProcess,
)
from snapflow.worker.connectors.debug_sinks import CollectSink
from snapflow.worker.connectors.split_sources import GeneratorSource, SequenceSource
from snapflow.worker.runtime.operator import Operator


class Co(CoProcessFunction):
    pass


class KeyedCo(KeyedCoProcessFunction):
    pass


class CoBatch(CoBatchFunction):
    pass


class KeyedCoBatch(KeyedCoBatchFunction):
    pass


class Bcast(BroadcastProcessFunction):
    pass


class KeyedBcast(KeyedBroadcastProcessFunction):
    pass


def pipeline() -> tuple[Pipeline, Any, Any]:
    p = Pipeline("two-inputs", parallelism=2)
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(SequenceSource(0, 10), name="b", parallelism=1)
    return p, a, b


def graph_of(p: Pipeline) -> tuple[dict[str, list[str]], list[tuple[str, str, str, int, str]], Any]:
    graph = p.job_graph()
    kinds = {v.vertex_id: [o.kind for o in v.operators] for v in graph.vertices}
    edges = [
        (
            e.source_vertex_id,
            e.target_vertex_id,
            wire.PARTITIONER_KIND.from_pb(e.partitioner).name,
            e.target_input,
            e.key_field,
        )
        for e in graph.edges
    ]
    return kinds, edges, graph


def head_of(graph: Any, vertex_id: str) -> Operator:
    vertex = next(v for v in graph.vertices if v.vertex_id == vertex_id)
    op: Operator = cloudpickle.loads(vertex.operators[0].payload)
    return op


def test_connect_process_and_process_batches_not_keyed() -> None:
    p, a, b = pipeline()
    out = a.connect(b).process(Co(), name="co")
    out.sink(CollectSink())
    p2, a2, b2 = pipeline()
    a2.connect(b2).process_batches(CoBatch()).sink(CollectSink())
    for pipe, op_type, kind in ((p, CoProcess, "co"), (p2, CoBatchProcess, "process_batches")):
        kinds, edges, graph = graph_of(pipe)
        assert kinds["v2-connect"] == ["process" if kind == "co" else "process_batches", "sink"]
        assert edges == [
            ("v0-a", "v2-connect", "FORWARD", 0, ""),
            ("v1-b", "v2-connect", "REBALANCE", 1, ""),
        ]
        assert isinstance(head_of(graph, "v2-connect"), op_type)
        assert graph.vertices[2].operators[0].name == kind


def test_keyed_connect_process_shares_one_keyed_vertex() -> None:
    for build in (
        lambda a, b: a.key_by("key").connect(b.key_by("value")),
        lambda a, b: a.connect(b).key_by("key", "value"),
    ):
        p, a, b = pipeline()
        build(a, b).process(KeyedCo()).sink(CollectSink())
        kinds, edges, graph = graph_of(p)
        (vertex,) = [v for v in kinds if v not in ("v0-a", "v1-b")]
        assert kinds[vertex] == ["process", "sink"]
        assert edges == [("v0-a", vertex, "HASH", 0, "key"), ("v1-b", vertex, "HASH", 1, "value")]
        op = head_of(graph, vertex)
        assert isinstance(op, KeyedCoProcess) and op.key_fields == ("key", "value")
    p, a, b = pipeline()
    a.key_by("key").connect(b.key_by("value")).process_batches(KeyedCoBatch()).sink(CollectSink())
    kinds, _edges, graph = graph_of(p)
    op = head_of(graph, "v2-key-by-key")
    assert isinstance(op, KeyedCoBatchProcess) and op.key_fields == ("key", "value")


def test_broadcast_connections_send_input_1_to_every_subtask() -> None:
    p, a, b = pipeline()
    schema = pa.schema([("v", pa.int64())])
    out = a.connect(b.broadcast()).process(Bcast(), output_schema=schema)
    assert out.schema == schema
    out.sink(CollectSink())
    _kinds, edges, graph = graph_of(p)
    assert edges == [
        ("v0-a", "v2-connect", "FORWARD", 0, ""),
        ("v1-b", "v2-connect", "BROADCAST", 1, ""),
    ]
    assert isinstance(head_of(graph, "v2-connect"), BroadcastProcess)
    p, a, b = pipeline()
    a.key_by("key").connect(b.broadcast()).process(KeyedBcast()).sink(CollectSink())
    _kinds, edges, graph = graph_of(p)
    assert edges == [
        ("v0-a", "v2-key-by-key", "HASH", 0, "key"),
        ("v1-b", "v2-key-by-key", "BROADCAST", 1, ""),
    ]
    op = head_of(graph, "v2-key-by-key")
    assert isinstance(op, KeyedBroadcastProcess) and op.key_field == "key"
    assert PartitionerKind.BROADCAST.name == "BROADCAST"


@pytest.mark.parametrize(
    ("connect", "method", "function", "message"),
    [
        ("plain", "process", KeyedCo(), r"needs a CoProcessFunction, got a KeyedCoProcessFunction"),
        ("plain", "process", KeyedBcast(), r"KeyedBroadcastProcessFunction, which runs with"),
        ("plain", "process", lambda r, c: None, r"needs a CoProcessFunction \(subclass it\)"),
        ("plain", "process_batches", Co(), r"needs a CoBatchFunction, got a CoProcessFunction"),
        ("broadcast", "process", Co(), r"a\.connect\(b\.broadcast\(\)\) needs a Broadcast"),
        ("broadcast", "process", KeyedBcast(), r"on a\.key_by\(k\)\.connect\(b\.broadcast"),
        ("broadcast", "process_batches", CoBatch(), r"no vectorised function; use process"),
        ("keyed", "process", Co(), r"needs a KeyedCoProcessFunction, got a CoProcessFunction"),
        ("keyed", "process", KeyedBcast(), r"or connect the streams that way"),
        ("keyed", "process_batches", CoBatch(), r"needs a KeyedCoBatchFunction"),
        ("keyed_broadcast", "process", KeyedCo(), r"needs a KeyedBroadcastProcessFunction"),
        ("keyed_broadcast", "process", Bcast(), r"needs a KeyedBroadcastProcessFunction"),
        ("keyed_broadcast", "process_batches", KeyedCoBatch(), r"no vectorised function"),
    ],
)
def test_a_function_of_the_wrong_kind_is_refused_at_build_time(
    connect: str, method: str, function: Any, message: str
) -> None:
    _p, a, b = pipeline()
    streams = {
        "plain": lambda: a.connect(b),
        "broadcast": lambda: a.connect(b.broadcast()),
        "keyed": lambda: a.key_by("key").connect(b.key_by("value")),
        "keyed_broadcast": lambda: a.key_by("key").connect(b.broadcast()),
    }[connect]()
    with pytest.raises(InvalidArgumentError, match=message):
        getattr(streams, method)(function)

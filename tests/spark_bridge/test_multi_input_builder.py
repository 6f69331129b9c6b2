"""The builder's streams of several inputs (union, side outputs, connect, broadcast) as job
graphs: which vertices, which edges into which input, and the build-time errors (no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from snapflow import wire
from snapflow.coordinator.convert import graph_from_pb
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import PartitionerKind
from snapflow.spark_bridge import Pipeline
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.api.operators import Map
from snapflow.worker.connectors.debug_sinks import CollectSink
from snapflow.worker.connectors.split_sources import GeneratorSource, SequenceSource
from snapflow.worker.runtime.operator import Operator, OutputTag

HASH, FORWARD, REBALANCE, BROADCAST = (
    PartitionerKind.HASH,
    PartitionerKind.FORWARD,
    PartitionerKind.REBALANCE,
    PartitionerKind.BROADCAST,
)


class TwoInputs(Operator):
    """A head with two inputs (forwards both)."""

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return [batch]


def edges(graph: pb.JobGraph) -> list[tuple[str, str, PartitionerKind, str, int, str]]:
    return [
        (
            e.source_vertex_id,
            e.target_vertex_id,
            wire.PARTITIONER_KIND.from_pb(e.partitioner, field="partitioner"),
            e.key_field,
            e.target_input,
            e.output_tag,
        )
        for e in graph.edges
    ]


def kinds(graph: pb.JobGraph) -> dict[str, list[str]]:
    return {v.vertex_id: [o.kind for o in v.operators] for v in graph.vertices}


def test_a_union_feeds_one_input_and_key_by_repartitions_it_without_a_hop() -> None:
    p = Pipeline("union", parallelism=2)
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(GeneratorSource(total_records=10), name="b", parallelism=1)
    a.union(b).key_by("key").count().sink(CollectSink())
    graph = p.job_graph()
    assert kinds(graph) == {
        "v0-a": ["source"],
        "v1-b": ["source"],
        "v2-union": ["count", "sink"],
    }
    assert edges(graph) == [
        ("v0-a", "v2-union", HASH, "key", 0, ""),
        ("v1-b", "v2-union", HASH, "key", 0, ""),
    ]
    graph_from_pb(graph)  # the coordinator accepts it


def test_a_union_chained_directly_forwards_at_equal_parallelism() -> None:
    p = Pipeline("union", parallelism=2)
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(GeneratorSource(total_records=10), name="b", parallelism=1)
    a.union(b).sink(CollectSink())
    assert edges(p.job_graph()) == [
        ("v0-a", "v2-union", FORWARD, "", 0, ""),
        ("v1-b", "v2-union", REBALANCE, "", 0, ""),
    ]


def test_union_of_known_different_schemas_is_refused_at_build_time() -> None:
    p = Pipeline("union")
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(SequenceSource(0, 10, field="n"), name="b")
    with pytest.raises(InvalidArgumentError, match=r"one schema.*map\(\.\.\., output_schema"):
        a.union(b)


def test_a_diamond_splits_and_rejoins() -> None:
    p = Pipeline("diamond", parallelism=2)
    src = p.source(GeneratorSource(total_records=10), name="src")
    schema = pa.schema([("key", pa.int64()), ("value", pa.int64())])
    left = src.key_by("key").reduce("value").map(lambda r: r, output_schema=schema)
    right = (
        src.key_by("value")
        .reduce("key")
        .map(lambda r: {"key": r["value"], "value": r["key"]}, output_schema=schema)
    )
    left.union(right).key_by("key").count().sink(CollectSink())
    graph = p.job_graph()
    targets = [(s, t, k, i) for s, t, k, _, i, _ in edges(graph)]
    assert targets == [
        ("v0-src", "v1-key-by-key", HASH, 0),
        ("v0-src", "v2-key-by-value", HASH, 0),
        ("v1-key-by-key", "v3-union", HASH, 0),
        ("v2-key-by-value", "v3-union", HASH, 0),
    ]
    graph_from_pb(graph)


def test_side_outputs_travel_on_tagged_edges() -> None:
    p = Pipeline("side", parallelism=2)
    late = OutputTag("late")
    main = p.source(GeneratorSource(total_records=10), name="src").transform(Map(lambda r: r))
    main.sink(CollectSink())
    main.side_output(late).key_by("key").count().sink(CollectSink())
    graph = p.job_graph()
    assert edges(graph) == [("v0-src", "v1-side-output-late", HASH, "key", 0, "late")]
    with pytest.raises(InvalidArgumentError, match="already taken"):
        main.side_output(late)
    with pytest.raises(InvalidArgumentError, match="OutputTag"):
        main.side_output("late")  # type: ignore[arg-type]


def test_connect_feeds_input_0_and_input_1() -> None:
    p = Pipeline("connect", parallelism=2)
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(SequenceSource(0, 10), name="b", parallelism=1)
    a.connect(b).transform(TwoInputs(), name="both").sink(CollectSink())
    graph = p.job_graph()
    assert edges(graph) == [
        ("v0-a", "v2-connect", FORWARD, "", 0, ""),
        ("v1-b", "v2-connect", REBALANCE, "", 1, ""),
    ]
    graph_from_pb(graph)


def test_keyed_connect_shares_one_keyed_vertex() -> None:
    p = Pipeline("keyed", parallelism=2)
    a = p.source(GeneratorSource(total_records=10), name="a").key_by("key")
    b = p.source(GeneratorSource(total_records=10), name="b").key_by("value")
    a.connect(b).transform(TwoInputs()).sink(CollectSink())
    graph = p.job_graph()
    assert [v.vertex_id for v in graph.vertices] == ["v0-a", "v1-key-by-key", "v2-b"]
    assert edges(graph) == [
        ("v0-a", "v1-key-by-key", HASH, "key", 0, ""),
        ("v2-b", "v1-key-by-key", HASH, "value", 1, ""),
    ]
    with pytest.raises(InvalidArgumentError, match="consumed"):
        b.count()  # its edges moved into the connected vertex
    graph_from_pb(graph)


def test_connected_streams_key_by_keys_both() -> None:
    p = Pipeline("keyed")
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(GeneratorSource(total_records=10), name="b")
    a.connect(b).key_by("key", "key").transform(TwoInputs()).sink(CollectSink())
    assert [(k, f, i) for _, _, k, f, i, _ in edges(p.job_graph())] == [
        (HASH, "key", 0),
        (HASH, "key", 1),
    ]


def test_keyed_connect_refuses_keys_of_different_types() -> None:
    p = Pipeline("keys")
    schema = pa.schema([("key", pa.string())])
    a = p.source(GeneratorSource(total_records=10), name="a").key_by("key")
    b = (
        p.source(GeneratorSource(total_records=10), name="b")
        .map(lambda r: {"key": str(r["key"])}, output_schema=schema)
        .key_by("key")
    )
    with pytest.raises(InvalidArgumentError, match=r"one type.*int64.*string.*cast one"):
        a.connect(b)
    with pytest.raises(InvalidArgumentError, match="no field 'nope'"):
        p.source(GeneratorSource(total_records=10), name="c").key_by("nope")


def test_broadcast_goes_to_every_subtask_of_input_1() -> None:
    p = Pipeline("broadcast", parallelism=2)
    rules = p.source(SequenceSource(0, 3), name="rules", parallelism=1).broadcast()
    events = p.source(GeneratorSource(total_records=10), name="events").key_by("key")
    events.connect(rules).transform(TwoInputs()).sink(CollectSink())
    graph = p.job_graph()
    assert edges(graph) == [
        ("v1-events", "v2-key-by-key", HASH, "key", 0, ""),
        ("v0-rules", "v2-key-by-key", BROADCAST, "", 1, ""),
    ]
    graph_from_pb(graph)
    p2 = Pipeline("broadcast")
    plain = p2.source(GeneratorSource(total_records=10), name="s")
    with pytest.raises(InvalidArgumentError, match="broadcast input cannot be keyed"):
        plain.connect(p2.source(SequenceSource(0, 3)).broadcast()).key_by("key", "value")


def test_connect_errors_name_the_fix() -> None:
    p = Pipeline("errors")
    a = p.source(GeneratorSource(total_records=10), name="a")
    keyed = p.source(GeneratorSource(total_records=10), name="b").key_by("key")
    with pytest.raises(InvalidArgumentError, match="key both"):
        a.connect(keyed)
    with pytest.raises(InvalidArgumentError, match="Stream"):
        a.connect(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not followed by"):
        p2 = Pipeline("empty-union")
        x = p2.source(GeneratorSource(total_records=10), name="x")
        y = p2.source(GeneratorSource(total_records=10), name="y")
        x.union(y)
        p2.job_graph()


def test_the_coordinator_refuses_gaps_in_inputs_and_mixed_partitioning() -> None:
    p = Pipeline("bad")
    a = p.source(GeneratorSource(total_records=10), name="a")
    b = p.source(GeneratorSource(total_records=10), name="b")
    a.connect(b).transform(TwoInputs()).sink(CollectSink())
    graph = p.job_graph()
    graph.edges[1].target_input = 2
    with pytest.raises(InvalidArgumentError, match="without gaps"):
        graph_from_pb(graph)
    graph.edges[1].target_input = 0
    graph.edges[1].partitioner = wire.PARTITIONER_KIND.to_pb(HASH)
    graph.edges[1].key_field = "key"
    with pytest.raises(InvalidArgumentError, match="HASH and other edges mixed"):
        graph_from_pb(graph)
    graph.edges[1].target_input = 100
    with pytest.raises(InvalidArgumentError, match="target_input 100 out of range"):
        graph_from_pb(graph)

"""Build small job graphs of real operators for worker tests."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from snapflow.v1 import common_pb2 as pb
from snapflow.worker.connectors.split_sources import GeneratorSource


def op_spec(operator_id: str, operator: Any, kind: str = "") -> pb.OperatorSpec:
    return pb.OperatorSpec(
        operator_id=operator_id,
        name=operator_id,
        kind=kind or type(operator).__name__,
        payload=cloudpickle.dumps(operator),
    )


def count_graph(
    source: Any, counter: Any, sink: Any, parallelism: int = 2, max_parallelism: int = 128
) -> pb.JobGraph:
    """source -> hash(key) -> [keyed count -> sink]: the pipeline of the exactly-once tests."""
    return pb.JobGraph(
        name="keyed-count",
        vertices=[
            pb.JobVertex(
                vertex_id="source",
                name="source",
                parallelism=parallelism,
                max_parallelism=max_parallelism,
                is_source=True,
                operators=[op_spec("source", source)],
            ),
            pb.JobVertex(
                vertex_id="count",
                name="count",
                parallelism=parallelism,
                max_parallelism=max_parallelism,
                operators=[op_spec("count", counter), op_spec("sink", sink)],
            ),
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id="source",
                target_vertex_id="count",
                partitioner=pb.PARTITIONER_KIND_HASH,
                key_field="key",
            )
        ],
    )


def expected_counts(source: GeneratorSource, parallelism: int) -> Counter[int]:
    """The true count per key, from the generator's scalar record definition."""
    assert source.total_records is not None
    base, rest = divmod(source.total_records, parallelism)
    counts: Counter[int] = Counter()
    for split in range(parallelism):
        for i in range(base + (1 if split < rest else 0)):
            counts[source.record(split, i)["key"]] += 1
    return counts


def check_exactly_once(table: pa.Table, expected: Counter[int]) -> None:
    """Committed running counts: per key strictly increasing in commit order (a replayed
    record that was committed twice would repeat or lower a count), ending at the true count
    (a lost record would end below it)."""
    by_key: dict[int, list[int]] = {}
    for key, count in zip(
        table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True
    ):
        by_key.setdefault(key, []).append(count)
    for key, counts in by_key.items():
        assert all(a < b for a, b in itertools.pairwise(counts)), (
            f"key {key}: {counts} not strictly increasing"
        )
    finals = {key: counts[-1] for key, counts in by_key.items()}
    assert finals == dict(expected), "final counts differ from the true counts"

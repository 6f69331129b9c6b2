"""Build small job graphs of real operators for worker tests."""

from __future__ import annotations

from typing import Any

from pyspark import cloudpickle

from snapflow.v1 import common_pb2 as pb


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

"""The chaos suite's join job: two sources, a keyed two-input operator, a transactional sink.

``a: SequenceSource(0, n) -> (key, a)`` and ``b: SequenceSource(0, n) -> (key, b)``, with
``key = number % keys``, both hash-partitioned by ``key`` into one keyed vertex: input 0 from
``a``, input 1 from ``b``. Its head is the library's regular inner join
(``RegularJoinOperator``, what ``KeyedStream.join`` builds): it keeps every row of each input
per key and matches it against the other input's rows kept so far, so every pair of numbers
with equal keys is emitted exactly once as ``(key, a, b)``; the
``TransactionalFileSink`` commits them per checkpoint. The expected output is known in plain
Python (every pair with equal keys once), so the verification is record by record: a row
missing is lost, a row committed twice or no source could produce is duplicated.

It exercises barrier alignment, unaligned channel state and the restore of keyed state over
a task with two inputs.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle

from snapflow.v1 import common_pb2 as pb
from snapflow.worker.api.join_output import SelectPairs
from snapflow.worker.api.operators import MapBatches
from snapflow.worker.api.regular_join import RegularJoinOperator
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import SequenceSource

# The workers may not find the chaos package on their path: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

I64 = pa.int64()
FIELDS = ("a", "b")
_PAIRS = SelectPairs("key", "key", "left_", "right_")
"""Both key fields are ``key``: the joined rows are ``(key, a, b)``."""
MATCHES_PER_SIDE = 8
"""Records of each source per key (about): 64 output rows per key, whatever the size."""


class AddKey:
    """``field -> (key, field)`` with ``key = field % keys`` (a picklable batch function)."""

    def __init__(self, field: str, keys: int) -> None:
        self.field = field
        self.keys = keys

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        values = batch.column(self.field)
        return pa.RecordBatch.from_arrays(
            [pc.modulo(values, pa.scalar(self.keys, I64)), values], names=["key", self.field]
        )


def join_size(records: int, keys: int) -> tuple[int, int]:
    """(numbers per source, keys) for a join job of ``records`` records in all: at least
    ``keys`` keys, and about :data:`MATCHES_PER_SIDE` numbers of each source per key."""
    per_source = max(1, records // 2)
    return per_source, max(keys, per_source // MATCHES_PER_SIDE)


def join_graph(
    name: str, out: Path, records: int, keys: int, rate_per_s: int, parallelism: int
) -> pb.JobGraph:
    per_source, keys = join_size(records, keys)

    def op(operator_id: str, operator: Any) -> pb.OperatorSpec:
        return pb.OperatorSpec(
            operator_id=operator_id,
            name=operator_id,
            kind=type(operator).__name__,
            payload=cloudpickle.dumps(operator),
        )

    def source(field: str) -> pb.JobVertex:
        numbers = SequenceSource(
            0, per_source, batch_size=256, field=field, rate_per_s=max(1, rate_per_s // 2)
        )
        return pb.JobVertex(
            vertex_id=field,
            name=field,
            parallelism=parallelism,
            max_parallelism=128,
            is_source=True,
            operators=[op(field, numbers), op(f"key-{field}", MapBatches(AddKey(field, keys)))],
        )

    return pb.JobGraph(
        name=name,
        vertices=[
            source(FIELDS[0]),
            source(FIELDS[1]),
            pb.JobVertex(
                vertex_id="join",
                name="join",
                parallelism=parallelism,
                max_parallelism=128,
                operators=[
                    op("join", RegularJoinOperator("key", "key", emitter=_PAIRS)),
                    op("sink", TransactionalFileSink(str(out))),
                ],
            ),
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id=field,
                target_vertex_id="join",
                partitioner=pb.PARTITIONER_KIND_HASH,
                key_field="key",
                target_input=index,
            )
            for index, field in enumerate(FIELDS)
        ],
    )


def expected_join(records: int, keys: int) -> Counter[tuple[int, int, int]]:
    """Every pair of numbers with equal keys, once."""
    per_source, keys = join_size(records, keys)
    by_key: dict[int, list[int]] = {}
    for b in range(per_source):
        by_key.setdefault(b % keys, []).append(b)
    return Counter((a % keys, a, b) for a in range(per_source) for b in by_key.get(a % keys, []))


def verify_join(out: Path, expected: Counter[tuple[int, int, int]]) -> tuple[int, int]:
    """(rows lost, rows duplicated or never produced) of the committed output."""
    table: pa.Table = read_committed(out) if out.exists() else pa.table({})
    committed: Counter[tuple[int, int, int]] = Counter()
    if table.num_rows:
        committed.update(
            zip(
                table.column("key").to_pylist(),
                table.column(FIELDS[0]).to_pylist(),
                table.column(FIELDS[1]).to_pylist(),
                strict=True,
            )
        )
    lost = sum((expected - committed).values())
    duplicated = sum((committed - expected).values())
    return lost, duplicated

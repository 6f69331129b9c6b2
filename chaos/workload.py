"""The chaos jobs and their exact verification.

Two kinds of job (``JobSpec.kind``):

* ``count``: ``GeneratorSource -> hash(key) -> KeyedCount -> TransactionalFileSink``: the
  source is deterministic and replayable, so the true count of every key is known; the sink
  commits a running count per key and checkpoint. Exactly once means, per key, committed counts
  strictly increasing in commit order (a record committed twice repeats or lowers a count) and
  a last count equal to the true count (a lost record ends below it).
* ``join``: two sources keyed alike into a keyed two-input operator, then the sink
  (``chaos.join_workload``); its output is checked row by row against every matching pair.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from chaos.join_workload import expected_join, join_graph, verify_join
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource

KINDS = ("count", "join")

MODES = {
    "aligned": (pb.CHECKPOINT_MODE_ALIGNED, 0),
    "unaligned": (pb.CHECKPOINT_MODE_UNALIGNED, 0),
    "aligned-timeout": (pb.CHECKPOINT_MODE_ALIGNED, 20),
}


@dataclass(frozen=True)
class JobSpec:
    """One chaos job: its kind (:data:`KINDS`), mode, size and parallelism (slots = worker
    processes)."""

    name: str
    mode: str
    records: int
    rate_per_s: int
    keys: int
    parallelism: int
    seed: int
    kind: str = "count"

    def source(self) -> GeneratorSource:
        return GeneratorSource(
            total_records=self.records,
            rate_per_s=self.rate_per_s,
            num_keys=self.keys,
            batch_size=512,
            seed=self.seed,
        )

    def graph(self, out: Path) -> pb.JobGraph:
        if self.kind == "join":
            return join_graph(
                self.name, out, self.records, self.keys, self.rate_per_s, self.parallelism
            )

        def op(operator_id: str, operator: Any) -> pb.OperatorSpec:
            return pb.OperatorSpec(
                operator_id=operator_id,
                name=operator_id,
                kind=type(operator).__name__,
                payload=cloudpickle.dumps(operator),
            )

        p = self.parallelism
        return pb.JobGraph(
            name=self.name,
            vertices=[
                pb.JobVertex(
                    vertex_id="source",
                    name="source",
                    parallelism=p,
                    max_parallelism=128,
                    is_source=True,
                    operators=[op("source", self.source())],
                ),
                pb.JobVertex(
                    vertex_id="count",
                    name="count",
                    parallelism=p,
                    max_parallelism=128,
                    operators=[
                        op("count", KeyedCount("key")),
                        op("sink", TransactionalFileSink(str(out))),
                    ],
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

    def checkpoint_config(self, interval_ms: int) -> pb.CheckpointConfig:
        mode, aligned_timeout_ms = MODES[self.mode]
        return pb.CheckpointConfig(
            interval_ms=interval_ms,
            mode=mode,
            aligned_checkpoint_timeout_ms=aligned_timeout_ms,
            tolerable_failures_unlimited=True,
        )

    def verify(self, out: Path) -> Verdict:
        """How far the committed output in ``out`` is from exactly once."""
        if self.kind == "join":
            expected = expected_join(self.records, self.keys)
            lost, duplicated = verify_join(out, expected)
            return Verdict(sum(expected.values()), lost, duplicated)
        return verify(out, self.expected())

    def expected(self) -> Counter[int]:
        """The true count per key (a count job), from the generator's scalar record
        definition."""
        source = self.source()
        base, rest = divmod(self.records, self.parallelism)
        counts: Counter[int] = Counter()
        for split in range(self.parallelism):
            for i in range(base + (1 if split < rest else 0)):
                counts[source.record(split, i)["key"]] += 1
        return counts


@dataclass(frozen=True)
class Verdict:
    """How far the committed output is from exactly once."""

    records: int
    """Records of the true output: source records (count), matching pairs (join)."""
    lost: int
    """Records of the true counts missing from the last committed counts (join: rows
    missing)."""
    duplicated: int
    """Records counted twice: last counts above the truth, plus every repeated or lowered
    committed count (a replay committed again); join: rows committed twice or never
    produced."""

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0


def verify(out: Path, expected: Counter[int]) -> Verdict:
    table: pa.Table = read_committed(out) if out.exists() else pa.table({})
    by_key: dict[int, list[int]] = {}
    if table.num_rows:
        for key, count in zip(
            table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True
        ):
            by_key.setdefault(key, []).append(count)
    lost = duplicated = 0
    for key in set(expected) | set(by_key):
        counts = by_key.get(key, [0])
        duplicated += sum(1 for a, b in itertools.pairwise(counts) if b <= a)
        final, truth = counts[-1], expected.get(key, 0)
        lost += max(0, truth - final)
        duplicated += max(0, final - truth)
    return Verdict(sum(expected.values()), lost, duplicated)

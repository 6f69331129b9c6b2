"""Build small job graphs of real operators for worker tests, and run them on in-process
agents."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from kit.coordinator import Running
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.agent import Agent


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


async def run_agents(
    address: str, job_id: str, *, slots: int = 2, timeout_s: float = 60, **agent_options: Any
) -> None:
    """Start one in-process agent per slot for the job, run them all until the job's tasks end
    (within ``timeout_s``), and stop every agent whatever happened."""
    agents = [
        Agent(address, job_id, slot=s, num_slots=slots, **agent_options) for s in range(slots)
    ]
    for a in agents:
        await a.start()
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(a.run() for a in agents))
    finally:
        for a in agents:
            await a.stop()


async def run_job(
    c: Running,
    graph: pb.JobGraph,
    checkpoint_config: pb.CheckpointConfig | None = None,
    **run_options: Any,
) -> str:
    """Submit ``graph`` to the coordinator and run it on in-process agents to its end (see
    :func:`run_agents` for ``run_options``); returns the job id."""
    job_id = await submit_graph(c.stub, graph, checkpoint_config)
    await run_agents(c.address, job_id, **run_options)
    return job_id


async def submit_graph(
    stub: cgrpc.CoordinatorServiceAsyncStub,
    graph: pb.JobGraph,
    checkpoint_config: pb.CheckpointConfig | None = None,
    restore: cpb.RestoreSettings | None = None,
) -> str:
    """Submit ``graph`` (with these checkpoint and restore settings, if given); returns the
    job id."""
    request = cpb.SubmitJobRequest(graph=graph)
    if checkpoint_config is not None:
        request.checkpoint_config.CopyFrom(checkpoint_config)
    if restore is not None:
        request.restore.CopyFrom(restore)
    job_id: str = (await stub.SubmitJob(request, timeout=10)).job.job_id
    return job_id

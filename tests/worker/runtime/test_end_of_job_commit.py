"""FINISHED means committed, on the `snapflow worker` path: a bounded job run by worker
processes ends with its final checkpoint committed, with periodic checkpoints on and off, into a
transactional file sink and a Parquet sink. (The Spark path: tests/cli/test_run.py and
tests/spark_bridge.)

Without periodic checkpoints each source asks the coordinator for the final checkpoint when its
input ends; before, agents started by `snapflow worker` did not, and such a job reached FINISHED
with every record of its sinks uncommitted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest
from kit.coordinator import running_coordinator, wait_job_state
from kit.processes import Processes, start_worker
from kit.workers import check_exactly_once, count_graph, expected_counts, submit_graph

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.parquet_sink import TransactionalParquetSink, read_committed_parquet
from snapflow.worker.connectors.split_sources import GeneratorSource


@pytest.mark.slow
@pytest.mark.parametrize("interval_ms", [0, 200], ids=["checkpoints-off", "checkpoints-on"])
@pytest.mark.parametrize("sink_kind", ["file", "parquet"])
def test_a_bounded_job_on_worker_processes_finishes_with_everything_committed(
    redis_url: str, tmp_path: Path, interval_ms: int, sink_kind: str
) -> None:
    out = tmp_path / "out"
    source = GeneratorSource(
        total_records=60_000, rate_per_s=40_000, num_keys=200, batch_size=2048, seed=3
    )
    sink = (
        TransactionalFileSink(str(out))
        if sink_kind == "file"
        else TransactionalParquetSink(str(out))
    )

    async def main() -> cpb.CheckpointStats:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(source, KeyedCount("key"), sink, parallelism=2)
            job_id = await submit_graph(c.stub, graph, pb.CheckpointConfig(interval_ms=interval_ms))
            with Processes() as procs:
                workers = [
                    procs.add(start_worker(c.address, job_id, slot, 2, tmp_path / f"w{slot}.log"))
                    for slot in range(2)
                ]
                await wait_job_state(
                    c.stub, job_id, {pb.JOB_STATE_FINISHED}, timeout_s=90, procs=workers
                )
                for worker in workers:
                    assert await asyncio.to_thread(worker.wait, 30) == 0
            return await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )

    stats = asyncio.run(main())
    committed: pa.Table = (
        read_committed(out) if sink_kind == "file" else read_committed_parquet(out)
    )
    # Every record counted and committed exactly once: nothing left in an open transaction.
    check_exactly_once(committed, expected_counts(source, 2))
    assert stats.counts.completed >= 1, "no checkpoint completed: nothing could have committed"
    if interval_ms == 0:
        assert stats.counts.completed == 1  # the final one, asked for by the ended sources

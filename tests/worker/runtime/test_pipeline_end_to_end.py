"""The worker runtime end to end: coordinator, Redis, agents, real operators and channels."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kit.coordinator import running_coordinator
from kit.workers import check_exactly_once, count_graph, expected_counts, run_job

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource

RECORDS = 200_000
KEYS = 500


def test_bounded_pipeline_two_agents_exactly_once(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(
                GeneratorSource(total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=7),
                KeyedCount("key"),
                TransactionalFileSink(str(out)),
            )
            job_id = await run_job(
                c, graph, pb.CheckpointConfig(interval_ms=100), source_batch_records=4096
            )
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            assert stats.counts.completed >= 1
            # the final checkpoint was taken after every source emitted everything
            assert stats.latest_completed.source_records == RECORDS

    asyncio.run(main())
    source = GeneratorSource(total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=7)
    check_exactly_once(read_committed(out), expected_counts(source, 2))


def test_bounded_job_without_periodic_checkpoints_finishes_committed(
    redis_url: str, tmp_path: Path
) -> None:
    """No interval: the ended sources ask the coordinator for the final checkpoint, and the job
    finishes with exactly that one checkpoint, which commits the sink (it used to finish with
    nothing committed: two-phase commit needs a checkpoint)."""
    out = tmp_path / "out"
    source = GeneratorSource(total_records=20_000, num_keys=50, batch_size=4096, seed=3)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(out)))
            job_id = await run_job(c, graph, timeout_s=30)
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            assert stats.counts.completed == 1

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))

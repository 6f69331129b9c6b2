"""The worker runtime end to end with checkpoints on S3 (moto's server): coordinator, Redis and
two agents in one process, the keyed count job, and the request budget of its checkpoints."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kit.coordinator import running_coordinator
from kit.workers import check_exactly_once, count_graph, expected_counts, run_job

from snapflow.filestore_registry import store_for
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource

RECORDS = 200_000
KEYS = 500
SUBTASKS = 4  # source and count, parallelism 2
#: At most this many PUTs per subtask and checkpoint (the budget of the issue); the worker
#: writes one (a subtask's files of a checkpoint are merged into one object).
PUT_BUDGET = 3


def _source() -> GeneratorSource:
    return GeneratorSource(total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=7)


@pytest.mark.parametrize(
    ("mode", "inline"),
    [
        pytest.param(pb.CHECKPOINT_MODE_ALIGNED, False, id="aligned"),
        pytest.param(pb.CHECKPOINT_MODE_UNALIGNED, False, id="unaligned"),
        pytest.param(pb.CHECKPOINT_MODE_ALIGNED, True, id="aligned-inline"),
    ],
)
def test_bounded_pipeline_with_checkpoints_on_s3_exactly_once_within_the_budget(
    redis_url: str, s3_bucket: str, tmp_path: Path, mode: pb.CheckpointMode, inline: bool
) -> None:
    """Without inline state (threshold 0) each subtask writes one object per checkpoint; with
    the default threshold this job's state (500 keys) is inline: no PUT by any worker."""
    out = tmp_path / "out"
    root = f"s3://{s3_bucket}/checkpoints"
    # The coordinator gets its own S3 settings (another retry bound), so its own store and
    # counts: the counts of the default store are the workers' alone.
    worker_requests = store_for(root).requests
    before = worker_requests.snapshot()
    result: dict[str, Any] = {}

    async def main() -> None:
        async with running_coordinator(redis_url, root, s3_max_attempts=4) as c:
            assert store_for(root, c.coordinator.settings.s3_settings()) is not store_for(root)
            graph = count_graph(_source(), KeyedCount("key"), TransactionalFileSink(str(out)))
            config = pb.CheckpointConfig(interval_ms=100, mode=mode)
            if not inline:
                config.inline_state_threshold_bytes = 0
            job_id = await run_job(c, graph, config, source_batch_records=4096)
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            assert stats.counts.completed >= 1
            assert stats.latest_completed.source_records == RECORDS
            assert stats.latest_completed.external_path.startswith(f"{root}/")
            result["checkpoints"] = stats.counts.triggered
            result["latest"] = stats.latest_completed.checkpoint_id
            result["job"] = job_id

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(_source(), 2))
    used = {k: v - before[k] for k, v in worker_requests.snapshot().items()}
    # Writing checkpoints: PUTs only, never a LIST or HEAD, and no GET (nothing restored).
    assert used["list"] == used["head"] == used["get"] == 0, used
    chk = f"{root}/{result['job']}/chk-{result['latest']}"
    names = sorted(p.removeprefix(f"{chk}/") for p in store_for(root).list(chk))
    if inline:
        assert used["put"] == 0, (used, result)
        assert names == ["_metadata"]
        return
    # At most one PUT per subtask and triggered checkpoint (well within the budget).
    assert 0 < used["put"] <= SUBTASKS * result["checkpoints"], (used, result)
    # Per subtask and checkpoint: one object (its state files merged), next to _metadata.
    subtasks = [n.split("/")[0] for n in names if n != "_metadata"]
    assert "_metadata" in names
    assert sorted(subtasks) == ["count-0-1", "count-1-1", "source-0-1", "source-1-1"], names

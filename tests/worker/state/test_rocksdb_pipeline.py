"""The disk backend in running jobs: coordinator, Redis and in-process agents. Exactly-once
output, shared files reference-counted (none leaked after retention and after a coordinator
restart), restores at another parallelism, and stats that show the incremental size."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
from collections import Counter
from pathlib import Path

from kit.coordinator import running_coordinator
from kit.shared_files import shared_files_state
from kit.workers import check_exactly_once, count_graph, expected_counts, run_agents, run_job

from snapflow.cli.main import main as cli_main
from snapflow.coordinator import dashboard_views
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.limits import MAX_COMPACTION_TRIGGER
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource

RECORDS = 120_000
KEYS = 2_000


def _source(records: int = RECORDS) -> GeneratorSource:
    return GeneratorSource(
        total_records=records, rate_per_s=60_000, num_keys=KEYS, batch_size=2048, seed=5
    )


def test_retention_and_a_coordinator_restart_leak_no_shared_file(
    redis_url: str, tmp_path: Path
) -> None:
    out, root = tmp_path / "out", str(tmp_path / "cp")
    config = pb.CheckpointConfig(interval_ms=100, retained=2, state_backend="rocksdb")

    async def main() -> str:
        async with running_coordinator(redis_url, root) as c:
            graph = count_graph(_source(), KeyedCount("key"), TransactionalFileSink(str(out)))
            job_id = await run_job(c, graph, config, source_batch_records=2048)
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            assert stats.counts.completed >= 4, "too few checkpoints to retire any"
            stored, referenced = await shared_files_state(c.coordinator, job_id)
            assert referenced, "the retained checkpoints reference shared files"
            assert stored == referenced, f"leaked: {sorted(stored - referenced)[:3]}"
        # A new incarnation on the same Redis and storage rebuilds the references.
        async with running_coordinator(redis_url, root) as c:
            stored, referenced = await shared_files_state(c.coordinator, job_id)
            assert stored == referenced and referenced
        return job_id

    job_id = asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(_source(), 2))
    # Every checkpoint directory but the retained ones is gone too.
    assert len(CheckpointStorage(root).list_checkpoint_ids(job_id)) <= 2


def _cli(*argv: str) -> str:
    """The CLI's output (run in a thread: it blocks on its own gRPC channel)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert cli_main(list(argv)) == 0
    return buffer.getvalue()


def test_stats_split_state_size_into_incremental_and_shared(redis_url: str, tmp_path: Path) -> None:
    """Per checkpoint, the stats give the state size, what the checkpoint uploaded and what it
    reused, summed over the subtasks: the reused bytes are the sizes, in storage, of the shared
    files its handles reuse; the API, the details, the dashboard's JSON and the CLI agree."""
    out, root = tmp_path / "out", str(tmp_path / "cp")
    # No compaction in this run: every checkpoint adds one sorted run, and at the trigger
    # (8 by default) a compaction rewrites them all, so the checkpoint after it reuses nothing.
    # Whether that one is the latest would depend on how many checkpoints the run completes
    # (a matter of timing); with the trigger at its maximum every checkpoint after the first
    # reuses files. (Compactions between checkpoints: test_rocksdb_backend.py.)
    config = pb.CheckpointConfig(
        interval_ms=100,
        retained=3,
        state_backend="rocksdb",
        state_backend_options=pb.StateBackendOptions(compaction_trigger=MAX_COMPACTION_TRIGGER),
    )

    async def main() -> None:
        async with running_coordinator(redis_url, root) as c:
            graph = count_graph(_source(), KeyedCount("key"), TransactionalFileSink(str(out)))
            job_id = await run_job(c, graph, config, source_batch_records=2048)
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            manager = c.coordinator.manager
            assert manager is not None
            retained = await manager.store.list_completed(job_id)
            assert len(retained) == 3
            summaries = {s.checkpoint_id: s for s in stats.history}
            reusing = 0
            for cp in retained:
                s = summaries[cp.checkpoint_id]
                handles = [
                    h for a in cp.subtask_states for o in a.operator_states for h in o.handles
                ]
                shared_on_disk = sum(os.path.getsize(h.path) for h in handles if h.kind == "shared")
                assert s.shared_size_bytes == shared_on_disk
                assert s.state_size_bytes == cp.state_size_bytes
                assert s.incremental_size_bytes == s.state_size_bytes - s.shared_size_bytes
                assert s.incremental_size_bytes > 0  # at least the manifests
                reusing += s.shared_size_bytes > 0
                details = await c.stub.GetCheckpointDetails(
                    cpb.GetCheckpointDetailsRequest(job_id=job_id, checkpoint_id=cp.checkpoint_id),
                    timeout=5,
                )
                assert sum(t.incremental_size_bytes for t in details.subtasks) == (
                    s.incremental_size_bytes
                )
                assert sum(t.shared_size_bytes for t in details.subtasks) == s.shared_size_bytes
            assert reusing, "incremental checkpoints reuse the files of earlier ones"
            assert 0 < stats.incremental_size_bytes.min <= stats.incremental_size_bytes.max
            assert stats.incremental_size_bytes.max <= stats.state_size_bytes.max
            # The first checkpoint reused nothing: all of its state was new.
            first = summaries.get(1)
            if first is not None:
                assert (first.shared_size_bytes, first.incremental_size_bytes) == (
                    0,
                    first.state_size_bytes,
                )
            # The dashboard's JSON API carries the same numbers.
            shown = dashboard_views.checkpoints(manager.jobs[job_id])["stats"]
            latest = stats.latest_completed
            assert (
                shown["latest_completed"]["incremental_size_bytes"],
                shown["latest_completed"]["shared_size_bytes"],
            ) == (latest.incremental_size_bytes, latest.shared_size_bytes)
            assert shown["incremental_size_bytes"]["max"] == stats.incremental_size_bytes.max
            # The CLI's history and details show it.
            address = ("--address", c.address, "--timeout", "10")
            listed = await asyncio.to_thread(_cli, "checkpoints", "list", job_id, *address)
            # "(... new)": the latest completed checkpoint reused shared files.
            assert "Incremental" in listed and "new)" in listed
            shown_cp = await asyncio.to_thread(
                _cli, "checkpoints", "show", job_id, str(latest.checkpoint_id), *address
            )
            assert "Incremental size" in shown_cp and "Shared (reused)" in shown_cp

    asyncio.run(main())


def _graph(out: Path, parallelism: int, run: int, records: int) -> pb.JobGraph:
    """The keyed count job; each run has a source of its own (a fresh input), the count vertex
    (its keyed state) is the same."""
    graph = count_graph(
        _source(records), KeyedCount("key"), TransactionalFileSink(str(out)), parallelism
    )
    source = f"source-{run}"
    graph.vertices[0].vertex_id = source
    graph.vertices[0].operators[0].operator_id = source
    graph.edges[0].source_vertex_id = source
    return graph


def test_rescale_2_3_1_keeps_every_key_exactly_once(redis_url: str, tmp_path: Path) -> None:
    """A job runs at parallelism 2, then resumes from its latest (incremental) checkpoint at 3,
    then at 1, each time counting a fresh input on top: every key's final count is the sum of
    all runs' records of that key, committed exactly once."""
    records = 30_000
    out = tmp_path / "out"  # one sink directory: each run re-commits what the last left

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job_id = ""
            for run, parallelism in enumerate((2, 3, 1)):
                request = cpb.SubmitJobRequest(
                    graph=_graph(out, parallelism, run, records),
                    checkpoint_config=pb.CheckpointConfig(interval_ms=100, state_backend="rocksdb"),
                )
                if job_id:
                    request.job_id = job_id
                    request.restore.latest = True
                    request.restore.allow_non_restored_state = True  # the old run's source
                job_id = (await c.stub.SubmitJob(request, timeout=10)).job.job_id
                await run_agents(c.address, job_id, slots=parallelism, source_batch_records=2048)
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.state == pb.JOB_STATE_FINISHED

    asyncio.run(main())
    total: Counter[int] = Counter()
    for parallelism in (2, 3, 1):
        total.update(expected_counts(_source(records), parallelism))
    # Per key, no running count is committed twice (a count carried twice, a lost state that
    # starts again from 1, or a record counted twice would repeat one), and the last is the
    # sum of all runs. (The part files of runs at other parallelisms do not sort by time.)
    by_key: dict[int, list[int]] = {}
    committed = read_committed(out)
    for key, count in zip(
        committed.column("key").to_pylist(), committed.column("count").to_pylist(), strict=True
    ):
        by_key.setdefault(key, []).append(count)
    for key, counts in by_key.items():
        assert len(counts) == len(set(counts)), f"key {key}: a count committed twice"
    assert {k: max(v) for k, v in by_key.items()} == dict(total)

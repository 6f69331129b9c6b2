"""The rocksdb sizing travels in the job's config: from ``p.state_backend(...)`` through the
proto, the coordinator's validation and its stored record, to the backend each task opens."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from kit.coordinator import running_coordinator
from kit.workers import check_exactly_once, count_graph, expected_counts, run_job

from snapflow import limits, wire
from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator import model as coordinator_model
from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge.pipeline import Pipeline
from snapflow.state_backend_options import COMPACTION_STYLES, StateBackendOptions
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.state import rocksdb_tuning
from snapflow.worker.state.factory import StateBackendConfig
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend

TUNED: dict[str, Any] = {
    "memory_budget_bytes": 16 << 20,
    "cache_entries": 1234,
    "compaction_style": "level",
    "compaction_trigger": 5,
    "max_size_amplification_percent": 150,
    "upload_threads": 2,
}


def test_the_styles_agree_with_the_worker() -> None:
    assert tuple(sorted(rocksdb_tuning.COMPACTION_STYLES)) == COMPACTION_STYLES


def test_settings_round_trip_through_proto_coordinator_and_worker() -> None:
    p = Pipeline("tuned").state_backend("rocksdb", **TUNED)
    msg = wire.checkpoint_config_to_pb(p.checkpoint_config)
    assert msg.state_backend == "rocksdb"
    stored = wire.checkpoint_config_from_pb(msg)
    assert stored.state_backend_options == StateBackendOptions(**TUNED)
    # The coordinator's record persists them (JSON in Redis) and hands them to the agents.
    record = coordinator_model.JobRecord(
        job_id="a" * 32,
        graph=coordinator_model.JobGraph(name="g", vertices=(), edges=()),
        checkpoint_config=stored,
        state=coordinator_model.JobState.RUNNING,
        created_at_ms=1,
    )
    loaded = coordinator_model.JobRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert loaded.checkpoint_config == stored
    again = wire.checkpoint_config_from_pb(wire.checkpoint_config_to_pb(loaded.checkpoint_config))
    config = StateBackendConfig(kind=again.state_backend, options=again.state_backend_options)
    tuning = vars(config.tuning()) | {"cache_entries": config.cache_entries}
    assert {name: tuning[name] for name in TUNED} == TUNED
    assert config.kind == "rocksdb"
    # Unset fields keep the worker's defaults; heap carries none.
    plain_config = wire.checkpoint_config_from_pb(
        wire.checkpoint_config_to_pb(
            wire.checkpoint_config_from_pb(pb.CheckpointConfig(state_backend="rocksdb"))
        )
    )
    plain = StateBackendConfig(
        kind=plain_config.state_backend, options=plain_config.state_backend_options
    )
    assert plain == StateBackendConfig(kind="rocksdb")
    assert plain.tuning() == StateBackendConfig().tuning()
    assert (
        wire.checkpoint_config_to_pb(Pipeline("x").checkpoint_config).state_backend_options
        == pb.StateBackendOptions()
    )
    assert CheckpointConfig().state_backend_options == StateBackendOptions()


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("memory_budget_bytes", 10, f"[{limits.MIN_STATE_MEMORY_BUDGET_BYTES}, "),
        ("memory_budget_bytes", 1 << 50, "memory_budget_bytes"),
        ("cache_entries", -1, "cache_entries -1 is outside"),
        ("compaction_trigger", 1, "compaction_trigger 1 is outside [2, "),
        ("upload_threads", 0, "upload_threads 0 is outside [1, "),
        ("upload_threads", 10_000, f"[1, {limits.MAX_UPLOAD_THREADS}]"),
        ("max_size_amplification_percent", 0, "max_size_amplification_percent"),
        ("compaction_style", "fifo" * 100, "compaction_style"),
    ],
)
def test_the_coordinator_refuses_out_of_range_sizing(field: str, value: Any, needle: str) -> None:
    msg = pb.CheckpointConfig(state_backend="rocksdb")
    setattr(msg.state_backend_options, field, value)
    with pytest.raises(InvalidArgumentError) as e:
        wire.checkpoint_config_from_pb(msg)
    assert needle in str(e.value)
    assert len(str(e.value)) < 300


def test_the_pipeline_refuses_unknown_or_bad_settings() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown setting.*budget"):
        Pipeline("x").state_backend("rocksdb", budget=1)
    with pytest.raises(InvalidArgumentError, match="compaction_style 'fifo'"):
        Pipeline("x").state_backend("rocksdb", compaction_style="fifo")


class _RecordingCount(KeyedCount):
    """KeyedCount that writes the sizing of the backend it was given to ``report_dir``."""

    def __init__(self, key_field: str, report_dir: str) -> None:
        super().__init__(key_field)
        self.report_dir = report_dir

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        backend = self._backend
        assert isinstance(backend, RocksDBKeyedStateBackend)
        seen = dict(vars(backend.tuning), cache_entries=backend._cache_entries)
        Path(self.report_dir, f"{id(self)}.json").write_text(json.dumps(seen))


def test_a_running_job_opens_its_backends_with_the_configured_sizing(
    redis_url: str, tmp_path: Path
) -> None:
    out, reports = tmp_path / "out", tmp_path / "reports"
    reports.mkdir()
    source = GeneratorSource(total_records=20_000, rate_per_s=40_000, num_keys=500, seed=3)
    p = Pipeline("tuned").checkpointing(interval_ms=100).state_backend("rocksdb", **TUNED)
    config = wire.checkpoint_config_to_pb(p.checkpoint_config)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(
                source, _RecordingCount("key", str(reports)), TransactionalFileSink(str(out))
            )
            job_id = await run_job(c, graph, config, source_batch_records=2048)
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            assert info.checkpoint_config.state_backend_options.upload_threads == 2

    asyncio.run(main())
    seen = [json.loads(f.read_text()) for f in reports.iterdir()]
    assert len(seen) == 2  # both keyed subtasks
    for s in seen:
        assert {k: s[k] for k in TUNED} == TUNED
    check_exactly_once(read_committed(out), expected_counts(source, 2))

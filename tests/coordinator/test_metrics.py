"""The coordinator's Prometheus metrics (``coordinator/metrics.py``), scraped from the real
``/metrics`` endpoint of a real coordinator: names, units, label sets, separate registries,
the per-job series that come and go with the jobs, the process collector."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import prometheus_client
import pytest
from kit.coordinator import running_coordinator

from snapflow.coordinator.dashboard import start_http_server
from snapflow.coordinator.metrics import CoordinatorMetrics, JobMetricsCollector, JobSample
from snapflow.coordinator.model import AbortReason, AckResult, JobState, TriggerRefusal
from snapflow.coordinator.server import PortInUseError


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        body: bytes = resp.read()
    return body.decode()


def test_metrics_endpoint_serves_snapflow_metrics_and_stops(redis_url: str, tmp_path: Path) -> None:
    async def main() -> int:
        async with running_coordinator(redis_url, str(tmp_path / "cp"), metrics_port=0) as c:
            assert c.coordinator.manager is not None
            metrics = c.coordinator.manager.metrics
            metrics.record_triggered()
            metrics.record_completed(duration_s=0.2, size_bytes=5000)
            metrics.record_failed(AbortReason.EXPIRED)
            metrics.record_ack(AckResult.SUCCESS)
            metrics.record_refusal(TriggerRefusal.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
            metrics.record_task_failure()
            metrics.set_job_counts({JobState.RUNNING: 2})
            metrics.set_in_progress(1)
            port = c.coordinator.metrics_port
            assert port > 0
            text = await asyncio.to_thread(scrape, port)
            for expected in [
                "snapflow_checkpoints_triggered_total 1.0",
                "snapflow_checkpoints_completed_total 1.0",
                'snapflow_checkpoints_failed_total{reason="expired"} 1.0',
                'snapflow_checkpoints_failed_total{reason="declined"} 0.0',
                'snapflow_checkpoint_acks_total{result="success"} 1.0',
                'snapflow_trigger_refusals_total{reason="minimum_time_between_checkpoints"} 1.0',
                "snapflow_task_failures_total 1.0",
                'snapflow_jobs{state="running"} 2.0',
                'snapflow_jobs{state="failed"} 0.0',
                "snapflow_checkpoints_in_progress 1.0",
                "snapflow_last_checkpoint_duration_seconds 0.2",
                "snapflow_last_checkpoint_size_bytes 5000.0",
                'snapflow_checkpoint_duration_seconds_bucket{le="0.005"} 0.0',
                'snapflow_checkpoint_duration_seconds_bucket{le="0.25"} 1.0',
                'snapflow_checkpoint_duration_seconds_bucket{le="600.0"} 1.0',
                "snapflow_checkpoint_duration_seconds_count 1.0",
                "snapflow_checkpoint_size_bytes_count 1.0",
                # The coordinator process (prometheus_client's process collector).
                "# TYPE process_cpu_seconds_total counter",
                "# TYPE process_resident_memory_bytes gauge",
                "# TYPE process_open_fds gauge",
                "# TYPE python_info gauge",
                # No job yet: the per-job families exist, without series.
                "# TYPE snapflow_job_uptime_seconds gauge",
            ]:
                assert expected in text, expected
            assert "snapflow_job_uptime_seconds{" not in text
            with pytest.raises(ValueError, match="disabled"):
                await start_http_server(metrics, c.coordinator.manager, "127.0.0.1", -1)
            return port

    port = asyncio.run(main())
    with pytest.raises(urllib.error.URLError):  # stopped with the coordinator
        scrape(port)


def test_registries_are_separate_and_only_job_metrics_have_a_job_label() -> None:
    a, b = CoordinatorMetrics(), CoordinatorMetrics()
    a.record_triggered()
    assert a.registry.get_sample_value("snapflow_checkpoints_triggered_total") == 1.0
    assert b.registry.get_sample_value("snapflow_checkpoints_triggered_total") == 0.0
    global_names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert "snapflow_checkpoints_triggered" not in global_names

    a.collect_jobs(lambda: [JobSample("j1", 4, 0.5, 1024, -1, 2, 30.0)])
    with pytest.raises(RuntimeError, match="already"):
        a.collect_jobs(list)
    names = set()
    for family in a.registry.collect():
        names.add(family.name)
        for sample in family.samples:
            assert "checkpoint_id" not in sample.labels, sample
            if family.name.startswith("snapflow_job_"):
                assert set(sample.labels) == {"job_id"}, sample
            else:
                assert "job_id" not in sample.labels, sample
    snapflow = {n for n in names if n.startswith("snapflow_")}
    assert len(snapflow) == 12 + 6
    assert names - snapflow <= {n for n in names if n.startswith(("process_", "python_"))}
    assert a.registry.get_sample_value("snapflow_job_restarts_total", {"job_id": "j1"}) == 2.0
    assert a.registry.get_sample_value("snapflow_job_uptime_seconds", {"job_id": "j1"}) == 30.0


def test_job_series_come_and_go_with_the_jobs() -> None:
    jobs: list[JobSample] = []
    metrics = CoordinatorMetrics()
    metrics.collect_jobs(lambda: list(jobs))
    assert isinstance(metrics.job_collector, JobMetricsCollector)

    def series() -> set[str]:
        return {
            s.labels["job_id"]
            for f in metrics.registry.collect()
            if f.name.startswith("snapflow_job_")
            for s in f.samples
        }

    assert series() == set()
    jobs.append(JobSample("a" * 32, -1, -1, -1, -1, 0, 0))
    jobs.append(JobSample("b" * 32, 7, 1.5, 2048, 1.7e9, 3, -1))
    assert series() == {"a" * 32, "b" * 32}
    value = metrics.registry.get_sample_value
    assert value("snapflow_job_last_completed_checkpoint_id", {"job_id": "b" * 32}) == 7
    assert (
        value("snapflow_job_last_checkpoint_restore_timestamp_seconds", {"job_id": "b" * 32})
        == 1.7e9
    )
    assert value("snapflow_job_last_checkpoint_size_bytes", {"job_id": "a" * 32}) == -1
    del jobs[0]  # a removed job's series are gone at the next scrape
    assert series() == {"b" * 32}


def test_a_busy_metrics_port_fails_the_start_before_the_epoch(
    redis_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "a"), metrics_port=0) as a:
            assert a.coordinator.manager is not None
            epoch = a.coordinator.manager.epoch
            with pytest.raises(PortInUseError, match="metrics port"):
                async with running_coordinator(
                    redis_url, str(tmp_path / "b"), metrics_port=a.coordinator.metrics_port
                ):
                    pass
            assert not a.coordinator.manager.fenced
            assert a.coordinator.manager.epoch == epoch
            assert "snapflow_" in await asyncio.to_thread(scrape, a.coordinator.metrics_port)

    asyncio.run(main())

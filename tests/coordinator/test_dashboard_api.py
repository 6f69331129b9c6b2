"""The dashboard's JSON API and the per-job metrics, over real HTTP against a real coordinator
(the session's Redis, simulated agents over real gRPC): the same data as the gRPC views, the
retention marker, the exception history, and the per-job series through a failover."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from kit.coordinator import Running, running_coordinator, submit
from kit.simulated_agent import SimulatedAgent

from snapflow.coordinator.dashboard_views import to_json
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

T = 10  # seconds: deadline of every call


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=T)) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


async def _scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample of the exposition."""
    async with session.get(f"{base}/metrics", timeout=aiohttp.ClientTimeout(total=T)) as response:
        assert response.status == 200
        text = await response.text()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


async def _agents(c: Running, job_id: str) -> list[SimulatedAgent]:
    agents = [SimulatedAgent(c.address, job_id, [("src", i), ("map", i)]) for i in range(2)]
    for agent in agents:
        await agent.start()
        await agent.register_all()
    return agents


async def _report_metrics(c: Running, agent: SimulatedAgent) -> dict[tuple[str, int], Any]:
    """A heartbeat of ``agent`` with metrics for its tasks; returns them as the API shows them
    (keyed by vertex and subtask). Bad reports refuse the heartbeat; reports of attempts that
    are not current are ignored."""
    metrics = {
        ("src", 0): cpb.TaskMetrics(
            busy_ms_per_second=120.5,
            backpressured_ms_per_second=610.0,
            has_watermark=True,
            watermark_ms=1_700_000_000_000,
            period_ms=2000,
        ),
        ("map", 0): cpb.TaskMetrics(busy_ms_per_second=980.0, period_ms=2000),
    }
    stale = pb.TaskAttempt(vertex_id="map", subtask_index=0, attempt=99)
    reports = [
        cpb.TaskMetricsReport(attempt=agent.attempts[key], metrics=m) for key, m in metrics.items()
    ]
    request = cpb.HeartbeatRequest(
        job_id=agent.job_id,
        address=agent.address,
        tasks=list(agent.attempts.values()),
        task_metrics=reports,
    )
    response = await c.stub.Heartbeat(request, timeout=T)
    assert response.tasks_current
    # A report of an attempt the heartbeat does not name (an old one): ignored, the rest is
    # not (the API below shows map#0's first report, not this one).
    ignored = cpb.HeartbeatRequest()
    ignored.CopyFrom(request)
    ignored.task_metrics[1].attempt.CopyFrom(stale)
    ignored.task_metrics[1].metrics.busy_ms_per_second = 1.0
    assert (await c.stub.Heartbeat(ignored, timeout=T)).tasks_current
    request.task_metrics[0].metrics.busy_ms_per_second = -5.0
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await c.stub.Heartbeat(request, timeout=T)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "task_metrics[0].metrics.busy_ms_per_second must be" in (refused.value.details() or "")
    return {key: to_json(m) for key, m in metrics.items()}


async def _trigger(c: Running, job_id: str) -> int:
    summary = await c.stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T)
    return int(summary.checkpoint_id)


def test_api_shows_the_grpc_views_with_retention_markers_and_bad_input_errors(
    redis_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with (
            running_coordinator(redis_url, str(tmp_path / "cp"), metrics_port=0) as c,
            aiohttp.ClientSession() as http,
        ):
            base = f"http://127.0.0.1:{c.coordinator.metrics_port}"
            job_id = await submit(c.stub, retained=1)
            agents = await _agents(c, job_id)
            try:
                assert [await _trigger(c, job_id) for _ in range(3)] == [1, 2, 3]

                status, jobs = await _get(http, f"{base}/api/jobs")
                assert status == 200
                listed = await c.stub.ListJobs(cpb.ListJobsRequest(), timeout=T)
                assert jobs["jobs"] == [to_json(j) for j in listed.jobs]
                assert jobs["jobs"][0]["state"] == "JOB_STATE_RUNNING"
                assert jobs["jobs"][0]["latest_completed_checkpoint_id"] == 3  # a number

                # Agent 0's tasks report their metrics with a heartbeat; agent 1's none yet.
                reported = await _report_metrics(c, agents[0])

                status, job = await _get(http, f"{base}/api/jobs/{job_id}")
                assert status == 200
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
                tasks = await c.stub.ListTasks(cpb.ListTasksRequest(job_id=job_id), timeout=T)
                assert job["job"] == to_json(info)
                assert job["tasks"] == [to_json(t) for t in tasks.tasks]
                by_task = {
                    (t["attempt"]["vertex_id"], t["attempt"]["subtask_index"]): t
                    for t in job["tasks"]
                }
                for key, task in by_task.items():
                    if key in reported:
                        assert task["metrics"] == reported[key], key
                        assert task["metrics_timestamp_ms"] > 0
                    else:
                        assert "metrics" not in task, key  # none reported yet: left out
                        assert task["metrics_timestamp_ms"] == 0
                assert by_task[("src", 0)]["metrics"]["watermark_ms"] == 1_700_000_000_000
                assert by_task[("map", 0)]["metrics"]["has_watermark"] is False
                assert job["uptime_ms"] > 0
                assert job["exceptions"] == {"entries": [], "truncated": False}

                status, checkpoints = await _get(http, f"{base}/api/jobs/{job_id}/checkpoints")
                assert status == 200
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=T
                )
                assert checkpoints["stats"] == to_json(stats)
                history = checkpoints["stats"]["history"]
                # Retention keeps one checkpoint: 1 and 2 are discarded, 3 is not.
                assert [(r["checkpoint_id"], r["status"], r["discarded"]) for r in history] == [
                    (3, "CHECKPOINT_STATUS_COMPLETED", False),
                    (2, "CHECKPOINT_STATUS_COMPLETED", True),
                    (1, "CHECKPOINT_STATUS_COMPLETED", True),
                ]
                assert checkpoints["retained_ids"] == [3]
                assert checkpoints["config"] == to_json(info.checkpoint_config)
                assert checkpoints["config"]["retained"] == 1
                assert checkpoints["stats"]["end_to_end_duration_ms"]["max"] >= 0
                assert checkpoints["stats"]["state_size_bytes"]["p50"] == 4 * 64
                assert all(r["max_alignment_duration_ms"] == 0 for r in history)  # none reported

                status, details = await _get(http, f"{base}/api/jobs/{job_id}/checkpoints/1")
                assert status == 200
                assert details["summary"]["discarded"] is True
                assert len(details["subtasks"]) == 4
                assert all(s["acknowledged"] for s in details["subtasks"])
                assert {s["metrics"]["state_size_bytes"] for s in details["subtasks"]} == {64}

                for path, code, message in [
                    (f"/api/jobs/{job_id}/checkpoints/99", 404, "checkpoint 99"),
                    (f"/api/jobs/{job_id}/checkpoints/0", 400, "checkpoint_id must be >= 1"),
                    (f"/api/jobs/{job_id}/checkpoints/abc", 400, "not a positive integer"),
                    (f"/api/jobs/{job_id}/checkpoints/{'9' * 5000}", 400, "positive integer"),
                    ("/api/jobs/not-a-job", 400, "malformed"),
                    (f"/api/jobs/{'a' * 32}", 404, "does not exist"),
                    ("/api/unknown", 404, "no such API path"),
                ]:
                    status, body = await _get(http, base + path)
                    assert status == code, (path, status, body)
                    assert message in body["error"], (path, body)
                    assert len(body["error"]) <= 500, path
            finally:
                for agent in agents:
                    await agent.stop()

    asyncio.run(main())


def test_per_job_metrics_through_a_failover_and_the_end(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running_coordinator(redis_url, str(tmp_path / "cp"), metrics_port=0) as c,
            aiohttp.ClientSession() as http,
        ):
            base = f"http://127.0.0.1:{c.coordinator.metrics_port}"
            job_id = await submit(c.stub, retained=2)
            other = await submit(c.stub)  # never runs: its series say "none yet"
            agents = await _agents(c, job_id)
            try:
                await _trigger(c, job_id)
                await _trigger(c, job_id)
                m = await _scrape(http, base)
                label = f'{{job_id="{job_id}"}}'
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=T
                )
                latest = stats.latest_completed
                assert m[f"snapflow_job_last_completed_checkpoint_id{label}"] == 2
                assert m[f"snapflow_job_last_checkpoint_duration_seconds{label}"] == (
                    latest.end_to_end_duration_ms / 1000
                )
                assert m[f"snapflow_job_last_checkpoint_size_bytes{label}"] == 4 * 64
                assert m[f"snapflow_job_last_checkpoint_restore_timestamp_seconds{label}"] == -1
                assert m[f"snapflow_job_restarts_total{label}"] == 0
                assert m[f"snapflow_job_uptime_seconds{label}"] > 0
                idle = f'{{job_id="{other}"}}'
                assert m[f"snapflow_job_last_completed_checkpoint_id{idle}"] == -1
                assert m[f"snapflow_job_uptime_seconds{idle}"] == 0
                # One series per job, never a checkpoint id label; the process collector is on.
                job_series = [k for k in m if k.startswith("snapflow_job_")]
                assert len(job_series) == 2 * 6
                assert not [k for k in m if "checkpoint_id=" in k]
                assert m["process_cpu_seconds_total"] > 0
                assert m["process_resident_memory_bytes"] > 0
                assert any(k.startswith("python_info{") for k in m)

                # A task fails: the job restarts, the exception is kept, uptime drops to 0.
                await agents[0].set_state(pb.TASK_STATE_FAILED, "ValueError: boom", only=("src", 0))
                status, job = await _get(http, f"{base}/api/jobs/{job_id}")
                assert status == 200 and job["job"]["state"] == "JOB_STATE_RESTARTING"
                [entry] = job["exceptions"]["entries"]
                assert entry["message"] == "ValueError: boom"
                assert entry["task"] == {"vertex_id": "src", "subtask_index": 0, "attempt": 1}
                m = await _scrape(http, base)
                assert m[f"snapflow_job_uptime_seconds{label}"] == 0

                # The tasks come back (deployment 2) and restore from checkpoint 2.
                for agent in agents:
                    await agent.register_all()
                m = await _scrape(http, base)
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=T
                )
                assert stats.latest_restore.checkpoint_id == 2
                assert m[f"snapflow_job_last_checkpoint_restore_timestamp_seconds{label}"] == (
                    stats.latest_restore.restore_timestamp_ms / 1000
                )
                assert m[f"snapflow_job_restarts_total{label}"] == 1
                assert m[f"snapflow_job_uptime_seconds{label}"] >= 0

                await c.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)
                m = await _scrape(http, base)
                assert m[f"snapflow_job_uptime_seconds{label}"] == -1
                assert m[f"snapflow_job_last_completed_checkpoint_id{label}"] == 2
            finally:
                for agent in agents:
                    await agent.stop()

    asyncio.run(main())


def test_the_page_and_its_files_are_served(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            running_coordinator(redis_url, str(tmp_path / "cp"), metrics_port=0) as c,
            aiohttp.ClientSession() as http,
        ):
            base = f"http://127.0.0.1:{c.coordinator.metrics_port}"
            async with http.get(base + "/") as response:
                assert response.status == 200
                assert response.content_type == "text/html"
                page = await response.text()
                assert "default-src 'none'" in response.headers["Content-Security-Policy"]
            for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', page):
                async with http.get(base + asset) as response:
                    assert response.status == 200, asset
                    assert len(await response.read()) > 500, asset
            async with http.get(base + "/static/../dashboard.py") as response:
                assert response.status in (403, 404)

    asyncio.run(main())

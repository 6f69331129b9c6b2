"""The coordinator over real gRPC, with the session's real Redis and simulated worker agents."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest
import redis
from kit.coordinator import running_coordinator, submit
from kit.polling import wait_until_async
from kit.simulated_agent import SimulatedAgent

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb


async def _agents(address: str, job_id: str, n: int = 2) -> list[SimulatedAgent]:
    agents = [SimulatedAgent(address, job_id, [("src", i), ("map", i)]) for i in range(n)]
    for agent in agents:
        await agent.start()
    return agents


def test_manual_checkpoint_completes_end_to_end(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job_id = await submit(c.stub)
            agents = await _agents(c.address, job_id)
            for a in agents:
                await a.register_all()
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_RUNNING
            assert (info.total_tasks, info.running_tasks) == (4, 4)
            summary = await c.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
            )
            assert summary.checkpoint_id == 1
            assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            assert summary.num_acknowledged == summary.num_tasks == 4
            assert summary.state_size_bytes == 4 * 64
            assert os.path.exists(os.path.join(summary.external_path, "_metadata"))
            assert summary.external_path == str(tmp_path / "cp" / job_id / "chk-1")
            # triggers went to the agents hosting sources; notifications to all tasks
            await wait_until_async(
                lambda: all(a.completed == [1] for a in agents), "checkpoint 1 notified"
            )
            assert all(a.triggered == [1] for a in agents)
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            assert (stats.counts.triggered, stats.counts.completed, stats.counts.failed) == (
                1,
                1,
                0,
            )
            assert stats.latest_completed.checkpoint_id == 1
            assert stats.state_size_bytes.max == 256
            details = await c.stub.GetCheckpointDetails(
                cpb.GetCheckpointDetailsRequest(job_id=job_id, checkpoint_id=1), timeout=5
            )
            assert len(details.subtasks) == 4
            assert all(s.acknowledged and s.metrics.sync_duration_ms == 1 for s in details.subtasks)
            for a in agents:
                await a.stop()
        r = redis.Redis.from_url(redis_url)
        assert r.zrange(f"snapflow:job:{job_id}:completed", 0, -1) == [b"1"]
        assert r.hlen(f"snapflow:job:{job_id}:pending") == 0
        r.close()

    asyncio.run(main())


def test_periodic_checkpoints_and_retention(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job_id = await submit(c.stub, interval_ms=50, retained=2)
            agents = await _agents(c.address, job_id)
            for a in agents:
                await a.register_all()
            await wait_until_async(lambda: len(agents[0].completed) >= 4, "4 checkpoints completed")
            for a in agents:
                await a.stop()
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            latest = stats.latest_completed.checkpoint_id
            assert latest >= 4

            # only the retained completed checkpoints (plus at most one in progress) are on disk
            kept = {f"chk-{i}" for i in range(1, latest + 3)}

            def retained() -> set[str] | None:
                dirs = {
                    p.name
                    for p in (tmp_path / "cp" / job_id).iterdir()
                    if p.name.startswith("chk-")
                }
                return dirs if dirs <= kept and f"chk-{latest - 2}" not in dirs else None

            # subsumed checkpoints are deleted after the completion: wait for that clean-up
            dirs = await wait_until_async(retained, f"chk-{latest - 2} deleted by retention")
            assert dirs is not None  # for the type checker: wait_until_async returns a truthy value
            assert set(dirs) <= kept
            assert f"chk-{latest}" in dirs and f"chk-{latest - 1}" in dirs
            assert f"chk-{latest - 2}" not in dirs

    asyncio.run(main())


def test_task_failure_aborts_pending_reports_to_watchers_and_restores(
    redis_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job_id = await submit(c.stub, tolerable_failures=0)
            agents = await _agents(c.address, job_id)
            for a in agents:
                await a.register_all()
            first = await c.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
            )
            # the next checkpoint hangs: one task never acknowledges
            agents[1].policy = lambda task, cid: "ignore" if task.vertex_id == "map" else "ack"
            events: list[cpb.JobEvent] = []
            watch = c.stub.WatchJob(cpb.WatchJobRequest(job_id=job_id))

            async def collect() -> None:
                async for event in watch:
                    events.append(event)

            collector = asyncio.create_task(collect())

            async def trigger_checkpoint() -> cpb.CheckpointSummary:
                return await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )

            trigger = asyncio.create_task(trigger_checkpoint())
            await wait_until_async(lambda: 2 in agents[0].triggered, "checkpoint 2 triggered")
            await agents[1].set_state(pb.TASK_STATE_FAILED, "boom", only=("map", 1))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await trigger
            assert err.value.code() == grpc.StatusCode.ABORTED
            assert "TASK_FAILURE" in (err.value.details() or "")
            await wait_until_async(
                lambda: any(e.HasField("task_failed") for e in events), "a task_failed event"
            )
            failed = next(e for e in events if e.HasField("task_failed"))
            assert (
                failed.task_failed.attempt.vertex_id == "map"
                and failed.task_failed.message == "boom"
            )
            await wait_until_async(
                lambda: any(e.HasField("checkpoint_failed") for e in events),
                "a checkpoint_failed event",
            )
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_RESTARTING
            # the failure does not count against tolerable checkpoint failures: the job redeploys
            agents[1].policy = lambda task, cid: "ack"
            for a in agents:
                await a.register_all()
            assert all(att.attempt == 2 for a in agents for att in a.attempts.values())
            restore = agents[0].restores[("map", 0)]
            assert restore.checkpoint_id == first.checkpoint_id
            assert sorted(v.subtask_index for v in restore.vertex_state) == [0, 1]
            assert restore.previous_parallelism == 2
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert (info.state, info.restarts) == (pb.JOB_STATE_RUNNING, 1)
            third = await c.stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
            )
            assert third.checkpoint_id == 3
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
            )
            assert stats.counts.restored == 1 and stats.latest_restore.checkpoint_id == 1
            assert stats.latest_failed.failure_reason == "TASK_FAILURE"
            watch.cancel()
            collector.cancel()
            for a in agents:
                await a.stop()

    asyncio.run(main())

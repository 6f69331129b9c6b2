"""Coordinator restarts, fencing, savepoints and restore, over real gRPC and Redis."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import grpc
import pytest
import redis
from kit.coordinator import running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import fresh_namespace
from kit.polling import holds_for_async, wait_until_async
from kit.simulated_agent import SimulatedAgent

from snapflow.coordinator.model import CheckpointKind, PendingCheckpointRecord
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb


async def _start_agents(
    address: str, job_id: str, n: int = 2, maps: int | None = None
) -> list[SimulatedAgent]:
    maps = n if maps is None else maps
    agents = []
    for i in range(n):
        tasks = [("src", i)] + [("map", m) for m in range(maps) if m % n == i]
        agent = SimulatedAgent(address, job_id, tasks)
        await agent.start()
        agents.append(agent)
    return agents


async def _stop_all(agents: list[SimulatedAgent]) -> None:
    for agent in agents:
        await agent.stop()


def test_restart_recovers_jobs_aborts_pending_and_continues_ids(
    redis_url: str, tmp_path: Path
) -> None:
    root = str(tmp_path / "cp")

    async def main() -> None:
        async with running_coordinator(redis_url, root) as first:
            job_id = await submit(first.stub)
            agents = await _start_agents(first.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                for _ in range(2):
                    await first.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                    )
                # checkpoint 3 stays pending: one agent never acknowledges
                agents[1].policy = lambda task, cid: "ignore"

                async def hang() -> None:
                    with pytest.raises(grpc.aio.AioRpcError):
                        await first.stub.TriggerCheckpoint(
                            cpb.TriggerCheckpointRequest(job_id=job_id), timeout=0.5
                        )

                await hang()
                r = redis.Redis.from_url(redis_url)
                assert r.hkeys(f"snapflow:job:{job_id}:pending") == [b"3"]
                r.close()
                assert os.path.isdir(os.path.join(root, job_id, "chk-3"))
            finally:
                await _stop_all(agents)
        # A graceful stop aborted checkpoint 3. A crash would leave its record and files behind:
        # put back what a killed coordinator leaves, and check the next incarnation cleans it.
        record = PendingCheckpointRecord(
            job_id, 3, CheckpointKind.CHECKPOINT, 0, os.path.join(root, job_id, "chk-3")
        )
        r = redis.Redis.from_url(redis_url)
        r.hset(f"snapflow:job:{job_id}:pending", "3", json.dumps(record.to_dict()))
        r.close()
        os.makedirs(os.path.join(root, job_id, "chk-3"), exist_ok=True)
        Path(root, job_id, "chk-3", "map-1.state").write_bytes(b"half-written")
        async with running_coordinator(redis_url, root) as second:
            assert second.coordinator.manager is not None and second.coordinator.manager.epoch == 2
            info = await second.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_RESTARTING
            assert info.latest_completed_checkpoint_id == 2
            r = redis.Redis.from_url(redis_url)
            assert r.hlen(f"snapflow:job:{job_id}:pending") == 0
            r.close()
            assert not os.path.exists(os.path.join(root, job_id, "chk-3")), (
                "orphaned state of the pending checkpoint"
            )
            assert os.path.exists(os.path.join(root, job_id, "chk-2", "_metadata"))
            agents = await _start_agents(second.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                assert {att.attempt for a in agents for att in a.attempts.values()} == {2}
                assert agents[0].restores[("src", 0)].checkpoint_id == 2
                summary = await second.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                assert summary.checkpoint_id == 4, "ids continue above everything handed out before"
            finally:
                await _stop_all(agents)

    asyncio.run(main())


def test_old_incarnation_is_fenced_and_workers_see_newer_epoch(
    redis_url: str, tmp_path: Path
) -> None:
    root = str(tmp_path / "cp")

    async def main() -> None:
        async with running_coordinator(redis_url, root) as old:
            job_id = await submit(old.stub)
            async with running_coordinator(redis_url, root) as new:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await old.stub.SubmitJob(
                        cpb.SubmitJobRequest(graph=two_vertex_graph()), timeout=5
                    )
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "epoch" in (err.value.details() or "")
                # the old one now refuses everything that mutates, without touching Redis
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await old.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=5)
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                info = await new.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.state == pb.JOB_STATE_CREATED
                agents = await _start_agents(new.address, job_id)
                try:
                    for a in agents:
                        await a.register_all()
                    assert agents[0].epoch == 2
                    done = await new.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                    )
                    assert done.checkpoint_id == 1
                finally:
                    await _stop_all(agents)

    asyncio.run(main())


def test_savepoint_stop_with_savepoint_and_restore_with_new_parallelism(
    redis_url: str, tmp_path: Path
) -> None:
    root = str(tmp_path / "cp")
    target = str(tmp_path / "savepoints")

    async def main() -> None:
        async with running_coordinator(redis_url, root) as c:
            job_id = await submit(c.stub, interval_ms=0)
            agents = await _start_agents(c.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                sp = await c.stub.TriggerSavepoint(
                    cpb.TriggerSavepointRequest(job_id=job_id, target_directory=target), timeout=10
                )
                assert sp.kind == pb.CHECKPOINT_KIND_SAVEPOINT
                assert sp.external_path.startswith(target + "/savepoint-" + job_id[:6])
                # an intermediate savepoint does not notify tasks (no side-effect commits)
                await holds_for_async(
                    lambda: all(a.completed == [1] for a in agents),
                    "no task notified of the savepoint",
                    0.1,
                )
                cp = await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                assert cp.checkpoint_id == 3
                # a savepoint survives retention (retained=1) and subsumption
                assert os.path.exists(os.path.join(sp.external_path, "_metadata"))
                await wait_until_async(
                    lambda: not os.path.exists(os.path.join(root, job_id, "chk-1")),
                    "chk-1 deleted",
                )
                stop = await c.stub.StopWithSavepoint(
                    cpb.StopWithSavepointRequest(job_id=job_id, target_directory=target), timeout=10
                )
                assert stop.kind == pb.CHECKPOINT_KIND_SAVEPOINT_SUSPEND
                await wait_until_async(
                    lambda: all(4 in a.completed for a in agents), "checkpoint 4 notified"
                )
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=5
                    )
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                for a in agents:
                    await a.set_state(pb.TASK_STATE_FINISHED)
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.state == pb.JOB_STATE_FINISHED
            finally:
                await _stop_all(agents)

            # a new job restores from the stop savepoint with a different parallelism (moved dir too)
            moved = str(tmp_path / "moved-savepoint")
            os.rename(stop.external_path, moved)
            response = await c.stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=two_vertex_graph(sources=2, maps=3),
                    restore=cpb.RestoreSettings(savepoint_path=moved),
                ),
                timeout=10,
            )
            new_job = response.job.job_id
            agents = await _start_agents(c.address, new_job, n=2, maps=3)
            try:
                for a in agents:
                    await a.register_all()
                restore = agents[1].restores[("map", 1)]
                assert restore.checkpoint_id == 4
                assert restore.previous_parallelism == 2
                assert sorted(v.subtask_index for v in restore.vertex_state) == [0, 1]
                paths = [
                    h.path for v in restore.vertex_state for o in v.operators for h in o.handles
                ]
                assert paths and all(p.startswith(moved + "/") and os.path.exists(p) for p in paths)
                first = await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=new_job), timeout=10
                )
                assert first.checkpoint_id == 5, "ids continue after the savepoint's id"
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=new_job), timeout=5
                )
                assert stats.latest_restore.is_savepoint and stats.latest_restore.checkpoint_id == 4
            finally:
                await _stop_all(agents)
            await c.stub.DisposeSavepoint(
                cpb.DisposeSavepointRequest(savepoint_path=sp.external_path), timeout=5
            )
            assert not os.path.exists(sp.external_path)

    asyncio.run(main())


def test_declines_fail_the_job_past_tolerable_failures(redis_url: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job_id = await submit(c.stub, tolerable_failures=1)
            agents = await _start_agents(c.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                agents[0].policy = lambda task, cid: "decline" if task.vertex_id == "map" else "ack"
                for expected_state in (pb.JOB_STATE_RUNNING, pb.JOB_STATE_FAILED):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await c.stub.TriggerCheckpoint(
                            cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                        )
                    assert err.value.code() == grpc.StatusCode.ABORTED
                    assert "DECLINED" in (err.value.details() or "")

                    async def in_state(state: int = expected_state) -> bool:
                        job = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                        return bool(job.state == state)

                    if expected_state == pb.JOB_STATE_RUNNING:  # below the threshold: it stays up
                        await holds_for_async(in_state, "the job still RUNNING", 0.05)
                    else:
                        await wait_until_async(in_state, f"job {pb.JobState.Name(expected_state)}")
                    info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                    assert info.state == expected_state
                assert "tolerable failure threshold" in info.failure
                await wait_until_async(
                    lambda: sum(a.canceled for a in agents) == 4, "all 4 tasks canceled"
                )
                stats = await c.stub.GetCheckpointStats(
                    cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5
                )
                assert stats.counts.failed == 2 and stats.latest_failed.failure_reason == "DECLINED"
            finally:
                await _stop_all(agents)

    asyncio.run(main())


def test_resubmission_restores_latest_including_stop_savepoint_or_a_chosen_checkpoint(
    redis_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job_id = await submit(c.stub, retained=3)
            agents = await _start_agents(c.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                for _ in range(2):
                    await c.stub.TriggerCheckpoint(
                        cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                    )
                stop = await c.stub.StopWithSavepoint(
                    cpb.StopWithSavepointRequest(
                        job_id=job_id, target_directory=str(tmp_path / "sp")
                    ),
                    timeout=10,
                )
                assert stop.checkpoint_id == 3
                for a in agents:
                    await a.set_state(pb.TASK_STATE_FINISHED)
                # restore.latest goes to the stop savepoint, whose completion committed side effects
                await c.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        job_id=job_id,
                        graph=two_vertex_graph(),
                        checkpoint_config=pb.CheckpointConfig(retained=3),
                        restore=cpb.RestoreSettings(latest=True),
                    ),
                    timeout=10,
                )
                for a in agents:
                    await a.register_all()
                assert agents[0].restores[("src", 0)].checkpoint_id == 3
                after = await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                assert after.checkpoint_id == 4
                info = await c.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=10)
                assert info.running_tasks == 0
                tasks = await c.stub.ListTasks(cpb.ListTasksRequest(job_id=job_id), timeout=10)
                assert {t.state for t in tasks.tasks} == {pb.TASK_STATE_CANCELED}
                # a chosen retained checkpoint, older than the latest one
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.stub.SubmitJob(
                        cpb.SubmitJobRequest(
                            job_id=job_id,
                            graph=two_vertex_graph(),
                            checkpoint_config=pb.CheckpointConfig(retained=3),
                            restore=cpb.RestoreSettings(checkpoint_id=99),
                        ),
                        timeout=10,
                    )
                assert err.value.code() == grpc.StatusCode.NOT_FOUND and "retained" in (
                    err.value.details() or ""
                )
                await c.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        job_id=job_id,
                        graph=two_vertex_graph(),
                        checkpoint_config=pb.CheckpointConfig(retained=3),
                        restore=cpb.RestoreSettings(checkpoint_id=2),
                    ),
                    timeout=10,
                )
                for a in agents:
                    await a.register_all()
                assert agents[1].restores[("src", 1)].checkpoint_id == 2
                newest = await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                assert newest.checkpoint_id == 5
                # once this run completed a checkpoint, failover restores from it, not from 2
                await agents[0].set_state(pb.TASK_STATE_FAILED, "boom", only=("src", 0))
                for a in agents:
                    await a.register_all()
                assert agents[0].restores[("src", 0)].checkpoint_id == 5
            finally:
                await _stop_all(agents)

    asyncio.run(main())


def test_a_job_keeps_its_storage_when_the_coordinator_storage_root_changes(
    redis_url: str, tmp_path: Path
) -> None:
    """A job submitted without ``storage_uri`` records the coordinator's ``storage_root``: a
    coordinator started later with another root restores it from the first root, and its
    next checkpoints go there too."""
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    namespace = fresh_namespace()

    async def main() -> None:
        async with running_coordinator(
            redis_url, str(first_root), redis_namespace=namespace
        ) as first:
            job_id = await submit(first.stub)
            info = await first.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.checkpoint_config.storage_uri == os.path.realpath(first_root)
            agents = await _start_agents(first.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                done = await first.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                assert done.checkpoint_id == 1
            finally:
                await _stop_all(agents)
        async with running_coordinator(
            redis_url, str(second_root), redis_namespace=namespace
        ) as second:
            info = await second.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.latest_completed_checkpoint_id == 1
            agents = await _start_agents(second.address, job_id)
            try:
                for a in agents:
                    await a.register_all()
                assert agents[0].restores[("src", 0)].checkpoint_id == 1
                done = await second.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=10
                )
                assert done.checkpoint_id == 2
            finally:
                await _stop_all(agents)
            assert (first_root / job_id / "chk-2" / "_metadata").is_file()
            assert not (second_root / job_id).exists()

    asyncio.run(main())

"""FINISHED means committed, on the coordinator's side: a job whose sink may hold uncommitted
output reaches FINISHED only after a final checkpoint (taken after every source's end of data)
or a stop-with-savepoint completed with all its tasks. Tasks that report FINISHED without one
(an agent that never asked for the final checkpoint) fail the job with a message saying so.

Over real gRPC against a real coordinator and Redis, with a simulated agent hosting the job's
two tasks (a source and a sink). The decision itself: ``JobExecution`` (exact sequences in
test_execution.py) and ``CheckpointCoordinator``'s ``EndCommitted`` (test_checkpoint_coordinator.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kit.coordinator import job_state, running_coordinator, source_to_sink_graph, submit
from kit.coordinator_env import fresh_namespace
from kit.polling import wait_until_async
from kit.simulated_agent import SimulatedAgent

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

pytestmark = pytest.mark.timeout(60)
T = 10.0

GRAPH = source_to_sink_graph("to-a-sink")
TASKS = [("src", 0), ("sink", 0)]


async def _end_job(redis_url: str, root: Path, input_ended: bool, checkpoint: str) -> cpb.JobInfo:
    """Run the job on one simulated agent, take ``checkpoint`` ("none", "ordinary", "final" or
    "stop"), then report every task FINISHED; the job as the coordinator has it then."""
    async with running_coordinator(redis_url, str(root), redis_namespace=fresh_namespace()) as c:
        job_id = await submit(c.stub, GRAPH, interval_ms=0)  # periodic checkpoints off
        agent = SimulatedAgent(c.address, job_id, TASKS, input_ended=input_ended)
        await agent.start()
        try:
            await agent.register_all()
            assert await job_state(c.stub, job_id) == pb.JOB_STATE_RUNNING
            if checkpoint == "stop":
                done = await c.stub.StopWithSavepoint(
                    cpb.StopWithSavepointRequest(job_id=job_id, target_directory=str(root / "sp")),
                    timeout=T,
                )
            elif checkpoint != "none":
                done = await c.stub.TriggerCheckpoint(
                    cpb.TriggerCheckpointRequest(job_id=job_id), timeout=T
                )
            if checkpoint != "none":
                await wait_until_async(
                    lambda: done.checkpoint_id in agent.completed,
                    "the tasks notified",
                    interval_s=0.05,
                )
            await agent.set_state(pb.TASK_STATE_FINISHED)
            info: cpb.JobInfo = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T)
            return info
        finally:
            await agent.stop()


@pytest.mark.parametrize("checkpoint", ["none", "ordinary"])
def test_tasks_finishing_without_a_final_checkpoint_fail_the_job(
    redis_url: str, tmp_path: Path, checkpoint: str
) -> None:
    """No checkpoint at all, or one taken before the sources ended: the sink's last output is
    uncommitted, so the job is FAILED (never FINISHED), with the reason."""
    info = asyncio.run(_end_job(redis_url, tmp_path, input_ended=False, checkpoint=checkpoint))
    assert info.state == pb.JOB_STATE_FAILED
    assert "no final checkpoint committed their output" in info.failure
    assert "vertices sink may hold output" in info.failure


@pytest.mark.parametrize(("input_ended", "checkpoint"), [(True, "final"), (False, "stop")])
def test_tasks_finishing_after_their_end_committed_finish_the_job(
    redis_url: str, tmp_path: Path, input_ended: bool, checkpoint: str
) -> None:
    info = asyncio.run(_end_job(redis_url, tmp_path, input_ended, checkpoint))
    assert (info.state, info.failure) == (pb.JOB_STATE_FINISHED, "")

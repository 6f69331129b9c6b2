"""No checkpoint waits behind the end of input: once every source reported the end of its data,
the coordinator triggers nothing until every task did, then the final checkpoint at once.

Over real gRPC against a real coordinator and Redis, with a simulated agent hosting a source
and a sink, so that the test decides when each task's data ends (a real sink would be firing
its last timers meanwhile: Nexmark's q4 and q9 spent 10 s there, with the final checkpoint's
barrier waiting behind them). The rule itself: exact sequences in test_checkpoint_coordinator.py.
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
INTERVAL_MS = 50
QUIET_S = 0.5  # ten periods: without the hold, ten triggers would come

GRAPH = source_to_sink_graph("source-to-sink")
TASKS = [("src", 0), ("sink", 0)]


async def _in_progress(stub: object, job_id: str) -> int:
    stats = await stub.GetCheckpointStats(  # type: ignore[attr-defined]
        cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=T
    )
    return int(stats.counts.in_progress)


def test_checkpoints_wait_for_every_task_to_end_its_data_then_the_final_one_runs_at_once(
    redis_url: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with running_coordinator(
            redis_url, str(tmp_path / "cp"), redis_namespace=fresh_namespace()
        ) as c:
            job_id = await submit(c.stub, GRAPH, interval_ms=INTERVAL_MS)
            agent = SimulatedAgent(c.address, job_id, TASKS)
            await agent.start()
            try:
                await agent.register_all()
                assert await job_state(c.stub, job_id) == pb.JOB_STATE_RUNNING
                await wait_until_async(
                    lambda: len(agent.completed) >= 2, "periodic checkpoints", interval_s=0.02
                )
                # The source ended: its acks say so from now on, and it reports its end of data.
                agent.input_ended = True
                await agent.set_state(pb.TASK_STATE_RUNNING, only=("src", 0), data_ended=True)
                tasks = await c.stub.ListTasks(cpb.ListTasksRequest(job_id=job_id), timeout=T)
                assert {t.attempt.vertex_id: t.data_ended for t in tasks.tasks} == {
                    "src": True,
                    "sink": False,
                }
                # A checkpoint triggered before the report may still be on its way: let it end.
                await agent.wait_idle()
                for _ in range(100):
                    if await _in_progress(c.stub, job_id) == 0:
                        break
                    await asyncio.sleep(0.02)
                triggered = list(agent.triggered)
                await asyncio.sleep(QUIET_S)
                assert agent.triggered == triggered, (
                    "a checkpoint was triggered while the sink was still ending its input"
                )
                # The sink ended too: the final checkpoint follows at once, and the job ends.
                await agent.set_state(pb.TASK_STATE_RUNNING, only=("sink", 0), data_ended=True)
                await wait_until_async(
                    lambda: (
                        len(agent.triggered) > len(triggered)
                        and agent.triggered[-1] in agent.completed
                    ),
                    "the final checkpoint",
                    interval_s=0.02,
                )
                await agent.set_state(pb.TASK_STATE_FINISHED)
                assert await job_state(c.stub, job_id) == pb.JOB_STATE_FINISHED
            finally:
                await agent.stop()

    asyncio.run(main())

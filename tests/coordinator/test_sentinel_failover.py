"""A Redis master failover under a running job: the coordinator reaches Redis through
Sentinel (``redis+sentinel://``), the master is SIGKILLed after a checkpoint completed, the
sentinels promote the replica, and the job keeps checkpointing on the new master and finishes
exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from kit.coordinator import running_coordinator
from kit.polling import wait_until_async
from kit.sentinel import sentinel_setup
from kit.workers import (
    check_exactly_once,
    count_graph,
    expected_counts,
    run_agents,
    submit_graph,
)

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource


def test_a_job_finishes_exactly_once_across_a_redis_master_failover(tmp_path: Path) -> None:
    out = tmp_path / "out"
    source = GeneratorSource(
        total_records=500_000, rate_per_s=60_000, num_keys=300, batch_size=2048, seed=3
    )
    with sentinel_setup() as setup:

        async def main() -> None:
            async with running_coordinator(setup.url, str(tmp_path / "cp")) as c:
                graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(out)))
                config = pb.CheckpointConfig(interval_ms=150, tolerable_failures=1000)
                job_id = await submit_graph(c.stub, graph, config)
                agents = asyncio.create_task(run_agents(c.address, job_id, timeout_s=120))

                async def latest() -> int:
                    try:
                        stats = await c.stub.GetCheckpointStats(
                            cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=2
                        )
                    except grpc.aio.AioRpcError:
                        return 0
                    return int(stats.latest_completed.checkpoint_id)

                try:
                    await wait_until_async(latest, "a checkpoint", timeout_s=60, interval_s=0.05)
                    before = await latest()
                    setup.master.kill()  # SIGKILL by PID, mid-job
                    killed = time.monotonic()

                    async def completed_on_new_master() -> bool:
                        return setup.master_port() == setup.replica.port and (
                            await latest() > before + 1
                        )

                    await wait_until_async(
                        completed_on_new_master,
                        "checkpoints completing on the promoted replica",
                        timeout_s=60,
                        interval_s=0.1,
                    )
                    print(
                        f"master killed -> checkpoints on the new master: "
                        f"{time.monotonic() - killed:.2f} s"
                    )
                    await agents
                finally:
                    agents.cancel()
                    await asyncio.gather(agents, return_exceptions=True)
                info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.state == pb.JOB_STATE_FINISHED

        asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))

"""A leader `snapflow coordinator` SIGKILLed under a running job: the standby takes over
within the lease TTL, the `snapflow worker` processes (given both addresses) register with it
by themselves, and the job finishes exactly once; no process is restarted by hand."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import redis
from grpc_health.v1 import health_pb2
from kit.ha import HA_SETTINGS, addresses, health, start_ha_coordinators, wait_for_leader
from kit.polling import wait_until_async
from kit.processes import Processes, child_env, start_worker
from kit.workers import check_exactly_once, count_graph, expected_counts, submit_graph

from snapflow.leader_channel import aio_leader_channel
from snapflow.redis_server import RedisServer
from snapflow.spark_bridge.coordinator_client import CoordinatorClient
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource


async def _latest_completed(stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str) -> int:
    """The id of the job's latest completed checkpoint (0: none, or no answer)."""
    try:
        stats = await stub.GetCheckpointStats(
            cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=2
        )
    except grpc.aio.AioRpcError:
        return 0
    return int(stats.latest_completed.checkpoint_id)


async def _state(stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str) -> int | None:
    try:
        return int((await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=2)).state)
    except grpc.aio.AioRpcError:
        return None


def test_standby_takes_over_a_running_job_after_the_leader_is_killed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    source = GeneratorSource(
        total_records=600_000, rate_per_s=60_000, num_keys=300, batch_size=2048, seed=5
    )
    namespace = f"failover-{uuid.uuid4().hex[:8]}"
    ttl_s = float(HA_SETTINGS["lease_ttl_s"])

    async def main() -> None:
        coordinators = start_ha_coordinators(redis_server.url, namespace, tmp_path / "cp", tmp_path)
        first, second = coordinators
        assert health(second.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        channel = aio_leader_channel(addresses(coordinators))
        stub = cgrpc.CoordinatorServiceStub(channel)
        try:
            with Processes() as procs:
                for c in coordinators:
                    procs.add(c.proc)
                graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(out)))
                config = pb.CheckpointConfig(interval_ms=150, tolerable_failures=5)
                job_id = await submit_graph(stub, graph, config)
                workers = [
                    procs.add(
                        start_worker(addresses(coordinators), job_id, s, 2, tmp_path / f"w{s}.log")
                    )
                    for s in range(2)
                ]

                async def running_with_checkpoint() -> bool:
                    return await _state(stub, job_id) == pb.JOB_STATE_RUNNING and (
                        await _latest_completed(stub, job_id) >= 1
                    )

                await wait_until_async(
                    running_with_checkpoint,
                    "running with a completed checkpoint",
                    timeout_s=60,
                    interval_s=0.05,
                    procs=workers,
                )
                first.kill()
                killed = time.monotonic()
                # ids only grow: one above every id the killed leader handed out is a checkpoint
                # of the new leader
                counter = f"{namespace}:job:{job_id}:checkpoint-id"
                with redis.Redis.from_url(redis_server.url) as client:
                    last_old_id = int(client.get(counter) or 0)
                leader, serving_at = await asyncio.to_thread(wait_for_leader, [second], ttl_s + 20)
                assert leader is second
                # within the lease TTL plus one renew interval plus the recovery
                assert serving_at - killed < ttl_s + 10, serving_at - killed

                async def checkpoint_under_new_leader() -> bool:
                    return await _latest_completed(stub, job_id) > last_old_id

                await wait_until_async(
                    checkpoint_under_new_leader,
                    "a checkpoint completed under the new leader",
                    timeout_s=60,
                    interval_s=0.05,
                    procs=workers,
                )
                takeover_s = time.monotonic() - killed
                print(
                    f"leader killed -> new leader serving {serving_at - killed:.2f} s, "
                    f"-> first checkpoint under it {takeover_s:.2f} s"
                )

                async def finished() -> bool:
                    return await _state(stub, job_id) == pb.JOB_STATE_FINISHED

                await wait_until_async(
                    finished, "the job finished", timeout_s=120, interval_s=0.1, procs=workers
                )
                codes = [await asyncio.to_thread(w.wait, 30) for w in workers]
                assert codes == [0, 0]  # the same two workers, never restarted
                info = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.restarts >= 1
                # the other clients, given both addresses (the first one dead), find the leader
                cli = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "snapflow.cli", "job", job_id, "--json",
                     "--address", addresses(coordinators)],
                    capture_output=True,
                    env=child_env(),
                    timeout=60,
                )  # fmt: skip
                assert cli.returncode == 0, cli.stderr.decode()[-2000:]
                assert '"JOB_STATE_FINISHED"' in cli.stdout.decode()
                driver = CoordinatorClient(addresses(coordinators))
                try:
                    assert driver.job(job_id).state == pb.JOB_STATE_FINISHED
                finally:
                    driver.close()
            logs = "".join((tmp_path / f"w{s}.log").read_text() for s in range(2))
            assert "agent.reregistering" in logs
            events = [e["event"] for e in second.events()]
            assert "coordinator.leader_elected" in events and "job.recovered" in events
        finally:
            await channel.close()
            for c in coordinators:
                c.kill()

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))

"""Highly available coordinators on a real Redis (coordinator/leader_election.py, the lease
scripts of coordinator/redis_store.py, snapflow/leader_channel.py), in this process:

* a standby answers health NOT_SERVING and coordinator RPCs UNAVAILABLE naming the leader;
  a leader channel given several addresses finds the leader; a graceful stop hands over at
  the standby's next attempt, with a newer epoch and the jobs recovered;
* a leader whose renewals stall (Redis pauses writes) steps down while its lease still lives
  in Redis, and leads again with a new epoch once Redis answers;
* a stale leader that lost its lease cannot renew it, write with its epoch, or take the lease
  back; a coordinator without the election cannot take an epoch while the lease is held.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2
from kit.coordinator import running_coordinator, submit, two_vertex_graph
from kit.coordinator_env import health_status
from kit.polling import wait_until_async
from kit.processes import free_port

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator import convert
from snapflow.coordinator.config import load_settings
from snapflow.coordinator.model import JobRecord, JobState
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.errors import ConfigError, FailedPreconditionError, StaleEpochError
from snapflow.leader_channel import LEADER_METADATA_KEY, AioLeaderChannel, aio_leader_channel
from snapflow.redis_server import RedisServer
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LEASE_TTL_S = 1.5
HA: dict[str, Any] = {
    "high_availability": "redis",
    "lease_ttl_s": LEASE_TTL_S,
    "lease_renew_interval_s": 0.5,
}


def _namespace() -> str:
    return f"ha-{uuid.uuid4().hex[:10]}"


def test_a_standby_names_the_leader_and_takes_over_after_a_graceful_stop(
    redis_url: str, tmp_path: Path
) -> None:
    root = str(tmp_path / "cp")
    namespace = _namespace()

    async def main() -> None:
        async with running_coordinator(redis_url, root, redis_namespace=namespace, **HA) as a:
            assert a.coordinator.is_leader and a.coordinator.manager is not None
            epoch_a = a.coordinator.manager.epoch
            assert epoch_a >= 1
            job_id = await submit(a.stub, two_vertex_graph(1, 1))
            b_cm = running_coordinator(redis_url, root, redis_namespace=namespace, **HA)
            b = await b_cm.__aenter__()
            try:
                assert not b.coordinator.is_leader and b.coordinator.manager is None
                assert await health_status(b.channel) == NOT_SERVING
                assert await health_status(a.channel) == SERVING
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await b.stub.ListJobs(cpb.ListJobsRequest(), timeout=5)
                error = refused.value
                assert error.code() is grpc.StatusCode.UNAVAILABLE
                assert f"the leader is {a.address}" in (error.details() or ""), error.details()
                assert (LEADER_METADATA_KEY, a.address) in tuple(error.trailing_metadata() or ())

                # clients given every address find the leader, past a dead one and the standby
                dead = f"127.0.0.1:{free_port()}"
                channel = aio_leader_channel(f"{dead},{b.address},{a.address}")
                assert isinstance(channel, AioLeaderChannel)
                try:
                    stub = cgrpc.CoordinatorServiceStub(channel)
                    jobs = await stub.ListJobs(cpb.ListJobsRequest(), timeout=5)
                    assert [j.job_id for j in jobs.jobs] == [job_id]
                    assert channel.tracker.current == a.address
                finally:
                    await channel.close()
            except BaseException:
                await b_cm.__aexit__(None, None, None)
                raise
        # A stopped gracefully and released its lease: B leads at its next attempt
        try:
            # Released, not left to expire: the lease is free, or already B's.
            async with CheckpointStore.from_url(redis_url, namespace) as store:
                holder = await store.read_lease()
            assert holder is None or holder.address == b.address, holder

            async def serving() -> bool:
                return await health_status(b.channel) == SERVING

            await wait_until_async(
                serving,
                "the standby serving",
                timeout_s=10,
                interval_s=0.05,
            )
            assert b.coordinator.manager is not None
            assert b.coordinator.manager.epoch > epoch_a
            info = await b.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.job_id == job_id
            channel = aio_leader_channel(f"{a.address},{b.address}")
            try:
                stub = cgrpc.CoordinatorServiceStub(channel)
                jobs = await stub.ListJobs(cpb.ListJobsRequest(), timeout=5)
                assert [j.job_id for j in jobs.jobs] == [job_id]
            finally:
                await channel.close()
        finally:
            await b_cm.__aexit__(None, None, None)

    asyncio.run(main())


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_lapses(tmp_path: Path) -> None:
    """Redis pauses writes (CLIENT PAUSE WRITE): renewals stall. The leader steps down
    (NOT_SERVING, its manager fenced) while the lease key still has time to live in Redis,
    so no standby could have won yet; after the pause it leads again with a new epoch."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)

        async def main() -> None:
            namespace = _namespace()
            async with running_coordinator(
                server.url, str(tmp_path / "cp"), redis_namespace=namespace, **HA
            ) as a:
                manager = a.coordinator.manager
                assert manager is not None and a.coordinator.is_leader
                first_epoch = manager.epoch
                lease_key = f"{namespace}:coordinator:leader"
                assert await asyncio.to_thread(client.pttl, lease_key) > 0
                await asyncio.to_thread(client.execute_command, "CLIENT", "PAUSE", "2500", "WRITE")

                async def stepped_down() -> int | None:
                    if a.coordinator.is_leader:
                        return None
                    return int(await asyncio.to_thread(client.pttl, lease_key))

                ttl_left_ms = await wait_until_async(
                    stepped_down, "the leader stepping down", timeout_s=5, interval_s=0.01
                )
                # Redis' own clock: the lease still lived when the leader was seen stepped down.
                assert ttl_left_ms is not None and ttl_left_ms > 0, (
                    "the lease had lapsed before the leader stepped down"
                )
                assert manager.fenced  # its term's manager acts no more
                assert await health_status(a.channel) == NOT_SERVING
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await a.stub.ListJobs(cpb.ListJobsRequest(), timeout=5)
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
                # the pause ends: the lease (its own, or lapsed) is won again, a new term

                async def serving() -> bool:
                    return await health_status(a.channel) == SERVING

                await wait_until_async(serving, "serving again", timeout_s=10, interval_s=0.05)
                assert a.coordinator.manager is not None
                assert a.coordinator.manager.epoch > first_epoch

        try:
            asyncio.run(main())
        finally:
            client.close()


def test_a_leader_whose_term_fails_unexpectedly_gives_the_lease_up_and_serves_later(
    redis_url: str, tmp_path: Path
) -> None:
    """A term whose recovery dies of an error nobody expected (here a job record without its
    graph: KeyError) must not keep the lease while refusing every call (the chaos run's
    stall: the leader renewed for 20 minutes, NOT_SERVING). It resigns and retries; once the
    record is gone it leads and serves."""
    namespace = _namespace()
    client = redis.Redis.from_url(redis_url)
    bad_key = f"{namespace}:job:corrupt"
    client.sadd(f"{namespace}:jobs", "corrupt")
    client.set(bad_key, b'{"job_id": "corrupt"}')

    async def main() -> None:
        async with running_coordinator(
            redis_url, str(tmp_path / "cp"), redis_namespace=namespace, **HA
        ) as a:
            election = a.coordinator._elector
            assert election is not None
            assert not a.coordinator.is_leader
            assert await health_status(a.channel) == NOT_SERVING
            first = election.election.epoch
            assert first >= 1  # it won, failed to lead and resigned

            async def retried() -> bool:
                return election.election.epoch > first

            await wait_until_async(retried, "a new attempt", timeout_s=10, interval_s=0.02)
            assert not a.coordinator.is_leader
            await asyncio.to_thread(client.delete, bad_key)
            await asyncio.to_thread(client.srem, f"{namespace}:jobs", "corrupt")

            async def serving() -> bool:
                return await health_status(a.channel) == SERVING

            await wait_until_async(serving, "serving", timeout_s=10, interval_s=0.05)
            assert a.coordinator.is_leader and a.coordinator.manager is not None

    try:
        asyncio.run(main())
    finally:
        client.close()


def test_a_stale_leader_cannot_renew_write_or_take_the_epoch_back(redis_url: str) -> None:
    async def main() -> None:
        async with CheckpointStore.from_url(redis_url, namespace=_namespace()) as store:
            won = await store.try_acquire_lease("A", "a:1", ttl_ms=300)
            assert won.ok and won.epoch == 1
            held = await store.try_acquire_lease("B", "b:1", ttl_ms=5000)
            assert (held.ok, held.address, held.epoch) == (False, "a:1", 1)
            renewed = await store.renew_lease("A", 1, ttl_ms=300)
            assert renewed.ok
            # A stops renewing (paused, partitioned): the lease lapses, B takes over

            async def lapsed() -> bool:
                return await store.read_lease() is None

            await wait_until_async(lapsed, "the lease lapsing", timeout_s=5, interval_s=0.02)
            taken = await store.try_acquire_lease("B", "b:1", ttl_ms=5000)
            assert (taken.ok, taken.epoch) == (True, 2)
            lost = await store.renew_lease("A", 1, ttl_ms=300)
            assert (lost.ok, lost.address, lost.epoch) == (False, "b:1", 2)
            stale = store.with_epoch(1)
            record = JobRecord(
                job_id=uuid.uuid4().hex,
                graph=convert.graph_from_pb(two_vertex_graph(1, 1)),
                checkpoint_config=CheckpointConfig(),
                state=JobState.CREATED,
                created_at_ms=1,
            )
            with pytest.raises(StaleEpochError, match=r"epoch 1 but Redis .* holds epoch 2"):
                await stale.create_job(record)
            again = await store.try_acquire_lease("A", "a:1", ttl_ms=300)
            assert (again.ok, again.address, again.epoch) == (False, "b:1", 2)
            assert not await store.release_lease("A", 1)
            assert await store.read_lease() is not None
            # a coordinator without the election would fence the leader: refused
            with pytest.raises(FailedPreconditionError, match='high_availability = "redis"'):
                await store.acquire_epoch()
            assert await store.current_epoch() == 2
            assert await store.release_lease("B", 2)
            assert await store.acquire_epoch() == 3  # nobody holds the lease any more

    asyncio.run(main())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"high_availability": "zookeeper"}, "not a mode"),
        ({"lease_ttl_s": 2, "lease_renew_interval_s": 1}, "less than 3 times"),
        ({"lease_renew_interval_s": 0}, "not greater than 0"),
        ({"advertised_address": "node1"}, "not host:port"),
        ({"redis_url": "redis+sentinel://127.0.0.1:26379"}, "needs a service name"),
        ({"redis_url": "redis+sentinel://127.0.0.1/mymaster"}, "not a sentinel host:port"),
    ],
)
def test_bad_high_availability_settings_are_refused(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(overrides=overrides, environ={})

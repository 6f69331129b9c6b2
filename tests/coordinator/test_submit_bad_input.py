"""SubmitJob validation over real gRPC: invalid graphs, checkpoint configs, job ids, restore
settings and duplicates are refused with a precise status and leave nothing behind.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from kit.coordinator import running_coordinator, two_vertex_graph
from kit.coordinator_env import (
    Code,
    Env,
    T,
    checkpoint_completes,
    expect_error,
    fresh_namespace,
    job_with_agent,
    write_file,
)

from snapflow.coordinator.config import load_settings
from snapflow.coordinator.server import Coordinator
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

# ---------------------------------------------------------------------------------------------
# 2. SubmitJob: invalid graphs, configs, job ids, restore settings, duplicates
# ---------------------------------------------------------------------------------------------


def vertex(
    vertex_id: str,
    parallelism: int = 1,
    *,
    source: bool = False,
    max_parallelism: int = 0,
    operators: tuple[str, ...] | None = None,
) -> pb.JobVertex:
    ops = operators if operators is not None else (f"{vertex_id}-op",)
    return pb.JobVertex(
        vertex_id=vertex_id,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        is_source=source,
        operators=[pb.OperatorSpec(operator_id=o, kind="map") for o in ops],
    )


def edge(src: str, dst: str, partitioner: int = pb.PARTITIONER_KIND_HASH) -> pb.JobEdge:
    return pb.JobEdge(source_vertex_id=src, target_vertex_id=dst, partitioner=partitioner)  # type: ignore[arg-type]


def graph(vertices: list[pb.JobVertex], edges: list[pb.JobEdge] | None = None) -> pb.JobGraph:
    return pb.JobGraph(name="bad", vertices=vertices, edges=edges or [])


SRC = vertex("src", source=True)

INVALID_GRAPHS = [
    pytest.param(graph([]), "graph.vertices is empty", id="no-vertices"),
    pytest.param(graph([SRC, vertex("src")]), "'src' is duplicated", id="duplicate-vertex-id"),
    pytest.param(
        graph([vertex("src", 0, source=True)]), "parallelism 0 out of range", id="parallelism-0"
    ),
    pytest.param(
        graph([vertex("src", -3, source=True)]),
        "parallelism -3 out of range",
        id="negative-parallelism",
    ),
    pytest.param(
        graph([vertex("src", 9, source=True, max_parallelism=8)]),
        "parallelism 9 out of range 1..8",
        id="parallelism-above-max-parallelism",
    ),
    pytest.param(
        graph([vertex("src", 1, source=True, max_parallelism=32_769)]),
        "max_parallelism 32769 out of range 1..32768",
        id="max-parallelism-above-32768",
    ),
    pytest.param(
        graph([vertex("src", 1, source=True, max_parallelism=-1)]),
        "max_parallelism -1 out of range",
        id="negative-max-parallelism",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "ghost")]),
        "unknown vertex 'ghost'",
        id="edge-to-unknown-vertex",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("ghost", "map")]),
        "unknown vertex 'ghost'",
        id="edge-from-unknown-vertex",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "map"), edge("map", "map")]),
        "self loop on 'map'",
        id="self-loop",
    ),
    pytest.param(
        graph(
            [SRC, vertex("a"), vertex("b")],
            [edge("src", "a"), edge("a", "b"), edge("b", "a")],
        ),
        "cycle",
        id="cycle",
    ),
    pytest.param(
        graph([vertex("a"), vertex("b")], [edge("a", "b")]), "no source vertex", id="no-source"
    ),
    pytest.param(
        graph([SRC, vertex("map", 2)], [edge("src", "map", pb.PARTITIONER_KIND_FORWARD)]),
        "FORWARD needs equal parallelism",
        id="forward-unequal-parallelism",
    ),
    pytest.param(
        graph([SRC, vertex("src2", source=True)], [edge("src", "src2")]),
        "points into source vertex 'src2'",
        id="edge-into-source",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "map", pb.PARTITIONER_KIND_UNSPECIFIED)]),
        "partitioner must be FORWARD, HASH, REBALANCE or BROADCAST",
        id="unspecified-partitioner",
    ),
    pytest.param(
        graph([SRC, vertex("map")], [edge("src", "map", 99)]),
        "partitioner must be",
        id="unknown-partitioner-99",
    ),
    pytest.param(
        graph([vertex("a/b", source=True)]), "'a/b' is invalid", id="vertex-id-with-slash"
    ),
    pytest.param(
        graph([vertex("a b", source=True)]), "'a b' is invalid", id="vertex-id-with-space"
    ),
    pytest.param(graph([vertex("../x", source=True)]), "is invalid", id="vertex-id-path-traversal"),
    pytest.param(graph([vertex("", source=True)]), "vertex_id is required", id="empty-vertex-id"),
    pytest.param(graph([vertex("v" * 201, source=True)]), "is invalid", id="vertex-id-too-long"),
    pytest.param(
        graph([vertex("src", source=True, operators=("op", "op"))]),
        "operator_id 'op' is duplicated",
        id="duplicate-operator-id",
    ),
    pytest.param(
        graph([vertex("src", source=True, operators=("op;rm -rf",))]),
        "is invalid",
        id="bad-operator-id",
    ),
    pytest.param(
        graph([vertex("src", source=True, operators=("",))]),
        "operator_id is required",
        id="empty-operator-id",
    ),
    pytest.param(
        graph([vertex(f"v{i}", source=True) for i in range(1001)]),
        "at most 1000",
        id="too-many-vertices",
    ),
]


@pytest.mark.parametrize(("bad_graph", "fragment"), INVALID_GRAPHS)
def test_submit_invalid_graph_is_invalid_argument(
    env: Env, bad_graph: pb.JobGraph, fragment: str
) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(cpb.SubmitJobRequest(job_id=job_id, graph=bad_graph), timeout=T),
            Code.INVALID_ARGUMENT,
            fragment,
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert await asyncio.to_thread(env.jobs_set) == jobs_before
        await expect_error(
            env.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=T), Code.NOT_FOUND
        )

    env.loop.run(main())


INVALID_CONFIGS = [
    pytest.param({"interval_ms": -1}, "interval_ms must be >= 0", id="negative-interval"),
    pytest.param(
        {"interval_ms": 5}, "interval_ms 5 is below the minimum of 10 ms", id="interval-5ms"
    ),
    pytest.param({"timeout_ms": 5}, "timeout_ms 5 is below the minimum of 10 ms", id="timeout-5ms"),
    pytest.param({"timeout_ms": -100}, "timeout_ms must be >= 0", id="negative-timeout"),
    pytest.param({"min_pause_ms": -1}, "min_pause_ms must be >= 0", id="negative-min-pause"),
    pytest.param(
        {"max_concurrent": -1}, "max_concurrent must be >= 1", id="negative-max-concurrent"
    ),
    pytest.param(
        {"mode": pb.CHECKPOINT_MODE_UNALIGNED, "max_concurrent": 2},
        "at most 1 checkpoint may be in flight",
        id="unaligned-with-max-concurrent-2",
    ),
    pytest.param(
        {"aligned_checkpoint_timeout_ms": 50, "max_concurrent": 3},
        "max_concurrent 3 needs aligned checkpoints",
        id="aligned-timeout-with-max-concurrent-3",
    ),
    pytest.param(
        {"tolerable_failures": -2},
        "tolerable_failures must be >= 0",
        id="negative-tolerable-failures",
    ),
    pytest.param({"retained": -1}, "retained must be >= 1", id="negative-retained"),
    pytest.param({"mode": 99}, "mode 99 is not a known CheckpointMode", id="unknown-mode-99"),
    pytest.param(
        {"mode": pb.CHECKPOINT_MODE_UNALIGNED, "aligned_checkpoint_timeout_ms": 100},
        "applies only to ALIGNED",
        id="aligned-timeout-with-unaligned",
    ),
    pytest.param(
        {"mode": pb.CHECKPOINT_MODE_AT_LEAST_ONCE, "aligned_checkpoint_timeout_ms": 100},
        "applies only to ALIGNED",
        id="aligned-timeout-with-at-least-once",
    ),
    pytest.param(
        {"aligned_checkpoint_timeout_ms": -5},
        "aligned_checkpoint_timeout_ms must be >= 0",
        id="negative-aligned-timeout",
    ),
    pytest.param(
        {"storage_uri": "s3://bucket/../checkpoints"},
        "'..' segment",
        id="storage-uri-s3-dotdot",
    ),
    pytest.param(
        {"storage_uri": "s3:///checkpoints"},
        "names no bucket",
        id="storage-uri-s3-no-bucket",
    ),
    pytest.param(
        {"storage_uri": "hdfs://nn:8020/cp"},
        "only local or shared file systems",
        id="storage-uri-hdfs",
    ),
    pytest.param(
        {"storage_uri": "file://otherhost/checkpoints"},
        "names the host",
        id="storage-uri-file-with-host",
    ),
    pytest.param(
        {"storage_uri": "file:///tmp/checkpoints?x=1"},
        "query",
        id="storage-uri-file-with-query",
    ),
    pytest.param(
        {"storage_uri": "/tmp/check\x00points"},
        "NUL byte",
        id="storage-uri-nul-byte",
    ),
    pytest.param(
        {"storage_uri": "relative/checkpoints"},
        "absolute",
        id="storage-uri-relative",
    ),
    pytest.param(
        {"storage_uri": "file://"},
        "absolute",
        id="storage-uri-bare-file-scheme",
    ),
]


@pytest.mark.parametrize(("config", "fragment"), INVALID_CONFIGS)
def test_submit_invalid_checkpoint_config_is_invalid_argument(
    env: Env, config: dict[str, Any], fragment: str
) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        request = cpb.SubmitJobRequest(
            job_id=job_id, graph=two_vertex_graph(), checkpoint_config=pb.CheckpointConfig(**config)
        )
        await expect_error(
            env.stub.SubmitJob(request, timeout=T),
            Code.INVALID_ARGUMENT,
            "checkpoint_config" if "storage_uri" not in config else "storage",
            fragment,
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}, "a job record was left in Redis"
        assert await asyncio.to_thread(env.jobs_set) == jobs_before
        # the id is still free: a valid submission with it succeeds
        response = await env.stub.SubmitJob(
            cpb.SubmitJobRequest(job_id=job_id, graph=two_vertex_graph()), timeout=T
        )
        assert response.job.job_id == job_id
        await env.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=T)

    env.loop.run(main())


def test_rejected_storage_uri_does_not_break_the_next_coordinator_start(
    env: Env, tmp_path: Path
) -> None:
    async def main() -> None:
        namespace = fresh_namespace()
        root = str(tmp_path / "cp")
        async with running_coordinator(env.redis_url, root, redis_namespace=namespace) as c:
            await expect_error(
                c.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        graph=two_vertex_graph(),
                        checkpoint_config=pb.CheckpointConfig(storage_uri="file://otherhost/cp"),
                    ),
                    timeout=T,
                ),
                Code.INVALID_ARGUMENT,
                "names the host",
            )
        # Started by hand, not with running_coordinator: when start() fails, the half-started
        # coordinator must still be stopped (its Redis connection would leak otherwise).
        restarted = Coordinator(
            load_settings(
                overrides={
                    "host": "127.0.0.1",
                    "port": 0,
                    "metrics_port": -1,
                    "redis_url": env.redis_url,
                    "redis_namespace": namespace,
                    "storage_root": root,
                    "shutdown_grace_s": 0.5,
                },
                environ={},
            )
        )
        try:
            try:
                await restarted.start()
            except Exception as error:  # the coordinator cannot even start
                raise AssertionError(
                    f"coordinator restart failed: {type(error).__name__}: {error}"
                ) from None
            assert restarted.manager is not None and restarted.manager.jobs == {}
        finally:
            await restarted.stop()

    env.loop.run(main())


INVALID_SUBMIT_IDS = [
    pytest.param("xyz", "malformed", id="job-id-xyz"),
    pytest.param(uuid.UUID(int=1).hex + "0", "malformed", id="job-id-33-chars"),
    pytest.param(uuid.UUID(int=0xFEED).hex.upper(), "malformed", id="job-id-upper-case"),
    pytest.param("../" + "a" * 29, "malformed", id="job-id-path-traversal"),
]


@pytest.mark.parametrize(("job_id", "fragment"), INVALID_SUBMIT_IDS)
def test_submit_malformed_job_id_is_invalid_argument(env: Env, job_id: str, fragment: str) -> None:
    async def main() -> None:
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(job_id=job_id, graph=two_vertex_graph()), timeout=T
            ),
            Code.INVALID_ARGUMENT,
            "job_id",
            fragment,
        )
        assert await asyncio.to_thread(env.jobs_set) == jobs_before

    env.loop.run(main())


INVALID_RESTORES = [
    pytest.param(
        cpb.RestoreSettings(latest=True),
        Code.INVALID_ARGUMENT,
        "restore.latest needs an existing job",
        id="latest-for-new-job",
    ),
    pytest.param(
        cpb.RestoreSettings(checkpoint_id=3),
        Code.INVALID_ARGUMENT,
        "restore.checkpoint_id",
        id="checkpoint-id-for-new-job",
    ),
    pytest.param(
        cpb.RestoreSettings(checkpoint_id=-1),
        Code.INVALID_ARGUMENT,
        "checkpoint_id must be >= 1",
        id="negative-checkpoint-id",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path=""),
        Code.INVALID_ARGUMENT,
        "empty",
        id="empty-savepoint-path",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path="/nonexistent/savepoint-abc"),
        Code.NOT_FOUND,
        "no checkpoint metadata",
        id="missing-savepoint",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path="gs://bucket/savepoint-abc"),
        Code.INVALID_ARGUMENT,
        "URI scheme",
        id="gs-savepoint",
    ),
    pytest.param(
        cpb.RestoreSettings(savepoint_path="s3://bucket/a/../savepoint-abc"),
        Code.INVALID_ARGUMENT,
        "'..' segment",
        id="s3-savepoint-dotdot",
    ),
]


@pytest.mark.parametrize(("restore", "code", "fragment"), INVALID_RESTORES)
def test_submit_invalid_restore_settings(
    env: Env, restore: cpb.RestoreSettings, code: grpc.StatusCode, fragment: str
) -> None:
    async def main() -> None:
        job_id = uuid.uuid4().hex
        jobs_before = await asyncio.to_thread(env.jobs_set)
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(job_id=job_id, graph=two_vertex_graph(), restore=restore),
                timeout=T,
            ),
            code,
            fragment,
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert await asyncio.to_thread(env.jobs_set) == jobs_before

    env.loop.run(main())


def test_submit_restore_from_garbage_metadata_is_invalid_argument(env: Env, tmp_path: Path) -> None:
    async def main() -> None:
        savepoint = tmp_path / "savepoint-bogus"
        write_file(savepoint / "_metadata", b"\x00\x01 not json")
        job_id = uuid.uuid4().hex
        await expect_error(
            env.stub.SubmitJob(
                cpb.SubmitJobRequest(
                    job_id=job_id,
                    graph=two_vertex_graph(),
                    restore=cpb.RestoreSettings(savepoint_path=str(savepoint)),
                ),
                timeout=T,
            ),
            Code.INVALID_ARGUMENT,
            "invalid checkpoint metadata",
        )
        assert await asyncio.to_thread(env.job_keys, job_id) == {}
        assert (savepoint / "_metadata").read_bytes() == b"\x00\x01 not json"

    env.loop.run(main())


def test_duplicate_job_id_is_already_exists_and_leaves_the_running_job_alone(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            info_before = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            other = graph([vertex("x", 3, source=True)])
            await expect_error(
                env.stub.SubmitJob(
                    cpb.SubmitJobRequest(
                        job_id=job.id,
                        graph=other,
                        checkpoint_config=pb.CheckpointConfig(interval_ms=10),
                    ),
                    timeout=T,
                ),
                Code.ALREADY_EXISTS,
                job.id,
                "already exists",
            )
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info_after = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info_after == info_before
            assert info_after.state == pb.JOB_STATE_RUNNING
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())

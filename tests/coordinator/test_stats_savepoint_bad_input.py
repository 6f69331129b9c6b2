"""Checkpoint stats, details and DisposeSavepoint over real gRPC: bad input is refused, and a
checkpoint directory is never disposed of as a savepoint.

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from kit.coordinator_env import (
    Code,
    Env,
    T,
    checkpoint_completes,
    expect_error,
    job_with_agent,
    write_file,
)

from snapflow.v1 import coordinator_pb2 as cpb

# ---------------------------------------------------------------------------------------------
# 6. Stats, details, DisposeSavepoint
# ---------------------------------------------------------------------------------------------


def test_checkpoint_details_and_stats_bad_input(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await checkpoint_completes(env.stub, job)
            for checkpoint_id, code, fragment in (
                (42, Code.NOT_FOUND, "checkpoint 42"),
                (2**62, Code.NOT_FOUND, f"checkpoint {2**62}"),
                (0, Code.INVALID_ARGUMENT, "checkpoint_id must be >= 1"),
                (-1, Code.INVALID_ARGUMENT, "checkpoint_id must be >= 1"),
            ):
                await expect_error(
                    env.stub.GetCheckpointDetails(
                        cpb.GetCheckpointDetailsRequest(job_id=job.id, checkpoint_id=checkpoint_id),
                        timeout=T,
                    ),
                    code,
                    fragment,
                )
            for size in (-1, 1001, 5000, -(2**31)):
                await expect_error(
                    env.stub.GetCheckpointStats(
                        cpb.GetCheckpointStatsRequest(job_id=job.id, history_size=size), timeout=T
                    ),
                    Code.INVALID_ARGUMENT,
                    "history_size must be in 0..1000",
                )
            stats = await env.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.id, history_size=1000), timeout=T
            )
            assert stats.counts.completed == 1

    env.loop.run(main())


@pytest.mark.parametrize(
    ("make_path", "code", "fragment"),
    [
        pytest.param(lambda d: "", Code.INVALID_ARGUMENT, "savepoint_path is required", id="empty"),
        pytest.param(lambda d: "savepoints/sp-1", Code.INVALID_ARGUMENT, "absolute", id="relative"),
        pytest.param(
            lambda d: "file://sp-1", Code.INVALID_ARGUMENT, "absolute", id="file-uri-relative"
        ),
        pytest.param(lambda d: "s3:///sp-1", Code.INVALID_ARGUMENT, "names no bucket", id="s3-uri"),
        pytest.param(
            lambda d: "s3://bucket/x/../sp-1", Code.INVALID_ARGUMENT, "'..'", id="s3-dotdot"
        ),
        pytest.param(lambda d: "gs://bucket/sp-1", Code.INVALID_ARGUMENT, "gs://", id="gs-uri"),
        pytest.param(
            lambda d: str(d / "missing"), Code.NOT_FOUND, "no checkpoint metadata", id="missing-dir"
        ),
        pytest.param(
            lambda d: str(write_file(d / "garbage" / "_metadata", b"{not json").parent),
            Code.INVALID_ARGUMENT,
            "invalid checkpoint metadata",
            id="garbage-metadata",
        ),
        pytest.param(
            lambda d: str(write_file(d / "plain" / "data.bin").parent),
            Code.INVALID_ARGUMENT,
            "not a savepoint",
            id="plain-dir-without-metadata",
        ),
    ],
)
def test_dispose_savepoint_bad_input(
    env: Env,
    tmp_path: Path,
    make_path: Callable[[Path], str],
    code: grpc.StatusCode,
    fragment: str,
) -> None:
    async def main() -> None:
        path = make_path(tmp_path)
        before = sorted(p for p in tmp_path.rglob("*"))
        await expect_error(
            env.stub.DisposeSavepoint(cpb.DisposeSavepointRequest(savepoint_path=path), timeout=T),
            code,
            fragment,
        )
        assert sorted(p for p in tmp_path.rglob("*")) == before, "something was deleted"

    env.loop.run(main())


def test_dispose_of_a_checkpoint_dir_is_refused_and_a_disposed_savepoint_is_gone(
    env: Env, tmp_path: Path
) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            summary = await checkpoint_completes(env.stub, job)
            files = sorted(Path(summary.external_path).iterdir())
            await expect_error(
                env.stub.DisposeSavepoint(
                    cpb.DisposeSavepointRequest(savepoint_path=summary.external_path), timeout=T
                ),
                Code.INVALID_ARGUMENT,
                f"checkpoint {summary.checkpoint_id}, not a savepoint",
            )
            assert sorted(Path(summary.external_path).iterdir()) == files
            savepoint = await env.stub.TriggerSavepoint(
                cpb.TriggerSavepointRequest(job_id=job.id, target_directory=str(tmp_path / "sp")),
                timeout=10,
            )
            await env.stub.DisposeSavepoint(
                cpb.DisposeSavepointRequest(savepoint_path=savepoint.external_path), timeout=T
            )
            assert not os.path.exists(savepoint.external_path)
            await expect_error(
                env.stub.DisposeSavepoint(
                    cpb.DisposeSavepointRequest(savepoint_path=savepoint.external_path), timeout=T
                ),
                Code.NOT_FOUND,
                "no checkpoint metadata",
            )
            # the retained checkpoint survived all of it and the job still checkpoints
            assert sorted(Path(summary.external_path).iterdir()) == files
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())

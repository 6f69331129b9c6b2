"""AcknowledgeCheckpoint(s) / DeclineCheckpoint over real gRPC: unknown, late, duplicate and
invalid acks are judged one by one, and their state files are deleted only inside the job's
storage (never a retained checkpoint's, never outside).

Shared coordinator and helpers: tests/kit/coordinator_env.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kit.coordinator import submit, two_vertex_graph
from kit.coordinator_env import (
    Code,
    Env,
    T,
    ack,
    ack_all_by_hand,
    ack_outcome,
    ack_request,
    attempt,
    checkpoint_completes,
    checkpoint_details,
    expect_error,
    finish,
    ignore_all,
    job_with_agent,
    redis_snapshot,
    start_pending_checkpoint,
    write_file,
)
from kit.polling import holds_for_async, wait_until_async

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

# ---------------------------------------------------------------------------------------------
# 4. AcknowledgeCheckpoint / DeclineCheckpoint
# ---------------------------------------------------------------------------------------------


def test_ack_for_unknown_checkpoint_is_unknown_and_its_state_is_discarded(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            await checkpoint_completes(env.stub, job)  # checkpoint 1
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            state = write_file(job.dir / "taskowned" / "unknown-999.state")
            assert (
                await ack(env.stub, job.id, job.task(), 999, str(state)) == cpb.ACK_RESULT_UNKNOWN
            )
            await wait_until_async(lambda: not state.exists(), "state of the unknown ack deleted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            stats = await env.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.id), timeout=T
            )
            assert (stats.counts.completed, stats.counts.failed, stats.counts.in_progress) == (
                1,
                0,
                0,
            )
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_late_ack_for_expired_checkpoint_is_discarded_and_its_state_deleted(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(
            env.coordinator,
            env.storage_root,
            policy=ignore_all,
            timeout_ms=250,
            tolerable_failures_unlimited=True,
        ) as job:
            await expect_error(
                env.stub.TriggerCheckpoint(cpb.TriggerCheckpointRequest(job_id=job.id), timeout=T),
                Code.ABORTED,
                "EXPIRED",
            )
            chk = job.dir / "chk-1"
            await wait_until_async(
                lambda: not chk.exists(), "expired checkpoint's directory cleaned up"
            )
            await wait_until_async(
                lambda: not redis_snapshot(env.redis_url, f"{env.namespace}:job:{job.id}:pending"),
                "pending record removed",
            )
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            late = write_file(job.dir / "taskowned" / "late-1.state")
            assert await ack(env.stub, job.id, job.task(), 1, str(late)) == cpb.ACK_RESULT_DISCARDED
            await wait_until_async(lambda: not late.exists(), "late ack's state deleted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            info = await env.stub.GetJob(cpb.GetJobRequest(job_id=job.id), timeout=T)
            assert info.state == pb.JOB_STATE_RUNNING
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_duplicate_ack_of_a_completed_checkpoint_keeps_its_state(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            summary = await checkpoint_completes(env.stub, job)
            original = Path(summary.external_path) / "src-0-1.state"
            assert original.is_file()
            keys_before = await asyncio.to_thread(env.job_keys, job.id)
            extra = write_file(job.dir / "taskowned" / "duplicate-extra.state")
            result = await ack(
                env.stub, job.id, job.task(), summary.checkpoint_id, str(original), str(extra)
            )
            assert result == cpb.ACK_RESULT_DUPLICATE
            await wait_until_async(lambda: not extra.exists(), "duplicate ack's new state deleted")
            await holds_for_async(original.is_file, "the completed checkpoint's state was deleted")
            assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
            assert (await checkpoint_completes(env.stub, job)).checkpoint_id == 2

    env.loop.run(main())


def test_duplicate_ack_of_a_pending_checkpoint_is_duplicate(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                location = Path(details.summary.external_path)
                first = write_file(location / "src-first.state")
                assert (
                    await ack(env.stub, job.id, job.task(), checkpoint_id, str(first))
                    == cpb.ACK_RESULT_SUCCESS
                )
                again = write_file(location / "src-again.state")
                for paths in ((str(first),), (str(first), str(again))):
                    assert (
                        await ack(env.stub, job.id, job.task(), checkpoint_id, *paths)
                        == cpb.ACK_RESULT_DUPLICATE
                    )
                await wait_until_async(lambda: not again.exists(), "duplicate's new state deleted")
                assert first.is_file(), "the first ack's state was deleted by its duplicate"
                task_map = job.task("map", 0)
                map_state = write_file(location / "map.state")
                assert (
                    await ack(env.stub, job.id, task_map, checkpoint_id, str(map_state))
                    == cpb.ACK_RESULT_SUCCESS
                )
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
                assert summary.num_acknowledged == 2
                assert first.is_file() and map_state.is_file()
            finally:
                await finish(trigger)
            await checkpoint_completes(env.stub, job)

    env.loop.run(main())


ACK_FIELD_CASES = [
    pytest.param({"checkpoint_id": 0}, "checkpoint_id must be >= 1, got 0", id="checkpoint-id-0"),
    pytest.param(
        {"checkpoint_id": -5}, "checkpoint_id must be >= 1, got -5", id="negative-checkpoint-id"
    ),
    pytest.param(
        {"metrics": pb.SubtaskCheckpointMetrics(sync_duration_ms=-1)},
        "metrics: sync_duration_ms must be >= 0",
        id="negative-sync-duration",
    ),
    pytest.param(
        {"metrics": pb.SubtaskCheckpointMetrics(state_size_bytes=-1)},
        "state_size_bytes must be >= 0",
        id="negative-state-size",
    ),
    pytest.param(
        {"metrics": pb.SubtaskCheckpointMetrics(persisted_in_flight_bytes=-(2**40))},
        "persisted_in_flight_bytes must be >= 0",
        id="negative-in-flight-bytes",
    ),
    pytest.param({"size_bytes": -1}, "size_bytes must be >= 0", id="negative-handle-size"),
    pytest.param({"attempt": attempt("src", 0, 0)}, "attempt.attempt must be >= 1", id="attempt-0"),
    pytest.param({"held_ms": -1}, "held_ms must be >= 0, got -1", id="negative-held-ms"),
    pytest.param({"held_ms": 2**40}, "held_ms 1099511627776 is above", id="absurd-held-ms"),
    pytest.param(
        {"data": b"abc", "size_bytes": 5},
        "inline data of 3 bytes needs size_bytes 3 (got 5)",
        id="inline-data-size-mismatch",
    ),
]


@pytest.mark.parametrize(("override", "fragment"), ACK_FIELD_CASES)
def test_ack_with_invalid_fields_is_invalid_argument(
    env: Env, override: dict[str, Any], fragment: str
) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                state = write_file(Path(details.summary.external_path) / "src-bad-ack.state")
                request = ack_request(
                    job.id,
                    override.get("attempt", job.task()),
                    override.get("checkpoint_id", checkpoint_id),
                    str(state),
                    metrics=override.get("metrics"),
                    size_bytes=override.get("size_bytes", 5),
                )
                request.held_ms = override.get("held_ms", 0)
                for handle in request.operator_states[0].handles:
                    handle.data = override.get("data", b"")
                keys_before = await asyncio.to_thread(env.job_keys, job.id)
                await expect_error(
                    env.stub.AcknowledgeCheckpoint(request, timeout=T),
                    Code.INVALID_ARGUMENT,
                    fragment,
                )
                assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                assert details.summary.num_acknowledged == 0, "the invalid ack was counted"
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)

    env.loop.run(main())


@dataclass
class PathContext:
    job_dir: Path
    victim: Path
    other_victim: Path
    link: Path


BAD_STATE_PATHS = [
    pytest.param(lambda x: str(x.victim), "lies outside", id="absolute-path-outside-storage"),
    pytest.param(
        lambda x: os.path.join(x.job_dir, "chk-1", os.path.relpath(x.victim, x.job_dir / "chk-1")),
        "lies outside",
        id="dotdot-escape-from-job-dir",
    ),
    pytest.param(lambda x: str(x.other_victim), "lies outside", id="other-jobs-dir"),
    pytest.param(lambda x: str(x.link), "lies outside", id="symlink-in-job-dir-to-outside"),
    pytest.param(lambda x: f"file://{x.victim}", "lies outside", id="file-uri-outside"),
    pytest.param(lambda x: "chk-1/src-0-1.state", "is relative", id="relative-path"),
    pytest.param(lambda x: "../../etc/passwd", "is relative", id="relative-dotdot-etc-passwd"),
    pytest.param(lambda x: "s3://bucket/state", "URI scheme", id="s3-uri"),
    pytest.param(lambda x: f"{x.victim}\x00.state", "NUL byte", id="nul-byte"),
    pytest.param(lambda x: str(x.job_dir), "lies outside", id="the-job-dir-itself"),
    pytest.param(lambda x: "", "empty path", id="empty-path"),
    pytest.param(lambda x: "   ", "empty", id="blank-path"),
]


@pytest.mark.parametrize(("make_path", "fragment"), BAD_STATE_PATHS)
def test_ack_with_state_path_outside_the_job_storage_is_refused_and_never_deleted(
    env: Env, tmp_path: Path, make_path: Callable[[PathContext], str], fragment: str
) -> None:
    """The victim files are real files outside the job's directory (stand-ins for /etc/passwd:
    the tests run as root, so the real one is never offered). They must survive an invalid ack,
    the checkpoint's completion and an aborted checkpoint."""

    async def main() -> None:
        async with job_with_agent(
            env.coordinator, env.storage_root, policy=ignore_all, tolerable_failures_unlimited=True
        ) as job:
            victim = write_file(tmp_path / "outside" / "passwd", b"root:x:0:0")
            other_job = await submit(env.stub, two_vertex_graph(1, 1))
            other_victim = write_file(env.job_dir(other_job) / "chk-1" / "src-0-1.state", b"theirs")
            link = job.dir / "taskowned" / "link.state"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(victim)
            ctx = PathContext(job.dir, victim, other_victim, link)
            bad = make_path(ctx)
            victims = {victim: victim.read_bytes(), other_victim: other_victim.read_bytes()}

            def untouched() -> bool:
                return all(p.is_file() and p.read_bytes() == d for p, d in victims.items())

            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                keys_before = await asyncio.to_thread(env.job_keys, job.id)
                for target_id in (checkpoint_id, 999):  # a pending and an unknown checkpoint
                    await expect_error(
                        env.stub.AcknowledgeCheckpoint(
                            ack_request(job.id, job.task(), target_id, bad), timeout=T
                        ),
                        Code.INVALID_ARGUMENT,
                        fragment,
                    )
                assert await asyncio.to_thread(env.job_keys, job.id) == keys_before
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                assert details.summary.num_acknowledged == 0
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)
            assert untouched()

            # the same refused ack into a checkpoint that then aborts (declined)
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                await expect_error(
                    env.stub.AcknowledgeCheckpoint(
                        ack_request(job.id, job.task(), checkpoint_id, bad), timeout=T
                    ),
                    Code.INVALID_ARGUMENT,
                    fragment,
                )
                await env.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=job.id,
                        attempt=job.task("map", 0),
                        checkpoint_id=checkpoint_id,
                        reason=cpb.DECLINE_REASON_SNAPSHOT_FAILED,
                        message="test decline",
                    ),
                    timeout=T,
                )
                await expect_error(trigger, Code.ABORTED, "DECLINED")
            finally:
                await finish(trigger)
            chk = job.dir / f"chk-{checkpoint_id}"
            await wait_until_async(lambda: not chk.exists(), "aborted checkpoint cleaned up")
            await holds_for_async(untouched, "a file outside the job's storage was touched")
            assert link.is_symlink()
            await env.stub.CancelJob(cpb.CancelJobRequest(job_id=other_job), timeout=T)

    env.loop.run(main())


@pytest.mark.parametrize(
    "alias",
    [
        pytest.param(
            lambda chk: os.path.join(chk, "_metadata"),
            id="metadata-of-retained-checkpoint",
        ),
        pytest.param(
            lambda chk: os.path.join(chk, ".", "src-0-1.state"),
            id="dot-alias-of-retained-state",
        ),
        pytest.param(
            lambda chk: chk.replace("/chk-", "//chk-") + "/src-0-1.state",
            id="double-slash-alias-of-retained-state",
        ),
        pytest.param(
            lambda chk: os.path.join(chk, "src-0-1.state"),
            id="exact-path-of-retained-state",
        ),
    ],
)
def test_unknown_ack_never_deletes_files_of_a_retained_checkpoint(
    env: Env, alias: Callable[[str], str]
) -> None:

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root) as job:
            summary = await checkpoint_completes(env.stub, job)
            chk = summary.external_path
            files = {p: p.read_bytes() for p in Path(chk).iterdir()}
            assert Path(chk, "_metadata") in files and Path(chk, "src-0-1.state") in files
            result = await ack(env.stub, job.id, job.task(), 999, alias(chk))
            assert result == cpb.ACK_RESULT_UNKNOWN
            # a sentinel discarded after the bogus ack marks when its discard has run
            sentinel = write_file(job.dir / "taskowned" / "sentinel.state")
            assert (
                await ack(env.stub, job.id, job.task(), 998, str(sentinel))
                == cpb.ACK_RESULT_UNKNOWN
            )
            await wait_until_async(lambda: not sentinel.exists(), "sentinel discarded")
            missing = sorted(str(p) for p in files if not p.is_file())
            assert not missing, (
                f"files of retained checkpoint {summary.checkpoint_id} deleted: {missing}"
            )
            assert await checkpoint_completes(env.stub, job)

    env.loop.run(main())


def test_batched_acks_are_judged_one_by_one(env: Env, tmp_path: Path) -> None:
    """AcknowledgeCheckpoints: every ack of a batch gets its own outcome (the bad ones the status
    the unary RPC would give), the good ones still count, and no bad path is ever deleted."""

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                location = Path(details.summary.external_path)
                good = write_file(location / "src-batched.state")
                victim = write_file(tmp_path / "outside" / "victim", b"keep me")
                unknown_state = write_file(job.dir / "taskowned" / "batched-unknown.state")
                src = job.task("src", 0)
                bad_metrics = pb.SubtaskCheckpointMetrics(start_delay_ms=-1)
                negative_held = ack_request(job.id, src, checkpoint_id)
                negative_held.held_ms = -5
                cases = [
                    (ack_request(job.id, src, checkpoint_id, str(good)), "ACK_RESULT_SUCCESS", ""),
                    (ack_request(uuid.uuid4().hex, src, checkpoint_id), "NOT_FOUND", "not exist"),
                    (ack_request("XYZ", src, checkpoint_id), "INVALID_ARGUMENT", "malformed"),
                    (
                        ack_request(job.id, src, checkpoint_id, str(victim)),
                        "INVALID_ARGUMENT",
                        "lies outside",
                    ),
                    (ack_request(job.id, src, 0), "INVALID_ARGUMENT", "checkpoint_id must be >= 1"),
                    (
                        ack_request(job.id, src, checkpoint_id, metrics=bad_metrics),
                        "INVALID_ARGUMENT",
                        "start_delay_ms must be >= 0",
                    ),
                    (
                        ack_request(job.id, attempt("src", 0, 0), checkpoint_id),
                        "INVALID_ARGUMENT",
                        "attempt.attempt must be >= 1",
                    ),
                    (negative_held, "INVALID_ARGUMENT", "held_ms must be >= 0"),
                    (ack_request(job.id, src, 999, str(unknown_state)), "ACK_RESULT_UNKNOWN", ""),
                    (
                        ack_request(job.id, src, checkpoint_id, str(good)),
                        "ACK_RESULT_DUPLICATE",
                        "",
                    ),
                ]
                response = await env.stub.AcknowledgeCheckpoints(
                    cpb.AcknowledgeCheckpointsRequest(acks=[c[0] for c in cases]), timeout=T
                )
                assert len(response.outcomes) == len(cases)
                for i, ((_, want, fragment), outcome) in enumerate(
                    zip(cases, response.outcomes, strict=True)
                ):
                    got, message = ack_outcome(outcome)
                    assert got == want, (i, got, message)
                    assert fragment.lower() in message.lower(), (i, message)
                await wait_until_async(
                    lambda: not unknown_state.exists(), "unknown ack's state deleted"
                )
                assert good.is_file() and victim.read_bytes() == b"keep me"

                # too many acks in one call: refused as a whole, none of them applied
                map_task = job.task("map", 0)
                flood = [ack_request(job.id, map_task, checkpoint_id)] * 4097
                await expect_error(
                    env.stub.AcknowledgeCheckpoints(
                        cpb.AcknowledgeCheckpointsRequest(acks=flood), timeout=T
                    ),
                    Code.INVALID_ARGUMENT,
                    "4097 acks in one call; at most 4096",
                )
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                assert details.summary.num_acknowledged == 1
                map_state = write_file(location / "map-batched.state")
                response = await env.stub.AcknowledgeCheckpoints(
                    cpb.AcknowledgeCheckpointsRequest(
                        acks=[ack_request(job.id, map_task, checkpoint_id, str(map_state))]
                    ),
                    timeout=T,
                )
                assert ack_outcome(response.outcomes[0]) == ("ACK_RESULT_SUCCESS", "")
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
                assert good.is_file() and map_state.is_file() and victim.is_file()
            finally:
                await finish(trigger)

    env.loop.run(main())


def test_decline_with_invalid_fields_is_invalid_argument(env: Env) -> None:
    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                for fields, fragment in (
                    ({"checkpoint_id": 0}, "checkpoint_id must be >= 1"),
                    ({"checkpoint_id": -1}, "checkpoint_id must be >= 1"),
                    ({"attempt": attempt("src", 0, 0)}, "attempt.attempt must be >= 1"),
                    ({"attempt": pb.TaskAttempt()}, "attempt.vertex_id is required"),
                ):
                    # Any: each case sets one field to a value of that field's type.
                    given: dict[str, Any] = {"attempt": job.task(), "checkpoint_id": checkpoint_id}
                    given.update(fields)
                    request = cpb.DeclineCheckpointRequest(
                        job_id=job.id,
                        attempt=given["attempt"],
                        checkpoint_id=given["checkpoint_id"],
                        message="bad",
                    )
                    await expect_error(
                        env.stub.DeclineCheckpoint(request, timeout=T),
                        Code.INVALID_ARGUMENT,
                        fragment,
                    )
                # an unknown task's decline is ignored: the checkpoint stays pending
                await env.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=job.id, attempt=attempt("ghost", 0, 1), checkpoint_id=checkpoint_id
                    ),
                    timeout=T,
                )
                assert not trigger.done()
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                assert details.summary.status == pb.CHECKPOINT_STATUS_IN_PROGRESS
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                assert (
                    await asyncio.wait_for(trigger, 10)
                ).status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)

    env.loop.run(main())


def test_inline_state_is_kept_in_the_records_and_its_name_never_touched(
    env: Env, tmp_path: Path
) -> None:
    """Inline state (``StateHandle.data``): the bytes go into the checkpoint's ``_metadata`` and
    its Redis record; its path only names it, so a name outside the job's storage is neither
    refused (nothing is read there) nor ever deleted, also when the checkpoint retires."""

    async def main() -> None:
        async with job_with_agent(env.coordinator, env.storage_root, policy=ignore_all) as job:
            outside = write_file(tmp_path / "not-yours.state")
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                request = ack_request(job.id, job.task(), checkpoint_id, str(outside), size_bytes=6)
                request.operator_states[0].handles[0].data = b"inline"
                response = await env.stub.AcknowledgeCheckpoint(request, timeout=T)
                assert response.result == cpb.ACK_RESULT_SUCCESS
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                request = ack_request(
                    job.id, job.task("map"), checkpoint_id, str(outside), size_bytes=3
                )
                request.operator_states[0].handles[0].data = b"\x00\xff\x01"
                response = await env.stub.AcknowledgeCheckpoint(request, timeout=T)
                assert response.result == cpb.ACK_RESULT_SUCCESS
                summary = await asyncio.wait_for(trigger, 10)
                assert summary.status == pb.CHECKPOINT_STATUS_COMPLETED
            finally:
                await finish(trigger)
            chk = Path(details.summary.external_path)
            assert sorted(p.name for p in chk.iterdir()) == ["_metadata"]
            record = json.loads((chk / "_metadata").read_text())["checkpoint"]
            inline = [
                base64.b64decode(h["data"])
                for a in record["subtask_states"]
                for s in a["operator_states"]
                for h in s["handles"]
            ]
            assert sorted(inline) == [b"\x00\xff\x01", b"inline"]
            stored = await asyncio.to_thread(env.job_keys, job.id)
            assert "aW5saW5l" in str(stored)  # base64 of b"inline"
            # retired by the next checkpoint (one retained): the name is still not touched
            trigger, checkpoint_id = await start_pending_checkpoint(env.stub, job)
            try:
                details = await checkpoint_details(env.stub, job.id, checkpoint_id)
                await ack_all_by_hand(
                    env.stub, job.id, job.agent, checkpoint_id, details.summary.external_path
                )
                assert (await asyncio.wait_for(trigger, 10)).status == (
                    pb.CHECKPOINT_STATUS_COMPLETED
                )
            finally:
                await finish(trigger)
            await wait_until_async(lambda: not chk.exists(), "the retired checkpoint deleted")
            assert outside.read_bytes() == b"state"

    env.loop.run(main())

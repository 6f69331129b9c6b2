"""Reference counts of shared state files in a real Redis: register, release, reset, a reuse of
a file already released, and fencing."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest
from kit.checkpoints import JOB, make_checkpoint

from snapflow.coordinator.model import CompletedCheckpoint, OperatorSubtaskState, StateHandle
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.shared_state import (
    SHARED,
    SHARED_NEW,
    SharedStateMissingError,
    creator_id,
    shared_paths,
)
from snapflow.errors import StaleEpochError


def _checkpoint(cid: int, new: list[str], reused: list[str]) -> CompletedCheckpoint:
    base = make_checkpoint(f"/cp/{JOB}/chk-{cid}", [f"/cp/{JOB}/chk-{cid}/manifest"])
    handles = (
        *base.subtask_states[0].operator_states[0].handles,
        *(StateHandle(p, 10, SHARED_NEW, 0, 63) for p in new),
        *(StateHandle(p, 10, SHARED, 0, 63) for p in reused),
    )
    ack = dataclasses.replace(
        base.subtask_states[0], operator_states=(OperatorSubtaskState("v/keyed", handles),)
    )
    return dataclasses.replace(base, checkpoint_id=cid, subtask_states=(ack,))


def _sst(cid: int, n: int) -> str:
    return f"/cp/{JOB}/shared/v_keyed-chk{cid}-{'0' * 15}{n}-00000{n}.sst"


def test_references_follow_the_retained_checkpoints(redis_url: str) -> None:
    async def main() -> None:
        store = CheckpointStore.from_url(redis_url, namespace=f"shared-{uuid.uuid4().hex[:8]}")
        try:
            await store.acquire_epoch()
            shared = store.shared_state
            a, b, c = _sst(1, 1), _sst(1, 2), _sst(2, 3)
            one = _checkpoint(1, [a, b], [])
            two = _checkpoint(2, [c], [a])
            assert shared_paths(two) == ([c, a], [a])
            assert await shared.register(one) == 2
            assert await shared.register(one) == 2  # idempotent per checkpoint
            assert await shared.register(two) == 2
            assert await shared.referenced(JOB) == {a: 2, b: 1, c: 1}
            assert sorted(await shared.release(JOB, [1])) == [b]  # a is still needed by 2
            # A checkpoint based on 1 that completes only now cannot reuse b any more.
            late = _checkpoint(3, [], [b])
            with pytest.raises(SharedStateMissingError, match=b):
                await shared.register(late)
            assert await shared.referenced(JOB) == {a: 1, c: 1}
            assert sorted(await shared.release(JOB, [2, 2, 99])) == [a, c]
            assert await shared.referenced(JOB) == {}
            # A restart rebuilds the counts from the retained checkpoints only.
            await shared.register(one)
            await shared.register(two)
            await shared.reset(JOB, [two])
            assert await shared.referenced(JOB) == {a: 1, c: 1}
            assert sorted(await shared.release(JOB, [1])) == []
            # A newer coordinator fences this one off: nothing changes.
            newer = CheckpointStore.from_url(redis_url, namespace=store.namespace)
            await newer.acquire_epoch()
            with pytest.raises(StaleEpochError):
                await shared.release(JOB, [2])
            await newer.close()
            assert await shared.referenced(JOB) == {a: 1, c: 1}
            assert set(store.all_job_keys(JOB)) >= {
                store.shared_refs_key(JOB),
                store.shared_of_key(JOB),
            }
        finally:
            await store.close()

    asyncio.run(main())


def test_creator_ids_come_from_the_worker_naming() -> None:
    assert creator_id(_sst(12, 1)) == 12
    assert creator_id("s3://b/p/job/shared/x-chk7-0123456789abcdef-000042.sst") == 7
    assert creator_id(f"/cp/{JOB}/shared/elsewhere.sst") is None
    assert creator_id("/x-chk01-0123456789abcdef-1.sst") is None  # not a canonical id

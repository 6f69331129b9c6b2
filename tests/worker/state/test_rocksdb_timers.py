"""The RocksDB backend's timers in its database (``rocksdb_timers.py``): equal to the heap
backend's through registrations, deletions, firings, checkpoints and restores; carried by
incremental checkpoints (no timers file) across rescaling; portable through savepoints; and
restored from checkpoints of older versions, which wrote a timers file."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from kit.keyed_snapshots import snapshot_backends

from snapflow.checkpointing import (
    INCREMENTAL,
    SHARED,
    SHARED_NEW,
    TIMERS,
    BarrierOptions,
    StateHandle,
)
from snapflow.errors import StateError
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend
from snapflow.worker.state.rocksdb_layout import TIMER_STATE
from snapflow.worker.state.rocksdb_timers import read_timers
from snapflow.worker.state.snapshots import KeyedSnapshotWriter
from snapflow.worker.state.timers import Timer

MAXP = 64


def _rocks(tmp_path: Path, parallelism: int = 1, index: int = 0) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend.for_subtask(
        MAXP, parallelism, index, name="v/keyed", local_dir=str(tmp_path)
    )


def _checkpoint(b: RocksDBKeyedStateBackend, root: Path, cid: int) -> list[StateHandle]:
    target = str(root / "job" / f"chk-{cid}")
    snap = b.snapshot(cid, BarrierOptions(target_location=target))
    handles = snap.write(os.path.join(target, "v-0-1", "v/keyed"))
    snap.release()
    return handles


def _timers(b: KeyedStateBackend) -> list[tuple[int, Any, Any, int]]:
    return sorted((t.timestamp, repr(t.key), repr(t.namespace), t.key_group) for t in _all(b))


def _all(b: KeyedStateBackend) -> list[Timer]:
    return b.timer_service.timers()


def _in_database(b: RocksDBKeyedStateBackend) -> list[tuple[int, Any, Any, int]]:
    """The timers the database holds (flushed first), as :func:`_timers` lists them."""
    b.timer_mirror.flush()
    return sorted(
        (ts, repr(key), repr(ns), kg)
        for kg in b.key_group_range
        for ts, key, ns in read_timers(b.db, kg)
    )


def _fired(timers: list[Timer]) -> list[tuple[int, Any, Any]]:
    # Among equal timestamps the order is registration order, which a restore does not keep
    # (the heap backend's neither): compare each timestamp's timers as a set.
    assert [t.timestamp for t in timers] == sorted(t.timestamp for t in timers)
    return sorted((t.timestamp, repr(t.key), repr(t.namespace)) for t in timers)


@pytest.mark.parametrize("flush_at", [1, 7, 65_536])
def test_timers_match_the_heap_backend_through_checkpoints_and_restores(
    tmp_path: Path, flush_at: int
) -> None:
    rng = random.Random(flush_at)
    heap = KeyedStateBackend(MAXP, (0, MAXP - 1))
    rocks = _rocks(tmp_path)
    rocks.timer_mirror.flush_at = flush_at
    keys: list[Any] = [*range(30), *(f"k{i}" for i in range(30)), (1, "t")]
    registered: list[tuple[Any, int, Any]] = []
    watermark = 0
    try:
        for step in range(4000):
            op = rng.randrange(10)
            if op < 5:
                key, ts, ns = rng.choice(keys), watermark + rng.randrange(-5, 60), rng.randrange(3)
                registered.append((key, ts, ("op", ns)))
                for b in (heap, rocks):
                    b.set_current_key(key)
                    b.timer_service.register_event_time_timer(ts, ("op", ns))
            elif op < 7 and registered:
                key, ts, ns = registered.pop(rng.randrange(len(registered)))
                for b in (heap, rocks):
                    b.set_current_key(key)
                    b.timer_service.delete_event_time_timer(ts, ns)
            elif op < 9:
                watermark += rng.randrange(0, 12)
                fired = [b.timer_service.advance_watermark(watermark) for b in (heap, rocks)]
                assert _fired(fired[1]) == _fired(fired[0]), f"step {step}"
            if step % 400 == 399:
                # a checkpoint (or a savepoint) of each; both go on as their restored copies
                assert _timers(rocks) == _timers(heap) == _in_database(rocks)
                savepoint = step % 800 == 399
                handles = (
                    snapshot_backends([rocks], tmp_path / f"s{step}", step, savepoint=True)
                    if savepoint
                    else _checkpoint(rocks, tmp_path / f"c{step}", step)
                )
                assert (TIMERS in {h.kind for h in handles}) == savepoint
                heap_handles = snapshot_backends([heap], tmp_path / f"h{step}", step)
                rocks.dispose()
                rocks, heap = _rocks(tmp_path), KeyedStateBackend(MAXP, (0, MAXP - 1))
                rocks.timer_mirror.flush_at = flush_at
                rocks.restore(handles)
                heap.restore(heap_handles)
                assert _timers(rocks) == _timers(heap) == _in_database(rocks)
                # a restored service starts from no watermark: what is due fires on the next
                fired = [b.timer_service.advance_watermark(watermark) for b in (heap, rocks)]
                assert _fired(fired[1]) == _fired(fired[0]), f"step {step}"
        fired = [b.timer_service.advance_watermark(1 << 40) for b in (heap, rocks)]
        assert _fired(fired[1]) == _fired(fired[0])
        assert rocks.timer_service.num_timers() == 0 and _in_database(rocks) == []
        assert rocks.is_empty()
    finally:
        rocks.dispose()


def test_a_watermark_at_the_end_of_input_clears_every_timer(tmp_path: Path) -> None:
    rocks = _rocks(tmp_path)
    try:
        for k in range(100):
            rocks.set_current_key(k)
            rocks.timer_service.register_event_time_timer((1 << 63) - 1 - k % 2)
            rocks.timer_service.register_event_time_timer(-(1 << 63) + k)
        rocks.timer_mirror.flush()
        assert len(rocks.timer_service.advance_watermark((1 << 63) - 1)) == 200
        assert _in_database(rocks) == []
        with pytest.raises(StateError, match="int64"):
            rocks.timer_service.register_event_time_timer(1 << 63)
        assert rocks.timer_service.num_timers() == 0
    finally:
        rocks.dispose()


def test_the_timers_state_name_is_reserved(tmp_path: Path) -> None:
    rocks = _rocks(tmp_path)
    try:
        with pytest.raises(StateError, match="timers"):
            rocks.get_value_state(TIMER_STATE)
    finally:
        rocks.dispose()


def _subtasks(tmp_path: Path, parallelism: int) -> list[RocksDBKeyedStateBackend]:
    return [_rocks(tmp_path, parallelism, i) for i in range(parallelism)]


@pytest.mark.parametrize("savepoints", [False, True], ids=["incremental", "savepoint"])
def test_rescale_2_3_1_moves_the_timers_with_their_key_groups(
    tmp_path: Path, savepoints: bool
) -> None:
    keys = [f"key-{i}" for i in range(600)]
    expected: dict[tuple[str, int], Any] = {}
    two = _subtasks(tmp_path, 2)
    for b in two:
        for i, k in enumerate(keys):
            if b.key_group_of(k) in b.key_group_range:
                b.set_current_key(k)
                for ts in (i % 50, 100 + i % 50):
                    b.timer_service.register_event_time_timer(ts, ("op", ts // 10))
                    expected[(k, ts)] = ("op", ts // 10)
    handles = snapshot_backends(two, tmp_path / "a", 1, savepoints)
    assert (TIMERS in {h.kind for h in handles}) == savepoints
    three = _subtasks(tmp_path, 3)
    one = _subtasks(tmp_path, 1)
    try:
        for b in three:
            b.restore(handles)
            assert {(t.key, t.timestamp) for t in _all(b)} == {
                kt for kt in expected if b.key_group_of(kt[0]) in b.key_group_range
            }
            assert _timers(b) == _in_database(b)
            # the restored timers fire; new ones join them
            for t in b.timer_service.advance_watermark(49):
                del expected[(t.key, t.timestamp)]
            late = next(k for k in keys if b.key_group_of(k) in b.key_group_range)
            b.set_current_key(late)
            b.timer_service.register_event_time_timer(500, "late")
            expected[(late, 500)] = "late"
        assert min(ts for _, ts in expected) == 100
        handles = snapshot_backends(three, tmp_path / "b", 2, savepoints)
        one[0].restore(handles)
        fired = one[0].timer_service.advance_watermark(1000)
        assert {(t.key, t.timestamp): t.namespace for t in fired} == expected
        assert len(fired) == len(expected) and _in_database(one[0]) == []
    finally:
        for b in [*two, *three, *one]:
            b.dispose()


def test_savepoints_carry_timers_between_heap_and_rocksdb(tmp_path: Path) -> None:
    heap = KeyedStateBackend.for_subtask(MAXP, 1, 0)
    for k in range(300):
        heap.set_current_key(k)
        heap.timer_service.register_event_time_timer(k % 40, ("w", k % 3))
    rocks = _rocks(tmp_path)
    back = KeyedStateBackend.for_subtask(MAXP, 1, 0)
    copy = _rocks(tmp_path)
    try:
        rocks.restore(snapshot_backends([heap], tmp_path / "h", 1, savepoint=True))
        assert _timers(rocks) == _timers(heap) == _in_database(rocks)
        # then the restored timers are the database's: an incremental checkpoint has them
        copy.restore(_checkpoint(rocks, tmp_path / "c", 2))
        assert _timers(copy) == _timers(heap)
        back.restore(snapshot_backends([copy], tmp_path / "r", 3, savepoint=True))
        assert _timers(back) == _timers(heap)
        for watermark in (10, 25, 100):
            fired = [b.timer_service.advance_watermark(watermark) for b in (heap, copy, back)]
            assert _fired(fired[1]) == _fired(fired[0]) == _fired(fired[2])
    finally:
        rocks.dispose()
        copy.dispose()


def test_a_checkpoint_with_a_timers_file_still_restores(tmp_path: Path) -> None:
    """Older versions kept the timers on the heap and wrote them beside the manifest."""
    old = _rocks(tmp_path)
    heap = KeyedStateBackend.for_subtask(MAXP, 1, 0)  # the old timers, as the heap held them
    restored = _rocks(tmp_path)
    again = _rocks(tmp_path)
    try:
        old.get_value_state("v").update_many(list(range(50)), list(range(50)))
        for k in range(50):
            heap.set_current_key(k)
            heap.timer_service.register_event_time_timer(k, ("op", k % 2))
        handles = _checkpoint(old, tmp_path / "old", 1)
        assert {h.kind for h in handles} == {INCREMENTAL, SHARED_NEW}
        target = str(tmp_path / "old" / "job" / "chk-1" / "v-0-1" / "v/keyed")
        timers_file = KeyedSnapshotWriter(
            1, MAXP, old.key_group_range, old.name, {}, heap.timer_service.freeze()
        )(target)
        assert [h.kind for h in timers_file] == [TIMERS]
        restored.restore([*handles, *timers_file])
        assert dict(restored.entries("v")) == {k: k for k in range(50)}
        assert _timers(restored) == _timers(heap) == _in_database(restored)
        # the next checkpoint has them in its SST files
        again.restore(_checkpoint(restored, tmp_path / "new", 2))
        assert _timers(again) == _timers(heap)
    finally:
        for b in (old, restored, again):
            b.dispose()


def _new_and_reused(handles: list[StateHandle]) -> tuple[int, int]:
    return (
        sum(h.size_bytes for h in handles if h.kind == SHARED_NEW),
        sum(h.size_bytes for h in handles if h.kind == SHARED),
    )


def test_a_checkpoint_after_a_few_timer_changes_uploads_only_new_files(tmp_path: Path) -> None:
    rocks = _rocks(tmp_path)
    try:
        for k in range(30_000):
            rocks.set_current_key(k)
            rocks.timer_service.register_event_time_timer(1000 + k % 100, ("window", k % 100))
        first = _checkpoint(rocks, tmp_path, 1)
        rocks.notify_checkpoint_complete(1)
        uploaded, _ = _new_and_reused(first)
        assert uploaded > 30_000  # every timer is an entry of the uploaded SST files
        rocks.set_current_key(7)
        rocks.timer_service.register_event_time_timer(5)
        rocks.timer_service.delete_event_time_timer(1007, ("window", 7))
        assert len(rocks.timer_service.advance_watermark(1001)) == 600 + 1
        second = _checkpoint(rocks, tmp_path, 2)
        new, reused = _new_and_reused(second)
        assert reused >= uploaded and 0 < new < uploaded / 20
        copy = _rocks(tmp_path)
        try:
            copy.restore(second)
            assert _timers(copy) == _timers(rocks) == _in_database(copy)
            assert copy.timer_service.num_timers() == 30_000 - 600 - 1
        finally:
            copy.dispose()
    finally:
        rocks.dispose()


def test_export_and_ingest_carry_the_timers(tmp_path: Path) -> None:
    source = _rocks(tmp_path)
    target = _rocks(tmp_path, 2, 0)
    try:
        for k in range(200):
            source.set_current_key(k)
            source.timer_service.register_event_time_timer(k)
        path = str(tmp_path / "half.sst")
        assert source.export_key_groups(target.key_group_range, path) > 0
        target.ingest_key_groups([path], source.state_kinds())
        mine = [t for t in _timers(source) if t[3] in target.key_group_range]
        assert mine and _timers(target) == mine == _in_database(target)
    finally:
        source.dispose()
        target.dispose()


def test_end_of_data_writes_everything_pending_and_the_next_checkpoint_restores_it(
    tmp_path: Path,
) -> None:
    """At the end of a task's data the backend writes its cache, its timer changes and its
    memtable (``end_of_data``), so the final checkpoint's synchronous part has nothing left;
    what that checkpoint holds is unchanged."""
    b = _rocks(tmp_path / "a")
    try:
        value = b.get_value_state("v", 0)
        for k in range(500):
            b.set_current_key(k)
            value.update(k * 2)
            b.timer_service.register_event_time_timer(1_000 + k, ("op", k % 3))
        b.timer_service.advance_watermark(1_100)  # fires 101 timers: range deletions pending
        assert b.dirty and b.timer_mirror.pending
        b.end_of_data()
        assert not b.dirty and b.timer_mirror.pending == 0
        expected = _timers(b)
        handles = _checkpoint(b, tmp_path / "cp", 1)
    finally:
        b.dispose()
    restored = _rocks(tmp_path / "b")
    try:
        restored.restore(handles)
        assert _timers(restored) == expected and len(expected) == 399
        restored.set_current_key(321)
        assert restored.get_value_state("v", 0).value() == 642
    finally:
        restored.dispose()

"""The disk (RocksDB) keyed state backend against the heap backend as its oracle; incremental
checkpoints, key-group export and ingest, rescaling, savepoint portability, broken shared
files."""

from __future__ import annotations

import contextlib
import operator
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kit.keyed_snapshots import snapshot_backends

from snapflow.checkpointing import (
    INCREMENTAL,
    SHARED,
    SHARED_NEW,
    BarrierOptions,
    StateHandle,
)
from snapflow.coordinator import shared_state as coordinator_shared
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.errors import InvalidArgumentError, StorageError
from snapflow.filestore_registry import store_for
from snapflow.state_backend_options import ROCKSDB, StateBackendOptions
from snapflow.worker.state import factory
from snapflow.worker.state import keyed_backend as heap_module
from snapflow.worker.state.errors import CorruptStateError, IncompatibleStateError
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keygroups import KeyGroupRange, key_group_range_for_subtask
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend
from snapflow.worker.state.rocksdb_snapshots import shared_dir_for
from snapflow.worker.state.rocksdb_state import RocksStore

MAXP = 128


@pytest.fixture
def rocks(tmp_path: Path) -> Iterator[RocksDBKeyedStateBackend]:
    backend = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), name="v/keyed", local_dir=str(tmp_path))
    yield backend
    backend.dispose()


def test_the_backend_is_the_store_its_states_use(rocks: RocksDBKeyedStateBackend) -> None:
    """The states reach their backend through the ``RocksStore`` protocol (``rocksdb_state.py``
    cannot import the backend): mypy checks this assignment, the tests below the behaviour."""
    store: RocksStore = rocks
    assert store.db is rocks.db


def _states(b: KeyedStateBackend) -> dict[str, Any]:
    return {
        "value": b.get_value_state("value", 0),
        "list": b.get_list_state("list"),
        "map": b.get_map_state("map"),
        "reducing": b.get_reducing_state("reducing", operator.add),
        "aggregating": b.get_aggregating_state(
            "aggregating", lambda v, acc: [acc[0] + v, acc[1] + 1], tuple, lambda: [0, 0]
        ),
    }


def _everything(b: KeyedStateBackend) -> dict[str, Any]:
    out: dict[str, Any] = {name: dict(b.entries(name)) for name in b.state_names()}
    out["timers"] = sorted(
        repr((t.timestamp, t.key, t.namespace)) for t in b.timer_service.timers()
    )
    return out


def _step(rng: random.Random, b: KeyedStateBackend, states: dict[str, Any], key: Any) -> Any:
    """One random operation on ``key``; returns what it read (compared between backends)."""
    b.set_current_key(key)
    op = rng.randrange(16)
    v = rng.randrange(100)
    s = states
    if op == 0:
        s["value"].update(v)
    elif op == 1:
        return s["value"].value()
    elif op == 2:
        s["list"].add(v)
    elif op == 3:
        return s["list"].get()
    elif op == 4:
        s["map"].put(v % 5, v)
    elif op == 5:
        s["map"].remove(v % 5)
    elif op == 6:
        return sorted(s["map"].items())
    elif op == 7:
        s["reducing"].add(v)
    elif op == 8:
        return s["reducing"].get()
    elif op == 9:
        s["aggregating"].add(v)
    elif op == 10:
        return s["aggregating"].get()
    elif op == 11:
        s[rng.choice(["value", "list", "map", "reducing", "aggregating"])].clear()
    elif op == 12:
        b.timer_service.register_event_time_timer(v, namespace=v % 3)
    elif op == 13:
        s["list"].update([v, v + 1] if v % 2 else [])
    elif op == 14:
        b.timer_service.delete_event_time_timer(v, namespace=v % 3)
    elif v < 10:  # now and then a watermark: the timers up to it fire
        watermark = max(b.timer_service.current_watermark, 0) + v
        return sorted(repr(t) for t in b.timer_service.advance_watermark(watermark))
    return None


def test_random_operations_match_the_heap_backend_with_snapshots_between(
    rocks: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    heap = KeyedStateBackend(MAXP, (0, MAXP - 1))
    rng_heap, rng_rocks = random.Random(5), random.Random(5)
    heap_states, rocks_states = _states(heap), _states(rocks)
    keys: list[Any] = [*range(40), *(f"k{i}" for i in range(40)), (1, "t"), b"raw"]
    for step in range(3000):
        key = keys[step % len(keys) if step % 3 else random.Random(step).randrange(len(keys))]
        got_heap = _step(rng_heap, heap, heap_states, key)
        got_rocks = _step(rng_rocks, rocks, rocks_states, key)
        assert got_rocks == got_heap, f"step {step}: {got_rocks!r} != {got_heap!r}"
        if step % 500 == 499:
            # a snapshot in between changes nothing and holds exactly the state as of it
            assert _everything(rocks) == _everything(heap)
            snap = rocks.snapshot(step)
            handles = snap.write(str(tmp_path / f"snap-{step}"))
            snap.release()
            copy = KeyedStateBackend(MAXP, (0, MAXP - 1))
            copy.restore(handles)
            assert _everything(copy) == _everything(heap)
    for name in heap.state_names():
        assert len(rocks_states[name]) == len(heap_states[name]), name


@contextlib.contextmanager
def _rocks_and_heap(
    tmp_path: Path, cache_entries: int
) -> Iterator[tuple[RocksDBKeyedStateBackend, KeyedStateBackend]]:
    """A RocksDB backend with ``cache_entries`` and a heap backend over every key group."""
    rocks = RocksDBKeyedStateBackend(
        MAXP, (0, MAXP - 1), local_dir=str(tmp_path), cache_entries=cache_entries
    )
    try:
        yield rocks, KeyedStateBackend(MAXP, (0, MAXP - 1))
    finally:
        rocks.dispose()


@pytest.mark.parametrize("cache_entries", [0, 7, 100_000])
def test_bulk_api_matches_the_heap_backend_at_every_cache_size(
    tmp_path: Path, cache_entries: int
) -> None:
    with _rocks_and_heap(tmp_path, cache_entries) as (rocks, heap):
        rng = random.Random(cache_entries)
        for b in (heap, rocks):
            b.get_reducing_state("count", operator.add)
            b.get_value_state("last")
        for _ in range(30):
            keys = pa.array([rng.randrange(200) for _ in range(300)], pa.int64())
            values = [rng.randrange(10) for _ in range(300)]
            results = []
            for b in (heap, rocks):
                count = b.get_reducing_state("count", operator.add)
                last = b.get_value_state("last")
                count.add_many(keys, values)  # repeated keys fold in order
                last.update_many(keys, [None if v == 0 else v for v in values])
                results.append((count.get_many(keys), last.get_many(keys)))
                assert count.add_batch(keys) == len(set(keys.to_pylist()))
            assert results[0] == results[1]
        assert _everything(rocks) == _everything(heap)


@pytest.mark.parametrize("cache_entries", [0, 7, 100_000])
def test_pop_many_reads_and_clears_as_the_heap_backend_at_every_cache_size(
    tmp_path: Path, cache_entries: int
) -> None:
    # a fired window's aggregate and rows: (key, window) composites, read and cleared in bulk
    with _rocks_and_heap(tmp_path, cache_entries) as (rocks, heap):
        rng = random.Random(cache_entries)
        for _ in range(20):
            keys = [(rng.randrange(50), rng.randrange(3) * 10) for _ in range(100)]
            popped = [(rng.randrange(60), rng.randrange(3) * 10) for _ in range(40)]
            popped += popped[:5]  # a repeated key: None after its first
            results = []
            for b in (heap, rocks):
                count = b.get_reducing_state("count", operator.add)
                rows = b.get_list_state("rows")
                count.add_many(keys, [1] * len(keys))
                for i, key in enumerate(keys):
                    b.set_current_key(key)
                    rows.add(i)
                results.append((count.pop_many(popped), rows.pop_many(popped)))
                assert count.get_many(popped) == [None] * len(popped)
                assert rows.pop_many(popped) == [[]] * len(popped)
            assert results[0] == results[1]
            counts, lists = results[0]
            assert any(v is not None for v in counts) and counts[-5:] == [None] * 5
            assert [len(v) for v in lists] == [v or 0 for v in counts]
            assert _everything(rocks) == _everything(heap)


def test_checkpoints_are_incremental_and_restore_whole(
    rocks: RocksDBKeyedStateBackend, tmp_path: Path
) -> None:
    location = str(tmp_path / "cp" / "job" / "chk-1")
    count = rocks.get_reducing_state("count", operator.add)
    keys = list(range(20_000))
    count.add_many(keys, [1] * len(keys))
    rocks.set_current_key(3)
    rocks.timer_service.register_event_time_timer(50)

    def checkpoint(cid: int) -> list[StateHandle]:
        target = str(tmp_path / "cp" / "job" / f"chk-{cid}")
        snap = rocks.snapshot(cid, BarrierOptions(target_location=target))
        handles = snap.write(os.path.join(target, "count-0-1", "v/keyed"))
        snap.release()
        return handles

    first = checkpoint(1)
    kinds = sorted(h.kind for h in first)
    assert kinds == [INCREMENTAL, SHARED_NEW]  # the timer is an entry of the SST files
    new_bytes = sum(h.size_bytes for h in first if h.kind == SHARED_NEW)
    # not confirmed yet: the next checkpoint uploads its files again (Flink does the same)
    again = checkpoint(2)
    assert [h.kind for h in again].count(SHARED) == 0
    rocks.notify_checkpoint_complete(2)
    count.add_many(keys[:100], [1] * 100)
    third = checkpoint(3)
    reused = [h for h in third if h.kind == SHARED]
    uploaded = [h for h in third if h.kind == SHARED_NEW]
    assert reused and {h.path for h in reused} <= {h.path for h in again}
    assert 0 < sum(h.size_bytes for h in uploaded) < new_bytes / 5
    for h in [*reused, *uploaded]:
        assert h.path.startswith(shared_dir_for(location) + os.sep)
        assert coordinator_shared.creator_id(h.path) == (3 if h in uploaded else 2)
    # The same key groups restore from the files as they are; another backend sees it all.
    restored = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path))
    try:
        assert restored.restore(third) == MAXP  # every key group (the timers among them)
        assert _everything(restored) == _everything(rocks)
    finally:
        restored.dispose()
    heap = KeyedStateBackend(MAXP, (0, MAXP - 1))
    with pytest.raises(IncompatibleStateError, match="rocksdb"):
        heap.restore(third)


def _subtask_backends(tmp_path: Path, parallelism: int) -> list[RocksDBKeyedStateBackend]:
    return [
        RocksDBKeyedStateBackend.for_subtask(
            MAXP, parallelism, i, name="v/keyed", local_dir=str(tmp_path)
        )
        for i in range(parallelism)
    ]


@pytest.mark.parametrize("savepoints", [False, True], ids=["incremental", "savepoint"])
def test_rescale_2_3_1_keeps_every_key_exactly_once(tmp_path: Path, savepoints: bool) -> None:
    keys = [f"key-{i}" for i in range(3000)]
    expected = {k: i % 7 + 1 for i, k in enumerate(keys)}
    two = _subtask_backends(tmp_path, 2)
    for b in two:
        mine = [k for k in keys if b.key_group_of(k) in b.key_group_range]
        b.get_reducing_state("count", operator.add).add_many(mine, [expected[k] for k in mine])
        b.get_map_state("seen")
        for k in mine[:50]:
            b.set_current_key(k)
            b.get_map_state("seen").put("first", k)
    handles = snapshot_backends(two, tmp_path / "a", 1, savepoints)
    three = _subtask_backends(tmp_path, 3)
    for b in three:
        b.restore(handles)
    handles = snapshot_backends(three, tmp_path / "b", 2, savepoints)
    one = _subtask_backends(tmp_path, 1)
    one[0].restore(handles)
    try:
        seen: dict[str, int] = {}
        for b in three:
            for k, v in b.entries("count"):
                assert k not in seen, f"{k} in two subtasks"
                assert b.key_group_of(k) in b.key_group_range
                seen[k] = v
        assert seen == expected
        assert dict(one[0].entries("count")) == expected
        assert len(dict(one[0].entries("seen"))) == 100
    finally:
        for b in [*two, *three, *one]:
            b.dispose()


def test_savepoints_move_between_heap_and_disk_at_another_parallelism(tmp_path: Path) -> None:
    heaps = [KeyedStateBackend.for_subtask(MAXP, 2, i) for i in range(2)]
    for b in heaps:
        for k in range(500):
            if b.key_group_of(k) not in b.key_group_range:
                continue
            b.set_current_key(k)
            b.get_value_state("v").update(k * 2)
            b.get_list_state("l").add_all([k, k])
            b.get_map_state("m").put_all({"a": k})
            b.timer_service.register_event_time_timer(k)
    heap_handles = snapshot_backends(heaps, tmp_path / "h", 1, savepoint=True)
    disks = _subtask_backends(tmp_path, 3)
    for b in disks:
        b.restore(heap_handles)
    disk_handles = snapshot_backends(disks, tmp_path / "d", 2, savepoint=True)
    assert {h.kind for h in disk_handles} == {"keyed", "timers"}  # canonical, self-contained
    back = KeyedStateBackend(MAXP, (0, MAXP - 1))
    back.restore(disk_handles)
    merged: dict[str, Any] = {}
    for b in heaps:
        for name, entries in _everything(b).items():
            if name == "timers":
                merged.setdefault(name, []).extend(entries)
            else:
                merged.setdefault(name, {}).update(entries)
    merged["timers"].sort()
    assert _everything(back) == merged
    for b in disks:
        b.dispose()


def test_key_group_range_export_and_ingest(rocks: RocksDBKeyedStateBackend, tmp_path: Path) -> None:
    rocks.get_reducing_state("count", operator.add).add_many(range(1000), [1] * 1000)
    half = KeyGroupRange(0, 63)
    path = str(tmp_path / "half.sst")
    exported = rocks.export_key_groups(half, path)
    in_half = {k for k in range(1000) if rocks.key_group_of(k) in half}
    assert exported == len(in_half)
    target = RocksDBKeyedStateBackend(MAXP, half, local_dir=str(tmp_path))
    other = RocksDBKeyedStateBackend(MAXP, (64, 127), local_dir=str(tmp_path))
    try:
        target.ingest_key_groups([path], rocks.state_kinds())
        assert dict(target.entries("count")) == dict.fromkeys(in_half, 1)
        again = str(tmp_path / "again.sst")
        rocks.export_key_groups(half, again)
        with pytest.raises(IncompatibleStateError, match="outside"):
            other.ingest_key_groups([again])
        assert other.is_empty()
        assert rocks.export_key_groups(KeyGroupRange.empty(), str(tmp_path / "none.sst")) == 0
    finally:
        target.dispose()
        other.dispose()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_missing_or_corrupt_shared_file_is_named(
    rocks: RocksDBKeyedStateBackend, tmp_path: Path, damage: str
) -> None:
    rocks.get_reducing_state("count", operator.add).add_many(range(500), [1] * 500)
    handles = snapshot_backends([rocks], tmp_path / "cp", 1)
    victim = next(h.path for h in handles if h.kind == SHARED_NEW)
    if damage == "missing":
        os.unlink(victim)
    else:
        data = bytearray(Path(victim).read_bytes())
        data[len(data) // 2] ^= 0xFF
        Path(victim).write_bytes(bytes(data))
    target = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path))
    error = StorageError if damage == "missing" else CorruptStateError
    try:
        with pytest.raises(error, match=f"shared state file {victim}"):
            target.restore(handles)
    finally:
        target.dispose()


def test_restore_refuses_a_kind_change_and_overlapping_snapshots(tmp_path: Path) -> None:
    source = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path))
    source.get_value_state("s").update_many(range(10), range(10))
    handles = snapshot_backends([source], tmp_path / "cp", 1)
    target = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path))
    twice = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path))
    try:
        target.restore(handles)
        with pytest.raises(IncompatibleStateError, match="value state"):
            target.get_list_state("s")
        with pytest.raises(CorruptStateError, match="not one snapshot"):
            twice.restore(handles + handles)
    finally:
        for b in (source, target, twice):
            b.dispose()


def test_dispose_removes_the_local_files(tmp_path: Path) -> None:
    backend = factory.create_keyed_backend(
        factory.StateBackendConfig(kind=ROCKSDB, local_dir=str(tmp_path)), MAXP, 2, 1
    )
    assert isinstance(backend, RocksDBKeyedStateBackend)
    assert backend.key_group_range == key_group_range_for_subtask(MAXP, 2, 1)
    assert os.path.isdir(backend.local_path)
    backend.dispose()
    assert not os.path.exists(backend.local_path)
    assert type(factory.create_keyed_backend(None, MAXP, 1, 0)) is KeyedStateBackend


def test_the_coordinator_and_the_worker_agree_on_names(tmp_path: Path) -> None:
    """The coordinator never imports the worker: the names they share are checked here."""
    storage = CheckpointStorage(str(tmp_path))
    job = "0123456789abcdef0123456789abcdef"
    assert shared_dir_for(storage.checkpoint_dir(job, 7)) == storage.shared_dir(job)
    s3 = CheckpointStorage("s3://bucket-name/prefix")
    assert shared_dir_for(s3.checkpoint_dir(job, 7)) == s3.shared_dir(job)
    assert (coordinator_shared.SHARED, coordinator_shared.SHARED_NEW) == (SHARED, SHARED_NEW)
    assert heap_module.INCREMENTAL == INCREMENTAL


@pytest.mark.parametrize("style", ["universal", "level"])
def test_each_compaction_style_checkpoints_incrementally(tmp_path: Path, style: str) -> None:
    """The configured style reaches RocksDB (its OPTIONS file says so); with a trigger of 2
    runs, compactions replace files between checkpoints, later checkpoints reuse what is left
    (uploaded 3 at a time) and the last one restores every value."""
    config = factory.StateBackendConfig(
        kind=ROCKSDB,
        local_dir=str(tmp_path / "local"),
        options=StateBackendOptions(compaction_style=style, compaction_trigger=2, upload_threads=3),
    )
    backend = factory.create_keyed_backend(config, MAXP, 1, 0, name="v/keyed")
    assert isinstance(backend, RocksDBKeyedStateBackend)
    db_dir = os.path.join(backend.local_path, "db")
    options = [n for n in os.listdir(db_dir) if n.startswith("OPTIONS-")]
    with open(os.path.join(db_dir, max(options))) as f:
        text = f.read()
    expected = {"universal": "kCompactionStyleUniversal", "level": "kCompactionStyleLevel"}
    assert f"compaction_style={expected[style]}" in text
    assert "level0_file_num_compaction_trigger=2" in text
    state = backend.get_value_state("v")
    rng = random.Random(11)
    values: dict[int, int] = {}
    kinds: list[set[str]] = []
    handles: list[StateHandle] = []
    paths: list[set[str]] = []
    try:
        for cid in range(1, 7):
            keys = rng.sample(range(20_000), 4_000)
            state.update_many(keys, [k * cid for k in keys])
            values.update({k: k * cid for k in keys})
            handles = snapshot_backends([backend], tmp_path / "cp", cid)
            backend.notify_checkpoint_complete(cid)
            kinds.append({h.kind for h in handles})
            paths.append({h.path for h in handles if h.kind in (SHARED, SHARED_NEW)})
        assert kinds[0] == {SHARED_NEW, INCREMENTAL}
        assert any(SHARED in k for k in kinds[1:]), kinds
        assert paths[0] - paths[-1], "compactions replaced the first checkpoint's files"
        restored = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path / "r"))
        try:
            restored.restore(handles)
            assert dict(restored.entries("v")) == values
        finally:
            restored.dispose()
    finally:
        backend.dispose()


def test_bad_tuning_is_refused_with_what_to_fix() -> None:
    with pytest.raises(
        InvalidArgumentError, match="compaction_style 'fifo' is not one of level, universal"
    ):
        factory.StateBackendConfig(
            kind=ROCKSDB, options=StateBackendOptions(compaction_style="fifo")
        )
    with pytest.raises(InvalidArgumentError, match=r"upload_threads 0 is outside \[1, "):
        factory.StateBackendConfig(kind=ROCKSDB, options=StateBackendOptions(upload_threads=0))
    with pytest.raises(InvalidArgumentError, match=r"compaction_trigger 1 is outside \[2, "):
        factory.StateBackendConfig(options=StateBackendOptions(compaction_trigger=1))
    with pytest.raises(InvalidArgumentError, match="memory_budget_bytes 0 is outside"):
        factory.StateBackendConfig(options=StateBackendOptions(memory_budget_bytes=0))


def test_incremental_checkpoints_stream_to_s3_and_restore(tmp_path: Path, s3_bucket: str) -> None:
    # Shared SSTs go up with put_file and come back streamed; the counts are the requests made.
    store = store_for(f"s3://{s3_bucket}")
    source = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), name="v/keyed", local_dir=str(tmp_path))
    target = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), name="v/keyed", local_dir=str(tmp_path))
    try:
        count = source.get_reducing_state("count", operator.add)
        count.add_many(range(5000), [1] * 5000)
        location = f"s3://{s3_bucket}/cp/job/chk-1"
        before = store.requests.snapshot()
        snap = source.snapshot(1, BarrierOptions(target_location=location))
        handles = snap.write(f"{location}/v-0-1")
        snap.release()
        ssts = [h for h in handles if h.kind == SHARED_NEW]
        assert ssts and all(
            str(h.path).startswith(f"s3://{s3_bucket}/cp/job/shared/") for h in ssts
        )
        puts = store.requests.snapshot()["put"] - before["put"]
        assert puts >= len(ssts) + 1  # each SST, and the manifest
        gets = store.requests.snapshot()["get"]
        assert target.restore(handles) == MAXP  # every key group (no timers)
        # one GET per SST (streamed whole) plus the manifest's read
        assert store.requests.snapshot()["get"] - gets >= len(ssts)
        assert _everything(target) == _everything(source)
    finally:
        source.dispose()
        target.dispose()

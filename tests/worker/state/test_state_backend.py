"""The worker's state backends: keyed state, timers, operator state, snapshots and restore."""

from __future__ import annotations

import itertools
import operator
import os
import random
import struct
import threading
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from snapflow.checkpointing import StateHandle
from snapflow.errors import SnapflowError, StateError, StorageError
from snapflow.filestore_registry import store_for
from snapflow.worker.state.errors import (
    CorruptStateError,
    IncompatibleStateError,
    KeyGroupRangeError,
    StateFormatVersionError,
)
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import aggregate_batch
from snapflow.worker.state.keygroups import (
    KeyGroupRange,
    key_group_for_key,
    operator_index_for_key_group,
)
from snapflow.worker.state.operator_state import OperatorStateBackend
from snapflow.worker.state.state_files import MergedStateObject
from snapflow.worker.state.timers import Timer

MAX_P = 128


def full_backend() -> KeyedStateBackend:
    return KeyedStateBackend(MAX_P, KeyGroupRange(0, MAX_P - 1))


def avg_state(backend: KeyedStateBackend) -> Any:
    """An aggregating state whose accumulator is a mutable list [sum, count]."""

    def add(value: int, acc: list[int]) -> list[int]:
        acc[0] += value
        acc[1] += 1
        return acc

    return backend.get_aggregating_state("avg", add, lambda acc: acc[0] / acc[1], lambda: [0, 0])


def dump(backend: KeyedStateBackend) -> dict[str, dict[Any, Any]]:
    return {name: dict(backend.entries(name)) for name in backend.state_names()}


# ---------------------------------------------------------------------------------------------
# State types
# ---------------------------------------------------------------------------------------------


def test_value_state() -> None:
    b = full_backend()
    v = b.get_value_state("v", default=0)
    b.set_current_key("a")
    assert v.value() == 0
    v.update(5)
    b.set_current_key("b")
    assert v.value() == 0
    v.update(7)
    b.set_current_key("a")
    assert v.value() == 5
    v.clear()
    assert v.value() == 0
    assert dict(b.entries("v")) == {"b": 7}
    assert b.current_key == "a" and b.current_key_group == key_group_for_key("a", MAX_P)
    b.set_current_key("b")
    v.update(None)  # None clears, as in Flink
    assert v.value() == 0 and len(v) == 0
    v.update_many(["x", "y", "x"], [1, 2, None])
    assert dict(b.entries("v")) == {"y": 2}


def test_list_state() -> None:
    b = full_backend()
    lst = b.get_list_state("l")
    b.set_current_key(1)
    assert lst.get() == []
    lst.add("x")
    lst.add_all(["y", "z"])
    assert lst.get() == ["x", "y", "z"]
    lst.get().append("not stored")  # get() returns a copy
    assert lst.get() == ["x", "y", "z"]
    lst.update(["only"])
    assert lst.get() == ["only"]
    lst.update([])
    assert lst.get() == [] and len(lst) == 0
    lst.add_all([])
    assert len(lst) == 0


def test_map_state() -> None:
    b = full_backend()
    m = b.get_map_state("m")
    b.set_current_key("k")
    assert m.is_empty() and m.get("a") is None and m.get("a", 1) == 1
    m.put("a", 1)
    m.put_all({"b": 2, "c": 3})
    assert m.contains("b") and not m.contains("z")
    assert sorted(m.keys()) == ["a", "b", "c"]
    assert sorted(m.values()) == [1, 2, 3]
    assert sorted(m.items()) == [("a", 1), ("b", 2), ("c", 3)]
    m.remove("b")
    m.remove("missing")
    assert sorted(m.keys()) == ["a", "c"]
    m.remove("a")
    m.remove("c")
    assert m.is_empty() and len(m) == 0  # an empty map leaves no entry
    m.put("a", 1)
    m.clear()
    assert m.is_empty()


def test_reducing_state() -> None:
    b = full_backend()
    r = b.get_reducing_state("sum", operator.add)
    b.set_current_key("k")
    assert r.get() is None
    for x in (1, 2, 3):
        r.add(x)
    assert r.get() == 6
    r.clear()
    assert r.get() is None


def test_aggregating_state() -> None:
    b = full_backend()
    avg = avg_state(b)
    b.set_current_key("k")
    assert avg.get() is None
    for x in (1, 2, 6):
        avg.add(x)
    assert avg.get() == 3
    b.set_current_key("other")
    avg.add(10)
    assert avg.get() == 10


def test_state_registration_rules() -> None:
    b = full_backend()
    v1 = b.get_value_state("s")
    b.set_current_key(1)
    v1.update(1)
    assert b.get_value_state("s").value() == 1  # same name, same state
    with pytest.raises(IncompatibleStateError):
        b.get_list_state("s")
    with pytest.raises(StateError):
        b.get_value_state("")
    assert b.state_names() == ["s"]


def test_access_without_current_key_is_refused() -> None:
    b = full_backend()
    v = b.get_value_state("v")
    with pytest.raises(StateError, match="no current key"):
        v.value()
    with pytest.raises(StateError, match="no current key"):
        b.get_list_state("l").add(1)
    with pytest.raises(StateError, match="no current key"):
        b.timer_service.register_event_time_timer(1)


def test_key_outside_the_key_group_range_is_refused() -> None:
    b = KeyedStateBackend.for_subtask(MAX_P, 3, 0)
    assert b.key_group_range == KeyGroupRange(0, 42)
    outside = next(k for k in range(1000) if key_group_for_key(k, MAX_P) > 42)
    inside = next(k for k in range(1000) if key_group_for_key(k, MAX_P) <= 42)
    with pytest.raises(KeyGroupRangeError, match="outside this backend's key groups"):
        b.set_current_key(outside)
    with pytest.raises(KeyGroupRangeError):
        b.get_value_state("v").update_many([inside, outside], [1, 2])
    with pytest.raises(KeyGroupRangeError):
        b.get_value_state("v").get_many([inside], key_groups=[100])
    assert issubclass(KeyGroupRangeError, StateError)
    assert issubclass(StateError, SnapflowError)
    with pytest.raises(StateError):
        KeyedStateBackend(MAX_P, (0, MAX_P))  # range beyond max parallelism


# ---------------------------------------------------------------------------------------------
# Bulk (vectorised) API
# ---------------------------------------------------------------------------------------------


def test_bulk_keyed_count_over_an_arrow_batch() -> None:
    b = full_backend()
    counts = b.get_reducing_state("count", operator.add)
    rng = random.Random(7)
    rows = [rng.randrange(10_000) for _ in range(65_536)]
    distinct = counts.add_batch(pa.array(rows, pa.int64()))
    assert distinct == len(set(rows))
    counts.add_batch(pa.array(rows[:100], pa.int64()))
    expected = Counter(rows) + Counter(rows[:100])
    assert dict(b.entries("count")) == dict(expected)
    assert counts.get_many([rows[0], -1]) == [expected[rows[0]], None]


def test_bulk_sum_with_values_and_string_keys() -> None:
    b = full_backend()
    sums = b.get_reducing_state("sum", operator.add)
    keys = pa.array(["a", "b", "a", "c", "a"])
    values = pa.array([1, 2, 3, 4, 5])
    sums.add_batch(keys, values)
    sums.add_batch(keys.slice(0, 2), values.slice(0, 2))
    assert dict(b.entries("sum")) == {"a": 10, "b": 4, "c": 4}
    b.set_current_key("a")
    sums.add(1)  # record-at-a-time and bulk share the state
    assert sums.get() == 11
    distinct, partials = aggregate_batch(keys, values, "max")
    assert distinct.to_pylist() == ["a", "b", "c"] and partials.to_pylist() == [5, 2, 4]


def test_bulk_value_and_aggregating_state() -> None:
    b = KeyedStateBackend.for_subtask(MAX_P, 2, 1)
    keys = [k for k in range(2000) if key_group_for_key(k, MAX_P) >= 64][:500]
    v = b.get_value_state("v", default=-1)
    v.update_many(pa.array(keys, pa.int64()), [k * 2 for k in keys])
    v.update_many([keys[0], keys[0]], ["first", "last"])  # the last value wins
    got = v.get_many([*keys, keys[1]])
    assert got[0] == "last" and got[1:] == [k * 2 for k in keys[1:]] + [keys[1] * 2]  # type: ignore[comparison-overlap]  # an int state given a str on purpose
    groups = [key_group_for_key(k, MAX_P) for k in keys]
    assert v.get_many(keys, key_groups=groups) == got[:-1]
    avg = avg_state(b)
    avg.add_many(keys * 2, [1] * len(keys) + [3] * len(keys))
    assert avg.get_many(keys[:3]) == [2, 2, 2]
    with pytest.raises(StateError, match="keys but"):
        v.update_many(keys, [1])


# ---------------------------------------------------------------------------------------------
# Timers
# ---------------------------------------------------------------------------------------------


def test_timers_fire_in_timestamp_order() -> None:
    b = full_backend()
    ts = b.timer_service
    for key, t in [("a", 30), ("b", 10), ("c", 20), ("a", 10), ("b", 10)]:  # ("b", 10) twice
        b.set_current_key(key)
        ts.register_event_time_timer(t)
    b.set_current_key("w")
    ts.register_event_time_timer(15, namespace=("window", 0, 15))
    ts.register_event_time_timer(40)
    ts.delete_event_time_timer(40)
    assert ts.num_timers() == 5
    assert ts.next_timer_timestamp() == 10
    assert ts.advance_watermark(5) == []
    fired = ts.advance_watermark(20)
    assert [(t.timestamp, t.key, t.namespace) for t in fired] == [
        (10, "b", None),
        (10, "a", None),
        (15, "w", ("window", 0, 15)),
        (20, "c", None),
    ]
    assert all(t.key_group == key_group_for_key(t.key, MAX_P) for t in fired)
    assert ts.current_watermark == 20
    b.set_current_key("late")
    ts.register_event_time_timer(3)  # below the watermark: fires on the next advance
    assert [t.key for t in ts.advance_watermark(21)] == ["late"]
    assert [t.timestamp for t in ts.advance_watermark(100)] == [30]
    assert ts.num_timers() == 0 and ts.next_timer_timestamp() is None
    # deleted then re-registered: fires once
    b.set_current_key("x")
    ts.register_event_time_timer(200)
    ts.delete_event_time_timer(200)
    ts.register_event_time_timer(200)
    assert ts.advance_watermark(300) == [Timer(200, "x", None, key_group_for_key("x", MAX_P))]


def test_a_watermark_past_many_timers_fires_them_in_order_and_keeps_the_rest() -> None:
    # more due timers than advance_watermark pops one by one: the rest are taken in one pass
    b = full_backend()
    ts = b.timer_service
    rng = random.Random(7)
    live: dict[tuple[int, str], int] = {}  # (timestamp, key) -> registration order
    for i in range(20_000):
        key, t = f"k{rng.randrange(5_000)}", rng.randrange(1_000)
        b.set_current_key(key)
        if (t, key) in live and rng.random() < 0.3:
            ts.delete_event_time_timer(t)
            del live[(t, key)]
        else:
            ts.register_event_time_timer(t)
            live.setdefault((t, key), i)
    order = sorted(live, key=lambda e: (e[0], live[e]))
    due = [e for e in order if e[0] <= 600]
    assert len(due) > 8_192
    fired = ts.advance_watermark(600)
    assert [(t.timestamp, t.key) for t in fired] == due
    assert all(t.key_group == key_group_for_key(t.key, MAX_P) for t in fired)
    assert ts.num_timers() == len(order) - len(due)
    assert ts.next_timer_timestamp() == order[len(due)][0]
    b.set_current_key("late")
    ts.register_event_time_timer(5)  # below the watermark: fires first on the next advance
    rest = [(t.timestamp, t.key) for t in ts.advance_watermark(10**6)]
    assert rest == [(5, "late"), *order[len(due) :]]
    assert ts.num_timers() == 0 and ts.next_timer_timestamp() is None


def test_timers_are_snapshotted_and_redistributed(tmp_path: Path) -> None:
    old = [KeyedStateBackend.for_subtask(MAX_P, 2, i) for i in range(2)]
    keys = [f"k{i}" for i in range(200)]
    for i, key in enumerate(keys):
        b = old[operator_index_for_key_group(MAX_P, 2, key_group_for_key(key, MAX_P))]
        b.set_current_key(key)
        b.timer_service.register_event_time_timer(1000 + i % 7)
        b.timer_service.register_event_time_timer(5, namespace="w")
    expected = {(t.timestamp, t.key, t.namespace) for b in old for t in b.timer_service.timers()}
    assert len(expected) == 400
    snaps = [b.snapshot(1) for b in old]
    # after the snapshot: fire every timer of one subtask, register more on the other
    assert len(old[0].timer_service.advance_watermark(10**6)) > 0
    b = old[1]
    b.set_current_key(next(k for k in keys if key_group_for_key(k, MAX_P) >= 64))
    b.timer_service.register_event_time_timer(7)
    handles = [h for s in snaps for h in s.write(tmp_path)]
    assert {h.kind for h in handles} == {"timers"}
    new = [KeyedStateBackend.for_subtask(MAX_P, 3, i) for i in range(3)]
    restored: set[tuple[int, Any, Any]] = set()
    for i, b in enumerate(new):
        b.restore(handles)
        for t in b.timer_service.timers():
            assert operator_index_for_key_group(MAX_P, 3, t.key_group) == i
            assert t.key_group == key_group_for_key(t.key, MAX_P)
            restored.add((t.timestamp, t.key, t.namespace))
    assert restored == expected
    fired = new[0].timer_service.advance_watermark(10**6)
    assert [t.timestamp for t in fired] == sorted(t.timestamp for t in fired)
    assert new[0].timer_service.num_timers() == 0


# ---------------------------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------------------------


def populate(b: KeyedStateBackend, keys: list[Any]) -> None:
    v = b.get_value_state("v")
    lst = b.get_list_state("l")
    m = b.get_map_state("m")
    r = b.get_reducing_state("r", operator.add)
    avg = avg_state(b)
    for k in keys:
        b.set_current_key(k)
        v.update(("v", k))
        lst.add_all([k, k])
        m.put("x", k)
        m.put("y", 1)
        r.add(3)
        avg.add(4)
        b.timer_service.register_event_time_timer(100, namespace=k)


def test_snapshot_is_isolated_from_later_mutations(tmp_path: Path) -> None:
    b = full_backend()
    keys = list(range(300)) + [f"s{i}" for i in range(300)]
    populate(b, keys)
    before = dump(b)
    before_timers = b.timer_service.timers()
    snap = b.snapshot(7)
    assert list(tmp_path.iterdir()) == []  # the synchronous part writes nothing: write() does
    # mutate every kind of state in every way after the synchronous part
    v, lst, m = b.get_value_state("v"), b.get_list_state("l"), b.get_map_state("m")
    r, avg = b.get_reducing_state("r", operator.add), avg_state(b)
    for k in keys[::2]:
        b.set_current_key(k)
        v.update("changed")
        lst.add("appended")
        m.put("x", "changed")
        m.remove("y")
        r.add(100)
        avg.add(1000)
        b.timer_service.register_event_time_timer(50)
    for k in keys[1::4]:
        b.set_current_key(k)
        v.clear()
        lst.clear()
        m.clear()
        r.clear()
        avg.clear()
    b.set_current_key("brand new")
    v.update("new")
    lst.add("new")
    b.timer_service.advance_watermark(100)
    assert dump(b) != before
    handles = snap.write(tmp_path)
    assert sorted(h.kind for h in handles) == ["keyed", "timers"]
    assert snap.async_duration_s is not None and snap.state_size_bytes > 0
    restored = full_backend()
    avg_state(restored)  # registered before restore: restored into it
    restored.restore(handles)
    assert dump(restored) == before
    assert set(restored.timer_service.timers()) == set(before_timers)
    # the live backend kept its own mutations
    b.set_current_key(keys[0])
    assert v.value() == "changed" and lst.get() == [keys[0], keys[0], "appended"]
    restored.set_current_key(keys[0])
    assert avg_state(restored).get() == 4
    assert restored.get_list_state("l").get() == [keys[0], keys[0]]


def test_snapshot_written_in_a_thread_while_processing_continues(tmp_path: Path) -> None:
    b = full_backend()
    counts = b.get_reducing_state("c", operator.add)
    lst = b.get_list_state("l")
    keys = pa.array(range(20_000), pa.int64())
    counts.add_batch(keys)
    for k in range(0, 20_000, 50):
        b.set_current_key(k)
        lst.add(k)
    before = dump(b)
    snap = b.snapshot(1)
    result: list[StateHandle] = []
    writer = threading.Thread(target=lambda: result.extend(snap.write(tmp_path)))
    writer.start()
    for _ in range(5):
        counts.add_batch(keys)
        for k in range(0, 20_000, 50):
            b.set_current_key(k)
            lst.add(-k)
    writer.join()
    snap.release()
    restored = full_backend()
    restored.restore(result)
    assert dump(restored) == before
    assert dict(b.entries("c")) == {k: 6 for k in range(20_000)}


def test_release_and_repeated_snapshots(tmp_path: Path) -> None:
    b = full_backend()
    lst = b.get_list_state("l")
    b.set_current_key("k")
    lst.add(1)
    s1 = b.snapshot(1)
    lst.add(2)
    s2 = b.snapshot(2)
    lst.add(3)
    h2 = s2.write(tmp_path / "2")
    s2.release()  # s1 still alive: still copy-on-write for it
    lst.add(4)
    h1 = s1.write(tmp_path / "1")
    assert s1.write(tmp_path / "1") == h1  # idempotent once written
    s1.release()
    s1.release()
    lst.add(5)  # no snapshot alive: in place
    s3 = b.snapshot(3)
    lst.add(6)
    h3 = s3.write(tmp_path / "3")
    s4 = b.snapshot(4)  # releases s3 (written) automatically
    assert not b._snapshots._active[:-1]
    s4.release()
    with pytest.raises(StateError):
        s4.write(tmp_path / "4")
    for handles, expected in ((h1, [1]), (h2, [1, 2]), (h3, [1, 2, 3, 4, 5])):
        r = full_backend()
        r.restore(handles)
        r.set_current_key("k")
        assert r.get_list_state("l").get() == expected
    assert lst.get() == [1, 2, 3, 4, 5, 6]


def test_empty_state_writes_no_files(tmp_path: Path) -> None:
    b = full_backend()
    b.get_value_state("v")
    assert b.snapshot(1).write(tmp_path) == []
    assert OperatorStateBackend().snapshot(1).write(tmp_path) == []
    r = full_backend()
    assert r.restore([]) == 0


def test_files_are_written_atomically_with_unique_names(tmp_path: Path) -> None:
    b = KeyedStateBackend.for_subtask(MAX_P, 4, 1, name="op/1:x")
    key = next(k for k in range(1000) if key_group_for_key(k, MAX_P) in b.key_group_range)
    b.set_current_key(key)
    b.get_value_state("v").update(1)
    h1 = b.snapshot(5).write(tmp_path)
    h2 = b.snapshot(5).write(tmp_path)
    assert h1[0].path != h2[0].path
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2 and not any(n.startswith(".") for n in names)  # no temp files left
    assert all(n.startswith("op_1_x-chk5-keyed-kg32-63-") and n.endswith(".state") for n in names)
    h = h1[0]
    assert os.path.isabs(h.path) and h.size_bytes == os.path.getsize(h.path)
    assert (h.key_group_start, h.key_group_end) == (32, 63)


def test_unpicklable_state_raises_state_error_and_leaves_no_file(tmp_path: Path) -> None:
    b = full_backend()
    b.set_current_key("k")
    b.get_value_state("v").update(threading.Lock())
    with pytest.raises(StateError, match="cannot serialise"):
        b.snapshot(1).write(tmp_path)
    assert os.listdir(tmp_path) == []
    # the keyed file is fine, the timers file fails: the keyed file is removed again
    b = full_backend()
    b.set_current_key("k")
    b.get_value_state("v").update(1)
    b.timer_service.register_event_time_timer(5, namespace=threading.Lock())
    snap = b.snapshot(2)
    with pytest.raises(StateError, match="cannot serialise"):
        snap.write(tmp_path)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Restore and rescaling
# ---------------------------------------------------------------------------------------------

KEYS: list[Any] = [*range(1500), *(f"user-{i}" for i in range(1500)), b"raw", (1, "composite")]


def build_job(parallelism: int) -> list[KeyedStateBackend]:
    backends = [KeyedStateBackend.for_subtask(MAX_P, parallelism, i) for i in range(parallelism)]
    for key in KEYS:
        owner = operator_index_for_key_group(MAX_P, parallelism, key_group_for_key(key, MAX_P))
        populate(backends[owner], [key])
    return backends


def union_of(backends: list[KeyedStateBackend]) -> dict[str, dict[Any, Any]]:
    out: dict[str, dict[Any, Any]] = {}
    for b in backends:
        for name, entries in dump(b).items():
            overlap = out.setdefault(name, {}).keys() & entries.keys()
            assert not overlap, f"keys restored twice: {list(overlap)[:5]}"
            out[name].update(entries)
    return out


@pytest.mark.parametrize(("old_p", "new_p"), [(2, 2), (2, 3), (3, 2), (3, 1), (1, 4)])
def test_restore_at_any_parallelism(tmp_path: Path, old_p: int, new_p: int) -> None:
    old = build_job(old_p)
    expected = union_of(old)
    expected_timers = Counter(t[:3] for b in old for t in b.timer_service.timers())
    handles: list[Any] = []
    for i, b in enumerate(old):
        written = b.snapshot(3).write(tmp_path / f"sub{i}")
        # handles arrive as dataclasses or mappings alike
        handles.extend(written if i % 2 else [asdict(h) for h in written])
    new = [KeyedStateBackend.for_subtask(MAX_P, new_p, i) for i in range(new_p)]
    for b in new:
        b.restore(handles)
    assert union_of(new) == expected
    for i, b in enumerate(new):
        for name in b.state_names():
            for key, _ in b.entries(name):
                kg = key_group_for_key(key, MAX_P)
                assert operator_index_for_key_group(MAX_P, new_p, kg) == i
                assert kg in b.key_group_range
    assert Counter(t[:3] for b in new for t in b.timer_service.timers()) == expected_timers
    # restored state is live state: it works through the normal API
    b = new[0]
    key = next(iter(dict(b.entries("v"))))
    b.set_current_key(key)
    assert b.get_value_state("v").value() == ("v", key)
    assert b.get_list_state("l").get() == [key, key]


def test_restore_reads_only_overlapping_files(tmp_path: Path) -> None:
    old = build_job(2)
    handles = [h for i, b in enumerate(old) for h in b.snapshot(1).write(tmp_path / str(i))]
    # subtask 0 of 2 owns 0..63: the files of 64..127 are never opened
    missing = [
        replace(h, path=str(tmp_path / "gone.state")) for h in handles if h.key_group_start == 64
    ]
    kept = [h for h in handles if h.key_group_start == 0]
    b = KeyedStateBackend.for_subtask(MAX_P, 2, 0)
    b.restore(kept + missing)
    assert dump(b) == dump(old[0])
    with pytest.raises(StorageError, match="cannot open"):
        KeyedStateBackend.for_subtask(MAX_P, 2, 1).restore(missing)


def test_restore_relative_paths_and_non_keyed_handles_ignored(tmp_path: Path) -> None:
    old = build_job(1)
    handles = old[0].snapshot(1).write(tmp_path)
    # as mappings (older callers and tests): normalised like the dataclasses
    relative: list[Any] = [{**asdict(h), "path": os.path.basename(h.path)} for h in handles]
    relative.append({"path": "whatever", "kind": "operator", "size_bytes": 1})
    b = full_backend()
    b.restore(relative, base_dir=tmp_path)
    assert dump(b) == dump(old[0])
    file_uri = [replace(h, path="file://" + h.path) for h in handles]
    b2 = full_backend()
    b2.restore(file_uri)
    assert dump(b2) == dump(old[0])


def test_restore_refuses_incompatible_state(tmp_path: Path) -> None:
    old = build_job(1)
    handles = old[0].snapshot(1).write(tmp_path)
    with pytest.raises(IncompatibleStateError, match="max parallelism"):
        KeyedStateBackend(256, (0, 255)).restore(handles)
    b = full_backend()
    b.get_list_state("v")  # "v" was value state
    with pytest.raises(IncompatibleStateError, match="value state"):
        b.restore(handles)
    not_empty = full_backend()
    not_empty.set_current_key(1)
    not_empty.get_value_state("x").update(1)
    with pytest.raises(IncompatibleStateError, match="holds no state"):
        not_empty.restore(handles)
    twice = full_backend()
    with pytest.raises(CorruptStateError, match="appears in both"):
        twice.restore(handles + handles)


# ---------------------------------------------------------------------------------------------
# Corrupt files
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def keyed_file(tmp_path: Path) -> StateHandle:
    b = full_backend()
    populate(b, list(range(50)))
    return next(h for h in b.snapshot(1).write(tmp_path) if h.kind == "keyed")


def restore_one(handle: Any) -> None:
    full_backend().restore([handle])


def test_truncated_file(keyed_file: StateHandle) -> None:
    path = keyed_file.path
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-10])
    with pytest.raises(CorruptStateError, match="handle says"):
        restore_one(keyed_file)  # the size in the handle catches it first
    with pytest.raises(CorruptStateError, match="trailer"):
        restore_one(replace(keyed_file, size_bytes=0))  # size unknown: the trailer catches it
    Path(path).write_bytes(data[:5])
    with pytest.raises(CorruptStateError, match="only 5 bytes"):
        restore_one(replace(keyed_file, size_bytes=0))


def test_flipped_byte_in_a_section(keyed_file: StateHandle) -> None:
    path = Path(keyed_file.path)
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the first key-group section
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="checksum mismatch in section"):
        restore_one(keyed_file)


def test_flipped_byte_in_the_index(keyed_file: StateHandle) -> None:
    path = Path(keyed_file.path)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01  # the last index entry
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="metadata or index"):
        restore_one(keyed_file)


def test_not_a_state_file(keyed_file: StateHandle) -> None:
    path = Path(keyed_file.path)
    path.write_bytes(b"garbage" * 20)
    with pytest.raises(CorruptStateError, match="not a Snapflow state file"):
        restore_one(replace(keyed_file, size_bytes=140))


def test_unknown_format_version(keyed_file: StateHandle) -> None:
    path = Path(keyed_file.path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 4, 99)
    path.write_bytes(bytes(data))
    with pytest.raises(StateFormatVersionError, match="format version 99"):
        restore_one(keyed_file)


def test_handle_kind_mismatch(keyed_file: StateHandle) -> None:
    with pytest.raises(CorruptStateError, match="kind"):
        restore_one(replace(keyed_file, kind="timers"))
    with pytest.raises(CorruptStateError, match="handle says"):
        restore_one(replace(keyed_file, key_group_end=100))


def test_missing_file(tmp_path: Path) -> None:
    handle = {"path": str(tmp_path / "nope.state"), "kind": "keyed", "key_group_end": 127}
    with pytest.raises(StorageError):
        restore_one(handle)
    with pytest.raises(StorageError):
        OperatorStateBackend().restore([[{**handle, "kind": "operator"}]], 0, 1)


# ---------------------------------------------------------------------------------------------
# Operator state
# ---------------------------------------------------------------------------------------------


def operator_job(parallelism: int, tmp_path: Path) -> list[list[StateHandle]]:
    handles = []
    for i in range(parallelism):
        b = OperatorStateBackend(name=f"src-{i}")
        offsets = b.get_list_state("offsets")
        offsets.add_all([f"p{i}-{j}" for j in range(i + 2)])  # 2, 3, 4, ... elements
        b.get_union_list_state("watermarks").add(i * 10)
        handles.append(b.snapshot(1).write(tmp_path / f"op{i}"))
    return handles


def restore_operator(handles: Any, p: int) -> list[OperatorStateBackend]:
    out = []
    for i in range(p):
        b = OperatorStateBackend()
        b.restore(handles, i, p)
        out.append(b)
    return out


def test_operator_list_state_basics() -> None:
    b = OperatorStateBackend()
    s = b.get_list_state("s")
    s.add(1)
    s.add_all([2, 3])
    assert s.get() == [1, 2, 3] and list(s) == [1, 2, 3] and len(s) == 3
    s.update([9])
    assert s.get() == [9]
    s.clear()
    assert s.get() == []
    assert b.get_list_state("s") is s
    with pytest.raises(IncompatibleStateError):
        b.get_union_list_state("s")
    assert b.state_names() == ["s"]


def test_operator_snapshot_is_isolated(tmp_path: Path) -> None:
    b = OperatorStateBackend()
    s = b.get_list_state("s")
    s.add_all([1, 2])
    snap = b.snapshot(1)
    s.add(3)
    s.clear()
    handles = snap.write(tmp_path)
    assert [h.kind for h in handles] == ["operator"]
    assert (handles[0].key_group_start, handles[0].key_group_end) == (0, -1)
    r = OperatorStateBackend()
    r.restore([handles], 0, 1)
    assert r.get_list_state("s").get() == [1, 2]


def test_operator_state_same_parallelism_keeps_own_lists(tmp_path: Path) -> None:
    handles = operator_job(3, tmp_path)
    new = restore_operator(handles, 3)
    for i, b in enumerate(new):
        assert b.get_list_state("offsets").get() == [f"p{i}-{j}" for j in range(i + 2)]
        assert b.get_union_list_state("watermarks").get() == [0, 10, 20]


@pytest.mark.parametrize(("old_p", "new_p"), [(3, 2), (2, 3), (3, 5), (4, 1)])
def test_operator_list_state_is_split_and_union_broadcast(
    tmp_path: Path, old_p: int, new_p: int
) -> None:
    handles = operator_job(old_p, tmp_path)
    everything = [f"p{i}-{j}" for i in range(old_p) for j in range(i + 2)]
    new = restore_operator(dict(enumerate(handles)), new_p)
    parts = [b.get_list_state("offsets").get() for b in new]
    assert [x for part in parts for x in part] == everything  # contiguous, in old order
    sizes = [len(p) for p in parts]
    base, extra = divmod(len(everything), new_p)
    assert sizes == [base + (1 if i < extra else 0) for i in range(new_p)]
    for b in new:
        assert b.get_union_list_state("watermarks").get() == [i * 10 for i in range(old_p)]


def test_operator_restore_with_missing_subtasks_and_old_parallelism(tmp_path: Path) -> None:
    handles = operator_job(3, tmp_path)
    # subtask 1 had no state at all: pass old_parallelism explicitly
    sparse = {0: handles[0], 2: handles[2]}
    b = OperatorStateBackend()
    b.restore(sparse, 2, 3, old_parallelism=3)
    assert b.get_list_state("offsets").get() == ["p2-0", "p2-1", "p2-2", "p2-3"]
    with pytest.raises(StateError):
        OperatorStateBackend().restore(sparse, 3, 3)


def test_operator_restore_refuses_corrupt_and_mismatched_files(tmp_path: Path) -> None:
    handles = operator_job(1, tmp_path)
    union_handle = next(h for h in handles[0] if h.kind == "union")
    path = Path(union_handle.path)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStateError):
        OperatorStateBackend().restore(handles, 0, 1)
    b = OperatorStateBackend()
    b.get_union_list_state("offsets")
    good = [h for h in handles[0] if h.kind == "operator"]
    with pytest.raises(IncompatibleStateError):
        b.restore([good], 0, 1)


# ---------------------------------------------------------------------------------------------
# On S3 (moto's server): whole objects, merged objects, ranged reads, request counts
# ---------------------------------------------------------------------------------------------


def s3_requests() -> dict[str, int]:
    return store_for("s3://x").requests.snapshot()


def delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in s3_requests().items() if v != before[k]}


@pytest.mark.parametrize(("old_p", "new_p"), [(2, 2), (2, 3), (3, 1)])
def test_keyed_state_on_s3_restores_at_any_parallelism(
    s3_bucket: str, old_p: int, new_p: int
) -> None:
    old = build_job(old_p)
    expected = union_of(old)
    expected_timers = Counter(t[:3] for b in old for t in b.timer_service.timers())
    before = s3_requests()
    handles = [h for i, b in enumerate(old) for h in b.snapshot(3).write(f"s3://{s3_bucket}/c/{i}")]
    # one PUT per file (keyed + timers per subtask), nothing else on the write path
    assert delta(before) == {"put": 2 * old_p}
    assert all(h.path.startswith(f"s3://{s3_bucket}/c/") and h.offset == 0 for h in handles)
    sizes = {h.path: h.size_bytes for h in handles}
    for path, size in sizes.items():
        assert store_for(path).size(path) == size
    before = s3_requests()
    new = [KeyedStateBackend.for_subtask(MAX_P, new_p, i) for i in range(new_p)]
    for b in new:
        b.restore(handles)
    assert union_of(new) == expected
    assert Counter(t[:3] for b in new for t in b.timer_service.timers()) == expected_timers
    # files up to 256 KiB: one ranged GET for every file a new subtask's key groups overlap
    assert all(h.size_bytes <= 256 * 1024 for h in handles)
    opened = sum(
        1
        for b in new
        for h in handles
        if KeyGroupRange(h.key_group_start, h.key_group_end).overlaps(b.key_group_range)
    )
    assert delta(before) == {"get": opened}


def test_merged_object_holds_a_subtasks_files_in_one_put(s3_bucket: str) -> None:
    """Keyed state, timers, operator and union state of two subtasks, each subtask's files
    merged into one object; restored at parallelism 3 from the byte ranges."""
    old = build_job(2)
    expected = union_of(old)
    handles: list[list[StateHandle]] = [[], []]
    keyed_handles: list[StateHandle] = []
    before = s3_requests()
    for i, b in enumerate(old):
        merged = MergedStateObject(f"s3://{s3_bucket}/chk-3/sub{i}.merged")
        written = b.snapshot(3).write(f"s3://{s3_bucket}/unused", into=merged)
        op = OperatorStateBackend(name=f"src-{i}")
        op.get_list_state("offsets").add_all([f"p{i}-{j}" for j in range(i + 2)])
        op.get_union_list_state("watermarks").add(i * 10)
        op_written = op.snapshot(3).write(f"s3://{s3_bucket}/unused", into=merged)
        assert merged.write()
        assert {h.path for h in written + op_written} == {merged.path}
        offsets = sorted((h.offset, h.size_bytes) for h in written + op_written)
        assert offsets[0][0] == 0 and sum(n for _, n in offsets) == merged.size
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(offsets))  # back to back
        keyed_handles.extend(written)
        handles[i] = op_written
    assert delta(before) == {"put": 2}  # one object per subtask
    assert not MergedStateObject(f"s3://{s3_bucket}/empty").write()  # nothing: no request
    new = [KeyedStateBackend.for_subtask(MAX_P, 3, i) for i in range(3)]
    for b in new:
        b.restore(keyed_handles)
    assert union_of(new) == expected
    restored = restore_operator(dict(enumerate(handles)), 3)
    assert [x for b in restored for x in b.get_list_state("offsets").get()] == [
        "p0-0",
        "p0-1",
        "p1-0",
        "p1-1",
        "p1-2",
    ]
    assert all(b.get_union_list_state("watermarks").get() == [0, 10] for b in restored)
    assert not list_keys(s3_bucket, "unused")  # merged: nothing written under the directory


def list_keys(bucket: str, prefix: str) -> list[str]:
    return store_for("s3://x").list(f"s3://{bucket}/{prefix}")


def test_large_state_file_on_s3_is_read_with_few_ranged_gets(s3_bucket: str) -> None:
    """A file larger than the tail prefetch: the subtask that owns a quarter of the key groups
    fetches the tail, the header and one coalesced range of its sections, not the file."""
    b = full_backend()
    v = b.get_value_state("v")
    for k in range(20_000):
        b.set_current_key(k)
        v.update(f"{k:>100}")  # distinct strings: pickle does not share them
    (handle,) = b.snapshot(1).write(f"s3://{s3_bucket}/big")
    assert handle.size_bytes > 1024 * 1024
    before = s3_requests()
    quarter = KeyedStateBackend.for_subtask(MAX_P, 4, 1)
    quarter.restore([handle])
    assert delta(before) == {"get": 3}
    assert dict(quarter.entries("v")) == {
        k: f"{k:>100}"
        for k in range(20_000)
        if key_group_for_key(k, MAX_P) in quarter.key_group_range
    }


def test_restore_from_s3_refuses_corrupt_truncated_and_missing_objects(s3_bucket: str) -> None:
    b = full_backend()
    populate(b, list(range(50)))
    handle = next(h for h in b.snapshot(1).write(f"s3://{s3_bucket}/c") if h.kind == "keyed")
    store = store_for(handle.path)
    data = store.read(handle.path)
    store.write(handle.path, data[:-10])
    with pytest.raises(CorruptStateError, match="handle says"):
        restore_one(handle)
    with pytest.raises(CorruptStateError, match="trailer"):
        restore_one(replace(handle, size_bytes=0))  # size unknown (one HEAD): the trailer
    flipped = bytearray(data)
    flipped[20] ^= 0xFF
    store.write(handle.path, bytes(flipped))
    with pytest.raises(CorruptStateError, match="checksum mismatch in section"):
        restore_one(handle)
    with pytest.raises(StorageError, match="no such object"):
        restore_one(replace(handle, path=f"s3://{s3_bucket}/c/gone.state"))
    with pytest.raises(StateError, match="needs its size"):
        restore_one(replace(handle, offset=10, size_bytes=0))


def test_s3_handles_keep_their_uri_and_join_relative_paths_with_slashes(s3_bucket: str) -> None:
    old = build_job(1)
    handles = old[0].snapshot(1).write(f"s3://{s3_bucket}/base/sub")
    relative = [replace(h, path=h.path.split("/base/", 1)[1]) for h in handles]
    b = full_backend()
    b.restore(relative, base_dir=f"s3://{s3_bucket}/base/")
    assert dump(b) == dump(old[0])
    b2 = full_backend()
    b2.restore(handles, base_dir="/some/local/dir")  # a full URI is never joined to a base
    assert dump(b2) == dump(old[0])

"""State time-to-live on both backends, driven by an injected clock."""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapflow.errors import StateError
from snapflow.worker.state.errors import IncompatibleStateError
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend
from snapflow.worker.state.ttl import StateTtlConfig, TtlUpdateType

MAXP = 128


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["heap", "rocksdb"])
def backend(
    request: pytest.FixtureRequest, clock: Clock, tmp_path: Path
) -> Iterator[KeyedStateBackend]:
    if request.param == "heap":
        yield KeyedStateBackend(MAXP, (0, MAXP - 1), clock=clock)
        return
    b = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path), clock=clock)
    yield b
    b.dispose()


TTL = StateTtlConfig(ttl_ms=100, cleanup_size=0)  # no incremental clean-up: only reads expire
ON_READ = StateTtlConfig(ttl_ms=100, update_type=TtlUpdateType.ON_READ_AND_WRITE, cleanup_size=0)


def test_a_value_expires_ttl_after_its_last_write(backend: KeyedStateBackend, clock: Clock) -> None:
    state = backend.get_value_state("v", "default", ttl=TTL)
    backend.set_current_key("a")
    state.update("x")
    clock.now += 99
    assert state.value() == "x"  # a read does not renew (OnCreateAndWrite)
    clock.now += 1
    assert state.value() == "default"
    assert len(state) == 0  # removed when met
    state.update("y")
    clock.now += 50
    state.update("z")  # a write renews
    clock.now += 99
    assert state.value() == "z"


def test_on_read_and_write_renews_on_read(backend: KeyedStateBackend, clock: Clock) -> None:
    state = backend.get_value_state("v", ttl=ON_READ)
    backend.set_current_key(1)
    state.update(5)
    for _ in range(5):
        clock.now += 99
        assert state.value() == 5
    clock.now += 100
    assert state.value() is None


def test_bulk_reads_never_return_expired_values(backend: KeyedStateBackend, clock: Clock) -> None:
    state = backend.get_value_state("v", 0, ttl=TTL)
    state.update_many([1, 2, 3], [10, 20, 30])
    clock.now += 60
    state.update_many([2], [21])
    clock.now += 40
    assert state.get_many([1, 2, 3, 4]) == [0, 21, 0, 0]
    counts = backend.get_reducing_state("c", operator.add, ttl=TTL)
    counts.add_many([1, 1, 2], [1, 1, 1])
    assert counts.get_many([1, 2]) == [2, 1]
    clock.now += 100
    counts.add_many([1], [5])  # an expired value is not folded into: it starts afresh
    assert counts.get_many([1, 2]) == [5, None]


def test_every_kind_expires(backend: KeyedStateBackend, clock: Clock) -> None:
    lst = backend.get_list_state("l", ttl=TTL)
    mp = backend.get_map_state("m", ttl=TTL)
    red = backend.get_reducing_state("r", operator.add, ttl=TTL)
    agg = backend.get_aggregating_state("a", lambda v, acc: [*acc, v], len, list, ttl=TTL)
    backend.set_current_key("k")
    lst.add(1)
    mp.put("old", 1)
    red.add(1)
    agg.add("x")
    clock.now += 60
    lst.add(2)  # per element
    mp.put("new", 2)  # per entry
    red.add(1)  # the sum renews the timestamp
    agg.add("y")
    clock.now += 50
    assert lst.get() == [2]
    assert mp.items() == [("new", 2)] and not mp.contains("old") and mp.get("old") is None
    assert red.get() == 2
    assert agg.get() == 2
    clock.now += 100
    assert lst.get() == [] and mp.is_empty() and red.get() is None and agg.get() is None
    agg.add("z")
    assert agg.get() == 1  # a fresh accumulator


def test_incremental_cleanup_removes_keys_nobody_reads(
    backend: KeyedStateBackend, clock: Clock
) -> None:
    config = StateTtlConfig(ttl_ms=100, cleanup_size=5)
    state = backend.get_value_state("v", ttl=config)
    state.update_many(range(200), range(200))
    clock.now += 100
    backend.set_current_key("other")
    accesses = 0
    while len(state) > 1 and accesses < 100:
        state.update(1)  # each access examines 5 more keys
        accesses += 1
    assert len(state) == 1, "expired keys were not cleaned up"
    assert 200 // 5 <= accesses <= 200 // 5 + 2
    assert backend.current_key == "other"


def test_ttl_is_part_of_the_state_kind(
    backend: KeyedStateBackend, clock: Clock, tmp_path: Path
) -> None:
    backend.get_value_state("v", ttl=TTL).update_many([1, 2], [1, 2])
    with pytest.raises(IncompatibleStateError, match="ttl-value"):
        backend.get_value_state("v")
    snap = backend.snapshot(1)
    handles = snap.write(str(tmp_path / "sp"))
    snap.release()
    # A savepoint keeps the timestamps: restored into the other backend, values expire on time.
    other: KeyedStateBackend
    if isinstance(backend, RocksDBKeyedStateBackend):
        other = KeyedStateBackend(MAXP, (0, MAXP - 1), clock=clock)
    else:
        other = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path), clock=clock)
    try:
        other.restore(handles)
        state = other.get_value_state("v", ttl=TTL)
        assert state.get_many([1, 2]) == [1, 2]
        clock.now += 100
        assert state.get_many([1, 2]) == [None, None]
        with pytest.raises(IncompatibleStateError):
            other.get_value_state("v")
    finally:
        other.dispose()
    assert os.path.isdir(tmp_path / "sp")


def test_bad_ttl_settings_are_refused() -> None:
    with pytest.raises(StateError, match="ttl_ms"):
        StateTtlConfig(ttl_ms=0)
    with pytest.raises(StateError, match="cleanup_size"):
        StateTtlConfig(ttl_ms=1, cleanup_size=-1)


def test_map_get_all_sees_live_entries_only_and_refreshes_on_read(
    backend: KeyedStateBackend, clock: Clock
) -> None:
    backend.set_current_key("k")
    plain = backend.get_map_state("plain", ttl=TTL)
    plain.put_all({"a": 1, "b": 2})
    clock.now += 60
    plain.put("c", 3)
    assert plain.get_all(["a", "b", "c", "z"]) == [1, 2, 3, None]
    clock.now += 60  # a and b are 120 ms old, c 60
    assert plain.get_all(["a", "c", "b"]) == [None, 3, None]
    assert plain.keys() == ["c"]
    on_read = backend.get_map_state("on_read", ttl=ON_READ)
    on_read.put("x", 9)
    clock.now += 60
    assert on_read.get_all(["x"]) == [9]  # read: its time to live starts again
    clock.now += 60
    assert on_read.get_all(["x"]) == [9]

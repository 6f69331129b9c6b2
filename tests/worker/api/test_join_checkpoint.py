"""The join buffer's incremental checkpoint (``join_checkpoint.py``), on the heap and the rocksdb
backend: exactly which entries a checkpoint writes after adds, expiries and compaction, the
restore of chunks and thresholds, rescales that split and merge key groups, savepoints between
the backends, and the point of it all: a small upload for a few new rows on rocksdb."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pytest
from kit.keyed_snapshots import snapshot_backends

from snapflow.checkpointing import SHARED_NEW
from snapflow.worker.api.interval_join import IntervalJoinOperator
from snapflow.worker.api.join_buffer import JoinBuffer
from snapflow.worker.api.join_checkpoint import THRESHOLDS, BufferCheckpoint
from snapflow.worker.api.regular_join import RegularJoinOperator
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.errors import IncompatibleStateError
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keygroups import key_group_for_key
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend

MAXP = 128
NAME = "op/left/chunks"


class Recording:
    """A value state that records what every ``update_many`` writes."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.writes: list[dict[Any, Any]] = []

    def update_many(self, keys: Any, values: Any, key_groups: Any = None) -> None:
        self.writes.append(dict(zip(keys, values, strict=True)))
        self.state.update_many(keys, values, key_groups=key_groups)

    def get_many(self, keys: Any, key_groups: Any = None) -> Any:
        return self.state.get_many(keys, key_groups=key_groups)


class Backends:
    """Makes backends of one kind, and disposes of them."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.made: list[KeyedStateBackend] = []

    def make(self, parallelism: int = 1, index: int = 0, kind: str | None = None) -> Any:
        if (kind or self.kind) == "rocksdb":
            b: KeyedStateBackend = RocksDBKeyedStateBackend.for_subtask(
                MAXP, parallelism, index, name="v/keyed", local_dir=str(self.tmp_path)
            )
        else:
            b = KeyedStateBackend.for_subtask(MAXP, parallelism, index, name="v/keyed")
        self.made.append(b)
        return b

    def dispose(self) -> None:
        for b in self.made:
            b.dispose()


@pytest.fixture(params=["heap", "rocksdb"])
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backends]:
    made = Backends(request.param, tmp_path)
    yield made
    made.dispose()


def batch(keys: list[int], times: list[int], tag: str = "") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"k": keys, "ts": times, "v": [f"{tag}{k}@{t}" for k, t in zip(keys, times, strict=True)]}
    )


def add(buffer: JoinBuffer, rows: pa.RecordBatch, stamps: list[int] | None = None) -> None:
    rows = buffer.conform(rows)
    s = None if stamps is None else np.array(stamps, np.int64)
    buffer.add(buffer.sorted_run(rows, buffer.times_of(rows), s))


def live(buffer: JoinBuffer) -> list[tuple[Any, ...]]:
    """The buffer's live rows (with their stamps, with a TTL), sorted."""
    out = []
    for run in buffer.runs:
        alive = buffer._alive(run)
        for i, row in enumerate(run.rows.to_pylist()):
            if alive[i]:
                stamp = () if run.stamps is None else (int(run.stamps[i]),)
                out.append((*row.values(), *stamp))
    return sorted(out)


def attach(backend: Any, *, time_field: str | None = "ts", stamps: bool = False) -> Any:
    buffer = JoinBuffer("k", time_field, "test", with_stamps=stamps)
    state = Recording(backend.get_value_state(NAME))
    return buffer, BufferCheckpoint(buffer, cast(Any, state), backend), state


def stored(backend: Any) -> dict[Any, Any]:
    return dict(backend.entries(NAME))


def rows_of(value: Any) -> list[Any]:
    return sorted(r["v"] for r in value[0].to_pylist())


def kg(key: int) -> int:
    return key_group_for_key(key, MAXP)


def test_a_checkpoint_writes_only_the_rows_added_since_the_last(backends: Backends) -> None:
    backend = backends.make()
    buffer, checkpoint, state = attach(backend)
    keys = list(range(200))
    add(buffer, batch(keys, [0] * 200))
    checkpoint.save()
    (first,) = state.writes
    groups = {kg(k) for k in keys}
    assert set(first) == {(g, 0) for g in groups}
    assert sum(v[0].num_rows for v in first.values()) == 200
    for (g, _), (rows, stamps) in first.items():
        assert stamps is None and {kg(k) for k in rows.column("k").to_pylist()} == {g}
    assert kg(1) != kg(2)
    add(buffer, batch([1, 2], [1, 1], "new"))
    checkpoint.save()
    assert {k: rows_of(v) for k, v in state.writes[1].items()} == {
        (kg(1), 1): ["new1@1"],
        (kg(2), 1): ["new2@1"],
    }
    checkpoint.save()  # nothing changed: nothing written
    assert len(state.writes) == 2
    assert len(stored(backend)) == len(groups) + 2


def test_expiry_writes_thresholds_then_compacts_a_quarter(backends: Backends) -> None:
    backend = backends.make()
    buffer, checkpoint, state = attach(backend)
    g = kg(7)
    add(buffer, batch([7] * 100, list(range(100))))
    checkpoint.save()
    buffer.expire(9)  # 10 of 100 expired: below a quarter, the chunk stays
    checkpoint.save()
    assert state.writes[-1] == {(g, THRESHOLDS): {0: 9}}
    buffer.expire(9)
    checkpoint.save()
    assert len(state.writes) == 2  # no new expiry: nothing written
    buffer.expire(23)  # 24 expired: thresholds only
    checkpoint.save()
    assert state.writes[-1] == {(g, THRESHOLDS): {0: 23}}
    buffer.expire(24)  # 25 of 100: a quarter, the group is rewritten
    checkpoint.save()
    last = state.writes[-1]
    assert set(last) == {(g, 0), (g, 1), (g, THRESHOLDS)}
    assert last[(g, 0)] is None and last[(g, THRESHOLDS)] is None
    assert rows_of(last[(g, 1)]) == sorted(f"7@{t}" for t in range(25, 100))
    assert set(stored(backend)) == {(g, 1)}
    buffer.expire(1000)  # every row expired: every entry deleted
    checkpoint.save()
    assert state.writes[-1] == {(g, 1): None}
    assert stored(backend) == {}


def test_rows_added_and_expired_between_checkpoints_are_never_written(
    backends: Backends,
) -> None:
    backend = backends.make()
    buffer, checkpoint, state = attach(backend)
    add(buffer, batch([7] * 10, list(range(10))))
    buffer.expire(4)
    add(buffer, batch([7], [2], "at"))  # arrives at/below the threshold: stays until the next
    checkpoint.save()
    (write,) = state.writes
    assert rows_of(write[(kg(7), 0)]) == ["7@5", "7@6", "7@7", "7@8", "7@9", "at7@2"]
    assert (kg(7), THRESHOLDS) not in write


def test_a_restore_buffers_exactly_the_live_rows_and_numbers_on(
    backends: Backends, tmp_path: Path
) -> None:
    backend = backends.make()
    buffer, checkpoint, _ = attach(backend)
    g = kg(7)
    add(buffer, batch([7] * 20 + [8] * 4, [*range(20), 0, 1, 2, 3]))
    checkpoint.save()
    buffer.expire(2)  # 3 of 7's 20 rows and 3 of 8's 4 rows: 8's group is compacted
    add(buffer, batch([7], [1], "at"))  # at/below the threshold: live
    checkpoint.save()
    assert stored(backend)[(g, THRESHOLDS)] == {0: 2}
    handles = snapshot_backends([backend], tmp_path / "a", 1)
    expected = live(buffer)
    values = [r[2] for r in expected]
    assert "at7@1" in values and "7@2" not in values and "8@3" in values

    again = backends.make()
    again.restore(handles)
    buffer2, checkpoint2, state2 = attach(again)
    checkpoint2.load(NAME)
    assert live(buffer2) == expected
    assert buffer2.unsaved == []
    checkpoint2.save()
    assert state2.writes == []  # restored as it was saved: nothing to write
    add(buffer2, batch([7], [50], "new"))
    buffer2.expire(3)  # applies to every restored row: 7@3, at7@1 and 8@3
    checkpoint2.save()
    assert state2.writes[0].pop((kg(8), 1)) is None  # 8's last row expired: entry deleted
    assert {k: (rows_of(v) if k[1] != THRESHOLDS else v) for k, v in state2.writes[0].items()} == {
        (g, 2): ["new7@50"],
        (g, THRESHOLDS): {0: 3, 1: 1},
    }
    values = [r[2] for r in live(buffer2)]
    assert "at7@1" not in values and "7@3" not in values and "7@4" in values


def test_a_ttl_keeps_the_arrival_stamps(backends: Backends, tmp_path: Path) -> None:
    backend = backends.make()
    buffer, checkpoint, _ = attach(backend, time_field=None, stamps=True)
    add(buffer, batch([1, 2, 3], [0, 0, 0]), [100, 100, 100])
    add(buffer, batch([1, 4], [0, 0]), [200, 200])
    checkpoint.save()
    buffer.expire(150)
    checkpoint.save()
    expected = live(buffer)
    assert [r[-1] for r in expected] == [200, 200]
    again = backends.make()
    again.restore(snapshot_backends([backend], tmp_path / "a", 1))
    buffer2, checkpoint2, _ = attach(again, time_field=None, stamps=True)
    checkpoint2.load(NAME)
    assert live(buffer2) == expected


def test_clear_deletes_every_entry(backends: Backends) -> None:
    backend = backends.make()
    buffer, checkpoint, _ = attach(backend)
    add(buffer, batch(list(range(50)), [5] * 50))
    checkpoint.save()
    buffer.expire(1)
    add(buffer, batch([1, 2], [6, 6]))
    buffer.clear()
    checkpoint.save()
    assert stored(backend) == {}


def test_a_join_without_expiry_merges_chunks_beyond_the_cap(
    backends: Backends, tmp_path: Path
) -> None:
    backend = backends.make()
    buffer, checkpoint, _ = attach(backend, time_field=None)
    for i in range(BufferCheckpoint.MAX_CHUNKS + 9):
        add(buffer, batch([3], [0], f"r{i:02}-"))
        checkpoint.save()
    entries = stored(backend)
    assert len(entries) == BufferCheckpoint.MAX_CHUNKS
    assert sum(v[0].num_rows for v in entries.values()) == BufferCheckpoint.MAX_CHUNKS + 9
    again = backends.make()
    again.restore(snapshot_backends([backend], tmp_path / "a", 1))
    buffer2, checkpoint2, _ = attach(again, time_field=None)
    checkpoint2.load(NAME)
    assert live(buffer2) == live(buffer)


def _fill(buffers: list[Any], backends_: list[Any], keys: list[int], times: list[int]) -> None:
    for (buffer, _, _), b in zip(buffers, backends_, strict=True):
        mine = [i for i, k in enumerate(keys) if kg(k) in b.key_group_range]
        if mine:
            add(buffer, batch([keys[i] for i in mine], [times[i] for i in mine]))


@pytest.mark.parametrize("savepoint", [False, True], ids=["checkpoint", "savepoint"])
def test_rescale_splits_and_merges_key_groups(
    backends: Backends, tmp_path: Path, savepoint: bool
) -> None:
    keys = list(range(300))
    two = [backends.make(2, i) for i in range(2)]
    bufs = [attach(b) for b in two]
    _fill(bufs, two, keys, [k % 40 for k in keys])
    for _, checkpoint, _ in bufs:
        checkpoint.save()
    _fill(bufs, two, keys[:100], [50] * 100)
    for i, ((buffer, checkpoint, _), b) in enumerate(zip(bufs, two, strict=True)):
        buffer.expire(10 + 5 * i)  # the subtasks' thresholds differ
        mine = next(k for k in keys if kg(k) in b.key_group_range)
        add(buffer, batch([mine], [3], "at"))  # at/below the threshold: live
        checkpoint.save()
    expected = sorted(r for buffer, _, _ in bufs for r in live(buffer))
    handles = snapshot_backends(two, tmp_path / "a", 1, savepoint)

    three = [backends.make(3, i) for i in range(3)]
    for b in three:
        b.restore(handles)
    bufs3 = [attach(b) for b in three]
    for (buffer, checkpoint, _), b in zip(bufs3, three, strict=True):
        checkpoint.load(NAME)
        assert all(kg(r[0]) in b.key_group_range for r in live(buffer))
    assert sorted(r for buffer, _, _ in bufs3 for r in live(buffer)) == expected
    _fill(bufs3, three, [5, 6, 7], [60, 60, 60])
    for _, checkpoint, _ in bufs3:
        checkpoint.save()
    handles = snapshot_backends(three, tmp_path / "b", 2, savepoint)

    # back to one subtask, on the other backend when the snapshot is a savepoint
    other = ("heap" if backends.kind == "rocksdb" else "rocksdb") if savepoint else None
    one = backends.make(kind=other)
    one.restore(handles)
    buffer1, checkpoint1, state1 = attach(one)
    checkpoint1.load(NAME)
    assert live(buffer1) == sorted(r for buffer, _, _ in bufs3 for r in live(buffer))
    add(buffer1, batch([5], [70], "n"))
    checkpoint1.save()
    (write,) = state1.writes
    numbers = [n for g, n in stored(one) if g == kg(5) and n != THRESHOLDS]
    assert list(write) == [(kg(5), max(numbers))]  # a new chunk number, no entry overwritten
    assert len(numbers) == len(set(numbers)) > 1


def test_a_snapshot_of_the_earlier_layout_is_refused_clearly(tmp_path: Path) -> None:
    backend = KeyedStateBackend(MAXP, (0, MAXP - 1))
    backend.get_value_state("j/left").update_many([kg(1)], [(batch([1], [1]), None)], [kg(1)])
    handles = snapshot_backends([backend], tmp_path, 1)
    restored = KeyedStateBackend(MAXP, (0, MAXP - 1))
    restored.restore(handles)
    op = IntervalJoinOperator("k", "k", "ts", "ts", -1, 1)
    with pytest.raises(IncompatibleStateError, match="earlier version"):
        op.open(OperatorContext(operator_id="j", keyed_state=restored, restored_checkpoint_id=1))


def test_on_rocksdb_a_few_new_rows_upload_a_small_fraction(tmp_path: Path) -> None:
    """The point of the chunks: after a first checkpoint of a large buffer, a checkpoint after
    a few more rows uploads about those rows, not the whole buffer again."""
    backend = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), name="v/keyed", local_dir=str(tmp_path))
    try:
        buffer, checkpoint, _ = attach(backend)
        n = 100_000
        rng = np.random.default_rng(3)
        add(buffer, batch(rng.integers(0, 10_000, n).tolist(), rng.integers(0, 1000, n).tolist()))
        checkpoint.save()

        def upload(cid: int) -> int:
            handles = snapshot_backends([backend], tmp_path / "cp", cid)
            backend.notify_checkpoint_complete(cid)
            return sum(h.size_bytes for h in handles if h.kind == SHARED_NEW)

        first = upload(1)
        add(buffer, batch(list(range(100)), [2000] * 100))
        buffer.expire(10)  # about 1 % expired: thresholds entries, no rewrite
        checkpoint.save()
        second = upload(2)
        assert first > 1_000_000
        assert 0 < second < first / 20
    finally:
        backend.dispose()


# --- rows written ahead of the checkpoint (spills), on a backend that writes ahead ---------


@pytest.fixture
def rocks(tmp_path: Path) -> Iterator[Backends]:
    made = Backends("rocksdb", tmp_path)
    yield made
    made.dispose()


def reloaded(
    backends_: Backends, backend: Any, tmp_path: Path, **attached: Any
) -> tuple[Any, tuple[Any, Any, Any]]:
    """A backend of ``backends_`` restored from a snapshot of ``backend``, and the buffer,
    checkpoint and recorded state attached to it with the chunks loaded."""
    again = backends_.make()
    again.restore(snapshot_backends([backend], tmp_path / "a", 1))
    buffer, checkpoint, state = attach(again, **attached)
    checkpoint.load(NAME)
    return again, (buffer, checkpoint, state)


def spill(buffer: JoinBuffer, checkpoint: BufferCheckpoint, rows: pa.RecordBatch) -> None:
    """Add ``rows`` as a join does (``KeyedJoinOperator._add``), spilling whatever is unsaved."""
    add(buffer, rows)
    checkpoint.SPILL_BYTES = 1
    checkpoint.maybe_spill()


def test_rows_written_ahead_are_parts_of_the_chunk_the_next_checkpoint_closes(
    rocks: Backends, tmp_path: Path
) -> None:
    backend = rocks.make()
    buffer, checkpoint, state = attach(backend)
    g1, g2 = kg(1), kg(2)
    spill(buffer, checkpoint, batch([1, 2], [0, 0], "a"))
    # in the database already, not left in the cache for the checkpoint to write
    assert {k: rows_of(v) for k, v in stored(backend).items()} == {
        (g1, 0): ["a1@0"],
        (g2, 0): ["a2@0"],
    }
    assert backend.dirty == set() and backend.cache == {}
    assert buffer.unsaved == []
    spill(buffer, checkpoint, batch([1], [1], "b"))
    add(buffer, batch([1, 3], [2, 2], "c"))  # not spilled: the checkpoint writes it
    checkpoint.save()
    assert {k: rows_of(v) for k, v in state.writes[-1].items()} == {
        (g1, 0, 2): ["c1@2"],
        (kg(3), 0): ["c3@2"],
    }
    assert set(stored(backend)) == {(g1, 0), (g1, 0, 1), (g1, 0, 2), (g2, 0), (kg(3), 0)}
    add(buffer, batch([1], [3], "d"))
    checkpoint.save()  # the chunks closed: a new number
    assert list(state.writes[-1]) == [(g1, 1)]
    expected = live(buffer)

    again, (buffer2, checkpoint2, state2) = reloaded(rocks, backend, tmp_path)
    assert live(buffer2) == expected
    assert [(c.number, c.rows, c.parts) for c in checkpoint2.groups[g1]] == [
        (0, 3, 3),
        (1, 1, 1),
    ]
    buffer2.expire(1000)  # every row expired: every part deleted
    checkpoint2.save()
    assert stored(again) == {}
    assert set(state2.writes[-1]) == {
        (g1, 0), (g1, 0, 1), (g1, 0, 2), (g1, 1), (g2, 0), (kg(3), 0)
    }  # fmt: skip


def test_the_heap_does_not_write_ahead() -> None:
    backend = KeyedStateBackend(MAXP, (0, MAXP - 1))
    buffer, checkpoint, state = attach(backend)
    spill(buffer, checkpoint, batch([1, 2], [0, 0]))
    assert state.writes == [] and len(buffer.unsaved) == 1
    checkpoint.save()
    assert set(state.writes[0]) == {(kg(1), 0), (kg(2), 0)}


def test_an_expiry_between_spills_closes_the_chunk_the_earlier_parts_opened(
    rocks: Backends, tmp_path: Path
) -> None:
    """All parts of a chunk are written between the same two expiries: a row that arrives at
    the threshold after an expiry stays live, so it may not join a chunk that the expiry's
    threshold covers (its restore would drop it)."""
    backend = rocks.make()
    buffer, checkpoint, _ = attach(backend)
    g = kg(7)
    spill(buffer, checkpoint, batch([7] * 20, list(range(20))))
    buffer.expire(2)  # 3 of 20 rows: below a quarter, no compaction
    spill(buffer, checkpoint, batch([7], [1], "at"))  # at/below the threshold: live
    checkpoint.save()
    entries = stored(backend)
    assert set(entries) == {(g, 0), (g, 1), (g, THRESHOLDS)}
    assert entries[(g, THRESHOLDS)] == {0: 2}
    assert rows_of(entries[(g, 1)]) == ["at7@1"]
    expected = live(buffer)
    assert "at7@1" in [r[2] for r in expected]
    _, (buffer2, _, _) = reloaded(rocks, backend, tmp_path)
    assert live(buffer2) == expected


def test_chunks_of_parts_are_merged_and_compacted_whole(rocks: Backends, tmp_path: Path) -> None:
    backend = rocks.make()
    buffer, checkpoint, _ = attach(backend, time_field=None)
    g = kg(3)
    for i in range(BufferCheckpoint.MAX_CHUNKS + 3):
        spill(buffer, checkpoint, batch([3], [0], f"r{i:02}a-"))
        spill(buffer, checkpoint, batch([3], [0], f"r{i:02}b-"))
        checkpoint.save()
    assert len(checkpoint.groups[g]) == BufferCheckpoint.MAX_CHUNKS
    entries = stored(backend)
    # the merged chunks are one entry each, the others two parts
    merged = [c for c in checkpoint.groups[g] if c.parts == 1]
    assert len(merged) >= 3
    assert len(entries) == sum(c.parts for c in checkpoint.groups[g])
    assert sum(v[0].num_rows for v in entries.values()) == 2 * (BufferCheckpoint.MAX_CHUNKS + 3)
    expected = live(buffer)
    _, (buffer2, _, _) = reloaded(rocks, backend, tmp_path, time_field=None)
    assert live(buffer2) == expected


def test_clear_deletes_the_parts_written_ahead(rocks: Backends, tmp_path: Path) -> None:
    backend = rocks.make()
    buffer, checkpoint, _ = attach(backend)
    add(buffer, batch([1], [0]))
    checkpoint.save()
    spill(buffer, checkpoint, batch([1, 2], [1, 1]))
    assert len(stored(backend)) == 3
    buffer.clear()
    checkpoint.maybe_spill()  # cleared: nothing written until the checkpoint
    checkpoint.save()
    assert stored(backend) == {}
    add(buffer, batch([1], [5], "n"))
    checkpoint.save()
    assert set(stored(backend)) == {(kg(1), 2)}  # numbers are never reused


def test_a_chunk_that_lacks_a_part_is_refused_clearly(tmp_path: Path) -> None:
    backend = KeyedStateBackend(MAXP, (0, MAXP - 1))
    g = kg(1)
    backend.get_value_state(NAME).update_many(
        [(g, 0), (g, 0, 2)], [(batch([1], [1]), None), (batch([1], [2]), None)], [g, g]
    )
    _, checkpoint, _ = attach(backend)
    with pytest.raises(IncompatibleStateError, match=r"lacks parts \(it has parts \[0, 2\]\)"):
        checkpoint.load(NAME)


@pytest.mark.parametrize("join", ["regular", "interval"])
def test_a_join_writes_its_rows_ahead_as_they_arrive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, join: str
) -> None:
    monkeypatch.setattr(BufferCheckpoint, "SPILL_BYTES", 1)
    backend = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), name="v/keyed", local_dir=str(tmp_path))
    try:
        op = (
            RegularJoinOperator("k", "k")
            if join == "regular"
            else IntervalJoinOperator("k", "k", "ts", "ts", -10, 10)
        )
        op.open(OperatorContext(operator_id="j", keyed_state=backend))
        op.process_input(0, batch([1, 2], [0, 0]))
        op.process_input(1, batch([1], [0], "r"))
        assert {k: rows_of(v) for k, v in backend.entries("j/left/chunks")} == {
            (kg(1), 0): ["1@0"],
            (kg(2), 0): ["2@0"],
        }
        assert {k: rows_of(v) for k, v in backend.entries("j/right/chunks")} == {
            (kg(1), 0): ["r1@0"],
        }
    finally:
        backend.dispose()


def test_runs_are_a_binary_counter_up_to_the_largest_run() -> None:
    """Runs halve in size towards the newest, and a run of MAX_RUN_ROWS is merged no more:
    no merge sorts more than twice that, and every row is found after it."""
    buffer = JoinBuffer("k", None, "test")
    buffer.MAX_RUN_ROWS = 64
    for i in range(100):
        add(buffer, batch([i % 7] * 10, [0] * 10, f"b{i}-"))
    sizes = [len(r) for r in buffer.runs]
    assert sum(sizes) == 1000
    frozen = [s for s in sizes if s >= 64]
    assert len(frozen) >= 7 and all(s < 2 * 64 + 10 for s in frozen)
    tail = sizes[len(frozen) :]
    assert all(older >= 2 * newer for older, newer in itertools.pairwise(tail))
    assert len(live(buffer)) == 1000

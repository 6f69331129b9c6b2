"""Inline state (Flink's ``state.storage.fs.memory-threshold``): a subtask's snapshot of at most
the threshold travels in its handles, and nothing is written; above it, the files are as
without it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from snapflow.checkpointing import CHANNEL_INPUT, CHANNEL_OUTPUT, KEYED, OPERATOR, StateHandle
from snapflow.errors import StorageError
from snapflow.worker.runtime.snapshot_writer import encode_snapshot, read_channel_state
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.operator_state import OperatorStateBackend
from snapflow.worker.state.state_files import MergedStateObject

MAX_P = 128
unique_part = re.compile(r"-[0-9a-f]+\.state$")


def keyed(keys: int, value: Any = 1) -> KeyedStateBackend:
    b = KeyedStateBackend(MAX_P, KeyGroupRange(0, MAX_P - 1), name="count")
    state = b.get_value_state("v")
    for k in range(keys):
        b.set_current_key(k)
        state.update((k, value))
    return b


def operator(items: list[Any]) -> OperatorStateBackend:
    b = OperatorStateBackend()
    b.get_list_state("offsets").add_all(items)
    return b


def snapshot(
    directory: Path,
    threshold: int,
    keyed_backend: KeyedStateBackend,
    operator_backend: OperatorStateBackend,
    channel: list[tuple[int, pa.RecordBatch]] | None = None,
) -> tuple[dict[str, list[StateHandle]], int, int]:
    snaps = [("op-a", keyed_backend.snapshot(7)), ("op-b", operator_backend.snapshot(7))]
    return encode_snapshot(str(directory), 7, snaps, channel or [], [], "op-a").store(threshold)


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def restored(handles: dict[str, list[StateHandle]]) -> tuple[dict[Any, Any], list[Any]]:
    b = KeyedStateBackend(MAX_P, KeyGroupRange(0, MAX_P - 1), name="count")
    b.restore(handles["op-a"])
    o = OperatorStateBackend()
    o.restore([handles["op-b"]], 0, 1)
    return dict(b.entries("v")), o.get_list_state("offsets").get()


def test_a_small_snapshot_is_inline_and_writes_nothing(tmp_path: Path) -> None:
    handles, size, in_flight = snapshot(tmp_path, 20 * 1024, keyed(50), operator(["p0", "p1"]))
    assert files_under(tmp_path) == []  # not even a directory's file
    every = [h for hs in handles.values() for h in hs]
    assert {h.kind for h in every} == {KEYED, OPERATOR}
    assert all(h.is_inline and h.offset == 0 and h.size_bytes == len(h.data) for h in every)
    assert size == sum(len(h.data) for h in every) and in_flight == 0
    # each handle is named as its file would have been
    assert all(h.path.startswith(str(tmp_path / h.path.split(os.sep)[-2])) for h in every)
    entries, offsets = restored(handles)
    assert entries == {k: (k, 1) for k in range(50)}
    assert offsets == ["p0", "p1"]


def test_above_the_threshold_every_file_is_written_as_without_it(tmp_path: Path) -> None:
    inline_dir, plain_dir = tmp_path / "t", tmp_path / "zero"
    big = "x" * 200
    a, size_a, _ = snapshot(inline_dir, 1024, keyed(50, big), operator(["p0"]))
    b, size_b, _ = snapshot(plain_dir, 0, keyed(50, big), operator(["p0"]))
    assert size_a == size_b > 1024
    for handles, root in ((a, inline_dir), (b, plain_dir)):
        every = [h for hs in handles.values() for h in hs]
        assert not any(h.is_inline or h.offset for h in every)
        assert all(os.path.getsize(h.path) == h.size_bytes for h in every)
        assert len(files_under(root)) == len(every)
    # the same names, one file per state, either way
    assert [unique_part.sub("", n) for n in files_under(inline_dir)] == [
        unique_part.sub("", n) for n in files_under(plain_dir)
    ]
    assert restored(a) == restored(b)


def test_the_threshold_counts_the_whole_snapshot(tmp_path: Path) -> None:
    handles, size, _ = snapshot(tmp_path / "probe", 0, keyed(40), operator(["p0"]))
    assert len([h for hs in handles.values() for h in hs]) == 2
    exact, _, _ = snapshot(tmp_path / "exact", size, keyed(40), operator(["p0"]))
    assert all(h.is_inline for hs in exact.values() for h in hs)
    below, _, _ = snapshot(tmp_path / "below", size - 1, keyed(40), operator(["p0"]))
    assert not any(h.is_inline for hs in below.values() for h in hs)  # all or nothing


def test_channel_state_is_inline_too(tmp_path: Path) -> None:
    batch = pa.record_batch({"key": pa.array([1, 2, 3]), "n": pa.array([4, 5, 6])})
    empty = batch.slice(0, 0)
    channel = [(1, batch), (0, empty), (1, batch)]
    handles, size, in_flight = snapshot(tmp_path, 64 * 1024, keyed(3), operator([]), channel)
    assert files_under(tmp_path) == []
    state = [h for h in handles["op-a"] if h.kind == CHANNEL_INPUT]
    assert len(state) == 1 and state[0].is_inline and state[0].key_group_start == 1
    assert in_flight == state[0].size_bytes and size >= in_flight
    replayed = read_channel_state(state[0])
    assert pa.Table.from_batches(replayed).equals(pa.Table.from_batches([batch, batch]))
    plain, _, _ = snapshot(tmp_path / "files", 0, keyed(3), operator([]), channel)
    on_disk = [h for h in plain["op-a"] if h.kind == CHANNEL_INPUT]
    assert read_channel_state(on_disk[0]) == replayed
    assert CHANNEL_OUTPUT not in {h.kind for h in handles["op-a"]}


def test_an_empty_snapshot_has_no_handles(tmp_path: Path) -> None:
    b = KeyedStateBackend(MAX_P, KeyGroupRange(0, MAX_P - 1), name="count")
    b.get_value_state("v")
    handles, size, _ = snapshot(tmp_path, 20 * 1024, b, operator([]))
    assert handles == {"op-a": [], "op-b": []} and size == 0
    assert files_under(tmp_path) == []


def test_a_failed_file_write_leaves_no_file(tmp_path: Path) -> None:
    merged = MergedStateObject(str(tmp_path / "chk1.merged"))
    first = merged.add([b"a" * 10], str(tmp_path / "d" / "one.state"))
    second = merged.add([b"b" * 10], str(tmp_path / "d" / "two.state"))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "two.state").write_bytes(b"someone else's")  # exclusive create fails
    handles = [StateHandle(merged.path, 10, KEYED, 0, 0, first)]
    handles.append(StateHandle(merged.path, 10, KEYED, 1, 1, second))
    with pytest.raises(StorageError, match=r"two\.state"):
        merged.finish(handles, 5)
    assert files_under(tmp_path) == ["d/two.state"]


@pytest.mark.parametrize("threshold", [1024, 0], ids=["inline", "files"])
def test_files_a_backend_wrote_itself_keep_their_handles(tmp_path: Path, threshold: int) -> None:
    """RocksDB uploads its shared SST files itself: their handles are not the object's."""
    merged = MergedStateObject(str(tmp_path / "chk3.merged"))
    offset = merged.add([b"manifest"], str(tmp_path / "op" / "manifest.state"))
    sst = StateHandle(str(tmp_path / "shared" / "000012.sst"), 4096, "shared-new", 0, 63)
    own = StateHandle(merged.path, 8, "incremental", 0, 63, offset)
    out = merged.finish([sst, own], threshold)
    assert out[0] == sst
    assert out[1].path == str(tmp_path / "op" / "manifest.state") and out[1].offset == 0
    assert out[1].is_inline == (threshold > 0)
    assert files_under(tmp_path) == ([] if threshold else ["op/manifest.state"])


def test_backends_say_how_many_entries_a_snapshot_encodes() -> None:
    b = keyed(30)
    b.set_current_key(3)
    b.timer_service.register_event_time_timer(100)
    b.timer_service.register_event_time_timer(200)
    assert b.snapshot(1).entries == 32
    o = operator(["a", "b"])
    o.get_union_list_state("w").add_all([1, 2, 3])
    assert o.snapshot(1).entries == 5


def test_which_snapshots_are_encoded_on_the_loop() -> None:
    from snapflow.worker.runtime import subtask_checkpoints as sc

    class Pending:
        def __init__(self, entries: list[int | None], channel: bool = False) -> None:
            self.snapshots = []
            for n in entries:
                snap = keyed(0).snapshot(1)
                snap.count_entries = None if n is None else (lambda n=n: n)
                self.snapshots.append(("op", snap))
            self.input_state = [(0, pa.record_batch({"a": [1]}))] if channel else []
            self.output_state: list[Any] = []

    most = sc.LOOP_ENCODE_MAX_ENTRIES
    assert sc._encodes_on_loop(Pending([10, most - 10]), 20 * 1024)  # type: ignore[arg-type]
    assert not sc._encodes_on_loop(Pending([10, most - 9]), 20 * 1024)  # type: ignore[arg-type]
    assert not sc._encodes_on_loop(Pending([10]), 0)  # type: ignore[arg-type]
    assert not sc._encodes_on_loop(Pending([10, None]), 20 * 1024)  # type: ignore[arg-type]
    assert not sc._encodes_on_loop(Pending([10], channel=True), 20 * 1024)  # type: ignore[arg-type]


def test_encoding_then_storing_is_writing(tmp_path: Path) -> None:

    for threshold in (20 * 1024, 64):
        snaps = [("op-a", keyed(20).snapshot(7)), ("op-b", operator(["p"]).snapshot(7))]
        encoded = encode_snapshot(str(tmp_path / str(threshold)), 7, snaps, [], [], "op-a")
        assert encoded.fits_inline(threshold) == (threshold > 64)
        handles, size, _ = encoded.store(threshold)
        assert all(h.is_inline == (threshold > 64) for hs in handles.values() for h in hs)
        assert size == sum(h.size_bytes for hs in handles.values() for h in hs)
        assert restored(handles) == ({k: (k, 1) for k in range(20)}, ["p"])
    assert len(files_under(tmp_path)) == 2  # only the files of the one above its threshold

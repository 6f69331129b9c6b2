"""Local recovery of the disk backend: the last completed checkpoint's files kept on local disk,
used by a restore of the same key groups when they match the manifest, storage otherwise."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any

import pytest

from snapflow import wire
from snapflow.checkpointing import SHARED, SHARED_NEW, BarrierOptions, StateHandle
from snapflow.filestore_registry import store_for
from snapflow.state_backend_options import StateBackendOptions
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.state import factory
from snapflow.worker.state.keygroups import key_group_for_key
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend
from snapflow.worker.state.rocksdb_local_recovery import LOCAL_COPY_META, local_copy_dir

MAXP = 128


def _backend(tmp_path: Path, copies: str | None) -> RocksDBKeyedStateBackend:
    return RocksDBKeyedStateBackend(
        MAXP,
        (0, MAXP - 1),
        name="v/keyed",
        local_dir=str(tmp_path / "db"),
        local_recovery_dir=copies,
    )


def _checkpoint(b: RocksDBKeyedStateBackend, root: str, cid: int) -> list[StateHandle]:
    target = f"{root}/job/chk-{cid}"
    snap = b.snapshot(cid, BarrierOptions(target_location=target))
    handles = snap.write(f"{target}/v-0-1")
    snap.release()
    return handles


def _contents(b: RocksDBKeyedStateBackend) -> dict[Any, Any]:
    return dict(b.entries("count"))


class _Run:
    """A source backend with local recovery, checkpoints 1 and 2 completed, 3 only taken."""

    def __init__(self, tmp_path: Path, root: str) -> None:
        self.copies = local_copy_dir(str(tmp_path / "local"), "job-1", "v/keyed", 0)
        source = _backend(tmp_path, self.copies)
        try:
            count = source.get_reducing_state("count", operator.add)
            count.add_many(range(3000), [1] * 3000)
            _checkpoint(source, root, 1)
            source.notify_checkpoint_complete(1)
            assert sorted(os.listdir(self.copies)) == ["chk-1"]
            count.add_many(range(0, 3000, 7), [5] * len(range(0, 3000, 7)))
            self.handles = _checkpoint(source, root, 2)
            self.expected = _contents(source)
            source.notify_checkpoint_complete(2)
            count.add_many(range(10), [100] * 10)
            self.later = _checkpoint(source, root, 3)  # not completed: the copy stays at 2
        finally:
            source.dispose()  # the task ends; its local copy outlives it
        assert sorted(os.listdir(self.copies)) == ["chk-2"]
        self.chk = Path(self.copies) / "chk-2"
        self.ssts = [h for h in self.handles if h.kind in (SHARED, SHARED_NEW)]
        assert self.ssts and (self.chk / LOCAL_COPY_META).exists()


@pytest.fixture
def run(tmp_path: Path) -> _Run:
    return _Run(tmp_path, str(tmp_path / "cp"))


def _restore(
    tmp_path: Path, copies: str | None, handles: list[StateHandle]
) -> tuple[RocksDBKeyedStateBackend, list[str]]:
    """A restored backend and the reasons of its local recovery misses."""
    target = _backend(tmp_path, copies)
    target.restore(handles)
    return target, list(target.local_recovery_misses)


def test_restore_from_the_local_copy_downloads_no_shared_file(
    tmp_path: Path, s3_bucket: str
) -> None:
    root = f"s3://{s3_bucket}/cp"
    run = _Run(tmp_path, root)
    store = store_for(root)
    assert all(str(h.path).startswith(f"{root}/job/shared/") for h in run.ssts)
    before = store.requests.snapshot()["get"]
    fetched, misses = _restore(tmp_path, None, run.handles)
    from_storage = store.requests.snapshot()["get"] - before
    try:
        assert fetched.local_recovery_hits == 0 and not misses
        assert _contents(fetched) == run.expected
    finally:
        fetched.dispose()
    before = store.requests.snapshot()["get"]
    local, misses = _restore(tmp_path, run.copies, run.handles)
    from_copy = store.requests.snapshot()["get"] - before
    try:
        assert local.local_recovery_hits == 1 and not misses
        assert _contents(local) == run.expected
        # Only the manifest is read: one GET less per SST, none for any SST.
        assert from_copy == from_storage - len(run.ssts)
        # The restored instance goes on: it writes and checkpoints like any other.
        local.get_reducing_state("count", operator.add).add_many([1], [1])
        assert _checkpoint(local, root, 4)
    finally:
        local.dispose()
    assert (run.chk / LOCAL_COPY_META).exists()  # still there for the next failover


def _flip_a_byte(path: Path) -> None:
    """A damaged copy of ``path`` in its place (a new inode: local checkpoint storage holds a
    hard link of the same file, which stays intact)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.unlink()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["corrupt", "missing-sst", "missing-copy", "other-checkpoint"])
def test_an_unusable_local_copy_falls_back_to_storage(
    run: _Run, tmp_path: Path, damage: str
) -> None:
    handles, expected = run.handles, run.expected
    sst = run.chk / os.path.basename(str(run.ssts[0].path)).rsplit("-", 1)[-1]
    if damage == "corrupt":
        _flip_a_byte(sst)
        reason = "CRC-32"
    elif damage == "missing-sst":
        sst.unlink()
        reason = f"lacks {sst.name}"
    elif damage == "missing-copy":
        (run.chk / LOCAL_COPY_META).unlink()
        reason = "no local copy of checkpoint 2"
    else:  # the copy is of checkpoint 2, the restore of checkpoint 3
        handles = run.later
        expected = {k: v + (100 if k < 10 else 0) for k, v in run.expected.items()}
        reason = "no local copy of checkpoint 3"
    target, misses = _restore(tmp_path, run.copies, handles)
    try:
        assert target.local_recovery_hits == 0
        assert len(misses) == 1 and reason in misses[0], misses
        assert _contents(target) == expected
    finally:
        target.dispose()


def test_a_copy_of_other_key_groups_is_not_used(run: _Run, tmp_path: Path) -> None:
    # Same directory, other key groups (a rescaled job reusing the subtask index).
    target = RocksDBKeyedStateBackend(
        MAXP,
        (0, MAXP // 2 - 1),
        name="v/keyed",
        local_dir=str(tmp_path / "db"),
        local_recovery_dir=run.copies,
    )
    try:
        target.restore(run.handles)
        misses = target.local_recovery_misses
        assert misses == ["the restore changes the key groups (rescaling)"]
        assert target.local_recovery_hits == 0
        mine = {k: v for k, v in run.expected.items() if key_group_for_key(k, MAXP) < MAXP // 2}
        assert 0 < len(mine) < len(run.expected) and _contents(target) == mine
    finally:
        target.dispose()


def test_only_the_latest_completed_checkpoint_is_kept(tmp_path: Path) -> None:
    copies = str(tmp_path / "local" / "s0")
    b = _backend(tmp_path, copies)
    try:
        b.get_reducing_state("count", operator.add).add_many(range(100), [1] * 100)
        root = str(tmp_path / "cp")
        for cid in (1, 2, 3):
            _checkpoint(b, root, cid)
        b.notify_checkpoint_complete(2)  # 1 is superseded, 3 still pending
        assert os.listdir(copies) == ["chk-2"]
        pending = [n for n in os.listdir(b.local_path) if n.startswith("chk-")]
        assert len(pending) == 1 and pending[0].startswith("chk-3-")
        b.notify_checkpoint_complete(3)
        assert os.listdir(copies) == ["chk-3"]
        assert not [n for n in os.listdir(b.local_path) if n.startswith("chk-")]
    finally:
        b.dispose()
    assert os.listdir(copies) == ["chk-3"]


def test_without_local_recovery_nothing_is_kept(tmp_path: Path) -> None:
    config = factory.StateBackendConfig(kind="rocksdb", local_recovery_dir=str(tmp_path / "lr"))
    b = factory.create_keyed_backend(config, MAXP, 1, 0, name="v/keyed", job_id="job-1")
    assert isinstance(b, RocksDBKeyedStateBackend)
    try:
        b.get_reducing_state("count", operator.add).add_many(range(100), [1] * 100)
        _checkpoint(b, str(tmp_path / "cp"), 1)
        b.notify_checkpoint_complete(1)
        assert not (tmp_path / "lr").exists()
        assert not [n for n in os.listdir(b.local_path) if n.startswith("chk-")]
    finally:
        b.dispose()


def test_config_travels_and_the_job_end_discards_its_copies(tmp_path: Path) -> None:
    on = factory.StateBackendConfig(
        kind="rocksdb",
        options=StateBackendOptions(local_recovery=True),
        local_recovery_dir=str(tmp_path / "lr"),
    )
    options = wire.state_backend_options_to_pb(on.options)
    assert options == pb.StateBackendOptions(local_recovery=True)
    config = pb.CheckpointConfig(state_backend="rocksdb", state_backend_options=options)
    travelled = factory.StateBackendConfig(
        kind=config.state_backend,
        options=wire.checkpoint_config_from_pb(config).state_backend_options,
    )
    assert travelled.local_recovery and not factory.StateBackendConfig().local_recovery
    backends = [
        factory.create_keyed_backend(on, MAXP, 2, i, name="v/keyed", job_id=job)
        for job in ("job-1", "job-2")
        for i in range(2)
    ]
    try:
        for cid, b in enumerate(backends, 1):
            keys = [k for k in range(200) if key_group_for_key(k, MAXP) in b.key_group_range]
            b.get_reducing_state("count", operator.add).add_many(keys, [1] * len(keys))
            _checkpoint(b, str(tmp_path / "cp"), cid)  # type: ignore[arg-type]
            b.notify_checkpoint_complete(cid)
    finally:
        for b in backends:
            b.dispose()
    assert sorted(os.listdir(tmp_path / "lr")) == ["job-1", "job-2"]
    assert sorted(os.listdir(tmp_path / "lr" / "job-1" / "v_keyed")) == ["0", "1"]
    on.discard_local_copies("job-1")
    assert sorted(os.listdir(tmp_path / "lr")) == ["job-2"]

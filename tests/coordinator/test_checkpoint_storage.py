"""Checkpoint storage: layout, atomic create-if-absent metadata, relocatable savepoints, and
that nothing outside a job's directory is ever deleted."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from kit.checkpoints import JOB, OTHER_JOB, make_checkpoint

from snapflow.coordinator.checkpoint_storage import METADATA_FILE, CheckpointStorage
from snapflow.coordinator.model import CheckpointKind
from snapflow.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    ConfigError,
    InvalidArgumentError,
    InvalidStatePathError,
)


def write_file(path: str | Path, content: bytes = b"abc") -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(content)
    return str(path)


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    return CheckpointStorage(str(tmp_path / "root"))


# --- root and layout ---------------------------------------------------------------------------


def test_root_accepts_path_and_file_uri(tmp_path: Path) -> None:
    assert CheckpointStorage(str(tmp_path)).root == os.path.realpath(tmp_path)
    assert CheckpointStorage(f"file://{tmp_path}").root == os.path.realpath(tmp_path)


@pytest.mark.parametrize("uri", ["hdfs://nn:8020/chk", "gs://b/x"])
def test_root_with_other_scheme_is_a_config_error(uri: str) -> None:
    scheme = uri.split(":")[0]
    with pytest.raises(ConfigError, match=rf"'{scheme}'.*only local or shared file systems"):
        CheckpointStorage(uri)


def test_layout(storage: CheckpointStorage) -> None:
    assert storage.job_dir(JOB) == os.path.join(storage.root, JOB)
    assert storage.checkpoint_dir(JOB, 42) == os.path.join(storage.root, JOB, "chk-42")
    assert os.path.isabs(storage.checkpoint_dir(JOB, 42))
    with pytest.raises(InvalidArgumentError):
        storage.job_dir("../escape")
    with pytest.raises(InvalidArgumentError):
        storage.checkpoint_dir(JOB, -1)


def test_savepoint_dir_is_flink_style(storage: CheckpointStorage, tmp_path: Path) -> None:
    default = storage.savepoint_dir("", JOB, 3)
    assert os.path.dirname(default) == os.path.join(storage.root, "savepoints")
    name = os.path.basename(default)
    prefix, job6, rand = name.split("-")
    assert (prefix, job6) == ("savepoint", JOB[:6])
    assert len(rand) == 12 and int(rand, 16) >= 0
    target = storage.savepoint_dir(str(tmp_path / "sp"), JOB, 3)
    assert os.path.dirname(target) == str(tmp_path / "sp")
    assert storage.savepoint_dir("", JOB, 3) != default
    with pytest.raises(InvalidArgumentError, match="absolute"):
        storage.savepoint_dir("relative/dir", JOB, 3)


# --- metadata ----------------------------------------------------------------------------------


def test_metadata_round_trip_and_format(storage: CheckpointStorage) -> None:
    directory = storage.checkpoint_dir(JOB, 7)
    state = write_file(os.path.join(directory, "map-0.state"))
    checkpoint = make_checkpoint(directory, [state])
    path = storage.write_metadata(directory, checkpoint)
    assert path == os.path.join(directory, METADATA_FILE)
    doc = json.loads(Path(path).read_text())
    assert doc["format"] == "snapflow-checkpoint-metadata"
    assert doc["version"] == 1
    assert doc["checkpoint"]["checkpoint_id"] == 7
    assert storage.read_metadata(directory) == checkpoint
    assert storage.read_metadata(path) == checkpoint
    assert storage.read_metadata(f"file://{directory}") == checkpoint


def test_metadata_is_create_if_absent_and_leaves_no_temp_files(
    storage: CheckpointStorage,
) -> None:
    directory = storage.checkpoint_dir(JOB, 7)
    first = make_checkpoint(directory, ["/a"], checkpoint_id=7)
    path = storage.write_metadata(directory, first)
    before = Path(path).read_bytes()
    with pytest.raises(AlreadyExistsError, match="already exists"):
        storage.write_metadata(directory, make_checkpoint(directory, ["/b"], checkpoint_id=8))
    assert Path(path).read_bytes() == before
    assert storage.read_metadata(directory).checkpoint_id == 7
    assert sorted(os.listdir(directory)) == [METADATA_FILE]


def test_metadata_is_not_written_over_a_concurrent_winner(
    storage: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link step itself refuses an existing _metadata (the early check can race)."""
    directory = storage.checkpoint_dir(JOB, 7)
    os.makedirs(directory)
    real_link = os.link

    def racing_link(src: str, dst: str) -> None:
        Path(dst).write_text("winner")
        real_link(src, dst)

    monkeypatch.setattr(os, "link", racing_link)
    with pytest.raises(AlreadyExistsError):
        storage.write_metadata(directory, make_checkpoint(directory, []))
    assert Path(directory, METADATA_FILE).read_text() == "winner"
    assert sorted(os.listdir(directory)) == [METADATA_FILE]


def test_savepoint_relative_paths_survive_moving_the_directory(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    sp = storage.savepoint_dir(str(tmp_path / "savepoints"), JOB, 5)
    inside = write_file(os.path.join(sp, "op-1", "map-0.state"), b"state-0")
    outside = write_file(tmp_path / "elsewhere" / "map-1.state")
    checkpoint = make_checkpoint(sp, [inside, outside], kind=CheckpointKind.SAVEPOINT)
    storage.write_metadata(sp, checkpoint)

    record = json.loads(Path(sp, METADATA_FILE).read_text())["checkpoint"]
    stored = [s["operator_states"][0]["handles"][0]["path"] for s in record["subtask_states"]]
    assert stored == [os.path.join("op-1", "map-0.state"), outside]

    moved = str(tmp_path / "moved" / "sp")
    os.makedirs(os.path.dirname(moved))
    shutil.move(sp, moved)
    restored = storage.read_metadata(moved)
    assert restored.external_path == moved
    assert restored.state_paths() == [os.path.join(moved, "op-1", "map-0.state"), outside]
    assert Path(restored.state_paths()[0]).read_bytes() == b"state-0"
    assert restored.subtask_states[0].operator_states[0].handles[0].size_bytes == 3


def test_read_metadata_errors(storage: CheckpointStorage, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointNotFoundError, match=str(missing)):
        storage.read_metadata(str(missing))

    bad = tmp_path / "bad"
    write_file(bad / METADATA_FILE, b"{not json")
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        storage.read_metadata(str(bad))

    write_file(bad / METADATA_FILE, json.dumps({"format": "flink", "version": 1}).encode())
    with pytest.raises(InvalidArgumentError, match="format is 'flink'"):
        storage.read_metadata(str(bad))

    doc = {"format": "snapflow-checkpoint-metadata", "version": 99, "checkpoint": {}}
    write_file(bad / METADATA_FILE, json.dumps(doc).encode())
    with pytest.raises(InvalidArgumentError, match="version 99 is not supported"):
        storage.read_metadata(str(bad))

    doc = {"format": "snapflow-checkpoint-metadata", "version": 1, "checkpoint": {"job_id": JOB}}
    write_file(bad / METADATA_FILE, json.dumps(doc).encode())
    with pytest.raises(InvalidArgumentError, match="malformed checkpoint record"):
        storage.read_metadata(str(bad))


# --- path validation ---------------------------------------------------------------------------


def test_validate_accepts_paths_inside_the_job_dir(storage: CheckpointStorage) -> None:
    path = os.path.join(storage.checkpoint_dir(JOB, 1), "x.state")
    assert storage.validate_state_path(JOB, path) == path
    assert storage.validate_state_path(JOB, f"file://{path}") == path
    assert storage.validate_state_path(JOB, path.replace("chk-1", "chk-1/./../chk-1")) == path


def test_validate_rejects_escapes(storage: CheckpointStorage, tmp_path: Path) -> None:
    job_dir = storage.job_dir(JOB)
    os.makedirs(job_dir)
    outside_dir = tmp_path / "outside"
    outside_dir.mkdir()
    os.symlink(outside_dir, os.path.join(job_dir, "link"))
    os.symlink(write_file(outside_dir / "f"), os.path.join(job_dir, "file-link"))

    bad = [
        os.path.join(job_dir, "chk-1", "..", "..", "..", "etc", "passwd"),  # ../ escape
        os.path.join(job_dir, "link", "f"),  # symlinked directory
        os.path.join(job_dir, "file-link"),  # symlinked file
        os.path.join(storage.job_dir(OTHER_JOB), "chk-1", "x"),  # another job's dir
        job_dir + "-suffix/x",  # shares the prefix only
        "chk-1/x",  # relative
        "",  # empty
        job_dir,  # the job dir itself is not a state file
        "s3://bucket/x",
    ]
    for path in bad:
        with pytest.raises(InvalidStatePathError) as info:
            storage.validate_state_path(JOB, path)
        if path:
            assert repr(path) in str(info.value) or path in str(info.value)
        assert job_dir in str(info.value)


def test_validate_allows_extra_dirs(storage: CheckpointStorage, tmp_path: Path) -> None:
    sp = tmp_path / "sp"
    path = str(sp / "x.state")
    with pytest.raises(InvalidStatePathError):
        storage.validate_state_path(JOB, path)
    assert storage.validate_state_path(JOB, path, allowed_extra_dirs=[str(sp)]) == path


def test_discard_state_never_deletes_outside_the_job_dir(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    job_dir = storage.job_dir(JOB)
    inside = [write_file(os.path.join(job_dir, "chk-3", f"s{i}")) for i in range(2)]
    victim = write_file(tmp_path / "precious.txt")
    other_job = write_file(os.path.join(storage.job_dir(OTHER_JOB), "chk-1", "s"))
    os.symlink(tmp_path, os.path.join(job_dir, "escape"))
    paths = [
        *inside,
        os.path.join(job_dir, "chk-3", "..", "..", "..", "precious.txt"),
        os.path.join(job_dir, "escape", "precious.txt"),
        victim,
        other_job,
        "precious.txt",
        os.path.join(job_dir, "chk-3", "already-gone"),
    ]
    assert storage.discard_state(JOB, paths) == 2
    assert not any(os.path.exists(p) for p in inside)
    assert os.path.exists(victim)
    assert os.path.exists(other_job)


def test_discard_state_in_allowed_savepoint_dir(storage: CheckpointStorage, tmp_path: Path) -> None:
    f = write_file(tmp_path / "sp" / "s")
    assert storage.discard_state(JOB, [f]) == 0
    assert os.path.exists(f)
    assert storage.discard_state(JOB, [f], allowed_extra_dirs=[str(tmp_path / "sp")]) == 1
    assert not os.path.exists(f)


# --- deletion ----------------------------------------------------------------------------------


def test_delete_checkpoint(storage: CheckpointStorage) -> None:
    directory = storage.checkpoint_dir(JOB, 4)
    write_file(os.path.join(directory, "a", "b"))
    assert storage.delete_checkpoint(JOB, 4) is True
    assert not os.path.exists(directory)
    assert storage.delete_checkpoint(JOB, 4) is False


def test_delete_checkpoint_refuses_symlinked_dir(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    victim = write_file(outside / "keep")
    os.makedirs(storage.job_dir(JOB))
    os.symlink(outside, storage.checkpoint_dir(JOB, 9))
    with pytest.raises(InvalidStatePathError):
        storage.delete_checkpoint(JOB, 9)
    assert os.path.exists(victim)


def test_dispose_savepoint(storage: CheckpointStorage, tmp_path: Path) -> None:
    sp = storage.savepoint_dir(str(tmp_path), JOB, 2)
    state = write_file(os.path.join(sp, "s"))
    storage.write_metadata(sp, make_checkpoint(sp, [state], kind=CheckpointKind.SAVEPOINT))
    assert storage.dispose_savepoint(os.path.join(sp, METADATA_FILE)) == sp
    assert not os.path.exists(sp)
    with pytest.raises(CheckpointNotFoundError):
        storage.dispose_savepoint(sp)


def test_dispose_savepoint_refuses_non_savepoints(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    keep = write_file(plain / "data.csv")
    with pytest.raises(InvalidArgumentError, match="no _metadata"):
        storage.dispose_savepoint(str(plain))
    write_file(plain / METADATA_FILE, b"garbage")
    with pytest.raises(InvalidArgumentError, match="invalid checkpoint metadata"):
        storage.dispose_savepoint(str(plain))
    chk = storage.checkpoint_dir(JOB, 1)
    storage.write_metadata(chk, make_checkpoint(chk, []))
    with pytest.raises(InvalidArgumentError, match="not a savepoint"):
        storage.dispose_savepoint(chk)
    assert os.path.exists(keep)
    assert os.path.exists(os.path.join(chk, METADATA_FILE))


def test_cleanup_orphans(storage: CheckpointStorage, tmp_path: Path) -> None:
    for cid in (1, 2, 3, 10):
        write_file(os.path.join(storage.checkpoint_dir(JOB, cid), "s"))
    shared = write_file(os.path.join(storage.job_dir(JOB), "shared", "s"))
    other = write_file(os.path.join(storage.checkpoint_dir(OTHER_JOB, 1), "s"))
    outside = tmp_path / "outside"
    victim = write_file(outside / "keep")
    os.symlink(outside, storage.checkpoint_dir(JOB, 11))
    not_ours = write_file(os.path.join(storage.job_dir(JOB), "chk-001", "s"))

    assert storage.cleanup_orphans(JOB, keep_checkpoint_ids=[3]) == [1, 2, 10, 11]
    assert os.path.exists(not_ours)
    assert storage.list_checkpoint_ids(JOB) == [3]
    assert os.path.exists(shared)
    assert os.path.exists(other)
    assert os.path.exists(victim)
    assert storage.cleanup_orphans(JOB, [3]) == []
    assert storage.cleanup_orphans(OTHER_JOB + "0", []) == []


def test_state_size(storage: CheckpointStorage, tmp_path: Path) -> None:
    a = write_file(tmp_path / "a", b"12345")
    assert storage.state_size([a, f"file://{a}", str(tmp_path / "missing")]) == 10

"""Checkpoint storage on S3 (moto's real S3 server): create-if-absent ``_metadata``, containment
of state paths by normalised key prefix, retention without LIST, savepoints that are disposed
and that restore from a copy at another prefix, orphan clean-up, and permanent errors."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import boto3
import pytest
from kit.checkpoints import JOB, OTHER_JOB, make_checkpoint
from kit.s3 import S3Server, create_bucket

from snapflow.coordinator.checkpoint_storage import METADATA_FILE, CheckpointStorage
from snapflow.coordinator.model import CheckpointKind
from snapflow.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    ConfigError,
    InvalidArgumentError,
    InvalidStatePathError,
    StorageError,
)
from snapflow.filestore import FileStore
from snapflow.s3_filestore import S3Settings


@pytest.fixture
def storage(s3: S3Server, s3_bucket: str) -> Iterator[CheckpointStorage]:
    # Settings of their own: these tests' requests are counted apart from other stores.
    yield CheckpointStorage(
        f"s3://{s3_bucket}/root/", S3Settings(endpoint_url=s3.endpoint_url, max_attempts=2)
    )


def store_of(storage: CheckpointStorage) -> FileStore:
    return storage.store(storage.root)


def put(storage: CheckpointStorage, path: str, data: bytes = b"abc") -> str:
    store_of(storage).write(path, data)
    return path


def exists(storage: CheckpointStorage, path: str) -> bool:
    return store_of(storage).exists(path)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# --- root and layout ---------------------------------------------------------------------------


def test_layout_on_s3(storage: CheckpointStorage, s3_bucket: str) -> None:
    root = f"s3://{s3_bucket}/root"
    assert storage.root == root and storage.is_object_store
    assert storage.job_dir(JOB) == f"{root}/{JOB}"
    assert storage.checkpoint_dir(JOB, 42) == f"{root}/{JOB}/chk-42"
    default = storage.savepoint_dir("", JOB, 3)
    assert default.startswith(f"{root}/savepoints/savepoint-{JOB[:6]}-")
    target = storage.savepoint_dir(f"s3://{s3_bucket}//sp/", JOB, 3)
    assert target.startswith(f"s3://{s3_bucket}/sp/savepoint-{JOB[:6]}-")
    before = store_of(storage).requests.snapshot()
    assert storage.ensure_directory(storage.checkpoint_dir(JOB, 1)) == f"{root}/{JOB}/chk-1"
    assert store_of(storage).requests.snapshot() == before  # no directories on S3
    assert CheckpointStorage(f"s3://{s3_bucket}").job_dir(JOB) == f"s3://{s3_bucket}/{JOB}"


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ("s3:///checkpoints", "names no bucket"),
        ("s3://my-bucket/a/../../etc", r"'\.\.' segment"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("s3://my-bucket/x?versionId=1", "query"),
    ],
)
def test_bad_s3_roots_say_what_to_fix(root: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        CheckpointStorage(root)
    assert len(str(info.value)) < 500


def test_bad_savepoint_targets_on_s3(storage: CheckpointStorage) -> None:
    with pytest.raises(InvalidArgumentError, match="names no bucket"):
        storage.savepoint_dir("s3:///sp", JOB, 1)
    with pytest.raises(InvalidArgumentError, match=r"'\.\.' segment"):
        storage.savepoint_dir("s3://my-bucket/sp/../..", JOB, 1)


# --- metadata ----------------------------------------------------------------------------------


def test_metadata_is_create_if_absent_on_s3(storage: CheckpointStorage) -> None:
    directory = storage.checkpoint_dir(JOB, 7)
    state = put(storage, f"{directory}/map-0.state")
    checkpoint = make_checkpoint(directory, [state])
    store = store_of(storage)
    before = store.requests.snapshot()
    path = storage.write_metadata(directory, checkpoint)
    assert delta(before, store.requests.snapshot()) == {"put": 1}
    assert path == f"{directory}/{METADATA_FILE}"
    first = store.read(path)
    assert json.loads(first)["format"] == "snapflow-checkpoint-metadata"

    with pytest.raises(AlreadyExistsError, match="never overwritten"):
        storage.write_metadata(directory, make_checkpoint(directory, [], checkpoint_id=8))
    assert store.read(path) == first  # the first one stays

    before = store.requests.snapshot()
    assert storage.read_metadata(directory) == checkpoint
    assert storage.read_metadata(path) == checkpoint
    assert storage.read_metadata(directory + "/") == checkpoint
    # Decided by name: one GET each, never a LIST or a HEAD.
    assert delta(before, store.requests.snapshot()) == {"get": 3}


def test_read_metadata_errors_on_s3(storage: CheckpointStorage) -> None:
    missing = storage.checkpoint_dir(JOB, 99)
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint metadata"):
        storage.read_metadata(missing)
    put(storage, f"{missing}/{METADATA_FILE}", b"{not json")
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        storage.read_metadata(missing)


# --- path validation ---------------------------------------------------------------------------


def test_validate_and_discard_by_normalised_prefix(
    storage: CheckpointStorage, s3_bucket: str
) -> None:
    job_dir = storage.job_dir(JOB)
    inside = put(storage, f"{job_dir}/chk-3/s0")
    assert storage.validate_state_path(JOB, inside) == inside
    assert storage.validate_state_path(JOB, f"{job_dir}//chk-3/s0") == inside
    victim = put(storage, f"s3://{s3_bucket}/other/precious")
    other_job = put(storage, f"{storage.job_dir(OTHER_JOB)}/chk-1/s")
    bad = [
        f"s3://{s3_bucket}/root/../other/precious",  # .. escape
        f"{job_dir}/chk-3/../../{OTHER_JOB}/chk-1/s",
        f"{job_dir}/./chk-3/s0",
        victim,
        other_job,
        f"{job_dir}-suffix/x",  # shares the prefix only
        f"s3://another-bucket/root/{JOB}/x",
        job_dir,  # the job dir itself is not a state file
        "/tmp/local/file",  # a local path with S3 storage
        "chk-3/s0",
    ]
    for path in bad:
        with pytest.raises(InvalidStatePathError) as info:
            storage.validate_state_path(JOB, path)
        assert job_dir in str(info.value)
        assert len(str(info.value)) < 1200

    # An allowed savepoint prefix elsewhere.
    sp = f"s3://{s3_bucket}/savepoints/savepoint-012345-abc"
    sp_file = put(storage, f"{sp}/s")
    with pytest.raises(InvalidStatePathError):
        storage.validate_state_path(JOB, sp_file)
    assert storage.validate_state_path(JOB, sp_file, allowed_extra_dirs=[sp]) == sp_file

    store = store_of(storage)
    before = store.requests.snapshot()
    assert storage.discard_state(JOB, [inside, inside, *bad, sp_file], [sp]) == 2
    assert delta(before, store.requests.snapshot()) == {"delete": 1}  # one batch
    assert not exists(storage, inside) and not exists(storage, sp_file)
    assert exists(storage, victim) and exists(storage, other_job)


# --- deletion ----------------------------------------------------------------------------------


def test_retention_deletes_the_named_files_without_list(storage: CheckpointStorage) -> None:
    store = store_of(storage)
    job_dir = storage.job_dir(JOB)
    for cid in (1, 2):
        directory = storage.checkpoint_dir(JOB, cid)
        files = [put(storage, f"{directory}/map-{i}.state") for i in range(3)]
        shared = put(storage, f"{job_dir}/shared/s-{cid}")
        storage.write_metadata(
            directory, make_checkpoint(directory, [*files, shared], checkpoint_id=cid)
        )
    one = storage.read_metadata(storage.checkpoint_dir(JOB, 1))

    before = store.requests.snapshot()
    assert storage.delete_checkpoint(JOB, 1, one) is True
    assert delta(before, store.requests.snapshot()) == {"delete": 1}
    assert store.list(storage.checkpoint_dir(JOB, 1)) == []
    assert exists(storage, f"{job_dir}/shared/s-1")  # shared state is not the chk's to delete

    # Without the checkpoint: its _metadata is read (one GET), still no LIST.
    before = store.requests.snapshot()
    assert storage.delete_checkpoint(JOB, 2) is True
    assert delta(before, store.requests.snapshot()) == {"get": 1, "delete": 1}
    assert store.list(storage.checkpoint_dir(JOB, 2)) == []
    before = store.requests.snapshot()
    assert storage.delete_checkpoint(JOB, 2) is False
    assert store.requests.snapshot()["list"] == before["list"]


def test_dispose_savepoint_on_s3(storage: CheckpointStorage, s3_bucket: str) -> None:
    sp = storage.savepoint_dir(f"s3://{s3_bucket}/sps", JOB, 2)
    inside = [put(storage, f"{sp}/op/map-{i}.state") for i in range(2)]
    outside = put(storage, f"s3://{s3_bucket}/elsewhere/map-9.state")
    storage.write_metadata(
        sp, make_checkpoint(sp, [*inside, outside], kind=CheckpointKind.SAVEPOINT)
    )
    neighbour = put(storage, f"{sp}-other/keep")  # shares the name prefix only
    assert storage.dispose_savepoint(f"{sp}/{METADATA_FILE}") == sp
    assert store_of(storage).list(sp) == []
    assert exists(storage, outside) and exists(storage, neighbour)
    with pytest.raises(CheckpointNotFoundError):
        storage.dispose_savepoint(sp)


def test_dispose_refuses_what_is_not_a_savepoint_on_s3(
    storage: CheckpointStorage, s3_bucket: str
) -> None:
    plain = f"s3://{s3_bucket}/plain"
    keep = put(storage, f"{plain}/data.csv")
    with pytest.raises(InvalidArgumentError, match="no _metadata"):
        storage.dispose_savepoint(plain)
    chk = storage.checkpoint_dir(JOB, 1)
    storage.write_metadata(chk, make_checkpoint(chk, []))
    with pytest.raises(InvalidArgumentError, match="not a savepoint"):
        storage.dispose_savepoint(chk)
    assert exists(storage, keep) and exists(storage, f"{chk}/{METADATA_FILE}")


def test_savepoint_copied_to_another_prefix_restores(
    storage: CheckpointStorage, s3: S3Server, s3_bucket: str
) -> None:
    sp = storage.savepoint_dir("", JOB, 5)
    inside = put(storage, f"{sp}/op-1/map-0.state", b"state-0")
    outside = put(storage, f"s3://{s3_bucket}/elsewhere/map-1.state")
    storage.write_metadata(
        sp, make_checkpoint(sp, [inside, outside], kind=CheckpointKind.SAVEPOINT)
    )
    record = json.loads(store_of(storage).read(f"{sp}/{METADATA_FILE}"))["checkpoint"]
    stored = [s["operator_states"][0]["handles"][0]["path"] for s in record["subtask_states"]]
    assert stored == ["op-1/map-0.state", outside]  # relative inside, absolute outside

    # Copy every object of the savepoint to another bucket and prefix, as a user would.
    target_bucket = f"copy-{uuid.uuid4().hex[:12]}"
    create_bucket(s3, target_bucket)
    client = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1")
    source_prefix = sp.removeprefix(f"s3://{s3_bucket}/")
    moved = f"s3://{target_bucket}/restored/sp"
    for obj in client.list_objects_v2(Bucket=s3_bucket, Prefix=source_prefix + "/")["Contents"]:
        client.copy_object(
            Bucket=target_bucket,
            Key="restored/sp" + obj["Key"].removeprefix(source_prefix),
            CopySource={"Bucket": s3_bucket, "Key": obj["Key"]},
        )
    restored = storage.read_metadata(moved)
    assert restored.external_path == moved
    assert restored.state_paths() == [f"{moved}/op-1/map-0.state", outside]
    assert store_of(storage).read(restored.state_paths()[0]) == b"state-0"


def test_cleanup_orphans_on_s3(storage: CheckpointStorage, s3_bucket: str) -> None:
    for cid in (1, 2, 3, 10):
        put(storage, f"{storage.checkpoint_dir(JOB, cid)}/s")
    shared = put(storage, f"{storage.job_dir(JOB)}/shared/s")
    not_ours = put(storage, f"{storage.job_dir(JOB)}/chk-001/s")
    other = put(storage, f"{storage.checkpoint_dir(OTHER_JOB, 1)}/s")
    assert storage.list_checkpoint_ids(JOB) == [1, 2, 3, 10]
    assert storage.cleanup_orphans(JOB, keep_checkpoint_ids=[3]) == [1, 2, 10]
    assert storage.list_checkpoint_ids(JOB) == [3]
    assert exists(storage, shared) and exists(storage, not_ours) and exists(storage, other)
    assert storage.cleanup_orphans(JOB, [3]) == []
    assert storage.cleanup_orphans("a" * 32, []) == []  # a job with nothing stored


def test_incomplete_savepoint_is_deleted_a_complete_one_kept(storage: CheckpointStorage) -> None:
    incomplete = storage.savepoint_dir("", JOB, 1)
    put(storage, f"{incomplete}/s")
    complete = storage.savepoint_dir("", JOB, 2)
    put(storage, f"{complete}/s")
    storage.write_metadata(complete, make_checkpoint(complete, [], kind=CheckpointKind.SAVEPOINT))
    assert storage.delete_incomplete_savepoint(incomplete) is True
    assert storage.delete_incomplete_savepoint(complete) is False
    assert store_of(storage).list(incomplete) == []
    assert exists(storage, f"{complete}/s")


def test_state_size_on_s3(storage: CheckpointStorage) -> None:
    a = put(storage, f"{storage.checkpoint_dir(JOB, 1)}/a", b"12345")
    assert storage.state_size([a, f"{storage.checkpoint_dir(JOB, 1)}/missing"]) == 5


def test_a_missing_bucket_is_a_storage_error_naming_it(s3: S3Server) -> None:
    storage = CheckpointStorage(
        "s3://snapflow-no-such-bucket/chk", S3Settings(endpoint_url=s3.endpoint_url)
    )
    directory = storage.checkpoint_dir(JOB, 1)
    with pytest.raises(StorageError) as info:
        storage.write_metadata(directory, make_checkpoint(directory, []))
    message = str(info.value)
    assert "snapflow-no-such-bucket" in message and "put_object" in message
    assert "does not exist" in message and len(message) < 600

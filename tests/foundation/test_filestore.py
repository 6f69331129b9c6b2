"""The file store contract, on a local directory and on a real S3 endpoint (moto's server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.s3 import S3Server, create_bucket

from snapflow.errors import AlreadyExistsError, InvalidArgumentError, StorageError
from snapflow.filestore import FileStore
from snapflow.filestore_registry import store_for
from snapflow.local_filestore import LocalFileStore
from snapflow.s3_filestore import MAX_KEYS_PER_DELETE, S3FileStore, S3Settings
from snapflow.s3_multipart import MultipartUploads


@pytest.fixture(params=["local", "s3"])
def store_and_base(
    request: pytest.FixtureRequest, tmp_path: Path, s3: S3Server
) -> Iterator[tuple[FileStore, str]]:
    if request.param == "local":
        yield LocalFileStore(), str(tmp_path)
    else:
        bucket = f"fs-{uuid.uuid4().hex[:12]}"
        create_bucket(s3, bucket)
        yield S3FileStore(S3Settings(endpoint_url=s3.endpoint_url)), f"s3://{bucket}/base"


def test_write_read_range_size_and_list(store_and_base: tuple[FileStore, str]) -> None:
    store, base = store_and_base
    a = store.join(base, "chk-1", "a.state")
    b = store.join(base, "chk-1", "sub", "b.state")
    store.write(a, b"0123456789")
    store.write(b, b"xyz")
    assert store.read(a) == b"0123456789"
    assert store.read_range(a, 3, 4) == b"3456"
    assert store.read_range(a, 8, 10) == b"89"  # short only at the end
    assert store.size(b) == 3
    assert store.exists(a) and not store.exists(store.join(base, "nope"))
    assert store.list(store.join(base, "chk-1")) == sorted([a, b])
    with pytest.raises(FileNotFoundError):
        store.read(store.join(base, "missing"))


def test_create_never_overwrites(store_and_base: tuple[FileStore, str]) -> None:
    store, base = store_and_base
    path = store.join(base, "chk-7", "_metadata")
    store.create(path, b"first")
    with pytest.raises(AlreadyExistsError, match="never overwritten"):
        store.create(path, b"second")
    assert store.read(path) == b"first"
    # No temporary files are left behind next to it.
    assert store.list(store.join(base, "chk-7")) == [path]


def test_delete_is_batched_and_tolerates_missing(store_and_base: tuple[FileStore, str]) -> None:
    store, base = store_and_base
    paths = [store.join(base, "many", f"f-{i}") for i in range(3)]
    for p in paths:
        store.write(p, b"x")
    before = store.requests.snapshot()
    assert store.delete([*paths, store.join(base, "many", "never-written")]) == 4
    after = store.requests.snapshot()
    assert store.list(store.join(base, "many")) == []
    if isinstance(store, S3FileStore):
        assert after["delete"] - before["delete"] == 1  # one DeleteObjects request


def test_s3_counts_exact_requests(s3: S3Server) -> None:
    bucket = f"fs-{uuid.uuid4().hex[:12]}"
    create_bucket(s3, bucket)
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url))
    keys = [f"s3://{bucket}/d/k{i}" for i in range(MAX_KEYS_PER_DELETE + 5)]
    store.write(keys[0], b"a")
    store.create(f"s3://{bucket}/d/_metadata", b"m")
    store.read_range(keys[0], 0, 1)
    store.delete(keys)
    assert store.requests.snapshot() == {"put": 2, "get": 1, "head": 0, "list": 0, "delete": 2}


def test_s3_permanent_error_names_bucket_and_operation(s3: S3Server) -> None:
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url, max_attempts=1))
    with pytest.raises(StorageError) as e:
        store.write("s3://no-such-bucket-snapflow/chk-1/x", b"data")
    text = str(e.value)
    assert "put_object" in text and "no-such-bucket-snapflow" in text
    assert len(text) < 1000


def test_store_for_refuses_unknown_schemes() -> None:
    with pytest.raises(InvalidArgumentError, match="unsupported storage scheme 'ftp'"):
        store_for("ftp://host/x")
    assert isinstance(store_for("/tmp/x"), LocalFileStore)
    assert isinstance(store_for("file:///tmp/x"), LocalFileStore)
    assert store_for("s3://b/p") is store_for("s3://other/q")


def test_multipart_upload_is_invisible_until_complete_and_idempotent(s3: S3Server) -> None:
    bucket = f"fs-{uuid.uuid4().hex[:12]}"
    create_bucket(s3, bucket)
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url))
    uploads = MultipartUploads(store)
    path = f"s3://{bucket}/out/part-0-1-0.arrow"
    upload_id = uploads.start(path)
    first = b"a" * MultipartUploads.MIN_PART_BYTES
    parts = [
        uploads.upload_part(path, upload_id, 1, first),
        uploads.upload_part(path, upload_id, 2, b"tail"),
    ]
    assert not store.exists(path)
    assert store.list(f"s3://{bucket}/out") == []
    assert uploads.complete(path, upload_id, parts) is True
    assert store.read(path) == first + b"tail"
    # A second commit of the same transaction (after a restore) changes nothing.
    uploads.complete(path, upload_id, parts)
    assert store.read(path) == first + b"tail"


def test_multipart_abort_drops_the_parts(s3: S3Server) -> None:
    bucket = f"fs-{uuid.uuid4().hex[:12]}"
    create_bucket(s3, bucket)
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url))
    uploads = MultipartUploads(store)
    path = f"s3://{bucket}/out/part-0-2-0.arrow"
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url, max_attempts=1))
    uploads = MultipartUploads(store)
    upload_id = uploads.start(path)
    part = uploads.upload_part(path, upload_id, 1, b"data")
    uploads.abort(path, upload_id)
    uploads.abort(path, upload_id)  # idempotent
    # S3 answers NoSuchUpload; moto answers 500. Either way nothing becomes visible.
    with pytest.raises(StorageError, match="complete"):
        uploads.complete(path, upload_id, [part])
    assert not store.exists(path)


def test_s3_missing_credentials_is_a_storage_error(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # No shared config files and no instance metadata lookups: nothing can supply credentials.
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url, max_attempts=1))
    with pytest.raises(StorageError, match=r"S3 put_object on s3://b/k failed: .*credentials"):
        store.write("s3://b/k", b"x")


def test_s3_delete_sends_each_key_once(s3_bucket: str, s3: S3Server) -> None:
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url))
    path = f"s3://{s3_bucket}/chk-1/merged"
    store.write(path, b"x")
    # Several handles of one merged object name the same path.
    assert store.delete([path, path, path]) == 1
    assert not store.exists(path)

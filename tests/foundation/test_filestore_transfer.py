"""Streamed file transfers (``upload_file``/``download_file``) on a local directory and on a
real S3 endpoint (moto's server): the bytes arrive whole, the CRC is the bytes', requests are
counted as made, and no transfer holds a whole large file in memory."""

from __future__ import annotations

import os
import tracemalloc
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.s3 import S3Server, create_bucket

from snapflow.errors import StorageError
from snapflow.filestore import TRANSFER_CHUNK_BYTES, FileStore, file_crc32
from snapflow.local_filestore import LocalFileStore
from snapflow.s3_filestore import S3FileStore, S3Settings

# Above twice the chunk: S3 takes it as a multipart upload of three parts.
LARGE = 2 * TRANSFER_CHUNK_BYTES + 1234


@pytest.fixture(params=["local", "s3"])
def store_and_base(
    request: pytest.FixtureRequest, tmp_path: Path, s3: S3Server
) -> Iterator[tuple[FileStore, str]]:
    if request.param == "local":
        yield LocalFileStore(), str(tmp_path / "store")
    else:
        bucket = f"fs-{uuid.uuid4().hex[:12]}"
        create_bucket(s3, bucket)
        yield S3FileStore(S3Settings(endpoint_url=s3.endpoint_url)), f"s3://{bucket}/base"


def _local_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("size", [0, 1000, LARGE], ids=["empty", "small", "multipart"])
def test_upload_then_download_round_trips(
    store_and_base: tuple[FileStore, str], tmp_path: Path, size: int
) -> None:
    store, base = store_and_base
    data = _local_file(tmp_path / "src.sst", size)
    path = store.join(base, "shared", "a.sst")
    store.upload_file(path, str(tmp_path / "src.sst"))
    assert store.size(path) == size
    if size:
        assert store.read_range(path, size - 10, 10) == data[-10:]
    got, crc = store.download_file(path, str(tmp_path / "dst.sst"))
    assert (got, crc) == (size, zlib.crc32(data))
    assert (tmp_path / "dst.sst").read_bytes() == data
    assert file_crc32(str(tmp_path / "dst.sst")) == (size, zlib.crc32(data))


def test_s3_upload_counts_the_multipart_requests(s3_bucket: str, tmp_path: Path) -> None:
    store = S3FileStore()
    _local_file(tmp_path / "small", 10)
    _local_file(tmp_path / "large", LARGE)
    store.upload_file(f"s3://{s3_bucket}/s", str(tmp_path / "small"))
    assert store.requests.snapshot()["put"] == 1  # one PutObject
    store.upload_file(f"s3://{s3_bucket}/l", str(tmp_path / "large"))
    # create + 3 parts + complete
    assert store.requests.snapshot() == {"put": 6, "get": 0, "head": 0, "list": 0, "delete": 0}
    store.download_file(f"s3://{s3_bucket}/l", str(tmp_path / "back"))
    assert store.requests.snapshot()["get"] == 1


def test_download_of_a_missing_object_leaves_no_file(
    store_and_base: tuple[FileStore, str], tmp_path: Path
) -> None:
    store, base = store_and_base
    with pytest.raises(FileNotFoundError):
        store.download_file(store.join(base, "never-written"), str(tmp_path / "dst"))
    assert not (tmp_path / "dst").exists()


def test_s3_upload_to_a_missing_bucket_names_it(s3: S3Server, tmp_path: Path) -> None:
    store = S3FileStore(S3Settings(endpoint_url=s3.endpoint_url, max_attempts=1))
    _local_file(tmp_path / "f", 10)
    with pytest.raises(StorageError, match="no-such-bucket-snapflow"):
        store.upload_file("s3://no-such-bucket-snapflow/x", str(tmp_path / "f"))


def test_transfers_never_hold_a_large_file_in_memory(
    store_and_base: tuple[FileStore, str], tmp_path: Path
) -> None:
    store, base = store_and_base
    size = 8 * TRANSFER_CHUNK_BYTES
    _local_file(tmp_path / "big", size)
    path = store.join(base, "big")
    tracemalloc.start()
    try:
        store.upload_file(path, str(tmp_path / "big"))
        _, upload_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        store.download_file(path, str(tmp_path / "back"))
        _, download_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A whole-file transfer would peak above the file's size; a streamed one at a few chunks
    # (botocore copies a part while it signs and checksums it), whatever the file's size.
    assert upload_peak < 5 * TRANSFER_CHUNK_BYTES, upload_peak
    assert download_peak < 3 * TRANSFER_CHUNK_BYTES, download_peak
    assert file_crc32(str(tmp_path / "back")) == file_crc32(str(tmp_path / "big"))


def test_local_upload_links_or_copies_durably(tmp_path: Path) -> None:
    store = LocalFileStore()
    data = _local_file(tmp_path / "src", 100)
    target = str(tmp_path / "d" / "obj")
    store.upload_file(target, str(tmp_path / "src"))
    assert Path(target).read_bytes() == data
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["obj"]  # no temporary left
    with pytest.raises(FileExistsError):  # names are never reused
        store.upload_file(target, str(tmp_path / "src"))

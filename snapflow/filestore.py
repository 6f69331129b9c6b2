"""Where Snapflow's bytes persist: a local (or mounted) file system or an S3 object store,
behind one small interface that both the coordinator and the workers use.

The interface is shaped by what object stores do well and charge for, not by POSIX:

* whole-object writes (:meth:`FileStore.write`) under names that are never reused, so no write
  ever replaces data someone may read;
* :meth:`FileStore.create`: create-if-absent, for ``_metadata``. On S3 it is a conditional
  ``PutObject`` with ``If-None-Match: *``, on a file system a hard link from a fsynced temporary
  file; either way a second writer (a stale coordinator included) gets
  :class:`~snapflow.errors.AlreadyExistsError` and the first object stays;
* ranged reads (:meth:`FileStore.read_range`), so a restore reads only the key-group sections
  it owns;
* batched deletes (:meth:`FileStore.delete`, ``DeleteObjects`` with up to 1,000 keys a request);
* listing (:meth:`FileStore.list`) only off the hot path (orphan clean-up, disposal);
* file transfers that never hold a whole object in memory (:meth:`FileStore.upload_file`,
  :meth:`FileStore.download_file`), for state files as large as a compaction makes them.

Every request is counted by kind (:class:`RequestCounts`): benchmarks and tests read the counts
to hold checkpoints to a request budget.

Library choice. S3 goes through ``s3fs`` (fsspec), whose ``call_s3`` gives one exact S3
request per call (no hidden ``HEAD``/``LIST`` of a file-system emulation) on aiobotocore's
async client, with the AWS conventions users already have: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``AWS_REGION`` and
``AWS_ENDPOINT_URL`` are read by botocore. Throttling and transient errors are retried by
botocore's ``standard`` retry mode (exponential back-off with jitter, at most
:attr:`S3Settings.max_attempts` attempts per request); a GET whose body breaks off after the
answer began is asked for again within the same bound (botocore retries requests, not body
reads); a create-if-absent whose earlier attempt was stored but whose answer was lost finds its
own bytes and succeeds. A permanent error (no such bucket, access denied), or a transient one
that outlasts the bound, raises :class:`~snapflow.errors.StorageError` naming the bucket, the
key and the operation. ``tests/foundation/test_filestore_retries.py`` proves these against a
real server behind a fault-injecting proxy.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import secrets
import shutil
import threading
import time
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from snapflow.durable_files import create_exclusive, fsync_dir, write_atomic
from snapflow.errors import AlreadyExistsError, InvalidArgumentError, StorageError

__all__ = [
    "TRANSFER_CHUNK_BYTES",
    "FileStore",
    "LocalFileStore",
    "MultipartUploads",
    "RequestCounts",
    "RequestKind",
    "S3FileStore",
    "S3Settings",
    "file_crc32",
    "is_object_store_uri",
    "store_for",
]

T = TypeVar("T")

#: S3 refuses more keys in one ``DeleteObjects`` request.
MAX_KEYS_PER_DELETE = 1000

#: Bytes a file transfer holds in memory at once: the chunk of a streamed download, and the
#: part size of an S3 upload (a file below twice this size is one ``PutObject``; s3fs reads it
#: whole). At least S3's 5 MiB minimum part size.
TRANSFER_CHUNK_BYTES = 8 * 1024 * 1024


class RequestKind(StrEnum):
    """What an object store bills a request as."""

    PUT = "put"
    GET = "get"
    HEAD = "head"
    LIST = "list"
    DELETE = "delete"


@dataclass
class RequestCounts:
    """Requests made by one :class:`FileStore`, by kind. Thread-safe."""

    _counts: Counter[RequestKind] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: RequestKind, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def snapshot(self) -> dict[str, int]:
        """The counts so far, every kind present (0 when none)."""
        with self._lock:
            return {kind.value: self._counts[kind] for kind in RequestKind}


class FileStore(ABC):
    """A place that holds immutable named blobs. Paths are full URIs or absolute paths as this
    store's :meth:`join` builds them; methods block (call them off the event loop)."""

    def __init__(self) -> None:
        self.requests = RequestCounts()

    @abstractmethod
    def join(self, base: str, *names: str) -> str:
        """``base`` with ``names`` appended as path segments."""

    @abstractmethod
    def write(self, path: str, data: bytes) -> None:
        """Write a whole object. Callers use unique names: nothing is ever replaced that someone
        may read (on a file system the write is atomic: temporary file, fsync, rename)."""

    @abstractmethod
    def create(self, path: str, data: bytes) -> None:
        """Create ``path`` only if it does not exist (atomically); raise
        :class:`AlreadyExistsError` and leave the existing object untouched otherwise."""

    @abstractmethod
    def read(self, path: str) -> bytes:
        """The whole object; :class:`FileNotFoundError` if there is none."""

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer only at the end of the object)."""

    @abstractmethod
    def size(self, path: str) -> int:
        """The object's size in bytes; :class:`FileNotFoundError` if there is none."""

    @abstractmethod
    def delete(self, paths: Iterable[str]) -> int:
        """Delete objects (missing ones are fine), batched; returns how many distinct paths were
        asked for."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every object under the directory ``prefix``, recursively (off the hot path only)."""

    @abstractmethod
    def upload_file(self, path: str, local_path: str) -> None:
        """Write the local file ``local_path`` as the object ``path`` (a unique name, as for
        :meth:`write`) without reading it into memory whole. The local file must not change
        while it is uploaded."""

    @abstractmethod
    def download_file(self, path: str, local_path: str) -> tuple[int, int]:
        """Write the object ``path`` to the new local file ``local_path`` in chunks; returns
        ``(size, CRC-32)`` of the bytes written. :class:`FileNotFoundError` if there is no
        object (and then no local file either)."""

    def exists(self, path: str) -> bool:
        try:
            self.size(path)
        except FileNotFoundError:
            return False
        return True


def _crc_copy(reader: Any, writer: Any) -> tuple[int, int]:
    """Copy ``reader`` to ``writer`` in :data:`TRANSFER_CHUNK_BYTES` chunks; ``(size, crc)``."""
    size = crc = 0
    while chunk := reader.read(TRANSFER_CHUNK_BYTES):
        writer.write(chunk)
        size += len(chunk)
        crc = zlib.crc32(chunk, crc)
    return size, crc


def file_crc32(local_path: str) -> tuple[int, int]:
    """``(size, CRC-32)`` of a local file, read in chunks."""
    size = crc = 0
    with open(local_path, "rb") as f:
        while chunk := f.read(TRANSFER_CHUNK_BYTES):
            size += len(chunk)
            crc = zlib.crc32(chunk, crc)
    return size, crc


# ---------------------------------------------------------------------------------------------
# Local (or mounted shared) file system
# ---------------------------------------------------------------------------------------------


class LocalFileStore(FileStore):
    """A POSIX file system. Requests are counted as an object store would bill them, so a local
    run shows the request budget a deployment on S3 would have."""

    def join(self, base: str, *names: str) -> str:
        return os.path.join(base, *names)

    def write(self, path: str, data: bytes) -> None:
        self.requests.add(RequestKind.PUT)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, data)

    def create(self, path: str, data: bytes) -> None:
        self.requests.add(RequestKind.PUT)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            create_exclusive(path, data)
        except FileExistsError:
            raise AlreadyExistsError(f"{path} already exists; it is never overwritten") from None

    def read(self, path: str) -> bytes:
        self.requests.add(RequestKind.GET)
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        self.requests.add(RequestKind.GET)
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def size(self, path: str) -> int:
        self.requests.add(RequestKind.HEAD)
        return os.stat(path).st_size

    def delete(self, paths: Iterable[str]) -> int:
        n = 0
        for path in paths:
            n += 1
            self.requests.add(RequestKind.DELETE)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return n

    def upload_file(self, path: str, local_path: str) -> None:
        """A hard link when both names are on one file system (the callers' files are
        immutable once written, as RocksDB's SST files are, so the object and the local file
        may share the inode; the data is fsynced, a link adds no bytes); a chunked copy to a
        temporary file, fsynced and renamed, otherwise."""
        self.requests.add(RequestKind.PUT)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        try:
            os.link(local_path, path)
        except FileExistsError:
            raise
        except OSError:
            tmp = f"{path}.tmp-{secrets.token_hex(6)}"
            try:
                with open(local_path, "rb") as src, open(tmp, "xb") as dst:
                    shutil.copyfileobj(src, dst, TRANSFER_CHUNK_BYTES)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(directory)

    def download_file(self, path: str, local_path: str) -> tuple[int, int]:
        self.requests.add(RequestKind.GET)
        with open(path, "rb") as src:
            try:
                with open(local_path, "xb") as dst:
                    return _crc_copy(src, dst)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local_path)
                raise

    def list(self, prefix: str) -> list[str]:
        self.requests.add(RequestKind.LIST)
        out: list[str] = []
        for directory, _, files in os.walk(prefix):
            out.extend(os.path.join(directory, f) for f in files)
        return sorted(out)


# ---------------------------------------------------------------------------------------------
# S3
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Settings:
    """How to reach S3. Every field left empty falls back to the AWS conventions (environment,
    ``~/.aws/config`` and ``~/.aws/credentials``, instance profiles) that botocore applies."""

    endpoint_url: str | None = None
    """An S3-compatible endpoint (MinIO, a local test server); ``AWS_ENDPOINT_URL`` otherwise."""
    region: str | None = None
    """The bucket's region; ``AWS_REGION``/``AWS_DEFAULT_REGION`` otherwise."""
    profile: str | None = None
    """A named profile of the shared AWS config files; ``AWS_PROFILE`` otherwise."""
    max_attempts: int = 5
    """Attempts per request, the first included (botocore's ``total_max_attempts``), under its
    ``standard`` retry mode: throttling, 5xx and network errors are retried with exponential
    back-off and jitter; at least 1 (1: no retry)."""
    connect_timeout_s: float = 5.0
    """TCP connect timeout of one attempt."""
    read_timeout_s: float = 30.0
    """Socket read timeout of one attempt."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgumentError(f"S3 max_attempts must be >= 1, got {self.max_attempts}")


# Error codes that no retry can fix: the message must name what to change.
_PERMANENT = {
    "NoSuchBucket": "the bucket does not exist",
    "AccessDenied": "access denied (check the credentials and the bucket policy)",
    "InvalidAccessKeyId": "the access key id is not known to the endpoint",
    "SignatureDoesNotMatch": "the secret access key does not match the access key id",
    "AllAccessDisabled": "all access to the bucket is disabled",
}


def _split(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    if parts.scheme != "s3" or not parts.netloc:
        raise InvalidArgumentError(f"not an s3://bucket/key URI: {uri!r:.200}")
    return parts.netloc, unquote(parts.path.lstrip("/"))


class S3FileStore(FileStore):
    """Amazon S3 or an S3-compatible endpoint, through s3fs's exact per-request calls."""

    def __init__(self, settings: S3Settings | None = None) -> None:
        super().__init__()
        self.settings = settings or S3Settings()
        self._fs: Any = None
        self._lock = threading.Lock()

    def _client(self) -> Any:
        with self._lock:
            if self._fs is None:
                import s3fs  # imported lazily: a local-only deployment never loads botocore

                s = self.settings
                client_kwargs: dict[str, Any] = {}
                if s.endpoint_url:
                    client_kwargs["endpoint_url"] = s.endpoint_url
                if s.region:
                    client_kwargs["region_name"] = s.region
                self._fs = s3fs.S3FileSystem(
                    profile=s.profile,
                    client_kwargs=client_kwargs,
                    config_kwargs={
                        # total_max_attempts counts the first attempt; botocore's
                        # max_attempts here would count retries only (one attempt more).
                        "retries": {"mode": "standard", "total_max_attempts": s.max_attempts},
                        "connect_timeout": s.connect_timeout_s,
                        "read_timeout": s.read_timeout_s,
                    },
                    skip_instance_cache=True,
                    use_listings_cache=False,
                )
                # s3fs retries some errors itself on top of botocore; one bound is enough.
                self._fs.retries = 1
            return self._fs

    def _call(self, kind: RequestKind, operation: str, uri: str, **kwargs: Any) -> Any:
        self.requests.add(kind)
        return self._mapped(
            operation, uri, kwargs.get("Bucket"), self._client().call_s3, operation, **kwargs
        )

    def _mapped(
        self, operation: str, uri: str, bucket: Any, fn: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """``fn(*args, **kwargs)`` with s3fs's and botocore's errors mapped to ours."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as e:
            if "bucket" in str(e).lower():  # NoSuchBucket: no retry or restore can fix it
                raise StorageError(
                    f"S3 {operation} on {uri}: the bucket {bucket!r} does not "
                    "exist (NoSuchBucket); create it or fix the storage URI"
                ) from e
            raise
        except FileExistsError:
            raise
        except PermissionError as e:
            raise StorageError(
                f"S3 {operation} on {uri}: access denied (check the credentials and the bucket "
                f"policy): {e}"
            ) from e
        except OSError as e:
            raise StorageError(f"S3 {operation} on {uri} failed: {_describe(e)}") from e
        except Exception as e:
            # botocore's own errors (no credentials, a bad endpoint, a bad parameter) are not
            # OSErrors; they are as permanent as access denied and must name what failed.
            if not type(e).__module__.startswith(("botocore", "aiobotocore", "s3fs")):
                raise
            raise StorageError(f"S3 {operation} on {uri} failed: {_describe(e)}") from e

    def join(self, base: str, *names: str) -> str:
        out = base.rstrip("/")
        for name in names:
            out = f"{out}/{name.strip('/')}"
        return out

    def write(self, path: str, data: bytes) -> None:
        bucket, key = _split(path)
        self._call(RequestKind.PUT, "put_object", path, Bucket=bucket, Key=key, Body=data)

    def create(self, path: str, data: bytes) -> None:
        """A conditional ``PutObject`` (``If-None-Match: *``). An existing object holding exactly
        ``data`` counts as created by this call (see below)."""
        bucket, key = _split(path)
        try:
            self._call(
                RequestKind.PUT,
                "put_object",
                path,
                Bucket=bucket,
                Key=key,
                Body=data,
                IfNoneMatch="*",
            )
        except FileExistsError as e:
            conflict: BaseException = e
        except StorageError as e:
            # s3fs maps 412 PreconditionFailed to FileExistsError; some endpoints answer 409
            # ConditionalRequestConflict when two creates race: the other one won.
            if "ConditionalRequestConflict" not in str(e) and "PreconditionFailed" not in str(e):
                raise
            conflict = e
        else:
            return
        # A retried create whose earlier attempt was applied but whose answer was lost (a
        # reset or timeout after S3 stored it) finds its own object: a success, not a second
        # writer. The bytes tell which. botocore's RetryAttempts cannot: aiohttp itself
        # resends a request whose reused connection was reset. One GET, on a conflict only.
        with contextlib.suppress(FileNotFoundError):
            if self.read(path) == data:
                return
        raise AlreadyExistsError(f"{path} already exists; it is never overwritten") from conflict

    def upload_file(self, path: str, local_path: str) -> None:
        """s3fs's ``put_file``: one ``PutObject`` below twice :data:`TRANSFER_CHUNK_BYTES`,
        a multipart upload of such parts (one at a time: the callers upload several files at
        once) above, aborted if a part fails. Counted as the requests it makes."""
        bucket, _ = _split(path)
        size = os.path.getsize(local_path)
        chunk = _s3fs_chunksize(size)
        if size < 2 * chunk:
            self.requests.add(RequestKind.PUT)
        else:  # create, the parts, complete
            self.requests.add(RequestKind.PUT, 2 + math.ceil(size / chunk))
        self._mapped(
            "put_file",
            path,
            bucket,
            self._client().put_file,
            local_path,
            path,
            chunksize=chunk,
            max_concurrency=1,
        )

    def download_file(self, path: str, local_path: str) -> tuple[int, int]:
        """One ``GetObject`` whose body is streamed to the file in chunks (the file starts
        over if the body breaks off and the GET is asked for again)."""

        async def stream(body: Any, dst: Any) -> tuple[int, int]:
            dst.seek(0)
            dst.truncate()
            size = crc = 0
            while chunk := await body.read(TRANSFER_CHUNK_BYTES):
                dst.write(chunk)
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
            return size, crc

        try:
            with open(local_path, "xb") as dst:
                return self._get(path, lambda body: stream(body, dst))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local_path)
            raise

    def read(self, path: str) -> bytes:
        return self._get(path, _read_all)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._get(path, _read_all, Range=f"bytes={offset}-{offset + length - 1}")

    def _get(self, path: str, consume: Callable[[Any], Awaitable[T]], **kwargs: Any) -> T:
        """A ``GetObject`` whose body ``consume`` reads. botocore retries the request, not the
        reading of its body once the answer began: a body that breaks off (a reset, a short
        answer, a read timeout) is asked for again, with botocore's back-off, up to
        ``max_attempts`` GETs in all; then a :class:`StorageError` names the operation."""
        from fsspec.asyn import sync

        bucket, key = _split(path)
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            out = self._call(RequestKind.GET, "get_object", path, Bucket=bucket, Key=key, **kwargs)

            async def read(body: Any = out["Body"]) -> T:
                async with body as stream:
                    return await consume(stream)

            try:
                return sync(self._client().loop, read)
            except _broken_body_errors() as e:
                if attempt == attempts:
                    raise StorageError(
                        f"S3 get_object on {path} failed: the answer broke off in each of "
                        f"{attempts} attempts, last: {_describe(e)}"
                    ) from e
            except OSError as e:
                raise StorageError(f"S3 get_object on {path} failed: {_describe(e)}") from e
            time.sleep(random.random() * min(2 ** (attempt - 1), 20))
        raise AssertionError("unreachable")  # the loop returns or raises

    def size(self, path: str) -> int:
        bucket, key = _split(path)
        out = self._call(RequestKind.HEAD, "head_object", path, Bucket=bucket, Key=key)
        return int(out["ContentLength"])

    def delete(self, paths: Iterable[str]) -> int:
        by_bucket: dict[str, list[str]] = {}
        n = 0
        # Handles of one merged object share its path: delete each key once.
        for path in dict.fromkeys(paths):
            bucket, key = _split(path)
            by_bucket.setdefault(bucket, []).append(key)
            n += 1
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), MAX_KEYS_PER_DELETE):
                chunk = keys[i : i + MAX_KEYS_PER_DELETE]
                out = self._call(
                    RequestKind.DELETE,
                    "delete_objects",
                    f"s3://{bucket}/{chunk[0]}",
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
                errors = out.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StorageError(
                        f"S3 delete_objects in bucket {bucket}: {len(errors)} of {len(chunk)} "
                        f"keys not deleted, first {first.get('Key')!r}: {first.get('Code')} "
                        f"{first.get('Message', '')}"[:500]
                    )
        return n

    def list(self, prefix: str) -> list[str]:
        bucket, key = _split(prefix)
        key = key.rstrip("/") + "/" if key else ""
        out: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(RequestKind.LIST, "list_objects_v2", prefix, **kwargs)
            out.extend(f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return out
            token = page.get("NextContinuationToken")


@dataclass(frozen=True)
class UploadedPart:
    """One part of a multipart upload: what completing the upload needs."""

    number: int
    etag: str


class MultipartUploads:
    """S3 multipart uploads whose id outlives the process that started them: the two phases
    of an exactly-once object sink. Parts uploaded to an upload are invisible to every reader
    until :meth:`complete`, which makes the whole object visible at once; :meth:`abort` drops
    them. Both are idempotent, so a restored sink can finish or drop what a dead one began.
    S3 requires every part but the last to be at least 5 MiB."""

    MIN_PART_BYTES = 5 * 1024 * 1024

    def __init__(self, store: S3FileStore) -> None:
        self.store = store

    def start(self, path: str) -> str:
        bucket, key = _split(path)
        out = self.store._call(
            RequestKind.PUT, "create_multipart_upload", path, Bucket=bucket, Key=key
        )
        return str(out["UploadId"])

    def upload_part(self, path: str, upload_id: str, number: int, data: bytes) -> UploadedPart:
        bucket, key = _split(path)
        out = self.store._call(
            RequestKind.PUT,
            "upload_part",
            path,
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
        )
        return UploadedPart(number, str(out["ETag"]))

    def complete(self, path: str, upload_id: str, parts: list[UploadedPart]) -> bool:
        """Make the object visible. Returns False when the upload is gone but the object
        exists (completed before: a re-commit after a restore); raises when neither is there."""
        bucket, key = _split(path)
        try:
            self.store._call(
                RequestKind.PUT,
                "complete_multipart_upload",
                path,
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={
                    "Parts": [{"PartNumber": p.number, "ETag": p.etag} for p in parts]
                },
            )
            return True
        except (FileNotFoundError, StorageError) as e:
            if "NoSuchUpload" not in str(e) and not isinstance(e, FileNotFoundError):
                raise
            if self.store.exists(path):
                return False
            raise StorageError(
                f"cannot complete the upload of {path}: the upload {upload_id[:16]}... is gone "
                "and the object does not exist (aborted, or expired by a lifecycle rule)"
            ) from e

    def abort(self, path: str, upload_id: str) -> None:
        bucket, key = _split(path)
        with contextlib.suppress(FileNotFoundError):
            try:
                self.store._call(
                    RequestKind.DELETE,
                    "abort_multipart_upload",
                    path,
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                )
            except StorageError as e:
                if "NoSuchUpload" not in str(e):
                    raise

    def list_uploads(self, prefix: str) -> list[tuple[str, str]]:
        """``(path, upload_id)`` of every upload neither completed nor aborted whose key
        starts with ``prefix`` (a key prefix, not a directory). Off the hot path: a restore
        finds by name what a dead run may have started."""
        bucket, key = _split(prefix)
        out: list[tuple[str, str]] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        while True:
            page = self.store._call(RequestKind.LIST, "list_multipart_uploads", prefix, **kwargs)
            out.extend(
                (f"s3://{bucket}/{u['Key']}", str(u["UploadId"])) for u in page.get("Uploads", [])
            )
            if not page.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")


def _s3fs_chunksize(size: int) -> int:
    """The part size s3fs's ``put_file`` uses for a file of ``size`` bytes when asked for
    :data:`TRANSFER_CHUNK_BYTES` (S3 allows 10,000 parts: larger files get larger parts)."""
    return max(TRANSFER_CHUNK_BYTES, math.ceil(size / 10_000))


async def _read_all(body: Any) -> bytes:
    return bytes(await body.read())


def _broken_body_errors() -> tuple[type[BaseException], ...]:
    """What reading a GET's body raises when the connection fails midway (imported lazily:
    a local-only deployment never loads botocore)."""
    import aiohttp
    from botocore.exceptions import HTTPClientError, IncompleteReadError

    return (
        aiohttp.ClientPayloadError,
        aiohttp.ClientConnectionError,
        HTTPClientError,  # botocore's ResponseStreamingError and ReadTimeoutError among them
        IncompleteReadError,
        TimeoutError,
    )


def _describe(error: BaseException) -> str:
    text = str(error)
    for code, meaning in _PERMANENT.items():
        if code in text:
            return f"{meaning} ({code})"
    return f"{type(error).__name__}: {text}"[:400]


# ---------------------------------------------------------------------------------------------
# Choosing a store
# ---------------------------------------------------------------------------------------------


def is_object_store_uri(location: str) -> bool:
    return urlsplit(location).scheme == "s3"


_STORES: dict[tuple[str, S3Settings | None], FileStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(location: str, s3: S3Settings | None = None) -> FileStore:
    """The process-wide store for ``location``'s scheme (one client, one set of counts, per
    scheme and settings): ``s3://`` -> :class:`S3FileStore`, a path or ``file://`` ->
    :class:`LocalFileStore`."""
    scheme = urlsplit(location).scheme
    if scheme not in ("", "file", "s3"):
        raise InvalidArgumentError(
            f"unsupported storage scheme {scheme!r} in {location!r:.200}: use a path, file:// "
            "or s3://bucket/prefix"
        )
    key = ("s3", s3 or S3Settings()) if scheme == "s3" else ("file", None)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = S3FileStore(s3) if scheme == "s3" else LocalFileStore()
            _STORES[key] = store
        return store


def request_totals() -> Mapping[str, dict[str, int]]:
    """Requests of every store this process made, by scheme and kind (for benchmarks)."""
    with _STORES_LOCK:
        return {scheme: store.requests.snapshot() for (scheme, _), store in _STORES.items()}

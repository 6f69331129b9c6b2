"""Amazon S3 or an S3-compatible endpoint as a :class:`~snapflow.filestore.FileStore`.

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
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from snapflow.errors import AlreadyExistsError, InvalidArgumentError, StorageError
from snapflow.filestore import TRANSFER_CHUNK_BYTES, FileStore, RequestKind

__all__ = ["MAX_KEYS_PER_DELETE", "S3FileStore", "S3Settings", "split_s3_uri"]

T = TypeVar("T")

#: S3 refuses more keys in one ``DeleteObjects`` request.
MAX_KEYS_PER_DELETE = 1000


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


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://bucket/key`` URI."""
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

    def call(self, kind: RequestKind, operation: str, uri: str, **kwargs: Any) -> Any:
        """One S3 request ``operation``, counted as ``kind``, its errors mapped to ours."""
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
        bucket, key = split_s3_uri(path)
        self.call(RequestKind.PUT, "put_object", path, Bucket=bucket, Key=key, Body=data)

    def create(self, path: str, data: bytes) -> None:
        """A conditional ``PutObject`` (``If-None-Match: *``). An existing object holding exactly
        ``data`` counts as created by this call (see below)."""
        bucket, key = split_s3_uri(path)
        try:
            self.call(
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
        bucket, _ = split_s3_uri(path)
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

        bucket, key = split_s3_uri(path)
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            out = self.call(RequestKind.GET, "get_object", path, Bucket=bucket, Key=key, **kwargs)

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
        bucket, key = split_s3_uri(path)
        out = self.call(RequestKind.HEAD, "head_object", path, Bucket=bucket, Key=key)
        return int(out["ContentLength"])

    def delete(self, paths: Iterable[str]) -> int:
        by_bucket: dict[str, list[str]] = {}
        n = 0
        # Handles of one merged object share its path: delete each key once.
        for path in dict.fromkeys(paths):
            bucket, key = split_s3_uri(path)
            by_bucket.setdefault(bucket, []).append(key)
            n += 1
        for bucket, keys in by_bucket.items():
            for i in range(0, len(keys), MAX_KEYS_PER_DELETE):
                chunk = keys[i : i + MAX_KEYS_PER_DELETE]
                out = self.call(
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
        bucket, key = split_s3_uri(prefix)
        key = key.rstrip("/") + "/" if key else ""
        out: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.call(RequestKind.LIST, "list_objects_v2", prefix, **kwargs)
            out.extend(f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return out
            token = page.get("NextContinuationToken")


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

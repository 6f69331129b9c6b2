"""S3 multipart uploads whose id outlives the process: the two phases of an exactly-once
object sink."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from snapflow.errors import StorageError
from snapflow.filestore import RequestKind
from snapflow.s3_filestore import S3FileStore, split_s3_uri

__all__ = ["MultipartUploads", "UploadedPart"]


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
        bucket, key = split_s3_uri(path)
        out = self.store.call(
            RequestKind.PUT, "create_multipart_upload", path, Bucket=bucket, Key=key
        )
        return str(out["UploadId"])

    def upload_part(self, path: str, upload_id: str, number: int, data: bytes) -> UploadedPart:
        bucket, key = split_s3_uri(path)
        out = self.store.call(
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
        bucket, key = split_s3_uri(path)
        try:
            self.store.call(
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
        bucket, key = split_s3_uri(path)
        with contextlib.suppress(FileNotFoundError):
            try:
                self.store.call(
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
        bucket, key = split_s3_uri(prefix)
        out: list[tuple[str, str]] = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        while True:
            page = self.store.call(RequestKind.LIST, "list_multipart_uploads", prefix, **kwargs)
            out.extend(
                (f"s3://{bucket}/{u['Key']}", str(u["UploadId"])) for u in page.get("Uploads", [])
            )
            if not page.get("IsTruncated"):
                return out
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

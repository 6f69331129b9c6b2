"""Where a transaction of a file sink lives from its first write to its commit: a :class:`Staging`,
chosen by the sink's directory (:func:`staging_for`).

A path: :class:`LocalStaging`
    A transaction is a staging file ``<dir>/_staging/<vertex>-<subtask>-<attempt>-<seq>-
    <token>.arrow``, created on the first write, flushed, closed and fsync'ed on
    pre-commit. Commit is an atomic ``os.rename`` to the part file and is idempotent: a
    target that exists while the staging file is gone was committed before. Staging files
    of transactions that never reach a completed checkpoint (pre-committed for a checkpoint
    that was then subsumed by a failure) stay in ``_staging`` as orphans.

``s3://bucket/prefix``: :class:`MultipartStaging`
    A transaction is spooled to an anonymous local temporary file (``TMPDIR``) while it is
    open. Pre-commit uploads it as the parts of an S3 multipart upload whose key is the
    part file's (parts of 5 MiB, the last one smaller) and records the upload id and the
    parts' ETags in the transaction, hence in the checkpointed operator state: ``1 +
    ceil(size / 5 MiB)`` requests. An incomplete upload is not an object: no listing or
    read sees it. Commit completes the upload (one request), which makes the whole object
    visible at once; a commit of an upload completed before finds the object and does
    nothing (a restore's re-commit: two requests). Abort aborts the upload (idempotent); a
    restore aborts the restored current transaction's upload, if a later pre-commit
    started one, found by name (one ``ListMultipartUploads``). Transient errors are retried
    by botocore (:mod:`snapflow.filestore`); a permanent one (no such bucket, access
    denied) raises a :class:`~snapflow.errors.StorageError` naming the bucket and the
    operation, which fails the snapshot, so the task declines the checkpoint. Uploads
    abandoned by a dead process that no restore names stay incomplete and invisible: a
    bucket lifecycle rule (``AbortIncompleteMultipartUpload``) reclaims their storage.
"""

from __future__ import annotations

import os
import re
import tempfile
from abc import ABC, abstractmethod
from contextlib import suppress
from typing import IO, Protocol

from snapflow.durable_files import fsync_dir
from snapflow.errors import InvalidArgumentError
from snapflow.filestore import is_object_store_uri
from snapflow.filestore_registry import store_for
from snapflow.s3_filestore import S3FileStore
from snapflow.s3_multipart import MultipartUploads, UploadedPart
from snapflow.worker.connectors.two_phase_commit import SinkCommitError

STAGING_DIR = "_staging"


class StagedTransaction(Protocol):
    """What a :class:`Staging` reads and records of a sink's transaction (the sink's
    ``FileTransaction``; a protocol, as the sink module imports this one)."""

    staging_name: str  # under _staging/ (local)
    subtask: int
    seq: int
    token: str
    part_name: str | None  # set by the sink's pre_commit (None: nothing to commit)
    upload_id: str | None  # S3 only, set by pre_commit
    parts: tuple[tuple[int, str], ...]  # S3 only, set by pre_commit: (part number, ETag)


class Staging(ABC):
    """Where a transaction's bytes live from its first write to its commit, and how they
    become the part file ``join(part_name)`` of the sink's directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @abstractmethod
    def join(self, name: str) -> str:
        """The path of ``name`` in the directory."""

    @abstractmethod
    def open(self, txn: StagedTransaction) -> IO[bytes]:
        """A new file for the transaction's bytes (the sink closes it, or ``pre_commit``)."""

    @abstractmethod
    def pre_commit(self, txn: StagedTransaction, f: IO[bytes]) -> None:
        """Make the bytes written to ``f`` durable and still invisible, ready to become
        ``txn.part_name``; record in ``txn`` what :meth:`commit` needs; close ``f``."""

    @abstractmethod
    def commit(self, txn: StagedTransaction) -> None:
        """Make the pre-committed bytes the part file, atomically. Idempotent."""

    @abstractmethod
    def abort(self, txn: StagedTransaction) -> None:
        """Drop the transaction's bytes (its file is closed already). Idempotent."""

    def recover_and_abort(self, txn: StagedTransaction) -> None:
        """Drop what a dead run wrote for the restored current transaction."""
        self.abort(txn)


class LocalStaging(Staging):
    """A staging file under ``<dir>/_staging``, renamed into ``<dir>`` on commit."""

    def __init__(self, directory: str) -> None:
        super().__init__(os.path.abspath(directory))
        self.staging_dir = os.path.join(self.directory, STAGING_DIR)
        os.makedirs(self.staging_dir, exist_ok=True)

    def join(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def staging_path(self, txn: StagedTransaction) -> str:
        return os.path.join(self.staging_dir, txn.staging_name)

    def open(self, txn: StagedTransaction) -> IO[bytes]:
        return open(self.staging_path(txn), "wb")

    def pre_commit(self, txn: StagedTransaction, f: IO[bytes]) -> None:
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        fsync_dir(self.staging_dir)

    def commit(self, txn: StagedTransaction) -> None:
        assert txn.part_name is not None
        staging = self.staging_path(txn)
        target = self.join(txn.part_name)
        staged = os.path.exists(staging)
        if os.path.exists(target):
            if staged:
                raise SinkCommitError(
                    f"cannot commit {staging}: {target} exists already (another run wrote it)"
                )
            return  # committed before (e.g. a re-commit after a restore)
        if not staged:
            raise SinkCommitError(
                f"cannot commit transaction {txn.staging_name}: neither the staging file "
                f"{staging} nor the committed file {target} exists"
            )
        os.rename(staging, target)
        fsync_dir(self.directory)

    def abort(self, txn: StagedTransaction) -> None:
        with suppress(FileNotFoundError):
            os.unlink(self.staging_path(txn))


class MultipartStaging(Staging):
    """A local temporary file, uploaded on pre-commit as an S3 multipart upload under the part
    file's key and completed on commit (see the module docstring)."""

    def __init__(self, directory: str, part_bytes: int = MultipartUploads.MIN_PART_BYTES) -> None:
        super().__init__(directory.rstrip("/"))
        if part_bytes < MultipartUploads.MIN_PART_BYTES:
            raise InvalidArgumentError(
                f"S3 multipart parts must be >= {MultipartUploads.MIN_PART_BYTES} bytes, "
                f"got {part_bytes}"
            )
        self.part_bytes = part_bytes
        store = store_for(self.directory)
        assert isinstance(store, S3FileStore)
        self.store = store
        self.uploads = MultipartUploads(store)

    def join(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def open(self, txn: StagedTransaction) -> IO[bytes]:
        # Anonymous: the operating system removes it when it is closed or the process dies.
        return tempfile.TemporaryFile(prefix="snapflow-txn-")

    def pre_commit(self, txn: StagedTransaction, f: IO[bytes]) -> None:
        assert txn.part_name is not None
        path = self.join(txn.part_name)
        upload_id: str | None = None
        parts: list[UploadedPart] = []
        try:
            f.flush()
            f.seek(0)
            upload_id = self.uploads.start(path)
            while chunk := f.read(self.part_bytes):
                parts.append(self.uploads.upload_part(path, upload_id, len(parts) + 1, chunk))
        except BaseException:
            if upload_id is not None:  # best effort: the error at hand is what matters
                with suppress(Exception):
                    self.uploads.abort(path, upload_id)
            raise
        finally:
            f.close()
        txn.upload_id = upload_id
        txn.parts = tuple((p.number, p.etag) for p in parts)

    def commit(self, txn: StagedTransaction) -> None:
        assert txn.part_name is not None
        if txn.upload_id is None:
            raise SinkCommitError(
                f"cannot commit transaction {txn.staging_name}: it has rows but no upload"
            )
        parts = [UploadedPart(number, etag) for number, etag in txn.parts]
        self.uploads.complete(self.join(txn.part_name), txn.upload_id, parts)

    def abort(self, txn: StagedTransaction) -> None:
        if txn.upload_id is not None and txn.part_name is not None:
            self.uploads.abort(self.join(txn.part_name), txn.upload_id)

    def recover_and_abort(self, txn: StagedTransaction) -> None:
        # The restored state was written before this transaction's pre-commit, so it holds no
        # upload id; a pre-commit for a later checkpoint (that never completed) may have
        # started one under part-<subtask>-<that checkpoint>-<seq>-<token>: find it by name.
        self.abort(txn)
        prefix = self.join(f"part-{txn.subtask}-")
        name = re.compile(
            rf"part-{txn.subtask}-\d+-{txn.seq}-{re.escape(txn.token)}{re.escape(_suffix(txn))}"
        )
        for path, upload_id in self.uploads.list_uploads(prefix):
            if name.fullmatch(path.rsplit("/", 1)[-1]):
                self.uploads.abort(path, upload_id)


def _suffix(txn: StagedTransaction) -> str:
    return os.path.splitext(txn.staging_name)[1]


def staging_for(directory: str) -> Staging:
    """The :class:`Staging` for ``directory``: S3 multipart uploads for ``s3://``, staging
    files otherwise."""
    if is_object_store_uri(directory):
        return MultipartStaging(directory)
    return LocalStaging(directory)

"""An exactly-once sink of Arrow IPC files on a local or shared file system, or on S3.

TransactionalFileSink
    Every checkpoint interval writes one transaction per subtask; a transaction with rows
    becomes the part file ``<dir>/part-<subtask>-<checkpoint_id>-<seq>-<token>.arrow`` (Arrow
    IPC file format; ``token`` is random per opened sink, so runs that reuse checkpoint ids --
    e.g. restored from a savepoint into the same directory -- never share a name) when the
    checkpoint it was pre-committed for completes. Transactions without rows create nothing.
    :func:`read_committed` reads only committed part files. Where a transaction's bytes live
    until then is one seam, a :class:`Staging`, chosen by the directory:

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

    A transaction whose pre-commit failed has lost its open file: later writes to it and its
    pre-commit raise :class:`~snapflow.errors.StateError`, so the task fails over and its rows
    are replayed from the last completed checkpoint instead of being silently dropped.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from abc import ABC, abstractmethod
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from snapflow.durable_files import fsync_dir
from snapflow.errors import InvalidArgumentError, StateError
from snapflow.filestore import is_object_store_uri
from snapflow.filestore_registry import store_for
from snapflow.s3_filestore import S3FileStore
from snapflow.s3_multipart import MultipartUploads, UploadedPart
from snapflow.worker.connectors.two_phase_commit import SinkCommitError, TwoPhaseCommitSink
from snapflow.worker.runtime.operator import OperatorContext


@dataclass
class FileTransaction:
    """One transaction of :class:`TransactionalFileSink` (names relative to its directory)."""

    staging_name: str  # under _staging/ (local)
    subtask: int
    seq: int
    token: str
    num_rows: int = 0
    checkpoint_id: int | None = None  # set by pre_commit
    part_name: str | None = None  # set by pre_commit (None: nothing to commit)
    # S3 only, set by pre_commit. Plain values (not filestore classes) keep the operator
    # state readable whatever those classes become.
    upload_id: str | None = None
    parts: tuple[tuple[int, str], ...] = ()  # (part number, ETag)


_SAFE = re.compile(r"[^A-Za-z0-9_.]+")


_PART = re.compile(r"^part-(\d+)-(\d+)-(\d+)(?:-([0-9a-f]+))?\.arrow$")


STAGING_DIR = "_staging"


# ---------------------------------------------------------------------------------------------
# Where a transaction's bytes live
# ---------------------------------------------------------------------------------------------


class Staging(ABC):
    """Where a transaction's bytes live from its first write to its commit, and how they
    become the part file ``join(part_name)`` of the sink's directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @abstractmethod
    def join(self, name: str) -> str:
        """The path of ``name`` in the directory."""

    @abstractmethod
    def open(self, txn: FileTransaction) -> IO[bytes]:
        """A new file for the transaction's bytes (the sink closes it, or ``pre_commit``)."""

    @abstractmethod
    def pre_commit(self, txn: FileTransaction, f: IO[bytes]) -> None:
        """Make the bytes written to ``f`` durable and still invisible, ready to become
        ``txn.part_name``; record in ``txn`` what :meth:`commit` needs; close ``f``."""

    @abstractmethod
    def commit(self, txn: FileTransaction) -> None:
        """Make the pre-committed bytes the part file, atomically. Idempotent."""

    @abstractmethod
    def abort(self, txn: FileTransaction) -> None:
        """Drop the transaction's bytes (its file is closed already). Idempotent."""

    def recover_and_abort(self, txn: FileTransaction) -> None:
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

    def staging_path(self, txn: FileTransaction) -> str:
        return os.path.join(self.staging_dir, txn.staging_name)

    def open(self, txn: FileTransaction) -> IO[bytes]:
        return open(self.staging_path(txn), "wb")

    def pre_commit(self, txn: FileTransaction, f: IO[bytes]) -> None:
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        fsync_dir(self.staging_dir)

    def commit(self, txn: FileTransaction) -> None:
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

    def abort(self, txn: FileTransaction) -> None:
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

    def open(self, txn: FileTransaction) -> IO[bytes]:
        # Anonymous: the operating system removes it when it is closed or the process dies.
        return tempfile.TemporaryFile(prefix="snapflow-txn-")

    def pre_commit(self, txn: FileTransaction, f: IO[bytes]) -> None:
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

    def commit(self, txn: FileTransaction) -> None:
        assert txn.part_name is not None
        if txn.upload_id is None:
            raise SinkCommitError(
                f"cannot commit transaction {txn.staging_name}: it has rows but no upload"
            )
        parts = [UploadedPart(number, etag) for number, etag in txn.parts]
        self.uploads.complete(self.join(txn.part_name), txn.upload_id, parts)

    def abort(self, txn: FileTransaction) -> None:
        if txn.upload_id is not None and txn.part_name is not None:
            self.uploads.abort(self.join(txn.part_name), txn.upload_id)

    def recover_and_abort(self, txn: FileTransaction) -> None:
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


def _suffix(txn: FileTransaction) -> str:
    return os.path.splitext(txn.staging_name)[1]


def staging_for(directory: str) -> Staging:
    """The :class:`Staging` for ``directory``: S3 multipart uploads for ``s3://``, staging
    files otherwise."""
    if is_object_store_uri(directory):
        return MultipartStaging(directory)
    return LocalStaging(directory)


# ---------------------------------------------------------------------------------------------
# The sink
# ---------------------------------------------------------------------------------------------


class TransactionalFileSink(TwoPhaseCommitSink[FileTransaction]):
    """Exactly-once Arrow IPC files in ``directory``, a path or ``s3://bucket/prefix`` (see the
    module docstring). All batches must have the schema of the first batch of their
    transaction."""

    _runtime_fields: tuple[str, ...] = (
        *TwoPhaseCommitSink._runtime_fields,
        "_writers",
        "_failed",
        "_seq",
        "_token",
        "_area",
    )

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)

    def initialize(self, ctx: OperatorContext) -> None:
        try:
            self._area = staging_for(self.directory)
        except OSError as e:
            raise StateError(f"{self.name}: cannot create the staging directory: {e}") from e
        # staging name -> (file, Arrow writer, schema) of the transactions written to
        self._writers: dict[str, tuple[IO[bytes], Any, pa.Schema]] = {}
        # staging name -> why the pre-commit of that transaction failed
        self._failed: dict[str, str] = {}
        self._seq = 0
        self._token = uuid.uuid4().hex[:8]

    @property
    def staging(self) -> Staging:
        """Where this (opened) sink keeps its transactions' bytes."""
        return self._area

    # The file format: subclasses (TransactionalParquetSink) override these three only.
    file_suffix = ".arrow"

    def _open_writer(self, f: IO[bytes], schema: pa.Schema) -> Any:
        return pa.ipc.new_file(f, schema)

    def _write_batch(self, writer: Any, batch: pa.RecordBatch) -> None:
        writer.write_batch(batch)

    def begin_transaction(self) -> FileTransaction:
        ctx = self._context()
        seq = self._seq
        self._seq += 1
        vertex = _SAFE.sub("_", ctx.vertex_id) or "vertex"
        name = f"{vertex}-{ctx.subtask_index}-{ctx.attempt}-{seq}-{self._token}{self.file_suffix}"
        return FileTransaction(name, ctx.subtask_index, seq, self._token)

    def _check_not_failed(self, txn: FileTransaction) -> None:
        error = self._failed.get(txn.staging_name)
        if error is not None:
            raise StateError(
                f"{self.name}: transaction {txn.staging_name} could not be pre-committed "
                f"({error}); its rows are gone from this run and come back only by a restore"
            )

    def write(self, txn: FileTransaction, batch: pa.RecordBatch) -> None:
        self._check_not_failed(txn)
        entry = self._writers.get(txn.staging_name)
        if entry is None:
            f = self._area.open(txn)
            try:
                writer = self._open_writer(f, batch.schema)
            except BaseException:
                f.close()
                raise
            entry = self._writers[txn.staging_name] = (f, writer, batch.schema)
        _, writer, schema = entry
        if not batch.schema.equals(schema):
            raise InvalidArgumentError(
                f"{self.name}: batch schema {batch.schema} differs from the transaction's "
                f"schema {schema}"
            )
        self._write_batch(writer, batch)
        txn.num_rows += batch.num_rows

    def pre_commit(self, txn: FileTransaction) -> None:
        self._check_not_failed(txn)
        entry = self._writers.pop(txn.staging_name, None)
        txn.checkpoint_id = self.pending_checkpoint_id
        if entry is None:  # nothing written: nothing to commit
            txn.part_name = None
            return
        f, writer, _ = entry
        part_name = (
            f"part-{txn.subtask}-{txn.checkpoint_id}-{txn.seq}-{txn.token}{self.file_suffix}"
        )
        txn.part_name = part_name
        try:
            try:
                writer.close()
            except BaseException:
                f.close()
                raise
            self._area.pre_commit(txn, f)
        except Exception as e:
            txn.part_name = None
            self._failed[txn.staging_name] = str(e)[:300]
            raise

    def commit(self, txn: FileTransaction) -> None:
        if txn.part_name is None:
            return
        self._area.commit(txn)

    def abort(self, txn: FileTransaction) -> None:
        self._close_writer(txn)
        self._failed.pop(txn.staging_name, None)
        self._area.abort(txn)

    def recover_and_abort(self, txn: FileTransaction) -> None:
        self._area.recover_and_abort(txn)

    def _close_writer(self, txn: FileTransaction) -> None:
        entry = self._writers.pop(txn.staging_name, None)
        if entry is not None:
            f, writer, _ = entry
            with suppress(Exception):
                writer.close()
            f.close()

    def close(self) -> None:
        try:
            super().close()
        finally:
            for f, writer, _ in getattr(self, "_writers", {}).values():
                with suppress(Exception):
                    writer.close()
                f.close()
            if hasattr(self, "_writers"):
                self._writers.clear()


# ---------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------


def committed_part_files(directory: str | os.PathLike[str], pattern: re.Pattern[str]) -> list[str]:
    """The files of ``directory`` (a path or ``s3://bucket/prefix``; not its subdirectories)
    whose names match ``pattern`` (groups: subtask, checkpoint, seq, token), ordered by
    (subtask, checkpoint, seq, token). On S3 an upload not yet completed is not an object,
    hence never listed."""
    directory = os.fspath(directory)
    paths: dict[str, str] = {}  # name -> path
    if is_object_store_uri(directory):
        base = directory.rstrip("/")
        for path in store_for(base).list(base):
            name = path[len(base) + 1 :]
            if "/" not in name:
                paths[name] = path
    else:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        paths = {name: os.path.join(directory, name) for name in names}
    parts = []
    for name, path in paths.items():
        m = pattern.match(name)
        if m:
            parts.append(((int(m[1]), int(m[2]), int(m[3]), m[4] or ""), path))
    parts.sort()
    return [path for _, path in parts]


def open_committed(path: str) -> Any:
    """A readable pyarrow source for a committed part file (a local path or ``s3://``)."""
    if is_object_store_uri(path):
        return pa.BufferReader(store_for(path).read(path))
    return pa.OSFile(path, "rb")


def committed_files(directory: str | os.PathLike[str]) -> list[str]:
    """The committed part files of ``directory``, ordered by (subtask, checkpoint, seq)."""
    return committed_part_files(directory, _PART)


def read_committed(directory: str | os.PathLike[str], schema: pa.Schema | None = None) -> pa.Table:
    """Every committed row of a :class:`TransactionalFileSink` directory (a path or
    ``s3://bucket/prefix``) as one table (part files in (subtask, checkpoint, seq) order); an
    empty table (of ``schema``) if none."""
    tables = []
    for path in committed_files(directory):
        with open_committed(path) as f:
            tables.append(pa.ipc.open_file(f).read_all())
    if not tables:
        return schema.empty_table() if schema is not None else pa.table({})
    return pa.concat_tables(tables)

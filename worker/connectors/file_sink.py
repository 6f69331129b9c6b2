"""An exactly-once sink of Arrow IPC files on a local or shared file system, or on S3.

TransactionalFileSink
    Every checkpoint interval writes one transaction per subtask; a transaction with rows
    becomes the part file ``<dir>/part-<subtask>-<checkpoint_id>-<seq>-<token>.arrow`` (Arrow
    IPC file format; ``token`` is random per opened sink, so runs that reuse checkpoint ids --
    e.g. restored from a savepoint into the same directory -- never share a name) when the
    checkpoint it was pre-committed for completes. Transactions without rows create nothing.
    :func:`read_committed` reads only committed part files. Where a transaction's bytes live
    until then is one seam, a :class:`~snapflow.worker.connectors.file_staging.Staging`, chosen by
    the directory: a staging file renamed into place for a path, an S3 multipart upload
    completed on commit for ``s3://bucket/prefix`` (both in
    :mod:`snapflow.worker.connectors.file_staging`).

    A transaction whose pre-commit failed has lost its open file: later writes to it and its
    pre-commit raise :class:`~snapflow.errors.StateError`, so the task fails over and its rows
    are replayed from the last completed checkpoint instead of being silently dropped.

    ``compression="lz4"`` or ``"zstd"`` compresses the files' buffers (Arrow IPC's own buffer
    compression: every Arrow reader, :func:`read_committed` and Spark's among them, decompresses
    them as it reads); None (the default) writes them uncompressed.
"""

from __future__ import annotations

import os
import re
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.connectors.committed_files import committed_part_files, open_committed
from snapflow.worker.connectors.file_staging import Staging, staging_for
from snapflow.worker.connectors.two_phase_commit import TwoPhaseCommitSink
from snapflow.worker.runtime.operator import OperatorContext


@dataclass
class FileTransaction:
    """One transaction of :class:`TransactionalFileSink` (names relative to its directory).
    Pickled into operator state by its module path, so it stays next to the sink."""

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

IPC_COMPRESSIONS = (None, "lz4", "zstd")
"""The buffer compressions of Arrow IPC files (None: uncompressed)."""


_PART = re.compile(r"^part-(\d+)-(\d+)-(\d+)(?:-([0-9a-f]+))?\.arrow$")


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

    def __init__(
        self, directory: str | os.PathLike[str], *, compression: str | None = None
    ) -> None:
        if compression not in IPC_COMPRESSIONS:
            raise InvalidArgumentError(
                f"compression must be one of {', '.join(map(str, IPC_COMPRESSIONS))}, "
                f"got {compression!r}"
            )
        self.directory = os.fspath(directory)
        self.compression = compression

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
        return pa.ipc.new_file(
            f, schema, options=pa.ipc.IpcWriteOptions(compression=self.compression)
        )

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

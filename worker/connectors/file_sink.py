"""An exactly-once sink of Arrow IPC files on a local or shared file system.

TransactionalFileSink
    A transaction is a staging file ``<dir>/_staging/<vertex>-<subtask>-<attempt>-<seq>-<token>
    .arrow`` (Arrow IPC file format; ``token`` is random per opened sink, so runs that reuse
    checkpoint ids -- e.g. restored from a savepoint into the same directory -- never share a
    name), created on the first write, flushed, closed and fsync'ed on pre-commit. Commit is an
    atomic ``os.rename`` to ``<dir>/part-<subtask>-<checkpoint_id>-<seq>-<token>.arrow`` and
    is idempotent: a target that exists while the staging file is gone was committed before.
    Transactions without rows create no file. :func:`read_committed` reads only committed part
    files. Staging files of transactions that never reach a completed checkpoint (pre-committed
    for a checkpoint that was then subsumed by a failure) stay in ``_staging`` as orphans.
"""

from __future__ import annotations

import os
import re
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any

import pyarrow as pa

from snapflow.durable_files import fsync_dir
from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.connectors.two_phase_commit import SinkCommitError, TwoPhaseCommitSink
from snapflow.worker.runtime.operator import OperatorContext


@dataclass
class FileTransaction:
    """One transaction of :class:`TransactionalFileSink` (names relative to its directory)."""

    staging_name: str  # under _staging/
    subtask: int
    seq: int
    token: str
    num_rows: int = 0
    checkpoint_id: int | None = None  # set by pre_commit
    part_name: str | None = None  # set by pre_commit (None: nothing to commit)


_SAFE = re.compile(r"[^A-Za-z0-9_.]+")


_PART = re.compile(r"^part-(\d+)-(\d+)-(\d+)(?:-([0-9a-f]+))?\.arrow$")


STAGING_DIR = "_staging"


class TransactionalFileSink(TwoPhaseCommitSink[FileTransaction]):
    """Exactly-once Arrow IPC files in ``directory`` (see the module docstring). All batches
    must have the schema of the first batch of their transaction."""

    _runtime_fields: tuple[str, ...] = (
        *TwoPhaseCommitSink._runtime_fields,
        "_writers",
        "_seq",
        "_token",
        "_dir",
        "_staging",
    )

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)

    def initialize(self, ctx: OperatorContext) -> None:
        self._dir = os.path.abspath(self.directory)
        self._staging = os.path.join(self._dir, STAGING_DIR)
        try:
            os.makedirs(self._staging, exist_ok=True)
        except OSError as e:
            raise StateError(f"{self.name}: cannot create {self._staging}: {e}") from e
        # staging name -> (file, Arrow writer, schema) of the transactions written to
        self._writers: dict[str, tuple[IO[bytes], Any, pa.Schema]] = {}
        self._seq = 0
        self._token = uuid.uuid4().hex[:8]

    def staging_path(self, txn: FileTransaction) -> str:
        return os.path.join(self._staging, txn.staging_name)

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

    def write(self, txn: FileTransaction, batch: pa.RecordBatch) -> None:
        entry = self._writers.get(txn.staging_name)
        if entry is None:
            f = open(self.staging_path(txn), "wb")  # noqa: SIM115 - closed in pre_commit/abort
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
        entry = self._writers.pop(txn.staging_name, None)
        txn.checkpoint_id = self.pending_checkpoint_id
        if entry is None:  # nothing written: nothing to commit
            txn.part_name = None
            return
        f, writer, _ = entry
        try:
            writer.close()
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        fsync_dir(self._staging)
        txn.part_name = (
            f"part-{txn.subtask}-{txn.checkpoint_id}-{txn.seq}-{txn.token}{self.file_suffix}"
        )

    def commit(self, txn: FileTransaction) -> None:
        if txn.part_name is None:
            return
        staging = self.staging_path(txn)
        target = os.path.join(self._dir, txn.part_name)
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
        fsync_dir(self._dir)

    def abort(self, txn: FileTransaction) -> None:
        entry = self._writers.pop(txn.staging_name, None)
        if entry is not None:
            f, writer, _ = entry
            with suppress(Exception):
                writer.close()
            f.close()
        with suppress(FileNotFoundError):
            os.unlink(self.staging_path(txn))

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
    directory = os.fspath(directory)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    parts = []
    for name in names:
        m = _PART.match(name)
        if m:
            parts.append(((int(m[1]), int(m[2]), int(m[3]), m[4] or ""), name))
    parts.sort()
    return [os.path.join(directory, name) for _, name in parts]


def read_committed(directory: str | os.PathLike[str], schema: pa.Schema | None = None) -> pa.Table:
    """Every committed row of a :class:`TransactionalFileSink` directory as one table (part
    files in (subtask, checkpoint, seq) order); an empty table (of ``schema``) if none."""
    tables = []
    for path in committed_files(directory):
        with pa.OSFile(path, "rb") as f:
            tables.append(pa.ipc.open_file(f).read_all())
    if not tables:
        return schema.empty_table() if schema is not None else pa.table({})
    return pa.concat_tables(tables)

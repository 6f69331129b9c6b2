"""An exactly-once transactional Parquet sink (read by ``spark.read.parquet``).

TransactionalParquetSink
    :class:`~snapflow.worker.connectors.file_sink.TransactionalFileSink`'s two-phase commit, with Parquet files
    (``pyarrow.parquet``) instead of Arrow IPC files. A transaction is a staging file
    ``<dir>/_staging/<vertex>-<subtask>-<attempt>-<seq>-<token>.parquet``, created on the first
    write; pre-commit closes the Parquet writer (writing the footer), flushes and fsyncs it.
    Commit is an atomic ``os.rename`` to ``<dir>/part-<subtask>-<checkpoint>-<seq>-<token>
    .parquet``, idempotent (a target that exists while the staging file is gone was committed
    before); a restore re-commits the pending transactions of the restored state and aborts
    (deletes) the restored current one -- all inherited from the base classes.

    On ``s3://bucket/prefix`` the transaction is spooled to a local temporary file and, on
    pre-commit, uploaded as an S3 multipart upload under the part file's key; commit completes
    the upload, abort aborts it: the ``MultipartStaging`` of
    :mod:`snapflow.worker.connectors.file_staging`, with the same contract and request counts as
    the Arrow IPC sink. An incomplete upload is not an object, so no reader lists it.

    Visibility: Spark's file listing skips every file and directory whose name starts with
    ``_`` or ``.``, so ``spark.read.parquet(directory)`` (and any reader that follows the same
    Hadoop convention, e.g. ``pyarrow.dataset`` with its default ``ignore_prefixes``) sees only
    committed part files, each a complete Parquet file; on S3 ``pyarrow.dataset`` over the
    prefix (with a pyarrow or s3fs file system) sees only completed uploads. A directory
    without any committed file yet has no schema for Spark to infer: pass ``schema=`` to
    ``spark.read`` or wait for the first commit. All batches of a transaction must have the same schema; every transaction of
    a job should have the same schema for the directory to read as one table.
    :func:`read_committed_parquet` reads the committed rows with pyarrow, in (subtask,
    checkpoint, seq) order.
"""

from __future__ import annotations

import os
import re
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.committed_files import committed_part_files, open_committed
from snapflow.worker.connectors.file_sink import TransactionalFileSink

_SAFE = re.compile(r"[^A-Za-z0-9_.]+")


_PARQUET_PART = re.compile(r"^part-(\d+)-(\d+)-(\d+)-([0-9a-f]+)\.parquet$")


class TransactionalParquetSink(TransactionalFileSink):
    """Exactly-once Parquet files in ``directory``, readable by ``spark.read.parquet`` (see the
    module docstring). ``compression`` and ``row_group_size`` go to ``pyarrow.parquet``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        compression: str = "snappy",
        row_group_size: int | None = None,
    ) -> None:
        super().__init__(directory)
        if row_group_size is not None and row_group_size <= 0:
            raise InvalidArgumentError(f"row_group_size must be > 0, got {row_group_size}")
        self.compression = compression
        self.row_group_size = row_group_size

    # Only the file format differs from TransactionalFileSink: transactions, pre-commit with
    # fsync, the atomic idempotent commit, abort and close are inherited.
    file_suffix = ".parquet"

    def _open_writer(self, f: IO[bytes], schema: pa.Schema) -> pq.ParquetWriter:
        return pq.ParquetWriter(f, schema, compression=self.compression)

    def _write_batch(self, writer: Any, batch: pa.RecordBatch) -> None:
        writer.write_batch(batch, row_group_size=self.row_group_size)


def committed_parquet_files(directory: str | os.PathLike[str]) -> list[str]:
    """The committed part files of a :class:`TransactionalParquetSink` directory (a path or
    ``s3://bucket/prefix``), ordered by (subtask, checkpoint, seq, token)."""
    return committed_part_files(directory, _PARQUET_PART)


def read_committed_parquet(
    directory: str | os.PathLike[str], schema: pa.Schema | None = None
) -> pa.Table:
    """Every committed row of a :class:`TransactionalParquetSink` directory (a path or
    ``s3://bucket/prefix``) as one table (part files in (subtask, checkpoint, seq) order); an
    empty table (of ``schema``) if none."""
    tables = []
    for path in committed_parquet_files(directory):
        with open_committed(path) as f:
            tables.append(pq.read_table(f))
    if not tables:
        return schema.empty_table() if schema is not None else pa.table({})
    return pa.concat_tables(tables)

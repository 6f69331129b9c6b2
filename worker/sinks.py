"""Sinks: the two-phase-commit base class (exactly-once), a transactional Arrow file sink, and
simple sinks for tests and debugging.

Two-phase commit (Flink's ``TwoPhaseCommitSinkFunction``)
    :class:`TwoPhaseCommitSink` writes every record into the *current* transaction. On
    ``snapshot_state(n)`` (the barrier of checkpoint n) it pre-commits the current transaction,
    keeps it as *pending for n*, begins the next one, and records both -- the pending
    transactions and the new current one -- in operator list state, serialised on the spot (a
    synchronous copy, as Flink's state serialisers make). On ``notify_checkpoint_complete(n)``
    it commits, in checkpoint order, every pending transaction with an id ``<= n``: a lost
    notification is repaired by the next one. ``notify_checkpoint_aborted`` keeps the pending
    transactions (their data is also covered by the next checkpoint, whose completion commits
    them). On a restore, ``open`` re-commits every pending transaction of the restored state
    (:meth:`~TwoPhaseCommitSink.recover_and_commit`, so ``commit`` must be idempotent) and
    aborts the restored current transaction (:meth:`~TwoPhaseCommitSink.recover_and_abort`);
    the restored checkpoint completed, so everything pre-committed before its barrier is
    committed, and everything written after it is replayed by the sources. ``close`` aborts the
    current transaction; pending ones stay for a later completion or a restore.

    End of input: like Flink since 1.14 (FLIP-147), the transaction open at end of input is
    only committed by a *final checkpoint*: after ``end_input`` the task must take one more
    checkpoint (``snapshot_state`` + ``notify_checkpoint_complete``) before ``close``;
    otherwise the rows written after the last completed checkpoint are aborted.

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
import pickle
import re
import sys
import threading
import uuid
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any, Generic, TypeVar

import pyarrow as pa

from snapflow.errors import InvalidArgumentError, SnapflowError, StateError
from worker.operators import Operator, OperatorContext
from worker.state import OperatorListState

__all__ = [
    "CollectSink",
    "FileTransaction",
    "PrintSink",
    "SinkCommitError",
    "TransactionalFileSink",
    "TwoPhaseCommitSink",
    "read_committed",
]

TXN = TypeVar("TXN")

_STATE_VERSION = 1


class SinkCommitError(SnapflowError):
    """A transaction cannot be committed (its data is gone, or its target is taken)."""


def _dumps(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        from pyspark import cloudpickle  # classes defined in a driver script (__main__)

        return bytes(cloudpickle.dumps(obj, protocol=5))


class TwoPhaseCommitSink(Operator, Generic[TXN]):
    """Base class of exactly-once sinks (see the module docstring). Subclasses implement
    :meth:`begin_transaction`, :meth:`write`, :meth:`pre_commit`, :meth:`commit` (idempotent)
    and :meth:`abort`; transactions must be picklable (they are stored in operator state)."""

    _runtime_fields: tuple[str, ...] = (
        "_current",
        "_pending",
        "_txn_state",
        "pending_checkpoint_id",
    )

    # --- to implement -----------------------------------------------------------------------

    def begin_transaction(self) -> TXN:
        raise NotImplementedError

    def write(self, txn: TXN, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    def pre_commit(self, txn: TXN) -> None:
        """Make ``txn`` durable and ready to commit. ``self.pending_checkpoint_id`` is the
        checkpoint it is pre-committed for."""
        raise NotImplementedError

    def commit(self, txn: TXN) -> None:
        """Commit a pre-committed transaction. Must be idempotent."""
        raise NotImplementedError

    def abort(self, txn: TXN) -> None:
        raise NotImplementedError

    def recover_and_commit(self, txn: TXN) -> None:
        """Commit a pending transaction found in restored state (may be committed already)."""
        self.commit(txn)

    def recover_and_abort(self, txn: TXN) -> None:
        """Abort the restored current transaction (its data is replayed by the sources)."""
        self.abort(txn)

    def initialize(self, ctx: OperatorContext) -> None:
        """Hook run in ``open`` before recovery (e.g. create directories)."""

    # --- operator ---------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self.pending_checkpoint_id: int | None = None
        self._txn_state: OperatorListState[bytes] = ctx.operator_state.get_list_state(
            ctx.state_name("2pc")
        )
        self._pending: list[tuple[int, TXN]] = []
        self.initialize(ctx)
        restored = self._txn_state.get() if ctx.is_restored else []
        to_commit: list[tuple[int, TXN]] = []
        to_abort: list[TXN] = []
        for blob in restored:
            try:
                version, current, pending = pickle.loads(blob)
            except Exception as e:
                raise StateError(f"{self.name}: unreadable transaction state: {e!r}") from e
            if version != _STATE_VERSION:
                raise StateError(f"{self.name}: transaction state version {version} unknown")
            to_commit.extend(pending)
            if current is not None:
                to_abort.append(current)
        to_commit.sort(key=lambda p: p[0])
        for _, txn in to_commit:
            self.recover_and_commit(txn)
        for txn in to_abort:
            self.recover_and_abort(txn)
        self._txn_state.clear()
        self._current: TXN | None = self.begin_transaction()

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            if self._current is None:
                raise StateError(f"{self.name}: no open transaction (closed?)")
            self.write(self._current, batch)
        return []

    def snapshot_state(self, checkpoint_id: int) -> None:
        txn = self._current
        if txn is None:
            raise StateError(f"{self.name}: no open transaction (closed?)")
        self.pending_checkpoint_id = checkpoint_id
        try:
            self.pre_commit(txn)
        finally:
            self.pending_checkpoint_id = None
        self._pending.append((checkpoint_id, txn))
        self._current = self.begin_transaction()
        self._txn_state.update([_dumps((_STATE_VERSION, self._current, list(self._pending)))])

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        while self._pending and self._pending[0][0] <= checkpoint_id:
            self.commit(self._pending[0][1])
            self._pending.pop(0)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        # Keep the pending transactions: the next completed checkpoint commits them.
        pass

    @property
    def pending_transactions(self) -> list[tuple[int, TXN]]:
        """``(checkpoint_id, txn)`` pre-committed and not yet committed, oldest first."""
        return list(self._pending)

    @property
    def current_transaction(self) -> TXN | None:
        return self._current

    def close(self) -> None:
        txn, self._current = getattr(self, "_current", None), None
        if txn is not None:
            self.abort(txn)


# ---------------------------------------------------------------------------------------------
# Transactional Arrow file sink
# ---------------------------------------------------------------------------------------------


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


def _fsync_dir(path: str) -> None:
    with suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
        _fsync_dir(self._staging)
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
        _fsync_dir(self._dir)

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


# ---------------------------------------------------------------------------------------------
# Test and debug sinks
# ---------------------------------------------------------------------------------------------

_COLLECTED: dict[str, list[pa.RecordBatch]] = {}
_COLLECT_LOCK = threading.Lock()


class CollectSink(Operator):
    """Collects batches in memory, in this process, under ``name`` (shared by every copy of
    the sink, e.g. the unpickled ones of parallel subtasks). For tests; not exactly-once."""

    def __init__(self, name: str | None = None) -> None:
        self.collect_name = name or f"collect-{uuid.uuid4().hex}"
        with _COLLECT_LOCK:
            _COLLECTED.setdefault(self.collect_name, [])

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            with _COLLECT_LOCK:
                _COLLECTED.setdefault(self.collect_name, []).append(batch)
        return []

    @property
    def batches(self) -> list[pa.RecordBatch]:
        return CollectSink.results(self.collect_name)

    def rows(self) -> list[dict[str, Any]]:
        return [row for b in self.batches for row in b.to_pylist()]

    @staticmethod
    def results(name: str) -> list[pa.RecordBatch]:
        with _COLLECT_LOCK:
            return list(_COLLECTED.get(name, ()))

    @staticmethod
    def table(name: str) -> pa.Table:
        batches = CollectSink.results(name)
        return pa.Table.from_batches(batches) if batches else pa.table({})

    @staticmethod
    def clear(name: str | None = None) -> None:
        with _COLLECT_LOCK:
            if name is None:
                _COLLECTED.clear()
            else:
                _COLLECTED.pop(name, None)


class PrintSink(Operator):
    """Prints every row as ``<prefix><subtask>> {row}`` to ``stream`` (default stdout)."""

    def __init__(self, prefix: str = "", stream: IO[str] | None = None) -> None:
        self.prefix = prefix
        self.stream = stream

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["stream"] = None  # streams are process-local
        return state

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            stream = self.stream if self.stream is not None else sys.stdout
            subtask = self.ctx.subtask_index if self.ctx is not None else 0
            lines: Iterable[str] = (f"{self.prefix}{subtask}> {row}\n" for row in batch.to_pylist())
            stream.writelines(lines)
            stream.flush()
        return []

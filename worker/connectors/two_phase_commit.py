"""Exactly-once sinks: the two-phase-commit base class.

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
"""

from __future__ import annotations

import pickle
from typing import Any, Generic, TypeVar

import pyarrow as pa

from snapflow.errors import SnapflowError, StateError
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state import arrow_pickling
from snapflow.worker.state.operator_state import OperatorListState

TXN = TypeVar("TXN")


_STATE_VERSION = 1


class SinkCommitError(SnapflowError):
    """A transaction cannot be committed (its data is gone, or its target is taken)."""


def _dumps(obj: Any) -> bytes:
    try:
        return arrow_pickling.dumps(obj)
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

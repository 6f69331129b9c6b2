"""The exactly-once Kafka sink's transaction decisions, pure: no Kafka, no I/O, no clock.

The shell (:mod:`snapflow.worker.connectors.kafka_sink`) does what these decide and nothing
else; the decisions are tested as exact sequences with invariants.

Names
    Each subtask ``s`` of a sink owns ``slots`` transactional ids
    ``<prefix>-<operator_id>-<s>-<slot>`` (one librdkafka producer each: a producer has one
    open transaction at a time, and a subtask has its current transaction plus those
    pre-committed and not yet committed) and one *marker group* ``<prefix>-<operator_id>-<s>``.

Sequences and the marker
    Every transaction of subtask ``s`` gets the next number of ``s``'s *sequence*. Its commit
    carries, inside the same Kafka transaction, an offset commit of the marker group
    (``send_offsets_to_transaction``) whose offset is that sequence number. So the marker is
    the sequence of the last committed transaction of ``s``, and transactions of ``s`` commit
    in sequence order: a pending transaction was committed if and only if its sequence is <=
    the marker. Sequences, not checkpoint ids: a job restored from a savepoint counts its
    checkpoint ids from 1 again, while a subtask's sequence resumes above both its restored
    value and the marker (:func:`next_sequence`), so the marker only ever grows.

One subtask's life (:class:`SubtaskTransactions`)
    ``begin`` opens the current transaction on a free slot; ``pre_commit(n)`` (the barrier of
    checkpoint ``n``) makes it pending for ``n``; ``to_commit(n)`` (the completion notice of
    ``n``) lists the pending transactions with a checkpoint id ``<= n``, oldest first, so a
    lost notice is covered by the next one; ``committed`` removes each once Kafka committed
    it. More pending transactions than ``slots - 1`` means completion notices stopped
    arriving: ``begin`` refuses (:class:`TooManyPendingTransactionsError`), which bounds the
    state the sink keeps.

A restore (:func:`recovered_by`, :func:`to_reproduce`, :func:`next_sequence`)
    Every subtask keeps one :class:`SubtaskRecord` in *union* state, so every new subtask sees
    all old ones. New subtask ``i`` of ``p`` recovers old subtask ``s`` when ``s % p == i``:
    itself, and the subtasks a down-scale removed; no other new subtask uses ``s``'s ids, so
    no two producers fence each other. For each, the shell first aborts every slot's
    lingering transaction (``init_transactions`` on its id: the broker aborts it and fences
    the old producer), then reads the marker, then re-produces, in order, each pending
    transaction whose sequence is above the marker, each in its own transaction that commits
    its own sequence as the marker: a crash in the middle leaves a marker from which the
    next restore continues, never one that repeats a transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from snapflow.errors import StateError


class TooManyPendingTransactionsError(StateError):
    """Every slot of a subtask holds a pre-committed transaction: completion notices stopped
    arriving (or checkpoints keep failing after their barrier passed the sink)."""


@dataclass(frozen=True)
class Txn:
    """One Kafka transaction of a subtask: its producer slot, its sequence number (the marker
    its commit writes) and, once pre-committed, its checkpoint."""

    slot: int
    sequence: int
    checkpoint_id: int | None = None


@dataclass(frozen=True)
class SubtaskRecord:
    """What a subtask keeps in the sink's union state (its records aside)."""

    subtask: int
    slots: int
    next_sequence: int
    pending: tuple[Txn, ...] = ()


def transactional_id(prefix: str, operator_id: str, subtask: int, slot: int) -> str:
    return f"{prefix}-{operator_id}-{subtask}-{slot}"


def marker_group(prefix: str, operator_id: str, subtask: int) -> str:
    return f"{prefix}-{operator_id}-{subtask}"


@dataclass
class SubtaskTransactions:
    """The transactions of one running subtask (see the module docstring)."""

    subtask: int
    slots: int
    next_sequence: int = 1
    pending: list[Txn] = field(default_factory=list)
    current: Txn | None = None

    def __post_init__(self) -> None:
        if self.slots < 2:
            raise StateError(f"a subtask needs at least 2 transaction slots, got {self.slots}")

    def begin(self) -> Txn:
        """Open the current transaction on the lowest free slot."""
        if self.current is not None:
            raise StateError(f"subtask {self.subtask}: a transaction is open already")
        used = {t.slot for t in self.pending}
        free = [s for s in range(self.slots) if s not in used]
        if not free:
            raise TooManyPendingTransactionsError(
                f"subtask {self.subtask}: {len(self.pending)} transactions (checkpoints "
                f"{[t.checkpoint_id for t in self.pending]}) await their completion notice; "
                f"no slot is free for the next one (raise max_pending_transactions, or find "
                f"why checkpoints do not complete)"
            )
        self.current = Txn(free[0], self.next_sequence)
        self.next_sequence += 1
        return self.current

    def pre_commit(self, checkpoint_id: int) -> Txn:
        """The barrier of ``checkpoint_id``: the current transaction becomes pending for it."""
        if self.current is None:
            raise StateError(f"subtask {self.subtask}: no open transaction to pre-commit")
        if self.pending and checkpoint_id <= (self.pending[-1].checkpoint_id or 0):
            raise StateError(
                f"subtask {self.subtask}: checkpoint {checkpoint_id} after "
                f"{self.pending[-1].checkpoint_id}: barriers must come in order"
            )
        txn = replace(self.current, checkpoint_id=checkpoint_id)
        self.pending.append(txn)
        self.current = None
        return txn

    def to_commit(self, checkpoint_id: int) -> list[Txn]:
        """The completion notice of ``checkpoint_id``: the pending transactions it covers."""
        return [t for t in self.pending if (t.checkpoint_id or 0) <= checkpoint_id]

    def committed(self, txn: Txn) -> None:
        """Kafka committed ``txn``, the oldest pending transaction."""
        if not self.pending or self.pending[0] != txn:
            raise StateError(f"subtask {self.subtask}: {txn} is not the oldest pending one")
        self.pending.pop(0)

    def record(self) -> SubtaskRecord:
        return SubtaskRecord(self.subtask, self.slots, self.next_sequence, tuple(self.pending))


# --- restore ---------------------------------------------------------------------------------


def recovered_by(
    subtask: int, parallelism: int, records: Iterable[SubtaskRecord]
) -> list[SubtaskRecord]:
    """The old subtasks new subtask ``subtask`` of ``parallelism`` recovers, by index."""
    mine: dict[int, SubtaskRecord] = {}
    for r in records:
        if r.subtask % parallelism != subtask:
            continue
        if r.subtask in mine:
            raise StateError(f"the restored state holds subtask {r.subtask} twice")
        mine[r.subtask] = r
    return [mine[s] for s in sorted(mine)]


def slots_to_abort(subtask: int, slots: int, recovered: Sequence[SubtaskRecord]) -> dict[int, int]:
    """Per subtask id this subtask answers for, how many slot ids to abort: its own (with the
    slots it runs with now, or more if it ran with more) and each recovered one's."""
    out = {subtask: slots}
    for r in recovered:
        out[r.subtask] = max(out.get(r.subtask, 0), r.slots)
    return dict(sorted(out.items()))


def to_reproduce(record: SubtaskRecord, marker: int | None) -> list[Txn]:
    """The pending transactions of ``record`` that the marker says were never committed,
    in order (``marker`` None: the group has no offset, nothing was ever committed)."""
    last = marker if marker is not None else 0
    return [t for t in record.pending if t.sequence > last]


def next_sequence(record: SubtaskRecord | None, marker: int | None) -> int:
    """Where a subtask's sequence resumes: above its restored value and above the marker
    (a later run with the same names may have committed past the restored checkpoint)."""
    restored = record.next_sequence if record is not None else 1
    return max(restored, (marker or 0) + 1)

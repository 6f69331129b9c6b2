"""The RocksDB backend's event-time timers in its database, so that its incremental checkpoints
carry them with the SST files: :class:`RocksDBTimerMirror`, the timer service's sink.

Every timer is one entry of the reserved state :data:`~rocksdb_layout.TIMER_STATE`, key group
first like any entry (``rocksdb_layout.py``), so timers move with their key groups on export,
ingest and rescaling. The in-memory :class:`~snapflow.worker.state.timers.TimerService` stays
the index the timers fire from, all of it (Flink's RocksDB timer service instead keeps only
each key group's earliest timers in memory and reads the rest from the column family); the
database copy is what checkpoints carry, and what a restore rebuilds the index from
(:func:`read_timers`).

Changes are buffered (a timer registered and fired between two flushes never reaches the
database) and written as one ``WriteBatch`` per flush: when ``flush_at`` changes are pending,
and whenever the backend flushes its cache (every snapshot, scan and export). Firing deletes
no timer one by one: the timers of a key group sort by timestamp, so each key group that fired
loses all of its timers up to the watermark in one range deletion.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import rocksdict

from snapflow.errors import StateError
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.rocksdb_layout import (
    KG,
    TIMER_STATE,
    decode_timer,
    encode_key,
    encode_timer,
    prefix_end,
    scan_range,
    state_tag,
    timers_after,
)
from snapflow.worker.state.timers import Timer

__all__ = ["DEFAULT_FLUSH_AT", "RocksDBTimerMirror", "read_timers", "timer_prefix"]

DEFAULT_FLUSH_AT = 4_096
"""Pending timer changes that trigger a flush (bounds the buffer's memory and the work a
snapshot's synchronous part finds left)."""

_INT64 = range(-(1 << 63), 1 << 63)
# A pending change: a timer new since the last flush (not in the database), one put again after
# a pending delete, one to delete.
_NEW, _PUT, _DELETE = 0, 1, 2


class _HasDB(Protocol):
    db: rocksdict.Rdict


def timer_prefix(key_group: int) -> bytes:
    """The start of the database keys of ``key_group``'s timers."""
    return KG.pack(key_group) + state_tag(TIMER_STATE)


def read_timers(
    source: Any, key_group: int, namespaces: dict[bytes, Any] | None = None
) -> list[tuple[int, Any, Any]]:
    """``(timestamp, key, namespace)`` of every timer of ``key_group`` in ``source`` (a
    database, snapshot or checkpoint), in timestamp order: a canonical timers section.
    ``namespaces``: the namespaces decoded so far (see ``decode_timer``), to share between
    calls."""
    prefix = timer_prefix(key_group)
    n = len(prefix)
    memo: dict[bytes, Any] = {} if namespaces is None else namespaces
    return [decode_timer(key, n, memo) for key, _ in scan_range(source, prefix, prefix_end(prefix))]


class RocksDBTimerMirror:
    """Keeps the timers of ``backend``'s key groups ``key_groups`` in its database (see the
    module docstring); the backend's :class:`TimerService` sink."""

    def __init__(
        self, backend: _HasDB, key_groups: KeyGroupRange, flush_at: int = DEFAULT_FLUSH_AT
    ) -> None:
        self._backend = backend
        self._prefixes = {kg: timer_prefix(kg) for kg in key_groups}
        # key group -> timer entry -> its change since the last flush
        self._pending: dict[int, dict[tuple[int, Any, Any], int]] = {}
        self._count = 0
        # key group -> the highest watermark that fired timers of it since the last flush
        self._fired: dict[int, int] = {}
        self.flush_at = flush_at
        """Pending changes that trigger a flush."""

    @property
    def pending(self) -> int:
        """Timer changes not yet written to the database."""
        return self._count

    def _group(self, key_group: int) -> dict[tuple[int, Any, Any], int]:
        group = self._pending.get(key_group)
        if group is None:
            group = self._pending[key_group] = {}
        return group

    def timer_added(self, key_group: int, entry: tuple[int, Any, Any]) -> None:
        if entry[0] not in _INT64:
            raise StateError(f"the RocksDB backend keeps timer timestamps as int64, got {entry[0]}")
        group = self._pending.get(key_group)
        if group is None:
            group = self._pending[key_group] = {}
        # Added means it was not registered: in the database only if its delete is pending.
        change = group.setdefault(entry, _NEW)
        if change == _DELETE:
            group[entry] = _PUT
        else:
            self._count += 1
            if self._count >= self.flush_at:
                self.flush()

    def timer_deleted(self, key_group: int, entry: tuple[int, Any, Any]) -> None:
        group = self._group(key_group)
        change = group.pop(entry, None)
        if change == _NEW:  # it never reached the database
            self._count -= 1
        else:
            group[entry] = _DELETE
            if change is None:
                self._count += 1
                if self._count >= self.flush_at:
                    self.flush()

    def timers_fired(self, watermark: int, timers: Sequence[Timer]) -> None:
        # No per-timer delete: each key group that fired loses every timer up to ``watermark``
        # in one range deletion at the next flush, before the changes pending since (a timer
        # pending from before this call was due, so it fired and its change goes).
        pending, fired = self._pending, self._fired
        for kg in {t.key_group for t in timers}:
            if fired.get(kg, watermark) <= watermark:
                fired[kg] = watermark
        if not pending:
            return
        for t in timers:
            group = pending.get(t.key_group)
            if group and group.pop((t.timestamp, t.key, t.namespace), None) is not None:
                self._count -= 1

    def flush(self) -> None:
        """Write the pending changes to the database (one ``WriteBatch``): the fired key groups'
        range deletions first, then the timers added and deleted since."""
        pending, fired = self._pending, self._fired
        if not pending and not fired:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        prefixes = self._prefixes
        for kg, watermark in fired.items():
            prefix = prefixes[kg]
            after = timers_after(watermark)
            batch.delete_range(prefix, prefix_end(prefix) if after is None else prefix + after)
        # A window's namespace recurs for many keys and is pickled once per flush (equal
        # namespaces, one timer to the service, share the first one's encoding).
        namespaces: dict[Any, bytes] = {}
        for kg, group in pending.items():
            prefix = prefixes[kg]
            for (ts, key, ns), change in group.items():
                encoded_ns = namespaces.get(ns)
                if encoded_ns is None:
                    encoded_ns = namespaces[ns] = encode_key(ns)
                db_key = prefix + encode_timer(ts, encode_key(key), encoded_ns)
                if change == _DELETE:
                    batch.delete(db_key)
                else:
                    batch.put(db_key, b"")
        self._backend.db.write(batch)
        pending.clear()
        fired.clear()
        self._count = 0

    def scan(self, key_groups: KeyGroupRange) -> Iterator[tuple[int, list[tuple[int, Any, Any]]]]:
        """``(key group, timers)`` of each of ``key_groups`` holding timers in the database."""
        self.flush()
        db = self._backend.db
        namespaces: dict[bytes, Any] = {}
        for kg in key_groups:
            timers = read_timers(db, kg, namespaces)
            if timers:
                yield kg, timers

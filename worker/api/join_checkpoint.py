"""A join buffer's checkpointed form: per key group, *chunks* of rows, written incrementally.

A checkpoint writes, for every key group that received rows since the previous checkpoint,
one new chunk holding those rows (the ones still live): the value state entry
``(key group, chunk number) -> (rows, arrival stamps or None)``, stored in that key group
(``update_many(..., key_groups=...)``), so a snapshot holds each group's rows in its section
and a rescale hands them to the subtask that owns the group. Nothing else is rewritten, so
on the rocksdb backend a checkpoint's upload is about the rows that arrived since the last
one, not the whole join state.

On a backend that writes ahead (``KeyedStateBackend.writes_ahead``: the rocksdb one), rows
need not wait for the checkpoint: once :attr:`BufferCheckpoint.SPILL_BYTES` of them arrived,
:meth:`BufferCheckpoint.maybe_spill` writes them into the database as *parts* of the chunks the
next checkpoint closes, ``(key group, chunk number, part)`` (part 0 keeps the two-number key),
so that checkpoint's synchronous part writes only the rest (Flink's RocksDB backend writes every
record as it arrives; a checkpoint there only flushes the memtable). A chunk is all its parts:
read, rewritten and deleted together.

Expired rows stay in their chunks until they are worth dropping: a group's chunks are
rewritten as one (*compacted*: read back, live rows kept, old entries deleted) once a quarter
of their rows has expired, and the two adjacent chunks of a group with the fewest rows are
merged while the group has more than :attr:`BufferCheckpoint.MAX_CHUNKS` (a join without
expiry would otherwise add a chunk per checkpoint forever). Which stored rows have expired is
itself part of the checkpoint: per key group, the entry ``(key group, -1) -> {chunk number:
threshold}`` says that the chunk's rows with an expiry column (event time, or arrival time
with a TTL) at or below the threshold have expired; it is rewritten only when it changes. A
restore drops those rows, so it buffers exactly the rows that were live at the checkpoint.

Thresholds, as in :class:`~snapflow.worker.api.join_buffer.JoinBuffer`: an expiry applies to
the rows added before it (a row that arrives at the threshold stays until the next one), so a
chunk's threshold is the buffer's latest one only if the buffer expired rows after the chunk
was written (or restored), and never lower than the threshold the chunk was restored with.
Hence all parts of a chunk are written between the same two expiries: a spill after an expiry
first closes the chunks its earlier parts opened.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa

from snapflow.worker.api.join_buffer import I64_MIN, JoinBuffer
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.errors import IncompatibleStateError
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import ValueState

__all__ = ["THRESHOLDS", "BufferCheckpoint", "part_keys"]

THRESHOLDS = -1
"""The chunk number of a key group's entry of expiry thresholds."""


@dataclass
class _Chunk:
    """A stored chunk, as the checkpoint tracks it."""

    number: int
    rows: int
    """Rows in the stored entry (expired ones included)."""
    expiry: np.ndarray[Any, Any] | None
    """The stored rows' expiry column, sorted (None: the buffer never expires rows)."""
    floor: int
    """Stored rows at or below this are expired (restored with it; ``I64_MIN``: none)."""
    expiries: int
    """``JoinBuffer.expiries`` when written or restored: a later expiry applies to it."""
    parts: int = 1
    """Stored entries holding its rows (:func:`part_keys`)."""


@dataclass
class _Open:
    """A chunk whose parts are being written (spilled) before the checkpoint that closes it."""

    number: int
    parts: int
    rows: int
    expiry: list[np.ndarray[Any, Any]]
    expiries: int


def part_keys(group: int, number: int, parts: int) -> list[tuple[int, ...]]:
    """The entries of chunk ``number`` of key group ``group`` with ``parts`` parts."""
    return [(group, number), *((group, number, i) for i in range(1, parts))]


@dataclass
class _Write:
    """A checkpoint's entries to write (``None``: delete), and those it creates."""

    values: dict[tuple[int, ...], Any]
    fresh: set[tuple[int, ...]]

    def put(self, key: tuple[int, ...], value: Any) -> None:
        self.values[key] = value
        self.fresh.add(key)

    def delete(self, key: tuple[int, ...]) -> None:
        if key in self.fresh:  # never stored: nothing to delete
            self.fresh.discard(key)
            del self.values[key]
        else:
            self.values[key] = None


class BufferCheckpoint:
    """The checkpointed form of ``buffer`` in value state ``state`` of ``backend`` (module
    docstring). :meth:`load` restores it, :meth:`save` writes a checkpoint's changes."""

    COMPACT_FRACTION = 4
    """A group's chunks are compacted once ``1 / COMPACT_FRACTION`` of their rows expired."""
    MAX_CHUNKS = 32
    SPILL_BYTES = 8 << 20
    """Rows (Arrow bytes) added since the last write after which :meth:`maybe_spill` writes
    them ahead of the checkpoint, on a backend that writes ahead. (Merges for
    :attr:`MAX_CHUNKS` stay with the checkpoint: docs/worker.md, "Keyed joins: the state
    layout".)"""

    def __init__(
        self, buffer: JoinBuffer, state: ValueState[Any], backend: KeyedStateBackend
    ) -> None:
        self.buffer = buffer
        self.state = state
        self.backend = backend
        self.groups: dict[int, list[_Chunk]] = {}
        """The stored chunks per key group, oldest first."""
        self.next_number: dict[int, int] = {}
        self.saved_thresholds: dict[int, dict[int, int]] = {}
        """Per key group, what its thresholds entry holds."""
        self.open: dict[int, _Open] = {}
        """Per key group, the chunk its spilled parts began (closed by the next save)."""
        self._counted: tuple[list[Any], int, int] = (buffer.unsaved, 0, 0)
        """The ``buffer.unsaved`` list counted (the buffer replaces it when its rows are
        written or cleared), how many of its rows were counted, and their bytes."""

    # --- thresholds -------------------------------------------------------------------------

    def _threshold(self, chunk: _Chunk) -> int:
        b = self.buffer
        if chunk.expiries < b.expiries:
            return max(chunk.floor, b.expired_below)
        return chunk.floor

    def _expired(self, chunk: _Chunk) -> int:
        if chunk.expiry is None:
            return 0
        threshold = self._threshold(chunk)
        if threshold == I64_MIN:
            return 0
        return int(np.searchsorted(chunk.expiry, threshold, "right"))

    def _expiry_of(self, rows: pa.RecordBatch, stamps: np.ndarray[Any, Any] | None) -> Any:
        b = self.buffer
        if not b.expiring:
            return None
        if b.with_stamps:
            return stamps if stamps is not None else np.zeros(rows.num_rows, np.int64)
        return b.times_of(rows)

    # --- saving -----------------------------------------------------------------------------

    def maybe_spill(self) -> None:
        """Write the rows added since the last write as parts of the open chunks, if they
        hold at least :attr:`SPILL_BYTES` and the backend writes ahead (module docstring)."""
        b = self.buffer
        if b.cleared or not self.backend.writes_ahead:
            return
        listed, counted, size = self._counted
        if listed is not b.unsaved:  # written or cleared since
            counted, size = 0, 0
        size += sum(u.rows.nbytes for u in b.unsaved[counted:])
        self._counted = (b.unsaved, len(b.unsaved), size)
        if size < self.SPILL_BYTES:
            return
        write = _Write({}, set())
        self._close_open_before_expiry()
        self._add_new_rows(write)
        self._store(write)
        self.backend.write_ahead()

    def save(self) -> None:
        """Write what changed since the last checkpoint: new chunks, rewritten groups, deleted
        entries and changed thresholds."""
        write = _Write({}, set())
        b = self.buffer
        if b.cleared:
            self._close_open()  # their parts are deleted with the stored chunks
            for g, chunks in self.groups.items():
                self._delete(write, g, chunks)
            self.groups = {}
            b.cleared = False
        self._close_open_before_expiry()
        self._add_new_rows(write)
        self._close_open()
        for g in list(self.groups):
            chunks = self.groups[g]
            expired = sum(self._expired(c) for c in chunks)
            if expired and expired * self.COMPACT_FRACTION >= sum(c.rows for c in chunks):
                self._rewrite(write, g, 0, len(chunks))
            self._cap(write, g)
        self._write_thresholds(write)
        self._store(write)

    def _cap(self, write: _Write, group: int) -> None:
        """Merge the two adjacent chunks of ``group`` with the fewest rows while it has more
        than :attr:`MAX_CHUNKS`."""
        while len(self.groups.get(group, ())) > self.MAX_CHUNKS:
            chunks = self.groups[group]
            sizes = [x.rows + y.rows for x, y in itertools.pairwise(chunks)]
            i = sizes.index(min(sizes))
            self._rewrite(write, group, i, i + 2)

    def _store(self, write: _Write) -> None:
        if write.values:
            keys = list(write.values)
            self.state.update_many(
                keys, list(write.values.values()), key_groups=[k[0] for k in keys]
            )

    def _close_open_before_expiry(self) -> None:
        """Close the open chunks if the buffer expired rows since they opened: all parts of a
        chunk are written between the same two expiries (module docstring)."""
        if any(o.expiries != self.buffer.expiries for o in self.open.values()):
            self._close_open()

    def _close_open(self) -> None:
        """The open chunks become stored chunks (:attr:`groups`)."""
        b = self.buffer
        for g, o in self.open.items():
            expiry = np.sort(np.concatenate(o.expiry)) if b.expiring else None
            self.groups.setdefault(g, []).append(
                _Chunk(o.number, o.rows, expiry, I64_MIN, o.expiries, o.parts)
            )
        self.open = {}

    def _add_new_rows(self, write: _Write) -> None:
        """A new part of each key group's open chunk (opening one if need be) from the
        buffer's rows added since the last write (those still live)."""
        b = self.buffer
        batches: list[pa.RecordBatch] = []
        stamps: list[np.ndarray[Any, Any]] = []
        expiry: list[np.ndarray[Any, Any]] = []
        for u in b.unsaved:
            rows, s, e = u.rows, u.stamps, u.expiry
            if u.expiries < b.expiries:
                alive = e > b.expired_below
                if not alive.all():
                    rows, e = rows.filter(pa.array(alive)), e[alive]
                    s = s[alive] if s is not None else None
            if rows.num_rows:
                batches.append(rows)
                expiry.append(e)
                if s is not None:
                    stamps.append(s)
        b.unsaved = []
        if not batches:
            return
        rows = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        all_stamps = np.concatenate(stamps) if b.with_stamps else None
        all_expiry = np.concatenate(expiry) if b.expiring else None
        groups = kgs.key_groups(rows.column(b.key_field), self.backend.max_parallelism)
        g = groups.to_numpy()
        order = np.argsort(g, kind="stable")
        sorted_g = g[order]
        cuts = np.flatnonzero(np.diff(sorted_g)) + 1
        for s_, e_ in itertools.pairwise([0, *cuts.tolist(), len(sorted_g)]):
            # A take per group, not a slice of one sorted batch: pickling an Arrow slice
            # writes its parent's whole buffers, so every group would carry all the rows.
            picked = order[s_:e_]
            group = int(sorted_g[s_])
            o = self.open.get(group)
            if o is None:
                number = self.next_number.get(group, 0)
                self.next_number[group] = number + 1  # taken now: a merge may number one too
                o = self.open[group] = _Open(number, 0, 0, [], b.expiries)
            part_stamps = all_stamps[picked] if all_stamps is not None else None
            write.put(
                part_keys(group, o.number, o.parts + 1)[-1],
                (rows.take(pa.array(picked)), part_stamps),
            )
            o.parts += 1
            o.rows += len(picked)
            if all_expiry is not None:
                o.expiry.append(all_expiry[picked])

    def _delete(self, write: _Write, group: int, chunks: list[_Chunk]) -> None:
        for c in chunks:
            for key in part_keys(group, c.number, c.parts):
                write.delete(key)

    def _rewrite(self, write: _Write, group: int, start: int, end: int) -> None:
        """Replace chunks ``start:end`` of ``group`` by one of their live rows (none if every
        row expired)."""
        chunks = self.groups[group]
        old = chunks[start:end]
        # Chunks written by this checkpoint are still in ``write``, not yet in the state.
        pending = write.values
        keys = [k for c in old for k in part_keys(group, c.number, c.parts)]
        stored_keys = [k for k in keys if k not in write.fresh]
        stored = dict(
            zip(
                stored_keys,
                self.state.get_many(stored_keys, key_groups=[group] * len(stored_keys)),
                strict=True,
            )
        )
        batches: list[pa.RecordBatch] = []
        stamps: list[np.ndarray[Any, Any]] = []
        b = self.buffer
        for c in old:
            values = []
            for key in part_keys(group, c.number, c.parts):
                value = pending[key] if key in write.fresh else stored[key]
                if value is None:
                    raise IncompatibleStateError(
                        f"{b.who}: the checkpointed chunk {key} of the join's rows is missing"
                    )
                values.append(value)
            rows, s = _joined(b, values)
            threshold = self._threshold(c)
            if threshold != I64_MIN:
                alive = self._expiry_of(rows, s) > threshold
                if not alive.all():
                    keep = pa.array(np.flatnonzero(alive))
                    rows = rows.take(keep)
                    s = s[alive] if s is not None else None
            if rows.num_rows:
                batches.append(rows)
                if s is not None:
                    stamps.append(s)
        self._delete(write, group, old)
        new: list[_Chunk] = []
        if batches:
            rows = pa.concat_batches([b.conform(r) for r in batches])
            s_all = np.concatenate(stamps) if b.with_stamps else None
            number = self.next_number.get(group, 0)
            self.next_number[group] = number + 1
            write.put((group, number), (rows, s_all))
            e = self._expiry_of(rows, s_all)
            new = [_Chunk(number, rows.num_rows, None if e is None else np.sort(e), I64_MIN,
                          b.expiries)]  # fmt: skip
        chunks[start:end] = new
        if not chunks:
            del self.groups[group]

    def _write_thresholds(self, write: _Write) -> None:
        if not self.buffer.expiring:
            return
        for g in sorted(set(self.groups) | set(self.saved_thresholds)):
            # the largest expired value, not the threshold itself: the same rows expire, and
            # the entry changes only when more of them do
            now = {
                c.number: int(c.expiry[n - 1])
                for c in self.groups.get(g, ())
                if c.expiry is not None and (n := self._expired(c))
            }
            if now != self.saved_thresholds.get(g, {}):
                if now:
                    write.put((g, THRESHOLDS), now)
                else:
                    write.values[(g, THRESHOLDS)] = None
                if now:
                    self.saved_thresholds[g] = now
                else:
                    self.saved_thresholds.pop(g, None)

    # --- restoring --------------------------------------------------------------------------

    def load(self, name: str) -> None:
        """Buffer the restored chunks of state ``name`` (every key group of the backend),
        without the rows their thresholds say expired."""
        chunks: dict[tuple[int, int], dict[int, Any]] = {}
        thresholds: dict[int, dict[int, int]] = {}
        for key, value in self.backend.entries(name):
            group, number = key[0], key[1]
            if number == THRESHOLDS:
                thresholds[group] = dict(value)
            else:
                chunks.setdefault((group, number), {})[key[2] if len(key) > 2 else 0] = value
        b = self.buffer
        restored: list[tuple[pa.RecordBatch, np.ndarray[Any, Any] | None]] = []
        for group, number in sorted(chunks):
            stored = chunks[(group, number)]
            if sorted(stored) != list(range(len(stored))):
                raise IncompatibleStateError(
                    f"{b.who}: the checkpointed chunk {(group, number)} of the join's rows "
                    f"lacks parts (it has parts {sorted(stored)[:8]})"
                )
            rows, s = _joined(b, [stored[i] for i in range(len(stored))])
            e = self._expiry_of(rows, s)
            floor = thresholds.get(group, {}).get(number, I64_MIN)
            live, live_s = rows, s
            if e is not None and floor != I64_MIN:
                alive = e > floor
                live = rows.filter(pa.array(alive))
                live_s = s[alive] if s is not None else None
            restored.append((live, live_s))
            self.groups.setdefault(group, []).append(
                _Chunk(number, rows.num_rows, None if e is None else np.sort(e), floor,
                       b.expiries, len(stored))
            )  # fmt: skip
            self.next_number[group] = max(self.next_number.get(group, 0), number + 1)
        self.saved_thresholds = thresholds
        b.restore(restored)


def _stamps(stamps: Any) -> np.ndarray[Any, Any] | None:
    return None if stamps is None else np.asarray(stamps, np.int64)


def _joined(
    buffer: JoinBuffer, values: list[Any]
) -> tuple[pa.RecordBatch, np.ndarray[Any, Any] | None]:
    """The rows and stamps of a chunk from its parts' stored values, in part order."""
    if len(values) == 1:
        return buffer.conform(values[0][0]), _stamps(values[0][1])
    rows = pa.concat_batches([buffer.conform(v[0]) for v in values])
    stamps = [_stamps(v[1]) for v in values]
    if any(s is None for s in stamps):
        return rows, None
    return rows, np.concatenate(cast(list[np.ndarray[Any, Any]], stamps))

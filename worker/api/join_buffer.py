"""One input's buffered rows in a keyed join (interval or regular), probed in bulk.

Layout (in memory, per subtask and side): a few *runs*, each an Arrow record batch of the
side's rows sorted by (key code, event time) with numpy columns beside it:

* ``codes``: the key's 64-bit code (integer keys: the value itself, so equal codes are equal
  keys; other types: :func:`snapflow.worker.state.keygroups.key_hashes`, checked for equality
  after a match);
* ``times``: event time in ms (0 for the regular join), ``stamps``: processing time of arrival
  (only with a state TTL);
* ``comp``: a composite int64 sort key ``key rank * (distinct times + 1) + time rank``: the
  rows of one key within a time range are one slice of it, found with two
  ``numpy.searchsorted`` per probing row, whatever the key type and the span of time (ranks,
  not values, so it never overflows).

A batch that arrives becomes a new run; runs of similar size are merged (a binary counter:
``O(log n)`` runs, each row re-sorted ``O(log n)`` times), up to :attr:`JoinBuffer.MAX_RUN_ROWS`
rows: a run that size is merged no more, so no merge sorts more than twice that many rows and
the runs grow in number only with the state. Rows are dropped in bulk: every
probe ignores rows at or below the *expiry threshold* (event time for the interval join,
arrival time for a TTL), and runs are rewritten only once a quarter of them has expired.

Checkpoints (:mod:`snapflow.worker.api.join_checkpoint`) are incremental: the buffer keeps
the rows added since the last checkpoint (:attr:`JoinBuffer.unsaved`) and counts its expiries,
so that a checkpoint writes only those rows and what expiry made worth rewriting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.worker.state import keygroups as kgs

__all__ = ["JoinBuffer", "Matches", "Run", "Unsaved", "event_times", "key_codes"]

_I64 = pa.int64()
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1
_EMPTY_I64: np.ndarray[Any, Any] = np.empty(0, np.int64)


def key_codes(keys: pa.Array, who: str) -> tuple[np.ndarray[Any, Any], bool]:
    """The uint64 codes of ``keys`` and whether equal codes mean equal keys (integers)."""
    if keys.null_count:
        raise InvalidArgumentError(f"{who}: null keys cannot be joined")
    t = keys.type
    if pa.types.is_integer(t):
        if not pa.types.is_int64(t) and not pa.types.is_uint64(t):
            keys = pc.cast(keys, _I64)
        return keys.to_numpy(zero_copy_only=False).view(np.uint64), True
    return kgs.key_hashes(keys).to_numpy(zero_copy_only=False), False


def event_times(column: pa.Array, field: str, who: str) -> np.ndarray[Any, Any]:
    """An event-time column (integer ms or an Arrow timestamp) as int64 ms."""
    t = column.type
    if column.null_count:
        raise InvalidArgumentError(f"{who}: event time {field!r} has nulls; every row needs one")
    if pa.types.is_timestamp(t):
        column = pc.cast(pc.cast(column, pa.timestamp("ms", t.tz)), _I64)
    elif pa.types.is_integer(t):
        column = pc.cast(column, _I64) if not pa.types.is_int64(t) else column
    else:
        raise InvalidArgumentError(
            f"{who}: event time {field!r} must be integer ms or a timestamp, got {t}"
        )
    return column.to_numpy(zero_copy_only=False)


@dataclass
class Run:
    """Rows sorted by (code, time) and what probing them needs (see the module docstring)."""

    rows: pa.RecordBatch
    codes: np.ndarray[Any, Any]
    times: np.ndarray[Any, Any]
    stamps: np.ndarray[Any, Any] | None
    distinct: np.ndarray[Any, Any]
    utimes: np.ndarray[Any, Any]
    comp: np.ndarray[Any, Any]
    live: int
    """Rows not yet known to be expired (the run is rewritten when a quarter has)."""
    below: int
    """Rows of this run with an expiry column ``<=`` this are expired (``I64_MIN``: none).
    Per run: a row that arrives at the watermark itself stays until the next one, as under
    Flink's timers, which fire only when the watermark advances."""
    span: int
    """> 0: ``comp = key rank * span + (time - utimes[0])``; -1: ``utimes`` are the distinct
    times and ``comp = key rank * (len(utimes) + 1) + time rank`` (a span that would overflow)."""
    exact: bool = True
    """Equal codes are equal keys (integer keys); else keys are compared after a match."""

    def time_slots(
        self, low: np.ndarray[Any, Any] | None, high: np.ndarray[Any, Any] | None
    ) -> tuple[Any, Any, int]:
        """The composite offsets of ``[low, high]`` within a key's slice, and the slice's
        width."""
        if self.span > 0:
            tmin, width = int(self.utimes[0]), self.span
            # clipped before subtracting: no overflow at the int64 bounds
            lo = 0 if low is None else np.clip(low, tmin, tmin + width - 1) - tmin
            hi = (
                width - 1
                if high is None
                else np.clip(high, tmin - 1, tmin + width - 2) - (tmin - 1)
            )
            return lo, hi, width
        ranks = self.utimes
        lo = 0 if low is None else np.searchsorted(ranks, low, "left")
        hi = len(ranks) if high is None else np.searchsorted(ranks, high, "right")
        return lo, hi, len(ranks) + 1

    def __len__(self) -> int:
        return len(self.codes)


def _make_run(
    rows: pa.RecordBatch,
    codes: np.ndarray[Any, Any],
    times: np.ndarray[Any, Any],
    stamps: np.ndarray[Any, Any] | None,
    exact: bool,
) -> Run:
    n = len(codes)
    if n and times[0] == times.min() == times.max():
        # one time (the regular join): a stable sort of the codes alone, which finds the
        # sorted stretches a merge concatenates (timsort) instead of sorting them again
        order = np.argsort(codes, kind="stable")
    else:
        order = np.lexsort((times, codes))
    if not (order[1:] > order[:-1]).all():
        rows = rows.take(pa.array(order))
        codes, times = codes[order], times[order]
        stamps = stamps[order] if stamps is not None else None
    first = np.empty(n, np.bool_)
    if n:
        first[0] = True
        np.not_equal(codes[1:], codes[:-1], out=first[1:])
    krank = np.cumsum(first, dtype=np.int64) - 1
    distinct = codes[first]
    tmin = int(times[0]) if n else 0
    span = (int(times.max()) - int(times.min()) + 2) if n else 2
    if len(distinct) * span < 1 << 62:
        # times as offsets from the smallest: no ranks to look up
        tmin = int(times.min())
        utimes = np.array([tmin, span], np.int64)
        comp = krank * span + (times - tmin)
    else:
        ranks = np.unique(times)
        utimes = ranks
        comp = krank * (len(ranks) + 1) + np.searchsorted(ranks, times)
        span = -1
    return Run(rows, codes, times, stamps, distinct, utimes, comp, n, I64_MIN, span, exact)


def _filter_run(run: Run, keep: np.ndarray[Any, Any]) -> Run:
    """The run's rows where ``keep``: still sorted, so the search arrays stay valid (distinct
    codes and times that no row has any more only make empty slices)."""
    stamps = run.stamps[keep] if run.stamps is not None else None
    n = int(keep.sum())
    return Run(
        run.rows.filter(pa.array(keep)),
        run.codes[keep],
        run.times[keep],
        stamps,
        run.distinct,
        run.utimes,
        run.comp[keep],
        n,
        I64_MIN,
        run.span,
        run.exact,
    )


@dataclass
class Unsaved:
    """Rows added since the last checkpoint, as they were added (the run's arrays are never
    changed in place, so these references stay valid while the run is merged or filtered)."""

    rows: pa.RecordBatch
    stamps: np.ndarray[Any, Any] | None
    expiry: np.ndarray[Any, Any]
    """The expiry column (times, or stamps with a TTL) of ``rows``."""
    expiries: int
    """:attr:`JoinBuffer.expiries` when added: a later expiry applies to these rows."""


@dataclass
class Matches:
    """The rows of a buffer matched by probing rows: ``probe[i]`` (a row index of the probing
    batch) pairs with row ``i`` of ``rows``; in probing-row order, and per probing row in the
    order the matched rows arrived (run by run), then by time."""

    probe: np.ndarray[Any, Any]
    rows: pa.RecordBatch
    times: np.ndarray[Any, Any]

    def __len__(self) -> int:
        return len(self.probe)


def _expand(starts: np.ndarray[Any, Any], counts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``starts[j] + 0 .. counts[j] - 1`` for every j, concatenated."""
    total = int(counts.sum())
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(total, dtype=np.int64)


class JoinBuffer:
    """The buffered rows of one side (module docstring). ``key_field`` and ``time_field``
    (None: no event time, the regular join) name the columns; ``with_stamps``: rows carry
    their arrival time (a state TTL)."""

    MAX_RUN_ROWS = 1 << 18
    """Rows from which a run is merged no more (module docstring)."""

    def __init__(
        self, key_field: str, time_field: str | None, who: str, *, with_stamps: bool = False
    ) -> None:
        self.key_field = key_field
        self.time_field = time_field
        self.who = who
        self.with_stamps = with_stamps
        self.schema: pa.Schema | None = None
        self.runs: list[Run] = []
        self.expired_below = I64_MIN
        """The latest expiry threshold (:meth:`expire`); each run keeps the one it was last
        checked against (``Run.below``): its rows at or below it never match again and are
        not snapshotted."""
        self.expiries = 0
        """How many times :meth:`expire` moved the threshold: rows added (or checkpointed)
        before the latest move are expired at or below :attr:`expired_below`, later ones not
        yet."""
        self.unsaved: list[Unsaved] = []
        """Rows added since the last checkpoint (taken by the checkpoint)."""
        self.cleared = False
        """:meth:`clear` dropped every row: the next checkpoint drops every saved one too."""

    @property
    def expiring(self) -> bool:
        """Rows can expire (event time or a TTL); the regular join without a TTL keeps all."""
        return self.with_stamps or self.time_field is not None

    def __len__(self) -> int:
        return sum(r.live for r in self.runs)

    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` in the side's schema (the first batch's); equal names are cast."""
        if self.schema is None:
            self.schema = batch.schema
            return batch
        if batch.schema.equals(self.schema):
            return batch
        if batch.schema.names != self.schema.names:
            raise InvalidArgumentError(
                f"{self.who}: a batch has columns {batch.schema.names}, earlier batches "
                f"{self.schema.names}; one input of a join needs one schema"
            )
        try:
            return batch.cast(self.schema)
        except (pa.ArrowException, ValueError) as e:
            raise InvalidArgumentError(
                f"{self.who}: a batch does not fit the input's schema {self.schema}: {e}"
            ) from None

    def times_of(self, batch: pa.RecordBatch) -> np.ndarray[Any, Any]:
        if self.time_field is None:
            return np.zeros(batch.num_rows, np.int64)
        return event_times(batch.column(self.time_field), self.time_field, self.who)

    # --- adding and expiring -------------------------------------------------------------------

    def sorted_run(
        self,
        rows: pa.RecordBatch,
        times: np.ndarray[Any, Any],
        stamps: np.ndarray[Any, Any] | None = None,
    ) -> Run:
        """``rows`` (conformed) with their times and arrival stamps as a run: sorted by key
        code and time, ready to probe the other side and to be added."""
        codes, exact = key_codes(rows.column(self.key_field), self.who)
        return _make_run(rows, codes, times, stamps, exact)

    def add(self, run: Run) -> None:
        """Buffer ``run``: the newest two runs are merged while the older has fewer than
        twice the newer's rows and fewer than :attr:`MAX_RUN_ROWS`, so sizes at least double
        from the newest run to the oldest (rows in time order expire run by run, the oldest
        first). A cap on the number of runs instead (eight, merging the smallest adjacent
        pair) made every batch merge into runs that grow with the state: Nexmark q20 fell to
        95 K events/s over a 230 s run, half its time in these merges."""
        if not len(run):
            return
        self.unsaved.append(Unsaved(run.rows, run.stamps, self._expiry_column(run), self.expiries))
        runs = self.runs
        runs.append(run)
        while (
            len(runs) >= 2
            and len(runs[-2]) < 2 * len(runs[-1])
            and len(runs[-2]) < self.MAX_RUN_ROWS
        ):
            runs[-2:] = [self._merge(runs[-2:])]

    def _merge(self, runs: list[Run]) -> Run:
        runs = [r if r.live == len(r) else _filter_run(r, self._alive(r)) for r in runs]
        stamps = (
            np.concatenate([r.stamps for r in runs if r.stamps is not None])
            if self.with_stamps
            else None
        )
        return _make_run(
            pa.concat_batches([r.rows for r in runs]),
            np.concatenate([r.codes for r in runs]),
            np.concatenate([r.times for r in runs]),
            stamps,
            runs[0].exact,
        )

    def _expiry_column(self, run: Run) -> np.ndarray[Any, Any]:
        if self.with_stamps:
            assert run.stamps is not None
            return run.stamps
        return run.times

    def _alive(self, run: Run) -> np.ndarray[Any, Any]:
        return self._expiry_column(run) > run.below

    def expire(self, below: int) -> None:
        """Rows with time (stamp, with a TTL) ``<= below`` are expired from now on; runs are
        rewritten once a quarter of their rows has expired."""
        if below <= self.expired_below:
            return
        self.expired_below = below
        self.expiries += 1
        kept: list[Run] = []
        for run in self.runs:
            column = self._expiry_column(run)
            alive = column > below
            n = int(alive.sum())
            if n == 0:
                continue
            if n <= len(run) * 3 // 4:
                run = _filter_run(run, alive)
            elif n < len(run):
                run.live, run.below = n, below
            kept.append(run)
        self.runs = kept

    def clear(self) -> None:
        self.runs = []
        self.unsaved = []
        self.cleared = True

    # --- probing ---------------------------------------------------------------------------

    def probe(
        self,
        probe: Run,
        probe_key: str,
        low: np.ndarray[Any, Any] | None,
        high: np.ndarray[Any, Any] | None,
    ) -> Matches:
        """The live buffered rows that have the key of row j of ``probe`` (a run of the other
        side, keyed by its field ``probe_key``) and a time in ``[low[j], high[j]]`` (None: any
        time)."""
        keys = None if probe.exact else probe.rows.column(probe_key)
        parts: list[tuple[np.ndarray[Any, Any], pa.RecordBatch, np.ndarray[Any, Any]]] = []
        for run in self.runs:
            found = self._probe_run(run, probe.codes, low, high, keys)
            if found is not None:
                parts.append(found)
        if not parts:
            schema = self.schema if self.schema is not None else pa.schema([])
            return Matches(_EMPTY_I64, pa.RecordBatch.from_pylist([], schema=schema), _EMPTY_I64)
        if len(parts) == 1:
            return Matches(*parts[0])
        probe_idx = np.concatenate([p[0] for p in parts])
        order = np.argsort(probe_idx, kind="stable")
        rows = pa.concat_batches([p[1] for p in parts]).take(pa.array(order))
        return Matches(probe_idx[order], rows, np.concatenate([p[2] for p in parts])[order])

    def _probe_run(
        self,
        run: Run,
        codes: np.ndarray[Any, Any],
        low: np.ndarray[Any, Any] | None,
        high: np.ndarray[Any, Any] | None,
        keys: pa.Array | None,
    ) -> tuple[np.ndarray[Any, Any], pa.RecordBatch, np.ndarray[Any, Any]] | None:
        distinct = run.distinct
        if not len(distinct) or not run.live:
            return None
        pos = np.minimum(np.searchsorted(distinct, codes), len(distinct) - 1)
        hit = np.flatnonzero(distinct[pos] == codes)
        if not len(hit):
            return None
        lo_t, hi_t, width = run.time_slots(
            None if low is None else low[hit], None if high is None else high[hit]
        )
        base = pos[hit].astype(np.int64) * width
        lo = np.searchsorted(run.comp, base + lo_t, "left")
        hi = np.searchsorted(run.comp, base + hi_t, "left")
        counts = np.maximum(hi - lo, 0)
        if not counts.any():
            return None
        other = _expand(lo, counts)
        probe = np.repeat(hit, counts)
        keep: np.ndarray[Any, Any] | None = None
        if run.live < len(run):
            keep = self._expiry_column(run)[other] > run.below
        if keys is not None:
            same = pc.equal(
                keys.take(pa.array(probe)), run.rows.column(self.key_field).take(pa.array(other))
            )
            eq = same.to_numpy(zero_copy_only=False)
            keep = eq if keep is None else keep & eq
        if keep is not None:
            probe, other = probe[keep], other[keep]
            if not len(other):
                return None
        return probe, run.rows.take(pa.array(other)), run.times[other]

    # --- checkpoints ---------------------------------------------------------------------------

    def restore(self, parts: list[tuple[pa.RecordBatch, np.ndarray[Any, Any] | None]]) -> None:
        """Buffer the rows of restored state entries (one run; already checkpointed, so not
        :attr:`unsaved`)."""
        batches = [self.conform(rows) for rows, _ in parts if rows.num_rows]
        if not batches:
            return
        rows = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        stamps: np.ndarray[Any, Any] | None = None
        if self.with_stamps:
            stamps = np.concatenate(
                [
                    s if s is not None else np.zeros(r.num_rows, np.int64)
                    for r, s in parts
                    if r.num_rows
                ]
            )
        self.runs = [self.sorted_run(rows, self.times_of(rows), stamps)]

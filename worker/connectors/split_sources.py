"""Replayable sources: a deterministic data generator and a number sequence.

Both are *split* sources (Flink's FLIP-27 model with a static split assignment):

* On a fresh start (``ctx.restored_checkpoint_id == 0``) the source is cut into as many splits
  as the vertex has subtasks, and subtask ``s`` owns split ``s``. A bounded source's records
  are divided over the splits as evenly as possible (split ``s`` of ``p`` gets
  ``total // p + (1 if s < total % p else 0)``).
* Record ``i`` of split ``s`` is a pure function of ``(seed, s, i)`` (see
  :meth:`GeneratorSource.record`), so replaying from a position reproduces exactly the same
  records.
* The position of every owned split (next record index, end, watermark state) is operator list
  state, written in ``snapshot_state`` and read back in ``open``. After a restore each subtask
  resumes its splits exactly where the checkpoint left them. When the parallelism changed, the
  list state is redistributed (contiguous chunks of the old splits), so every split keeps being
  read by exactly one subtask: no record is lost or duplicated. A subtask may then own several
  splits (polled round-robin) or none. A union-list marker tells a restored subtask that owns no
  split apart from an operator that had no state at all (which starts fresh).
* ``poll_batch(max_records)``: at most ``min(max_records, batch_size)`` records of one split;
  a batch with 0 rows when rate-limited (after waiting at most a few milliseconds);
  ``None`` once every split of a bounded source is exhausted (and right away for a bounded
  subtask without splits). An unbounded subtask without splits idles (0-row batches).
* ``current_watermark()``: the minimum over the unfinished splits of their watermarks
  (bounded out-of-orderness over the split's emitted event times); ``MAX_WATERMARK`` once no
  split is left unfinished (finished, or owns none), like Flink's final watermark.
* ``rate_per_s`` is the *total* rate of the source; each subtask produces ``rate_per_s /
  parallelism`` records per second (a token bucket without more than one second of burst).
  ``clock`` (seconds, default ``time.monotonic``) is the bucket's time source: tests drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.api.arrays import arange
from snapflow.worker.runtime.operator import OperatorContext, SourceOperator
from snapflow.worker.runtime.watermarks import BoundedOutOfOrdernessWatermarks
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.operator_state import OperatorListState

__all__ = ["GENERATOR_SCHEMA", "GeneratorSource", "SequenceSource", "SplitSource"]

_U64 = pa.uint64()
_I64 = pa.int64()
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / phi: spreads (seed, split) over the 64-bit space

GENERATOR_SCHEMA = pa.schema([("key", _I64), ("value", _I64), ("ts", _I64)])


@dataclass
class _Split:
    split_id: int
    next_index: int
    end_index: int | None  # None: unbounded
    watermarks: BoundedOutOfOrdernessWatermarks

    @property
    def finished(self) -> bool:
        return self.end_index is not None and self.next_index >= self.end_index

    def entry(self) -> tuple[int, int, int | None, Any]:
        return (self.split_id, self.next_index, self.end_index, self.watermarks.snapshot())


class SplitSource(SourceOperator):
    """Base of the split sources (see the module docstring). Subclasses define
    :meth:`_split_sizes` (records per split on a fresh start, None = unbounded) and
    :meth:`_generate` (the records ``start .. start + n - 1`` of a split)."""

    _runtime_fields: tuple[str, ...] = (
        "_splits",
        "_position_state",
        "_marker_state",
        "_rr",
        "_rate",
        "_rate_start",
        "_rate_emitted",
        "_num_splits",
    )

    clock: Callable[[], float] = time.monotonic
    """The rate limit's time source in seconds (an instance attribute only when injected, so
    the shipped configuration is unchanged by default)."""

    def __init__(
        self,
        *,
        batch_size: int,
        rate_per_s: float | None,
        max_out_of_orderness_ms: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if rate_per_s is not None and not rate_per_s > 0:
            raise InvalidArgumentError(f"rate_per_s must be > 0 or None, got {rate_per_s!r}")
        if not isinstance(max_out_of_orderness_ms, int) or max_out_of_orderness_ms < 0:
            raise InvalidArgumentError(
                f"max_out_of_orderness_ms must be an integer >= 0, got {max_out_of_orderness_ms!r}"
            )
        self.batch_size = batch_size
        self.rate_per_s = rate_per_s
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        if clock is not None:
            self.clock = clock

    # --- subclass hooks ---------------------------------------------------------------------

    def _split_sizes(self, num_splits: int) -> list[int | None]:
        raise NotImplementedError

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        raise NotImplementedError

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array | None:
        """The event-time column of a generated batch (None: no event time)."""
        return None

    @property
    def bounded(self) -> bool:
        raise NotImplementedError

    # --- life cycle -------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._position_state: OperatorListState[Any] = ctx.operator_state.get_list_state(
            ctx.state_name("splits")
        )
        self._marker_state: OperatorListState[Any] = ctx.operator_state.get_union_list_state(
            ctx.state_name("num-splits")
        )
        markers = self._marker_state.get()
        if ctx.is_restored and markers:
            self._num_splits = int(markers[0])
            entries = self._position_state.get()
        else:
            self._num_splits = ctx.parallelism
            sizes = self._split_sizes(ctx.parallelism)
            s = ctx.subtask_index
            entries = [(s, 0, sizes[s], None)]
        self._splits = []
        for entry in entries:
            if not (isinstance(entry, tuple) and len(entry) == 4):
                raise StateError(f"{self.name}: malformed split position {entry!r:.100}")
            split_id, next_index, end_index, wm_state = entry
            wm = BoundedOutOfOrdernessWatermarks(self.max_out_of_orderness_ms)
            wm.restore(wm_state)
            self._splits.append(_Split(split_id, next_index, end_index, wm))
        self._splits.sort(key=lambda sp: sp.split_id)
        self._rr = 0
        self._rate = (
            None if self.rate_per_s is None else float(self.rate_per_s) / max(1, ctx.parallelism)
        )
        self._rate_start = self.clock()
        self._rate_emitted = 0

    def snapshot_state(self, checkpoint_id: int) -> None:
        self._position_state.update([sp.entry() for sp in self._splits])
        self._marker_state.update([self._num_splits])

    @property
    def splits(self) -> list[tuple[int, int, int | None]]:
        """``(split_id, next_index, end_index)`` of the splits this subtask owns."""
        return [(sp.split_id, sp.next_index, sp.end_index) for sp in self._splits]

    @property
    def finished(self) -> bool:
        return all(sp.finished for sp in self._splits) and (self.bounded or not self._splits)

    def _allowance(self, wanted: int) -> int:
        rate = self._rate
        if rate is None:
            return wanted
        now = self.clock()
        allowed = int((now - self._rate_start) * rate) - self._rate_emitted
        if allowed > rate + wanted:  # at most one second of burst after a stall
            self._rate_start = now - 1.0
            self._rate_emitted = 0
            allowed = int(rate)
        # Release at least MIN_BATCH_INTERVAL_S worth of records (or a full batch): releasing
        # whatever accumulated since the last poll made batches of a few rows, whose per-batch
        # cost then saturated the CPU at any rate.
        minimum = min(wanted, max(1, int(rate * MIN_BATCH_INTERVAL_S)))
        if allowed < minimum:
            return 0  # the task waits a few ms (and takes checkpoint triggers) before polling again
        return max(0, min(wanted, allowed))

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        self._context()
        active = [sp for sp in self._splits if not sp.finished]
        if not active:
            if self.bounded or self._splits:
                return None
            return self._empty()  # unbounded subtask without splits: idle
        split = active[self._rr % len(active)]
        self._rr += 1
        wanted = min(max(0, int(max_records)), self.batch_size)
        if split.end_index is not None:
            wanted = min(wanted, split.end_index - split.next_index)
        n = self._allowance(wanted)
        if n <= 0:
            return self._empty()
        batch = self._generate(split.split_id, split.next_index, n)
        split.next_index += n
        self._rate_emitted += n
        times = self._event_times(batch)
        if times is not None:
            split.watermarks.on_timestamps(times)
        return batch

    def idle_at_once(self) -> bool:
        """No split left to read (an unbounded subtask without splits): idle at once."""
        return all(sp.finished for sp in self._splits)

    def _empty(self) -> pa.RecordBatch:
        return self._generate(0, 0, 0)

    def current_watermark(self) -> int:
        self._context()
        active = [sp for sp in self._splits if not sp.finished]
        if not active:
            return MAX_WATERMARK
        return min(sp.watermarks.current_watermark() for sp in active)


MIN_BATCH_INTERVAL_S = 0.02
"""A rate-limited source emits batches of at least this much time's worth of records."""


def _split_evenly(total: int, parts: int) -> list[int | None]:
    base, rest = divmod(total, parts)
    return [base + (1 if s < rest else 0) for s in range(parts)]


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------


def split_base(seed: int, split_id: int) -> int:
    """Where record 0 of split ``split_id`` starts in the 64-bit hash space of ``seed``: a
    replayable source's record ``i`` of the split is a pure function of ``base + i``."""
    return kgs.fmix64((seed * _GOLDEN + split_id) & _MASK64) * _GOLDEN & _MASK64


class GeneratorSource(SplitSource):
    """Deterministic, replayable records ``key, value, ts`` (all int64).

    Record ``i`` of split ``s`` (:meth:`record` is the scalar definition)::

        h     = fmix64((base(seed, s) + i) mod 2**64)      # MurmurHash3 finalizer
        key   = h mod num_keys
        value = (h >> 32) mod value_range
        ts    = start_ms + i * interval_ms - ((h >> 16) mod (max_out_of_orderness_ms + 1))

    Event time increases with ``i``, out of order by at most ``max_out_of_orderness_ms``; the
    watermark (bounded out-of-orderness by the same bound) therefore never makes a record of the
    source late. ``total_records`` None: unbounded; otherwise split over the initial parallelism.
    """

    output_schema = GENERATOR_SCHEMA

    def runs_on_loop(self) -> bool:
        return True  # a batch is a few vectorised Arrow kernels; the rate limit never sleeps

    def __init__(
        self,
        total_records: int | None = None,
        rate_per_s: float | None = None,
        num_keys: int = 1000,
        batch_size: int = 65536,
        seed: int = 0,
        *,
        value_range: int = 1000,
        start_ms: int = 0,
        interval_ms: int = 1,
        max_out_of_orderness_ms: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            rate_per_s=rate_per_s,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            clock=clock,
        )
        if total_records is not None and (not isinstance(total_records, int) or total_records < 0):
            raise InvalidArgumentError(
                f"total_records must be an integer >= 0 or None, got {total_records!r}"
            )
        for name, value in (("num_keys", num_keys), ("value_range", value_range)):
            if not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(interval_ms, int) or interval_ms < 0:
            raise InvalidArgumentError(f"interval_ms must be an integer >= 0, got {interval_ms!r}")
        self.total_records = total_records
        self.num_keys = num_keys
        self.seed = seed
        self.value_range = value_range
        self.start_ms = start_ms
        self.interval_ms = interval_ms

    @property
    def bounded(self) -> bool:
        return self.total_records is not None

    def _split_sizes(self, num_splits: int) -> list[int | None]:
        if self.total_records is None:
            return [None] * num_splits
        return _split_evenly(self.total_records, num_splits)

    def record(self, split_id: int, i: int) -> dict[str, int]:
        """Record ``i`` of split ``split_id`` (the scalar definition of the generator)."""
        h = kgs.fmix64((split_base(self.seed, split_id) + i) & _MASK64)
        jitter = (h >> 16) % (self.max_out_of_orderness_ms + 1)
        return {
            "key": h % self.num_keys,
            "value": (h >> 32) % self.value_range,
            "ts": self.start_ms + i * self.interval_ms - jitter,
        }

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        if n == 0:
            return pa.RecordBatch.from_arrays([pa.array([], _I64)] * 3, schema=GENERATOR_SCHEMA)
        rel = arange(n)
        idx = pc.add(rel, pa.scalar(start, _I64)) if start else rel
        base = (split_base(self.seed, split_id) + start) & _MASK64
        h = kgs.fmix64_array(pc.add(pc.cast(rel, _U64), pa.scalar(base, _U64)))
        key = pc.cast(pc.modulo(h, pa.scalar(self.num_keys, _U64)), _I64)
        value = pc.cast(
            pc.modulo(pc.shift_right(h, pa.scalar(32, _U64)), pa.scalar(self.value_range, _U64)),
            _I64,
        )
        ts = pc.multiply(idx, pa.scalar(self.interval_ms, _I64)) if self.interval_ms else None
        if ts is None:
            ts = pa.nulls(n, _I64).fill_null(self.start_ms)
        elif self.start_ms:
            ts = pc.add(ts, pa.scalar(self.start_ms, _I64))
        if self.max_out_of_orderness_ms:
            jitter = pc.cast(
                pc.modulo(
                    pc.shift_right(h, pa.scalar(16, _U64)),
                    pa.scalar(self.max_out_of_orderness_ms + 1, _U64),
                ),
                _I64,
            )
            ts = pc.subtract(ts, jitter)
        return pa.RecordBatch.from_arrays([key, value, ts], schema=GENERATOR_SCHEMA)

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array | None:
        return batch.column(2)

    def __repr__(self) -> str:
        return (
            f"GeneratorSource(total_records={self.total_records}, rate_per_s={self.rate_per_s}, "
            f"num_keys={self.num_keys}, batch_size={self.batch_size}, seed={self.seed})"
        )


# ---------------------------------------------------------------------------------------------
# Sequence
# ---------------------------------------------------------------------------------------------


class SequenceSource(SplitSource):
    """The integers ``start .. end - 1`` in one int64 column ``field``, bounded. Split ``s`` of
    the initial ``p`` covers a contiguous range; record ``i`` of a split is its ``i``-th number.
    No event time: the watermark stays ``MIN_WATERMARK`` until the subtask is finished."""

    def runs_on_loop(self) -> bool:
        return True  # a batch is one Arrow range

    def __init__(
        self,
        start: int,
        end: int,
        batch_size: int = 65536,
        field: str = "value",
        rate_per_s: float | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, rate_per_s=rate_per_s, clock=clock)
        if not isinstance(start, int) or not isinstance(end, int) or end < start:
            raise InvalidArgumentError(f"need integers start <= end, got {start!r}, {end!r}")
        self.start = start
        self.end = end
        self.field = field
        self.schema = pa.schema([(field, _I64)])
        self.output_schema = self.schema

    @property
    def bounded(self) -> bool:
        return True

    def _split_sizes(self, num_splits: int) -> list[int | None]:
        return _split_evenly(self.end - self.start, num_splits)

    def _split_start(self, split_id: int) -> int:
        base, rest = divmod(self.end - self.start, self._num_splits)
        return self.start + split_id * base + min(split_id, rest)

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        if n == 0:
            return pa.RecordBatch.from_arrays([pa.array([], _I64)], schema=self.schema)
        first = self._split_start(split_id) + start
        return pa.RecordBatch.from_arrays(
            [pc.add(arange(n), pa.scalar(first, _I64))], schema=self.schema
        )

    def current_watermark(self) -> int:
        wm = super().current_watermark()
        return wm if wm == MAX_WATERMARK else MIN_WATERMARK

    def __repr__(self) -> str:
        return f"SequenceSource(start={self.start}, end={self.end}, field={self.field!r})"

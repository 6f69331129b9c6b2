"""Event-time windows: assigners and the keyed window aggregation operator.

Semantics follow Flink's ``WindowOperator`` with the ``EventTimeTrigger``:

* A window is ``[start, end)`` with ``end = start + size``; its *max timestamp* is ``end - 1``.
  Tumbling windows: ``start = ts - (ts - offset) mod size`` (floored modulo, so negative
  timestamps work). Sliding windows: every record belongs to the ``ceil(size / slide)``
  windows ``start = last - j * slide`` (``last = ts - (ts - offset) mod slide``) with
  ``start > ts - size``.
* Window contents are pre-aggregated per ``(key, window)`` with Arrow (``group_by`` over the
  key and window start columns) before the state is touched: one ``ReducingState`` update per
  distinct ``(key, window)`` per batch. The state entry's key is ``(key, window_start)`` (the
  window start is the namespace) stored in the key group of ``key``, so it is snapshotted and
  redistributed with the key.
* One event-time timer per ``(key, window)`` at the window's max timestamp (namespace
  ``(operator_id, window_start)``); a watermark ``>= end - 1`` fires it and emits the row
  ``(key, window_start, window_end, value)``. With ``allowed_lateness_ms = L > 0`` the state is
  kept until a second (cleanup) timer at ``end - 1 + L``; with ``L = 0`` the firing timer
  cleans up.
* A window is *late* when ``end - 1 + L <= watermark``: its records are dropped. A record is
  counted in :attr:`WindowAggregate.num_late_records_dropped` when none of its windows took it
  and it is late itself (``ts + L <= watermark``; Flink's ``numLateRecordsDropped``). Records for a window that already fired but is within
  the allowed lateness are added and the window's updated value is emitted at once (one row per
  such window per batch).
* ``end_input`` fires every remaining window (as the ``MAX_WATERMARK`` a finished bounded
  source sends would). Watermarks are not part of snapshots: a restored operator fires its
  restored windows once the new watermark passes them.
"""

from __future__ import annotations

import math
import operator as _op
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.api.arrays import arange
from snapflow.worker.runtime.chain import fire_timers
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.keyed_state import ReducingState

__all__ = [
    "SlidingEventTimeWindows",
    "TumblingEventTimeWindows",
    "WindowAggregate",
    "WindowAssigner",
]

_I64 = pa.int64()


def _i64(value: int) -> pa.Scalar:
    return pa.scalar(value, _I64)


def _check_ms(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum} (ms), got {value!r}")
    return value


class WindowAssigner:
    """Assigns event timestamps to windows. ``size_ms`` is the window length."""

    size_ms: int

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        """Vectorised assignment of int64 ``timestamps``: ``(rows, starts)`` where ``starts[i]``
        is a window start of record ``rows[i]`` (``rows`` is None when every record has exactly
        one window, ``starts[i]`` then being record i's)."""
        raise NotImplementedError

    def window_starts(self, timestamp: int) -> list[int]:
        """The window starts of one timestamp (the scalar reference of :meth:`assign`)."""
        raise NotImplementedError


class TumblingEventTimeWindows(WindowAssigner):
    """Fixed, non-overlapping windows of ``size_ms`` (aligned to ``offset_ms``)."""

    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
        self.size_ms = _check_ms("size_ms", size_ms, 1)
        if not isinstance(offset_ms, int) or not 0 <= offset_ms < size_ms:
            raise InvalidArgumentError(f"offset_ms must be in [0, size_ms), got {offset_ms!r}")
        self.offset_ms = offset_ms

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        shifted = pc.subtract(timestamps, _i64(self.offset_ms)) if self.offset_ms else timestamps
        return None, pc.subtract(timestamps, pc.modulo(shifted, _i64(self.size_ms)))

    def window_starts(self, timestamp: int) -> list[int]:
        return [timestamp - (timestamp - self.offset_ms) % self.size_ms]

    def __repr__(self) -> str:
        return f"TumblingEventTimeWindows(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size_ms`` starting every ``slide_ms`` (aligned to ``offset_ms``)."""

    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
        self.size_ms = _check_ms("size_ms", size_ms, 1)
        self.slide_ms = _check_ms("slide_ms", slide_ms, 1)
        if not isinstance(offset_ms, int) or not 0 <= offset_ms < slide_ms:
            raise InvalidArgumentError(f"offset_ms must be in [0, slide_ms), got {offset_ms!r}")
        self.offset_ms = offset_ms
        self.windows_per_record = math.ceil(size_ms / slide_ms)

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        n = len(timestamps)
        shifted = pc.subtract(timestamps, _i64(self.offset_ms)) if self.offset_ms else timestamps
        last = pc.subtract(timestamps, pc.modulo(shifted, _i64(self.slide_ms)))
        if self.windows_per_record == 1 and self.size_ms >= self.slide_ms:
            return None, last
        lowest = pc.subtract(timestamps, _i64(self.size_ms))  # start must be > ts - size
        rows = arange(n)
        all_rows, all_starts = [], []
        for j in range(self.windows_per_record):
            starts = pc.subtract(last, _i64(j * self.slide_ms)) if j else last
            keep = pc.greater(starts, lowest)
            all_rows.append(rows.filter(keep))
            all_starts.append(starts.filter(keep))
        return pa.concat_arrays(all_rows), pa.concat_arrays(all_starts)

    def window_starts(self, timestamp: int) -> list[int]:
        last = timestamp - (timestamp - self.offset_ms) % self.slide_ms
        out = []
        start = last
        while start > timestamp - self.size_ms:
            out.append(start)
            start -= self.slide_ms
        return out

    def __repr__(self) -> str:
        return (
            f"SlidingEventTimeWindows(size_ms={self.size_ms}, slide_ms={self.slide_ms}, "
            f"offset_ms={self.offset_ms})"
        )


_AGGS: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    # name: (Arrow hash aggregation, reduce function of the state)
    "sum": ("sum", _op.add),
    "count": ("count_all", _op.add),
    "min": ("min", min),
    "max": ("max", max),
}


def _as_ms(column: pa.Array) -> pa.Array:
    """An event-time column as int64 milliseconds (timestamps are converted)."""
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(column, pa.timestamp("ms", t.tz)), _I64)
    if pa.types.is_int64(t):
        return column
    if pa.types.is_integer(t):
        return pc.cast(column, _I64)
    raise InvalidArgumentError(f"the event-time column must be integer ms or a timestamp, got {t}")


class WindowAggregate(Operator):
    """Keyed event-time window aggregation: ``agg`` (``"sum"``, ``"count"``, ``"min"``,
    ``"max"``) of ``value_field`` (unused for ``"count"``) per key and window, windows from
    ``assigner``, event time from ``time_field`` (int ms or timestamp). Emits rows
    ``(key_field, "window_start", "window_end", output_field)``. See the module docstring."""

    _runtime_fields: tuple[str, ...] = ("_backend", "_state", "_owner")

    def __init__(
        self,
        key_field: str,
        time_field: str,
        value_field: str | None,
        assigner: WindowAssigner,
        agg: str = "sum",
        allowed_lateness_ms: int = 0,
        output_field: str = "value",
    ) -> None:
        if agg not in _AGGS:
            raise InvalidArgumentError(f"agg must be one of {sorted(_AGGS)}, got {agg!r}")
        if agg != "count" and not value_field:
            raise InvalidArgumentError(f"agg {agg!r} needs a value_field")
        if not isinstance(assigner, WindowAssigner):
            raise InvalidArgumentError(f"not a window assigner: {assigner!r:.100}")
        self.key_field = key_field
        self.time_field = time_field
        self.value_field = value_field
        self.assigner = assigner
        self.agg = agg
        self.allowed_lateness_ms = _check_ms("allowed_lateness_ms", allowed_lateness_ms, 0)
        self.output_field = output_field
        self.num_late_records_dropped = 0
        self._key_type: pa.DataType | None = None
        self._value_type: pa.DataType | None = None
        self._watermark = MIN_WATERMARK

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend: KeyedStateBackend = ctx.require_keyed_state(self.name)
        self._state: ReducingState[Any] = self._backend.get_reducing_state(
            ctx.state_name("window"), _AGGS[self.agg][1]
        )
        self._owner = ctx.operator_id
        self._watermark = self._backend.timer_service.current_watermark
        self.num_late_records_dropped = 0

    @property
    def current_watermark(self) -> int:
        return self._watermark

    # --- data -------------------------------------------------------------------------------

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        n = batch.num_rows
        if not n:
            return []
        schema = batch.schema
        for name in (self.key_field, self.time_field, self.value_field):
            if name is not None and schema.get_field_index(name) < 0:
                raise InvalidArgumentError(
                    f"{self.name}: field {name!r} not in the input (columns: {schema.names})"
                )
        keys = batch.column(schema.get_field_index(self.key_field))
        ts = _as_ms(batch.column(schema.get_field_index(self.time_field)))
        values = (
            batch.column(schema.get_field_index(self.value_field))
            if self.value_field is not None and self.agg != "count"
            else None
        )
        self._note_types(keys.type, None if values is None else values.type)
        if ts.null_count:
            raise InvalidArgumentError(f"{self.name}: null event times in {self.time_field!r}")

        rows, starts = self.assigner.assign(ts)
        if rows is not None:
            keys = keys.take(rows)
            if values is not None:
                values = values.take(rows)

        size, lateness, wm = self.assigner.size_ms, self.allowed_lateness_ms, self._watermark
        if wm > MIN_WATERMARK:
            # late window: start + size - 1 + lateness <= wm  <=>  start <= wm - size + 1 - L
            keep = pc.greater(starts, _i64(wm - size + 1 - lateness))
            kept = pc.sum(keep).as_py() or 0
            if rows is None:  # one window per record: a late window is a late record
                self.num_late_records_dropped += len(starts) - kept
            else:
                # Flink: a record counts as dropped when none of its windows was taken and the
                # record itself is late (ts + lateness <= wm); records in gaps included
                late_ts = pc.less_equal(ts, _i64(wm - lateness))
                n_late = pc.sum(late_ts).as_py() or 0
                if n_late:
                    taken = rows.filter(pc.and_(keep, late_ts.take(rows)))
                    self.num_late_records_dropped += n_late - (
                        pc.count_distinct(taken).as_py() if len(taken) else 0
                    )
            if kept < len(starts):
                keys, starts = keys.filter(keep), starts.filter(keep)
                if values is not None:
                    values = values.filter(keep)
        if not len(starts):
            return []

        table = {"k": keys, "w": starts}
        if values is None:
            aggs: list[Any] = [([], "count_all")]
            column = "count_all"
        else:
            table["v"] = values
            aggs = [("v", _AGGS[self.agg][0])]
            column = f"v_{_AGGS[self.agg][0]}"
        grouped = pa.table(table).group_by(["k", "w"], use_threads=False).aggregate(aggs)
        dkeys = grouped.column("k").combine_chunks()
        dstarts = grouped.column("w").combine_chunks()
        groups = kgs.key_groups(dkeys, self._backend.max_parallelism)
        key_list, start_list, group_list = (
            dkeys.to_pylist(),
            dstarts.to_pylist(),
            groups.to_pylist(),
        )
        composite = list(zip(key_list, start_list, strict=True))
        self._state.add_many(composite, grouped.column(column), key_groups=groups)

        backend, timers, owner = self._backend, self._backend.timer_service, self._owner
        late_firing: list[int] = []
        for i, (k, w, g) in enumerate(zip(key_list, start_list, group_list, strict=True)):
            max_ts = w + size - 1
            backend.set_current_key(k, g)
            if max_ts > wm:
                timers.register_event_time_timer(max_ts, (owner, w))
            else:  # the window already fired (within the allowed lateness): fire again now
                late_firing.append(i)
            if lateness:
                timers.register_event_time_timer(max_ts + lateness, (owner, w))
        if not late_firing:
            return []
        fire_keys = [composite[i] for i in late_firing]
        values_now = self._state.get_many(
            fire_keys, key_groups=[group_list[i] for i in late_firing]
        )
        return self._rows(
            [key_list[i] for i in late_firing], [start_list[i] for i in late_firing], values_now
        )

    def _note_types(self, key_type: pa.DataType, value_type: pa.DataType | None) -> None:
        if self._key_type is None:
            self._key_type = key_type
        if self._value_type is None:
            if self.agg == "count":
                self._value_type = _I64
            elif value_type is not None:
                if self.agg == "sum":
                    self._value_type = (
                        pa.float64() if pa.types.is_floating(value_type) else pa.int64()
                    )
                else:
                    self._value_type = value_type

    def _rows(self, keys: list[Any], starts: list[int], values: list[Any]) -> list[pa.RecordBatch]:
        if not keys:
            return []
        size = self.assigner.size_ms
        value_type = _I64 if self.agg == "count" else self._value_type
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(keys, self._key_type),
                pa.array(starts, _I64),
                pa.array([s + size for s in starts], _I64),
                pa.array(values, value_type),
            ],
            names=[self.key_field, "window_start", "window_end", self.output_field],
        )
        return [batch]

    # --- time -------------------------------------------------------------------------------

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        if watermark_ms > self._watermark:
            self._watermark = watermark_ms
        fired = fire_timers(self._backend, watermark_ms, self._owner)
        if not fired:
            return []
        size, lateness = self.assigner.size_ms, self.allowed_lateness_ms
        backend, state = self._backend, self._state
        keys: list[Any] = []
        starts: list[int] = []
        values: list[Any] = []
        for timer in fired:
            start = timer.namespace[1]
            max_ts = start + size - 1
            backend.set_current_key((timer.key, start), timer.key_group)
            if timer.timestamp == max_ts:
                value = state.get()
                if value is not None:
                    keys.append(timer.key)
                    starts.append(start)
                    values.append(value)
            if timer.timestamp == max_ts + lateness:
                state.clear()
        return self._rows(keys, starts, values)

    def end_input(self) -> list[pa.RecordBatch]:
        return self.process_watermark(MAX_WATERMARK)

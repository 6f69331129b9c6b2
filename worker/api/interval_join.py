"""The keyed interval join (Flink's ``KeyedStream.intervalJoin`` / ``IntervalJoinOperator``),
vectorised.

A left row ``l`` and a right row ``r`` with equal keys join when
``l.ts + lower <= r.ts <= l.ts + upper`` (bounds inclusive; an exclusive bound is moved by
1 ms, as Flink does). Every batch of one input probes the other input's buffered rows in bulk
(:class:`~snapflow.worker.api.join_buffer.JoinBuffer`) and is buffered itself; every pair is
emitted once, when its second row arrives.

Late rows (``ts < watermark``, Flink's ``isLate``) are dropped, or sent to a side output
(``left_late``/``right_late``, Flink's ``sideOutputLeftLateData``), and counted in
:attr:`IntervalJoinOperator.num_late_records_dropped`.

State clean-up at the instants of Flink's timers: a left row is kept until the watermark
reaches ``ts + upper`` (``ts`` when ``upper <= 0``), a right row until it reaches
``ts - lower`` (``ts`` when ``lower >= 0``). Flink registers one event-time timer per row
and time stamp; here the buffers' expiry threshold moves with every watermark and the rows
below it stop matching at once and are dropped in bulk (``JoinBuffer.expire``): the same rows
leave at the same watermark, without a timer per row. The end of the input empties both
buffers (as Flink's final watermark fires every timer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.api.join_buffer import I64_MAX, I64_MIN
from snapflow.worker.api.join_output import PairEmitter
from snapflow.worker.api.keyed_join import KeyedJoinOperator
from snapflow.worker.runtime.operator import OperatorContext, OutputTag

__all__ = ["IntervalJoinOperator"]


def _check_bound(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer (ms), got {value!r}")
    if not -(1 << 62) <= value <= 1 << 62:
        raise InvalidArgumentError(f"{name} must be within +-2**62 ms, got {value}")
    return value


def _shifted(times: np.ndarray[Any, Any], delta: int) -> np.ndarray[Any, Any]:
    """``times + delta``, saturated at the int64 bounds."""
    if not len(times) or delta == 0:
        return times
    if delta > 0 and int(times.max()) > I64_MAX - delta:
        return np.where(times > I64_MAX - delta, I64_MAX, times + delta)
    if delta < 0 and int(times.min()) < I64_MIN - delta:
        return np.where(times < I64_MIN - delta, I64_MIN, times + delta)
    return times + delta


class IntervalJoinOperator(KeyedJoinOperator):
    """The interval join of input 0 (left) and input 1 (right) on a keyed vertex (module
    docstring). ``left_time``/``right_time``: the event-time columns (integer ms or Arrow
    timestamps). ``emitter``: what pairs become (default: the joined rows,
    :class:`~snapflow.worker.api.join_output.SelectPairs`)."""

    _runtime_fields: tuple[str, ...] = (*KeyedJoinOperator._runtime_fields, "_watermark")

    def __init__(
        self,
        left_key: str,
        right_key: str,
        left_time: str,
        right_time: str,
        lower_ms: int,
        upper_ms: int,
        *,
        lower_inclusive: bool = True,
        upper_inclusive: bool = True,
        emitter: PairEmitter | None = None,
        left_late: OutputTag | None = None,
        right_late: OutputTag | None = None,
    ) -> None:
        super().__init__(left_key, right_key, emitter)
        lower = _check_bound("lower_ms", lower_ms)
        upper = _check_bound("upper_ms", upper_ms)
        if lower > upper:
            raise InvalidArgumentError(
                f"an interval join needs lower <= upper, got between({lower}, {upper})"
            )
        for what, value in (("left_time", left_time), ("right_time", right_time)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"{what} must be a field name, got {value!r}")
        for what, tag in (("left_late", left_late), ("right_late", right_late)):
            if tag is not None and not isinstance(tag, OutputTag):
                raise InvalidArgumentError(f"{what} must be an OutputTag, got {tag!r:.80}")
        self.left_time = left_time
        self.right_time = right_time
        self.lower_ms = lower if lower_inclusive else lower + 1
        self.upper_ms = upper if upper_inclusive else upper - 1
        """The bounds, inclusive (an exclusive bound moved by 1 ms, as in Flink)."""
        self.late_tags = (left_late, right_late)
        self.num_late_records_dropped = 0
        """Late rows not sent to a side output (Flink's ``numLateRecordsDropped``)."""

    @property
    def name(self) -> str:
        return "IntervalJoin"

    def _time_fields(self) -> tuple[str | None, str | None]:
        return self.left_time, self.right_time

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._watermark = MIN_WATERMARK

    def retention_ms(self, input_index: int) -> int:
        """How long past its time a row of input ``input_index`` is kept (Flink's cleanup
        timers: ``ts + upper`` for the left, ``ts - lower`` for the right, never before
        ``ts``)."""
        return max(0, self.upper_ms) if input_index == 0 else max(0, -self.lower_ms)

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        own, other = self._side(input_index)
        if not batch.num_rows:
            return []
        batch = own.conform(batch)
        times = own.times_of(batch)
        wm = self._watermark
        if wm > MIN_WATERMARK:
            late = times < wm
            if late.any():
                self._late(input_index, batch.filter(pa.array(late)))
                on_time = ~late
                batch, times = batch.filter(pa.array(on_time)), times[on_time]
                if not batch.num_rows:
                    return []
        run = own.sorted_run(batch, times)
        times = run.times
        if input_index == 0:
            low, high = _shifted(times, self.lower_ms), _shifted(times, self.upper_ms)
        else:
            low, high = _shifted(times, -self.upper_ms), _shifted(times, -self.lower_ms)
        out = self._emit(input_index, run, other.probe(run, own.key_field, low, high))
        self._add(input_index, run)
        return out

    def _late(self, input_index: int, rows: pa.RecordBatch) -> None:
        tag = self.late_tags[input_index]
        if tag is None:
            self.num_late_records_dropped += rows.num_rows
        else:
            self._context().output(tag, rows)

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        if watermark_ms <= self._watermark:
            return []
        self._watermark = watermark_ms
        for index, buffer in enumerate(self._buffers):
            below = watermark_ms - self.retention_ms(index)
            buffer.expire(max(I64_MIN, min(I64_MAX, below)))
        return []

    def end_input(self) -> list[pa.RecordBatch]:
        """Every input ended: no row can match any more (Flink's final watermark fires every
        clean-up timer)."""
        for buffer in self._buffers:
            buffer.clear()
        return []

"""Window assigners: which windows a record belongs to (Flink's ``WindowAssigner``).

* A window is :class:`TimeWindow` ``[start, end)``; its *max timestamp* is ``end - 1``.
* Tumbling: ``start = ts - (ts - offset) mod size`` (floored modulo, so negative timestamps
  work). Sliding: every record belongs to the ``ceil(size / slide)`` windows
  ``start = last - j * slide`` (``last = ts - (ts - offset) mod slide``) with
  ``start > ts - size``.
* Sessions (merging assigners): a record's window is ``[ts, ts + gap)``; windows that
  intersect (``a.start <= b.end and b.start <= a.end``, as Flink's ``TimeWindow.intersects``,
  so records exactly ``gap`` apart share a session) are merged by the window operator
  (:mod:`snapflow.worker.api.session_merging`).
* Event-time assigners take ``ts`` from the record's time field; processing-time assigners
  from the task's clock when the record reaches the window operator.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.arrays import arange

__all__ = [
    "EventTimeSessionWindows",
    "ProcessingTimeSessionWindows",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "WindowAssigner",
    "as_ms",
    "check_ms",
]

_I64 = pa.int64()


class TimeWindow(NamedTuple):
    """A window ``[start, end)`` (Flink's ``TimeWindow``)."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1

    def intersects(self, other: TimeWindow) -> bool:
        return self.start <= other.end and other.start <= self.end

    def cover(self, other: TimeWindow) -> TimeWindow:
        """The smallest window containing both."""
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


def i64(value: int) -> pa.Scalar:
    return pa.scalar(value, _I64)


def check_ms(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum} (ms), got {value!r}")
    return value


def as_ms(column: pa.Array) -> pa.Array:
    """An event-time column as int64 milliseconds (timestamps are converted)."""
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(pc.cast(column, pa.timestamp("ms", t.tz)), _I64)
    if pa.types.is_int64(t):
        return column
    if pa.types.is_integer(t):
        return pc.cast(column, _I64)
    raise InvalidArgumentError(f"the event-time column must be integer ms or a timestamp, got {t}")


class WindowAssigner:
    """Assigns timestamps to windows. ``is_event_time``: timestamps come from the records
    (else from the task's processing-time clock); ``is_merging``: windows merge (sessions)."""

    is_event_time = True
    is_merging = False
    size_ms: int
    """The window length (fixed-size assigners)."""

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        """Vectorised assignment of int64 ``timestamps``: ``(rows, starts)`` where ``starts[i]``
        is a window start of record ``rows[i]`` (``rows`` is None when every record has exactly
        one window, ``starts[i]`` then being record i's)."""
        raise NotImplementedError

    def window_starts(self, timestamp: int) -> list[int]:
        """The window starts of one timestamp (the scalar reference of :meth:`assign`)."""
        raise NotImplementedError


class _Tumbling(WindowAssigner):
    def __init__(self, size_ms: int, offset_ms: int = 0) -> None:
        self.size_ms = check_ms("size_ms", size_ms, 1)
        if not isinstance(offset_ms, int) or not 0 <= offset_ms < size_ms:
            raise InvalidArgumentError(f"offset_ms must be in [0, size_ms), got {offset_ms!r}")
        self.offset_ms = offset_ms

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        shifted = pc.subtract(timestamps, i64(self.offset_ms)) if self.offset_ms else timestamps
        return None, pc.subtract(timestamps, pc.modulo(shifted, i64(self.size_ms)))

    def window_starts(self, timestamp: int) -> list[int]:
        return [timestamp - (timestamp - self.offset_ms) % self.size_ms]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


class _Sliding(WindowAssigner):
    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0) -> None:
        self.size_ms = check_ms("size_ms", size_ms, 1)
        self.slide_ms = check_ms("slide_ms", slide_ms, 1)
        if not isinstance(offset_ms, int) or not 0 <= offset_ms < slide_ms:
            raise InvalidArgumentError(f"offset_ms must be in [0, slide_ms), got {offset_ms!r}")
        self.offset_ms = offset_ms
        self.windows_per_record = math.ceil(size_ms / slide_ms)

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        n = len(timestamps)
        shifted = pc.subtract(timestamps, i64(self.offset_ms)) if self.offset_ms else timestamps
        last = pc.subtract(timestamps, pc.modulo(shifted, i64(self.slide_ms)))
        if self.windows_per_record == 1 and self.size_ms >= self.slide_ms:
            return None, last
        lowest = pc.subtract(timestamps, i64(self.size_ms))  # start must be > ts - size
        rows = arange(n)
        all_rows, all_starts = [], []
        for j in range(self.windows_per_record):
            starts = pc.subtract(last, i64(j * self.slide_ms)) if j else last
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
            f"{type(self).__name__}(size_ms={self.size_ms}, slide_ms={self.slide_ms}, "
            f"offset_ms={self.offset_ms})"
        )


class _Session(WindowAssigner):
    is_merging = True

    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = check_ms("gap_ms", gap_ms, 1)

    def assign(self, timestamps: pa.Array) -> tuple[pa.Array | None, pa.Array]:
        return None, timestamps  # window [ts, ts + gap): the start is the timestamp

    def window_starts(self, timestamp: int) -> list[int]:
        return [timestamp]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gap_ms={self.gap_ms})"


class TumblingEventTimeWindows(_Tumbling):
    """Fixed, non-overlapping event-time windows of ``size_ms`` (aligned to ``offset_ms``)."""


class SlidingEventTimeWindows(_Sliding):
    """Event-time windows of ``size_ms`` starting every ``slide_ms`` (aligned to
    ``offset_ms``)."""


class EventTimeSessionWindows(_Session):
    """Event-time sessions: a key's records less than ``gap_ms`` apart (or exactly) share a
    window (Flink's ``EventTimeSessionWindows.withGap``)."""

    @staticmethod
    def with_gap(gap_ms: int) -> EventTimeSessionWindows:
        return EventTimeSessionWindows(gap_ms)


class TumblingProcessingTimeWindows(_Tumbling):
    """Tumbling windows over the task's processing time (the clock when a record arrives)."""

    is_event_time = False


class SlidingProcessingTimeWindows(_Sliding):
    """Sliding windows over the task's processing time."""

    is_event_time = False


class ProcessingTimeSessionWindows(_Session):
    """Sessions over the task's processing time: a key's records that arrive less than
    ``gap_ms`` apart share a window."""

    is_event_time = False

    @staticmethod
    def with_gap(gap_ms: int) -> ProcessingTimeSessionWindows:
        return ProcessingTimeSessionWindows(gap_ms)

"""Watermark generators, used by sources.

:class:`BoundedOutOfOrdernessWatermarks` tracks the
highest event time seen and emits ``max_ts - max_out_of_orderness_ms - 1`` (Flink's
``BoundedOutOfOrdernessWatermarks``: a watermark ``W`` promises no more records with
``ts <= W``, so a record at most ``max_out_of_orderness_ms`` behind the maximum is never late).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MIN_WATERMARK


class WatermarkGenerator:
    """Derives watermarks from the event times a source emits (Flink's ``WatermarkGenerator``):
    call :meth:`on_timestamps` with every emitted batch's event times, read
    :meth:`current_watermark` when the task wants to emit one. Watermarks never go back."""

    def on_timestamps(self, timestamps: Any) -> None:
        raise NotImplementedError

    def current_watermark(self) -> int:
        raise NotImplementedError

    # position support: the state a source snapshots and restores with its position
    def snapshot(self) -> Any:
        raise NotImplementedError

    def restore(self, state: Any) -> None:
        raise NotImplementedError


class BoundedOutOfOrdernessWatermarks(WatermarkGenerator):
    """``watermark = max event time seen - max_out_of_orderness_ms - 1`` (``MIN_WATERMARK``
    before the first record)."""

    def __init__(self, max_out_of_orderness_ms: int = 0) -> None:
        if not isinstance(max_out_of_orderness_ms, int) or max_out_of_orderness_ms < 0:
            raise InvalidArgumentError(
                f"max_out_of_orderness_ms must be an integer >= 0, got {max_out_of_orderness_ms!r}"
            )
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.max_timestamp: int | None = None

    def on_timestamp(self, timestamp: int) -> None:
        if self.max_timestamp is None or timestamp > self.max_timestamp:
            self.max_timestamp = timestamp

    def on_timestamps(self, timestamps: Any) -> None:
        if isinstance(timestamps, pa.ChunkedArray | pa.Array):
            if not len(timestamps):
                return
            if pa.types.is_timestamp(timestamps.type):
                timestamps = pc.cast(
                    pc.cast(timestamps, pa.timestamp("ms", timestamps.type.tz)), pa.int64()
                )
            top = pc.max(timestamps).as_py()
        else:
            values = list(timestamps)
            top = max(values) if values else None
        if top is not None:
            self.on_timestamp(int(top))

    def current_watermark(self) -> int:
        if self.max_timestamp is None:
            return MIN_WATERMARK
        return max(MIN_WATERMARK, self.max_timestamp - self.max_out_of_orderness_ms - 1)

    def snapshot(self) -> int | None:
        return self.max_timestamp

    def restore(self, state: int | None) -> None:
        self.max_timestamp = state

    def __repr__(self) -> str:
        return (
            f"BoundedOutOfOrdernessWatermarks(max_out_of_orderness_ms="
            f"{self.max_out_of_orderness_ms})"
        )


class AscendingTimestampsWatermarks(BoundedOutOfOrdernessWatermarks):
    """For event times that never decrease: ``watermark = max event time - 1``."""

    def __init__(self) -> None:
        super().__init__(0)

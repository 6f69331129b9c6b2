"""The event time of a task with inputs: a pure combination of its channels' watermarks (the
part of Flink's ``StatusWatermarkValve`` that combines; idleness comes with multi-input
operators).

Each channel's watermark only rises. An input's watermark is the minimum over its channels; the
task's is the minimum over its inputs, and it is emitted only when it rises. A channel that
ended (end of partition) counts as the maximum watermark, so it never holds the others back.
"""

from __future__ import annotations

from collections.abc import Sequence

from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK


class WatermarkValve:
    """Channels numbered ``0 .. len(input_of_channel) - 1``; ``input_of_channel[c]`` is the
    logical input (from 0) that channel ``c`` belongs to."""

    def __init__(self, input_of_channel: Sequence[int]) -> None:
        self._input_of = list(input_of_channel)
        self.num_inputs = max(self._input_of, default=-1) + 1
        if sorted(set(self._input_of)) != list(range(self.num_inputs)):
            raise ValueError(f"inputs must be numbered 0..n-1 without gaps: {self._input_of}")
        self._channels = [MIN_WATERMARK] * len(self._input_of)
        self.current = MIN_WATERMARK
        """The task's watermark: the last one this valve returned."""

    def on_watermark(self, channel: int, timestamp_ms: int) -> int | None:
        """A watermark on ``channel``; the task's new watermark if it rose, else None."""
        self._channels[channel] = max(self._channels[channel], timestamp_ms)
        return self._combine()

    def on_channel_ended(self, channel: int) -> int | None:
        """``channel`` ended; the task's new watermark if it rose, else None."""
        self._channels[channel] = MAX_WATERMARK
        return self._combine()

    def input_watermark(self, input_index: int) -> int:
        return min(w for c, w in enumerate(self._channels) if self._input_of[c] == input_index)

    def _combine(self) -> int | None:
        if not self._channels:
            return None
        # The minimum over the inputs' minimums is the minimum over all channels.
        combined = min(self._channels)
        if combined <= self.current:
            return None
        self.current = combined
        return combined

    def check_invariants(self) -> None:
        assert len(self._channels) == len(self._input_of)
        if self._channels:
            assert self.current <= min(self._channels) or self.current == MIN_WATERMARK

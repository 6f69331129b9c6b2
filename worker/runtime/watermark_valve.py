"""The event time of a task with inputs: a pure combination of its channels' watermarks and
watermark statuses (Flink's ``StatusWatermarkValve`` for each input, then the combination across
the inputs of a multi-input operator, Flink's ``CombinedWatermarkStatus``).

Per input, as Flink's valve:

* A channel's watermark only rises; the input's watermark is the minimum over its *aligned*
  channels, emitted when it rises.
* A channel marked idle (``WatermarkStatusFrame(idle=True)``) is not aligned: it is left out of
  the minimum, and watermarks it sends while idle are ignored. When it is marked active again it
  is aligned at once if its watermark is not below the input's, else only once a watermark of
  its own catches up: a channel coming back behind never moves the input's watermark back.
* When the last active channel of an input goes idle, nothing can hold the input back any more:
  if that channel was the one holding it, the input's watermark moves to the highest watermark
  of its channels (Flink's flush). The input is idle while all its channels are.
* A channel that ended (end of partition) is active at the maximum watermark: it never holds the
  others back, and an input with an ended channel is never idle.

Across inputs: the task's watermark is the minimum over the watermarks of the inputs that are
not idle, and it only rises, so an input that becomes active again behind it holds it where it is
until it caught up. The task is idle while every input is idle.

Each event returns the task's new watermark if it rose, else None; ``idle`` is the task's status
after it. An event changes the status at most once: a change to active goes downstream before
that event's watermark, a change to idle after it (the flushed watermark comes first).
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
        self._channels_of = [
            [c for c, i in enumerate(self._input_of) if i == index]
            for index in range(self.num_inputs)
        ]
        n = len(self._input_of)
        self._channels = [MIN_WATERMARK] * n
        self._idle = [False] * n
        self._aligned = [True] * n
        """Takes part in its input's minimum: active, and not behind the input's watermark."""
        self._ended = [False] * n
        self._inputs = [MIN_WATERMARK] * self.num_inputs
        """Each input's watermark: the last one it emitted (Flink's valve output)."""
        self._inputs_idle = [False] * self.num_inputs
        self.current = MIN_WATERMARK
        """The task's watermark: the last one this valve returned."""
        self.idle = False
        """The task's watermark status: every input is idle."""

    # --- events ----------------------------------------------------------------------------

    def on_watermark(self, channel: int, timestamp_ms: int) -> int | None:
        """A watermark on ``channel``; the task's new watermark if it rose, else None. Never
        changes the status (a watermark on an idle channel is ignored)."""
        if self._idle[channel] or self._ended[channel] or timestamp_ms <= self._channels[channel]:
            return None
        self._channels[channel] = timestamp_ms
        index = self._input_of[channel]
        if not self._aligned[channel] and timestamp_ms >= self._inputs[index]:
            self._aligned[channel] = True  # caught up
        self._advance_input(index)
        return self._combine()

    def on_status(self, channel: int, idle: bool) -> int | None:
        """``channel`` became idle (or active again); the task's new watermark if it rose."""
        if self._ended[channel] or idle == self._idle[channel]:
            return None
        index = self._input_of[channel]
        holding = self._channels[channel] == self._inputs[index]
        self._idle[channel] = idle
        if idle:
            self._aligned[channel] = False
            channels = self._channels_of[index]
            if all(self._idle[c] for c in channels):
                if holding:
                    top = max(self._channels[c] for c in channels)
                    self._inputs[index] = max(self._inputs[index], top)
                # The flushed watermark is combined while the input still counts, then it idles
                # (Flink's valve emits it before the idle status).
                flushed = self._combine()
                self._inputs_idle[index] = True
                after = self._combine()
                return flushed if after is None else after
            if holding:
                self._advance_input(index)
        else:
            self._aligned[channel] = self._channels[channel] >= self._inputs[index]
            self._inputs_idle[index] = False
        return self._combine()

    def on_channel_ended(self, channel: int) -> int | None:
        """``channel`` ended; the task's new watermark if it rose, else None."""
        if self._ended[channel]:
            return None
        self._ended[channel] = True
        self._channels[channel] = MAX_WATERMARK
        self._idle[channel] = False
        self._aligned[channel] = True
        index = self._input_of[channel]
        self._inputs_idle[index] = False
        self._advance_input(index)
        return self._combine()

    # --- queries ---------------------------------------------------------------------------

    def input_watermark(self, input_index: int) -> int:
        return self._inputs[input_index]

    def is_input_idle(self, input_index: int) -> bool:
        return self._inputs_idle[input_index]

    def is_channel_idle(self, channel: int) -> bool:
        return self._idle[channel]

    # --- combining -------------------------------------------------------------------------

    def _advance_input(self, index: int) -> None:
        aligned = [self._channels[c] for c in self._channels_of[index] if self._aligned[c]]
        if aligned:
            self._inputs[index] = max(self._inputs[index], min(aligned))

    def _combine(self) -> int | None:
        active = [w for w, idle in zip(self._inputs, self._inputs_idle, strict=True) if not idle]
        self.idle = self.num_inputs > 0 and not active
        if not active:
            return None
        combined = min(active)
        if combined <= self.current:
            return None
        self.current = combined
        return combined

    def check_invariants(self) -> None:
        n = len(self._input_of)
        assert len(self._channels) == len(self._idle) == len(self._aligned) == n
        for c in range(n):
            if self._ended[c]:
                assert self._channels[c] == MAX_WATERMARK and not self._idle[c]
                assert self._aligned[c]
            if self._idle[c]:
                assert not self._aligned[c], "an idle channel takes part in the minimum"
        for index, channels in enumerate(self._channels_of):
            assert self._inputs_idle[index] == all(self._idle[c] for c in channels)
            for c in channels:
                if self._aligned[c]:
                    assert self._channels[c] >= self._inputs[index], "aligned behind its input"
            assert self._inputs[index] <= max(self._channels[c] for c in channels)
        assert self.idle == (self.num_inputs > 0 and all(self._inputs_idle))
        if self._channels:
            assert self.current <= max(self._channels), "the watermark ran ahead of every channel"
        active = [w for w, idle in zip(self._inputs, self._inputs_idle, strict=True) if not idle]
        if active:
            assert self.current >= min(active), "an active input's watermark was not combined"

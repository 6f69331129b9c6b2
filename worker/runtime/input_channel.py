"""The consumer side of a data channel: ``buffers_per_channel`` buffers, one credit per free
buffer, and the frames waiting for the task's input gate.

The producer side and the flow-control contract are in
``snapflow.worker.runtime.output_channel``; the gate that reads input channels is
``snapflow.worker.runtime.input_gate``. Nothing here is thread-safe (one asyncio loop per
agent).

- A data frame takes one buffer (it needs a credit; one without is a protocol violation:
  :class:`~snapflow.worker.runtime.channel_errors.CreditViolationError`); the buffer is freed,
  and granted back, when the gate hands the frame to the task. Events need no buffer.
- A priority frame (unaligned barrier, cancel marker; ``frames.is_priority``) is put ahead of
  the data queued here (``priority_frame``); frames that arrive after it are held back until
  the gate returned it and moved on (``release_fence``), so the queue keeps exactly the data
  it overtook: the input channel state of that checkpoint.
- An aligned barrier with a timeout that is still queued behind data when its timeout passed
  becomes this channel's priority frame (``convert_timed_out_barrier``), as if it had arrived
  unaligned.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from itertools import islice
from typing import Protocol

from snapflow.checkpointing import CheckpointMode
from snapflow.worker.runtime.channel_errors import (
    ChannelClosedError,
    ChannelError,
    ChannelFailedError,
    CreditViolationError,
)
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    LatencyMarkerFrame,
    WatermarkFrame,
    WatermarkStatusFrame,
    is_priority,
)

__all__ = ["DEFAULT_BUFFERS_PER_CHANNEL", "InputChannel", "InputChannelListener"]

DEFAULT_BUFFERS_PER_CHANNEL = 4
"""Data batches a consumer buffers per input channel (= credits it grants)."""

_OVERTAKABLE = (DataFrame, WatermarkFrame, WatermarkStatusFrame, LatencyMarkerFrame)
"""What an aligned barrier that timed out may overtake: data and event-time frames."""


class InputChannelListener(Protocol):
    """What an input channel tells the gate that reads it (``InputGate``), by its index there."""

    def on_available(self, index: int) -> None:
        """Channel ``index``'s queue went from empty to non-empty."""

    def on_priority(self, index: int) -> None:
        """Channel ``index`` has a new ``priority_frame``."""

    def on_failure(self, index: int) -> None:
        """Channel ``index`` failed or was released (its ``failure`` is set)."""


class InputChannel:
    """Consumer side of one channel: ``buffers_per_channel`` buffers, frames for a gate.

    Transports call ``connect`` (once, with the function that passes credits to the producer;
    returns the initial credit), ``receive`` for every frame in stream order, and ``fail`` when
    the stream breaks. The gate takes frames and grants credit back.
    """

    def __init__(
        self, buffers_per_channel: int = DEFAULT_BUFFERS_PER_CHANNEL, *, name: str = ""
    ) -> None:
        if buffers_per_channel < 1:
            raise ValueError(f"buffers_per_channel must be >= 1, got {buffers_per_channel}")
        self.buffers_per_channel = buffers_per_channel
        self.name = name
        self.queue: deque[Frame] = deque()
        """Frames for the gate, in stream order: it takes them from the head (and
        ``InputGate.persist_queued`` reads them). Frames held behind a priority frame are not
        here yet."""
        self.priority_frame: Frame | None = None
        """A priority frame that arrived (or an aligned barrier converted on timeout) and the
        gate has not returned yet; the gate takes it by setting this to None."""
        self._fenced = False
        self._held: deque[Frame] = deque()
        self._announced = buffers_per_channel
        self._buffered = 0
        self.max_buffered = 0
        """High-water mark of buffered data frames (never above buffers_per_channel)."""
        self.received_batches = 0
        self.received_records = 0
        self._credit_sink: Callable[[int], None] | None = None
        self._eop_received = False
        self._failure: ChannelError | None = None
        self._released: str | None = None
        self._release_callbacks: list[Callable[[str], None]] = []
        self._gate: InputChannelListener | None = None
        self._index = -1
        self._timeoutable = 0
        """Aligned barriers with a timeout received and not yet taken or converted."""

    # -- state -----------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Data frames received and not yet taken by the gate."""
        return self._buffered

    @property
    def announced_credits(self) -> int:
        """Credits the producer holds (granted and not yet used)."""
        return self._announced

    @property
    def priority_pending(self) -> bool:
        """A priority frame arrived and the gate has not returned it yet."""
        return self.priority_frame is not None

    @property
    def end_of_partition_received(self) -> bool:
        return self._eop_received

    @property
    def failure(self) -> ChannelError | None:
        return self._failure

    @property
    def released(self) -> bool:
        return self._released is not None

    # -- transport API ---------------------------------------------------------------------------

    def connect(self, credit_sink: Callable[[int], None]) -> int:
        """Attach the producer's credit sink; returns the credit to announce initially."""
        if self._credit_sink is not None:
            raise ChannelError(f"input channel {self.name} is already connected")
        if self._released is not None:
            raise ChannelFailedError(f"input channel {self.name} was released: {self._released}")
        self._credit_sink = credit_sink
        return self._announced

    def receive(self, frame: Frame) -> None:
        """The next frame of the stream arrived. Raises on a protocol violation."""
        if self._eop_received:
            raise ChannelError(f"input channel {self.name}: frame after end of partition")
        if self._released is not None:
            return  # consumer is gone; the producer is being told
        if type(frame) is DataFrame:
            if self._announced <= 0:
                raise CreditViolationError(
                    f"input channel {self.name}: data frame without credit "
                    f"({self._buffered} of {self.buffers_per_channel} buffers in use)"
                )
            self._announced -= 1
            self._buffered += 1
            if self._buffered > self.max_buffered:
                self.max_buffered = self._buffered
            self.received_batches += 1
            self.received_records += frame.batch.num_rows
        elif type(frame) is EndOfPartitionFrame:
            self._eop_received = True
        elif type(frame) is BarrierFrame and frame.options.is_timeoutable:
            self._timeoutable += 1
        if self._fenced:
            self._held.append(frame)
        else:
            self._enqueue(frame)

    def fail(self, error: BaseException | str) -> None:
        """The stream broke or the producer failed: the gate raises on its next call.

        Ignored once end of partition arrived (the stream is complete)."""
        if self._eop_received or self._failure is not None:
            return
        if isinstance(error, ChannelError):
            self._failure = error
        else:
            self._failure = ChannelFailedError(f"input channel {self.name} failed: {error}")
        if self._gate is not None:
            self._gate.on_failure(self._index)

    def grant(self, n: int = 1) -> None:
        """Announce ``n`` freed buffers to the producer (the gate does this on every take)."""
        if n <= 0:
            return
        if self._announced + self._buffered + n > self.buffers_per_channel:
            raise ValueError(
                f"input channel {self.name}: granting {n} would exceed "
                f"{self.buffers_per_channel} buffers ({self._buffered} buffered, "
                f"{self._announced} announced)"
            )
        self._announced += n
        if self._credit_sink is not None and self._released is None:
            self._credit_sink(n)

    def on_release(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` when the consumer releases the channel."""
        self._release_callbacks.append(callback)

    def release(self, reason: str = "consumer released the channel") -> None:
        """The consumer is gone (task finished, failed or cancelled): drop queued frames and
        tell the producer. Idempotent."""
        if self._released is not None:
            return
        self._released = reason
        self.queue.clear()
        self._held.clear()
        self.priority_frame = None
        if self._failure is None:
            self._failure = ChannelClosedError(f"input channel {self.name} released: {reason}")
            if self._gate is not None:
                self._gate.on_failure(self._index)
        for callback in self._release_callbacks:
            callback(reason)
        self._release_callbacks.clear()

    # -- for the gate ------------------------------------------------------------------------------

    def attach(self, gate: InputChannelListener, index: int) -> None:
        """Report to ``gate`` as its channel ``index`` from now on (once per channel)."""
        if self._gate is not None:
            raise ValueError(f"input channel {self.name} already belongs to a gate")
        self._gate = gate
        self._index = index

    def free_buffer(self) -> None:
        """The gate took a data frame: its buffer is free and goes back to the producer as one
        credit (``grant(1)``, without its check: the invariant's sum does not change)."""
        self._buffered -= 1
        self._announced += 1
        if self._credit_sink is not None and self._released is None:
            self._credit_sink(1)

    def timeoutable_barrier_taken(self) -> None:
        """The gate took an aligned barrier with a timeout: it no longer waits here."""
        self._timeoutable -= 1

    def _enqueue(self, frame: Frame) -> None:
        gate = self._gate
        if is_priority(frame):
            self.priority_frame = frame
            self._fenced = True
            if gate is not None:
                gate.on_priority(self._index)
        else:
            self.queue.append(frame)
            if gate is not None and len(self.queue) == 1:
                gate.on_available(self._index)

    def barrier_deadline_ms(self) -> int | None:
        """The earliest deadline of an aligned barrier with a timeout queued here."""
        if not self._timeoutable:
            return None
        deadlines = [
            f.timestamp_ms + f.options.aligned_checkpoint_timeout_ms
            for f in self.queue
            if type(f) is BarrierFrame and f.options.is_timeoutable
        ]
        return min(deadlines, default=None)

    def convert_timed_out_barrier(self, now_ms: int) -> bool:
        """An aligned barrier with a timeout, queued behind data when its timeout passed,
        becomes unaligned and the priority frame of this channel: it overtakes the frames
        ahead of it (the gate's ``persist_queued`` returns them, the checkpoint's input channel
        state), and the frames behind it are held back until the task took it, as for a
        priority frame on arrival. Flink does the same with announced barriers
        (``SingleCheckpointBarrierHandler.processBarrierAnnouncement`` ->
        ``convertToPriorityEvent``). Only data, watermarks, watermark statuses and latency
        markers are overtaken; a barrier behind another control frame, or at the head of the
        queue (it is next anyway), or while a priority frame is pending, stays where it is."""
        if not self._timeoutable or self.priority_frame is not None or self._fenced:
            return False
        queue = self.queue
        for position, frame in enumerate(queue):
            tp = type(frame)
            if isinstance(frame, BarrierFrame):
                options = frame.options
                deadline = frame.timestamp_ms + options.aligned_checkpoint_timeout_ms
                if position == 0 or not options.is_timeoutable or now_ms < deadline:
                    return False
                ahead = list(islice(queue, 0, position))
                behind = list(islice(queue, position + 1, None))
                queue.clear()
                queue.extend(ahead)
                self._held.extendleft(reversed(behind))
                self._timeoutable -= 1
                self.priority_frame = replace(
                    frame, options=replace(options, mode=CheckpointMode.UNALIGNED)
                )
                self._fenced = True
                return True
            if tp not in _OVERTAKABLE:
                return False
        return False

    def release_fence(self) -> None:
        """The priority frame was taken and the task moved on: let held frames in."""
        if self.priority_frame is not None:
            return
        self._fenced = False
        held = self._held
        while held and not self._fenced:
            self._enqueue(held.popleft())

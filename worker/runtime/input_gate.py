"""The input gate: reads every input channel of one subtask, fair, with blocking (aligned
checkpoints) and priority frames (unaligned ones).

Channels are ``snapflow.worker.runtime.input_channel``; the flow-control contract is in
``snapflow.worker.runtime.output_channel``. Nothing here is thread-safe.

What unaligned checkpoints may rely on (consumer side)
------------------------------------------------------

- ``InputGate.next`` returns a priority frame before anything else, also from a blocked
  channel. From the moment ``next`` returns a priority frame from channel ``i`` until the
  following call to ``next``, ``persist_queued(i)`` returns exactly the data frames that frame
  overtook in the input channel (frames that arrive later are held back until then): the input
  channel state of that channel. Channels whose barrier has not arrived yet hold pre-barrier
  data only up to their barrier; ``persist_queued(i, until_checkpoint=n)`` stops at the first
  queued barrier ``>= n`` (used when an aligned checkpoint times out and switches to
  unaligned).
- Aligned checkpoints with a timeout (docs/worker.md): once the barrier handler switched,
  ``persist_queued(i, until_checkpoint=n)`` yields the data ahead of a barrier queued there;
  and ``InputGate.convert_timed_out_barriers(now)`` turns an aligned barrier still queued
  behind data when its timeout passed into that channel's priority frame (as if it had
  arrived unaligned: the data ahead of it is what it overtook, frames behind it are held),
  so it does not wait for the data ahead (Flink's announced barriers).
- ``persist_queued`` never consumes and never grants credit: persisted frames are still
  delivered to the task afterwards.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from snapflow.worker.runtime.frames import BarrierFrame, DataFrame, EndOfPartitionFrame, Frame
from snapflow.worker.runtime.input_channel import InputChannel

__all__ = ["InputGate"]


class InputGate:
    """Reads the input channels of one subtask: fair, with blocking and priority frames.

    ``next`` returns ``(channel_index, frame)``: a pending priority frame first (in arrival
    order, blocked channels included), else the next frame of the next unblocked channel with
    frames, round-robin one frame per channel. An end-of-partition frame is returned once and
    closes its channel; ``next`` returns None when every channel has ended. A failed channel
    makes ``next`` raise ChannelFailedError.

    The gate spans every channel of every logical input of the task (Flink's
    ``CheckpointedInputGate`` over the union of a task's input gates), so that one barrier
    handler aligns them all: ``input_of[c]`` is the input (numbered from 0) that channel ``c``
    belongs to; by default every channel belongs to input 0.
    """

    def __init__(
        self, channels: Sequence[InputChannel], input_of: Sequence[int] | None = None
    ) -> None:
        self.channels = list(channels)
        n = len(self.channels)
        self.input_of: list[int] = list(input_of) if input_of is not None else [0] * n
        if len(self.input_of) != n:
            raise ValueError(f"input_of names {len(self.input_of)} channels, the gate has {n}")
        if sorted(set(self.input_of)) != list(range(len(set(self.input_of)))):
            raise ValueError(f"inputs must be numbered 0..k-1 without gaps, got {self.input_of}")
        self._available: deque[int] = deque()
        self._is_available = [False] * n
        self._priority: deque[int] = deque()
        self._unfence: list[int] = []
        self._blocked: set[int] = set()
        self._ended = [False] * n
        self._num_ended = 0
        self._failed: list[int] = []
        self._waiter: asyncio.Future[None] | None = None
        for i, ch in enumerate(self.channels):
            ch.attach(self, i)
            if ch.priority_frame is not None:
                self._priority.append(i)
            if ch.queue:
                self.on_available(i)
            if ch.failure is not None:
                self._failed.append(i)

    # -- reading -----------------------------------------------------------------------------------

    async def next(self) -> tuple[int, Frame] | None:
        """The next frame, waiting for one; None once every channel has ended."""
        while True:
            item = self.poll()
            if item is not None:
                return item
            if self._num_ended == len(self.channels):
                return None
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiter = fut
            try:
                await fut
            finally:
                self._waiter = None

    def poll(self) -> tuple[int, Frame] | None:
        """The next frame if one can be returned now, else None (never waits)."""
        channels = self.channels
        if self._unfence:
            for i in self._unfence:
                channels[i].release_fence()
            self._unfence.clear()
        if self._failed:
            failure = channels[self._failed[0]].failure
            assert failure is not None
            raise failure
        while self._priority:
            i = self._priority.popleft()
            ch = channels[i]
            frame = ch.priority_frame
            if frame is None:
                continue
            ch.priority_frame = None
            self._unfence.append(i)
            return i, frame
        available = self._available
        blocked = self._blocked
        for _ in range(len(available)):
            i = available.popleft()
            if i in blocked:
                available.append(i)
                continue
            ch = channels[i]
            queue = ch.queue
            if not queue:
                self._is_available[i] = False
                continue
            frame = queue.popleft()
            if queue:
                available.append(i)
            else:
                self._is_available[i] = False
            tp = type(frame)
            if tp is DataFrame:
                ch.free_buffer()
            elif tp is BarrierFrame and frame.options.is_timeoutable:  # type: ignore[union-attr]
                ch.timeoutable_barrier_taken()
            elif tp is EndOfPartitionFrame:
                self._ended[i] = True
                self._num_ended += 1
            return i, frame
        return None

    def barrier_deadline_ms(self) -> int | None:
        """The earliest timeout of an aligned barrier queued behind data on some channel."""
        blocked = self._blocked
        deadlines = [
            d
            for i, ch in enumerate(self.channels)
            if i not in blocked and (d := ch.barrier_deadline_ms()) is not None
        ]
        return min(deadlines, default=None)

    def convert_timed_out_barriers(self, now_ms: int) -> int:
        """Turn every aligned barrier whose timeout passed while it was queued behind data into
        an unaligned priority frame of its channel (``InputChannel.convert_timed_out_barrier``);
        returns how many. ``poll`` returns them next, like unaligned barriers on arrival.
        Not on a blocked channel: what it queues is behind the barrier it already delivered."""
        converted = 0
        for i, ch in enumerate(self.channels):
            if i not in self._blocked and ch.convert_timed_out_barrier(now_ms):
                self.on_priority(i)
                converted += 1
        return converted

    # -- blocking (aligned checkpoints) ------------------------------------------------------------

    def block(self, index: int) -> None:
        """Stop returning non-priority frames of channel ``index`` (they stay queued)."""
        self._check_index(index)
        self._blocked.add(index)

    def unblock(self, index: int) -> None:
        self._check_index(index)
        self._blocked.discard(index)
        if self._is_available[index]:
            self._wake()

    def unblock_all(self) -> None:
        self._blocked.clear()
        if self._available:
            self._wake()

    def is_blocked(self, index: int) -> bool:
        return index in self._blocked

    @property
    def blocked(self) -> frozenset[int]:
        return frozenset(self._blocked)

    @property
    def aligning(self) -> bool:
        """Some channel is blocked (an aligned checkpoint is aligning); cheap, per frame."""
        return bool(self._blocked)

    # -- channel state -----------------------------------------------------------------------------

    def persist_queued(self, index: int, until_checkpoint: int | None = None) -> list[DataFrame]:
        """Data frames queued on channel ``index``, in order, without consuming them.

        Right after ``next`` returned a priority frame from this channel these are exactly the
        frames it overtook. With ``until_checkpoint`` the scan stops at the first queued barrier
        whose id is ``>= until_checkpoint`` (data behind it is after the checkpoint).
        """
        self._check_index(index)
        out: list[DataFrame] = []
        for frame in self.channels[index].queue:
            tp = type(frame)
            if tp is DataFrame:
                out.append(frame)  # type: ignore[arg-type]
            elif (
                until_checkpoint is not None
                and tp is BarrierFrame
                and frame.checkpoint_id >= until_checkpoint  # type: ignore[union-attr]
            ):
                break
        return out

    def is_ended(self, index: int) -> bool:
        """End of partition of channel ``index`` was returned by ``next``."""
        return self._ended[index]

    @property
    def num_channels(self) -> int:
        return len(self.channels)

    @property
    def num_inputs(self) -> int:
        """Logical inputs of the task (at least one when the gate has channels)."""
        return len(set(self.input_of))

    def channels_of(self, input_index: int) -> list[int]:
        """The channels of logical input ``input_index``, in order."""
        return [c for c, i in enumerate(self.input_of) if i == input_index]

    @property
    def open_channels(self) -> list[int]:
        """Indexes of the channels that have not ended."""
        return [i for i, ended in enumerate(self._ended) if not ended]

    @property
    def all_ended(self) -> bool:
        return self._num_ended == len(self.channels)

    def close(self, reason: str = "consumer closed the input gate") -> None:
        """Release every channel (the task is done or failing); producers that have not ended
        see a failure, and ``next`` raises ChannelClosedError from now on."""
        for ch in self.channels:
            ch.release(reason)
        self._available.clear()
        self._is_available = [False] * len(self.channels)
        self._priority.clear()

    # -- notifications from channels (``InputChannelListener``) ------------------------------------

    def on_available(self, index: int) -> None:
        if not self._is_available[index]:
            self._is_available[index] = True
            self._available.append(index)
            if index not in self._blocked:
                self._wake()

    def on_priority(self, index: int) -> None:
        self._priority.append(index)
        self._wake()

    def on_failure(self, index: int) -> None:
        self._failed.append(index)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self.channels):
            raise IndexError(f"no input channel {index} (gate has {len(self.channels)})")

"""The producer side of a data channel: an output queue drained by credits (Flink's network
stack, slimmed, on asyncio).

One agent is one process with one asyncio loop; nothing here is thread-safe. A channel
connects one producer subtask's output to one consumer subtask's input and carries an ordered
stream of frames (``snapflow.worker.runtime.frames``). The same contract holds in-process
(``snapflow.worker.runtime.local_channel``, batches handed over as Python objects) and over
gRPC (``snapflow.worker.runtime.exchange``, Arrow IPC on the wire). The consumer side is
``snapflow.worker.runtime.input_channel`` (buffers, credits) and
``snapflow.worker.runtime.input_gate`` (what the task reads).

Flow-control contract
---------------------

- The consumer's ``InputChannel`` owns ``buffers_per_channel`` buffers; one buffer holds
  one :class:`~snapflow.worker.runtime.frames.DataFrame`. It announces every free buffer to the producer as one
  credit. Invariant (checked, a violation fails the channel)::

      data frames handed over and not yet taken by the gate + credits held by the producer
          <= buffers_per_channel

  so at most ``buffers_per_channel`` batches are ever in flight per channel.
- A buffer is freed, and its credit granted back, when the ``InputGate`` hands the data
  frame to the task (``InputGate.next``). Events occupy no buffer and need no credit.
- The producer's :class:`OutputChannel` keeps an *output queue* of frames not yet handed to the
  consumer. Frames leave it strictly in order: a data frame only while the producer holds a
  credit, an event as soon as it reaches the head. So an event never passes data, and a
  credit-starved data frame holds back the events behind it.
- ``OutputChannel.send`` enqueues, hands over what the credits allow, and then waits while
  more than ``output_queue`` data frames are queued. Backpressure therefore reaches the
  caller (the operator, and through its own ``send`` calls, ultimately the source) as soon as
  the consumer stops granting credits. The frame is enqueued even if that wait is cancelled.
- A failure of either side (a broken stream, ``OutputChannel.abort``, a consumer that
  released its channel) surfaces as ``ChannelFailedError`` from the producer's next
  ``send`` and from the consumer's next ``InputGate.next``: the task fails, as in Flink.

What unaligned checkpoints may rely on (producer side; the consumer side is in
``snapflow.worker.runtime.input_gate``)
---------------------------------------------------------------------------------------------

- Priority frames (barriers of unaligned checkpoints, cancel markers; see
  ``frames.is_priority``) overtake data on both sides of a channel:
  ``OutputChannel.send_priority`` puts the frame ahead of every frame still in the output
  queue (behind earlier priority frames only) and returns the data frames it overtook, which
  are exactly the output channel state of that checkpoint. They stay queued and are still
  delivered, after the barrier. Frames already handed over are never overtaken on the
  producer side; they are in the consumer's input channel or on the wire.
- Aligned checkpoints with a timeout (docs/worker.md): ``OutputChannel.convert_to_unaligned(n)``
  turns the still-queued aligned barrier n into an unaligned one that overtakes the queue, and
  returns the data it overtook (the frames that were ahead of it); None when the barrier was
  already handed over. The task calls it when the timeout passes for every output whose
  ``barrier_sent(n)`` is not done yet.
- Buffer debloating (``snapflow.worker.runtime.debloat``, per output channel): the producer
  measures its consumer's throughput from the credits coming back and bounds the rows the
  channel holds (queued here + handed over and not yet taken) by throughput x target: a data
  frame is handed over only within that budget (one always goes when the channel holds
  nothing), and ``send`` also waits while queued + outstanding rows exceed it. Sources poll
  at most twice the budget per channel (``max_poll_rows``); optionally (``split_frames``)
  batches are split to a quarter of the budget.
- With at most ``output_queue`` (+1 per concurrently waiting sender) queued data frames and
  ``buffers_per_channel`` buffered ones, the in-flight data an unaligned checkpoint persists
  per channel is bounded by ``output_queue + buffers_per_channel`` batches (+ the split chunks
  of one oversized batch on the remote path).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from itertools import islice
from typing import Any

from snapflow.checkpointing import CheckpointMode
from snapflow.worker.runtime.channel_errors import (
    ChannelClosedError,
    ChannelError,
    ChannelFailedError,
)
from snapflow.worker.runtime.debloat import Budget, ChannelDebloater, DebloatSettings
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    is_priority,
)

__all__ = ["DEFAULT_OUTPUT_QUEUE", "OutputChannel"]

DEFAULT_OUTPUT_QUEUE = 2
"""Data batches a producer may queue per output channel beyond its credit before ``send``
waits."""


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()


class OutputChannel:
    """Producer side of one channel: an output queue drained by credits.

    Subclasses hand frames over (``_kick``: take frames with ``_take_nowait`` and deliver
    them) and may pre-process frames (``_prepare``: split and encode). Entries in the queue are
    ``(frame, payload)`` pairs; the payload is transport data (e.g. encoded bytes) or None.
    """

    def __init__(
        self,
        *,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        name: str = "",
        debloat: DebloatSettings | None = None,
    ) -> None:
        if output_queue < 0:
            raise ValueError(f"output_queue must be >= 0, got {output_queue}")
        self.name = name
        self.output_queue = output_queue
        self.debloater = ChannelDebloater(debloat if debloat is not None else DebloatSettings())
        """Buffer debloating (``snapflow.worker.runtime.debloat``): the rows this channel
        holds are bounded by its consumer's throughput times the target."""
        self._queue: deque[tuple[Frame, Any]] = deque()
        self._queued_data = 0
        self._queued_rows = 0
        self._last_frame_rows = 1
        """Rows of the last data frame sent: :meth:`has_room`'s estimate of the next one."""
        self._barrier_waiters: dict[int, asyncio.Future[None]] = {}
        self._credits = 0
        self._closing = False
        self._failure: ChannelError | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self.sent_batches = 0
        """Data frames handed to the consumer (after splitting)."""
        self.sent_records = 0

    # -- state ---------------------------------------------------------------------------------

    @property
    def credits(self) -> int:
        """Credits held: data frames that may be handed over now."""
        return self._credits

    @property
    def queued_data(self) -> int:
        """Data frames in the output queue (not yet handed to the consumer)."""
        return self._queued_data

    @property
    def queued_rows(self) -> int:
        """Rows of the data frames in the output queue."""
        return self._queued_rows

    @property
    def budget(self) -> Budget:
        """The debloater's current bound on what this channel holds."""
        return self.debloater.budget()

    @property
    def max_frame_rows(self) -> int | None:
        """The largest data frame this channel hands over now (None: no bound)."""
        return self.debloater.budget().max_frame_rows

    @property
    def max_poll_rows(self) -> int | None:
        """The most a source polls for this channel now (None: no bound)."""
        return self.debloater.budget().max_poll_rows

    @property
    def queued(self) -> list[Frame]:
        """Every frame in the output queue, head first (a copy)."""
        return [f for f, _ in self._queue]

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def failure(self) -> ChannelError | None:
        return self._failure

    # -- producer API ----------------------------------------------------------------------------

    async def send(self, frame: Frame) -> None:
        """Append ``frame`` to the stream; waits (backpressure) while the output queue holds
        more than ``output_queue`` data frames. Raises ChannelFailedError / ChannelClosedError."""
        self._check_usable()
        if type(frame) is EndOfPartitionFrame:
            raise ValueError("end of partition is sent by close()")
        queue = self._queue
        for part in self._split(frame):
            for entry in self._prepare(part):
                queue.append(entry)
                f = entry[0]
                if type(f) is DataFrame:
                    self._queued_data += 1
                    self._queued_rows += f.batch.num_rows
                    self._last_frame_rows = f.batch.num_rows
        self._kick()
        if not self._may_send_more():
            await self._wait_until(self._may_send_more)

    def send_event(self, frame: Frame) -> None:
        """Append an event (no data) to the stream without waiting: events need no credit,
        so backpressure is the data's business (the next ``send`` of data waits)."""
        self._check_usable()
        if type(frame) is DataFrame or type(frame) is EndOfPartitionFrame:
            raise ValueError(f"send_event takes events other than end of partition, not {frame!r}")
        self._queue.extend(self._prepare(frame))
        self._kick()

    def has_room(self) -> bool:
        """Whether a data frame like the last one would be handed over at once (nothing queued
        at the producer, credit, and the debloated budget leaves room for it), or the channel
        failed (the next ``send`` raises). Without debloating: what ``send`` waits for."""
        if self._failure is not None:
            return True
        if self.debloater.budget().max_rows is None:
            return self._may_send_more()
        return (
            not self._queued_data
            and self._credits > 0
            and self.debloater.may_hand_over(self._last_frame_rows)
        )

    async def wait_for_room(self) -> None:
        """Until :meth:`has_room` (returns at once if the channel fails)."""
        with contextlib.suppress(ChannelError):
            await self._wait_until(self.has_room)

    def _may_send_more(self) -> bool:
        """``send`` returns once at most ``output_queue`` data frames are queued and, with
        debloating, the rows queued and outstanding are within the budget (or nothing is
        queued: one input's output may exceed it, see the task's overdraft)."""
        if self._queued_data > self.output_queue:
            return False
        limit = self.debloater.budget().max_rows
        return (
            limit is None
            or not self._queued_data
            or self._queued_rows + self.debloater.outstanding_rows <= limit
        )

    def _split(self, frame: Frame) -> list[Frame]:
        """A data frame above the debloated frame size, as zero-copy slices (one credit each)."""
        if type(frame) is not DataFrame:
            return [frame]
        cap = self.debloater.budget().max_frame_rows
        batch = frame.batch
        n = batch.num_rows
        if cap is None or n <= cap:
            return [frame]
        parts = -(-n // cap)
        size = -(-n // parts)  # equal parts, none tiny
        return [DataFrame(batch.slice(i, size)) for i in range(0, n, size)]

    def barrier_sent(self, checkpoint_id: int) -> asyncio.Future[None]:
        """Done once no barrier of ``checkpoint_id`` is in the output queue (handed over,
        converted to unaligned, or never queued), or the channel failed."""
        loop = asyncio.get_running_loop()
        fut = self._barrier_waiters.get(checkpoint_id)
        if fut is not None:
            return fut
        fut = loop.create_future()
        queued = any(
            type(f) is BarrierFrame and f.checkpoint_id == checkpoint_id for f, _ in self._queue
        )
        if queued and self._failure is None:
            self._barrier_waiters[checkpoint_id] = fut
        else:
            fut.set_result(None)
        return fut

    def _barrier_left(self, checkpoint_id: int) -> None:
        fut = self._barrier_waiters.pop(checkpoint_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def send_priority(self, frame: Frame) -> list[DataFrame]:
        """Put a priority frame ahead of all queued frames (behind earlier priority frames).

        Returns the data frames it overtook, in order: they stay queued and are delivered
        after it; the task persists them as output channel state. Never waits.
        """
        self._check_usable()
        if not is_priority(frame):
            raise ValueError(
                f"only unaligned barriers and cancel markers may overtake data, not {frame!r}"
            )
        queue = self._queue
        index = 0
        for f, _ in queue:
            if not is_priority(f):
                break
            index += 1
        overtaken = [f for f, _ in islice(queue, index, None) if type(f) is DataFrame]
        (entry,) = self._prepare(frame)
        queue.insert(index, entry)
        self._kick()
        return overtaken

    def convert_to_unaligned(self, checkpoint_id: int) -> list[DataFrame] | None:
        """Aligned checkpoint timed out on the output side: turn the queued aligned barrier of
        ``checkpoint_id`` into an unaligned one and move it ahead like ``send_priority``.

        Returns the data frames that were ahead of the barrier and are now behind it (the
        output channel state), or None when that barrier is no longer queued (already handed
        over: the consumer side handles the switch).
        """
        self._check_failed()
        queue = self._queue
        position = next(
            (
                k
                for k, (f, _) in enumerate(queue)
                if type(f) is BarrierFrame and f.checkpoint_id == checkpoint_id
            ),
            None,
        )
        if position is None:
            return None
        barrier = queue[position][0]
        assert isinstance(barrier, BarrierFrame)
        del queue[position]
        self._barrier_left(checkpoint_id)
        index = 0
        for f, _ in queue:
            if not is_priority(f):
                break
            index += 1
        overtaken = [f for f, _ in islice(queue, index, position) if type(f) is DataFrame]
        options = replace(barrier.options, mode=CheckpointMode.UNALIGNED)
        (entry,) = self._prepare(replace(barrier, options=options))
        queue.insert(index, entry)
        self._kick()
        return overtaken

    async def close(self) -> None:
        """Send end of partition and wait until every queued frame was handed over.

        Waits for credits like ``send`` (a backpressured consumer delays the close). Idempotent.
        """
        if not self._closing:
            self._check_usable()
            self._closing = True
            self._queue.extend(self._prepare(EndOfPartitionFrame()))
            self._kick()
        await self._wait_until(lambda: not self._queue)
        await self._finish()

    def abort(self, cause: BaseException | str = "producer aborted") -> None:
        """Fail the channel without end of partition (the producing task failed or was
        cancelled); the consumer sees a channel failure. Idempotent."""
        if self._failure is None:
            msg = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
            self._fail(ChannelFailedError(f"channel {self.name} aborted by the producer: {msg}"))

    # -- for subclasses and transports -------------------------------------------------------------

    def add_credits(self, n: int) -> None:
        """The consumer granted ``n`` more buffers."""
        if n < 0:
            raise ValueError(f"negative credit {n}")
        self._credits += n
        self.debloater.on_credit(n, time.monotonic_ns())
        if self._waiters:
            _wake(self._waiters)  # a new budget or credit: a waiting send or source may go on
        if self._queue:
            self._kick()

    def _prepare(self, frame: Frame) -> list[tuple[Frame, Any]]:
        return [(frame, None)]

    def _kick(self) -> None:
        """Frames may be deliverable: hand them over now or wake the transport's writer."""
        raise NotImplementedError

    async def _finish(self) -> None:
        """After close() drained the queue: wait for the transport to finish."""

    def _take_nowait(self) -> tuple[Frame, Any] | None:
        """Pop the head of the queue if it may be handed over now (spends one credit for data)."""
        queue = self._queue
        if not queue or self._failure is not None:
            return None
        entry = queue[0]
        frame = entry[0]
        tp = type(frame)
        if tp is DataFrame:
            rows = frame.batch.num_rows  # type: ignore[union-attr]
            if self._credits <= 0 or not self.debloater.may_hand_over(rows):
                return None
            self._credits -= 1
            self._queued_data -= 1
            self._queued_rows -= rows
            self.sent_batches += 1
            self.sent_records += rows
            self.debloater.on_handed_over(rows, time.monotonic_ns())
        elif tp is BarrierFrame and self._barrier_waiters:
            self._barrier_left(frame.checkpoint_id)  # type: ignore[union-attr]
        queue.popleft()
        if self._waiters:
            _wake(self._waiters)
        return entry

    def _fail(self, error: ChannelError) -> None:
        if self._failure is None:
            self._failure = error
        _wake(self._waiters)
        for checkpoint_id in list(self._barrier_waiters):
            self._barrier_left(checkpoint_id)

    def _check_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _check_usable(self) -> None:
        self._check_failed()
        if self._closing:
            raise ChannelClosedError(f"channel {self.name} is closed (end of partition sent)")

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._failure is not None:
                raise self._failure
            if predicate():
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    fut.cancel()

"""Data channels with credit-based flow control (Flink's network stack, slimmed, on asyncio).

One agent is one process with one asyncio loop; nothing here is thread-safe. A channel
connects one producer subtask's output to one consumer subtask's input and carries an ordered
stream of frames (``snapflow.worker.runtime.frames``). The same contract holds in-process
(:class:`LocalChannel`, batches handed over as Python objects) and over gRPC
(``snapflow.worker.runtime.exchange``, Arrow IPC on the wire).

Flow-control contract
---------------------

- The consumer's :class:`InputChannel` owns ``buffers_per_channel`` buffers; one buffer holds
  one :class:`~snapflow.worker.runtime.frames.DataFrame`. It announces every free buffer to the producer as one
  credit. Invariant (checked, a violation fails the channel)::

      data frames handed over and not yet taken by the gate + credits held by the producer
          <= buffers_per_channel

  so at most ``buffers_per_channel`` batches are ever in flight per channel.
- A buffer is freed, and its credit granted back, when the :class:`InputGate` hands the data
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
  released its channel) surfaces as :class:`ChannelFailedError` from the producer's next
  ``send`` and from the consumer's next ``InputGate.next``: the task fails, as in Flink.

What unaligned checkpoints may rely on
--------------------------------------

- Priority frames (barriers of unaligned checkpoints, cancel markers; see
  ``frames.is_priority``) overtake data on both sides of a channel:
  ``OutputChannel.send_priority`` puts the frame ahead of every frame still in the output
  queue (behind earlier priority frames only) and returns the data frames it overtook, which
  are exactly the output channel state of that checkpoint. They stay queued and are still
  delivered, after the barrier. Frames already handed over are never overtaken on the
  producer side; they are in the consumer's input channel or on the wire.
- In an :class:`InputChannel` a priority frame is put ahead of the data queued there, and
  ``InputGate.next`` returns it before anything else, also from a blocked channel. From the
  moment ``next`` returns a priority frame from channel ``i`` until the following call to
  ``next``, ``persist_queued(i)`` returns exactly the data frames that frame overtook in the
  input channel (frames that arrive later are held back until then): the input channel state
  of that channel. Channels whose barrier has not arrived yet hold pre-barrier data only up to
  their barrier; ``persist_queued(i, until_checkpoint=n)`` stops at the first queued barrier
  ``>= n`` (used when an aligned checkpoint times out and switches to unaligned).
- Aligned checkpoints with a timeout (docs/worker.md): ``OutputChannel.convert_to_unaligned(n)``
  turns the still-queued aligned barrier n into an unaligned one that overtakes the queue, and
  returns the data it overtook (the frames that were ahead of it); None when the barrier was
  already handed over. The task calls it when the timeout passes for every output whose
  ``barrier_sent(n)`` is not done yet. On the input side, once the barrier handler switched,
  ``persist_queued(i, until_checkpoint=n)`` yields the data ahead of a barrier queued there;
  and ``InputGate.convert_timed_out_barriers(now)`` turns an aligned barrier still queued
  behind data when its timeout passed into that channel's priority frame (as if it had
  arrived unaligned: the data ahead of it is what it overtook, frames behind it are held),
  so it does not wait for the data ahead (Flink's announced barriers).
- ``persist_queued`` never consumes and never grants credit: persisted frames are still
  delivered to the task afterwards.
- Buffer debloating (``snapflow.worker.runtime.debloat``, per output channel): the producer
  measures its consumer's throughput from the credits coming back and bounds the rows the
  channel holds (queued here + handed over and not yet taken) by throughput x target: a data
  frame is handed over only within that budget (one always goes when the channel holds
  nothing), and ``send`` also waits while queued + outstanding rows exceed it. Optionally
  (``split_frames``) batches are split to a quarter of the budget.
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
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

import grpc

from snapflow.checkpointing import CheckpointMode
from snapflow.errors import SnapflowError
from snapflow.worker.runtime.debloat import Budget, ChannelDebloater, DebloatSettings
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    LatencyMarkerFrame,
    WatermarkFrame,
    is_priority,
)

__all__ = [
    "DEFAULT_BUFFERS_PER_CHANNEL",
    "DEFAULT_OUTPUT_QUEUE",
    "ChannelClosedError",
    "ChannelError",
    "ChannelFailedError",
    "CreditViolationError",
    "InputChannel",
    "InputGate",
    "LocalChannel",
    "LocalOutputChannel",
    "OutputChannel",
]

DEFAULT_BUFFERS_PER_CHANNEL = 4
"""Data batches a consumer buffers per input channel (= credits it grants)."""

DEFAULT_OUTPUT_QUEUE = 2
"""Data batches a producer may queue per output channel beyond its credit before ``send``
waits."""


class ChannelError(SnapflowError):
    """Base of data-channel errors."""

    status = grpc.StatusCode.UNAVAILABLE


class ChannelFailedError(ChannelError):
    """The other side of the channel failed or the stream broke; the task must fail."""


class ChannelClosedError(ChannelError):
    """The channel was closed (end of partition sent) and accepts no more frames."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class CreditViolationError(ChannelError):
    """The producer handed over a data frame without holding a credit (a protocol bug)."""

    status = grpc.StatusCode.FAILED_PRECONDITION


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()


# ---------------------------------------------------------------------------------------------
# Producer side
# ---------------------------------------------------------------------------------------------


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


class LocalOutputChannel(OutputChannel):
    """Producer side of an in-process channel: frames go straight into the InputChannel."""

    def __init__(
        self,
        target: InputChannel,
        *,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        name: str = "",
        debloat: DebloatSettings | None = None,
    ) -> None:
        super().__init__(output_queue=output_queue, name=name or target.name, debloat=debloat)
        self.target = target
        target.on_release(self._on_consumer_released)
        self._credits = target.connect(self.add_credits)

    def _kick(self) -> None:
        target = self.target
        while (entry := self._take_nowait()) is not None:
            target.receive(entry[0])

    def abort(self, cause: BaseException | str = "producer aborted") -> None:
        super().abort(cause)
        if self._failure is not None:
            self.target.fail(self._failure)

    def _on_consumer_released(self, reason: str) -> None:
        self._fail(ChannelFailedError(f"channel {self.name}: consumer released it ({reason})"))


# ---------------------------------------------------------------------------------------------
# Consumer side
# ---------------------------------------------------------------------------------------------


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
        self._queue: deque[Frame] = deque()
        self._priority: Frame | None = None
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
        self._gate: InputGate | None = None
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
        return self._priority is not None

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
            self._gate._on_failure(self._index)

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
        self._queue.clear()
        self._held.clear()
        self._priority = None
        if self._failure is None:
            self._failure = ChannelClosedError(f"input channel {self.name} released: {reason}")
            if self._gate is not None:
                self._gate._on_failure(self._index)
        for callback in self._release_callbacks:
            callback(reason)
        self._release_callbacks.clear()

    # -- gate internals ----------------------------------------------------------------------------

    def _enqueue(self, frame: Frame) -> None:
        gate = self._gate
        if is_priority(frame):
            self._priority = frame
            self._fenced = True
            if gate is not None:
                gate._on_priority(self._index)
        else:
            self._queue.append(frame)
            if gate is not None and len(self._queue) == 1:
                gate._on_available(self._index)

    def _barrier_deadline_ms(self) -> int | None:
        """The earliest deadline of an aligned barrier with a timeout queued here."""
        if not self._timeoutable:
            return None
        deadlines = [
            f.timestamp_ms + f.options.aligned_checkpoint_timeout_ms
            for f in self._queue
            if type(f) is BarrierFrame and f.options.is_timeoutable
        ]
        return min(deadlines, default=None)

    def _convert_timed_out_barrier(self, now_ms: int) -> bool:
        """An aligned barrier with a timeout, queued behind data when its timeout passed,
        becomes unaligned and the priority frame of this channel: it overtakes the frames
        ahead of it (the gate's ``persist_queued`` returns them, the checkpoint's input channel
        state), and the frames behind it are held back until the task took it, as for a
        priority frame on arrival. Flink does the same with announced barriers
        (``SingleCheckpointBarrierHandler.processBarrierAnnouncement`` ->
        ``convertToPriorityEvent``). Only data, watermarks and latency markers are overtaken;
        a barrier behind another control frame, or at the head of the queue (it is next
        anyway), or while a priority frame is pending, stays where it is."""
        if self._priority is not None or self._fenced:
            return False
        queue = self._queue
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
                self._priority = replace(
                    frame, options=replace(options, mode=CheckpointMode.UNALIGNED)
                )
                self._fenced = True
                return True
            if tp is not DataFrame and tp is not WatermarkFrame and tp is not LatencyMarkerFrame:
                return False
        return False

    def _release_fence(self) -> None:
        """The priority frame was taken and the task moved on: let held frames in."""
        if self._priority is not None:
            return
        self._fenced = False
        held = self._held
        while held and not self._fenced:
            self._enqueue(held.popleft())


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
            if ch._gate is not None:
                raise ValueError(f"input channel {ch.name} already belongs to a gate")
            ch._gate = self
            ch._index = i
            if ch._priority is not None:
                self._priority.append(i)
            if ch._queue:
                self._on_available(i)
            if ch._failure is not None:
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
                channels[i]._release_fence()
            self._unfence.clear()
        if self._failed:
            ch = channels[self._failed[0]]
            assert ch._failure is not None
            raise ch._failure
        while self._priority:
            i = self._priority.popleft()
            ch = channels[i]
            frame = ch._priority
            if frame is None:
                continue
            ch._priority = None
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
            if not ch._queue:
                self._is_available[i] = False
                continue
            frame = ch._queue.popleft()
            if ch._queue:
                available.append(i)
            else:
                self._is_available[i] = False
            tp = type(frame)
            if tp is DataFrame:
                ch._buffered -= 1
                ch.grant(1)
            elif tp is BarrierFrame and frame.options.is_timeoutable:  # type: ignore[union-attr]
                ch._timeoutable -= 1
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
            if i not in blocked and (d := ch._barrier_deadline_ms()) is not None
        ]
        return min(deadlines, default=None)

    def convert_timed_out_barriers(self, now_ms: int) -> int:
        """Turn every aligned barrier whose timeout passed while it was queued behind data into
        an unaligned priority frame of its channel (``InputChannel._convert_timed_out_barrier``);
        returns how many. ``poll`` returns them next, like unaligned barriers on arrival.
        Not on a blocked channel: what it queues is behind the barrier it already delivered."""
        converted = 0
        for i, ch in enumerate(self.channels):
            if ch._timeoutable and i not in self._blocked and ch._convert_timed_out_barrier(now_ms):
                self._on_priority(i)
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

    # -- channel state -----------------------------------------------------------------------------

    def persist_queued(self, index: int, until_checkpoint: int | None = None) -> list[DataFrame]:
        """Data frames queued on channel ``index``, in order, without consuming them.

        Right after ``next`` returned a priority frame from this channel these are exactly the
        frames it overtook. With ``until_checkpoint`` the scan stops at the first queued barrier
        whose id is ``>= until_checkpoint`` (data behind it is after the checkpoint).
        """
        self._check_index(index)
        out: list[DataFrame] = []
        for frame in self.channels[index]._queue:
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

    # -- notifications from channels ---------------------------------------------------------------

    def _on_available(self, index: int) -> None:
        if not self._is_available[index]:
            self._is_available[index] = True
            self._available.append(index)
            if index not in self._blocked:
                self._wake()

    def _on_priority(self, index: int) -> None:
        self._priority.append(index)
        self._wake()

    def _on_failure(self, index: int) -> None:
        self._failed.append(index)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self.channels):
            raise IndexError(f"no input channel {index} (gate has {len(self.channels)})")


class LocalChannel:
    """An in-process channel: ``output`` (producer side) feeds ``input`` (consumer side).

    No serialization: the consumer receives the very ``pyarrow.RecordBatch`` objects the
    producer sent. Credits are enforced exactly as over gRPC.
    """

    def __init__(
        self,
        buffers_per_channel: int = DEFAULT_BUFFERS_PER_CHANNEL,
        *,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        name: str = "local",
        debloat: DebloatSettings | None = None,
    ) -> None:
        self.input = InputChannel(buffers_per_channel, name=name)
        self.output = LocalOutputChannel(
            self.input, output_queue=output_queue, name=name, debloat=debloat
        )

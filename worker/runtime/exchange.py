"""Data channels over gRPC: ``DataExchangeService.Exchange`` (one bidirectional stream per
channel), its protocol and the consumer side that serves it; the producer side is
``remote_output_channel.py``.

Protocol (``protos/snapflow/v1/worker.proto``)
----------------------------------------------

1. The producer opens ``Exchange`` and sends ``open`` = the :class:`ChannelId`.
2. The consumer agent checks it against its :class:`ChannelRegistry`: an unknown job,
   channel or deployment attempt, a stale attempt, or a channel that already has a stream is
   refused with FAILED_PRECONDITION (the producer raises :class:`ChannelRefusedError`). A
   first message that is not ``open`` is INVALID_ARGUMENT.
3. Otherwise its first ``CreditGrant`` announces the initial credit (the input channel's free
   buffers, i.e. ``buffers_per_channel`` on a fresh channel). Every later grant adds the
   buffers freed since the previous one (grants are coalesced while a write is pending).
4. The producer sends ``frame`` messages in stream order under the credit rules of
   ``snapflow.worker.runtime.output_channel``: a data batch spends one credit, events are free.
   Batches whose Arrow IPC encoding would exceed ``max_message_bytes`` (minus an envelope
   allowance) are split by rows before encoding; every chunk is a batch of its own and spends
   one credit.
5. After ``end_of_partition`` the producer half-closes; the consumer finishes the call with OK.

Failures: a stream that ends without end of partition, breaks, is cancelled, or carries a
protocol violation (data without credit, undecodable frame) fails the consumer's input channel
(its task fails on the next ``InputGate.next``). The producer's next ``send`` (or a waiting
one) raises :class:`~snapflow.worker.runtime.channel_errors.ChannelFailedError` when the call
fails, including when the consumer's server stops or its task releases the channel (ABORTED).

The same flow-control contract and the same guarantees for unaligned checkpoints hold as for
in-process channels (see ``snapflow.worker.runtime.output_channel`` and ``input_gate``):
``remote_output_channel.RemoteOutputChannel.send_priority`` overtakes frames still in its output queue, which are not
yet written to the stream; frames already written are in the consumer's input channel or in
transit, and the consumer-side input channel lets priority frames overtake what it holds.

The streams carry no deadline (they live as long as the job); a dead peer is detected by gRPC
keepalive or the transport error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from snapflow.errors import FailedPreconditionError, InvalidArgumentError
from snapflow.request_parsing import MalformedRequest
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.channel_errors import ChannelError, ChannelFailedError
from snapflow.worker.runtime.frames import frame_from_proto
from snapflow.worker.runtime.input_channel import InputChannel

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_OPEN_TIMEOUT_S",
    "ENVELOPE_BYTES",
    "ChannelRefusedError",
    "ChannelRegistry",
    "DataExchangeServicer",
    "channel_label",
    "exchange_grpc_options",
]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""Largest gRPC message of a data stream (gRPC's default receive limit)."""

ENVELOPE_BYTES = 1024
"""Allowance for the protobuf envelope around a batch's IPC bytes."""

DEFAULT_OPEN_TIMEOUT_S = 10.0
"""How long a stream may take to open: the consumer waits this long for ``open``, the producer
for the initial credit."""

# Any: the stubs type a stream read as `object | Response`, so comparing with EOF cannot narrow.
_EOF: Any = grpc.aio.EOF


def exchange_grpc_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> list[tuple[str, Any]]:
    """Channel/server options that let data messages of ``max_message_bytes`` through."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def channel_label(cid: wpb.ChannelId) -> str:
    return (
        f"{cid.job_id}/{cid.producer_vertex_id}[{cid.producer_subtask}]->"
        f"{cid.consumer_vertex_id}[{cid.consumer_subtask}]@{cid.attempt}"
    )


class ChannelRefusedError(FailedPreconditionError):
    """The consumer agent does not expect this channel (unknown or stale attempt)."""


_Key = tuple[str, str, int, str, int]


def _key(cid: wpb.ChannelId) -> _Key:
    return (
        cid.job_id,
        cid.producer_vertex_id,
        cid.producer_subtask,
        cid.consumer_vertex_id,
        cid.consumer_subtask,
    )


class _Registered:
    __slots__ = ("attempt", "channel", "connected")

    def __init__(self, attempt: int, channel: InputChannel) -> None:
        self.attempt = attempt
        self.channel = channel
        self.connected = False


class ChannelRegistry:
    """The input channels an agent expects streams for, by ChannelId (one attempt each).

    A task registers its input channels when it is deployed, before it reports running, so
    that producers of the same attempt find them; a newer attempt replaces an older one.
    """

    def __init__(self) -> None:
        self._entries: dict[_Key, _Registered] = {}
        self._jobs: dict[str, int] = {}

    def register(self, cid: wpb.ChannelId, channel: InputChannel) -> None:
        key = _key(cid)
        old = self._entries.get(key)
        if old is not None:
            if old.attempt >= cid.attempt:
                raise ChannelRefusedError(
                    f"channel {channel_label(cid)} is already registered for attempt {old.attempt}"
                )
            old.channel.release(f"replaced by attempt {cid.attempt}")
        else:
            self._jobs[cid.job_id] = self._jobs.get(cid.job_id, 0) + 1
        self._entries[key] = _Registered(cid.attempt, channel)

    def unregister(self, cid: wpb.ChannelId) -> None:
        """Forget a channel (any attempt). A stream already open stays open."""
        key = _key(cid)
        if self._entries.pop(key, None) is not None:
            self._jobs[cid.job_id] -= 1
            if not self._jobs[cid.job_id]:
                del self._jobs[cid.job_id]

    def unregister_job(self, job_id: str) -> None:
        for key in [k for k in self._entries if k[0] == job_id]:
            del self._entries[key]
        self._jobs.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._entries)

    def connect(self, cid: wpb.ChannelId) -> InputChannel:
        """The input channel for a new stream; raises ChannelRefusedError with the reason."""
        label = channel_label(cid)
        if cid.job_id not in self._jobs:
            raise ChannelRefusedError(
                f"unknown job {cid.job_id!r}: this agent hosts no consumer of it (channel {label})"
            )
        entry = self._entries.get(_key(cid))
        if entry is None:
            raise ChannelRefusedError(
                f"unknown channel {label}: consumer {cid.consumer_vertex_id}"
                f"[{cid.consumer_subtask}] does not expect producer {cid.producer_vertex_id}"
                f"[{cid.producer_subtask}] on this agent"
            )
        if cid.attempt < entry.attempt:
            raise ChannelRefusedError(
                f"stale attempt {cid.attempt} for channel {label}: the consumer runs "
                f"attempt {entry.attempt}"
            )
        if cid.attempt > entry.attempt:
            raise ChannelRefusedError(
                f"unknown attempt {cid.attempt} for channel {label}: the consumer runs "
                f"attempt {entry.attempt}"
            )
        if entry.connected:
            raise ChannelRefusedError(f"channel {label} already has a stream")
        if entry.channel.released:
            raise ChannelRefusedError(f"channel {label}: the consumer released it")
        entry.connected = True
        return entry.channel


class DataExchangeServicer(wgrpc.DataExchangeServiceServicer):
    """Serves ``Exchange`` streams into registered input channels (the consumer's agent).

    Register on the agent's ``grpc.aio`` server with ``snapflow.request_parsing.add_servicer``
    (undecodable messages are INVALID_ARGUMENT); give that server
    ``exchange_grpc_options(max_message_bytes)`` when batches may exceed 4 MiB.
    """

    def __init__(
        self,
        registry: ChannelRegistry | None = None,
        *,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
    ) -> None:
        self.registry = registry if registry is not None else ChannelRegistry()
        self.open_timeout_s = open_timeout_s

    async def Exchange(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        try:
            async with asyncio.timeout(self.open_timeout_s):
                first = await context.read()
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no open message in time")
        if isinstance(first, MalformedRequest):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, first.describe())
        if first is _EOF or first.WhichOneof("message") != "open":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "the first message of a stream must be open"
            )
        cid = first.open
        try:
            channel = self.registry.connect(cid)
        except ChannelRefusedError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        await _ConsumerStream(channel, cid, context).run()


class _ConsumerStream:
    """One accepted stream: frames into the input channel, credits back.

    A reader task moves frames into the channel and a writer task sends credit; the handler
    waits for the outcome (end of stream, protocol error, release by the consumer) and then
    finishes the call. gRPC operations in flight are never cancelled from here: cancelling a
    pending ``read``/``write`` of a ``grpc.aio`` call leaves the operation queued in the core,
    and the status sent afterwards fails (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS) so the peer
    would never learn the outcome.
    """

    _STOP_TIMEOUT_S = 1.0

    def __init__(
        self, channel: InputChannel, cid: wpb.ChannelId, context: grpc.aio.ServicerContext
    ) -> None:
        self.channel = channel
        self.label = channel_label(cid)
        self.context = context
        self.pending_credits = 0
        self.credit_event = asyncio.Event()
        self.stopping = False
        self.outcome: asyncio.Future[tuple[grpc.StatusCode, str] | None] = (
            asyncio.get_running_loop().create_future()
        )

    def _finish(self, outcome: tuple[grpc.StatusCode, str] | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)

    def _on_credit(self, n: int) -> None:
        self.pending_credits += n
        self.credit_event.set()

    def _on_release(self, reason: str) -> None:
        self._finish(
            (grpc.StatusCode.ABORTED, f"channel {self.label}: consumer released it ({reason})")
        )

    async def _write_credits(self) -> None:
        try:
            while True:
                await self.credit_event.wait()
                self.credit_event.clear()
                if self.stopping:
                    return
                n, self.pending_credits = self.pending_credits, 0
                if n:
                    await self.context.write(wpb.CreditGrant(credits=n))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.channel.fail(ChannelFailedError(f"channel {self.label}: credit write: {e!r}"))
            self._finish((grpc.StatusCode.UNAVAILABLE, f"channel {self.label}: {e!r}"))

    async def _read_frames(self) -> None:
        channel, context = self.channel, self.context
        receive = channel.receive
        try:
            while not self.outcome.done():
                msg = await context.read()
                if msg is _EOF:
                    if not channel.end_of_partition_received:
                        channel.fail(
                            ChannelFailedError(
                                f"channel {self.label}: the producer ended the stream "
                                "without end of partition"
                            )
                        )
                    self._finish(None)
                    return
                if self.outcome.done():
                    return
                if isinstance(msg, MalformedRequest):
                    raise InvalidArgumentError(msg.describe())
                if msg.WhichOneof("message") != "frame":
                    raise InvalidArgumentError("a second open message on the stream")
                receive(frame_from_proto(msg.frame))
        except asyncio.CancelledError:
            raise
        except (InvalidArgumentError, ChannelError) as e:
            channel.fail(ChannelFailedError(f"channel {self.label}: {e}"))
            code = (
                grpc.StatusCode.INVALID_ARGUMENT
                if isinstance(e, InvalidArgumentError)
                else e.status
            )
            self._finish((code, str(e)))
        except Exception as e:
            channel.fail(ChannelFailedError(f"channel {self.label}: stream broke: {e!r}"))
            self._finish((grpc.StatusCode.UNAVAILABLE, f"channel {self.label}: {e!r}"))

    async def _stop_writer(self, writer: asyncio.Task[None]) -> None:
        self.stopping = True
        self.credit_event.set()
        done, _ = await asyncio.wait({writer}, timeout=self._STOP_TIMEOUT_S)
        if not done:
            writer.cancel()

    async def run(self) -> None:
        channel = self.channel
        channel.on_release(self._on_release)
        initial = channel.connect(self._on_credit)
        reader: asyncio.Task[None] | None = None
        writer: asyncio.Task[None] | None = None
        try:
            await self.context.write(wpb.CreditGrant(credits=initial))
            reader = asyncio.create_task(self._read_frames())
            writer = asyncio.create_task(self._write_credits())
            outcome = await self.outcome
        except asyncio.CancelledError:
            # the server stops or the producer cancelled the call: the core ends it
            channel.fail(ChannelFailedError(f"channel {self.label}: stream cancelled"))
            for task in (reader, writer):
                if task is not None:
                    task.cancel()
            raise
        await self._stop_writer(writer)
        if outcome is not None:
            # the reader may still wait in read(); aborting ends the call and that read
            await self.context.abort(*outcome)

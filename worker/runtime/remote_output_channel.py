"""The producer side of a data channel over gRPC: :class:`RemoteOutputChannel`, an
``OutputChannel`` whose frames go out on an ``Exchange`` stream (the protocol: ``exchange.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.channel_errors import ChannelError, ChannelFailedError
from snapflow.worker.runtime.debloat import DebloatSettings
from snapflow.worker.runtime.exchange import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_OPEN_TIMEOUT_S,
    ENVELOPE_BYTES,
    ChannelRefusedError,
    channel_label,
)
from snapflow.worker.runtime.frames import (
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    encode_batch_chunks,
    frame_to_proto,
)
from snapflow.worker.runtime.output_channel import DEFAULT_OUTPUT_QUEUE, OutputChannel

__all__ = ["RemoteOutputChannel"]

# Any: the stubs type a stream read as `object | Response`, so comparing with EOF cannot narrow.
_EOF: Any = grpc.aio.EOF


class RemoteOutputChannel(OutputChannel):
    """Producer side of a channel over an ``Exchange`` stream; same contract as
    ``snapflow.worker.runtime.output_channel.OutputChannel``.

    Create with ``await RemoteOutputChannel.connect(stub, channel_id)``. Batches are split (to
    ``max_message_bytes`` minus ``ENVELOPE_BYTES`` of IPC bytes per message) and encoded in
    ``send``; one writer task writes the queue's deliverable head to the stream, one reader task
    turns CreditGrant messages into credit.
    """

    def __init__(
        self,
        stub: wgrpc.DataExchangeServiceAsyncStub,
        channel_id: wpb.ChannelId,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        debloat: DebloatSettings | None = None,
    ) -> None:
        if max_message_bytes <= 2 * ENVELOPE_BYTES:
            raise ValueError(f"max_message_bytes too small: {max_message_bytes}")
        super().__init__(output_queue=output_queue, name=channel_label(channel_id), debloat=debloat)
        self.stub = stub
        self.channel_id = channel_id
        self.max_payload_bytes = max_message_bytes - ENVELOPE_BYTES
        self._call: Any = None
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._eop_written = False
        self.initial_credit = 0

    @classmethod
    async def connect(
        cls,
        stub: wgrpc.DataExchangeServiceAsyncStub,
        channel_id: wpb.ChannelId,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        output_queue: int = DEFAULT_OUTPUT_QUEUE,
        timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
        debloat: DebloatSettings | None = None,
    ) -> RemoteOutputChannel:
        """Open the stream and wait for the initial credit.

        Raises ChannelRefusedError (FAILED_PRECONDITION from the consumer) or
        ChannelFailedError (transport error, timeout)."""
        self = cls(
            stub,
            channel_id,
            max_message_bytes=max_message_bytes,
            output_queue=output_queue,
            debloat=debloat,
        )
        await self._open(timeout_s)
        return self

    async def _open(self, timeout_s: float) -> None:
        call = self.stub.Exchange()
        self._call = call
        msg = wpb.ExchangeMessage()
        msg.open.CopyFrom(self.channel_id)
        try:
            async with asyncio.timeout(timeout_s):
                await call.write(msg)
                grant = await call.read()
        except grpc.aio.AioRpcError as e:
            call.cancel()
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise ChannelRefusedError(e.details() or "channel refused") from e
            raise ChannelFailedError(
                f"channel {self.name}: open failed: {e.code().name}: {e.details()}"
            ) from e
        except TimeoutError as e:
            call.cancel()
            raise ChannelFailedError(
                f"channel {self.name}: no initial credit within {timeout_s}s"
            ) from e
        if grant is _EOF:
            call.cancel()
            raise ChannelFailedError(f"channel {self.name}: consumer ended the stream at open")
        assert isinstance(grant, wpb.CreditGrant)  # for the type checker: not EOF, so a grant
        self._credits = grant.credits
        self.initial_credit = grant.credits
        self._writer = asyncio.create_task(self._write_frames(), name=f"exchange-w {self.name}")
        self._reader = asyncio.create_task(self._read_credits(), name=f"exchange-r {self.name}")

    # -- OutputChannel hooks ---------------------------------------------------------------------

    def _prepare(self, frame: Frame) -> list[tuple[Frame, Any]]:
        if type(frame) is DataFrame:
            chunks = encode_batch_chunks(frame.batch, self.max_payload_bytes)
            if len(chunks) == 1:
                return [(frame, chunks[0][1])]
            return [(DataFrame(batch), payload) for batch, payload in chunks]
        return [(frame, None)]

    def _kick(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def _fail(self, error: ChannelError) -> None:
        super()._fail(error)
        self._kick()

    async def _finish(self) -> None:
        """Wait for the writer to half-close and the consumer to end the call."""
        tasks = [t for t in (self._writer, self._reader) if t is not None]
        if tasks:
            await asyncio.gather(*tasks)
        if self._failure is not None:
            raise self._failure

    def abort(self, cause: BaseException | str = "producer aborted") -> None:
        super().abort(cause)
        self._stop_tasks()
        if self._call is not None:
            self._call.cancel()

    # -- tasks -----------------------------------------------------------------------------------

    async def _write_frames(self) -> None:
        loop = asyncio.get_running_loop()
        call = self._call
        try:
            while True:
                entry = self._take_nowait()
                if entry is None:
                    if self._failure is not None:
                        return
                    if self._closing and not self._queue and self._eop_written:
                        break
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                frame, payload = entry
                msg = wpb.ExchangeMessage()
                frame_to_proto(frame, msg.frame, payload)
                await call.write(msg)
                if type(frame) is EndOfPartitionFrame:
                    self._eop_written = True
            await call.done_writing()
        except grpc.aio.AioRpcError as e:
            self._fail(self._broken(e))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # e.g. InvalidStateError: the call is already finished
            if call.done():
                code, details = await call.code(), await call.details()
                self._fail(
                    ChannelFailedError(f"channel {self.name}: stream broke: {code.name}: {details}")
                )
            else:
                self._fail(ChannelFailedError(f"channel {self.name}: writing failed: {e!r}"))
                call.cancel()

    async def _read_credits(self) -> None:
        call = self._call
        try:
            while True:
                grant = await call.read()
                if grant is _EOF:
                    break
                self.add_credits(grant.credits)
            code = await call.code()
            if code != grpc.StatusCode.OK:
                self._fail(
                    ChannelFailedError(
                        f"channel {self.name}: stream ended with {code.name}: "
                        f"{await call.details()}"
                    )
                )
            elif not self._eop_written:
                self._fail(
                    ChannelFailedError(f"channel {self.name}: consumer ended the stream early")
                )
        except grpc.aio.AioRpcError as e:
            self._fail(self._broken(e))

    def _broken(self, e: grpc.aio.AioRpcError) -> ChannelFailedError:
        return ChannelFailedError(
            f"channel {self.name}: stream broke: {e.code().name}: {e.details()}"
        )

    def _stop_tasks(self) -> None:
        for task in (self._writer, self._reader):
            if task is not None and not task.done() and task is not asyncio.current_task():
                task.cancel()

"""One long-lived ``WorkerControlService.Control`` call to one agent: the coordinator's
triggers, completion and abort notices and cancellations, sent as messages in order.

Why a stream: with checkpoints every 100 ms a job sends a trigger and a completion notice to
every agent per checkpoint. As unary calls each cost about a millisecond of CPU on either
side (a call object, its tasks and completion queue events); a message on an open stream
costs a fraction of that.

The contract, for the coordinator's callers:

* ``send`` never blocks and never raises, and reports no failure before it returns; the call
  is opened on the first command and opened again on the next command after it ended.
* A **trigger** is answered by the agent (OK or refused). It fails (``on_failed`` with a
  message saying why) when the agent refuses it, when no answer came within ``timeout_s``,
  when the call ends before its answer (the agent died, restarted, or the connection broke:
  whether the agent carried it out is unknown, so it counts as failed, as a unary call's
  error did), or when ``max_queued`` commands are already waiting to be written.
* Other commands are **fire-and-forget**: a refusal or a loss is logged. A lost completion
  notice is tolerated by design (the next one commits everything before it); a lost abort
  notice leaves the agent to drop the checkpoint at the next one.
* Commands reach the agent in the order sent, on one call; after a call ended, those not yet
  written are dropped with it (triggers among them fail), never resent on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from snapflow.request_parsing import MAX_ERROR_CHARS
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc

#: Called with a message when a trigger failed.
OnFailed = Callable[[str], None]

DEFAULT_MAX_QUEUED = 1024
"""Commands waiting to be written on one call. Only reached when an agent stops reading for
minutes (ten checkpoints a second send about 20 a second to an agent); beyond it, triggers
fail at once instead of piling up in memory."""


@dataclass(slots=True)
class _Pending:
    """A trigger written or queued, waiting for the agent's answer."""

    on_failed: OnFailed
    deadline: asyncio.TimerHandle


class _Call:
    """One opened call: its queue of commands to write, the triggers awaiting an answer."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[wpb.ControlCommand | None] = asyncio.Queue()
        """Commands to write; None ends the request stream (the call ended)."""
        self.pending: dict[int, _Pending] = {}
        self.reader: asyncio.Task[None] | None = None
        self.grpc_call: Any = None

    async def requests(self) -> AsyncIterator[wpb.ControlCommand]:
        # Ends when the call does: grpc stops reading it on a cancel, None after any other end
        # (else grpc's task reading it stays pending and is destroyed so, which asyncio logs).
        while (command := await self.queue.get()) is not None:
            yield command


class ControlStream:
    """The control call to one agent (``address``); see the module's contract."""

    def __init__(
        self,
        stub: Callable[[], wgrpc.WorkerControlServiceAsyncStub],
        address: str,
        timeout_s: float,
        log: Any,
        max_queued: int = DEFAULT_MAX_QUEUED,
    ) -> None:
        self._stub = stub
        self.address = address
        self.timeout_s = timeout_s
        self.max_queued = max_queued
        self._log = log
        self._sequence = 0
        self._call: _Call | None = None
        self._closed = False

    # --- sending ---------------------------------------------------------------------------

    def send(self, command: wpb.ControlCommand, on_failed: OnFailed | None = None) -> None:
        """Queue ``command`` (its ``sequence`` is set here). ``on_failed`` is for triggers:
        it is called once if the trigger fails, never if the agent carried it out."""
        # Failures are reported from the loop, never from inside send: the caller may be in the
        # middle of executing the job core's actions.
        loop = asyncio.get_running_loop()
        if self._closed:
            if on_failed is not None:
                loop.call_soon(on_failed, f"control stream to {self.address} is closed")
            return
        call = self._call if self._call is not None else self._open()
        self._sequence += 1
        command.sequence = self._sequence
        if call.queue.qsize() >= self.max_queued:
            message = (
                f"control stream to {self.address} has {self.max_queued} commands waiting "
                f"to be written: the agent is not reading"
            )
            if on_failed is not None:
                loop.call_soon(on_failed, message)
            else:
                self._log.info("agent.control_dropped", address=self.address, error=message)
            return
        if on_failed is not None:
            deadline = loop.call_later(self.timeout_s, self._expire, call, self._sequence)
            call.pending[self._sequence] = _Pending(on_failed, deadline)
        call.queue.put_nowait(command)

    def _open(self) -> _Call:
        call = self._call = _Call()
        call.grpc_call = self._stub().Control(call.requests())
        call.reader = asyncio.create_task(self._read(call))
        return call

    def _expire(self, call: _Call, sequence: int) -> None:
        pending = call.pending.pop(sequence, None)
        if pending is not None:
            pending.on_failed(
                f"control command to {self.address} not answered within {self.timeout_s:g} s"
            )

    # --- answers ---------------------------------------------------------------------------

    async def _read(self, call: _Call) -> None:
        error = "the agent ended the control stream"
        try:
            async for reply in call.grpc_call:
                self._answered(call, reply)
        except grpc.aio.AioRpcError as e:
            error = f"{e.code().name} {(e.details() or '')[:MAX_ERROR_CHARS]}"
        except asyncio.CancelledError:
            error = "the control stream was closed"
        finally:
            self._ended(call, error)

    def _answered(self, call: _Call, reply: wpb.ControlReply) -> None:
        pending = call.pending.pop(reply.sequence, None)
        if pending is not None:
            pending.deadline.cancel()
        if reply.code == grpc.StatusCode.OK.value[0]:
            return
        code = _code_name(reply.code)
        message = f"{code} {reply.message[:MAX_ERROR_CHARS]}"
        if pending is not None:
            pending.on_failed(f"agent {self.address} refused the trigger: {message}")
        else:
            self._log.info(
                "agent.control_refused",
                address=self.address,
                sequence=reply.sequence,
                error=message,
            )

    def _ended(self, call: _Call, error: str) -> None:
        if self._call is call:
            self._call = None
        call.queue.put_nowait(None)
        pending, call.pending = call.pending, {}
        for entry in pending.values():
            entry.deadline.cancel()
        if self._closed:
            return  # shutting down: nothing will retry
        if pending:
            self._log.info("agent.control_ended", address=self.address, error=error)
        for entry in pending.values():
            entry.on_failed(f"control stream to {self.address} ended: {error}")

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def open(self) -> bool:
        """Whether a call is open (or opening) now."""
        return self._call is not None

    async def drain(self) -> None:
        """Wait until every trigger sent was answered or failed (tests)."""
        while self._call is not None and self._call.pending:
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        """End the call; triggers awaiting an answer are dropped without failing."""
        self._closed = True
        call, self._call = self._call, None
        if call is None:
            return
        call.grpc_call.cancel()
        if call.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await call.reader


def _code_name(value: int) -> str:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return str(code.name)
    return f"status {value}"

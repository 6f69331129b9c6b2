"""An agent's ``WorkerControlService``: one ``Control`` stream per coordinator, carrying the
coordinator's triggers for its source subtasks, checkpoint completion and abort notices, and
cancellation, each checked against the agent's job and coordinator epoch first.

Commands are carried out one at a time in the order they arrive (none of them waits), so a
completion notice sent after a trigger reaches the subtasks after it. Every trigger is
answered, OK or refused, and every refused command; a refused command leaves the stream open
(the next may be valid). Undecodable bytes end the stream with INVALID_ARGUMENT: an honest
coordinator never sends them. A stopping agent ends its calls with UNAVAILABLE
(``ControlCalls.close``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
import grpc.aio

from snapflow import wire
from snapflow.request_parsing import MAX_ERROR_CHARS, MalformedRequest
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.task import Subtask

__all__ = [
    "CommandRefused",
    "ControlCalls",
    "ControlHandler",
    "ControlledAgent",
    "WorkerControlServicer",
]


class CommandRefused(Exception):
    """A control command the agent does not carry out: the status and what to fix."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message[:MAX_ERROR_CHARS]


class ControlHandler(Protocol):
    """Carries out the commands of a ``Control`` stream; raises ``CommandRefused``."""

    def trigger(self, request: wpb.TriggerTaskCheckpointRequest) -> None: ...

    def complete(self, request: wpb.NotifyCheckpointRequest) -> None: ...

    def abort(self, request: wpb.NotifyCheckpointRequest) -> None: ...

    def cancel(self, request: wpb.CancelTaskRequest) -> None: ...


def _reply(command: wpb.ControlCommand, handler: ControlHandler) -> wpb.ControlReply | None:
    """Carry out one command; the reply to send, or None (an unrefused non-trigger)."""
    kind = command.WhichOneof("command")
    try:
        if kind == "trigger":
            handler.trigger(command.trigger)
            return wpb.ControlReply(sequence=command.sequence)
        if kind == "complete":
            handler.complete(command.complete)
        elif kind == "abort":
            handler.abort(command.abort)
        elif kind == "cancel":
            handler.cancel(command.cancel)
        else:
            raise CommandRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a control command needs one of trigger, complete, abort or cancel",
            )
    except CommandRefused as e:
        return wpb.ControlReply(sequence=command.sequence, code=e.code.value[0], message=e.message)
    return None


class _ControlCall:
    """One ``Control`` call being served: a reader task carries the commands out and writes
    the replies; the handler waits for the outcome and then ends the call. As for ``Exchange``
    streams (``exchange.py``), gRPC operations in flight are never cancelled from here: the
    call is ended with the read still pending, which ends that read."""

    def __init__(self, context: grpc.aio.ServicerContext, handler: ControlHandler) -> None:
        self.context = context
        self.handler = handler
        self.outcome: asyncio.Future[tuple[grpc.StatusCode, str] | None] = (
            asyncio.get_running_loop().create_future()
        )

    def finish(self, outcome: tuple[grpc.StatusCode, str] | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)

    async def _read(self) -> None:
        context, handler = self.context, self.handler
        try:
            while not self.outcome.done():
                command = await context.read()
                if command is grpc.aio.EOF or self.outcome.done():
                    self.finish(None)
                    return
                if isinstance(command, MalformedRequest):
                    self.finish((grpc.StatusCode.INVALID_ARGUMENT, command.describe()))
                    return
                reply = _reply(command, handler)
                if reply is not None:
                    await context.write(reply)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the call broke under us (the peer went away)
            self.finish((grpc.StatusCode.UNAVAILABLE, f"control stream broke: {e!r}"[:200]))

    async def run(self) -> None:
        reader = asyncio.create_task(self._read(), name="control-reader")
        try:
            outcome = await self.outcome
        except asyncio.CancelledError:
            reader.cancel()  # the client cancelled the call: the core ends it
            raise
        if outcome is not None:
            await self.context.abort(*outcome)


class ControlCalls:
    """The ``Control`` calls a server is serving, so that they end before it stops: a stream
    the coordinator keeps open would otherwise hold the server's grace period and then be
    cancelled (which gRPC logs as an error)."""

    def __init__(self) -> None:
        self._calls: set[_ControlCall] = set()

    async def serve(self, context: grpc.aio.ServicerContext, handler: ControlHandler) -> None:
        """The body of a ``Control`` handler: each command carried out in order, the replies
        written, until the client ends the call or ``close``."""
        call = _ControlCall(context, handler)
        self._calls.add(call)
        try:
            await call.run()
        finally:
            self._calls.discard(call)

    def close(self) -> None:
        """End every call (UNAVAILABLE: the agent is stopping); call before the server stops."""
        for call in list(self._calls):
            call.finish((grpc.StatusCode.UNAVAILABLE, "the agent is stopping"))


class ControlledAgent(Protocol):
    """What the control service uses of its agent. A protocol: the agent builds its service,
    so this module cannot import ``agent.py`` (that would be an import cycle)."""

    @property
    def job_id(self) -> str: ...

    @property
    def epoch(self) -> int: ...

    def hosts(self, attempt: pb.TaskAttempt) -> bool: ...

    def adopt_epoch(self, epoch: int) -> None: ...

    def tasks_for(self, attempts: Sequence[pb.TaskAttempt]) -> list[Subtask]: ...

    def cancel_tasks(self, attempts: Sequence[pb.TaskAttempt]) -> None: ...

    def checkpoint_aborted(self, checkpoint_id: int) -> None: ...


class WorkerControlServicer(wgrpc.WorkerControlServiceServicer):
    """Serves ``WorkerControlService`` for one agent: checks that a command is for the agent's
    job and coordinator epoch, then hands it to the subtasks it names."""

    def __init__(self, agent: ControlledAgent) -> None:
        self.agent = agent
        self.calls = ControlCalls()

    async def Control(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        await self.calls.serve(context, self)

    def _check(self, job_id: str, epoch: int, attempts: Sequence[pb.TaskAttempt]) -> None:
        """Refuse a command of another job or an older epoch. A newer epoch is adopted only
        from a command that names current attempts of tasks hosted here, so one forged command
        cannot make the agent refuse its real coordinator."""
        agent = self.agent
        if job_id != agent.job_id:
            raise CommandRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job_id[:64]!r} is not hosted by this agent: ignored",
            )
        if epoch < agent.epoch:
            raise CommandRefused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"coordinator epoch {epoch} is older than {agent.epoch}: ignored",
            )
        if epoch > agent.epoch:
            if not attempts or not all(agent.hosts(a) for a in attempts):
                raise CommandRefused(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"coordinator epoch {epoch} is newer than {agent.epoch} but the command "
                    f"names tasks this agent does not run: ignored",
                )
            agent.adopt_epoch(epoch)

    def trigger(self, request: wpb.TriggerTaskCheckpointRequest) -> None:
        self._check(request.job_id, request.coordinator_epoch, request.tasks)
        options = wire.barrier_options_from_pb(request.options)
        tasks = self.agent.tasks_for(request.tasks)
        not_sources = [task.name for task in tasks if not task.is_source][:5]
        if not_sources:
            # Barriers reach the other tasks on their inputs; a trigger there is a bad request.
            raise CommandRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"checkpoint triggers go to source tasks only; not sources: {', '.join(not_sources)}",
            )
        for task in tasks:
            task.trigger(request.checkpoint_id, request.timestamp_ms, options)

    def complete(self, request: wpb.NotifyCheckpointRequest) -> None:
        self._check(request.job_id, request.coordinator_epoch, request.tasks)
        for task in self.agent.tasks_for(request.tasks):
            task.notify_complete(request.checkpoint_id, request.final)

    def abort(self, request: wpb.NotifyCheckpointRequest) -> None:
        self._check(request.job_id, request.coordinator_epoch, request.tasks)
        for task in self.agent.tasks_for(request.tasks):
            task.notify_aborted(request.checkpoint_id)
        self.agent.checkpoint_aborted(request.checkpoint_id)

    def cancel(self, request: wpb.CancelTaskRequest) -> None:
        self._check(request.job_id, request.coordinator_epoch, request.tasks)
        self.agent.cancel_tasks(request.tasks)

"""An agent's ``WorkerControlService``: the coordinator's triggers for its source subtasks,
checkpoint completion and abort notices, and cancellation, each checked against the agent's job
and coordinator epoch first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc
import grpc.aio

from snapflow import wire
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.task import Subtask

__all__ = ["ControlledAgent", "WorkerControlServicer"]


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
    """Serves ``WorkerControlService`` for one agent: checks that a message is for the agent's
    job and coordinator epoch, then hands it to the subtasks it names."""

    def __init__(self, agent: ControlledAgent) -> None:
        self.agent = agent

    async def _check(
        self,
        job_id: str,
        epoch: int,
        attempts: Sequence[pb.TaskAttempt],
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Refuse a message of another job or an older epoch. A newer epoch is adopted only
        from a message that names current attempts of tasks hosted here, so one forged message
        cannot make the agent refuse its real coordinator."""
        agent = self.agent
        if job_id != agent.job_id:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job_id[:64]!r} is not hosted by this agent: ignored",
            )
        if epoch < agent.epoch:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"coordinator epoch {epoch} is older than {agent.epoch}: ignored",
            )
        if epoch > agent.epoch:
            if not attempts or not all(agent.hosts(a) for a in attempts):
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"coordinator epoch {epoch} is newer than {agent.epoch} but the message "
                    f"names tasks this agent does not run: ignored",
                )
            agent.adopt_epoch(epoch)

    async def TriggerCheckpoint(
        self, request: wpb.TriggerTaskCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerAck:
        await self._check(request.job_id, request.coordinator_epoch, request.tasks, context)
        options = wire.barrier_options_from_pb(request.options)
        tasks = self.agent.tasks_for(request.tasks)
        not_sources = [task.name for task in tasks if not task.is_source][:5]
        if not_sources:
            # Barriers reach the other tasks on their inputs; a trigger there is a bad request.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"checkpoint triggers go to source tasks only; not sources: {', '.join(not_sources)}",
            )
        for task in tasks:
            task.trigger(request.checkpoint_id, request.timestamp_ms, options)
        return wpb.WorkerAck()

    async def NotifyCheckpointComplete(
        self, request: wpb.NotifyCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerAck:
        await self._check(request.job_id, request.coordinator_epoch, request.tasks, context)
        for task in self.agent.tasks_for(request.tasks):
            task.notify_complete(request.checkpoint_id, request.final)
        return wpb.WorkerAck()

    async def NotifyCheckpointAborted(
        self, request: wpb.NotifyCheckpointRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerAck:
        await self._check(request.job_id, request.coordinator_epoch, request.tasks, context)
        for task in self.agent.tasks_for(request.tasks):
            task.notify_aborted(request.checkpoint_id)
        self.agent.checkpoint_aborted(request.checkpoint_id)
        return wpb.WorkerAck()

    async def CancelTask(
        self, request: wpb.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> wpb.WorkerAck:
        await self._check(request.job_id, request.coordinator_epoch, request.tasks, context)
        self.agent.cancel_tasks(request.tasks)
        return wpb.WorkerAck()

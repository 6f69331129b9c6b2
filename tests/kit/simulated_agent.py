"""A simulated worker agent: real gRPC on both sides, no operators.

It serves ``WorkerControlService`` and, on a trigger, acknowledges the checkpoint for every
subtask it hosts (as if the barrier had flowed through them), writing a small real state file
per subtask into the checkpoint location through the file store (a directory or an S3 prefix);
a write that fails declines the checkpoint (``IO_ERROR``) with the error. A test double, not
shipped: used by the coordinator's tests and benchmark (``bench/coordinator_bench.py``, with
``tests/`` on its path), where the coordinator must be exercised over the wire without the
worker runtime.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from snapflow import wire
from snapflow.checkpointing import OPERATOR, DeclineReason, StateHandle
from snapflow.errors import SnapflowError
from snapflow.filestore_registry import store_for
from snapflow.jobgraph import TaskState
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.ack_batcher import AckBatcher
from snapflow.worker.runtime.agent_service import CommandRefused, ControlCalls

AckPolicy = Callable[[pb.TaskAttempt, int], str]
"""Decides per (task, checkpoint id): "ack", "decline" or "ignore"."""


def always_ack(task: pb.TaskAttempt, checkpoint_id: int) -> str:
    return "ack"


@dataclass
class SimulatedAgent:
    coordinator_address: str
    job_id: str
    tasks: list[tuple[str, int]]
    """(vertex_id, subtask_index) of the subtasks this agent hosts."""
    write_state: bool = True
    """Write each subtask's state file (False: report the handle only, as a pure ack load)."""
    state_bytes: int = 64
    policy: AckPolicy = always_ack
    input_ended: bool = False
    """Acks say the subtask's input had ended (a bounded source's after its end of data): a
    checkpoint acked so by every source is the job's final one."""
    attempts: dict[tuple[str, int], pb.TaskAttempt] = field(default_factory=dict)
    restores: dict[tuple[str, int], cpb.TaskRestore] = field(default_factory=dict)
    triggered: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    canceled: int = 0
    epoch: int = 0
    address: str = ""
    ack_latencies_s: list[float] = field(default_factory=list)
    last_ack_sent: dict[int, float] = field(default_factory=dict)
    """checkpoint id -> ``time.perf_counter()`` when this agent sent its last ack for it."""
    _server: grpc.aio.Server | None = None
    _control: _Control | None = None
    _channel: grpc.aio.Channel | None = None
    _stub: cgrpc.CoordinatorServiceAsyncStub | None = None
    _acks: set[asyncio.Task[None]] = field(default_factory=set)
    batch_acks: bool = True
    """Send acks through the agent's ``AckBatcher`` (False: one unary RPC per subtask ack)."""
    _batcher: AckBatcher | None = None
    heartbeats: bool = True
    """Send heartbeats for the registered tasks (False: a silent agent, as if it died)."""
    heartbeat_interval_s: float = 0.5
    _heartbeat_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        self._control = _Control(self)
        wgrpc.add_WorkerControlServiceServicer_to_server(self._control, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        self._channel = grpc.aio.insecure_channel(self.coordinator_address)
        self._stub = cgrpc.CoordinatorServiceStub(self._channel)
        self._batcher = AckBatcher(self._stub)
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            if not self.heartbeats or not self.attempts:
                continue
            try:
                response = await self.stub.Heartbeat(
                    cpb.HeartbeatRequest(
                        job_id=self.job_id,
                        address=self.address,
                        tasks=list(self.attempts.values()),
                    ),
                    timeout=5,
                )
            except grpc.aio.AioRpcError:
                continue
            if response.heartbeat_interval_ms > 0:
                self.heartbeat_interval_s = response.heartbeat_interval_ms / 1000

    @property
    def stub(self) -> cgrpc.CoordinatorServiceAsyncStub:
        assert self._stub is not None, "start() first"
        return self._stub

    async def register_all(self, running: bool = True) -> None:
        for vertex_id, index in self.tasks:
            response = await self.stub.RegisterTask(
                cpb.RegisterTaskRequest(
                    job_id=self.job_id,
                    vertex_id=vertex_id,
                    subtask_index=index,
                    address=self.address,
                ),
                timeout=10,
            )
            self.attempts[(vertex_id, index)] = response.attempt
            self.restores[(vertex_id, index)] = response.restore
            self.epoch = response.coordinator_epoch
        if running:
            await self.set_state(wire.TASK_STATE.to_pb(TaskState.RUNNING))

    async def set_state(
        self,
        state: int,
        failure: str = "",
        only: tuple[str, int] | None = None,
        data_ended: bool = False,
    ) -> None:
        for key, attempt in self.attempts.items():
            if only is None or key == only:
                await self.stub.UpdateTaskState(
                    cpb.UpdateTaskStateRequest(
                        job_id=self.job_id,
                        attempt=attempt,
                        state=state,  # type: ignore[arg-type]
                        failure=failure,
                        data_ended=data_ended,
                    ),
                    timeout=10,
                )

    async def stop(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        for task in list(self._acks):
            task.cancel()
        if self._server is not None:
            if self._control is not None:
                self._control.calls.close()
            await self._server.stop(0.5)
        if self._channel is not None:
            await self._channel.close(grace=None)

    async def wait_idle(self) -> None:
        while self._acks:
            await asyncio.gather(*list(self._acks), return_exceptions=True)

    def _on_trigger(self, request: wpb.TriggerTaskCheckpointRequest) -> None:
        self.triggered.append(request.checkpoint_id)
        for attempt in self.attempts.values():
            task = asyncio.get_running_loop().create_task(self._ack(attempt, request))
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)

    async def _ack(
        self, attempt: pb.TaskAttempt, request: wpb.TriggerTaskCheckpointRequest
    ) -> None:
        decision = self.policy(attempt, request.checkpoint_id)
        if decision == "ignore":
            return
        if decision == "decline":
            await self.stub.DeclineCheckpoint(
                cpb.DeclineCheckpointRequest(
                    job_id=self.job_id,
                    attempt=attempt,
                    checkpoint_id=request.checkpoint_id,
                    reason=wire.DECLINE_REASON.to_pb(DeclineReason.SNAPSHOT_FAILED),
                    message="simulated snapshot failure",
                ),
                timeout=10,
            )
            return
        store = store_for(request.options.target_location)
        path = store.join(
            request.options.target_location,
            f"{attempt.vertex_id}-{attempt.subtask_index}-{attempt.attempt}.state",
        )
        if self.write_state:
            try:
                await asyncio.to_thread(store.write, path, os.urandom(self.state_bytes))
            except (OSError, SnapflowError) as e:
                await self.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=self.job_id,
                        attempt=attempt,
                        checkpoint_id=request.checkpoint_id,
                        reason=wire.DECLINE_REASON.to_pb(DeclineReason.IO_ERROR),
                        message=f"cannot write state: {e}"[:500],
                    ),
                    timeout=10,
                )
                return
        handles = [wire.state_handle_to_pb(StateHandle(path, self.state_bytes, OPERATOR))]
        ack = cpb.AcknowledgeCheckpointRequest(
            job_id=self.job_id,
            attempt=attempt,
            checkpoint_id=request.checkpoint_id,
            operator_states=[
                pb.OperatorSubtaskState(operator_id=f"{attempt.vertex_id}-op", handles=handles)
            ],
            metrics=pb.SubtaskCheckpointMetrics(
                sync_duration_ms=1, async_duration_ms=2, state_size_bytes=self.state_bytes
            ),
            input_ended=self.input_ended,
        )
        started = time.perf_counter()
        self.last_ack_sent[request.checkpoint_id] = started
        if self.batch_acks and self._batcher is not None:
            await self._batcher.acknowledge(ack)
        else:
            await self.stub.AcknowledgeCheckpoint(ack, timeout=10)
        self.ack_latencies_s.append(time.perf_counter() - started)


class _Control(wgrpc.WorkerControlServiceServicer):
    """The agent's control stream, served by the worker's own ``ControlCalls``."""

    def __init__(self, agent: SimulatedAgent) -> None:
        self.agent = agent
        self.calls = ControlCalls()

    async def Control(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # type: ignore[override]
        await self.calls.serve(context, self)

    def _check_epoch(self, epoch: int) -> None:
        if epoch < self.agent.epoch:
            raise CommandRefused(grpc.StatusCode.FAILED_PRECONDITION, "stale coordinator epoch")

    def trigger(self, request: wpb.TriggerTaskCheckpointRequest) -> None:
        self._check_epoch(request.coordinator_epoch)
        self.agent.epoch = request.coordinator_epoch
        self.agent._on_trigger(request)

    def complete(self, request: wpb.NotifyCheckpointRequest) -> None:
        self._check_epoch(request.coordinator_epoch)
        self.agent.completed.append(request.checkpoint_id)

    def abort(self, request: wpb.NotifyCheckpointRequest) -> None:
        self.agent.aborted.append(request.checkpoint_id)

    def cancel(self, request: wpb.CancelTaskRequest) -> None:
        self.agent.canceled += len(request.tasks)

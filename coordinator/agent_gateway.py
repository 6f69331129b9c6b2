"""RPCs from the coordinator to worker agents: trigger, notify, cancel.

Every call is fire-and-forget with a deadline (``worker_rpc_timeout_s``) and carries the
coordinator epoch, so an agent ignores commands of a superseded coordinator. Failures are logged;
a failed trigger is reported back (the checkpoint is aborted as if declined), a lost completion
notice is tolerated (the next one commits everything before it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from snapflow import wire
from snapflow.coordinator import convert
from snapflow.coordinator.checkpoint_coordinator import BarrierOptions
from snapflow.coordinator.model import ExecutionAttempt
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.tls import aio_channel
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc

#: Called when a trigger RPC failed: (first attempt of the call, checkpoint id, message).
TriggerFailed = Callable[[ExecutionAttempt, int, str], None]
#: Attempts grouped by the address of the agent that hosts them.
ByAddress = dict[str, list[ExecutionAttempt]]


class AgentClients:
    """gRPC stubs for worker agents, one channel per address, with deadlines on every call."""

    def __init__(
        self, timeout_s: float, max_message_bytes: int, security: SecuritySettings = PLAINTEXT
    ) -> None:
        self.timeout_s = timeout_s
        self._security = security
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, wgrpc.WorkerControlServiceAsyncStub] = {}

    def stub(self, address: str) -> wgrpc.WorkerControlServiceAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = aio_channel(address, self._security, self._options)
            self._channels[address] = channel
            stub = self._stubs[address] = wgrpc.WorkerControlServiceStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()
        self._stubs.clear()


class AgentGateway:
    """The RPCs one job sends to the agents hosting its tasks (one call per agent)."""

    def __init__(
        self,
        job_id: str,
        clients: AgentClients,
        epoch: Callable[[], int],
        on_trigger_failed: TriggerFailed,
        log: Any,
    ) -> None:
        self.job_id = job_id
        self._clients = clients
        self._epoch = epoch
        self._on_trigger_failed = on_trigger_failed
        self._log = log
        self._calls: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """Cancel the calls still in flight."""
        for task in list(self._calls):
            task.cancel()

    async def drain(self) -> None:
        """Wait for the calls in flight (tests)."""
        while self._calls:
            await asyncio.gather(*list(self._calls), return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    # --- trigger ---------------------------------------------------------------------------

    def trigger(
        self, by_address: ByAddress, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions
    ) -> None:
        options_pb = wire.barrier_options_to_pb(options)
        for address, attempts in by_address.items():
            request = wpb.TriggerTaskCheckpointRequest(
                job_id=self.job_id,
                coordinator_epoch=self._epoch(),
                tasks=[convert.attempt_to_pb(a) for a in attempts],
                checkpoint_id=checkpoint_id,
                timestamp_ms=timestamp_ms,
                options=options_pb,
            )
            self._spawn(self._trigger_rpc(address, request, checkpoint_id, attempts))

    async def _trigger_rpc(
        self,
        address: str,
        request: wpb.TriggerTaskCheckpointRequest,
        checkpoint_id: int,
        attempts: list[ExecutionAttempt],
    ) -> None:
        try:
            await self._clients.stub(address).TriggerCheckpoint(
                request, timeout=self._clients.timeout_s
            )
        except grpc.aio.AioRpcError as e:
            message = f"trigger RPC to {address} failed: {e.code().name} {e.details()}"
            self._log.warning(
                "checkpoint.trigger_failed",
                checkpoint_id=checkpoint_id,
                address=address,
                error=message,
            )
            self._on_trigger_failed(attempts[0], checkpoint_id, message)

    # --- notify ----------------------------------------------------------------------------

    def notify(
        self,
        by_address: ByAddress,
        checkpoint_id: int,
        complete: bool,
        reason: str = "",
        final: bool = False,
    ) -> None:
        for address, attempts in by_address.items():
            request = wpb.NotifyCheckpointRequest(
                job_id=self.job_id,
                coordinator_epoch=self._epoch(),
                tasks=[convert.attempt_to_pb(a) for a in attempts],
                checkpoint_id=checkpoint_id,
                reason=reason,
                final=final,
            )
            self._spawn(self._notify_rpc(address, request, complete))

    async def _notify_rpc(
        self, address: str, request: wpb.NotifyCheckpointRequest, complete: bool
    ) -> None:
        stub = self._clients.stub(address)
        call = stub.NotifyCheckpointComplete if complete else stub.NotifyCheckpointAborted
        try:
            await call(request, timeout=self._clients.timeout_s)
        except grpc.aio.AioRpcError as e:
            # A lost completion notice is tolerated by design: the next one commits everything.
            self._log.info(
                "checkpoint.notify_failed",
                checkpoint_id=request.checkpoint_id,
                address=address,
                code=e.code().name,
            )

    # --- cancel ----------------------------------------------------------------------------

    def cancel(self, by_address: ByAddress) -> None:
        for address, attempts in by_address.items():
            request = wpb.CancelTaskRequest(
                job_id=self.job_id,
                coordinator_epoch=self._epoch(),
                tasks=[convert.attempt_to_pb(a) for a in attempts],
            )
            self._spawn(self._cancel_rpc(address, request))

    async def _cancel_rpc(self, address: str, request: wpb.CancelTaskRequest) -> None:
        try:
            await self._clients.stub(address).CancelTask(request, timeout=self._clients.timeout_s)
        except grpc.aio.AioRpcError as e:
            self._log.info("task.cancel_failed", address=address, code=e.code().name)

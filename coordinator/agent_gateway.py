"""Commands from the coordinator to worker agents: trigger, notify, cancel.

Every command goes on the agent's control stream (``control_stream.py``: one long-lived call
per agent, commands in order) and carries the coordinator epoch, so an agent ignores commands
of a superseded coordinator. A failed trigger is reported back (the checkpoint is aborted as if
declined); a refused or lost notice or cancellation is logged (a lost completion notice is
tolerated: the next one commits everything before it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import structlog

from snapflow import wire
from snapflow.coordinator import convert
from snapflow.coordinator.checkpoint_coordinator import BarrierOptions
from snapflow.coordinator.control_stream import ControlStream
from snapflow.coordinator.model import ExecutionAttempt
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.tls import aio_channel
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc

#: Called when a trigger failed: (first attempt of the command, checkpoint id, message).
TriggerFailed = Callable[[ExecutionAttempt, int, str], None]
#: Attempts grouped by the address of the agent that hosts them.
ByAddress = dict[str, list[ExecutionAttempt]]

log = structlog.get_logger("snapflow.coordinator")


class AgentClients:
    """One channel and one control stream per agent address, shared by the coordinator's jobs."""

    def __init__(
        self,
        timeout_s: float,
        max_message_bytes: int,
        security: SecuritySettings = PLAINTEXT,
    ) -> None:
        self.timeout_s = timeout_s
        self._security = security
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._streams: dict[str, ControlStream] = {}

    def _stub(self, address: str) -> wgrpc.WorkerControlServiceAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = aio_channel(address, self._security, self._options)
            self._channels[address] = channel
        return wgrpc.WorkerControlServiceStub(channel)

    def control(self, address: str) -> ControlStream:
        """The control stream to ``address`` (made on first use)."""
        stream = self._streams.get(address)
        if stream is None:
            stream = ControlStream(lambda: self._stub(address), address, self.timeout_s, log)
            self._streams[address] = stream
        return stream

    async def drain(self) -> None:
        """Wait until every trigger sent was answered or failed (tests)."""
        for stream in list(self._streams.values()):
            await stream.drain()

    async def close(self) -> None:
        for stream in self._streams.values():
            await stream.close()
        self._streams.clear()
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()


class AgentGateway:
    """The commands one job sends to the agents hosting its tasks (one per agent)."""

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
        self._closed = False

    def close(self) -> None:
        """The job's runner stopped: failures of its triggers are no longer reported."""
        self._closed = True

    async def drain(self) -> None:
        """Wait until the triggers sent were answered or failed (tests)."""
        await self._clients.drain()

    def _send(self, address: str, command: wpb.ControlCommand) -> None:
        self._clients.control(address).send(command)

    # --- trigger ---------------------------------------------------------------------------

    def trigger(
        self, by_address: ByAddress, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions
    ) -> None:
        options_pb = wire.barrier_options_to_pb(options)
        for address, attempts in by_address.items():
            command = wpb.ControlCommand(
                trigger=wpb.TriggerTaskCheckpointRequest(
                    job_id=self.job_id,
                    coordinator_epoch=self._epoch(),
                    tasks=[convert.attempt_to_pb(a) for a in attempts],
                    checkpoint_id=checkpoint_id,
                    timestamp_ms=timestamp_ms,
                    options=options_pb,
                )
            )
            self._clients.control(address).send(
                command, self._trigger_failed_fn(address, checkpoint_id, attempts[0])
            )

    def _trigger_failed_fn(
        self, address: str, checkpoint_id: int, attempt: ExecutionAttempt
    ) -> Callable[[str], None]:
        def failed(message: str) -> None:
            if self._closed:
                return
            self._log.warning(
                "checkpoint.trigger_failed",
                checkpoint_id=checkpoint_id,
                address=address,
                error=message,
            )
            self._on_trigger_failed(attempt, checkpoint_id, message)

        return failed

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
            command = (
                wpb.ControlCommand(complete=request)
                if complete
                else wpb.ControlCommand(abort=request)
            )
            self._send(address, command)

    # --- cancel ----------------------------------------------------------------------------

    def cancel(self, by_address: ByAddress) -> None:
        for address, attempts in by_address.items():
            request = wpb.CancelTaskRequest(
                job_id=self.job_id,
                coordinator_epoch=self._epoch(),
                tasks=[convert.attempt_to_pb(a) for a in attempts],
            )
            self._send(address, wpb.ControlCommand(cancel=request))

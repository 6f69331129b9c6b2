"""The coordinator's control stream to an agent (``control_stream.py``, ``AgentGateway``), over
real gRPC against an agent that serves ``Control`` with the worker's own ``ControlCalls``:
commands arrive in order with the epoch, and a trigger fails exactly when the contract says
(refused, not answered in time, the call ended first, too many commands waiting); other
commands never report."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
import pytest
import structlog
from kit.polling import wait_until_async

from snapflow.checkpointing import CheckpointKind, CheckpointMode
from snapflow.coordinator.agent_gateway import AgentClients, AgentGateway
from snapflow.coordinator.checkpoint_coordinator import BarrierOptions
from snapflow.coordinator.control_stream import ControlStream
from snapflow.coordinator.model import ExecutionAttempt
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.agent_service import CommandRefused, ControlCalls

T = TypeVar("T")
JOB = "0123456789abcdef0123456789abcdef"
SRC = ExecutionAttempt("src", 0, 1)
OTHER = ExecutionAttempt("src", 1, 1)
LOG = structlog.get_logger("test")
OPTIONS = BarrierOptions(CheckpointKind.SAVEPOINT, CheckpointMode.ALIGNED, 0, "/sp")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))


class Agent(wgrpc.WorkerControlServiceServicer):
    """Records every command; refuses triggers (``refuse``) or holds them (``hold``: the
    stream stops being read, as by an agent whose loop is stuck)."""

    def __init__(self, refuse: bool = False, hold: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.refuse = refuse
        self.hold = hold
        self.streams = 0
        self.control = ControlCalls()

    async def Control(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        self.streams += 1
        if self.hold:
            await asyncio.sleep(3600)
        await self.control.serve(context, self)

    def trigger(self, request: wpb.TriggerTaskCheckpointRequest) -> None:
        self.calls.append(("trigger", request))
        if self.refuse:
            raise CommandRefused(grpc.StatusCode.UNAVAILABLE, "busy")

    def complete(self, request: wpb.NotifyCheckpointRequest) -> None:
        self.calls.append(("complete", request))

    def abort(self, request: wpb.NotifyCheckpointRequest) -> None:
        self.calls.append(("abort", request))
        raise CommandRefused(grpc.StatusCode.FAILED_PRECONDITION, "not hosted")

    def cancel(self, request: wpb.CancelTaskRequest) -> None:
        self.calls.append(("cancel", request))


@asynccontextmanager
async def serving(agent: Agent) -> AsyncIterator[tuple[str, grpc.aio.Server]]:
    server = grpc.aio.server()
    wgrpc.add_WorkerControlServiceServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", server
    finally:
        await server.stop(None)


@pytest.mark.parametrize("refuse", [False, True])
def test_gateway_sends_commands_in_order_on_one_stream_with_the_epoch(refuse: bool) -> None:
    async def body() -> None:
        agent = Agent(refuse=refuse)
        async with serving(agent) as (address, _):
            clients = AgentClients(timeout_s=5, max_message_bytes=1 << 20)
            failed: list[tuple[ExecutionAttempt, int, str]] = []
            gateway = AgentGateway(JOB, clients, lambda: 7, lambda *a: failed.append(a), LOG)
            try:
                # No waiting between them: the stream keeps their order.
                gateway.trigger({address: [SRC, OTHER]}, 3, 100, OPTIONS)
                gateway.notify({address: [SRC]}, 3, complete=True, final=True)
                gateway.notify({address: [SRC]}, 4, complete=False, reason="EXPIRED")
                gateway.cancel({address: [SRC, OTHER]})
                await wait_until_async(lambda: len(agent.calls) == 4, "four commands", timeout_s=10)
                await gateway.drain()
            finally:
                await clients.close()
        assert [k for k, _ in agent.calls] == ["trigger", "complete", "abort", "cancel"]
        assert agent.streams == 1
        assert all(r.coordinator_epoch == 7 and r.job_id == JOB for _, r in agent.calls)
        trigger = agent.calls[0][1]
        assert (trigger.checkpoint_id, trigger.timestamp_ms, len(trigger.tasks)) == (3, 100, 2)
        assert trigger.options.target_location == "/sp"
        assert agent.calls[1][1].final and agent.calls[2][1].reason == "EXPIRED"
        # Only the trigger reports; the refused abort notice is logged, not reported.
        if refuse:
            assert len(failed) == 1 and failed[0][:2] == (SRC, 3)
            assert "refused the trigger: UNAVAILABLE busy" in failed[0][2]
        else:
            assert failed == []

    run(body())


def test_a_trigger_not_answered_in_time_fails_and_a_closed_gateway_reports_nothing() -> None:
    async def body() -> None:
        agent = Agent(hold=True)
        async with serving(agent) as (address, _):
            clients = AgentClients(timeout_s=0.3, max_message_bytes=1 << 20)
            failed: list[tuple[ExecutionAttempt, int, str]] = []
            gateway = AgentGateway(JOB, clients, lambda: 1, lambda *a: failed.append(a), LOG)
            try:
                gateway.trigger({address: [SRC]}, 1, 100, OPTIONS)
                await wait_until_async(lambda: len(failed) == 1, "the trigger failed", timeout_s=10)
                assert "not answered within 0.3 s" in failed[0][2]
                gateway.close()
                gateway.trigger({address: [SRC]}, 2, 100, OPTIONS)
                await asyncio.sleep(0.6)
                assert len(failed) == 1
            finally:
                await clients.close()

    run(body())


def test_triggers_fail_when_the_call_ends_before_their_answer_and_the_next_reopens() -> None:
    async def body() -> None:
        failures: list[str] = []
        hold = Agent(hold=True)
        async with serving(hold) as (address, server):
            stream = ControlStream(
                lambda: wgrpc.WorkerControlServiceStub(grpc.aio.insecure_channel(address)),
                address,
                timeout_s=30,
                log=LOG,
            )
            command = wpb.ControlCommand(trigger=wpb.TriggerTaskCheckpointRequest(job_id=JOB))
            stream.send(command, failures.append)
            await wait_until_async(lambda: hold.streams == 1, "the call opened", timeout_s=10)
            await server.stop(None)  # the agent goes away with the trigger unanswered
            await wait_until_async(lambda: len(failures) == 1, "first failure", timeout_s=10)
            assert f"control stream to {address} ended" in failures[0]
            # The next command opens a new call, which fails the same way (nobody serves).
            stream.send(
                wpb.ControlCommand(trigger=wpb.TriggerTaskCheckpointRequest()), failures.append
            )
            await wait_until_async(lambda: len(failures) == 2, "second failure", timeout_s=10)
            assert "UNAVAILABLE" in failures[1]
            await stream.close()
            stream.send(command, failures.append)
            assert len(failures) == 2  # reported from the loop, not from inside send
            await asyncio.sleep(0)
            assert failures[2] == f"control stream to {address} is closed"

    run(body())


def test_triggers_fail_at_once_when_too_many_commands_wait_to_be_written() -> None:
    """An agent that stops reading: gRPC's flow-control window fills, then the queue."""

    async def body() -> None:
        failures: list[str] = []
        async with serving(Agent(hold=True)) as (address, _):
            channel = grpc.aio.insecure_channel(address)
            stream = ControlStream(
                lambda: wgrpc.WorkerControlServiceStub(channel),
                address,
                timeout_s=30,
                log=LOG,
                max_queued=4,
            )
            big = wpb.TriggerTaskCheckpointRequest(job_id="j" * 20_000)
            for _ in range(1_000):  # 20 MB: far beyond any flow-control window
                stream.send(wpb.ControlCommand(trigger=big), failures.append)
                await asyncio.sleep(0)
            await wait_until_async(lambda: bool(failures), "a failure", timeout_s=10)
            assert "has 4 commands waiting to be written: the agent is not reading" in failures[0]
            await stream.close()
            await channel.close()

    run(body())


def test_an_agent_that_stops_ends_its_calls_and_the_next_command_opens_a_new_one() -> None:
    async def body() -> None:
        agent = Agent()
        async with serving(agent) as (address, _):
            clients = AgentClients(timeout_s=5, max_message_bytes=1 << 20)
            failed: list[tuple[ExecutionAttempt, int, str]] = []
            gateway = AgentGateway(JOB, clients, lambda: 1, lambda *a: failed.append(a), LOG)
            stream = clients.control(address)
            try:
                gateway.trigger({address: [SRC]}, 1, 100, OPTIONS)
                await gateway.drain()
                agent.control.close()  # what Agent.stop does before its server stops
                await wait_until_async(lambda: stream.open is False, "the call ended")
                gateway.trigger({address: [SRC]}, 2, 100, OPTIONS)
                await gateway.drain()
            finally:
                await clients.close()
        assert [r.checkpoint_id for _, r in agent.calls] == [1, 2]
        assert agent.streams == 2 and failed == []

    run(body())

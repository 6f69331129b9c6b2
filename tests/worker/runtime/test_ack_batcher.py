"""``AckBatcher`` (worker/runtime/ack_batcher.py) against a real gRPC server on 127.0.0.1.

The server answers ``AcknowledgeCheckpoints`` from a table keyed by checkpoint id and records
every call. Batches are cut by ``max_batch`` or by ``close()``; the linger timer is set far
beyond any test, so no test depends on timing. The held acks of tracked subtasks (the hold rule
itself: tests/worker/runtime/test_ack_hold.py) go with a zero linger; only lower bounds of
``held_ms`` are asserted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import grpc.aio
import pytest
from kit.channels import run

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.runtime.ack_batcher import AckBatcher, AckRejected

NEVER_S = 3_600.0  # a linger that never fires within a test


class FakeCoordinator:
    """Serves ``AcknowledgeCheckpoints`` only (the one method ``AckBatcher`` calls)."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        """Checkpoint ids of the acks of every call, in order."""
        self.held_ms: list[list[int]] = []
        """``held_ms`` of the acks of every call, in order."""
        self.outcomes: dict[int, cpb.AckOutcome] = {}
        self.fail_with: grpc.StatusCode | None = None

    async def AcknowledgeCheckpoints(
        self, request: cpb.AcknowledgeCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.AcknowledgeCheckpointsResponse:
        self.calls.append([a.checkpoint_id for a in request.acks])
        self.held_ms.append([a.held_ms for a in request.acks])
        if self.fail_with is not None:
            await context.abort(self.fail_with, "coordinator down")
        default = cpb.AckOutcome(result=cpb.ACK_RESULT_SUCCESS)
        return cpb.AcknowledgeCheckpointsResponse(
            outcomes=[self.outcomes.get(a.checkpoint_id, default) for a in request.acks]
        )


@asynccontextmanager
async def served(
    fake: FakeCoordinator,
    *,
    linger_s: float = NEVER_S,
    max_batch: int = 256,
    max_hold_s: float = NEVER_S,
) -> AsyncIterator[AckBatcher]:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        fake.AcknowledgeCheckpoints,
        request_deserializer=cpb.AcknowledgeCheckpointsRequest.FromString,
        response_serializer=cpb.AcknowledgeCheckpointsResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "snapflow.v1.CoordinatorService", {"AcknowledgeCheckpoints": handler}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield AckBatcher(
            cgrpc.CoordinatorServiceStub(channel), linger_s, max_batch, max_hold_s=max_hold_s
        )
    finally:
        await channel.close(grace=None)
        await server.stop(None)


JOB = "j" * 32


def ack(checkpoint_id: int, task: pb.TaskAttempt | None = None) -> cpb.AcknowledgeCheckpointRequest:
    return cpb.AcknowledgeCheckpointRequest(job_id=JOB, checkpoint_id=checkpoint_id, attempt=task)


SRC = pb.TaskAttempt(vertex_id="src", subtask_index=0, attempt=1)
SINK = pb.TaskAttempt(vertex_id="sink", subtask_index=0, attempt=1)


def running(batcher: AckBatcher, *tasks: pb.TaskAttempt) -> list[asyncio.Task[None]]:
    """Track ``tasks`` as running subtasks; their runners end when cancelled."""

    async def run_until_cancelled() -> None:
        await asyncio.Event().wait()

    runners = []
    for task in tasks:
        runner = asyncio.ensure_future(run_until_cancelled())
        batcher.track(JOB, task, runner)
        runners.append(runner)
    return runners


async def settle(turns: int = 20) -> None:
    """Loop turns: enough for a queued ack to reach the server if it were sent (a zero linger)."""
    for _ in range(turns):
        await asyncio.sleep(0.001)


def test_a_full_batch_is_one_call_and_each_caller_gets_its_own_result() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        fake.outcomes[2] = cpb.AckOutcome(result=cpb.ACK_RESULT_DUPLICATE)
        fake.outcomes[3] = cpb.AckOutcome(result=cpb.ACK_RESULT_DISCARDED)
        async with served(fake, max_batch=3) as batcher:
            results = await asyncio.gather(*(batcher.acknowledge(ack(i)) for i in (1, 2, 3)))
        assert results == [
            cpb.ACK_RESULT_SUCCESS,
            cpb.ACK_RESULT_DUPLICATE,
            cpb.ACK_RESULT_DISCARDED,
        ]
        assert fake.calls == [[1, 2, 3]]

    run(main())


def test_acks_beyond_max_batch_go_in_another_call() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, max_batch=2) as batcher:
            results = await asyncio.gather(*(batcher.acknowledge(ack(i)) for i in (1, 2, 3, 4)))
        assert results == [cpb.ACK_RESULT_SUCCESS] * 4
        # Both calls are in flight at once, so they may reach the server in either order.
        assert sorted(fake.calls) == [[1, 2], [3, 4]]

    run(main())


def test_a_rejected_ack_raises_for_its_own_caller_only() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        fake.outcomes[2] = cpb.AckOutcome(
            error_code=grpc.StatusCode.INVALID_ARGUMENT.value[0], error_message="bad path"
        )
        async with served(fake, max_batch=3) as batcher:
            results = await asyncio.gather(
                *(batcher.acknowledge(ack(i)) for i in (1, 2, 3)), return_exceptions=True
            )
        assert results[0] == cpb.ACK_RESULT_SUCCESS
        assert results[2] == cpb.ACK_RESULT_SUCCESS
        rejected = results[1]
        assert isinstance(rejected, AckRejected)
        assert rejected.code is grpc.StatusCode.INVALID_ARGUMENT
        assert str(rejected) == "INVALID_ARGUMENT: bad path"
        assert fake.calls == [[1, 2, 3]]

    run(main())


def test_an_unknown_status_code_is_rejected_as_unknown() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        fake.outcomes[1] = cpb.AckOutcome(error_code=999, error_message="?")
        async with served(fake, max_batch=1) as batcher:
            with pytest.raises(AckRejected) as caught:
                await batcher.acknowledge(ack(1))
        assert caught.value.code is grpc.StatusCode.UNKNOWN

    run(main())


def test_a_failed_call_fails_every_ack_of_its_batch() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        fake.fail_with = grpc.StatusCode.UNAVAILABLE
        async with served(fake, max_batch=2) as batcher:
            results = await asyncio.gather(
                *(batcher.acknowledge(ack(i)) for i in (1, 2)), return_exceptions=True
            )
        assert [type(r) for r in results] == [grpc.aio.AioRpcError] * 2
        assert all(
            isinstance(r, grpc.aio.AioRpcError) and r.code() is grpc.StatusCode.UNAVAILABLE
            for r in results
        )
        assert fake.calls == [[1, 2]]

    run(main())


def test_close_sends_the_partial_batch_and_waits_for_it() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, max_batch=10) as batcher:
            pending = [asyncio.ensure_future(batcher.acknowledge(ack(i))) for i in (1, 2)]
            await asyncio.sleep(0)  # one loop turn: both tasks queued their ack (no I/O yet)
            assert fake.calls == []
            await batcher.close()
            assert fake.calls == [[1, 2]]
            assert [await p for p in pending] == [cpb.ACK_RESULT_SUCCESS] * 2

    run(main())


def test_the_linger_timer_sends_a_lone_ack() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0) as batcher:
            assert await batcher.acknowledge(ack(5)) == cpb.ACK_RESULT_SUCCESS
        assert fake.calls == [[5]]

    run(main())


def test_an_ack_waits_for_its_running_peer_and_both_go_in_one_call() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0) as batcher:
            runners = running(batcher, SRC, SINK)
            first = asyncio.ensure_future(batcher.acknowledge(ack(1, SRC)))
            await settle()
            await asyncio.sleep(0.05)
            assert fake.calls == [] and not first.done()
            assert await batcher.acknowledge(ack(1, SINK)) == cpb.ACK_RESULT_SUCCESS
            assert await first == cpb.ACK_RESULT_SUCCESS
            for r in runners:
                r.cancel()
        assert fake.calls == [[1, 1]]
        [[held_src, held_sink]] = fake.held_ms
        assert held_src >= 50 and held_sink < held_src

    run(main())


def test_a_peer_whose_run_ends_releases_the_held_ack() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0) as batcher:
            _, sink = running(batcher, SRC, SINK)
            first = asyncio.ensure_future(batcher.acknowledge(ack(1, SRC)))
            await settle()
            assert fake.calls == []
            sink.cancel()
            assert await first == cpb.ACK_RESULT_SUCCESS
        assert fake.calls == [[1]]

    run(main())


def test_a_decline_of_the_peer_releases_the_held_ack() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0) as batcher:
            running(batcher, SRC, SINK)
            first = asyncio.ensure_future(batcher.acknowledge(ack(1, SRC)))
            await settle()
            assert fake.calls == []
            batcher.declined(JOB, SINK, 1)
            assert await first == cpb.ACK_RESULT_SUCCESS
        assert fake.calls == [[1]]

    run(main())


def test_the_bound_sends_a_held_ack_alone_and_says_how_long_it_was_held() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0, max_hold_s=0.05) as batcher:
            running(batcher, SRC, SINK)
            assert await batcher.acknowledge(ack(1, SRC)) == cpb.ACK_RESULT_SUCCESS
        assert fake.calls == [[1]]
        assert fake.held_ms[0][0] >= 50

    run(main())


def test_close_sends_held_acks_too() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0) as batcher:
            running(batcher, SRC, SINK)
            first = asyncio.ensure_future(batcher.acknowledge(ack(1, SRC)))
            await settle()
            assert fake.calls == []
            await batcher.close()
            assert fake.calls == [[1]]
            assert await first == cpb.ACK_RESULT_SUCCESS

    run(main())


def test_a_held_ack_whose_caller_was_cancelled_is_still_sent() -> None:
    async def main() -> None:
        fake = FakeCoordinator()
        async with served(fake, linger_s=0.0) as batcher:
            running(batcher, SRC, SINK)
            first = asyncio.ensure_future(batcher.acknowledge(ack(1, SRC)))
            await settle()
            first.cancel()  # the source's run ended and cancelled its asynchronous parts
            assert await batcher.acknowledge(ack(1, SINK)) == cpb.ACK_RESULT_SUCCESS
        assert fake.calls == [[1, 1]]

    run(main())

"""``AckBatcher`` (worker/runtime/ack_batcher.py) against a real gRPC server on 127.0.0.1.

The server answers ``AcknowledgeCheckpoints`` from a table keyed by checkpoint id and records
every call. Batches are cut by ``max_batch`` or by ``close()``; the linger timer is set far
beyond any test, so no test depends on timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import grpc.aio
import pytest
from kit.channels import run

from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.runtime.ack_batcher import AckBatcher, AckRejected

NEVER_S = 3_600.0  # a linger that never fires within a test


class FakeCoordinator:
    """Serves ``AcknowledgeCheckpoints`` only (the one method ``AckBatcher`` calls)."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        """Checkpoint ids of the acks of every call, in order."""
        self.outcomes: dict[int, cpb.AckOutcome] = {}
        self.fail_with: grpc.StatusCode | None = None

    async def AcknowledgeCheckpoints(
        self, request: cpb.AcknowledgeCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> cpb.AcknowledgeCheckpointsResponse:
        self.calls.append([a.checkpoint_id for a in request.acks])
        if self.fail_with is not None:
            await context.abort(self.fail_with, "coordinator down")
        default = cpb.AckOutcome(result=cpb.ACK_RESULT_SUCCESS)
        return cpb.AcknowledgeCheckpointsResponse(
            outcomes=[self.outcomes.get(a.checkpoint_id, default) for a in request.acks]
        )


@asynccontextmanager
async def served(
    fake: FakeCoordinator, *, linger_s: float = NEVER_S, max_batch: int = 256
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
        yield AckBatcher(cgrpc.CoordinatorServiceStub(channel), linger_s, max_batch)
    finally:
        await channel.close(grace=None)
        await server.stop(None)


def ack(checkpoint_id: int) -> cpb.AcknowledgeCheckpointRequest:
    return cpb.AcknowledgeCheckpointRequest(job_id="j" * 32, checkpoint_id=checkpoint_id)


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

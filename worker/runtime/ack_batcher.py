"""The task side's client of the coordinator: acks are coalesced per agent.

An agent hosts several subtasks whose snapshots often finish within the same millisecond (all
of them see the same barrier). ``AckBatcher`` sends the acks that are ready within ``linger_s``
in one ``AcknowledgeCheckpoints`` call (at most ``max_batch`` per call), so the coordinator
pays one RPC per agent and checkpoint instead of one per subtask. Each ack still gets its own
outcome; a rejected ack raises for its own caller only.
"""

from __future__ import annotations

import asyncio

import grpc

from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

DEFAULT_LINGER_S = 0.001
DEFAULT_MAX_BATCH = 256


class AckRejected(Exception):
    """The coordinator rejected one ack (bad path, unknown job, ...)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class AckBatcher:
    def __init__(
        self,
        stub: cgrpc.CoordinatorServiceAsyncStub,
        linger_s: float = DEFAULT_LINGER_S,
        max_batch: int = DEFAULT_MAX_BATCH,
        timeout_s: float = 10.0,
    ) -> None:
        self.stub = stub
        self.linger_s = linger_s
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self._batch: list[tuple[cpb.AcknowledgeCheckpointRequest, asyncio.Future[int]]] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._inflight: set[asyncio.Task[None]] = set()

    async def acknowledge(self, request: cpb.AcknowledgeCheckpointRequest) -> int:
        """Queue one ack; returns its ``AckResult`` value once the batch is answered."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._batch.append((request, future))
        if len(self._batch) >= self.max_batch:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_later(self.linger_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        batch, self._batch = self._batch, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _send(
        self, batch: list[tuple[cpb.AcknowledgeCheckpointRequest, asyncio.Future[int]]]
    ) -> None:
        try:
            response = await self.stub.AcknowledgeCheckpoints(
                cpb.AcknowledgeCheckpointsRequest(acks=[r for r, _ in batch]),
                timeout=self.timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, future), outcome in zip(batch, response.outcomes, strict=True):
            if future.done():
                continue
            if outcome.error_code:
                future.set_exception(
                    AckRejected(
                        _CODES.get(outcome.error_code, grpc.StatusCode.UNKNOWN),
                        outcome.error_message,
                    )
                )
            else:
                future.set_result(outcome.result)

    async def close(self) -> None:
        self._flush()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

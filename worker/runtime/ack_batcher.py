"""The task side's client of the coordinator: acks are coalesced per agent.

An agent hosts several subtasks whose acks of one checkpoint arrive together or up to tens of
milliseconds apart (a source acks at the trigger, a downstream subtask once its barriers
arrived). ``AckBatcher`` holds the ack of a checkpoint while another running subtask of the
same job hosted here still has to answer it (the rule and why it never delays a checkpoint's
completion: ``ack_hold``), then sends the acks that are ready within ``linger_s`` in one
``AcknowledgeCheckpoints`` call (at most ``max_batch`` per call), so the coordinator pays one
RPC per agent and checkpoint instead of one per subtask. Each ack says how long it was held
(``held_ms``), so the coordinator's ack times stay those of the snapshots. Each ack still gets
its own outcome; a rejected ack raises for its own caller only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import structlog

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.runtime.ack_hold import MAX_HOLD_S, AckHold, SubtaskKey

log = structlog.get_logger("snapflow.worker")

DEFAULT_LINGER_S = 0.001
DEFAULT_MAX_BATCH = 256


class AckRejected(Exception):
    """The coordinator rejected one ack (bad path, unknown job, ...)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _key(attempt: pb.TaskAttempt) -> SubtaskKey:
    return (attempt.vertex_id, attempt.subtask_index, attempt.attempt)


@dataclass
class _Ack:
    request: cpb.AcknowledgeCheckpointRequest
    future: asyncio.Future[int]
    ready: float
    """``loop.time()`` when the subtask handed it over."""


class AckBatcher:
    def __init__(
        self,
        stub: cgrpc.CoordinatorServiceAsyncStub,
        linger_s: float = DEFAULT_LINGER_S,
        max_batch: int = DEFAULT_MAX_BATCH,
        timeout_s: float = 10.0,
        max_hold_s: float = MAX_HOLD_S,
    ) -> None:
        self.stub = stub
        self.linger_s = linger_s
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self._hold: AckHold[_Ack] = AckHold(max_hold_s)
        self._expiry: asyncio.TimerHandle | None = None
        self._batch: list[_Ack] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._inflight: set[asyncio.Task[None]] = set()

    # --- the subtasks whose acks are held for each other ---------------------------------------

    def track(self, job_id: str, attempt: pb.TaskAttempt, runner: asyncio.Task[None]) -> None:
        """``attempt`` runs as ``runner``: its peers' acks wait for its own until the runner is
        done (finished, failed or cancelled). Acks of untracked subtasks are never held."""
        key = _key(attempt)
        self._hold.start(job_id, key)
        runner.add_done_callback(lambda _: self._send_now(self._hold.end(job_id, key)))

    def declined(self, job_id: str, attempt: pb.TaskAttempt, checkpoint_id: int) -> None:
        """``attempt`` declined ``checkpoint_id``: its peers' acks of it need not wait."""
        self._send_now(self._hold.decline(job_id, _key(attempt), checkpoint_id))

    def aborted(self, job_id: str, checkpoint_id: int) -> None:
        """The coordinator aborted ``checkpoint_id``: the acks held for it go now."""
        self._send_now(self._hold.aborted(job_id, checkpoint_id))

    # --- acks --------------------------------------------------------------------------------

    async def acknowledge(self, request: cpb.AcknowledgeCheckpointRequest) -> int:
        """Queue one ack; returns its ``AckResult`` value once its batch is answered."""
        loop = asyncio.get_running_loop()
        ack = _Ack(request, loop.create_future(), loop.time())
        self._send_now(
            self._hold.ack(
                request.job_id, _key(request.attempt), request.checkpoint_id, ack, ack.ready
            )
        )
        return await ack.future

    def _send_now(self, acks: list[_Ack]) -> None:
        """Into the batch: sent once ``max_batch`` are in it or after ``linger_s``."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for ack in acks:
            ack.request.held_ms = max(0, round((now - ack.ready) * 1000))
            self._batch.append(ack)
            if len(self._batch) >= self.max_batch:
                self._flush()
        if self._batch and self._flush_handle is None:
            self._flush_handle = loop.call_later(self.linger_s, self._flush)
        self._arm_expiry(loop)

    def _arm_expiry(self, loop: asyncio.AbstractEventLoop) -> None:
        deadline = self._hold.next_deadline()
        if self._expiry is not None and (deadline is None or self._expiry.when() != deadline):
            self._expiry.cancel()
            self._expiry = None
        if deadline is not None and self._expiry is None:
            self._expiry = loop.call_at(deadline, self._expire, deadline)

    def _expire(self, deadline: float) -> None:
        # The loop runs a timer up to its clock resolution early: the deadline has come.
        self._expiry = None
        expired = self._hold.expire(max(deadline, asyncio.get_running_loop().time()))
        if expired:
            # A subtask that never answered: the hold rule guessed wrong (docs/worker.md).
            log.info(
                "checkpoint.ack_hold_expired",
                checkpoint_ids=sorted({a.request.checkpoint_id for a in expired}),
                acks=len(expired),
            )
        self._send_now(expired)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        batch, self._batch = self._batch, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _send(self, batch: list[_Ack]) -> None:
        try:
            response = await self.stub.AcknowledgeCheckpoints(
                cpb.AcknowledgeCheckpointsRequest(acks=[a.request for a in batch]),
                timeout=self.timeout_s,
            )
        except grpc.aio.AioRpcError as e:
            for ack in batch:
                if not ack.future.done():
                    ack.future.set_exception(e)
            return
        for ack, outcome in zip(batch, response.outcomes, strict=True):
            if ack.future.done():
                continue
            if outcome.error_code:
                ack.future.set_exception(
                    AckRejected(
                        _CODES.get(outcome.error_code, grpc.StatusCode.UNKNOWN),
                        outcome.error_message,
                    )
                )
            else:
                ack.future.set_result(outcome.result)

    async def close(self) -> None:
        """Send everything, held acks included, and wait for the answers."""
        self._send_now(self._hold.release_all())
        self._flush()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

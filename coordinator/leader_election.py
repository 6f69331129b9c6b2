"""The Redis shell of the leader election (``coordinator.leadership`` is its pure core), and
the gate that makes a standby refuse coordinator RPCs.

``LeaderElector`` feeds the core with the clock and the answers of the lease scripts
(``CheckpointStore.try_acquire_lease`` / ``renew_lease`` / ``release_lease``) and executes its
actions: ``Lead`` and ``StepDown`` are callbacks of the coordinator process
(``coordinator.server``). One acquire or renew request is outstanding at a time, bounded by
one renew interval; the step-down deadline is a timer of its own, so a hung Redis call cannot
keep a leader acting past it.

``LeaderGate`` is a server interceptor: while this coordinator is not the serving leader,
every ``CoordinatorService`` call is answered ``UNAVAILABLE`` with a message naming the
leader and the trailing metadata ``snapflow-leader: host:port`` (when known) and
``snapflow-role: standby``; clients (``snapflow.leader_channel``) follow it. Health and
reflection stay open.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, assert_never

import grpc
import structlog

from snapflow.coordinator.leadership import (
    Action,
    Lead,
    LeaderElection,
    LeadershipRole,
    LeaseTiming,
    Release,
    Renew,
    StepDown,
    TryAcquire,
)
from snapflow.coordinator.redis_store import CheckpointStore, LeaseAnswer
from snapflow.errors import SnapflowError
from snapflow.leader_channel import LEADER_METADATA_KEY, ROLE_METADATA_KEY, STANDBY_ROLE

log = structlog.get_logger("snapflow.coordinator")

__all__ = ["LeaderElector", "LeaderGate"]


class LeaderElector:
    """Runs the election of one coordinator process against Redis.

    ``on_lead(epoch)``: start leading (awaited in a task of its own; cancelled by a step-down);
    ``on_step_down(epoch, reason)``: stop acting at once (synchronous)."""

    def __init__(
        self,
        store: CheckpointStore,
        timing: LeaseTiming,
        address: str,
        on_lead: Callable[[int], Awaitable[None]],
        on_step_down: Callable[[int, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.timing = timing
        self.address = address
        self.candidate = uuid.uuid4().hex
        """This process's identity in the lease (a restarted process is a new candidate)."""
        self.clock = clock
        self.election = LeaderElection(timing, address, clock())
        self._on_lead = on_lead
        self._on_step_down = on_step_down
        self._request: asyncio.Task[tuple[str, LeaseAnswer]] | None = None
        self._leading: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._first_round = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the election; returns once the first attempt was answered and, if it won,
        the coordinator leads (or gave up trying)."""
        self._loop_task = asyncio.create_task(self._run(), name="leader-election")
        waiter = asyncio.create_task(self._first_round.wait())
        await asyncio.wait({waiter, self._loop_task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._loop_task.done():
            self._loop_task.result()  # raises what ended the loop
        if self._leading is not None:
            await asyncio.gather(asyncio.shield(self._leading), return_exceptions=True)

    async def stop(self, before_release: Callable[[], Awaitable[None]] | None = None) -> None:
        """Step down, await ``before_release`` (the coordinator closes its jobs while the
        lease is still held), release the lease (bounded by one renew interval) and stop."""
        actions = self.election.stop(self.clock())
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for task in [t for t in (self._request, self._leading) if t is not None]:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._request = self._leading = None
        self._execute([a for a in actions if not isinstance(a, Release)])
        if before_release is not None:
            await before_release()
        for action in actions:
            if isinstance(action, Release):
                await self._release(action.epoch)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # --- events from the coordinator -------------------------------------------------------------

    def superseded(self, reason: str) -> None:
        """A fenced write found a newer epoch: step down."""
        self._execute(self.election.superseded(self.clock(), reason))
        self._wake.set()

    def resign(self, reason: str) -> None:
        """Leading failed (the recovery of the jobs): step down and release the lease."""
        self._execute(self.election.resign(self.clock(), reason))
        self._wake.set()

    # --- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._execute(self.election.tick(self.clock()))
        while True:
            wake = self.election.next_wakeup()
            timeout = None if wake is None else max(0.0, wake - self.clock())
            waiting: set[asyncio.Future[Any]] = {asyncio.ensure_future(self._wake.wait())}
            if self._request is not None:
                waiting.add(self._request)
            try:
                await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiting:
                    if w is not self._request:
                        w.cancel()
            self._wake.clear()
            request = self._request
            if request is not None and request.done():
                self._request = None
                self._execute(self._answer(request))
                if self._leading is None:
                    self._first_round.set()
            self._execute(self.election.tick(self.clock()))

    def _answer(self, request: asyncio.Task[tuple[str, LeaseAnswer]]) -> list[Action]:
        now = self.clock()
        try:
            kind, answer = request.result()
        except (SnapflowError, TimeoutError, OSError) as e:
            log.warning("coordinator.lease_request_failed", error=f"{type(e).__name__}: {e}")
            return self.election.failed(now, f"{type(e).__name__}: {e}")
        if kind == "acquire":
            if answer.ok:
                return self.election.acquired(now, answer.epoch)
            if answer.address != self.election.leader_address:
                log.info("coordinator.standby", leader=answer.address, epoch=answer.epoch)
            return self.election.held_by(now, answer.address, answer.epoch)
        if answer.ok:
            return self.election.renewed(now)
        return self.election.lost(now, answer.address, answer.epoch)

    # --- actions ---------------------------------------------------------------------------------

    def _execute(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, TryAcquire):
                self._request = asyncio.create_task(self._acquire(), name="lease-acquire")
            elif isinstance(action, Renew):
                self._request = asyncio.create_task(self._renew(action.epoch), name="lease-renew")
            elif isinstance(action, Lead):
                log.info("coordinator.leader_elected", epoch=action.epoch, address=self.address)
                self._leading = asyncio.create_task(self._lead(action.epoch), name="leading")
            elif isinstance(action, StepDown):
                if self._leading is not None and not self._leading.done():
                    self._leading.cancel()
                self._leading = None
                stopping = self.election.role is LeadershipRole.STOPPED
                (log.info if stopping else log.error)(
                    "coordinator.stepped_down", epoch=action.epoch, reason=action.reason
                )
                self._on_step_down(action.epoch, action.reason)
            elif isinstance(action, Release):
                self._spawn(self._release(action.epoch))
            else:
                assert_never(action)

    async def _acquire(self) -> tuple[str, LeaseAnswer]:
        async with asyncio.timeout(self.timing.renew_interval_s):
            answer = await self.store.try_acquire_lease(
                self.candidate, self.address, self.timing.ttl_ms
            )
        return "acquire", answer

    async def _renew(self, epoch: int) -> tuple[str, LeaseAnswer]:
        async with asyncio.timeout(self.timing.renew_interval_s):
            answer = await self.store.renew_lease(self.candidate, epoch, self.timing.ttl_ms)
        return "renew", answer

    async def _lead(self, epoch: int) -> None:
        try:
            await self._on_lead(epoch)
        except Exception as e:
            # A leader that holds the lease must serve: had this task died silently, the
            # election would renew the lease forever while the gate refuses every call.
            log.exception("coordinator.leading_failed", epoch=epoch, error=str(e)[:500])
            if self.election.is_leader and self.election.epoch == epoch:
                self.resign(f"leading epoch {epoch} failed: {type(e).__name__}: {e}")
        finally:
            self._first_round.set()

    async def _release(self, epoch: int) -> None:
        with contextlib.suppress(SnapflowError, TimeoutError, OSError):
            async with asyncio.timeout(self.timing.renew_interval_s):
                if await self.store.release_lease(self.candidate, epoch):
                    log.info("coordinator.lease_released", epoch=epoch)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses the calls of one service while this coordinator is not the serving leader."""

    def __init__(self, service_name: str, own_address: str = "") -> None:
        self.prefix = f"/{service_name}/"
        self.own_address = own_address
        self.serving = False
        """Leading and recovered: calls pass."""
        self.hint: Callable[[], tuple[str, int]] = lambda: ("", 0)
        """The leader's address ("" unknown; this coordinator's own while it recovers) and
        epoch, as the election last saw them."""

    def refusal(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The status message and trailing metadata of a refused call."""
        metadata: list[tuple[str, str]] = [(ROLE_METADATA_KEY, STANDBY_ROLE)]
        leader, epoch = self.hint()
        if leader == self.own_address:
            message = (
                f"this coordinator ({self.own_address}) won the leader election (epoch "
                f"{epoch}) and is recovering its jobs: retry shortly"
            )
        elif leader:
            message = (
                f"this coordinator ({self.own_address}) is a standby; the leader is "
                f"{leader} (epoch {epoch}): call it instead"
            )
        else:
            message = (
                f"this coordinator ({self.own_address}) is a standby and no leader is known "
                f"(an election is under way): retry shortly"
            )
        if leader:
            metadata.append((LEADER_METADATA_KEY, leader))
        return message, tuple(metadata)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method or "")
        if self.serving or handler is None or not method.startswith(self.prefix):
            return handler
        message, metadata = self.refusal()

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message, metadata)

        async def refuse_stream(
            request: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message, metadata)
            yield  # pragma: no cover - abort raises

        # Requests are not even decoded (raw bytes): a standby looks at nothing.
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse_stream)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse_stream)
        return grpc.unary_unary_rpc_method_handler(refuse)

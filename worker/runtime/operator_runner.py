"""Where a subtask's user code runs: on its task thread, or on the agent's loop in steps, moving
to a task thread once its calls block (docs/worker.md, "Where user code runs").

Calls (``call``, ``process``) run in order and are awaited by the task's loop, so operators
never run concurrently with each other or with a snapshot's synchronous part. Notices
(``post``) run between two calls, as Flink runs ``notifyCheckpointComplete`` as a mail; a
notice that fails is logged and does not stop the ones after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
import structlog

from snapflow.worker.runtime.busy_time import BusyTimeMeter
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.mailbox import TaskThread
from snapflow.worker.runtime.placement import Placement, PlacementSettings

T = TypeVar("T")

LOOP_SLICE_S = 0.005
"""Operators on the loop: the longest a batch runs before the task gives the loop a turn, at
the operator's next step (``Operator.process_batch_steps``). The interpreter's switch interval,
the longest a task thread would hold the loop off with Python code too."""
CLOSE_TIMEOUT_S = 10.0
"""How long a finishing or cancelled task waits for its task thread to close the operators (a
user function stuck forever must not keep the agent from going on)."""

Posted = tuple[Callable[..., Any], tuple[Any, ...]]


class OperatorRunner:
    """Runs one subtask's operator calls where they belong."""

    def __init__(
        self,
        name: str,
        log: structlog.stdlib.BoundLogger,
        *,
        task_thread: bool,
        placement: PlacementSettings | None,
        accepts_notices: Callable[[], bool],
        meter: BusyTimeMeter | None = None,
    ) -> None:
        self.name = name
        self.meter = meter or BusyTimeMeter()
        """Counts the time of every call as busy (the task's ``BusyTimeMeter``)."""
        self._log = log
        self.thread: TaskThread | None = TaskThread(name) if task_thread else None
        """Where operators run (``snapflow.worker.runtime.mailbox``); None: on the loop. A bare
        ``Subtask`` runs them on the loop; agents pass ``DataplaneSettings.task_thread``, which
        is on by default."""
        self._placement: Placement | None = (
            Placement(placement) if placement is not None and not task_thread else None
        )
        """Operators on the loop move to a task thread once their calls block
        (``worker/runtime/placement.py``); None: they stay where ``task_thread`` put them."""
        self._accepts_notices = accepts_notices
        self.deferred: list[Posted] | None = None
        """Notices posted while a batch is between two steps on the loop (``post``)."""

    @property
    def adaptive(self) -> bool:
        return self._placement is not None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run operator code on the task thread (in order, after posted notices) and wait for
        it; the agent's loop stays free meanwhile. On the loop: here and now."""
        with self.meter.busy:
            if self.thread is None:
                return fn(*args)
            return await self.thread.call(fn, *args)

    def call_measured(self, fn: Callable[..., T], *args: Any) -> T:
        """On the loop: ``fn(*args)`` timed, for the placement to decide on (not counted as
        busy here: the caller's own measure covers it, ``SourceLoop._poll``)."""
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return fn(*args)
        finally:
            self._measured(time.perf_counter_ns() - started, time.thread_time_ns() - cpu_started)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """A notice for the operators, run between two calls; dropped once the task closes."""
        if not self._accepts_notices():
            return  # closed and disposed, or about to be: nothing more reaches the operators
        if self.thread is not None:
            self.thread.post(fn, *args)
        elif self.deferred is not None:
            self.deferred.append((fn, args))  # a batch is between two steps: after it
        else:
            self._run_posted(fn, args)

    async def process(
        self, chain: Chain, batch: pa.RecordBatch, input_index: int = 0
    ) -> list[pa.RecordBatch]:
        """``batch`` of logical input ``input_index`` through ``chain`` where the operators
        run."""
        if self.thread is None:
            with self.meter.busy:
                out = await self._process_in_steps(chain, batch, input_index)
            # Operators ran on the loop: give it a turn after every batch, as a source does
            # after every poll. The gate returns buffered frames without waiting, so without
            # this a backlogged task would process all of them in one turn of the loop, and
            # triggers, credits, acks and heartbeats would wait.
            await asyncio.sleep(0)
            return out
        with self.meter.busy:
            return await self.thread.call(chain.process_batch, batch, input_index)

    async def close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (close the operators, dispose the state) where the operators run, then
        end the thread. A notice posted before cannot run concurrently with it. If user code
        does not return within ``CLOSE_TIMEOUT_S``, ``fn`` is left running under it (logged)."""
        thread = self.thread
        if thread is None:
            fn()
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await thread.call(fn)
        except TimeoutError:
            self._log.warning("task.close_timed_out", timeout_s=CLOSE_TIMEOUT_S)
        finally:
            thread.close()

    async def open(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (open the operators) on the task thread when there is one (so ``open``
        runs on the thread of every later call, as Flink opens operators on the task thread,
        and a large restore does not hold up the loop), else here. A cancelled caller first
        waits for ``fn`` to end on the thread (at most ``CLOSE_TIMEOUT_S``), so that no
        ``open`` runs on after its deployment was given up."""
        if self.thread is None:
            fn()
            return
        opening = asyncio.ensure_future(self.thread.call(fn))
        try:
            await asyncio.shield(opening)
        except BaseException:
            if not opening.done():
                with contextlib.suppress(BaseException):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(opening)
            raise

    def _run_posted(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """A notice on the loop: a failure is logged, as the task thread logs it
        (``TaskThread.post``); it neither fails the task nor stops the notices after it."""
        try:
            fn(*args)
        except Exception as e:
            self._log.warning("task.posted_call_failed", error=repr(e))

    async def _process_in_steps(
        self, chain: Chain, batch: pa.RecordBatch, input_index: int
    ) -> list[pa.RecordBatch]:
        """Operators on the loop: run ``batch`` through the chain, giving the loop a turn at
        the first step after every ``LOOP_SLICE_S``. Meanwhile only other coroutines run; this
        task's mailbox waits, so no snapshot splits the batch, and notices posted meanwhile
        run after it (as on the task thread, between two calls)."""
        steps = chain.process_batch_steps(batch, input_index)
        deferred: list[Posted] = []
        self.deferred = deferred
        wall_ns = cpu_ns = 0
        slice_ns = int(LOOP_SLICE_S * 1e9)
        try:
            turn_at = time.perf_counter_ns() + slice_ns
            while True:
                started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
                try:
                    next(steps)
                except StopIteration as done:
                    out: list[pa.RecordBatch] = done.value
                    return out
                finally:
                    now = time.perf_counter_ns()
                    wall_ns += now - started
                    cpu_ns += time.thread_time_ns() - cpu_started
                if now >= turn_at:
                    await asyncio.sleep(0)
                    turn_at = time.perf_counter_ns() + slice_ns
        finally:
            steps.close()  # a batch cut short (an error, a cancellation) ends its generator now
            self.deferred = None
            for fn, args in deferred:
                self._run_posted(fn, args)
            self._measured(wall_ns, cpu_ns)

    def _measured(self, wall_ns: int, cpu_ns: int) -> None:
        """A call of operators on the loop took this long: move them to a task thread when
        their calls block (``Placement``)."""
        if self._placement is None or self.thread is not None:
            return
        move = self._placement.on_call(wall_ns, cpu_ns)
        if move is not None:
            self.thread = TaskThread(self.name)
            self._log.info(
                "task.moved_to_thread",
                calls=move.calls,
                wall_ms=round(move.wall_ms, 1),
                blocked_ms=round(move.blocked_ms, 1),
            )

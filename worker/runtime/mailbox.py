"""The task thread: where a subtask's user code runs, one call at a time, in order (the
execution side of Flink's ``MailboxProcessor``).

An agent runs every subtask's control on one asyncio loop: the gRPC servers (checkpoint
triggers, completion notices, the data exchange), the heartbeats, the acks, the channels, and
each subtask's driving coroutine. User code (operators, functions, sinks) does not run there:
each subtask hands it to its own :class:`TaskThread`, so a record function that takes 100 ms
per batch, or a sink that blocks on I/O, never holds up a trigger, a barrier, a credit or a
heartbeat of any task in the agent.

The subtask's coroutine is the mailbox loop: it takes the next input (a frame, a source poll)
and awaits the task thread's work on it; between two such calls it executes what is in its
mailbox (a checkpoint trigger, a priority barrier, a cancel marker: "checkpoint actions are
handled between batches"). Since the coroutine awaits every call it makes, operators never
run concurrently with the snapshot's synchronous part, which also runs here, in order.
Completion and abort notices arrive on the loop and are *posted*: they run on the task thread
between two calls, as Flink runs ``notifyCheckpointComplete`` as a mail.

Why a thread of our own instead of ``concurrent.futures.ThreadPoolExecutor(max_workers=1)``:
the executor's thread is joined at interpreter exit, so one user function stuck forever would
keep a cancelled worker process alive; this thread is a daemon. Everything else is the same
FIFO hand-off.

The GIL: Python code of a record function holds it; the loop thread gets it back at the
interpreter's switch interval (5 ms) at the latest, so control stays responsive within
milliseconds. Arrow and numpy kernels release it, so vectorised operators and the loop's
network I/O overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("snapflow.worker")

T = TypeVar("T")

_STOP = object()


def _resolve(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return  # the caller was cancelled meanwhile
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class TaskThread:
    """One daemon thread running calls in submission order; started on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.busy_ns = 0
        """Time spent running calls (monotonic nanoseconds)."""

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"task {self.name}", daemon=True)
            self._thread.start()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the task thread after everything submitted before; its result
        or exception. Cancelling the caller does not stop a call that already started."""
        if self._closed:
            raise RuntimeError(f"task thread {self.name} is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._start()
        self._queue.put((fn, args, loop, fut))
        return await fut

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the task thread after everything submitted before, without
        waiting; an exception is logged."""
        if self._closed:
            return
        self._start()
        self._queue.put((fn, args, None, None))

    def close(self) -> None:
        """No more calls; the thread ends after the calls already submitted."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)

    @property
    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            fn, args, loop, fut = item
            started = time.monotonic_ns()
            value: Any = None
            error: BaseException | None = None
            try:
                value = fn(*args)
            except BaseException as e:  # handed to the caller, like any result
                error = e
            self.busy_ns += time.monotonic_ns() - started
            if fut is None:
                if error is not None:
                    log.warning("task.posted_call_failed", task=self.name, error=repr(error))
                continue
            # a closed loop (RuntimeError) has nobody waiting any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, fut, value, error)

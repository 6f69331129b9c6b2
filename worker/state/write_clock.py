"""Where a snapshot's writing spends its time: serialising state (into memory), and writing
it durably. Measured per thread, only while a clock is started on it (the asynchronous part of a
subtask's snapshot starts one; see ``worker/runtime/snapshot_writer.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_local = threading.local()


@dataclass
class WriteClock:
    """Seconds spent by one thread in each step of writing a snapshot."""

    serialise_s: float = 0.0
    """Pickling state sections and encoding Arrow IPC (holds the GIL)."""
    durable_s: float = 0.0
    """fsync, rename and the directory's fsync; an object store's PUT."""


def current() -> WriteClock | None:
    """The clock started on this thread, if any."""
    clock: WriteClock | None = getattr(_local, "clock", None)
    return clock


@contextmanager
def started(clock: WriteClock) -> Iterator[WriteClock]:
    """Measure this thread's writing into ``clock`` while the block runs."""
    _local.clock = clock
    try:
        yield clock
    finally:
        _local.clock = None


class timing:  # lower case: used as ``with timing(step):``, like the function it was
    """Add the block's duration to ``step`` (a field of :class:`WriteClock`) of this thread's
    clock; nothing without one. A class, not a generator: it wraps every key group's section
    of a snapshot (hundreds per checkpoint), where ``contextlib``'s machinery cost more than
    the timing."""

    __slots__ = ("_clock", "_start", "_step")

    def __init__(self, step: str) -> None:
        self._step = step
        self._clock = current()
        self._start = 0.0

    def __enter__(self) -> None:
        if self._clock is not None:
            self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        clock = self._clock
        if clock is not None:
            step = self._step
            setattr(clock, step, getattr(clock, step) + time.perf_counter() - self._start)

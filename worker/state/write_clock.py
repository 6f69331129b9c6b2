"""Where a snapshot's writing spends its time: serialising state, writing bytes, making them
durable. Measured per thread, only while a clock is started on it (the asynchronous part of a
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
    write_s: float = 0.0
    """Handing bytes to the file system or building an object's body."""
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


@contextmanager
def timing(step: str) -> Iterator[None]:
    """Add the block's duration to ``step`` (a field of :class:`WriteClock`) of this thread's
    clock; nothing without one."""
    clock = current()
    if clock is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(clock, step, getattr(clock, step) + time.perf_counter() - start)

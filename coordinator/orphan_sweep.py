"""When one job's orphan sweep runs: at recovery, every ``orphan_sweep_interval_s``, and soon
after a clean-up that could not run.

What a sweep deletes, and how it is fenced and bounded, is ``CheckpointIo.sweep``
(docs/coordinator.md, "Orphan sweep"). Periodic and retried sweeps go through the job's I/O
queue, so they run in order with everything else. A failed clean-up (Redis or storage
unavailable, a late writer) asks for a sweep after a back-off: 1 s, doubling up to the sweep
interval (60 s when periodic sweeps are off); a sweep that runs resets the back-off.
"""

from __future__ import annotations

import asyncio
import contextlib

from snapflow.coordinator.checkpoint_io import CheckpointIo, Fencing, SweepOrphans
from snapflow.coordinator.config import CoordinatorSettings

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
"""The longest back-off when periodic sweeps are off (``orphan_sweep_interval_s`` 0)."""


class OrphanSweeper:
    """The orphan sweeps of one job: one now, the periodic loop, and retries after failures."""

    def __init__(self, io: CheckpointIo, settings: CoordinatorSettings, fencing: Fencing) -> None:
        self._io = io
        self._settings = settings
        self._fencing = fencing
        self._now = asyncio.Event()
        self._retry_s = RETRY_FIRST_S
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    async def sweep_now(self) -> list[int]:
        """One bounded, fenced sweep at once, outside the queue (at recovery, before the job's
        runner starts); the ids swept."""
        return await self._io.sweep(self._settings.orphan_sweep_max_deletes)

    def request(self) -> None:
        """A clean-up failed: sweep again after the back-off, not only at the next interval."""
        if self._retry is not None or self._closed:
            return
        delay = self._retry_s
        self._retry_s = min(delay * 2, self._settings.orphan_sweep_interval_s or RETRY_MAX_S)

        def wake() -> None:
            self._retry = None
            self._now.set()

        self._retry = asyncio.get_running_loop().call_later(delay, wake)

    async def run(self) -> None:
        """The periodic sweep (none with interval 0), and earlier after a failed clean-up."""
        while not self._closed and not self._fencing.fenced:
            interval = self._settings.orphan_sweep_interval_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval if interval > 0 else None):
                    await self._now.wait()
            self._now.clear()
            if self._closed or self._fencing.fenced:
                return
            self._io.submit(SweepOrphans(self._settings.orphan_sweep_max_deletes))
            await self._io.join()
            if self._retry is None:  # it ran: the next failure backs off from 1 s again
                self._retry_s = RETRY_FIRST_S

    def close(self) -> None:
        """No more sweeps are asked for; a pending retry is dropped."""
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()

"""How one subtask spends its time: busy in operator calls, or backpressured, waiting for
output credit (the consumers' buffers are full), as milliseconds per second of a reporting
period (the names of Flink's ``busyTimeMsPerSecond`` and ``backPressuredTimeMsPerSecond``).

Flink derives busy time as what is neither idle nor backpressured; here both are measured
directly where they happen (``OperatorRunner`` around operator calls, ``TaskOutput`` while sends
wait for credit, the source loop while it waits for room before a poll), so the rest of the
second is idle or the task's own work (barriers, channel bookkeeping).

The phases may nest: a task waiting for credit serves its mailbox, and a snapshot taken there
calls the operators. A moment counts once, as busy if any busy phase is open, else as
backpressured, so the two never add up to more than the period. Everything runs on the task's
event loop (operator calls on a task thread are timed by the loop side that awaits them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from snapflow.task_metrics import MS_PER_SECOND

_NS_PER_MS = 1_000_000


class _Phase:
    """A reusable context manager: one open phase of its kind per ``with``."""

    def __init__(self, meter: BusyTimeMeter, busy: bool) -> None:
        self._meter = meter
        self._busy = busy

    def __enter__(self) -> None:
        self._meter._enter(self._busy)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._meter._exit(self._busy)


class BusyTimeMeter:
    """Busy and backpressured time of one subtask since the last ``sample``."""

    def __init__(self, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._since_ns = clock_ns()
        """The last change of what the time counts as."""
        self._period_start_ns = self._since_ns
        self._open = [0, 0]  # backpressured, busy phases open (indexed by ``busy``)
        self._spent_ns = [0, 0]
        self.busy = _Phase(self, True)
        """``with meter.busy:`` around an operator call."""
        self.backpressured = _Phase(self, False)
        """``with meter.backpressured:`` around a wait for output credit."""

    def sample(self) -> tuple[float, float, int]:
        """Busy and backpressured milliseconds per second since the previous sample (or the
        start), and that period in milliseconds; starts the next period."""
        self._account()
        period_ns = self._since_ns - self._period_start_ns
        backpressured_ns, busy_ns = self._spent_ns
        self._spent_ns = [0, 0]
        self._period_start_ns = self._since_ns
        if period_ns <= 0:
            return 0.0, 0.0, 0
        per_second = MS_PER_SECOND / period_ns
        return busy_ns * per_second, backpressured_ns * per_second, period_ns // _NS_PER_MS

    def _enter(self, busy: bool) -> None:
        self._account()
        self._open[busy] += 1

    def _exit(self, busy: bool) -> None:
        self._account()
        self._open[busy] -= 1

    def _account(self) -> None:
        now = self._clock_ns()
        if self._open[True]:
            self._spent_ns[True] += now - self._since_ns
        elif self._open[False]:
            self._spent_ns[False] += now - self._since_ns
        self._since_ns = now

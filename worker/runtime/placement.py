"""Where a subtask's operators run: on its agent's loop, or on a task thread of their own
(``worker/runtime/mailbox.py``). A pure core: measured calls in, a move out.

Operators run on a task thread by default (``DataplaneSettings.task_thread``). With
``task_thread=False`` they run on the agent's loop, where a CPU-bound function runs a batch in
steps and gives the loop a turn every ``LOOP_SLICE_S`` (5 ms, ``worker/runtime/task.py``). Code
that blocks cannot be stepped: a sink sleeping 10 ms per batch would hold the whole loop for
10 ms. So on the loop, operators move to a task thread once their calls are found to block:
over two windows of calls in a row (16 calls, or fewer once they took 20 ms), the wall time
exceeds the calling thread's CPU time by a large share and by milliseconds per call.

The move is one way: operators that blocked once may block again, and moving back and forth
would reorder nothing but cost a decision per window for no gain. It happens between two
calls (the subtask's coroutine is the only caller), so no call runs on both. User code may
therefore run on two threads in its life: ``open`` and its first calls on the loop's, the
rest on the task thread; an operator that needs one thread for everything (a resource tied
to the thread that made it) runs with ``task_thread``, or without ``adaptive_task_thread``.

Time is measured by the shell (``time.perf_counter_ns`` and ``time.thread_time_ns`` around each
call on the loop thread) and handed in; CPU time that another process or thread took (a loaded
machine, GIL waits) also shows as wall time without CPU time, hence the high thresholds and
two windows in a row: a CPU-bound function on a machine loaded two-fold still gets about half
its wall time as CPU (50 % off it, against the 75 % that moves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from snapflow.errors import InvalidArgumentError


class _MayRunOnLoop(Protocol):
    def runs_on_loop(self) -> bool: ...


def builtins_only(operators: Sequence[_MayRunOnLoop], *, keyed_state_on_disk: bool) -> bool:
    """Whether a subtask's operators may run on its agent's loop although user code runs on task
    threads (``DataplaneSettings.builtins_on_loop``): every one promises short calls that never
    block (``Operator.runs_on_loop``), and its keyed state, if any, is on the heap. A disk
    backend's reads and writes (RocksDB) take as long as the state is cold, which no promise of
    the operator's bounds."""
    return bool(operators) and not keyed_state_on_disk and all(o.runs_on_loop() for o in operators)


@dataclass(frozen=True)
class PlacementSettings:
    """When operators on the loop move to a task thread."""

    window_calls: int = 16
    """A window of calls ends after this many calls ..."""
    window_ms: float = 20.0
    """... or once its calls (at least two) took this much wall time, so operators that block
    for long move after a few calls; the sums of a window decide."""
    blocked_share: float = 0.75
    """Move when the calls of a window spent at least this share of their wall time off the
    CPU (blocked: sleeping, waiting for I/O or a lock, or the GIL)."""
    min_blocked_ms: float = 2.0
    """... and at least this much blocked time per call on average: short calls whose timer
    jitter is a large share of them do not count."""
    windows: int = 2
    """Consecutive windows that must block before the move: a burst of load on the machine
    (CPU time taken by other processes also shows as time off the CPU) does not move a
    CPU-bound function for good."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.window_calls, bool)
            or not isinstance(self.window_calls, int)
            or self.window_calls < 1
        ):
            raise InvalidArgumentError(
                f"window_calls must be an integer >= 1, got {self.window_calls!r}"
            )
        if not 0.0 < self.blocked_share <= 1.0:
            raise InvalidArgumentError(
                f"blocked_share must be in (0, 1], got {self.blocked_share!r}"
            )
        if not self.window_ms >= 0:  # NaN too
            raise InvalidArgumentError(f"window_ms must be >= 0, got {self.window_ms!r}")
        if not self.min_blocked_ms >= 0:
            raise InvalidArgumentError(f"min_blocked_ms must be >= 0, got {self.min_blocked_ms!r}")
        if isinstance(self.windows, bool) or not isinstance(self.windows, int) or self.windows < 1:
            raise InvalidArgumentError(f"windows must be an integer >= 1, got {self.windows!r}")


@dataclass(frozen=True)
class MoveToTaskThread:
    """Run the operators on a task thread from the next call on."""

    wall_ms: float
    """Wall time of the window's calls."""
    blocked_ms: float
    """Of it, time off the CPU."""
    calls: int
    """The figures are the last window's."""


class Placement:
    """Decides, from measured calls, when operators on the loop move to a task thread."""

    def __init__(self, settings: PlacementSettings | None = None) -> None:
        self.settings = settings or PlacementSettings()
        self.on_thread = False
        self._calls = 0
        self._wall_ns = 0
        self._cpu_ns = 0
        self._blocking_windows = 0
        """Consecutive windows so far that blocked."""

    def on_call(self, wall_ns: int, cpu_ns: int) -> MoveToTaskThread | None:
        """A call on the loop took ``wall_ns`` of wall time, ``cpu_ns`` of it on the CPU of the
        calling thread. The move, when this call completes a window of blocking calls."""
        if wall_ns < 0 or cpu_ns < 0:
            raise InvalidArgumentError(f"times must be >= 0, got {wall_ns!r}, {cpu_ns!r}")
        if self.on_thread:
            return None
        self._calls += 1
        self._wall_ns += wall_ns
        self._cpu_ns += min(cpu_ns, wall_ns)  # clocks of different resolution
        s = self.settings
        if self._calls < s.window_calls and (self._calls < 2 or self._wall_ns < s.window_ms * 1e6):
            self.validate_state()
            return None
        calls, wall, blocked = self._calls, self._wall_ns, self._wall_ns - self._cpu_ns
        self._calls = self._wall_ns = self._cpu_ns = 0
        if wall and blocked >= s.blocked_share * wall and blocked >= s.min_blocked_ms * 1e6 * calls:
            self._blocking_windows += 1
        else:
            self._blocking_windows = 0
        if self._blocking_windows >= s.windows:
            self.on_thread = True
            self._blocking_windows = 0
            self.validate_state()
            return MoveToTaskThread(wall_ms=wall / 1e6, blocked_ms=blocked / 1e6, calls=calls)
        self.validate_state()
        return None

    def validate_state(self) -> None:
        """Invariants (tests call this after every event)."""
        assert 0 <= self._calls < self.settings.window_calls
        assert self._calls < 2 or self._wall_ns < self.settings.window_ms * 1e6
        assert 0 <= self._cpu_ns <= self._wall_ns
        assert 0 <= self._blocking_windows < self.settings.windows
        assert not (self.on_thread and (self._calls or self._blocking_windows)), (
            "nothing is measured once on the thread"
        )

"""The recent history of one job: its exception history and when it entered each state.

Pure and in memory, fed by the events ``JobWatch`` publishes (``coordinator/watch.py``): a
task failure, a change of the job state. It is read by the dashboard (Flink's Exceptions tab)
and by the per-job metrics (``uptime``, as Flink's uptime gauge). Like the checkpoint
statistics it starts empty after a coordinator restart; the job's last failure itself is
durable in its Redis record (``JobInfo.failure``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from snapflow.coordinator.model import ExecutionAttempt, JobState

EXCEPTION_HISTORY_SIZE = 16
"""Failures remembered per job: Flink's ``web.exception-history-size`` default."""

MAX_MESSAGE_CHARS = 4096
"""A failure message is kept up to this many characters (a task may report a long trace)."""


@dataclass(frozen=True)
class ExceptionEntry:
    """One failure: of a task (``task`` set) or of the whole job (``task`` None, e.g. too many
    failed checkpoints)."""

    timestamp_ms: int
    message: str
    task: ExecutionAttempt | None = None


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "\u2026"


class JobHistory:
    """Exceptions (newest ``size``) and state timestamps of one job."""

    def __init__(self, size: int = EXCEPTION_HISTORY_SIZE) -> None:
        if size < 1:
            raise ValueError(f"exception history size must be >= 1, got {size}")
        self.size = size
        self._exceptions: deque[ExceptionEntry] = deque(maxlen=size)
        self.total_exceptions = 0
        """Failures recorded since this coordinator started the job's runner (also those no
        longer kept)."""
        self.state: JobState | None = None
        """The last state reported (None: no change seen since the runner started)."""
        self.state_timestamps: dict[JobState, int] = {}
        """When the job last entered each state (Flink's status timestamps)."""
        self.running_since_ms: int | None = None
        """When the job entered RUNNING, while it is RUNNING."""

    # --- queries -------------------------------------------------------------------------

    def exceptions(self) -> list[ExceptionEntry]:
        """Newest first."""
        return list(reversed(self._exceptions))

    @property
    def truncated(self) -> bool:
        """Whether older failures were dropped (Flink's ``truncated`` flag)."""
        return self.total_exceptions > len(self._exceptions)

    def uptime_ms(self, now_ms: int, state: JobState) -> int:
        """As Flink's ``uptime`` gauge: how long a RUNNING job has been running, 0 before it
        runs (or while it restarts), -1 once it ended."""
        if state.is_terminal:
            return -1
        if state is not JobState.RUNNING or self.running_since_ms is None:
            return 0
        return max(0, now_ms - self.running_since_ms)

    def check_invariants(self) -> None:
        assert len(self._exceptions) <= self.size
        assert self.total_exceptions >= len(self._exceptions)
        assert (self.running_since_ms is not None) == (self.state is JobState.RUNNING)
        if self.running_since_ms is not None:
            assert self.state_timestamps.get(JobState.RUNNING) == self.running_since_ms
        times = [e.timestamp_ms for e in self._exceptions]
        assert times == sorted(times), "exceptions out of order"
        assert all(len(e.message) <= MAX_MESSAGE_CHARS for e in self._exceptions)

    # --- events --------------------------------------------------------------------------

    def on_state_changed(self, now_ms: int, state: JobState, reason: str) -> None:
        """The job is now in ``state``; a FAILED job's ``reason`` is its failure."""
        now_ms = max(now_ms, self._last_timestamp())  # a clock step back keeps the order
        if state is JobState.RUNNING:
            if self.state is not JobState.RUNNING:
                self.running_since_ms = now_ms
                self.state_timestamps[state] = now_ms
        else:
            self.running_since_ms = None
            self.state_timestamps[state] = now_ms
        if state is JobState.FAILED and reason and self.state is not JobState.FAILED:
            self._record(ExceptionEntry(now_ms, bounded(reason)))
        self.state = state

    def on_task_failed(self, now_ms: int, attempt: ExecutionAttempt, message: str) -> None:
        now_ms = max(now_ms, self._last_timestamp())
        self._record(ExceptionEntry(now_ms, bounded(message or "(no message)"), attempt))

    def _record(self, entry: ExceptionEntry) -> None:
        self._exceptions.append(entry)
        self.total_exceptions += 1

    def _last_timestamp(self) -> int:
        return self._exceptions[-1].timestamp_ms if self._exceptions else 0

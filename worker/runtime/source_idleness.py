"""When a source subtask is idle: pure, the time passed in.

A source is idle once every poll returned no rows for ``timeout_ms`` (Flink's
``WatermarkStrategy.withIdleness``; None: never by time, Flink's default), or at its first empty
poll when it has nothing to read at all (a split source without splits, as Flink's source
operator without splits). It is active again at its next rows. The task announces the changes
downstream (``WatermarkStatusFrame``), active before the data that ended the idleness.
"""

from __future__ import annotations

from snapflow.errors import InvalidArgumentError


class SourceIdleness:
    """The idleness of one source subtask, fed with the outcome of every poll."""

    def __init__(self, timeout_ms: int | None) -> None:
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or timeout_ms <= 0):
            raise InvalidArgumentError(
                f"idle_timeout_ms must be an integer > 0 or None, got {timeout_ms!r}"
            )
        self.timeout_ms = timeout_ms
        self._empty_since_ms: int | None = None
        self.idle = False

    def on_poll(self, rows: int, now_ms: int, nothing_to_read: bool = False) -> bool:
        """A poll returned ``rows`` rows at ``now_ms`` (a monotonic clock); whether the source
        is idle now. ``nothing_to_read``: the source has no input at all (no splits)."""
        if rows > 0:
            self._empty_since_ms = None
            self.idle = False
            return False
        if self._empty_since_ms is None:
            self._empty_since_ms = now_ms
        timed_out = self.timeout_ms is not None and now_ms - self._empty_since_ms >= self.timeout_ms
        self.idle = nothing_to_read or timed_out
        return self.idle

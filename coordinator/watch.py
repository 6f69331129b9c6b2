"""``WatchJob`` streams of one job: every subscriber gets the job's events in order.

A subscriber that does not keep up (``WATCH_QUEUE_BOUND`` events buffered) is cut off rather
than buffering forever; closing the watch ends every stream. The job's recent history (its
exceptions, when it started running: ``coordinator/job_history.py``) is fed by the same
events, whether anyone watches or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from snapflow import wire
from snapflow.coordinator import convert
from snapflow.coordinator.job_history import JobHistory
from snapflow.coordinator.model import ExecutionAttempt, JobState
from snapflow.v1 import coordinator_pb2 as cpb

WATCH_QUEUE_BOUND = 1024  # events buffered per watch stream before it is closed as too slow


class JobWatch:
    """The open ``WatchJob`` streams of one job and the typed events published to them."""

    def __init__(self, job_id: str, clock: Callable[[], int]) -> None:
        self.job_id = job_id
        self._clock = clock
        self._subscribers: set[asyncio.Queue[cpb.JobEvent | None]] = set()
        self.history = JobHistory()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def stream(self, current_state: Callable[[], JobState]) -> AsyncIterator[cpb.JobEvent]:
        """Events from now on, starting with the job's current state."""
        queue: asyncio.Queue[cpb.JobEvent | None] = asyncio.Queue(WATCH_QUEUE_BOUND)
        self._subscribers.add(queue)
        try:
            yield self._event(
                job_state_changed=cpb.JobStateChanged(
                    state=wire.JOB_STATE.to_pb(current_state()),
                    reason="current state",
                )
            )
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            self._subscribers.discard(queue)

    def close(self) -> None:
        """End every stream (after the events already queued)."""
        for queue in list(self._subscribers):
            queue.put_nowait(None)

    # --- events ----------------------------------------------------------------------------

    def state_changed(self, state: JobState, reason: str) -> None:
        self.history.on_state_changed(self._clock(), state, reason)
        if self._subscribers:
            self._publish(
                self._event(
                    job_state_changed=cpb.JobStateChanged(
                        state=wire.JOB_STATE.to_pb(state),
                        reason=reason,
                    )
                )
            )

    def task_failed(self, attempt: ExecutionAttempt, message: str) -> None:
        self.history.on_task_failed(self._clock(), attempt, message)
        if self._subscribers:
            self._publish(
                self._event(
                    task_failed=cpb.TaskFailed(
                        attempt=convert.attempt_to_pb(attempt), message=message
                    )
                )
            )

    def checkpoint_completed(self, summary: Callable[[], cpb.CheckpointSummary]) -> None:
        """``summary`` is only built when someone watches."""
        if self._subscribers:
            self._publish(self._event(checkpoint_completed=summary()))

    def checkpoint_failed(self, summary: Callable[[], cpb.CheckpointSummary]) -> None:
        if self._subscribers:
            self._publish(self._event(checkpoint_failed=summary()))

    def _event(self, **payload: object) -> cpb.JobEvent:
        return cpb.JobEvent(job_id=self.job_id, timestamp_ms=self._clock(), **payload)  # type: ignore[arg-type]

    def _publish(self, event: cpb.JobEvent) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # A consumer that does not keep up is cut off rather than buffering forever.
                self._subscribers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

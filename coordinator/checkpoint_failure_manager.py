"""The checkpoint coordinator's failure policy (pure, part of its core): which aborts and
trigger failures count as failures, and when consecutive counted failures fail the job.

``abort_reason_for_decline`` decides what a task's decline aborts with (and so whether it
counts); :class:`FailureManager` counts them (Flink's CheckpointFailureManager; where the
policies differ: ``docs/flink-differences.md``).
"""

from __future__ import annotations

from snapflow.coordinator.model import AbortReason, CheckpointKind, DeclineReason, TriggerRefusal


def abort_reason_for_decline(reason: DeclineReason) -> AbortReason:
    """The decline policy: declines that say nothing about the checkpoint's health (the task
    was not ready, a newer barrier overtook it, alignment was canceled) abort with a reason that
    the failure manager does not count, as Flink's CheckpointFailureManager does; every other
    decline is ``DECLINED`` and counts."""
    match reason:
        case DeclineReason.TASK_NOT_READY:
            return AbortReason.TASK_NOT_READY
        case DeclineReason.SUBSUMED:
            return AbortReason.SUBSUMED
        case DeclineReason.ALIGNMENT_CANCELED:
            return AbortReason.ALIGNMENT_CANCELED
        case DeclineReason.UNSPECIFIED | DeclineReason.SNAPSHOT_FAILED | DeclineReason.IO_ERROR:
            return AbortReason.DECLINED
        case _:
            raise AssertionError(f"unknown decline reason {reason!r}")


# Trigger failures the failure manager counts (Flink's IO_EXCEPTION and CHECKPOINT_EXPIRED).
COUNTED_TRIGGER_FAILURES = frozenset(
    {TriggerRefusal.IO_EXCEPTION, TriggerRefusal.CHECKPOINT_EXPIRED}
)


class FailureManager:
    """Flink's CheckpointFailureManager (as in 1.18 and 1.20): counts consecutive failures.

    Counted: failures whose reason counts (expired, declined for a reason of its own,
    finalisation failed, trigger I/O error or trigger expiry), each checkpoint id at most once
    between two successes, and only ids newer than the last success; a failure without an id
    (the trigger never got one) always counts. Savepoints count only when a task declined an
    intermediate savepoint (Flink's task-level failure; a savepoint's expiry or trigger failure
    is job-level and never counts, a declined stop-with-savepoint: see the coordinator). A
    success newer than every earlier one clears the count and the remembered ids, failures of
    newer checkpoints still in flight included (Flink's ``handleCheckpointSuccess``).
    """

    def __init__(self, tolerable: int | None) -> None:
        self.tolerable = tolerable
        self.consecutive_failures = 0
        self.last_succeeded_id = 0
        self._counted: set[int] = set()

    def on_failure(
        self,
        checkpoint_id: int | None,
        kind: CheckpointKind,
        reason: AbortReason | TriggerRefusal,
        declined_by_task: bool = False,
    ) -> bool:
        """Record a failure (``checkpoint_id`` None: no id yet; ``declined_by_task``: a task's
        decline, Flink's task-level failure); True when the job must fail."""
        counts = (
            reason in COUNTED_TRIGGER_FAILURES
            if isinstance(reason, TriggerRefusal)
            else reason.counts_as_failure
        )
        if not counts:
            return False
        if kind.is_savepoint and (kind.is_synchronous or not declined_by_task):
            return False  # job-level savepoint failures; stop-with-savepoint: never counted
        if checkpoint_id is not None:
            if checkpoint_id <= self.last_succeeded_id or checkpoint_id in self._counted:
                return False
            self._counted.add(checkpoint_id)
        self.consecutive_failures += 1
        return self.tolerable is not None and self.consecutive_failures > self.tolerable

    def on_success(self, checkpoint_id: int) -> None:
        if checkpoint_id <= self.last_succeeded_id:
            return  # an older success changes nothing (Flink)
        self.last_succeeded_id = checkpoint_id
        self.consecutive_failures = 0
        self._counted.clear()  # Flink's clearCount

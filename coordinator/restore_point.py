"""The restore-point policy: where a new deployment of a job restores from (pure).

Each deployment start asks this policy; the shell only executes the answer (reading a
savepoint directory's ``_metadata`` when the answer is a path). First match wins:

1. the newest restorable snapshot, if this run completed it (its id is greater than the run's
   ``run_start_checkpoint_id``);
2. the run's explicit savepoint path;
3. the run's explicit checkpoint id (``CheckpointNotFoundError`` if it is no longer recorded);
4. with ``latest``, the newest restorable snapshot;
5. nothing: fresh state.

Restorable: the latest retained checkpoint, or a stop-with-savepoint savepoint if it is newer
(its completion notified the tasks, so restoring from an older checkpoint would replay
committed side effects). Intermediate savepoints never qualify: they notify no task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from snapflow.coordinator.model import CompletedCheckpoint
from snapflow.errors import CheckpointNotFoundError


@dataclass(frozen=True)
class RestorePlan:
    """What a run of a job asked to restore from (the restore fields of its ``JobRecord``)."""

    run_start_checkpoint_id: int = 0
    savepoint_path: str = ""
    checkpoint_id: int = 0
    latest: bool = False


@dataclass(frozen=True)
class RestoreFromSnapshot:
    """Restore from a checkpoint or savepoint the coordinator has recorded."""

    checkpoint: CompletedCheckpoint


@dataclass(frozen=True)
class RestoreFromPath:
    """Restore from the snapshot in this directory: the shell reads its ``_metadata``."""

    path: str


@dataclass(frozen=True)
class FreshStart:
    """Nothing to restore: the job starts with empty state."""


RestoreDecision = RestoreFromSnapshot | RestoreFromPath | FreshStart


@dataclass(frozen=True)
class RestorePoint:
    """The snapshot a deployment restores from, as handed to every registering task."""

    checkpoint: CompletedCheckpoint
    is_savepoint: bool

    @staticmethod
    def of(checkpoint: CompletedCheckpoint) -> RestorePoint:
        return RestorePoint(checkpoint, checkpoint.kind.is_savepoint)


def latest_restorable(
    completed: Sequence[CompletedCheckpoint], savepoints: Sequence[CompletedCheckpoint]
) -> CompletedCheckpoint | None:
    """The newest snapshot failover may restore from (see the module docstring)."""
    candidates = [c for c in savepoints if c.kind.is_synchronous]
    if completed:
        candidates.append(max(completed, key=lambda c: c.checkpoint_id))
    return max(candidates, key=lambda c: c.checkpoint_id, default=None)


def choose_restore_point(
    plan: RestorePlan,
    job_id: str,
    completed: Sequence[CompletedCheckpoint],
    savepoints: Sequence[CompletedCheckpoint],
) -> RestoreDecision:
    """The restore decision for a new deployment (first match of the module docstring)."""
    latest = latest_restorable(completed, savepoints)
    if latest is not None and latest.checkpoint_id > plan.run_start_checkpoint_id:
        return RestoreFromSnapshot(latest)
    if plan.savepoint_path:
        return RestoreFromPath(plan.savepoint_path)
    if plan.checkpoint_id:
        chosen = next(
            (c for c in [*completed, *savepoints] if c.checkpoint_id == plan.checkpoint_id), None
        )
        if chosen is None:
            raise CheckpointNotFoundError(
                f"checkpoint {plan.checkpoint_id} of job {job_id} is not retained any more"
            )
        return RestoreFromSnapshot(chosen)
    if plan.latest and latest is not None:
        return RestoreFromSnapshot(latest)
    return FreshStart()

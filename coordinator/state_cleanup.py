"""Deciding which state files a coordinator may delete, and deleting them.

Four layers stand between a path and its deletion (docs/coordinator.md, "Discarding" and
"Fencing of storage"):

1. the pure core keeps paths string-equal to a handle of a retained snapshot;
2. :meth:`StateCleanup.plan` keeps anything inside the directory of a retained checkpoint or a
   recorded savepoint (resolved paths, normalised keys on S3, so ``chk-1/./x`` is caught), and
   keeps every path this coordinator cannot attribute to a checkpoint it allocated itself: a
   path must lie inside ``chk-<id>`` with ``id`` at most the highest id this incarnation knows,
   or inside a savepoint directory it created. A newer coordinator's tasks only write into
   directories of ids it allocated after it took the epoch, which are higher, so no delay
   between the fenced step below and the deletion can make a superseded coordinator delete
   them. (A path elsewhere in the job's directory, which no task writes, is protected by the
   epoch check alone.);
3. the fenced step: ``CheckpointStore.claim_deletions`` (one Lua script) proves that this
   coordinator still holds the current epoch and that Redis records none of the owning ids as
   retained or as a savepoint (``CheckpointIo`` runs it between :meth:`plan` and the deletion);
4. ``CheckpointStorage`` re-validates every path and refuses anything outside the job's
   directory or an allowed savepoint directory.

The methods here are blocking (``CheckpointIo`` runs them in a worker thread) except
:meth:`plan`, which touches no storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.confinement import is_inside, location_key

NO_CHECKPOINT = 0
"""The owner id of a path inside no checkpoint or savepoint directory (ids start at 1)."""


class StateCleanup:
    """Storage clean-up of one job: discarded state, ended checkpoints, orphans."""

    def __init__(self, job_id: str, storage: CheckpointStorage, log: Any) -> None:
        self.job_id = job_id
        self.storage = storage
        self._log = log

    def owner(self, path: str, savepoint_ids: Mapping[str, int]) -> int | None:
        """The checkpoint or savepoint id whose directory holds ``path``, or None.
        ``savepoint_ids``: directory -> id of the savepoints this coordinator knows."""
        checkpoint_id = self.storage.checkpoint_id_of(self.job_id, path)
        if checkpoint_id is not None:
            return checkpoint_id
        key = location_key(path)
        for directory, savepoint_id in savepoint_ids.items():
            if directory and is_inside(key, location_key(directory)):
                return savepoint_id
        return None

    def plan(
        self,
        paths: Sequence[str],
        snapshot_dirs: Sequence[str],
        savepoint_ids: Mapping[str, int],
        highest_id: int,
    ) -> dict[int, list[str]]:
        """Layer 2: the paths that may be discarded, by owning checkpoint id (the ids to claim
        in Redis before deleting). Refused paths are logged and kept."""
        protected = [location_key(d) for d in snapshot_dirs]
        by_owner: dict[int, list[str]] = {}
        for path in paths:
            real = location_key(path)
            if any(real == d or is_inside(real, d) for d in protected):
                self._refused(path, "inside a retained snapshot")
                continue
            owner = self.owner(path, savepoint_ids)
            if owner is None:
                # Elsewhere in the job's directory (no task writes there; a hostile or buggy
                # ack may name it): only the epoch check protects it, claimed as id 0.
                by_owner.setdefault(NO_CHECKPOINT, []).append(path)
            elif owner > highest_id:
                self._refused(
                    path,
                    f"inside checkpoint {owner}, above the highest id this coordinator "
                    f"allocated ({highest_id}): a newer coordinator's",
                )
            else:
                by_owner.setdefault(owner, []).append(path)
        return by_owner

    def _refused(self, path: str, why: str) -> None:
        self._log.warning("checkpoint.discard_refused", path=path, why=why)

    def discard(self, paths: Sequence[str], allowed_dirs: Sequence[str]) -> int:
        """Delete planned and claimed ``paths`` (layer 4 re-validates each); ``allowed_dirs``
        are savepoint directories outside the job's directory. Returns how many went."""
        if not paths:
            return 0
        return self.storage.discard_state(self.job_id, list(paths), list(allowed_dirs))

    def delete_ended(self, checkpoint_id: int, location: str, is_savepoint: bool) -> bool:
        """Delete the directory of a claimed checkpoint that ended without completing
        (aborted, refused after its id was allocated, an orphan): a savepoint directory only
        if it has no ``_metadata``. Tolerates a late writer (``StorageError`` after a few
        retries: the next sweep finishes it)."""
        if is_savepoint:
            return self.storage.delete_incomplete_savepoint(location)
        return self.storage.delete_checkpoint_dir(self.job_id, checkpoint_id)

"""Discarding a job's unused state files, and never the files a retained snapshot needs.

The pure core already keeps paths that a retained snapshot references (compared as strings).
This second layer compares resolved paths (normalised keys on S3) against the directories of
retained checkpoints and recorded savepoints, so ``chk-1/./x`` or ``chk-1/_metadata`` in a late
ack cannot delete what a completed checkpoint needs. ``CheckpointStorage`` then re-validates
every path (third layer). Blocking I/O: callers run these methods in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from snapflow.coordinator.checkpoint_coordinator import CheckpointAborted
from snapflow.coordinator.checkpoint_storage import CheckpointStorage, is_inside, location_key


class StateCleanup:
    """Storage clean-up of one job: discarded state and aborted checkpoints."""

    def __init__(self, job_id: str, storage: CheckpointStorage, log: Any) -> None:
        self.job_id = job_id
        self.storage = storage
        self._log = log

    def discard(
        self, paths: Sequence[str], snapshot_dirs: Sequence[str], allowed_dirs: Sequence[str]
    ) -> None:
        """Discard ``paths`` except anything inside ``snapshot_dirs`` (retained checkpoints and
        savepoints); ``allowed_dirs`` are savepoint directories outside the job's directory
        where state may be discarded."""
        protected = [location_key(d) for d in snapshot_dirs]
        keep = []
        for path in paths:
            real = location_key(path)
            if any(real == d or is_inside(real, d) for d in protected):
                self._log.warning(
                    "checkpoint.discard_refused", path=path, why="inside a retained snapshot"
                )
                continue
            keep.append(path)
        if keep:
            self.storage.discard_state(self.job_id, keep, list(allowed_dirs))

    def clean_up_aborted(self, aborted: CheckpointAborted, snapshot_dirs: Sequence[str]) -> None:
        """Discard an aborted checkpoint's acknowledged state and delete its directory (a
        savepoint's only if it has no ``_metadata``).

        On S3 an aborted checkpoint's prefix is not listed (aborts are on the checkpoint path):
        its acknowledged files are discarded here, and files of tasks that never acknowledged
        go with the orphans at the next start-up."""
        is_savepoint = aborted.request.kind.is_savepoint
        extra = [aborted.external_path] if is_savepoint else []
        self.discard(aborted.discarded_paths, snapshot_dirs, extra)
        if is_savepoint:
            self.storage.delete_incomplete_savepoint(aborted.external_path)
        elif not self.storage.is_object_store:
            self.storage.delete_checkpoint(self.job_id, aborted.checkpoint_id)

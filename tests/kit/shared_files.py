"""Shared state files of a job (the disk backend's incremental checkpoints): what storage holds
against what the retained checkpoints reference."""

from __future__ import annotations

from snapflow.coordinator.confinement import location_key
from snapflow.coordinator.server import Coordinator
from snapflow.coordinator.shared_state import shared_paths


async def shared_files_state(coordinator: Coordinator, job_id: str) -> tuple[set[str], set[str]]:
    """``(in storage, referenced by a retained checkpoint)`` after one orphan sweep, as
    comparable location keys."""
    manager = coordinator.manager
    assert manager is not None
    runner = manager.jobs[job_id]
    await runner.sweep_orphans()
    stored = {location_key(p) for p in runner.storage.list_shared(job_id)}
    retained = await manager.store.list_completed(job_id)
    referenced = {location_key(p) for cp in retained for p in shared_paths(cp)[0]}
    return stored, referenced

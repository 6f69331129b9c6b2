"""Keyed state backends snapshotted as one vertex's subtasks would be: the handles a restore
(or a rescale) of those backends reads back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from snapflow.checkpointing import BarrierOptions, CheckpointKind, StateHandle


def snapshot_backends(
    backends: list[Any], root: Path, cid: int, savepoint: bool = False
) -> list[StateHandle]:
    """Snapshot every backend (subtask ``i`` of a vertex ``v``) as checkpoint (or savepoint)
    ``cid`` under ``root``; the written handles of all of them."""
    target = str(root / "job" / f"chk-{cid}")
    kind = CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT
    handles: list[StateHandle] = []
    for i, b in enumerate(backends):
        snap = b.snapshot(cid, BarrierOptions(kind=kind, target_location=target))
        handles += snap.write(os.path.join(target, f"v-{i}-1", "v/keyed"))
        snap.release()
    return handles

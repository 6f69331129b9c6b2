"""Path confinement: savepoint targets, restore paths, disposals and job storage locations
must lie under the configured roots (``storage_root`` and ``savepoint_roots``).

Checked in the service before any I/O. Local paths are compared after ``os.path.realpath``,
so ``..`` and symbolic links that leave a root are caught; ``s3://`` locations after
normalisation (a ``.``/``..`` segment does not normalise and so matches no root).
"""

from __future__ import annotations

from collections.abc import Sequence

from snapflow.coordinator.checkpoint_storage import is_inside, location_key
from snapflow.errors import PermissionDeniedError


def check_confined(path: str, roots: Sequence[str], what: str, *, allow_root: bool = False) -> None:
    """Raise PERMISSION_DENIED unless ``path`` lies strictly inside one of ``roots`` (or is
    one, with ``allow_root``); no roots: no confinement."""
    if not roots or not path:
        return
    key = location_key(path)
    root_keys = [location_key(root) for root in roots]
    if "\x00" not in path and any(
        is_inside(key, root) or (allow_root and key == root) for root in root_keys
    ):
        return
    raise PermissionDeniedError(
        f"{what} {path[:200]!r} is outside the allowed roots (storage_root and "
        f"savepoint_roots of the coordinator): choose a location under one of them"
    )

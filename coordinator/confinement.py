"""Path confinement: savepoint targets, restore paths, disposals and job storage locations
must lie under the configured roots (``storage_root`` and ``savepoint_roots``).

Checked in the service before any I/O. Local paths are compared after ``os.path.realpath``,
so ``..`` and symbolic links that leave a root are caught; ``s3://`` locations after
normalisation (a ``.``/``..`` segment does not normalise and so matches no root).

The same comparison keeps checkpoint storage and state clean-up from touching a file outside
a job's directory or inside a retained snapshot: :func:`location_key` (the comparable form of a
location) and strict containment (:func:`is_inside`, :func:`is_relative_to`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from snapflow.errors import ConfigError, InvalidArgumentError, PermissionDeniedError
from snapflow.filestore import is_object_store_uri
from snapflow.storage_location import local_path_from_uri, s3_location


def location_key(path: str) -> str:
    """A comparable form of a location: the normalised S3 URI, or the real local path (a path
    that cannot be normalised is returned as given, which matches nothing else)."""
    if is_object_store_uri(path):
        try:
            return s3_location(path, what="path")
        except InvalidArgumentError:
            return path
    try:
        return os.path.realpath(local_path_from_uri(path))
    except ConfigError:
        return path


def is_inside(path_key: str, directory_key: str) -> bool:
    """True when ``path_key`` lies strictly inside ``directory_key`` (both from
    :func:`location_key`)."""
    sep = "/" if is_object_store_uri(directory_key) else os.sep
    return path_key.startswith(directory_key.rstrip(sep) + sep)


def is_relative_to(path: str, root: str) -> bool:
    """True when normalised absolute ``path`` lies strictly inside normalised ``root``."""
    if path == root:
        return False
    return os.path.commonpath([path, root]) == root


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

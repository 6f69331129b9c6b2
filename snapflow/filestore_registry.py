"""The process-wide :class:`~snapflow.filestore.FileStore` of a location: one client and one set
of request counts per scheme and settings.

A module of its own because it names the implementations, which import the interface."""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

from snapflow.errors import InvalidArgumentError
from snapflow.filestore import FileStore
from snapflow.local_filestore import LocalFileStore
from snapflow.s3_filestore import S3FileStore, S3Settings

__all__ = ["store_for"]

_STORES: dict[tuple[str, S3Settings | None], FileStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(location: str, s3: S3Settings | None = None) -> FileStore:
    """The process-wide store for ``location``'s scheme (one client, one set of counts, per
    scheme and settings): ``s3://`` -> :class:`S3FileStore`, a path or ``file://`` ->
    :class:`LocalFileStore`."""
    scheme = urlsplit(location).scheme
    if scheme not in ("", "file", "s3"):
        raise InvalidArgumentError(
            f"unsupported storage scheme {scheme!r} in {location!r:.200}: use a path, file:// "
            "or s3://bucket/prefix"
        )
    key = ("s3", s3 or S3Settings()) if scheme == "s3" else ("file", None)
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = S3FileStore(s3) if scheme == "s3" else LocalFileStore()
            _STORES[key] = store
        return store

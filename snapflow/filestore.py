"""Where Snapflow's bytes persist: one small interface, :class:`FileStore`, that both the
coordinator and the workers use, over a local (or mounted) file system
(:mod:`snapflow.local_filestore`) or an S3 object store (:mod:`snapflow.s3_filestore`,
multipart uploads in :mod:`snapflow.s3_multipart`); :mod:`snapflow.filestore_registry` picks the
store for a location.

The interface is shaped by what object stores do well and charge for, not by POSIX:

* whole-object writes (:meth:`FileStore.write`) under names that are never reused, so no write
  ever replaces data someone may read;
* :meth:`FileStore.create`: create-if-absent, for ``_metadata``. On S3 it is a conditional
  ``PutObject`` with ``If-None-Match: *``, on a file system a hard link from a fsynced temporary
  file; either way a second writer (a stale coordinator included) gets
  :class:`~snapflow.errors.AlreadyExistsError` and the first object stays;
* ranged reads (:meth:`FileStore.read_range`), so a restore reads only the key-group sections
  it owns;
* batched deletes (:meth:`FileStore.delete`, ``DeleteObjects`` with up to 1,000 keys a request);
* listing (:meth:`FileStore.list`) only off the hot path (orphan clean-up, disposal);
* file transfers that never hold a whole object in memory (:meth:`FileStore.upload_file`,
  :meth:`FileStore.download_file`), for state files as large as a compaction makes them.

Every request is counted by kind (:class:`RequestCounts`): benchmarks and tests read the counts
to hold checkpoints to a request budget.
"""

from __future__ import annotations

import threading
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

__all__ = [
    "TRANSFER_CHUNK_BYTES",
    "FileStore",
    "RequestCounts",
    "RequestKind",
    "file_crc32",
    "is_object_store_uri",
]

#: Bytes a file transfer holds in memory at once: the chunk of a streamed download, and the
#: part size of an S3 upload (a file below twice this size is one ``PutObject``; s3fs reads it
#: whole). At least S3's 5 MiB minimum part size.
TRANSFER_CHUNK_BYTES = 8 * 1024 * 1024


class RequestKind(StrEnum):
    """What an object store bills a request as."""

    PUT = "put"
    GET = "get"
    HEAD = "head"
    LIST = "list"
    DELETE = "delete"


@dataclass
class RequestCounts:
    """Requests made by one :class:`FileStore`, by kind. Thread-safe."""

    _counts: Counter[RequestKind] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: RequestKind, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def snapshot(self) -> dict[str, int]:
        """The counts so far, every kind present (0 when none)."""
        with self._lock:
            return {kind.value: self._counts[kind] for kind in RequestKind}


class FileStore(ABC):
    """A place that holds immutable named blobs. Paths are full URIs or absolute paths as this
    store's :meth:`join` builds them; methods block (call them off the event loop)."""

    def __init__(self) -> None:
        self.requests = RequestCounts()

    @abstractmethod
    def join(self, base: str, *names: str) -> str:
        """``base`` with ``names`` appended as path segments."""

    @abstractmethod
    def write(self, path: str, data: bytes) -> None:
        """Write a whole object. Callers use unique names: nothing is ever replaced that someone
        may read (on a file system the write is atomic: temporary file, fsync, rename)."""

    @abstractmethod
    def create(self, path: str, data: bytes) -> None:
        """Create ``path`` only if it does not exist (atomically); raise
        :class:`AlreadyExistsError` and leave the existing object untouched otherwise."""

    @abstractmethod
    def read(self, path: str) -> bytes:
        """The whole object; :class:`FileNotFoundError` if there is none."""

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer only at the end of the object)."""

    @abstractmethod
    def size(self, path: str) -> int:
        """The object's size in bytes; :class:`FileNotFoundError` if there is none."""

    @abstractmethod
    def delete(self, paths: Iterable[str]) -> int:
        """Delete objects (missing ones are fine), batched; returns how many distinct paths were
        asked for."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every object under the directory ``prefix``, recursively (off the hot path only)."""

    @abstractmethod
    def upload_file(self, path: str, local_path: str) -> None:
        """Write the local file ``local_path`` as the object ``path`` (a unique name, as for
        :meth:`write`) without reading it into memory whole. The local file must not change
        while it is uploaded."""

    @abstractmethod
    def download_file(self, path: str, local_path: str) -> tuple[int, int]:
        """Write the object ``path`` to the new local file ``local_path`` in chunks; returns
        ``(size, CRC-32)`` of the bytes written. :class:`FileNotFoundError` if there is no
        object (and then no local file either)."""

    def exists(self, path: str) -> bool:
        try:
            self.size(path)
        except FileNotFoundError:
            return False
        return True


def file_crc32(local_path: str) -> tuple[int, int]:
    """``(size, CRC-32)`` of a local file, read in chunks."""
    size = crc = 0
    with open(local_path, "rb") as f:
        while chunk := f.read(TRANSFER_CHUNK_BYTES):
            size += len(chunk)
            crc = zlib.crc32(chunk, crc)
    return size, crc


def is_object_store_uri(location: str) -> bool:
    return urlsplit(location).scheme == "s3"

"""Restoring the disk backend from an incremental checkpoint: the database directory its
manifest describes, with every SST downloaded from the shared directory and checked.

Every downloaded SST is checked against the size and CRC-32 its manifest recorded: a missing one
raises :class:`~snapflow.errors.StorageError`, a wrong one :class:`CorruptStateError`, both
naming the file.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Any

from snapflow.errors import StorageError
from snapflow.filestore_registry import store_for
from snapflow.worker.state.errors import CorruptStateError
from snapflow.worker.state.rocksdb_snapshots import SharedFile

__all__ = ["download_shared_file", "materialise", "write_small_files"]


def download_shared_file(shared: SharedFile, target: str, manifest_path: str) -> None:
    """Copy a shared SST to ``target`` (streamed: never whole in memory), checking size and
    CRC-32."""
    try:
        size, crc = store_for(shared.path).download_file(shared.path, target)
    except FileNotFoundError:
        raise StorageError(
            f"shared state file {shared.path} is missing (named by the checkpoint manifest "
            f"{manifest_path}); the checkpoint cannot be restored"
        ) from None
    except OSError as e:
        raise StorageError(f"cannot read shared state file {shared.path}: {e}") from e
    if size != shared.size or crc != shared.crc:
        with suppress(OSError):
            os.unlink(target)
        raise CorruptStateError(
            f"shared state file {shared.path} is corrupt: the checkpoint manifest "
            f"{manifest_path} says {shared.size} bytes with CRC-32 {shared.crc:08x}, the file "
            f"has {size} bytes with CRC-32 {crc:08x}"
        )


def write_small_files(manifest: dict[str, Any], directory: str, manifest_path: str) -> None:
    """The files that describe the database (``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*``), as
    the manifest holds them."""
    os.makedirs(directory, exist_ok=True)
    for name, data in manifest["files"].items():
        if os.path.basename(name) != name or not isinstance(data, bytes):
            raise CorruptStateError(f"manifest {manifest_path}: malformed file entry {name!r}")
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def materialise(manifest: dict[str, Any], directory: str, manifest_path: str) -> None:
    """A RocksDB directory from a manifest: its small files, and its SSTs downloaded."""
    write_small_files(manifest, directory, manifest_path)
    for shared in manifest["ssts"]:
        if os.path.basename(shared.name) != shared.name:
            raise CorruptStateError(f"manifest {manifest_path}: malformed SST name")
        download_shared_file(shared, os.path.join(directory, shared.name), manifest_path)

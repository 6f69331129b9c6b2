"""Checkpoint storage on a local or shared (mounted) file system, or on S3.

Layout (docs/coordinator.md, "Storage layout")::

    <root>/<job_id>/chk-<id>/            task state files of checkpoint <id> and its _metadata
    <root>/<job_id>/shared/              state shared between checkpoints (incremental)
    <root>/<job_id>/taskowned/           state owned by the tasks
    <target>/savepoint-<job6>-<hex12>/   a savepoint: state files and _metadata, self-contained

``<root>`` is a path, a ``file://`` URI or ``s3://bucket/prefix``; the bytes go through
:mod:`snapflow.filestore`. On S3 a "directory" is a key prefix: nothing is created for it, and
locations are normalised (no ``.``/``..`` or empty segments: S3 keys are literal, so a ``..``
is refused rather than resolved).

``_metadata`` is created once and never overwritten (:meth:`FileStore.create`): on a file system
a fsynced temporary file hard-linked to ``_metadata``
(:func:`snapflow.durable_files.create_exclusive`), on S3 a ``PutObject`` with
``If-None-Match: *``. A crash leaves either no ``_metadata`` or a complete one; a second writer
gets :class:`AlreadyExistsError` and the first one stays.

Savepoint metadata records the state files that lie inside the savepoint directory relative to
it, so a savepoint directory (or prefix) can be moved or copied and still be restored;
:meth:`CheckpointStorage.read_metadata` resolves them against the directory it read from.

Nothing here ever deletes a file outside the job's directory (or an explicitly allowed savepoint
directory): every path a worker or a metadata file hands us is normalised (``file://`` prefix,
``..``, symlinks locally; the key prefix on S3) and checked first.

Request budget on S3: the checkpoint path (trigger, ack, finalize, retention) never LISTs.
Retention deletes the files a retired checkpoint's metadata names plus its ``_metadata`` in one
batched ``DeleteObjects``; only start-up (orphans), savepoint disposal and aborted savepoints
list a prefix.

All methods are synchronous and blocking; the coordinator calls them via ``asyncio.to_thread``.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import secrets
import shutil
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import structlog

from snapflow.coordinator.confinement import is_inside, is_relative_to, location_key
from snapflow.coordinator.model import CompletedCheckpoint
from snapflow.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    ConfigError,
    InvalidArgumentError,
    InvalidStatePathError,
    SnapflowError,
    StorageError,
)
from snapflow.filestore import FileStore, is_object_store_uri
from snapflow.filestore_registry import store_for
from snapflow.s3_filestore import S3Settings
from snapflow.storage_location import has_uri_scheme, local_path_from_uri, s3_location

log = structlog.get_logger(__name__)

METADATA_FILE = "_metadata"
METADATA_FORMAT = "snapflow-checkpoint-metadata"
METADATA_VERSION = 1
CHECKPOINT_DIR_PREFIX = "chk-"
SAVEPOINTS_DIR = "savepoints"
SHARED_DIR = "shared"
"""``<root>/<job>/shared/``: files shared between checkpoints (the disk state backend's SSTs),
reference-counted in Redis (``coordinator/shared_state.py``). The worker derives the same
directory from a checkpoint's target location (``rocksdb_snapshots.shared_dir_for``)."""

# Only canonical names (no leading zeros): "chk-007" is not ours and is left alone.
_CHECKPOINT_DIR_RE = re.compile(r"^chk-(0|[1-9][0-9]*)$")
_SAFE_JOB_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_SUPPORTED = "a path, a file:// URI or s3://bucket/prefix"
# Removing a directory a late writer still adds files to (a task that has not yet seen the
# abort): a few quick retries, then the orphan sweep's next run takes what is left.
_REMOVE_ATTEMPTS = 5
_REMOVE_RETRY_S = 0.02
_RACE_ERRNOS = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT)


def _s3_join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *names])


def _s3_split(location: str) -> tuple[str, str]:
    """``(parent, name)`` of a normalised S3 location (the parent of a bucket is itself)."""
    bucket_and_key = location[len("s3://") :]
    if "/" not in bucket_and_key:
        return location, ""
    parent, name = bucket_and_key.rsplit("/", 1)
    return f"s3://{parent}", name


class CheckpointStorage:
    """Checkpoint and savepoint files under one root: a directory (a path or ``file://`` URI)
    or an S3 prefix (``s3://bucket/prefix``, reached with ``s3``'s settings)."""

    def __init__(self, root: str, s3: S3Settings | None = None) -> None:
        if not isinstance(root, str) or not root.strip():
            raise ConfigError(
                "storage root is empty: set storage_root to a directory path or s3://bucket/prefix"
            )
        self._s3 = s3
        root = root.strip()
        if is_object_store_uri(root):
            self._root = s3_location(root, what="storage root", error=ConfigError)
            return
        path = local_path_from_uri(root, what="storage root")
        if "\x00" in path:
            raise ConfigError(f"storage root {root!r:.200} contains a NUL byte")
        # Resolved once: every containment check compares real paths against this.
        self._root = os.path.realpath(os.path.abspath(path))

    def __repr__(self) -> str:
        return f"CheckpointStorage({self._root!r})"

    @property
    def root(self) -> str:
        """The absolute, symlink-free root directory, or the normalised S3 URI."""
        return self._root

    @property
    def is_object_store(self) -> bool:
        """The root is on S3 (no directories; a LIST costs a request)."""
        return is_object_store_uri(self._root)

    def store(self, location: str) -> FileStore:
        """The file store of ``location``'s scheme (this storage's S3 settings for ``s3://``)."""
        return store_for(location, self._s3)

    def _join(self, base: str, *names: str) -> str:
        if is_object_store_uri(base):
            return _s3_join(base, *names)
        return os.path.join(base, *names)

    # --- paths ------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> str:
        """``<root>/<job_id>`` (absolute). The job id must be a single safe path component."""
        if (
            not isinstance(job_id, str)
            or not _SAFE_JOB_ID_RE.match(job_id)
            or job_id in (".", "..")
        ):
            raise InvalidArgumentError(
                f"invalid job id {job_id!r:.100}: expected letters, digits, '_', '-' or '.' "
                "(a 32-character hex id)"
            )
        return self._join(self._root, job_id)

    def checkpoint_dir(self, job_id: str, checkpoint_id: int) -> str:
        """``<root>/<job_id>/chk-<checkpoint_id>`` (absolute)."""
        if (
            isinstance(checkpoint_id, bool)
            or not isinstance(checkpoint_id, int)
            or checkpoint_id < 0
        ):
            raise InvalidArgumentError(
                f"invalid checkpoint id {checkpoint_id!r:.50}: expected a non-negative integer"
            )
        return self._join(self.job_dir(job_id), f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")

    def checkpoint_id_of(self, job_id: str, path: str) -> int | None:
        """The id ``<id>`` when ``path`` lies inside ``<root>/<job_id>/chk-<id>/`` (the
        directory itself included), compared as :func:`location_key`; else None."""
        job_key = location_key(self.job_dir(job_id))
        key = location_key(path)
        if not is_inside(key, job_key):
            return None
        sep = "/" if is_object_store_uri(job_key) else os.sep
        first = key[len(job_key.rstrip(sep)) + 1 :].split(sep, 1)[0]
        match = _CHECKPOINT_DIR_RE.match(first)
        return int(match.group(1)) if match else None

    def savepoint_dir(self, target_directory: str, job_id: str, checkpoint_id: int) -> str:
        """A fresh savepoint directory path (not created): Flink's
        ``<target>/savepoint-<first 6 chars of job id>-<12 random hex>``.

        An empty ``target_directory`` means ``<root>/savepoints``. A target must be absolute
        (the coordinator's working directory means nothing to the caller) or an ``s3://`` URI.
        ``checkpoint_id`` is not part of the name (as in Flink); it is accepted for symmetry.
        """
        job_prefix = self.job_dir(job_id).rsplit("/", 1)[-1][:6]
        if target_directory and is_object_store_uri(target_directory):
            target = s3_location(target_directory, what="savepoint target directory")
        elif target_directory:
            try:
                target = local_path_from_uri(target_directory, what="savepoint target directory")
            except ConfigError as e:
                raise InvalidArgumentError(str(e)) from None
            if "\x00" in target or not os.path.isabs(target):
                raise InvalidArgumentError(
                    f"savepoint target directory {target_directory!r:.200} must be an absolute "
                    "path, a file:// URI or s3://bucket/prefix"
                )
            target = os.path.normpath(target)
        else:
            target = self._join(self._root, SAVEPOINTS_DIR)
        return self._join(target, f"savepoint-{job_prefix}-{secrets.token_hex(6)}")

    def ensure_directory(self, directory: str) -> str:
        """Create ``directory`` (and parents) if missing; returns its absolute path. On S3 a
        directory is a key prefix: nothing to create, no request."""
        path = self._absolute(directory, what="directory")
        if is_object_store_uri(path):
            return path
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create directory {path}: {e}") from e
        return path

    # --- metadata ---------------------------------------------------------------------------

    def write_metadata(self, directory: str, checkpoint: CompletedCheckpoint) -> str:
        """Write ``<directory>/_metadata`` atomically, create-if-absent; returns its path.

        Raises :class:`AlreadyExistsError` if ``_metadata`` exists (it is never overwritten) and
        :class:`StorageError` on I/O errors (on S3 naming the bucket and the operation).
        """
        directory = self._absolute(directory, what="checkpoint directory")
        target = self._join(directory, METADATA_FILE)
        record = checkpoint.to_dict()
        if checkpoint.kind.is_savepoint:
            record = _relativize(record, directory)
        payload = json.dumps(
            {"format": METADATA_FORMAT, "version": METADATA_VERSION, "checkpoint": record},
            sort_keys=True,
            separators=(",", ":"),
        ).encode("utf-8")
        try:
            self.store(target).create(target, payload)
        except AlreadyExistsError:
            raise AlreadyExistsError(
                f"checkpoint metadata {target} already exists; it is never overwritten"
            ) from None
        except OSError as e:
            raise StorageError(f"cannot write checkpoint metadata {target}: {e}") from e
        log.debug(
            "storage.metadata_written",
            job_id=checkpoint.job_id,
            checkpoint_id=checkpoint.checkpoint_id,
            path=target,
            bytes=len(payload),
        )
        return target

    def read_metadata(self, path_or_directory: str) -> CompletedCheckpoint:
        """Read a ``_metadata`` file, or the one in a checkpoint/savepoint directory.

        Relative state paths (savepoints) are resolved against the directory the file is in,
        and a savepoint's ``external_path`` becomes that directory. On S3 a location whose last
        segment is ``_metadata`` is the file, any other the directory (one GET, no LIST).
        """
        if not isinstance(path_or_directory, str) or not path_or_directory.strip():
            raise InvalidArgumentError("checkpoint path is empty")
        location = path_or_directory.strip()
        if is_object_store_uri(location):
            location = s3_location(location, what="checkpoint path")
            parent, name = _s3_split(location)
            if name == METADATA_FILE:
                directory, path = parent, location
            else:
                directory, path = location, _s3_join(location, METADATA_FILE)
            try:
                raw = self.store(path).read(path)
            except FileNotFoundError:
                raise CheckpointNotFoundError(_no_metadata(path)) from None
            except OSError as e:
                raise StorageError(f"cannot read checkpoint metadata {path}: {e}") from e
            return _decode_metadata(raw, path, directory)
        try:
            local = local_path_from_uri(location, what="checkpoint path")
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        if "\x00" in local:
            raise InvalidArgumentError(
                f"checkpoint path {path_or_directory!r:.200} contains a NUL byte"
            )
        local = os.path.normpath(os.path.abspath(local))
        if os.path.isdir(local):
            directory, path = local, os.path.join(local, METADATA_FILE)
        else:
            directory, path = os.path.dirname(local), local
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointNotFoundError(_no_metadata(path)) from None
        except IsADirectoryError:
            raise InvalidArgumentError(f"{path} is a directory, not a metadata file") from None
        except OSError as e:
            raise StorageError(f"cannot read checkpoint metadata {path}: {e}") from e
        return _decode_metadata(raw, path, directory)

    # --- path validation and deletion ----------------------------------------------------------

    def validate_state_path(
        self, job_id: str, path: str, allowed_extra_dirs: Iterable[str] = ()
    ) -> str:
        """Return the normalised absolute path of ``path`` if it lies inside the job's
        directory or one of ``allowed_extra_dirs`` (savepoint directories); else raise
        :class:`InvalidStatePathError`. Locally ``file://`` URIs, ``..`` and symlinks are
        resolved; on S3 the key must lie under the directory's prefix (``..`` refused); empty
        and relative paths are refused."""
        job_root = self.job_dir(job_id)
        if not isinstance(path, str) or not path.strip():
            raise InvalidStatePathError(f"empty state path: state must lie inside {job_root}")
        extras = [e for e in allowed_extra_dirs if e]
        if is_object_store_uri(path):
            return self._validate_s3_state_path(job_root, path, extras)
        try:
            local = local_path_from_uri(path, what="state path")
        except ConfigError as e:
            raise InvalidStatePathError(f"{e}; state must lie inside {job_root}") from None
        if "\x00" in local:
            raise InvalidStatePathError(f"state path {path!r:.200} contains a NUL byte")
        if not os.path.isabs(local):
            raise InvalidStatePathError(
                f"state path {path!r:.200} is relative: state paths must be absolute and lie "
                f"inside {job_root}"
            )
        real = os.path.realpath(local)
        # The job directory is *not* resolved: if it were itself a symlink, nothing validates.
        roots = [] if is_object_store_uri(job_root) else [job_root]
        for extra in extras:
            if is_object_store_uri(extra):
                continue
            try:
                extra_local = local_path_from_uri(extra, what="allowed directory")
            except ConfigError as e:
                raise InvalidArgumentError(str(e)) from None
            if "\x00" in extra_local or not os.path.isabs(extra_local):
                raise InvalidArgumentError(f"allowed directory {extra!r:.200} must be absolute")
            roots.append(os.path.realpath(extra_local))
        for root in roots:
            if is_relative_to(real, root):
                return real
        allowed = " or ".join(dict.fromkeys([job_root, *roots]))
        raise InvalidStatePathError(
            f"state path {path!r:.200} (resolved to {real:.200}) lies outside {allowed:.600}; "
            "it is not touched"
        )

    @staticmethod
    def _validate_s3_state_path(job_root: str, path: str, extras: list[str]) -> str:
        try:
            key = s3_location(path, what="state path", error=InvalidStatePathError)
        except InvalidStatePathError as e:
            raise InvalidStatePathError(f"{e}; state must lie inside {job_root}") from None
        roots = [job_root] if is_object_store_uri(job_root) else []
        roots += [
            s3_location(e, what="allowed directory") for e in extras if is_object_store_uri(e)
        ]
        for root in roots:
            if key.startswith(root + "/"):
                return key
        if not roots:
            raise InvalidStatePathError(
                f"state path {path!r:.200} uses the URI scheme 's3' but the job's storage is "
                f"{job_root}: state must lie inside it; it is not touched"
            )
        allowed = " or ".join(dict.fromkeys([job_root, *roots]))
        raise InvalidStatePathError(
            f"state path {path!r:.200} lies outside {allowed:.600}; it is not touched"
        )

    def discard_state(
        self, job_id: str, paths: Iterable[str], allowed_extra_dirs: Iterable[str] = ()
    ) -> int:
        """Delete the state files at ``paths`` that validate; returns how many were deleted
        (on S3: how many were asked for, in batched ``DeleteObjects`` requests).

        Paths that do not validate are logged and skipped (never deleted); missing files are
        fine; directories are skipped; I/O errors are logged (discarding is best-effort).
        """
        self.job_dir(job_id)  # an invalid job id is the caller's bug: raise, once
        extra = tuple(allowed_extra_dirs)
        deleted = 0
        seen: set[str] = set()
        objects: list[str] = []
        for path in paths:
            try:
                real = self.validate_state_path(job_id, path, extra)
            except InvalidArgumentError as e:
                log.warning("storage.discard_refused", job_id=job_id, path=path, error=str(e))
                continue
            if real in seen:
                continue
            seen.add(real)
            if is_object_store_uri(real):
                objects.append(real)
                continue
            try:
                if os.path.isdir(real):
                    log.warning("storage.discard_skipped_directory", job_id=job_id, path=real)
                    continue
                os.unlink(real)
                deleted += 1
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("storage.discard_failed", job_id=job_id, path=real, error=str(e))
        if objects:
            try:
                deleted += self.store(objects[0]).delete(objects)
            except (OSError, StorageError) as e:
                log.warning("storage.discard_failed", job_id=job_id, path=objects[0], error=str(e))
        if deleted:
            log.debug("storage.state_discarded", job_id=job_id, files=deleted)
        return deleted

    def delete_checkpoint(
        self, job_id: str, checkpoint_id: int, checkpoint: CompletedCheckpoint | None = None
    ) -> bool:
        """Remove checkpoint ``<root>/<job_id>/chk-<id>``; False if there was nothing to remove.

        Locally the directory is removed recursively. On S3 (never a LIST): the state files
        inside ``chk-<id>/`` that ``checkpoint`` names, or, without it, that its ``_metadata``
        names (one GET), plus the ``_metadata``, in one batched delete. Files outside
        ``chk-<id>/`` (shared state) are kept, as locally."""
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        if is_object_store_uri(directory):
            return self._delete_s3_checkpoint(job_id, checkpoint_id, directory, checkpoint)
        job_root = self.job_dir(job_id)
        if os.path.islink(directory) or os.path.realpath(directory) != directory:
            # A symlinked chk dir (or job dir): never follow it out of the job's directory.
            raise InvalidStatePathError(
                f"refusing to delete {directory}: it resolves to {os.path.realpath(directory)}, "
                f"outside {job_root}"
            )
        if not _remove_tree(directory):
            return False
        log.debug("storage.checkpoint_deleted", job_id=job_id, checkpoint_id=checkpoint_id)
        return True

    def delete_checkpoint_dir(self, job_id: str, checkpoint_id: int) -> bool:
        """Remove everything under ``<root>/<job_id>/chk-<id>`` (a checkpoint that never
        completed: aborted, refused after its id was allocated, or an orphan); False if there
        was nothing. A symlinked ``chk-<id>`` is unlinked, never followed. Locally a late writer
        (a task still writing when the abort is decided) is tolerated: a few retries, then
        :class:`StorageError` and the orphan sweep's next run. On S3 one LIST of the prefix
        (off the checkpoint path: the sweep, or an allocation that never triggered)."""
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        if is_object_store_uri(directory):
            store = self.store(directory)
            try:
                objects = store.list(directory)
                if objects:
                    store.delete(objects)
            except OSError as e:
                raise StorageError(f"cannot delete {directory}: {e}") from e
            return bool(objects)
        try:
            if os.path.islink(directory) or (
                os.path.lexists(directory) and not os.path.isdir(directory)
            ):
                os.unlink(directory)  # removes a link itself, never its target
                return True
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StorageError(f"cannot delete {directory}: {e}") from e
        return self.delete_checkpoint(job_id, checkpoint_id)

    def _delete_s3_checkpoint(
        self,
        job_id: str,
        checkpoint_id: int,
        directory: str,
        checkpoint: CompletedCheckpoint | None,
    ) -> bool:
        if checkpoint is None:
            try:
                checkpoint = self.read_metadata(directory)
            except CheckpointNotFoundError:
                return False  # never completed: leftovers go with the orphans at start-up
        objects = []
        for path in checkpoint.state_paths():
            key = location_key(path)
            if is_inside(key, directory):
                objects.append(key)
        objects.append(_s3_join(directory, METADATA_FILE))  # last: a retry finds it still
        self.store(directory).delete(dict.fromkeys(objects))
        log.debug(
            "storage.checkpoint_deleted",
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            objects=len(objects),
        )
        return True

    def dispose_savepoint(self, path: str) -> str:
        """Delete a savepoint directory (or the directory of a ``_metadata`` path).

        Refused with :class:`InvalidArgumentError` unless the directory holds a valid savepoint
        ``_metadata``; a missing directory raises :class:`CheckpointNotFoundError`. Returns the
        deleted directory. State files outside the directory are never deleted. On S3 every
        object under the savepoint's prefix is deleted (one LIST: disposal is off the hot
        path), ``_metadata`` last, so an interrupted disposal can be repeated.
        """
        if not isinstance(path, str) or not path.strip():
            raise InvalidArgumentError("savepoint path is empty")
        if is_object_store_uri(path.strip()):
            return self._dispose_s3_savepoint(path.strip())
        try:
            local = local_path_from_uri(path.strip(), what="savepoint path")
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        if "\x00" in local or not os.path.isabs(local):
            raise InvalidArgumentError(f"savepoint path {path!r:.200} must be an absolute path")
        local = os.path.realpath(local)
        directory = local
        if os.path.basename(local) == METADATA_FILE and not os.path.isdir(local):
            directory = os.path.dirname(local)
        if not os.path.isdir(directory):
            raise CheckpointNotFoundError(f"no savepoint directory at {directory}")
        if not os.path.isfile(os.path.join(directory, METADATA_FILE)):
            raise InvalidArgumentError(_not_a_savepoint_dir(directory))
        checkpoint = self.read_metadata(directory)  # InvalidArgumentError when malformed
        self._check_disposable(checkpoint, directory)
        try:
            shutil.rmtree(directory)
        except OSError as e:
            raise StorageError(f"cannot delete savepoint directory {directory}: {e}") from e
        log.info(
            "storage.savepoint_disposed",
            job_id=checkpoint.job_id,
            checkpoint_id=checkpoint.checkpoint_id,
            path=directory,
        )
        return directory

    def _dispose_s3_savepoint(self, path: str) -> str:
        location = s3_location(path, what="savepoint path")
        parent, name = _s3_split(location)
        directory = parent if name == METADATA_FILE else location
        store = self.store(directory)
        try:
            checkpoint = self.read_metadata(directory)
        except CheckpointNotFoundError:
            if store.list(directory):
                raise InvalidArgumentError(_not_a_savepoint_dir(directory)) from None
            raise CheckpointNotFoundError(f"no savepoint at {directory}") from None
        self._check_disposable(checkpoint, directory)
        metadata = _s3_join(directory, METADATA_FILE)
        store.delete([o for o in store.list(directory) if o != metadata])
        store.delete([metadata])
        log.info(
            "storage.savepoint_disposed",
            job_id=checkpoint.job_id,
            checkpoint_id=checkpoint.checkpoint_id,
            path=directory,
        )
        return directory

    @staticmethod
    def _check_disposable(checkpoint: CompletedCheckpoint, directory: str) -> None:
        if not checkpoint.kind.is_savepoint:
            raise InvalidArgumentError(
                f"refusing to dispose {directory}: it holds checkpoint "
                f"{checkpoint.checkpoint_id}, not a savepoint (checkpoints are removed by "
                "retention)"
            )
        directory_key = location_key(directory)
        outside = [
            p for p in checkpoint.state_paths() if not is_inside(location_key(p), directory_key)
        ]
        if outside:
            log.warning(
                "storage.savepoint_external_state_kept",
                path=directory,
                files=len(outside),
            )

    def delete_incomplete_savepoint(self, directory: str) -> bool:
        """Delete a savepoint directory that has no ``_metadata`` (an aborted savepoint, or one
        pending when the coordinator stopped); one with ``_metadata`` is kept. Returns whether
        anything was deleted. Best effort; on S3 a HEAD and a LIST (savepoints are rare)."""
        if not directory:
            return False
        if is_object_store_uri(directory):
            try:
                directory = s3_location(directory, what="savepoint directory")
                store = self.store(directory)
                if store.exists(_s3_join(directory, METADATA_FILE)):
                    return False
                objects = store.list(directory)
                store.delete(objects)
            except (OSError, SnapflowError) as e:
                log.warning("storage.savepoint_cleanup_failed", path=directory, error=str(e))
                return False
            return bool(objects)
        directory = directory.removeprefix("file://")
        if os.path.exists(os.path.join(directory, METADATA_FILE)):
            return False
        existed = os.path.lexists(directory)
        shutil.rmtree(directory, ignore_errors=True)
        return existed

    def shared_dir(self, job_id: str) -> str:
        """``<root>/<job_id>/shared`` (absolute): state shared between checkpoints."""
        return self._join(self.job_dir(job_id), SHARED_DIR)

    def list_shared(self, job_id: str) -> list[str]:
        """Every file in the job's shared directory (one LIST on S3: the orphan sweep only)."""
        directory = self.shared_dir(job_id)
        if is_object_store_uri(directory):
            return self.store(directory).list(directory)
        out: list[str] = []
        for parent, _, files in os.walk(directory):
            out.extend(os.path.join(parent, f) for f in files if not f.startswith("."))
        return sorted(out)

    def list_checkpoint_ids(self, job_id: str) -> list[int]:
        """Ids of the ``chk-<id>`` directories present for the job, ascending (on S3: the
        prefixes holding at least one object; one LIST, at start-up only)."""
        job_root = self.job_dir(job_id)
        if is_object_store_uri(job_root):
            return sorted(self._s3_checkpoint_objects(job_root))
        try:
            names = os.listdir(job_root)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise StorageError(f"cannot list {job_root}: {e}") from e
        ids = []
        for name in names:
            m = _CHECKPOINT_DIR_RE.match(name)
            if m:
                ids.append(int(m.group(1)))
        return sorted(ids)

    def _s3_checkpoint_objects(self, job_root: str) -> dict[int, list[str]]:
        """The objects under ``<job_root>/chk-<id>/``, by id."""
        out: dict[int, list[str]] = {}
        for obj in self.store(job_root).list(job_root):
            first, _, rest = obj[len(job_root) + 1 :].partition("/")
            m = _CHECKPOINT_DIR_RE.match(first)
            if m and rest:
                out.setdefault(int(m.group(1)), []).append(obj)
        return out

    def cleanup_orphans(self, job_id: str, keep_checkpoint_ids: Iterable[int]) -> list[int]:
        """Delete every ``chk-<id>`` directory of the job whose id is not in
        ``keep_checkpoint_ids``; returns the deleted ids, ascending.

        Used after a coordinator restart, before any new checkpoint is triggered for the job,
        to drop the state of checkpoints that never completed (on S3: one LIST of the job's
        prefix, then batched deletes).
        """
        keep = {int(i) for i in keep_checkpoint_ids}
        job_root = self.job_dir(job_id)
        if is_object_store_uri(job_root):
            return self._cleanup_s3_orphans(job_id, job_root, keep)
        deleted: list[int] = []
        for checkpoint_id in self.list_checkpoint_ids(job_id):
            if checkpoint_id in keep:
                continue
            directory = os.path.join(job_root, f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")
            try:
                if os.path.islink(directory) or not os.path.isdir(directory):
                    os.unlink(directory)  # removes a link itself, never its target
                else:
                    self.delete_checkpoint(job_id, checkpoint_id)
            except FileNotFoundError:
                pass
            except (OSError, StorageError, InvalidArgumentError) as e:
                log.warning(
                    "storage.orphan_cleanup_failed",
                    job_id=job_id,
                    checkpoint_id=checkpoint_id,
                    error=str(e),
                )
                continue
            deleted.append(checkpoint_id)
        if deleted:
            log.info("storage.orphans_deleted", job_id=job_id, checkpoint_ids=deleted)
        return deleted

    def _cleanup_s3_orphans(self, job_id: str, job_root: str, keep: set[int]) -> list[int]:
        try:
            orphans = {
                cid: objs
                for cid, objs in self._s3_checkpoint_objects(job_root).items()
                if cid not in keep
            }
            self.store(job_root).delete(o for objs in orphans.values() for o in objs)
        except (OSError, StorageError) as e:
            log.warning("storage.orphan_cleanup_failed", job_id=job_id, error=str(e))
            return []
        deleted = sorted(orphans)
        if deleted:
            log.info("storage.orphans_deleted", job_id=job_id, checkpoint_ids=deleted)
        return deleted

    def state_size(self, paths: Iterable[str]) -> int:
        """Total size in bytes of the files at ``paths`` that exist (a HEAD per S3 object); a
        path named several times (the handles of one merged object) counts once."""
        total = 0
        for path in dict.fromkeys(paths):
            try:
                if is_object_store_uri(path):
                    total += self.store(path).size(path)
                else:
                    total += os.path.getsize(local_path_from_uri(path))
            except (OSError, SnapflowError):
                continue
        return total

    # --- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _absolute(directory: str, *, what: str) -> str:
        if not isinstance(directory, str) or not directory.strip():
            raise InvalidArgumentError(f"{what} is empty")
        if is_object_store_uri(directory):
            return s3_location(directory, what=what)
        try:
            local = local_path_from_uri(directory, what=what)
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        if "\x00" in local or not os.path.isabs(local):
            raise InvalidArgumentError(f"{what} {directory!r:.200} must be an absolute path")
        return os.path.normpath(local)


def _remove_tree(directory: str) -> bool:
    """``shutil.rmtree`` that tolerates a concurrent writer (a file created or removed during
    the walk: ENOTEMPTY, ENOENT); False when there was nothing to remove."""
    for attempt in range(_REMOVE_ATTEMPTS):
        if not os.path.lexists(directory):
            return attempt > 0
        try:
            shutil.rmtree(directory)
            return True
        except OSError as e:
            if e.errno not in _RACE_ERRNOS:
                raise StorageError(f"cannot delete checkpoint directory {directory}: {e}") from e
            if attempt + 1 == _REMOVE_ATTEMPTS:
                raise StorageError(
                    f"cannot delete checkpoint directory {directory}: still being written "
                    f"({e.strerror}); the orphan sweep retries"
                ) from e
            time.sleep(_REMOVE_RETRY_S * (attempt + 1))
    return False  # pragma: no cover - the loop returns or raises


def _no_metadata(path: str) -> str:
    return (
        f"no checkpoint metadata at {path} (expected a checkpoint or savepoint directory "
        f"containing {METADATA_FILE}, or the {METADATA_FILE} file itself)"
    )


def _not_a_savepoint_dir(directory: str) -> str:
    return (
        f"refusing to dispose {directory}: it has no {METADATA_FILE}, so it is not a "
        "savepoint directory"
    )


def _relativize(record: dict[str, Any], directory: str) -> dict[str, Any]:
    """Savepoint record: paths inside ``directory`` become relative to it."""
    if is_object_store_uri(directory):

        def rel(path: str) -> str:
            if not is_object_store_uri(path):
                return path
            key = location_key(path)
            return key[len(directory) + 1 :] if is_inside(key, directory) else path

    else:
        real_dir = os.path.realpath(directory)

        def rel(path: str) -> str:
            try:
                local = local_path_from_uri(path)
            except ConfigError:
                return path
            if not os.path.isabs(local):
                return path
            real = os.path.realpath(local)
            if is_relative_to(real, real_dir):
                return os.path.relpath(real, real_dir)
            return path

    record = dict(record)
    record["external_path"] = "."
    subtasks = []
    for ack in record["subtask_states"]:
        ack = dict(ack)
        ack["operator_states"] = [
            {**s, "handles": [{**h, "path": rel(h["path"])} for h in s["handles"]]}
            for s in ack["operator_states"]
        ]
        subtasks.append(ack)
    record["subtask_states"] = subtasks
    return record


def _resolve(path: str, directory: str) -> str:
    if not path or has_uri_scheme(path) or os.path.isabs(path):
        return path
    if is_object_store_uri(directory):
        bucket, _, key = directory[len("s3://") :].partition("/")
        joined = posixpath.normpath(posixpath.join("/" + key, path)).lstrip("/")
        return f"s3://{bucket}/{joined}"
    return os.path.normpath(os.path.join(directory, path))


def _decode_metadata(raw: bytes, path: str, directory: str) -> CompletedCheckpoint:
    def invalid(problem: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"invalid checkpoint metadata {path}: {problem}")

    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise invalid(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise invalid(
            f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); the file may be "
            "truncated or not a snapflow metadata file"
        ) from None
    if not isinstance(doc, dict):
        raise invalid(f"expected a JSON object, found {type(doc).__name__}")
    fmt = doc.get("format")
    if fmt != METADATA_FORMAT:
        raise invalid(f"format is {fmt!r}, expected {METADATA_FORMAT!r}")
    version = doc.get("version")
    if version != METADATA_VERSION or isinstance(version, bool):
        raise invalid(f"version {version!r} is not supported (supported: {METADATA_VERSION})")
    record = doc.get("checkpoint")
    if not isinstance(record, dict):
        raise invalid("the 'checkpoint' record is missing or not an object")
    try:
        checkpoint = CompletedCheckpoint.from_dict(record)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e)
        raise invalid(f"malformed checkpoint record: {detail}") from None

    external = checkpoint.external_path
    if (
        checkpoint.kind.is_savepoint
        or not external
        or not (os.path.isabs(external) or is_object_store_uri(external))
    ):
        external = directory
    subtasks = tuple(
        replace(
            ack,
            operator_states=tuple(
                replace(
                    s,
                    handles=tuple(replace(h, path=_resolve(h.path, directory)) for h in s.handles),
                )
                for s in ack.operator_states
            ),
        )
        for ack in checkpoint.subtask_states
    )
    return replace(checkpoint, external_path=external, subtask_states=subtasks)

"""Checkpoint storage on a local or shared (mounted) file system.

Layout (docs/coordinator.md, "Storage layout")::

    <root>/<job_id>/chk-<id>/            task state files of checkpoint <id> and its _metadata
    <root>/<job_id>/shared/              state shared between checkpoints (incremental)
    <root>/<job_id>/taskowned/           state owned by the tasks
    <target>/savepoint-<job6>-<hex12>/   a savepoint: state files and _metadata, self-contained

``_metadata`` is written atomically and never overwritten: the JSON goes to a temporary file in
the same directory, is fsynced, then hard-linked to ``_metadata`` (the link fails if the name
exists), the temporary name is removed and the directory fsynced. A crash leaves either no
``_metadata`` or a complete one.

Savepoint metadata records the state files that lie inside the savepoint directory relative to
it, so a savepoint directory can be moved or copied and still be restored;
:meth:`CheckpointStorage.read_metadata` resolves them against the directory it read from.

Nothing here ever deletes a file outside the job's directory (or an explicitly allowed savepoint
directory): every path a worker or a metadata file hands us is normalised (``file://`` prefix,
``..``, symlinks) and checked first.

All methods are synchronous and blocking; the coordinator calls them via ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlsplit

import structlog

from snapflow.coordinator.model import CompletedCheckpoint
from snapflow.durable_files import fsync_dir
from snapflow.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    ConfigError,
    InvalidArgumentError,
    InvalidStatePathError,
    StorageError,
)

log = structlog.get_logger(__name__)

METADATA_FILE = "_metadata"
METADATA_FORMAT = "snapflow-checkpoint-metadata"
METADATA_VERSION = 1
CHECKPOINT_DIR_PREFIX = "chk-"
SAVEPOINTS_DIR = "savepoints"

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# Only canonical names (no leading zeros): "chk-007" is not ours and is left alone.
_CHECKPOINT_DIR_RE = re.compile(r"^chk-(0|[1-9][0-9]*)$")
_SAFE_JOB_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
# os.link is not supported everywhere (some FUSE / SMB / object-store mounts).
_NO_HARDLINK_ERRNOS = frozenset(
    e
    for e in (
        errno.EPERM,
        errno.EXDEV,
        errno.EMLINK,
        getattr(errno, "ENOTSUP", None),
        getattr(errno, "EOPNOTSUPP", None),
        getattr(errno, "ENOSYS", None),
    )
    if e is not None
)


def local_path_from_uri(location: str, *, what: str = "path") -> str:
    """Return the file-system path of ``location`` (a plain path or a ``file://`` URI).

    Any other URI scheme raises :class:`ConfigError`: only local or shared (mounted) file systems
    are supported in this version. The result is not made absolute.
    """
    match = _SCHEME_RE.match(location)
    if not match:
        return location
    scheme = match.group(1).lower()
    if scheme != "file":
        raise ConfigError(
            f"{what} {location!r} uses the URI scheme {scheme!r}: only local or shared file "
            "systems (a plain path or a file:// URI) are supported in this version"
        )
    parts = urlsplit(location)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"{what} {location!r} names the host {parts.netloc!r}: a file:// URI must be "
            "file:///absolute/path (mount shared storage and use the local path)"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{what} {location!r}: a file:// URI must not have a query or fragment")
    return unquote(parts.path)


def _is_relative_to(path: str, root: str) -> bool:
    """True when normalised absolute ``path`` lies strictly inside normalised ``root``."""
    if path == root:
        return False
    return os.path.commonpath([path, root]) == root


class CheckpointStorage:
    """Checkpoint and savepoint files under one root directory (a path or ``file://`` URI)."""

    def __init__(self, root: str) -> None:
        if not isinstance(root, str) or not root.strip():
            raise ConfigError("storage root is empty: set storage_root to a directory path")
        path = local_path_from_uri(root.strip(), what="storage root")
        if "\x00" in path:
            raise ConfigError(f"storage root {root!r} contains a NUL byte")
        # Resolved once: every containment check compares real paths against this.
        self._root = os.path.realpath(os.path.abspath(path))

    def __repr__(self) -> str:
        return f"CheckpointStorage({self._root!r})"

    @property
    def root(self) -> str:
        """The absolute, symlink-free root directory."""
        return self._root

    # --- paths ------------------------------------------------------------------------------

    def job_dir(self, job_id: str) -> str:
        """``<root>/<job_id>`` (absolute). The job id must be a single safe path component."""
        if (
            not isinstance(job_id, str)
            or not _SAFE_JOB_ID_RE.match(job_id)
            or job_id in (".", "..")
        ):
            raise InvalidArgumentError(
                f"invalid job id {job_id!r}: expected letters, digits, '_', '-' or '.' "
                "(a 32-character hex id)"
            )
        return os.path.join(self._root, job_id)

    def checkpoint_dir(self, job_id: str, checkpoint_id: int) -> str:
        """``<root>/<job_id>/chk-<checkpoint_id>`` (absolute)."""
        if (
            isinstance(checkpoint_id, bool)
            or not isinstance(checkpoint_id, int)
            or checkpoint_id < 0
        ):
            raise InvalidArgumentError(
                f"invalid checkpoint id {checkpoint_id!r}: expected a non-negative integer"
            )
        return os.path.join(self.job_dir(job_id), f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")

    def savepoint_dir(self, target_directory: str, job_id: str, checkpoint_id: int) -> str:
        """A fresh savepoint directory path (not created): Flink's
        ``<target>/savepoint-<first 6 chars of job id>-<12 random hex>``.

        An empty ``target_directory`` means ``<root>/savepoints``. A target must be absolute
        (the coordinator's working directory means nothing to the caller).
        ``checkpoint_id`` is not part of the name (as in Flink); it is accepted for symmetry.
        """
        job_prefix = os.path.basename(self.job_dir(job_id))[:6]
        if target_directory:
            try:
                target = local_path_from_uri(target_directory, what="savepoint target directory")
            except ConfigError as e:
                raise InvalidArgumentError(str(e)) from None
            if "\x00" in target or not os.path.isabs(target):
                raise InvalidArgumentError(
                    f"savepoint target directory {target_directory!r} must be an absolute path "
                    "or a file:// URI"
                )
            target = os.path.normpath(target)
        else:
            target = os.path.join(self._root, SAVEPOINTS_DIR)
        return os.path.join(target, f"savepoint-{job_prefix}-{secrets.token_hex(6)}")

    def ensure_directory(self, directory: str) -> str:
        """Create ``directory`` (and parents) if missing; returns its absolute path."""
        path = self._absolute(directory, what="directory")
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create directory {path}: {e}") from e
        return path

    # --- metadata ---------------------------------------------------------------------------

    def write_metadata(self, directory: str, checkpoint: CompletedCheckpoint) -> str:
        """Write ``<directory>/_metadata`` atomically, create-if-absent; returns its path.

        Raises :class:`AlreadyExistsError` if ``_metadata`` exists (it is never overwritten) and
        :class:`StorageError` on I/O errors.
        """
        directory = self._absolute(directory, what="checkpoint directory")
        target = os.path.join(directory, METADATA_FILE)
        record = checkpoint.to_dict()
        if checkpoint.kind.is_savepoint:
            record = _relativize(record, directory)
        payload = json.dumps(
            {"format": METADATA_FORMAT, "version": METADATA_VERSION, "checkpoint": record},
            sort_keys=True,
            separators=(",", ":"),
        ).encode("utf-8")

        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create checkpoint directory {directory}: {e}") from e
        if os.path.lexists(target):
            raise AlreadyExistsError(f"checkpoint metadata {target} already exists")

        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{METADATA_FILE}.", suffix=".tmp", dir=directory)
        except OSError as e:
            raise StorageError(f"cannot create a temporary file in {directory}: {e}") from e
        try:
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from readers
                    f.write(payload)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise AlreadyExistsError(
                        f"checkpoint metadata {target} already exists"
                    ) from None
                except OSError as e:
                    if e.errno not in _NO_HARDLINK_ERRNOS:
                        raise
                    _write_exclusive(target, payload)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            fsync_dir(directory)
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
        and a savepoint's ``external_path`` becomes that directory.
        """
        if not isinstance(path_or_directory, str) or not path_or_directory.strip():
            raise InvalidArgumentError("checkpoint path is empty")
        try:
            local = local_path_from_uri(path_or_directory.strip(), what="checkpoint path")
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        if "\x00" in local:
            raise InvalidArgumentError(f"checkpoint path {path_or_directory!r} contains a NUL byte")
        local = os.path.normpath(os.path.abspath(local))
        if os.path.isdir(local):
            directory, path = local, os.path.join(local, METADATA_FILE)
        else:
            directory, path = os.path.dirname(local), local
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"no checkpoint metadata at {path} (expected a checkpoint or savepoint directory "
                f"containing {METADATA_FILE}, or the {METADATA_FILE} file itself)"
            ) from None
        except IsADirectoryError:
            raise InvalidArgumentError(f"{path} is a directory, not a metadata file") from None
        except OSError as e:
            raise StorageError(f"cannot read checkpoint metadata {path}: {e}") from e
        return _decode_metadata(raw, path, directory)

    # --- path validation and deletion ----------------------------------------------------------

    def validate_state_path(
        self, job_id: str, path: str, allowed_extra_dirs: Iterable[str] = ()
    ) -> str:
        """Return the real absolute path of ``path`` if it lies inside the job's directory or
        one of ``allowed_extra_dirs`` (savepoint directories); else raise
        :class:`InvalidStatePathError`. ``file://`` URIs, ``..`` and symlinks are resolved;
        empty and relative paths are refused."""
        job_root = self.job_dir(job_id)
        if not isinstance(path, str) or not path.strip():
            raise InvalidStatePathError(f"empty state path: state must lie inside {job_root}")
        try:
            local = local_path_from_uri(path, what="state path")
        except ConfigError as e:
            raise InvalidStatePathError(f"{e}; state must lie inside {job_root}") from None
        if "\x00" in local:
            raise InvalidStatePathError(f"state path {path!r} contains a NUL byte")
        if not os.path.isabs(local):
            raise InvalidStatePathError(
                f"state path {path!r} is relative: state paths must be absolute and lie "
                f"inside {job_root}"
            )
        real = os.path.realpath(local)
        # The job directory is *not* resolved: if it were itself a symlink, nothing validates.
        roots = [job_root]
        for extra in allowed_extra_dirs:
            if not extra:
                continue
            try:
                extra_local = local_path_from_uri(extra, what="allowed directory")
            except ConfigError as e:
                raise InvalidArgumentError(str(e)) from None
            if "\x00" in extra_local or not os.path.isabs(extra_local):
                raise InvalidArgumentError(f"allowed directory {extra!r} must be absolute")
            roots.append(os.path.realpath(extra_local))
        for root in roots:
            if _is_relative_to(real, root):
                return real
        allowed = " or ".join(roots)
        raise InvalidStatePathError(
            f"state path {path!r} (resolved to {real}) lies outside {allowed}; it is not touched"
        )

    def discard_state(
        self, job_id: str, paths: Iterable[str], allowed_extra_dirs: Iterable[str] = ()
    ) -> int:
        """Delete the state files at ``paths`` that validate; returns how many were deleted.

        Paths that do not validate are logged and skipped (never deleted); missing files are
        fine; directories are skipped; I/O errors are logged (discarding is best-effort).
        """
        self.job_dir(job_id)  # an invalid job id is the caller's bug: raise, once
        extra = tuple(allowed_extra_dirs)
        deleted = 0
        seen: set[str] = set()
        for path in paths:
            try:
                real = self.validate_state_path(job_id, path, extra)
            except InvalidArgumentError as e:
                log.warning("storage.discard_refused", job_id=job_id, path=path, error=str(e))
                continue
            if real in seen:
                continue
            seen.add(real)
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
        if deleted:
            log.debug("storage.state_discarded", job_id=job_id, files=deleted)
        return deleted

    def delete_checkpoint(self, job_id: str, checkpoint_id: int) -> bool:
        """Remove ``<root>/<job_id>/chk-<id>`` recursively; False if it did not exist."""
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        job_root = self.job_dir(job_id)
        if os.path.islink(directory) or os.path.realpath(directory) != directory:
            # A symlinked chk dir (or job dir): never follow it out of the job's directory.
            raise InvalidStatePathError(
                f"refusing to delete {directory}: it resolves to {os.path.realpath(directory)}, "
                f"outside {job_root}"
            )
        if not os.path.lexists(directory):
            return False
        try:
            shutil.rmtree(directory)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StorageError(f"cannot delete checkpoint directory {directory}: {e}") from e
        log.debug("storage.checkpoint_deleted", job_id=job_id, checkpoint_id=checkpoint_id)
        return True

    def dispose_savepoint(self, path: str) -> str:
        """Delete a savepoint directory (or the directory of a ``_metadata`` path).

        Refused with :class:`InvalidArgumentError` unless the directory holds a valid savepoint
        ``_metadata``; a missing directory raises :class:`CheckpointNotFoundError`. Returns the
        deleted directory. State files outside the directory are never deleted.
        """
        if not isinstance(path, str) or not path.strip():
            raise InvalidArgumentError("savepoint path is empty")
        try:
            local = local_path_from_uri(path.strip(), what="savepoint path")
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        if "\x00" in local or not os.path.isabs(local):
            raise InvalidArgumentError(f"savepoint path {path!r} must be an absolute path")
        local = os.path.realpath(local)
        directory = local
        if os.path.basename(local) == METADATA_FILE and not os.path.isdir(local):
            directory = os.path.dirname(local)
        if not os.path.isdir(directory):
            raise CheckpointNotFoundError(f"no savepoint directory at {directory}")
        if not os.path.isfile(os.path.join(directory, METADATA_FILE)):
            raise InvalidArgumentError(
                f"refusing to dispose {directory}: it has no {METADATA_FILE}, so it is not a "
                "savepoint directory"
            )
        checkpoint = self.read_metadata(directory)  # InvalidArgumentError when malformed
        if not checkpoint.kind.is_savepoint:
            raise InvalidArgumentError(
                f"refusing to dispose {directory}: it holds checkpoint "
                f"{checkpoint.checkpoint_id}, not a savepoint (checkpoints are removed by "
                "retention)"
            )
        outside = [
            p
            for p in checkpoint.state_paths()
            if not _is_relative_to(os.path.realpath(p), directory)
        ]
        if outside:
            log.warning(
                "storage.savepoint_external_state_kept",
                path=directory,
                files=len(outside),
            )
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

    def list_checkpoint_ids(self, job_id: str) -> list[int]:
        """Ids of the ``chk-<id>`` directories present for the job, ascending."""
        job_root = self.job_dir(job_id)
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

    def cleanup_orphans(self, job_id: str, keep_checkpoint_ids: Iterable[int]) -> list[int]:
        """Delete every ``chk-<id>`` directory of the job whose id is not in
        ``keep_checkpoint_ids``; returns the deleted ids, ascending.

        Used after a coordinator restart, before any new checkpoint is triggered for the job,
        to drop the state of checkpoints that never completed.
        """
        keep = {int(i) for i in keep_checkpoint_ids}
        job_root = self.job_dir(job_id)
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

    @staticmethod
    def state_size(paths: Iterable[str]) -> int:
        """Total size in bytes of the files at ``paths`` that exist."""
        total = 0
        for path in paths:
            try:
                total += os.path.getsize(local_path_from_uri(path))
            except (OSError, ConfigError):
                continue
        return total

    # --- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _absolute(directory: str, *, what: str) -> str:
        if not isinstance(directory, str) or not directory.strip():
            raise InvalidArgumentError(f"{what} is empty")
        try:
            local = local_path_from_uri(directory, what=what)
        except ConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        if "\x00" in local or not os.path.isabs(local):
            raise InvalidArgumentError(f"{what} {directory!r} must be an absolute path")
        return os.path.normpath(local)


def _write_exclusive(target: str, payload: bytes) -> None:
    """Fallback when hard links are unsupported: O_EXCL create, write, fsync."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise AlreadyExistsError(f"checkpoint metadata {target} already exists") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(target)
        raise


def _relativize(record: dict[str, Any], directory: str) -> dict[str, Any]:
    """Savepoint record: paths inside ``directory`` become relative to it."""
    real_dir = os.path.realpath(directory)

    def rel(path: str) -> str:
        try:
            local = local_path_from_uri(path)
        except ConfigError:
            return path
        if not os.path.isabs(local):
            return path
        real = os.path.realpath(local)
        if _is_relative_to(real, real_dir):
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
    if not path or _SCHEME_RE.match(path) or os.path.isabs(path):
        return path
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
    if checkpoint.kind.is_savepoint or not external or not os.path.isabs(external):
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

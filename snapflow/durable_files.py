"""Durable local files: what makes a write survive a crash (of the process or the machine).

* :func:`fsync_dir`: make a create, rename or unlink in a directory durable; the file's own
  ``fsync`` does not cover its directory entry.
* :func:`write_atomic`: write a whole file under its final name so that a reader sees either
  nothing or all of it (a temporary file in the same directory, fsynced, then renamed).
* :func:`create_exclusive`: the same, but only if the name does not exist yet: a second
  writer gets :class:`FileExistsError` and the first file stays (a hard link from the fsynced
  temporary file; ``O_EXCL`` where links are not supported).
* :func:`write_new_file`: a file under a new, unique name that nobody reads before the write
  returned (a snapshot's state file): durable in as few system calls as possible.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets


def fsync_dir(directory: str) -> None:
    """Make the entries of ``directory`` durable, where the platform allows it (best effort:
    some platforms cannot open a directory, some file systems refuse to fsync one)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: str, data: bytes | memoryview) -> None:
    """Create ``path`` (which must not exist) holding ``data``, durably: exclusive create, one
    write, fsync, close, the directory's fsync.

    No temporary name and no rename: the caller names the file to readers (a checkpoint's
    handles) only after this returned, so a crash leaves at most a partial file that nothing
    names, and a rename would only cost a second journal commit in the directory's fsync. Every
    system call gives the GIL away and must take it back, behind a thread running Python code
    (a record function): hence one write of the whole file rather than a buffered stream."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` all at once and durably, replacing any previous file."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)


# os.link is not supported everywhere (some FUSE / SMB mounts): fall back to O_EXCL.
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


def create_exclusive(path: str, data: bytes) -> None:
    """Create ``path`` with ``data`` durably, only if it does not exist; raise
    :class:`FileExistsError` otherwise. A crash leaves either no file or the whole one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    try:
        with open(tmp, "xb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if the name exists: never overwrites
        except OSError as e:
            if isinstance(e, FileExistsError) or e.errno not in _NO_HARDLINK_ERRNOS:
                raise
            _create_with_o_excl(path, data)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)


def _create_with_o_excl(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise

"""The local (or mounted shared) file system as a :class:`~snapflow.filestore.FileStore`."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import zlib
from collections.abc import Iterable
from typing import Any

from snapflow.durable_files import create_exclusive, fsync_dir, write_atomic
from snapflow.errors import AlreadyExistsError
from snapflow.filestore import TRANSFER_CHUNK_BYTES, FileStore, RequestKind

__all__ = ["LocalFileStore"]


def _crc_copy(reader: Any, writer: Any) -> tuple[int, int]:
    """Copy ``reader`` to ``writer`` in :data:`TRANSFER_CHUNK_BYTES` chunks; ``(size, crc)``."""
    size = crc = 0
    while chunk := reader.read(TRANSFER_CHUNK_BYTES):
        writer.write(chunk)
        size += len(chunk)
        crc = zlib.crc32(chunk, crc)
    return size, crc


class LocalFileStore(FileStore):
    """A POSIX file system. Requests are counted as an object store would bill them, so a local
    run shows the request budget a deployment on S3 would have."""

    def join(self, base: str, *names: str) -> str:
        return os.path.join(base, *names)

    def write(self, path: str, data: bytes) -> None:
        self.requests.add(RequestKind.PUT)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, data)

    def create(self, path: str, data: bytes) -> None:
        self.requests.add(RequestKind.PUT)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            create_exclusive(path, data)
        except FileExistsError:
            raise AlreadyExistsError(f"{path} already exists; it is never overwritten") from None

    def read(self, path: str) -> bytes:
        self.requests.add(RequestKind.GET)
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        self.requests.add(RequestKind.GET)
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def size(self, path: str) -> int:
        self.requests.add(RequestKind.HEAD)
        return os.stat(path).st_size

    def delete(self, paths: Iterable[str]) -> int:
        n = 0
        for path in paths:
            n += 1
            self.requests.add(RequestKind.DELETE)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return n

    def upload_file(self, path: str, local_path: str) -> None:
        """A hard link when both names are on one file system (the callers' files are
        immutable once written, as RocksDB's SST files are, so the object and the local file
        may share the inode; the data is fsynced, a link adds no bytes); a chunked copy to a
        temporary file, fsynced and renamed, otherwise."""
        self.requests.add(RequestKind.PUT)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        try:
            os.link(local_path, path)
        except FileExistsError:
            raise
        except OSError:
            tmp = f"{path}.tmp-{secrets.token_hex(6)}"
            try:
                with open(local_path, "rb") as src, open(tmp, "xb") as dst:
                    shutil.copyfileobj(src, dst, TRANSFER_CHUNK_BYTES)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(directory)

    def download_file(self, path: str, local_path: str) -> tuple[int, int]:
        self.requests.add(RequestKind.GET)
        with open(path, "rb") as src:
            try:
                with open(local_path, "xb") as dst:
                    return _crc_copy(src, dst)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(local_path)
                raise

    def list(self, prefix: str) -> list[str]:
        self.requests.add(RequestKind.LIST)
        out: list[str] = []
        for directory, _, files in os.walk(prefix):
            out.extend(os.path.join(directory, f) for f in files)
        return sorted(out)

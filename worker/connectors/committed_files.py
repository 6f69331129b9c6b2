"""Reading the part files a file sink committed, whatever their format: listing them in commit
order (:func:`committed_part_files`) and opening one (:func:`open_committed`), in a local
directory or under ``s3://bucket/prefix``. Each sink module reads its own format with these."""

from __future__ import annotations

import os
import re
from typing import Any

import pyarrow as pa

from snapflow.filestore import is_object_store_uri
from snapflow.filestore_registry import store_for


def committed_part_files(directory: str | os.PathLike[str], pattern: re.Pattern[str]) -> list[str]:
    """The files of ``directory`` (a path or ``s3://bucket/prefix``; not its subdirectories)
    whose names match ``pattern`` (groups: subtask, checkpoint, seq, token), ordered by
    (subtask, checkpoint, seq, token). On S3 an upload not yet completed is not an object,
    hence never listed."""
    directory = os.fspath(directory)
    paths: dict[str, str] = {}  # name -> path
    if is_object_store_uri(directory):
        base = directory.rstrip("/")
        for path in store_for(base).list(base):
            name = path[len(base) + 1 :]
            if "/" not in name:
                paths[name] = path
    else:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        paths = {name: os.path.join(directory, name) for name in names}
    parts = []
    for name, path in paths.items():
        m = pattern.match(name)
        if m:
            parts.append(((int(m[1]), int(m[2]), int(m[3]), m[4] or ""), path))
    parts.sort()
    return [path for _, path in parts]


def open_committed(path: str) -> Any:
    """A readable pyarrow source for a committed part file (a local path or ``s3://``)."""
    if is_object_store_uri(path):
        return pa.BufferReader(store_for(path).read(path))
    return pa.OSFile(path, "rb")

"""Local recovery of the disk backend (off by default, as Flink's
``state.backend.local-recovery``): the last completed checkpoint's RocksDB checkpoint kept on
local disk, and used by a restore of the same key groups instead of downloading.

With ``local_recovery_dir`` set (one directory per job, vertex and subtask,
:func:`local_copy_dir`, outside the instance's directory so that it outlives the task), a
checkpoint's RocksDB checkpoint directory (hard links) is kept after its upload instead of
deleted; when the checkpoint completes it becomes the subtask's local copy
(:func:`promote_local_copy`: moved to ``chk-<id>`` there, with a small ``local-copy.json``
naming the checkpoint and key groups), and the copy of any older checkpoint is deleted: at most
one per subtask. A restore of exactly the backend's key groups from one manifest uses the copy
when it is of the manifest's checkpoint (:func:`local_copy_mismatch`) and every SST the
manifest names is there with the manifest's size and CRC-32 (:func:`link_local_copy`): the SSTs
are hard-linked from it instead of downloaded (the manifest and the timers are still read from
storage). Otherwise the restore downloads, logging ``state.local_recovery_miss`` with the
reason. :func:`discard_local_copies` deletes a job's copies (the agent calls it when it sees the
job end).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from snapflow.filestore import file_crc32
from snapflow.worker.state.errors import CorruptStateError
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.rocksdb_restore import write_small_files

__all__ = [
    "LOCAL_COPY_META",
    "discard_local_copies",
    "link_local_copy",
    "local_copy_dir",
    "local_copy_mismatch",
    "promote_local_copy",
]

LOCAL_COPY_META = "local-copy.json"
"""In a local copy's directory: which checkpoint and key groups the copy is of."""


def promote_local_copy(
    root: str, checkpoint_id: int, kept: str, max_parallelism: int, key_groups: KeyGroupRange
) -> None:
    """Make ``kept`` (checkpoint ``checkpoint_id``'s RocksDB checkpoint) the subtask's local
    copy under ``root`` and delete the older ones. The metadata file goes in last: a copy
    without it (a crash in between) is never used."""
    os.makedirs(root, exist_ok=True)
    target = os.path.join(root, f"chk-{checkpoint_id}")
    shutil.rmtree(target, ignore_errors=True)
    shutil.move(kept, target)  # a rename on one file system; a copy across two
    meta = {
        "checkpoint_id": checkpoint_id,
        "max_parallelism": max_parallelism,
        "key_group_start": key_groups.start,
        "key_group_end": key_groups.end,
    }
    tmp = os.path.join(target, f".{LOCAL_COPY_META}.tmp")
    with open(tmp, "w") as f:
        json.dump(meta, f)
    os.replace(tmp, os.path.join(target, LOCAL_COPY_META))
    for name in os.listdir(root):
        if name != f"chk-{checkpoint_id}":
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def local_copy_mismatch(
    copy: str, checkpoint_id: Any, max_parallelism: int, key_groups: KeyGroupRange
) -> str | None:
    """Why the local copy at ``copy`` is not one of ``checkpoint_id`` for these key groups
    (``None``: it is)."""
    try:
        with open(os.path.join(copy, LOCAL_COPY_META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        return f"no local copy of checkpoint {checkpoint_id}"
    except (OSError, ValueError) as e:
        return f"unreadable local copy metadata: {e}"
    expected = {
        "checkpoint_id": checkpoint_id,
        "max_parallelism": max_parallelism,
        "key_group_start": key_groups.start,
        "key_group_end": key_groups.end,
    }
    if not isinstance(meta, dict):
        return "malformed local copy metadata"
    for name, value in expected.items():
        if meta.get(name) != value:
            return f"the local copy has {name} {meta.get(name)!r:.40}, the restore {value!r}"
    return None


def link_local_copy(
    manifest: dict[str, Any], copy: str, directory: str, manifest_path: str
) -> str | None:
    """The database directory of ``manifest`` with its SSTs hard-linked (copied where links
    fail) from ``copy``, each checked against the manifest's size and CRC-32. Returns why it
    could not be built (``None``: built)."""
    write_small_files(manifest, directory, manifest_path)
    for shared in manifest["ssts"]:
        if os.path.basename(shared.name) != shared.name:
            raise CorruptStateError(f"manifest {manifest_path}: malformed SST name")
        source, target = os.path.join(copy, shared.name), os.path.join(directory, shared.name)
        try:
            try:
                os.link(source, target)
            except FileNotFoundError:
                return f"the local copy lacks {shared.name}"
            except OSError:  # another file system, or no hard links: copy
                shutil.copyfile(source, target)
            size, crc = file_crc32(target)
        except OSError as e:
            return f"cannot read {shared.name} of the local copy: {e}"
        if size != shared.size or crc != shared.crc:
            return (
                f"{shared.name} of the local copy has {size} bytes with CRC-32 {crc:08x}, the "
                f"manifest says {shared.size} bytes with CRC-32 {shared.crc:08x}"
            )
    return None


def discard_local_copies(root: str, job_id: str) -> None:
    """Delete every local copy of job ``job_id`` under the local recovery root ``root``
    (the job ended: no restore will need them)."""
    shutil.rmtree(os.path.join(root, _safe_name(job_id)), ignore_errors=True)


def local_copy_dir(root: str, job_id: str, backend_name: str, subtask_index: int) -> str:
    """Where one keyed subtask keeps its local copy: ``<root>/<job>/<backend>/<subtask>``."""
    return os.path.join(root, _safe_name(job_id), _safe_name(backend_name), str(subtask_index))


def _safe_name(name: str) -> str:
    """``name`` as one path component."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"

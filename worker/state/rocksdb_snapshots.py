"""The asynchronous parts of the disk backend's snapshots, and the formats they write.

* A **checkpoint** is incremental (:class:`IncrementalSnapshotWriter`): every SST file of the
  RocksDB checkpoint that the last *completed* checkpoint (the last one whose completion the
  backend was told of, as Flink's ``RocksIncrementalSnapshotStrategy`` does) did not already
  upload goes to the job's shared directory (``<root>/<job>/shared/``, :func:`shared_dir_for`),
  ``upload_threads`` at a time; then a small manifest (kind ``incremental``: the SST files by
  name, path, size and CRC-32 (:class:`SharedFile`), plus the few small files that describe
  the database; read back by :func:`read_manifest`) goes into the checkpoint's directory. The
  acknowledgement names every SST file too (kinds ``shared-new`` and ``shared``), so the
  coordinator can count references to them (``coordinator/shared_state.py``). The timers are
  entries of the database (``rocksdb_timers.py``): no file of their own.
* A **savepoint** (and a snapshot without barrier options) is canonical
  (:class:`CanonicalSnapshotWriter`): the same key-group indexed ``keyed`` and ``timers`` files
  the heap backend writes, read from a RocksDB snapshot (consistent, no copy) one key group at
  a time. Either backend restores it, at any parallelism.

Both run on the snapshot's thread: they read the RocksDB checkpoint or snapshot, never the live
database or its cache.
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, NamedTuple, Protocol

from snapflow.checkpointing import INCREMENTAL, KEYED, SHARED, SHARED_NEW, TIMERS, StateHandle
from snapflow.errors import StorageError
from snapflow.filestore import file_crc32, is_object_store_uri
from snapflow.filestore_registry import store_for
from snapflow.worker.state.errors import CorruptStateError
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.rocksdb_layout import (
    MAP_KINDS,
    TIMER_STATE,
    decode_key,
    key_group_bounds,
    parse_entry,
    scan_range,
    split_map_key,
)
from snapflow.worker.state.rocksdb_timers import read_timers
from snapflow.worker.state.rocksdb_tuning import RocksDBTuning
from snapflow.worker.state.state_files import (
    MergedStateObject,
    StateFileReader,
    discard_files,
    pickle_section,
    state_file_name,
    write_state_file,
)

__all__ = [
    "SHARED_DIR",
    "CanonicalSnapshotWriter",
    "IncrementalSnapshotWriter",
    "SharedFile",
    "SnapshotSource",
    "read_manifest",
    "shared_dir_for",
]

SHARED_DIR = "shared"


def shared_dir_for(checkpoint_location: str) -> str:
    """The job's shared-state directory for a checkpoint's target location
    ``<root>/<job>/chk-<id>``: ``<root>/<job>/shared`` (the layout of
    ``coordinator/checkpoint_storage.py``, ``CheckpointStorage.shared_dir``; a test checks
    that the two agree)."""
    location = checkpoint_location.rstrip("/")
    if is_object_store_uri(location):
        return f"{location.rsplit('/', 1)[0]}/{SHARED_DIR}"
    return os.path.join(os.path.dirname(location), SHARED_DIR)


class SharedFile(NamedTuple):
    """An SST file in the shared directory: its name in the database, where it was uploaded,
    its size and CRC-32."""

    name: str
    path: str
    size: int
    crc: int


def read_manifest(reader: StateFileReader) -> dict[str, Any]:
    """The manifest an :class:`IncrementalSnapshotWriter` wrote (``ssts`` as
    :class:`SharedFile`, ``files``, ``states``), checked for its shape."""
    sections = reader.sections
    if len(sections) != 1:
        raise reader.corrupt(f"a manifest has one section, this one {len(sections)}")
    data = reader.read(sections[0])
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("ssts"), list)
        or not isinstance(data.get("files"), dict)
        or not isinstance(data.get("states"), dict)
    ):
        raise reader.corrupt("not an incremental-checkpoint manifest")
    try:
        data["ssts"] = [SharedFile(*entry) for entry in data["ssts"]]
    except TypeError:
        raise reader.corrupt("malformed SST entry in the manifest") from None
    return data


class SnapshotSource(Protocol):
    """What the writers need of the backend (``RocksDBKeyedStateBackend``)."""

    @property
    def name(self) -> str: ...

    @property
    def key_group_range(self) -> KeyGroupRange: ...

    @property
    def tuning(self) -> RocksDBTuning: ...

    @property
    def encoded_state_names(self) -> Mapping[bytes, str]: ...

    def snapshot_meta(
        self, kind: str, checkpoint_id: int, kinds: dict[str, str] | None
    ) -> dict[str, Any]: ...

    def checkpoint_written(
        self, checkpoint_id: int, files: dict[str, SharedFile], local_copy: str | None
    ) -> None: ...


_TIMER_NAME = TIMER_STATE.encode()


def _first_and_rest(sections: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]] | None:
    """``sections`` whole, or ``None`` when it yields nothing (then no file is written)."""
    first = next(sections, None)
    return None if first is None else itertools.chain([first], sections)


class CanonicalSnapshotWriter:
    """The asynchronous part of a canonical snapshot: the heap's ``keyed`` and ``timers``
    files, read from a RocksDB snapshot one key group at a time."""

    def __init__(
        self, backend: SnapshotSource, checkpoint_id: int, view: Any, kinds: dict[str, str]
    ) -> None:
        self.backend = backend
        self.checkpoint_id = checkpoint_id
        self.view = view
        self.kinds = kinds
        self.names = dict(backend.encoded_state_names)

    def _sections(self) -> Iterator[tuple[int, bytes]]:
        kg_range = self.backend.key_group_range
        for kg in range(kg_range.start, kg_range.end + 1):
            lower, upper = key_group_bounds(kg, kg)
            group: dict[str, dict[Any, Any]] = {}
            for key, raw in scan_range(self.view, lower, upper):
                _, name_bytes, rest = parse_entry(key)
                if name_bytes == _TIMER_NAME:
                    continue  # the timers file's
                name = self.names.get(name_bytes) or name_bytes.decode()
                kind = self.kinds.get(name)
                if kind is None:
                    raise CorruptStateError(f"state {name!r} has no registered kind")
                values = group.setdefault(name, {})
                if kind in MAP_KINDS:
                    user, sub = split_map_key(rest)
                    values.setdefault(decode_key(user), {})[decode_key(sub)] = pickle.loads(raw)
                else:
                    values[decode_key(rest)] = pickle.loads(raw)
            if group:
                yield kg, pickle_section(group, f"the keyed state of key group {kg}")

    def _timer_sections(self) -> Iterator[tuple[int, bytes]]:
        kg_range = self.backend.key_group_range
        for kg in range(kg_range.start, kg_range.end + 1):
            timers = read_timers(self.view, kg)
            if timers:
                yield kg, pickle_section(timers, "timers")

    def __call__(self, directory: str, into: MergedStateObject | None) -> list[StateHandle]:
        b = self.backend
        kg_range = b.key_group_range
        handles: list[StateHandle] = []
        try:
            sections = _first_and_rest(self._sections())
            if sections is not None:
                meta = b.snapshot_meta(KEYED, self.checkpoint_id, self.kinds)
                name = state_file_name(b.name, KEYED, self.checkpoint_id, kg_range)
                handles.append(
                    write_state_file(directory, name, KEYED, meta, sections, kg_range, into)
                )
            sections = _first_and_rest(self._timer_sections())
            if sections is not None:
                meta = b.snapshot_meta(TIMERS, self.checkpoint_id, None)
                name = state_file_name(b.name, TIMERS, self.checkpoint_id, kg_range)
                handles.append(
                    write_state_file(directory, name, TIMERS, meta, sections, kg_range, into)
                )
        except BaseException:
            if into is None:
                discard_files(handles)
            raise
        finally:
            self.view = None  # releases the RocksDB snapshot
        return handles


class IncrementalSnapshotWriter:
    """The asynchronous part of an incremental checkpoint: upload the SST files the last
    completed checkpoint did not (the timers among their entries), write the manifest;
    finally tell the backend what it wrote (``checkpoint_written``). ``keep``:
    keep the RocksDB checkpoint directory ``local`` for local recovery instead of deleting
    it."""

    def __init__(
        self,
        backend: SnapshotSource,
        checkpoint_id: int,
        local: str,
        shared_dir: str,
        kinds: dict[str, str],
        confirmed: dict[str, SharedFile],
        *,
        keep: bool,
    ) -> None:
        self.backend = backend
        self.checkpoint_id = checkpoint_id
        self.local = local
        self.shared_dir = shared_dir
        self.kinds = kinds
        self.confirmed = confirmed
        self.keep = keep
        self.uploaded_bytes = 0
        self.reused_bytes = 0

    def _upload(self, name: str) -> SharedFile:
        local = os.path.join(self.local, name)
        # Streamed, never whole in memory: a compaction's output can be gigabytes.
        size, crc = file_crc32(local)
        store = store_for(self.shared_dir)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.backend.name)
        # The uploading checkpoint's id is part of the name: the coordinator's orphan sweep
        # tells the files of ended checkpoints from those of pending ones by it
        # (coordinator/shared_state.py, ``creator_id``).
        unique = f"{safe}-chk{self.checkpoint_id}-{uuid.uuid4().hex[:16]}-{name}"
        path = store.join(self.shared_dir, unique)
        try:
            store.upload_file(path, local)
        except OSError as e:
            raise StorageError(f"cannot upload shared state file {path}: {e}") from e
        if not is_object_store_uri(path):
            path = os.path.abspath(path)
        return SharedFile(name, path, size, crc)

    def _upload_all(
        self, plan: list[tuple[str, SharedFile | None]], handles: list[StateHandle]
    ) -> list[SharedFile]:
        """Upload the planned new files, ``upload_threads`` at a time (the store's latency,
        not its bandwidth, bounds one upload on an object store); append one handle per SST
        to ``handles`` in ``plan`` order, also for the uploads that finished when one fails
        (so that the caller removes them)."""
        kg = self.backend.key_group_range
        todo = [name for name, reused in plan if reused is None]
        uploaded: dict[str, SharedFile] = {}
        error: BaseException | None = None
        threads = min(self.backend.tuning.upload_threads, len(todo))
        if threads <= 1:
            try:
                for name in todo:
                    uploaded[name] = self._upload(name)
            except BaseException as e:  # re-raised below, after the handles are listed
                error = e
        else:
            with ThreadPoolExecutor(threads, thread_name_prefix="sst-upload") as pool:
                futures = {pool.submit(self._upload, name): name for name in todo}
                for future in as_completed(futures):
                    try:
                        uploaded[futures[future]] = future.result()
                    except BaseException as e:  # re-raised below, after the handles are listed
                        error = error or e
        ssts: list[SharedFile] = []
        for name, reused in plan:
            shared = reused if reused is not None else uploaded.get(name)
            if shared is None:
                continue
            if reused is not None:
                self.reused_bytes += shared.size
            else:
                self.uploaded_bytes += shared.size
            ssts.append(shared)
            handles.append(
                StateHandle(
                    path=shared.path,
                    size_bytes=shared.size,
                    kind=SHARED if reused is not None else SHARED_NEW,
                    key_group_start=kg.start,
                    key_group_end=kg.end,
                    offset=0,
                )
            )
        if error is not None:
            raise error
        return ssts

    def __call__(self, directory: str, into: MergedStateObject | None) -> list[StateHandle]:
        b = self.backend
        kg = b.key_group_range
        handles: list[StateHandle] = []
        keep = False
        try:
            files: dict[str, bytes] = {}
            plan: list[tuple[str, SharedFile | None]] = []  # (name, reused file or None)
            for name in sorted(os.listdir(self.local)):
                if not name.endswith(".sst"):
                    with open(os.path.join(self.local, name), "rb") as f:
                        files[name] = f.read()
                    continue
                size = os.path.getsize(os.path.join(self.local, name))
                previous = self.confirmed.get(name)
                reuse = previous is not None and previous.size == size
                plan.append((name, previous if reuse else None))
            ssts = self._upload_all(plan, handles)
            manifest = {"ssts": [tuple(s) for s in ssts], "files": files, "states": self.kinds}
            meta = b.snapshot_meta(INCREMENTAL, self.checkpoint_id, self.kinds)
            handles.append(
                write_state_file(
                    directory,
                    state_file_name(b.name, INCREMENTAL, self.checkpoint_id, kg),
                    INCREMENTAL,
                    meta,
                    [(0, pickle_section(manifest, "the checkpoint manifest"))],
                    kg,
                    into,
                )
            )
            keep = self.keep
        except BaseException:
            # No orphans from a failed write: new uploads and whole files written so far.
            discard_files([h for h in handles if h.kind != SHARED])
            raise
        finally:
            if not keep:
                shutil.rmtree(self.local, ignore_errors=True)
        b.checkpoint_written(
            self.checkpoint_id, {s.name: s for s in ssts}, self.local if keep else None
        )
        return handles

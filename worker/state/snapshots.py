"""Snapshots in progress: the split of a snapshot into its synchronous and asynchronous parts.

A snapshot (``KeyedStateBackend.snapshot``, ``OperatorStateBackend.snapshot``) contains exactly
the state as of the moment the snapshot was taken: every entry of every registered (or
restored) state, every event-time timer, every operator list. Its synchronous part only freezes
a copy-on-write view (O(states x key groups), no copying of entries); the asynchronous part,
:meth:`SnapshotInProgress.write`, serialises that view while processing continues. Mutations
after the synchronous part never reach the written files: a key group's dict is copied on its
first write after a snapshot, and a list, map or aggregating accumulator is copied before its
first in-place change.

A heap keyed snapshot's asynchronous part is a :class:`KeyedSnapshotWriter` (its state and
timers, in the format of ``snapflow.worker.state.state_files``; the RocksDB backend's timers
are entries of its database, snapshotted with it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any

from snapflow.checkpointing import KEYED, TIMERS, StateHandle
from snapflow.errors import StateError
from snapflow.worker.state.keygroups import KEY_HASH_VERSION, KeyGroupRange
from snapflow.worker.state.state_files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MergedStateObject,
    discard_files,
    pickle_section,
    state_file_name,
    write_state_file,
)

__all__ = ["KeyedSnapshotWriter", "SnapshotInProgress", "SnapshotTracker"]


#: The asynchronous part of a snapshot: (directory, merged object or None) -> handles.
_Writer = Callable[[str, "MergedStateObject | None"], list[StateHandle]]


class SnapshotInProgress:
    """A snapshot whose synchronous part is done; :meth:`write` is the asynchronous part.

    ``write`` may run on another thread while the task keeps processing. Once written (or once
    the checkpoint is abandoned), call :meth:`release` from the task thread: the backend then
    stops copying on write until the next snapshot. Snapshots whose write returned or failed are
    released automatically when the backend takes its next snapshot.
    """

    def __init__(
        self,
        checkpoint_id: int,
        writer: _Writer,
        on_release: Callable[[SnapshotInProgress], None],
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.sync_duration_s = 0.0
        self.async_duration_s: float | None = None
        self.state_size_bytes = 0
        self.count_entries: Callable[[], int] | None = None
        """Counts the entries (keyed values, timers, list elements) :meth:`write` serialises,
        from the frozen view (so off the synchronous part, on any thread), where the backend
        can; None: unknown (a RocksDB snapshot). See :attr:`entries`."""
        self.handles: list[StateHandle] | None = None
        self._writer: _Writer | None = writer
        self._on_release: Callable[[SnapshotInProgress], None] | None = on_release
        self._status = "pending"  # pending | writing | written | failed | released

    @property
    def entries(self) -> int | None:
        """How many entries :meth:`write` serialises, or None when the backend cannot say. A
        few hundred encode in well under a millisecond, so such a snapshot may be encoded on
        the agent's loop instead of handed to a thread (``subtask_checkpoints``)."""
        count = self.count_entries
        return None if count is None else count()

    @property
    def done(self) -> bool:
        """True once :meth:`write` returned or raised."""
        return self._status in ("written", "failed")

    def write(
        self, directory: str | os.PathLike[str], *, into: MergedStateObject | None = None
    ) -> list[StateHandle]:
        """Serialise the snapshot into ``directory`` (a path, created if missing, or an
        ``s3://`` prefix); returns the handles of the files written (none for empty state).
        With ``into``, the files are appended to that object instead (the caller writes it).
        Idempotent once it succeeded."""
        if self._status == "written" and self.handles is not None:
            return list(self.handles)
        writer = self._writer
        if self._status in ("writing", "released") or writer is None:
            raise StateError(
                f"snapshot of checkpoint {self.checkpoint_id} cannot be written: {self._status}"
            )
        self._status = "writing"
        start = time.perf_counter()
        try:
            handles = writer(os.fspath(directory), into)
        except BaseException:
            self._status = "failed"
            raise
        self.async_duration_s = time.perf_counter() - start
        self.state_size_bytes = sum(h.size_bytes for h in handles)
        self.handles = handles
        self._writer = None  # drop the frozen view
        self._status = "written"
        return list(handles)

    def release(self) -> None:
        """The backend need not keep this snapshot's view isolated any longer (task thread)."""
        if self._status == "writing":
            raise StateError(
                f"snapshot of checkpoint {self.checkpoint_id} is being written; release it "
                "after write() returned"
            )
        if self._status == "released":
            return
        self._status = "released"
        self._writer = None
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release(self)


class SnapshotTracker:
    """The snapshots a backend keeps copy-on-write views for."""

    def __init__(self, thaw: Callable[[], None]) -> None:
        self._active: list[SnapshotInProgress] = []
        self._thaw = thaw

    def reap(self) -> None:
        for snap in [s for s in self._active if s.done]:
            snap.release()

    def add(self, snap: SnapshotInProgress) -> None:
        self._active.append(snap)

    def release(self, snap: SnapshotInProgress) -> None:
        with suppress(ValueError):
            self._active.remove(snap)
        if not self._active:
            self._thaw()


class KeyedSnapshotWriter:
    """The asynchronous part of a keyed snapshot: reads only the frozen view."""

    def __init__(
        self,
        checkpoint_id: int,
        max_parallelism: int,
        kg_range: KeyGroupRange,
        prefix: str,
        views: dict[str, tuple[str, list[dict[Any, Any]]]],
        timer_view: list[set[tuple[int, Any, Any]]],
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.max_parallelism = max_parallelism
        self.kg_range = kg_range
        self.prefix = prefix
        self.views = views
        self.timer_view = timer_view

    def _meta(self, kind: str) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": kind,
            "checkpoint_id": self.checkpoint_id,
            "max_parallelism": self.max_parallelism,
            "key_group_start": self.kg_range.start,
            "key_group_end": self.kg_range.end,
            "key_hash": KEY_HASH_VERSION,
        }

    def _keyed_sections(self) -> Iterator[tuple[int, bytes]]:
        for idx in range(len(self.kg_range)):
            group = {name: maps[idx] for name, (_, maps) in self.views.items() if maps[idx]}
            if group:
                kg = self.kg_range.start + idx
                yield kg, pickle_section(group, f"the keyed state of key group {kg}")

    def _timer_sections(self) -> Iterator[tuple[int, bytes]]:
        for idx, timers in enumerate(self.timer_view):
            if timers:
                yield self.kg_range.start + idx, pickle_section(list(timers), "timers")

    def __call__(self, directory: str, into: MergedStateObject | None = None) -> list[StateHandle]:
        handles: list[StateHandle] = []
        try:
            self._write(directory, handles, into)
        except BaseException:
            if into is None:
                discard_files(handles)  # no orphans from a failed write
            raise
        return handles

    def _write(
        self, directory: str, handles: list[StateHandle], into: MergedStateObject | None
    ) -> None:
        if any(maps[i] for _, maps in self.views.values() for i in range(len(maps))):
            meta = self._meta(KEYED)
            meta["states"] = {name: kind for name, (kind, _) in self.views.items()}
            name = state_file_name(self.prefix, KEYED, self.checkpoint_id, self.kg_range)
            handles.append(
                write_state_file(
                    directory, name, KEYED, meta, self._keyed_sections(), self.kg_range, into
                )
            )
        if any(self.timer_view):
            name = state_file_name(self.prefix, TIMERS, self.checkpoint_id, self.kg_range)
            handles.append(
                write_state_file(
                    directory,
                    name,
                    TIMERS,
                    self._meta(TIMERS),
                    self._timer_sections(),
                    self.kg_range,
                    into,
                )
            )

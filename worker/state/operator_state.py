"""Operator state: named lists of a non-keyed operator (source positions, buffered elements)
and broadcast state (named maps).

This is Flink's ``OperatorStateBackend`` (list, union list and broadcast state), in Python. A
*list* state is redistributed on restore (Flink's SPLIT_DISTRIBUTE); a *union* list state gives
every subtask the union of all subtasks' lists (Flink's UNION); a *broadcast* state
(:mod:`snapflow.worker.state.broadcast_state`) is checkpointed by every subtask, its own copy.

:meth:`OperatorStateBackend.restore` at an unchanged parallelism gives every subtask its own
lists back; at a changed parallelism it concatenates every list state's lists in old subtask
order and hands out contiguous, near-equal chunks (the first ``total % p`` subtasks get one
more element). Union states are the concatenation of all old subtasks' lists, for every
subtask, always. Broadcast states as Flink's ``RoundRobinOperatorStateRepartitioner`` hands
them out: at an unchanged parallelism each subtask gets its own copy back; at a changed one,
new subtask ``i`` gets the copy of the ``i % n``-th of the ``n`` old subtasks that wrote the
state (in subtask order): scaling 2 -> 3 gives subtasks 0, 1, 2 the copies of 0, 1, 0;
scaling 3 -> 2 gives them the copies of 0, 1 (old subtask 2's copy is dropped).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from snapflow.checkpointing import BROADCAST, OPERATOR, UNION, StateHandle
from snapflow.errors import StateError
from snapflow.worker.state.broadcast_state import BroadcastState
from snapflow.worker.state.errors import IncompatibleStateError
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.snapshots import SnapshotInProgress
from snapflow.worker.state.state_files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MergedStateObject,
    StateFileReader,
    handle_fields,
    pickle_section,
    state_file_name,
    write_state_file,
)

__all__ = [
    "SPLIT_DISTRIBUTE",
    "UNION_DISTRIBUTE",
    "OperatorListState",
    "OperatorStateBackend",
]

T = TypeVar("T")

SPLIT_DISTRIBUTE = "split"
UNION_DISTRIBUTE = "union"


class OperatorListState(Generic[T]):
    """A list of a non-keyed operator. ``mode`` is ``"split"`` (redistributed on restore) or
    ``"union"`` (every subtask gets all subtasks' elements on restore)."""

    def __init__(self, name: str, mode: str, items: list[T] | None = None) -> None:
        self.name = name
        self.mode = mode
        self._items: list[T] = items if items is not None else []

    def get(self) -> list[T]:
        return list(self._items)

    def add(self, value: T) -> None:
        self._items.append(value)

    def add_all(self, values: Iterable[T]) -> None:
        self._items.extend(values)

    def update(self, values: Iterable[T]) -> None:
        self._items = list(values)

    def clear(self) -> None:
        self._items = []

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))


class OperatorStateBackend:
    """Operator (non-keyed) list and union list state of one subtask."""

    def __init__(self, *, name: str = "") -> None:
        self.name = name
        self._states: dict[str, OperatorListState[Any]] = {}
        self._broadcast: dict[str, BroadcastState] = {}

    def _get(self, name: str, mode: str) -> OperatorListState[Any]:
        if not isinstance(name, str) or not name:
            raise StateError(f"state names are non-empty strings, got {name!r}")
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = OperatorListState(name, mode)
        elif state.mode != mode:
            raise IncompatibleStateError(
                f"operator state {name!r} is {state.mode} list state, it cannot be used as "
                f"{mode} list state"
            )
        return state

    def get_list_state(self, name: str) -> OperatorListState[Any]:
        """List state redistributed on restore (Flink's SPLIT_DISTRIBUTE)."""
        return self._get(name, SPLIT_DISTRIBUTE)

    def get_union_list_state(self, name: str) -> OperatorListState[Any]:
        """List state broadcast as the union of all subtasks' lists on restore (Flink's UNION)."""
        return self._get(name, UNION_DISTRIBUTE)

    def get_broadcast_state(self, name: str) -> BroadcastState:
        """The broadcast state ``name`` (a map), created empty on first use."""
        if not isinstance(name, str) or not name:
            raise StateError(f"state names are non-empty strings, got {name!r}")
        state = self._broadcast.get(name)
        if state is None:
            state = self._broadcast[name] = BroadcastState(name, {})
        return state

    def state_names(self) -> list[str]:
        return sorted(self._states)

    def broadcast_state_names(self) -> list[str]:
        return sorted(self._broadcast)

    def snapshot(self, checkpoint_id: int) -> SnapshotInProgress:
        """Synchronous part: a shallow copy of every list (operator state is small)."""
        start = time.perf_counter()
        split = {n: list(s._items) for n, s in self._states.items() if s.mode == SPLIT_DISTRIBUTE}
        union = {n: list(s._items) for n, s in self._states.items() if s.mode == UNION_DISTRIBUTE}
        # every registered broadcast state, empty ones too: a rescale picks old copies by
        # their position among the subtasks that wrote the state
        broadcast = {n: s.copy_entries() for n, s in self._broadcast.items()}
        prefix = self.name

        def write(directory: str, into: MergedStateObject | None) -> list[StateHandle]:
            handles = []
            parts: tuple[tuple[str, Mapping[str, Any]], ...] = (
                (OPERATOR, split),
                (UNION, union),
                (BROADCAST, broadcast),
            )
            for kind, lists in parts:
                if not (lists if kind == BROADCAST else any(lists.values())):
                    continue
                meta = {
                    "format": FORMAT_NAME,
                    "version": FORMAT_VERSION,
                    "kind": kind,
                    "checkpoint_id": checkpoint_id,
                    "states": {n: kind for n in lists},
                }
                sections = [(0, pickle_section(lists, f"{kind} state"))]
                name = state_file_name(prefix, kind, checkpoint_id, None)
                handles.append(
                    write_state_file(
                        directory, name, kind, meta, sections, KeyGroupRange.empty(), into
                    )
                )
            return handles

        snap = SnapshotInProgress(checkpoint_id, write, lambda _snap: None)
        snap.count_entries = lambda: (
            sum(len(items) for items in split.values())
            + sum(len(items) for items in union.values())
            + sum(len(entries) for entries in broadcast.values())
        )
        snap.sync_duration_s = time.perf_counter() - start
        return snap

    def restore(
        self,
        handles_by_old_subtask: Mapping[int, Iterable[Any]] | Sequence[Iterable[Any]],
        new_index: int,
        new_parallelism: int,
        *,
        old_parallelism: int | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Restore from the operator, union and broadcast handles of every old subtask (other
        kinds are ignored). ``handles_by_old_subtask`` maps old subtask index -> handles (a sequence is
        indexed by position); ``old_parallelism`` defaults to the highest index + 1."""
        if not 0 <= new_index < new_parallelism:
            raise StateError(f"subtask index {new_index} outside [0, {new_parallelism})")
        if any(len(s) for s in self._states.values()) or any(
            len(s) for s in self._broadcast.values()
        ):
            raise IncompatibleStateError("restore() needs a backend that holds no state yet")
        by_index: dict[int, Iterable[Any]] = (
            dict(handles_by_old_subtask)
            if isinstance(handles_by_old_subtask, Mapping)
            else dict(enumerate(handles_by_old_subtask))
        )
        old_p = old_parallelism if old_parallelism is not None else max(by_index, default=-1) + 1
        split_parts: dict[str, list[tuple[int, list[Any]]]] = {}
        union: dict[str, list[Any]] = {}
        copies: dict[str, list[tuple[int, dict[Any, Any]]]] = {}
        for old_index in sorted(by_index):
            for raw in by_index[old_index]:
                handle = handle_fields(raw, base_dir)
                kind = handle.kind
                if kind not in (OPERATOR, UNION, BROADCAST):
                    continue
                with StateFileReader(handle) as reader:
                    for entry in reader.sections:
                        data = reader.read(entry)
                        of = dict if kind == BROADCAST else list
                        if not isinstance(data, dict) or not all(
                            isinstance(v, of) for v in data.values()
                        ):
                            raise reader.corrupt(
                                f"an operator state section is not {{name: {of.__name__}}}"
                            )
                        for name, items in data.items():
                            if kind == BROADCAST:
                                copies.setdefault(name, []).append((old_index, items))
                            elif kind == UNION:
                                union.setdefault(name, []).extend(items)
                            else:
                                split_parts.setdefault(name, []).append((old_index, items))
        for name, items in union.items():
            self._get(name, UNION_DISTRIBUTE)._items = items
        for name, parts in split_parts.items():
            if old_p == new_parallelism:
                mine = [x for i, items in parts if i == new_index for x in items]
            else:
                everything = [x for _, items in parts for x in items]
                base, remainder = divmod(len(everything), new_parallelism)
                begin = new_index * base + min(new_index, remainder)
                mine = everything[begin : begin + base + (1 if new_index < remainder else 0)]
            self._get(name, SPLIT_DISTRIBUTE)._items = mine
        for name, found in copies.items():
            if old_p == new_parallelism:
                own = [entries for i, entries in found if i == new_index]
                chosen = own[0] if own else {}
            else:
                chosen = found[new_index % len(found)][1]
            self.get_broadcast_state(name).replace(chosen)

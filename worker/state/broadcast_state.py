"""Broadcast state: a map per name that every subtask of an operator holds a copy of (Flink's
``BroadcastState``), and the read-only view of it that the non-broadcast input gets.

Only the broadcast input writes it, and every subtask sees the same broadcast elements in the
same order, so the copies stay equal when the function is deterministic. Each subtask
checkpoints its own copy (``OperatorStateBackend``, kind ``BROADCAST``); how a rescale hands
the copies out is in :mod:`snapflow.worker.state.operator_state`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from snapflow.errors import StateError

__all__ = ["BroadcastState", "ReadOnlyBroadcastState", "read_only_error"]


def read_only_error(name: str) -> StateError:
    """The error of a write to broadcast state from the non-broadcast input."""
    return StateError(
        f"broadcast state {name!r} is read-only in process_element (and on_timer): only the "
        f"broadcast input writes it, so that every subtask keeps the same copy; write it in "
        f"process_broadcast_element"
    )


class ReadOnlyBroadcastState:
    """Reads of one broadcast state (Flink's ``ReadOnlyBroadcastState``)."""

    def __init__(self, name: str, entries: dict[Any, Any]) -> None:
        self.name = name
        self._entries = entries

    def get(self, key: Any, default: Any = None) -> Any:
        return self._entries.get(key, default)

    def contains(self, key: Any) -> bool:
        return key in self._entries

    def keys(self) -> list[Any]:
        return list(self._entries)

    def values(self) -> list[Any]:
        return list(self._entries.values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._entries.items())

    def is_empty(self) -> bool:
        return not self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._entries))

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def put(self, key: Any, value: Any) -> None:
        raise read_only_error(self.name)

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        raise read_only_error(self.name)

    def remove(self, key: Any) -> None:
        raise read_only_error(self.name)

    def clear(self) -> None:
        raise read_only_error(self.name)


class BroadcastState(ReadOnlyBroadcastState):
    """One broadcast state, writable (the broadcast input's view; Flink's ``BroadcastState``).
    ``read_only()`` is the view of the same map for the other input."""

    def put(self, key: Any, value: Any) -> None:
        self._entries[key] = value

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        self._entries.update(entries)

    def remove(self, key: Any) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def read_only(self) -> ReadOnlyBroadcastState:
        return ReadOnlyBroadcastState(self.name, self._entries)

    def copy_entries(self) -> dict[Any, Any]:
        """A shallow copy of the map (the synchronous part of a snapshot)."""
        return dict(self._entries)

    def replace(self, entries: dict[Any, Any]) -> None:
        """Restore: the map becomes ``entries``."""
        self._entries.clear()
        self._entries.update(entries)

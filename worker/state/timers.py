"""Event-time timers of a keyed backend.

Timers are keyed state too: kept per key group, snapshotted and redistributed with it. The
watermark is not part of a snapshot (as in Flink): restored timers fire once the restored
job's watermark passes them. Only event-time timers exist so far.

The service is the in-memory index the timers fire from. A backend that also stores them
elsewhere (the RocksDB backend, in its database: ``rocksdb_timers.py``) gives it a
:class:`TimerSink`, told of every timer added and removed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from snapflow.errors import StateError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.state.errors import CorruptStateError, no_current_key
from snapflow.worker.state.keyed_state import KeyContext

__all__ = ["Timer", "TimerService", "TimerSink"]


_POPS = 4096
"""Due timers popped one by one before the rest are taken in one pass and sorted."""


class Timer(NamedTuple):
    """An event-time timer: fires once the watermark reaches ``timestamp``."""

    timestamp: int
    key: Any
    namespace: Any
    key_group: int


class TimerSink(Protocol):
    """Told of every change to a :class:`TimerService`'s timers: of ``key_group``'s timer
    ``entry``, a ``(timestamp, key, namespace)`` tuple (the service's own: keeping it costs no
    memory), and of the timers that fired."""

    def timer_added(self, key_group: int, entry: tuple[int, Any, Any]) -> None:
        """A timer registered or restored."""

    def timer_deleted(self, key_group: int, entry: tuple[int, Any, Any]) -> None:
        """A timer deleted before it fired."""

    def timers_fired(self, watermark: int, timers: Sequence[Timer]) -> None:
        """``timers`` fired as the watermark reached ``watermark``: after this no timer at or
        below ``watermark`` is left (until one is registered again)."""


class TimerService:
    """Event-time timers of a keyed backend (Flink's ``InternalTimerService``), per key group.

    A timer is ``(key, namespace, timestamp)``; registering it twice keeps one. Timers are
    snapshotted with the keyed state and restored by key group like any keyed state. ``sink``
    is told of every change (see :class:`TimerSink`).
    """

    def __init__(self, backend: KeyContext, sink: TimerSink | None = None) -> None:
        self._backend = backend
        self._sink = sink
        self._start = backend.key_group_range.start
        n = len(backend.key_group_range)
        self._sets: list[set[tuple[int, Any, Any]]] = [set() for _ in range(n)]
        self._shared = [False] * n
        # (timestamp, sequence, key-group index, key, namespace); entries whose timer was
        # deleted (or fired through another entry) are skipped lazily.
        self._heap: list[tuple[int, int, int, Any, Any]] = []
        self._seq = itertools.count()
        self._watermark = MIN_WATERMARK
        self._count = 0

    @property
    def current_watermark(self) -> int:
        return self._watermark

    def _writable(self, idx: int) -> set[tuple[int, Any, Any]]:
        s = self._sets[idx]
        if self._shared[idx]:
            s = self._sets[idx] = set(s)
            self._shared[idx] = False
        return s

    def _add(self, idx: int, timestamp: int, key: Any, namespace: Any, *, to_sink: bool) -> None:
        entry = (timestamp, key, namespace)
        if entry in self._sets[idx]:
            return
        if to_sink and self._sink is not None:  # first: the sink may refuse the timer
            self._sink.timer_added(self._start + idx, entry)
        self._writable(idx).add(entry)
        self._count += 1
        heapq.heappush(self._heap, (timestamp, next(self._seq), idx, key, namespace))

    def register_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        """Register a timer for the current key at ``timestamp`` (in ``namespace``, e.g. a
        window). A timer at or below the current watermark fires on the next advance."""
        b = self._backend
        if b._current_idx < 0:
            raise no_current_key()
        if not isinstance(timestamp, int) or isinstance(timestamp, bool):
            raise StateError(f"timer timestamps are ints (ms), got {timestamp!r}")
        self._add(b._current_idx, timestamp, b._current_key, namespace, to_sink=True)

    def delete_event_time_timer(self, timestamp: int, namespace: Any = None) -> None:
        b = self._backend
        idx = b._current_idx
        if idx < 0:
            raise no_current_key()
        entry = (timestamp, b._current_key, namespace)
        if entry in self._sets[idx]:
            self._writable(idx).discard(entry)
            self._count -= 1
            if self._sink is not None:
                self._sink.timer_deleted(self._start + idx, entry)
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * self._count + 1024:
            self._heap = [e for e in self._heap if (e[0], e[3], e[4]) in self._sets[e[2]]]
            heapq.heapify(self._heap)

    def advance_watermark(self, watermark: int) -> list[Timer]:
        """Advance the watermark and return the timers with ``timestamp <= watermark``, in
        timestamp order (registration order among equal timestamps), removing them."""
        if watermark > self._watermark:
            self._watermark = watermark
        fired: list[Timer] = []
        heap, sets, start = self._heap, self._sets, self._start
        due: list[tuple[int, int, int, Any, Any]] = []
        while heap and heap[0][0] <= watermark:
            if len(due) == _POPS:
                # Many due (a watermark past a whole window's timers): one pass and one sort
                # instead of a pop each, in the same (timestamp, sequence) order.
                due += [e for e in heap if e[0] <= watermark]
                heap = self._heap = [e for e in heap if e[0] > watermark]
                heapq.heapify(heap)
                due.sort()
                break
            due.append(heapq.heappop(heap))
        for ts, _, idx, key, namespace in due:
            entry = (ts, key, namespace)
            if entry in sets[idx]:
                self._writable(idx).discard(entry)
                self._count -= 1
                fired.append(Timer(ts, key, namespace, start + idx))
        if fired and self._sink is not None:
            self._sink.timers_fired(watermark, fired)
        return fired

    def next_timer_timestamp(self) -> int | None:
        heap, sets = self._heap, self._sets
        while heap:
            ts, _, idx, key, namespace = heap[0]
            if (ts, key, namespace) in sets[idx]:
                return ts
            heapq.heappop(heap)
        return None

    def num_timers(self) -> int:
        return self._count

    def timers(self) -> list[Timer]:
        """All registered timers, in timestamp order."""
        start = self._start
        out = [
            Timer(ts, key, ns, start + idx) for idx, s in enumerate(self._sets) for ts, key, ns in s
        ]
        out.sort(key=lambda t: t.timestamp)
        return out

    def freeze(self) -> list[set[tuple[int, Any, Any]]]:
        """A snapshot's view of the timers per key group; each set is copied before its next
        change (until :meth:`thaw`)."""
        self._shared = [True] * len(self._sets)
        return list(self._sets)

    def thaw(self) -> None:
        """No snapshot view is alive any more: change the sets in place again."""
        self._shared = [False] * len(self._sets)

    def restore_group(self, idx: int, entries: Any, path: str, *, to_sink: bool = True) -> None:
        """Add the timers of one key group's section (``idx`` in the backend's range) read from
        ``path`` (a state file); ``to_sink=False``: read from where the sink keeps them, so it
        is not told."""
        if not isinstance(entries, list):
            raise CorruptStateError(f"state file {path}: a timers section is not a list")
        for entry in entries:
            if not (isinstance(entry, tuple) and len(entry) == 3 and isinstance(entry[0], int)):
                raise CorruptStateError(f"state file {path}: malformed timer {entry!r:.100}")
            self._add(idx, entry[0], entry[1], entry[2], to_sink=to_sink)

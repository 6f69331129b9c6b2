"""Merging session windows, pure: one key's windows and the new records' windows in, the
merged windows out (Flink's ``MergingWindowSet`` with ``TimeWindow.mergeWindows``).

No state and no I/O: the window operator keeps a key's windows in keyed state, calls
:func:`merge_sessions` once per key and batch, and moves state and timers as the result says.

A batch's records are taken as a set, with its *late* records (whose own window is late at
the batch's watermark) after the others: an on-time record's window merges with every window
it intersects (those in state and the batch's other on-time windows, transitively); then each
late record joins the windows it intersects (merging them, as a bridge may) or, intersecting
none, is dropped. Flink takes records one at a time, so there a late record that arrives
*before* the on-time record it would join is dropped; here it joins (docs/flink-differences.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from snapflow.worker.api.window_assigners import TimeWindow

__all__ = ["SessionMerge", "SessionUpdate", "merge_sessions"]


@dataclass
class SessionMerge:
    """A window that took records: ``window`` covers the ``absorbed`` windows that were in
    state before (their state and timers move to ``window``; ``window`` itself may be one of
    them) and the windows of records ``rows`` (indices into the new windows)."""

    window: TimeWindow
    absorbed: list[TimeWindow] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)


@dataclass
class SessionUpdate:
    """What a batch did to one key's windows: ``windows`` is the key's new window set (sorted,
    pairwise disjoint), ``merges`` the windows that took records (by start), ``dropped`` the
    late records that joined none (in input order)."""

    windows: list[TimeWindow]
    merges: list[SessionMerge]
    dropped: list[int]


def merge_sessions(
    existing: Sequence[TimeWindow],
    new: Sequence[TimeWindow],
    late: Sequence[bool] | None = None,
) -> SessionUpdate:
    """Merge the windows ``new`` of a batch's records (``late[i]``: record i is late) into a
    key's ``existing`` windows (pairwise disjoint)."""
    is_late = late if late is not None else [False] * len(new)
    groups: list[SessionMerge] = [SessionMerge(w, [w]) for w in existing]
    on_time = [(w.start, 1, i) for i, w in enumerate(new) if not is_late[i]]
    items = sorted([(g.window.start, 0, gi) for gi, g in enumerate(groups)] + on_time)
    merged: list[SessionMerge] = []
    for _start, kind, index in items:
        part = groups[index] if kind == 0 else SessionMerge(new[index], [], [index])
        if merged and merged[-1].window.intersects(part.window):
            last = merged[-1]
            last.window = last.window.cover(part.window)
            last.absorbed.extend(part.absorbed)
            last.rows.extend(part.rows)
        else:
            merged.append(SessionMerge(part.window, list(part.absorbed), list(part.rows)))
    dropped: list[int] = []
    for i, w in enumerate(new):
        if not is_late[i]:
            continue
        hits = [m for m in merged if m.window.intersects(w)]
        if not hits:
            dropped.append(i)
            continue
        joined = SessionMerge(w, [], [i])
        for m in hits:
            joined.window = joined.window.cover(m.window)
            joined.absorbed.extend(m.absorbed)
            joined.rows.extend(m.rows)
        merged = sorted(
            [m for m in merged if not any(m is h for h in hits)] + [joined],
            key=lambda m: m.window.start,
        )
    for m in merged:
        m.absorbed.sort()
        m.rows.sort()
    return SessionUpdate(
        windows=[m.window for m in merged],
        merges=[m for m in merged if m.rows],
        dropped=dropped,
    )

"""Session merging (worker/api/session_merging.py) as exact sequences, with its invariants
checked after every step."""

from __future__ import annotations

import itertools
import random

from snapflow.worker.api.session_merging import SessionUpdate, merge_sessions
from snapflow.worker.api.window_assigners import TimeWindow as W

GAP = 10


def rows(*ts: int) -> list[W]:
    return [W(t, t + GAP) for t in ts]


def check_invariants(existing: list[W], new: list[W], late: list[bool], u: SessionUpdate) -> None:
    ws = u.windows
    assert ws == sorted(ws)
    for a, b in itertools.pairwise(ws):
        assert a.end < b.start, "windows pairwise disjoint (not even touching)"
    for e in existing:  # every old window inside exactly one new one
        assert sum(w.start <= e.start and e.end <= w.end for w in ws) == 1
    kept = [i for i in range(len(new)) if i not in u.dropped]
    for i in kept:
        assert sum(w.start <= new[i].start and new[i].end <= w.end for w in ws) == 1
    for m in u.merges:
        parts = list(m.absorbed) + [new[i] for i in m.rows]
        assert m.window == W(min(p.start for p in parts), max(p.end for p in parts))
        assert m.window in ws
    assert sorted(i for m in u.merges for i in m.rows) == kept
    for i in u.dropped:
        assert late[i] and not any(w.intersects(new[i]) for w in ws)
    assert sorted(e for m in u.merges for e in m.absorbed) == sorted(
        e for e in existing if any(e in m.absorbed for m in u.merges)
    )


def step(existing: list[W], new: list[W], late: list[bool] | None = None) -> SessionUpdate:
    flags = late if late is not None else [False] * len(new)
    u = merge_sessions(existing, new, flags)
    check_invariants(existing, new, flags, u)
    return u


def test_exact_sequence_of_one_key() -> None:
    # 1. two records 5 apart: one session [0, 15)
    u = step([], rows(0, 5))
    assert u.windows == [W(0, 15)]
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [(W(0, 15), [], [0, 1])]
    # 2. out of order: 40 then 30 -> [30, 50); [0, 15) untouched
    u = step(u.windows, rows(40, 30))
    assert u.windows == [W(0, 15), W(30, 50)]
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [(W(30, 50), [], [0, 1])]
    # 3. exactly the gap after the end (touching): merges, as Flink's intersects
    u = step(u.windows, rows(50))
    assert u.windows == [W(0, 15), W(30, 60)]
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [(W(30, 60), [W(30, 50)], [0])]
    # 4. records 22 then 14 bridge both sessions (a chain): everything merges into one
    u = step(u.windows, rows(22, 14))
    assert u.windows == [W(0, 60)]
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [
        (W(0, 60), [W(0, 15), W(30, 60)], [0, 1])
    ]
    # 5. a record inside: the window stays, absorbing itself
    u = step(u.windows, rows(20))
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [(W(0, 60), [W(0, 60)], [0])]


def test_late_records_join_or_drop() -> None:
    existing = [W(100, 120)]
    # late record 95 touches [100, 120): joins and extends the start; late 50 joins nothing
    u = step(existing, rows(50, 95), [True, True])
    assert u.windows == [W(95, 120)]
    assert u.dropped == [0]
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [(W(95, 120), [W(100, 120)], [1])]
    # a late record joins an on-time record of the same batch, whatever their order
    u = step([], rows(0, 8), [True, False])
    assert u.windows == [W(0, 18)] and u.dropped == []
    # two late records that only meet each other are both dropped
    u = step([], rows(0, 5), [True, True])
    assert u.windows == [] and u.dropped == [0, 1] and u.merges == []
    # a late record bridging two sessions merges them
    u = step([W(0, 10), W(20, 40)], rows(10), [True])
    assert u.windows == [W(0, 40)]
    assert [(m.window, m.absorbed, m.rows) for m in u.merges] == [
        (W(0, 40), [W(0, 10), W(20, 40)], [0])
    ]


def test_random_batches_keep_the_invariants_and_match_a_union_of_intervals() -> None:
    rng = random.Random(7)
    for _ in range(200):
        existing: list[W] = []
        seen: list[W] = []
        for _ in range(rng.randint(1, 6)):
            new = rows(*(rng.randint(0, 300) for _ in range(rng.randint(0, 8))))
            u = step(existing, new)
            existing = u.windows
            seen.extend(new)
        # no late records: the windows are the union of every record's window, merged
        expected: list[W] = []
        for w in sorted(seen):
            if expected and expected[-1].intersects(w):
                expected[-1] = expected[-1].cover(w)
            else:
                expected.append(w)
        assert existing == expected

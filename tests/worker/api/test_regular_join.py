"""The regular (unbounded) inner join: every pair once as rows arrive, a state TTL on
processing time (an injected clock) that survives a snapshot and restore."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.regular_join import RegularJoinOperator
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def open_join(
    ttl_ms: int | None = None, clock: Clock | None = None, handles: Any = None
) -> RegularJoinOperator:
    backend = KeyedStateBackend(128, (0, 127), clock=clock)
    if handles is not None:
        backend.restore(handles)
    op = RegularJoinOperator("k", "id", ttl_ms=ttl_ms)
    op.open(
        OperatorContext(
            operator_id="j", keyed_state=backend, restored_checkpoint_id=1 if handles else 0
        )
    )
    return op


def orders(*rows: tuple[Any, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": k, "order": o} for k, o in rows])


def users(*rows: tuple[Any, str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"id": k, "name": n} for k, n in rows])


def rows(batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for b in batches for r in b.to_pylist())


def test_every_pair_once_as_rows_arrive() -> None:
    op = open_join()
    assert op.process_input(0, orders((1, "o1"), (2, "o2"))) == []
    out = op.process_input(1, users((1, "ann"), (3, "cy")))
    assert out[0].schema.names == ["k", "order", "id", "name"]
    assert rows(out) == [(1, "o1", 1, "ann")]
    assert rows(op.process_input(0, orders((1, "o3"), (3, "o4")))) == [
        (1, "o3", 1, "ann"),
        (3, "o4", 3, "cy"),
    ]
    assert rows(op.process_input(1, users((2, "bo"), (1, "al")))) == [
        (1, "o1", 1, "al"),
        (1, "o3", 1, "al"),
        (2, "o2", 2, "bo"),
    ]
    assert (op.buffered(0), op.buffered(1)) == (4, 4)


def test_random_inputs_give_the_full_inner_join() -> None:
    rnd = random.Random(5)
    op = open_join()
    seen: list[list[tuple[Any, str]]] = [[], []]
    got = []
    for i in range(60):
        side = rnd.randrange(2)
        batch = [(f"key{rnd.randrange(9)}", f"{side}-{i}-{j}") for j in range(rnd.randrange(1, 6))]
        seen[side] += batch
        got += rows(op.process_input(side, orders(*batch) if side == 0 else users(*batch)))
    expected = sorted((k, o, u, n) for k, o in seen[0] for u, n in seen[1] if k == u)
    assert sorted(got) == expected


def test_ttl_expires_rows_by_processing_time(tmp_path: Path) -> None:
    clock = Clock()
    op = open_join(ttl_ms=100, clock=clock)
    op.process_input(0, orders((1, "old")))
    clock.now += 60
    op.process_input(0, orders((1, "new")))
    clock.now += 39  # "old" has 1 ms left
    assert rows(op.process_input(1, users((1, "a")))) == [(1, "new", 1, "a"), (1, "old", 1, "a")]
    clock.now += 1  # "old" arrived 100 ms ago: expired, never matched again
    assert rows(op.process_input(1, users((1, "b")))) == [(1, "new", 1, "b")]
    assert op.buffered(0) == 1

    # the arrival times are checkpointed: the TTL runs on after a restore
    op.snapshot_state(1)
    handles = op.ctx.keyed_state.snapshot(1).write(tmp_path)  # type: ignore[union-attr]
    restored = open_join(ttl_ms=100, clock=clock, handles=handles)
    assert (restored.buffered(0), restored.buffered(1)) == (1, 2)
    assert rows(restored.process_input(1, users((1, "c")))) == [(1, "new", 1, "c")]
    clock.now += 60  # "new" arrived at 1060: expired at 1160
    assert restored.process_input(1, users((1, "d"))) == []


def test_bad_ttl_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="ttl_ms"):
        RegularJoinOperator("k", "k", ttl_ms=0)

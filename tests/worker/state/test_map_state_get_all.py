"""``MapState.get_all``: the bulk lookup of a vectorised function, the same on both backends
and equal to a ``get`` per entry; and ``KeyedBatchContext.set_current_key``, which makes a
batch function's per-key state (map, list) that of one of its keys."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from snapflow.worker.api.functions import KeyedBatchContext
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.rocksdb_backend import RocksDBKeyedStateBackend

MAXP = 128


@pytest.fixture(params=["heap", "rocksdb"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyedStateBackend]:
    if request.param == "heap":
        yield KeyedStateBackend(MAXP, (0, MAXP - 1))
        return
    b = RocksDBKeyedStateBackend(MAXP, (0, MAXP - 1), local_dir=str(tmp_path))
    yield b
    b.dispose()


def test_get_all_equals_a_get_per_entry_for_every_key(backend: KeyedStateBackend) -> None:
    rng = random.Random(3)
    state = backend.get_map_state("seen")
    model: dict[str, dict[object, int]] = {}
    for _ in range(300):
        key = f"k{rng.randrange(5)}"
        backend.set_current_key(key)
        entries = {rng.choice([rng.randrange(50), f"s{rng.randrange(50)}"]): rng.randrange(9)}
        state.put_all(entries)
        model.setdefault(key, {}).update(entries)
        if rng.random() < 0.2:
            backend.snapshot(rng.randrange(1, 1_000))  # a snapshot in between changes nothing
    for key, entries in model.items():
        backend.set_current_key(key)
        probe = [*entries, "absent", 999, *list(entries)[:3]]  # repeats and misses too
        assert state.get_all(probe) == [state.get(k) for k in probe]
        assert state.get_all(probe) == [entries.get(k) for k in probe]
    assert state.get_all([]) == []


def test_a_batch_function_reaches_one_keys_map_state_through_set_current_key(
    backend: KeyedStateBackend,
) -> None:
    ctx = KeyedBatchContext(backend, OperatorContext(operator_id="op", subtask_index=0))
    seen = ctx.get_map_state("seen")
    for key, values in (("a", [1, 2]), ("b", [2, 3])):
        ctx.set_current_key(key)
        seen.put_all(dict.fromkeys(values, key))
    ctx.set_current_key("a")
    assert seen.get_all([1, 2, 3]) == ["a", "a", None]
    ctx.set_current_key("b")
    assert sorted(seen.keys()) == [2, 3]
    assert seen.get_all([1]) == [None]

"""State holding Arrow slices pickles at the slices' size (``worker/state/arrow_pickling.py``),
and a keyed snapshot of many slices of one batch holds each row once."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa

from snapflow.worker.state.arrow_pickling import dumps
from snapflow.worker.state.keyed_backend import KeyedStateBackend

BIG = pa.RecordBatch.from_pydict({"k": np.arange(200_000), "s": np.arange(200_000).astype(str)})


def test_slices_round_trip_at_their_own_size() -> None:
    part = BIG.slice(1_000, 50)
    column = BIG.column(0).slice(7, 3)
    table = pa.Table.from_batches([BIG.slice(5, 4), BIG.slice(100, 2)])
    data = dumps({"batch": part, "column": column, "table": table, "n": 1})
    assert len(data) < 10_000  # pyarrow alone writes the whole 200,000 rows for each
    assert len(pickle.dumps(part, protocol=5)) > 1_000_000
    out = pickle.loads(data)
    assert out["batch"].equals(part)
    assert out["column"].to_pylist() == [7, 8, 9]
    assert out["table"].equals(table)
    assert out["n"] == 1


def test_whole_and_empty_batches_round_trip() -> None:
    empty = BIG.slice(0, 0)
    assert pickle.loads(dumps(BIG)).equals(BIG)
    restored = pickle.loads(dumps([empty, BIG.slice(3, 0)]))
    assert [b.num_rows for b in restored] == [0, 0]
    assert restored[0].schema == BIG.schema


def test_a_keyed_snapshot_of_slices_holds_each_row_once(tmp_path: Path) -> None:
    backend = KeyedStateBackend.for_subtask(128, 1, 0)
    state = backend.get_value_state("op/rows")
    slices = [BIG.slice(i * 1_000, 1_000) for i in range(100)]
    keys = list(range(100))
    state.update_many(keys, slices)
    handles = backend.snapshot(1).write(tmp_path)
    # about the 100,000 rows once; pickled as pyarrow does, 100 times the 200,000
    assert sum(h.size_bytes for h in handles) < 2 * BIG.slice(0, 100_000).nbytes
    restored = KeyedStateBackend.for_subtask(128, 1, 0)
    restored.restore(handles)
    rows = dict(restored.entries("op/rows"))
    assert sorted(rows) == keys and all(rows[i].equals(slices[i]) for i in keys)


def test_small_objects_round_trip_at_pyarrows_own_size() -> None:
    # a window's rows: many batches of a few rows, each compact (a take)
    piece = BIG.take(pa.array([3, 70_000, 5]))
    objects = {
        "batch": piece,
        "table": pa.table(piece),
        "array": piece.column(1),
        "empty": piece.slice(0, 0),
        "pieces": [piece, piece.slice(1, 1)],
    }
    out = pickle.loads(dumps(objects))
    assert out["batch"].equals(piece) and out["batch"].schema == BIG.schema
    assert out["table"].equals(pa.table(piece))
    assert out["array"].to_pylist() == ["3", "70000", "5"]
    assert out["empty"].num_rows == 0 and out["empty"].schema == BIG.schema
    assert [p.to_pylist() for p in out["pieces"]] == [piece.to_pylist(), piece.to_pylist()[1:2]]
    assert len(dumps(piece)) <= len(pickle.dumps(piece, protocol=5)) + 64

"""Operators and functions of the same-job benchmark (``bench.keyed_count_bench``).

The job is issue 12's: events ``key = i % 10000, value = 1, id = i``, a keyed running count
per key, a discarding sink. Three ways to write the count:

* :func:`record_count`, for ``KeyedStream.process``: a Python function called per key of a
  batch with that key's rows; it reads and updates a ``ValueState`` once per record.
* :class:`BatchCount`, for ``KeyedStream.process_batches``: vectorised, one bulk state read
  and write per batch (``get_many``/``update_many``).
* the built-in ``KeyedStream.count()``.

Each emits the new totals of the keys a batch updated (``key``, ``count``), once per key.
Throughput is measured inside the user function: the wall time of the first and the last
record it saw and the number of records, written per subtask to ``<stats_dir>/<kind>-<i>.json``
when it closes. The built-in count has no user function: :class:`MeasuringSink` (chained right
behind it, same task) measures instead. The sink also keeps the newest count per key; their sum
over the subtasks must equal the records generated (every run checks it).

These objects are shipped to Spark's Python workers with cloudpickle; the benchmark registers
this module to be pickled by value, so the workers need not import it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapflow.worker.api.arrays import arange
from snapflow.worker.api.functions import (
    KeyedBatchContext,
    KeyedBatchFunction,
    KeyedContext,
    RichFunction,
    RuntimeContext,
)
from snapflow.worker.connectors.split_sources import SequenceSource
from snapflow.worker.runtime.operator import Operator, OperatorContext

NUM_KEYS = 10_000
_I64 = pa.int64()
SCHEMA = pa.schema([("key", _I64), ("value", _I64), ("id", _I64)])


def _write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


class EventsSource(SequenceSource):
    """``id = i`` for ``i`` in ``0 .. total - 1``, ``key = i % num_keys``, ``value = 1``
    (bounded, replayable: split positions in operator state, as every split source)."""

    def __init__(self, total: int, batch_size: int = 65_536, num_keys: int = NUM_KEYS) -> None:
        super().__init__(0, total, batch_size=batch_size, field="id")
        self.num_keys = num_keys
        self.schema = self.output_schema = SCHEMA  # the declared schema: key, value, id

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        if n == 0:
            return pa.RecordBatch.from_arrays([pa.array([], _I64)] * 3, schema=SCHEMA)
        ids = pc.add(arange(n), pa.scalar(self._split_start(split_id) + start, _I64))
        keys = pc.subtract(ids, pc.multiply(pc.divide(ids, self.num_keys), self.num_keys))
        ones = pa.repeat(pa.scalar(1, _I64), n)
        return pa.RecordBatch.from_arrays([keys, ones, ids], schema=SCHEMA)


class _Meter:
    """First and last record seen, records seen: written as JSON on close."""

    def __init__(self) -> None:
        self.first = 0.0
        self.last = 0.0
        self.records = 0

    def saw(self, n: int) -> None:
        now = time.time()
        if not self.records:
            self.first = now
        self.last = now
        self.records += n

    def write(self, stats_dir: str, kind: str, subtask: int) -> None:
        _write_json(
            os.path.join(stats_dir, f"{kind}-{subtask}.json"),
            {"first": self.first, "last": self.last, "records": self.records},
        )


class RecordCount(RichFunction):
    """``fn(key, rows, ctx)`` for ``KeyedStream.process``: a ValueState read and written per
    record; the key's new total out, once per call."""

    def __init__(self, stats_dir: str) -> None:
        self.stats_dir = stats_dir
        self._meter: _Meter | None = None
        self._subtask = 0

    def open(self, ctx: RuntimeContext) -> None:
        self._meter = _Meter()
        self._subtask = ctx.subtask_index

    def __call__(self, key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> Any:
        assert self._meter is not None
        self._meter.saw(len(rows))
        state = ctx.get_value_state("count", 0)
        for row in rows:
            state.update(state.value() + row["value"])
        return [{"key": key, "count": state.value()}]

    def close(self) -> None:
        if self._meter is not None:
            self._meter.write(self.stats_dir, "fn", self._subtask)

    def __getstate__(self) -> dict[str, Any]:
        return {"stats_dir": self.stats_dir, "_meter": None, "_subtask": 0}


class BatchCount(KeyedBatchFunction):
    """Vectorised: distinct keys and their counts with Arrow, one bulk read and write of the
    state per batch."""

    def __init__(self, stats_dir: str) -> None:
        self.stats_dir = stats_dir
        self._meter: _Meter | None = None
        self._subtask = 0

    def open(self, ctx: RuntimeContext) -> None:
        self._meter = _Meter()
        self._subtask = ctx.subtask_index

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        assert self._meter is not None
        self._meter.saw(batch.num_rows)
        grouped = pa.table(batch).group_by("key").aggregate([("value", "sum")])
        keys = grouped.column("key").combine_chunks()
        state = ctx.get_value_state("count", 0)
        old = state.get_many(keys)
        new = pc.add(pa.array(old, _I64), grouped.column("value_sum").combine_chunks())
        state.update_many(keys, new)
        return pa.RecordBatch.from_arrays([keys, new], names=["key", "count"])

    def close(self) -> None:
        if self._meter is not None:
            self._meter.write(self.stats_dir, "fn", self._subtask)

    def __getstate__(self) -> dict[str, Any]:
        return {"stats_dir": self.stats_dir, "_meter": None, "_subtask": 0}


class MeasuringSink(Operator):
    """Keeps the newest (largest) count per key in a numpy array and discards the rows;
    measures like the functions."""

    _runtime_fields: tuple[str, ...] = ("_meter", "_latest")

    def __init__(self, stats_dir: str, num_keys: int = NUM_KEYS) -> None:
        self.stats_dir = stats_dir
        self.num_keys = num_keys

    def runs_on_loop(self) -> bool:
        return True  # one numpy call per batch: a measuring device, not the code measured

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._meter = _Meter()
        self._latest = np.zeros(self.num_keys, dtype=np.int64)

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            self._meter.saw(batch.num_rows)
            keys = batch.column("key").to_numpy()
            np.maximum.at(self._latest, keys, batch.column("count").to_numpy())
        return []

    def close(self) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        self._meter.write(self.stats_dir, "sink", ctx.subtask_index)
        _write_json(
            os.path.join(self.stats_dir, f"counted-{ctx.subtask_index}.json"),
            {"counted": int(self._latest.sum()), "keys": int((self._latest > 0).sum())},
        )

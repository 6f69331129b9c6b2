"""Source and sink of the join benchmark (``bench.join_bench``).

:class:`JoinEventsSource`: row ``i`` of a split (``i`` from 0 in every split) is
``key = i % num_keys``, ``ts = i * ms_per_10_rows // 10``, ``value = i``: bounded, in event
time order (the split sources' watermark: ``max ts - 1``). With ``ms_per_10_rows = 1`` (ten
rows per ms) a key comes back every 1,000 ms; two such sources of equal splits joined within
``[-250, 250]`` ms pair every row with exactly one row of each split of the other: the
benchmark expects ``2 x rows of the left source`` pairs (exactly once). The throttled source
of the skew run takes ``ms_per_10_rows = 10`` so that its event time keeps pace with the other
at a tenth of its rows (the join's state stays bounded).

:class:`MeasuringSink` counts the joined rows and the wall time of the first and last it saw,
written per subtask to ``<stats_dir>/sink-<i>.json`` when it closes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.worker.api.arrays import arange
from snapflow.worker.connectors.split_sources import SplitSource
from snapflow.worker.runtime.operator import Operator, OperatorContext

NUM_KEYS = 10_000
_I64 = pa.int64()
SCHEMA = pa.schema([("key", _I64), ("ts", _I64), ("value", _I64)])


class JoinEventsSource(SplitSource):
    """See the module docstring. ``total``: rows over all splits; ``rate_per_s``: in total."""

    def __init__(
        self,
        total: int,
        *,
        ms_per_10_rows: int = 1,
        batch_size: int = 65_536,
        rate_per_s: float | None = None,
        num_keys: int = NUM_KEYS,
    ) -> None:
        super().__init__(batch_size=batch_size, rate_per_s=rate_per_s)
        self.total = total
        self.ms_per_10_rows = ms_per_10_rows
        self.num_keys = num_keys
        self.output_schema = SCHEMA

    @property
    def bounded(self) -> bool:
        return True

    def _split_sizes(self, num_splits: int) -> list[int | None]:
        base, rest = divmod(self.total, num_splits)
        return [base + (1 if s < rest else 0) for s in range(num_splits)]

    def _generate(self, split_id: int, start: int, n: int) -> pa.RecordBatch:
        if n == 0:
            return pa.RecordBatch.from_arrays([pa.array([], _I64)] * 3, schema=SCHEMA)
        i = pc.add(arange(n), pa.scalar(start, _I64))
        keys = pc.subtract(i, pc.multiply(pc.divide(i, self.num_keys), self.num_keys))
        ts = pc.divide(pc.multiply(i, pa.scalar(self.ms_per_10_rows, _I64)), pa.scalar(10, _I64))
        return pa.RecordBatch.from_arrays([keys, ts, i], schema=SCHEMA)

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array | None:
        return batch.column(1)


def _write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


class MeasuringSink(Operator):
    """Counts the rows and the wall time of the first and the last; discards them."""

    _runtime_fields: tuple[str, ...] = ("_first", "_last", "_rows")

    def __init__(self, stats_dir: str) -> None:
        self.stats_dir = stats_dir

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._first = self._last = 0.0
        self._rows = 0

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            now = time.time()
            if not self._rows:
                self._first = now
            self._last = now
            self._rows += batch.num_rows
        return []

    def close(self) -> None:
        if self.ctx is not None:
            _write_json(
                os.path.join(self.stats_dir, f"sink-{self.ctx.subtask_index}.json"),
                {"first": self._first, "last": self._last, "rows": self._rows},
            )

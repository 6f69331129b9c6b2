"""Operators of the data-plane benchmark (``bench.dataplane_bench``).

They are shipped to the worker processes pickled (cloudpickle pickles classes of an importable
module by reference), so the workers import this module: they run with the repository root
on ``sys.path``.

* :class:`MarkedGeneratorSource`: a :class:`~snapflow.worker.connectors.split_sources.GeneratorSource` that, when its
  split is exhausted, writes a marker file ``<marker_dir>/source-<subtask>`` holding the wall
  time. The benchmark uses the markers to trigger the final checkpoint of a bounded job right
  away (a bounded source only ends once a checkpoint covers its last records, and with
  checkpoints off nothing else would trigger one).
* :class:`DiscardingSink`: counts rows and batches, remembers the newest running count per key
  (one C-level ``dict.update`` per batch) and discards the rows. On ``close`` it writes its
  counters to ``<stats_dir>/sink-<subtask>.json``; the sum of the newest counts over both sinks
  must equal the number of source records (the benchmark checks it).
* :class:`ThrottledSink`: a :class:`DiscardingSink` that sleeps ``sleep_s`` per batch: a
  slow sink that blocks (on I/O, say). By default it sleeps on its subtask's task thread; on
  the agent's event loop (``--no-task-thread``) the sleep would stall everything that agent
  hosts (its source subtask and its gRPC servicing too), so there its subtask moves to a task
  thread once its calls are seen to block, unless ``--no-adaptive-task-thread``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pyarrow as pa

from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.operator import Operator, OperatorContext


def _write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


class MarkedGeneratorSource(GeneratorSource):
    """A bounded generator that leaves a marker file once its split is exhausted.

    ``min_batch_ms`` (rate-limited runs only): emit a batch only once ``rate x min_batch_ms``
    records are due (the end of the split excepted), else an empty batch, on which the task
    waits a few milliseconds without blocking. ``GeneratorSource``'s own token bucket hands out
    whatever accrued since the previous poll, so under a rate limit the batches are as small as
    the poll loop is fast (a few to a few hundred rows) and the per-batch costs of the whole
    pipeline saturate the CPU at any rate; this pacing keeps the configured rate with batches
    of a sensible size. It reads the token-bucket fields of ``SplitSource``.
    """

    _runtime_fields: tuple[str, ...] = (*GeneratorSource._runtime_fields, "_marked")

    def __init__(
        self, *args: Any, marker_dir: str, min_batch_ms: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.marker_dir = marker_dir
        self.min_batch_ms = min_batch_ms

    def _allowance(self, wanted: int) -> int:
        rate = getattr(self, "_rate", None)
        if rate is None or self.min_batch_ms <= 0:
            return super()._allowance(wanted)
        now = time.monotonic()
        allowed = int((now - self._rate_start) * rate) - self._rate_emitted
        if allowed > rate + wanted:  # at most one second of burst after a stall (as the base)
            self._rate_start = now - 1.0
            self._rate_emitted = 0
            allowed = int(rate)
        if allowed < min(wanted, max(1, int(rate * self.min_batch_ms / 1000.0))):
            return 0
        return max(0, min(wanted, allowed))

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._marked = False

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        batch = super().poll_batch(max_records)
        if batch is None and not self._marked:
            self._marked = True
            index = self._context().subtask_index
            _write_json(
                os.path.join(self.marker_dir, f"source-{index}"),
                {"finished_at": time.time(), "subtask": index},
            )
        return batch


class DiscardingSink(Operator):
    """Counts and discards (see the module docstring)."""

    _runtime_fields: tuple[str, ...] = ("_rows", "_batches", "_latest", "_first", "_last")

    def __init__(self, stats_dir: str, key_field: str = "key", count_field: str = "count") -> None:
        self.stats_dir = stats_dir
        self.key_field = key_field
        self.count_field = count_field

    def runs_on_loop(self) -> bool:
        return True  # a dict update per batch: a measuring device, not the user code measured

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._rows = 0
        self._batches = 0
        self._latest: dict[Any, int] = {}
        self._first = 0.0
        self._last = 0.0

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        n = batch.num_rows
        if n:
            now = time.time()
            if not self._batches:
                self._first = now
            self._last = now
            self._rows += n
            self._batches += 1
            # running totals per key, newest last: the final ones sum to the records counted
            self._latest.update(
                zip(
                    batch.column(self.key_field).to_pylist(),
                    batch.column(self.count_field).to_pylist(),
                    strict=True,
                )
            )
        return []

    def close(self) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        _write_json(
            os.path.join(self.stats_dir, f"sink-{ctx.subtask_index}.json"),
            {
                "rows": self._rows,
                "batches": self._batches,
                "counted": sum(self._latest.values()),
                "keys": len(self._latest),
                "first_batch_at": self._first,
                "last_batch_at": self._last,
            },
        )


class ThrottledSink(DiscardingSink):
    """A :class:`DiscardingSink` that sleeps ``sleep_s`` per batch, blocking its thread.

    ``subtasks``: the subtask indexes that sleep (None: all)."""

    def __init__(
        self, stats_dir: str, sleep_s: float, subtasks: tuple[int, ...] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(stats_dir, **kwargs)
        self.sleep_s = sleep_s
        self.subtasks = subtasks

    def runs_on_loop(self) -> bool:
        return False  # it blocks: user code as the placement must treat it

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._sleep = (
            self.sleep_s if self.subtasks is None or ctx.subtask_index in self.subtasks else 0.0
        )

    _runtime_fields: tuple[str, ...] = (*DiscardingSink._runtime_fields, "_sleep")

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows and self._sleep:
            time.sleep(self._sleep)
        return super().process_batch(batch)

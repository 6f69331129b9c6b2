"""Sinks for tests and debugging: :class:`CollectSink` keeps batches in the process
(by name), :class:`PrintSink` prints rows. Neither takes part in checkpoints' two-phase commit.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterable
from typing import IO, Any

import pyarrow as pa

from snapflow.worker.runtime.operator import Operator

_COLLECTED: dict[str, list[pa.RecordBatch]] = {}


_COLLECT_LOCK = threading.Lock()


class CollectSink(Operator):
    """Collects batches in memory, in this process, under ``name`` (shared by every copy of
    the sink, e.g. the unpickled ones of parallel subtasks). For tests; not exactly-once."""

    def __init__(self, name: str | None = None) -> None:
        self.collect_name = name or f"collect-{uuid.uuid4().hex}"
        with _COLLECT_LOCK:
            _COLLECTED.setdefault(self.collect_name, [])

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            with _COLLECT_LOCK:
                _COLLECTED.setdefault(self.collect_name, []).append(batch)
        return []

    @property
    def batches(self) -> list[pa.RecordBatch]:
        return CollectSink.results(self.collect_name)

    def rows(self) -> list[dict[str, Any]]:
        return [row for b in self.batches for row in b.to_pylist()]

    @staticmethod
    def results(name: str) -> list[pa.RecordBatch]:
        with _COLLECT_LOCK:
            return list(_COLLECTED.get(name, ()))

    @staticmethod
    def table(name: str) -> pa.Table:
        batches = CollectSink.results(name)
        return pa.Table.from_batches(batches) if batches else pa.table({})

    @staticmethod
    def clear(name: str | None = None) -> None:
        with _COLLECT_LOCK:
            if name is None:
                _COLLECTED.clear()
            else:
                _COLLECTED.pop(name, None)


class PrintSink(Operator):
    """Prints every row as ``<prefix><subtask>> {row}`` to ``stream`` (default stdout)."""

    def __init__(self, prefix: str = "", stream: IO[str] | None = None) -> None:
        self.prefix = prefix
        self.stream = stream

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["stream"] = None  # streams are process-local
        return state

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows:
            stream = self.stream if self.stream is not None else sys.stdout
            subtask = self.ctx.subtask_index if self.ctx is not None else 0
            lines: Iterable[str] = (f"{self.prefix}{subtask}> {row}\n" for row in batch.to_pylist())
            stream.writelines(lines)
            stream.flush()
        return []

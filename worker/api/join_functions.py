"""What users write for joins: a function per joined pair, or one per batch of pairs.

* :class:`ProcessJoinFunction` (Flink's): ``process_element(left, right, ctx)`` once per
  matched pair, both rows as dicts; ``ctx`` (:class:`JoinContext`) has the pair's
  ``left_timestamp``, ``right_timestamp`` and ``timestamp`` (their maximum, the timestamp
  Flink gives the output) and ``output(tag, row)`` for side outputs. Python per pair: for
  small outputs or logic that needs rows.
* :class:`BatchJoinFunction`: vectorised: ``process_pairs(left, right, ctx)`` once per batch
  of pairs, ``left`` and ``right`` two record batches of equal length (pair i is row i of
  each); ``ctx`` (:class:`BatchJoinContext`) has the pairs' ``left_timestamps`` and
  ``right_timestamps`` (int64 arrays) and ``output(tag, batch)``.

Both are :class:`snapflow.worker.api.functions.RichFunction`: ``open(ctx)``/``close()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from snapflow.worker.api.functions import RichFunction
from snapflow.worker.runtime.operator import OperatorContext, OutputTag

__all__ = ["BatchJoinContext", "BatchJoinFunction", "JoinContext", "ProcessJoinFunction"]


class JoinContext:
    """The context of one pair in :meth:`ProcessJoinFunction.process_element`."""

    def __init__(self) -> None:
        self.left_timestamp: int | None = None
        self.right_timestamp: int | None = None
        self.side_rows: dict[OutputTag, list[dict[str, Any]]] = {}

    @property
    def timestamp(self) -> int | None:
        """The pair's timestamp: the larger of the two (Flink's ``getTimestamp``); None in
        the regular join, which has no event time."""
        if self.left_timestamp is None or self.right_timestamp is None:
            return None
        return max(self.left_timestamp, self.right_timestamp)

    def output(self, tag: OutputTag, row: dict[str, Any]) -> None:
        """Emit ``row`` to the side output ``tag`` (sent with the batch's output)."""
        self.side_rows.setdefault(tag, []).append(row)


class ProcessJoinFunction(RichFunction):
    """Per matched pair (Flink's ``ProcessJoinFunction``): subclass it, pass it to
    ``interval_join(...).between(...).process(f)``. Returns or yields output rows (dicts),
    or None."""

    def process_element(
        self, left: dict[str, Any], right: dict[str, Any], ctx: JoinContext
    ) -> Iterable[dict[str, Any]] | None:
        raise NotImplementedError


class BatchJoinContext:
    """The context of :meth:`BatchJoinFunction.process_pairs`."""

    def __init__(self, ctx: OperatorContext) -> None:
        self._ctx = ctx
        self.left_timestamps: pa.Array = pa.array([], pa.int64())
        self.right_timestamps: pa.Array = pa.array([], pa.int64())

    def output(self, tag: OutputTag, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` to the side output ``tag``."""
        self._ctx.output(tag, batch)


class BatchJoinFunction(RichFunction):
    """Vectorised, per batch of matched pairs: subclass it, pass it to
    ``interval_join(...).between(...).process_batches(f)``. ``process_pairs(left, right,
    ctx)`` returns a RecordBatch, a list of them, a ``pyarrow.Table`` or None."""

    def process_pairs(
        self, left: pa.RecordBatch, right: pa.RecordBatch, ctx: BatchJoinContext
    ) -> Any:
        raise NotImplementedError

"""User functions over two connected inputs (``connect``), and what they see.

* :class:`CoProcessFunction` (Flink's ``CoProcessFunction``): record at a time,
  ``process_element1(row, ctx)`` for rows of input 0 and ``process_element2(row, ctx)`` for
  input 1, with a :class:`CoContext` (side outputs, the watermark). No keyed state and no
  timers: the inputs are not keyed (Flink refuses timers there too).
* :class:`KeyedCoProcessFunction` (Flink's ``KeyedCoProcessFunction``): both inputs keyed into
  one key-group space; both see the keyed state and event-time timers of the current key
  (:class:`KeyedCoContext`); ``on_timer(timestamp, ctx)`` when a timer fires.
* :class:`CoBatchFunction` and :class:`KeyedCoBatchFunction`: the vectorised forms,
  ``process_batch1(batch, ctx)`` / ``process_batch2(batch, ctx)`` once per input batch; the
  keyed one has the bulk state API of :class:`KeyedBatchFunction` and gets due timers as one
  batch (``on_timers``).

Every function returns (or yields) its output rows as dicts (record functions) or returns
record batches (batch functions), as the one-input functions do; both inputs' outputs form one
stream. The operators that run them are in :mod:`snapflow.worker.api.co_operators`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.api.functions import (
    KeyedBatchContext,
    KeyedContext,
    RichFunction,
    Rows,
)
from snapflow.worker.api.operators import RowEncoder
from snapflow.worker.runtime.operator import OperatorContext, OutputTag
from snapflow.worker.state.keyed_backend import KeyedStateBackend

__all__ = [
    "CoBatchContext",
    "CoBatchFunction",
    "CoContext",
    "CoProcessFunction",
    "KeyedCoBatchContext",
    "KeyedCoBatchFunction",
    "KeyedCoContext",
    "KeyedCoProcessFunction",
    "RowSideOutputs",
]


class RowSideOutputs:
    """Rows a record function sends to side outputs (``ctx.output(tag, row)``), made into one
    batch per tag when the operator's call ends (:meth:`flush`), so that they leave in the same
    emit as the call's main output."""

    def __init__(self, ctx: OperatorContext, who: str) -> None:
        self._ctx = ctx
        self._who = who
        self._rows: dict[OutputTag, list[dict[str, Any]]] = {}
        self._encoders: dict[OutputTag, RowEncoder] = {}

    def output(self, tag: OutputTag, row: dict[str, Any]) -> None:
        if not isinstance(tag, OutputTag):
            raise InvalidArgumentError(f"output() needs an OutputTag, got {tag!r:.80}")
        if not isinstance(row, dict):
            raise InvalidArgumentError(
                f"{self._who}: output(tag, row) takes one row as a dict, got {type(row).__name__}"
            )
        self._rows.setdefault(tag, []).append(row)

    def flush(self) -> None:
        rows, self._rows = self._rows, {}
        for tag, tag_rows in rows.items():
            encoder = self._encoders.get(tag)
            if encoder is None:
                encoder = self._encoders[tag] = RowEncoder(None, f"{self._who} -> {tag.name}")
            batch = encoder.encode(tag_rows)
            if batch is not None:
                self._ctx.output(tag, batch)


class CoContext:
    """What a :class:`CoProcessFunction` sees: its subtask, the current watermark (the minimum
    over both inputs) and side outputs."""

    def __init__(self, ctx: OperatorContext, side: RowSideOutputs) -> None:
        self._ctx = ctx
        self._side = side
        self.current_watermark: int = MIN_WATERMARK

    @property
    def subtask_index(self) -> int:
        return self._ctx.subtask_index

    def output(self, tag: OutputTag, row: dict[str, Any]) -> None:
        """Send ``row`` to the side output ``tag`` (Flink's ``Context.output``)."""
        self._side.output(tag, row)


class KeyedCoContext(KeyedContext):
    """What a :class:`KeyedCoProcessFunction` sees: the current key (of either input), its
    keyed state and event-time timers (shared by both inputs), and side outputs."""

    def __init__(
        self, backend: KeyedStateBackend, ctx: OperatorContext, side: RowSideOutputs
    ) -> None:
        super().__init__(backend, ctx)
        self._side = side

    def output(self, tag: OutputTag, row: dict[str, Any]) -> None:
        """Send ``row`` to the side output ``tag``."""
        self._side.output(tag, row)


class CoBatchContext:
    """What a :class:`CoBatchFunction` sees: its subtask, the current watermark and side
    outputs (one batch at a time)."""

    def __init__(self, ctx: OperatorContext) -> None:
        self._ctx = ctx
        self.current_watermark: int = MIN_WATERMARK

    @property
    def subtask_index(self) -> int:
        return self._ctx.subtask_index

    def output(self, tag: OutputTag, batch: pa.RecordBatch) -> None:
        """Send ``batch`` to the side output ``tag``."""
        self._ctx.output(tag, batch)


class KeyedCoBatchContext(KeyedBatchContext):
    """What a :class:`KeyedCoBatchFunction` sees: ``keys`` and ``key_groups`` of the current
    batch (by its input's key field) or of the fired timers, the bulk state API and bulk
    timers of :class:`KeyedBatchContext`, and side outputs."""

    def output(self, tag: OutputTag, batch: pa.RecordBatch) -> None:
        """Send ``batch`` to the side output ``tag``."""
        self._ctx.output(tag, batch)


class CoProcessFunction(RichFunction):
    """Two inputs, record at a time, not keyed: use it with ``a.connect(b).process(f)``.

    ``process_element1(row, ctx)``: a row (dict) of input 0; ``process_element2(row, ctx)``: a
    row of input 1. Both return or yield output rows (dicts), or None; ``ctx``
    (:class:`CoContext`) sends rows to side outputs.
    """

    def process_element1(self, row: dict[str, Any], ctx: CoContext) -> Rows:
        raise NotImplementedError

    def process_element2(self, row: dict[str, Any], ctx: CoContext) -> Rows:
        raise NotImplementedError


class KeyedCoProcessFunction(RichFunction):
    """Two keyed inputs, record at a time: use it with ``a.key_by(k).connect(b.key_by(k2))
    .process(f)`` or ``a.connect(b).key_by(k, k2).process(f)``.

    ``process_element1(row, ctx)`` / ``process_element2(row, ctx)``: a row of input 0 / 1 with
    its key current on ``ctx`` (:class:`KeyedCoContext`): keyed state and event-time timers
    are the key's, whichever input the row came from. ``on_timer(timestamp, ctx)``: a timer of
    ``ctx.current_key`` fired. All return or yield output rows (dicts), or None.
    """

    def process_element1(self, row: dict[str, Any], ctx: KeyedCoContext) -> Rows:
        raise NotImplementedError

    def process_element2(self, row: dict[str, Any], ctx: KeyedCoContext) -> Rows:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: KeyedCoContext) -> Rows:
        return None


class CoBatchFunction(RichFunction):
    """Two inputs, vectorised, not keyed: use it with ``a.connect(b).process_batches(f)``.

    ``process_batch1(batch, ctx)`` / ``process_batch2(batch, ctx)``: a ``pyarrow.RecordBatch``
    of input 0 / 1; each returns a RecordBatch, a list of them, a ``pyarrow.Table`` or None.
    """

    def process_batch1(self, batch: pa.RecordBatch, ctx: CoBatchContext) -> Any:
        raise NotImplementedError

    def process_batch2(self, batch: pa.RecordBatch, ctx: CoBatchContext) -> Any:
        raise NotImplementedError


class KeyedCoBatchFunction(RichFunction):
    """Two keyed inputs, vectorised, with the bulk state API: use it with
    ``keyed_a.connect(keyed_b).process_batches(f)``.

    ``process_batch1(batch, ctx)`` / ``process_batch2(batch, ctx)``: a batch of input 0 / 1,
    ``ctx.keys`` its key column (by that input's key field) and ``ctx.key_groups`` their key
    groups; state through ``ctx.get_value_state(name).get_many(keys)`` /
    ``update_many(keys, values)``, shared by both inputs. ``on_timers(timers, ctx)``: the
    timers due at a watermark as one batch (``key``, ``timestamp``). All return a RecordBatch,
    a list of them, a ``pyarrow.Table`` or None.
    """

    def process_batch1(self, batch: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        raise NotImplementedError

    def process_batch2(self, batch: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        raise NotImplementedError

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        return None

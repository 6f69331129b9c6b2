"""What users run on a fired window: Flink's ``ProcessWindowFunction`` (every element, or the
result of an incremental aggregate), ``CoGroupFunction`` and ``JoinFunction`` (window
co-group and join of two inputs), and the :class:`WindowContext` they see.

Each returns (or yields) its output: ``None``, a ``pyarrow.RecordBatch`` or ``Table``, or
``dict`` rows; plain functions of the same signature work too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.functions import RichFunction
from snapflow.worker.api.operators import RowEncoder
from snapflow.worker.api.window_assigners import TimeWindow
from snapflow.worker.runtime.operator import OperatorContext, OutputTag

__all__ = [
    "CoGroupFunction",
    "JoinFunction",
    "ProcessWindowFunction",
    "WindowContext",
    "WindowOutput",
]


class WindowContext:
    """What a window function sees (Flink's ``ProcessWindowFunction.Context``): the key and
    window being fired, the watermark, the processing time, and side outputs."""

    def __init__(self, ctx: OperatorContext, clock: Callable[[], int]) -> None:
        self._ctx = ctx
        self._clock = clock
        self.key: Any = None
        self.window: TimeWindow = TimeWindow(0, 0)
        self.current_watermark: int = 0

    def current_processing_time(self) -> int:
        return self._clock()

    def output(self, tag: OutputTag, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` to the side output ``tag``."""
        self._ctx.output(tag, batch)


class ProcessWindowFunction(RichFunction):
    """Called once per fired window (Flink's ``ProcessWindowFunction``): ``elements`` is every
    row of the window as one ``pyarrow.RecordBatch`` (``WindowedStream.process``), or a
    one-element list with the aggregate's result (``WindowedStream.aggregate(..., fn)``)."""

    def process(self, key: Any, window: TimeWindow, elements: Any, ctx: WindowContext) -> Any:
        raise NotImplementedError


class CoGroupFunction(RichFunction):
    """Window co-group of two inputs (Flink's ``CoGroupFunction``): called once per fired
    window of a key with the rows of each input in it (``first``/``second``, batches; one of
    them may have no rows), ``ctx.key`` and ``ctx.window`` set."""

    def co_group(self, first: pa.RecordBatch, second: pa.RecordBatch, ctx: WindowContext) -> Any:
        raise NotImplementedError


class JoinFunction(RichFunction):
    """Window join (Flink's ``JoinFunction``/``FlatJoinFunction``): called for every pair of
    rows of the two inputs with one key in one window; returns a row, rows, or None."""

    def join(self, first: dict[str, Any], second: dict[str, Any]) -> Any:
        raise NotImplementedError


class WindowOutput:
    """A window function's output as record batches (``output_schema`` fixes the types of
    ``dict`` rows)."""

    def __init__(self, output_schema: pa.Schema | None, who: str) -> None:
        self.output_schema = output_schema
        self.who = who
        self._encoder = RowEncoder(output_schema, who)

    def __getstate__(self) -> dict[str, Any]:
        return {"output_schema": self.output_schema, "who": self.who}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["output_schema"], state["who"])  # type: ignore[misc]

    def collect(self, produced: Any, batches: list[pa.RecordBatch], rows: list[Any]) -> None:
        """Sort one call's output into ``batches`` and ``rows``."""
        if produced is None:
            return
        if isinstance(produced, pa.RecordBatch):
            batches.append(produced)
        elif isinstance(produced, pa.Table):
            batches.extend(produced.to_batches())
        elif isinstance(produced, dict):
            rows.append(produced)
        elif isinstance(produced, Iterable):
            rows.extend(produced)
        else:
            raise InvalidArgumentError(
                f"{self.who}: a window function returns None, a RecordBatch, a Table or dict "
                f"rows, got {produced!r:.80}"
            )

    def batches(self, batches: list[pa.RecordBatch], rows: list[Any]) -> list[pa.RecordBatch]:
        encoded = self._encoder.encode(rows)
        out = [b for b in batches if b.num_rows]
        if encoded is not None and encoded.num_rows:
            out.append(encoded)
        return out

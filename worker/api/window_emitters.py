"""What fired windows emit: the window operator hands a batch of fired windows (their keys,
windows and each input's contents) to its emitter.

* :class:`ResultRows`: one row ``(key, window_start, window_end, output_field)`` per window
  (built-in aggregations and aggregate functions without a window function), vectorised;
* :class:`ProcessWindow`: a ``ProcessWindowFunction`` once per window;
* :class:`CoGroupWindow` and :class:`JoinWindow`: two inputs (window co-group and join; the
  default join emits every pair's columns side by side, vectorised).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.arrays import arange
from snapflow.worker.api.functions import close_function, open_function, runtime_context
from snapflow.worker.api.window_assigners import TimeWindow
from snapflow.worker.api.window_functions import (
    CoGroupFunction,
    JoinFunction,
    ProcessWindowFunction,
    WindowContext,
    WindowOutput,
)
from snapflow.worker.runtime.operator import OperatorContext

__all__ = [
    "CoGroupWindow",
    "FiredWindows",
    "JoinWindow",
    "ProcessWindow",
    "ResultRows",
    "WindowEmitter",
    "joined_columns",
]


class FiredWindows:
    """Windows fired together: window j is key ``keys[j]``'s ``[starts[j], ends[j])``;
    ``results[i][j]`` input i's contents of it (None: nothing); ``key_type``,
    ``result_types[i]`` and ``schemas[i]`` when known."""

    def __init__(
        self,
        keys: list[Any],
        starts: list[int],
        ends: list[int],
        results: list[list[Any]],
        key_type: pa.DataType | None,
        result_types: list[pa.DataType | None],
        schemas: list[pa.Schema | None],
    ) -> None:
        self.keys = keys
        self.starts = starts
        self.ends = ends
        self.results = results
        self.key_type = key_type
        self.result_types = result_types
        self.schemas = schemas

    @property
    def windows(self) -> list[TimeWindow]:
        return [TimeWindow(s, e) for s, e in zip(self.starts, self.ends, strict=True)]


class WindowEmitter:
    def open(self, ctx: OperatorContext, wctx: WindowContext) -> None:
        self._wctx = wctx

    def emit(self, fired: FiredWindows) -> list[pa.RecordBatch]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_wctx"}


class ResultRows(WindowEmitter):
    def __init__(self, key_field: str, output_field: str) -> None:
        self.key_field = key_field
        self.output_field = output_field

    def emit(self, fired: FiredWindows) -> list[pa.RecordBatch]:
        if not fired.keys:
            return []
        return [
            pa.RecordBatch.from_arrays(
                [
                    pa.array(fired.keys, fired.key_type),
                    pa.array(fired.starts, pa.int64()),
                    pa.array(fired.ends, pa.int64()),
                    pa.array(fired.results[0], fired.result_types[0]),
                ],
                names=[self.key_field, "window_start", "window_end", self.output_field],
            )
        ]


def _call_open(fn: Any, ctx: OperatorContext) -> None:
    open_function(fn, runtime_context(ctx))


class ProcessWindow(WindowEmitter):
    """``function.process(key, window, elements, ctx)`` (or a plain function of that
    signature) per window; ``elements``: the rows as a batch, or ``[result]`` of an
    aggregate (``single_result``)."""

    def __init__(
        self,
        function: ProcessWindowFunction | Callable[..., Any],
        output_schema: pa.Schema | None,
        single_result: bool,
    ) -> None:
        if not (isinstance(function, ProcessWindowFunction) or callable(function)):
            raise InvalidArgumentError(
                f"a ProcessWindowFunction (or a function) is needed, got {function!r:.80}"
            )
        self.function = function
        self.single_result = single_result
        self.output = WindowOutput(output_schema, "window function")

    def open(self, ctx: OperatorContext, wctx: WindowContext) -> None:
        super().open(ctx, wctx)
        _call_open(self.function, ctx)

    def close(self) -> None:
        close_function(self.function)

    def emit(self, fired: FiredWindows) -> list[pa.RecordBatch]:
        fn = self.function
        call = fn.process if isinstance(fn, ProcessWindowFunction) else fn
        wctx, batches, rows = self._wctx, [], []  # type: ignore[var-annotated]
        for key, window, result in zip(fired.keys, fired.windows, fired.results[0], strict=True):
            wctx.key, wctx.window = key, window
            elements = [result] if self.single_result else result
            self.output.collect(call(key, window, elements, wctx), batches, rows)
        return self.output.batches(batches, rows)


def _empty(schema: pa.Schema | None) -> pa.RecordBatch:
    """The rows of a side that has none in a window (one batch for every such window)."""
    if schema is None:
        return pa.RecordBatch.from_pylist([])
    return pa.RecordBatch.from_pylist([], schema=schema)


class CoGroupWindow(WindowEmitter):
    """``function.co_group(first, second, ctx)`` per window that either input reached."""

    def __init__(
        self, function: CoGroupFunction | Callable[..., Any], output_schema: pa.Schema | None
    ) -> None:
        if not (isinstance(function, CoGroupFunction) or callable(function)):
            raise InvalidArgumentError(
                f"a CoGroupFunction (or a function) is needed, got {function!r:.80}"
            )
        self.function = function
        self.output = WindowOutput(output_schema, "co_group function")

    def open(self, ctx: OperatorContext, wctx: WindowContext) -> None:
        super().open(ctx, wctx)
        _call_open(self.function, ctx)

    def close(self) -> None:
        close_function(self.function)

    def emit(self, fired: FiredWindows) -> list[pa.RecordBatch]:
        fn = self.function
        call = fn.co_group if isinstance(fn, CoGroupFunction) else fn
        wctx, batches, rows = self._wctx, [], []  # type: ignore[var-annotated]
        collect = self.output.collect
        # Arrow batches are immutable: every window without rows of a side shares one
        empty_first, empty_second = _empty(fired.schemas[0]), _empty(fired.schemas[1])
        for key, window, first, second in zip(
            fired.keys, fired.windows, fired.results[0], fired.results[1], strict=True
        ):
            wctx.key, wctx.window = key, window
            collect(
                call(
                    empty_first if first is None else first,
                    empty_second if second is None else second,
                    wctx,
                ),
                batches,
                rows,
            )
        return self.output.batches(batches, rows)


def joined_columns(
    first: Sequence[str], second: Sequence[str], prefixes: tuple[str, str]
) -> tuple[list[str], list[str]]:
    """The output names of a default join: a name both inputs have gets its input's prefix."""
    clash = set(first) & set(second)
    return (
        [prefixes[0] + n if n in clash else n for n in first],
        [prefixes[1] + n if n in clash else n for n in second],
    )


class JoinWindow(WindowEmitter):
    """Every pair of rows of the two inputs in one window of one key. Without a function
    (``function=None``), one batch per fired set with the columns of both inputs (a clashing
    name prefixed ``prefixes[i]``), built with Arrow ``take``; with one,
    ``function.join(first_row, second_row)`` (or a plain function) per pair."""

    def __init__(
        self,
        function: JoinFunction | Callable[..., Any] | None,
        output_schema: pa.Schema | None,
        prefixes: tuple[str, str] = ("left_", "right_"),
    ) -> None:
        if function is not None and not (isinstance(function, JoinFunction) or callable(function)):
            raise InvalidArgumentError(
                f"a JoinFunction (or a function) is needed, got {function!r:.80}"
            )
        self.function = function
        self.prefixes = prefixes
        self.output = WindowOutput(output_schema, "join function")

    def open(self, ctx: OperatorContext, wctx: WindowContext) -> None:
        super().open(ctx, wctx)
        if self.function is not None:
            _call_open(self.function, ctx)

    def close(self) -> None:
        if self.function is not None:
            close_function(self.function)

    def emit(self, fired: FiredWindows) -> list[pa.RecordBatch]:
        pairs = [
            (a, b)
            for a, b in zip(fired.results[0], fired.results[1], strict=True)
            if a is not None and b is not None and a.num_rows and b.num_rows
        ]
        if not pairs:
            return []
        if self.function is None:
            return [self._cross(a, b) for a, b in pairs]
        fn = self.function
        call = fn.join if isinstance(fn, JoinFunction) else fn
        batches: list[pa.RecordBatch] = []
        rows: list[Any] = []
        for a, b in pairs:
            second_rows = b.to_pylist()
            for left in a.to_pylist():
                for right in second_rows:
                    self.output.collect(call(left, right), batches, rows)
        return self.output.batches(batches, rows)

    def _cross(self, a: pa.RecordBatch, b: pa.RecordBatch) -> pa.RecordBatch:
        m = pa.scalar(b.num_rows, pa.int64())
        idx = arange(a.num_rows * b.num_rows)
        left, right = a.take(pc.divide(idx, m)), b.take(pc.modulo(idx, m))
        names0, names1 = joined_columns(a.schema.names, b.schema.names, self.prefixes)
        return pa.RecordBatch.from_arrays(
            list(left.columns) + list(right.columns), names=names0 + names1
        )

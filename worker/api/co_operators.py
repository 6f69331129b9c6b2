"""The operators of two connected inputs: they run the functions of
:mod:`snapflow.worker.api.co_functions` at the head of a two-input vertex.

Input 0 arrives in ``process_batch`` (and ``process_input(0, ...)``), input 1 in
``process_input(1, ...)``; the watermark they get is the minimum over both inputs. The keyed
ones (:class:`KeyedCoProcess`, :class:`KeyedCoBatchProcess`) share one keyed backend and one
timer namespace between the inputs (each input keyed by its own field into one key-group
space), with the per-key grouping, stepping and timer firing of the one-input keyed operators
(:mod:`snapflow.worker.api.keyed_operators`). Output order of the record operators: per batch
as :class:`snapflow.worker.api.keyed_operators.KeyedProcess` (keyed: per key in arrival
order, keys in first-occurrence order; not keyed: arrival order).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Any, ClassVar

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.api.co_functions import (
    CoBatchContext,
    CoBatchFunction,
    CoContext,
    CoProcessFunction,
    KeyedCoBatchContext,
    KeyedCoBatchFunction,
    KeyedCoContext,
    KeyedCoProcessFunction,
    RowSideOutputs,
)
from snapflow.worker.api.functions import (
    KeyedContext,
    RichFunction,
    close_function,
    open_function,
    runtime_context,
)
from snapflow.worker.api.keyed_operators import (
    STEP_ROWS,
    fire_keyed_timers,
    fired_timers_batch,
    keyed_rows_steps,
    set_batch_keys,
)
from snapflow.worker.api.operators import RowEncoder, batches_of, non_empty_batches
from snapflow.worker.runtime.chain import run_steps
from snapflow.worker.runtime.operator import Operator, OperatorContext

__all__ = [
    "CoBatchProcess",
    "CoProcess",
    "FunctionOperator",
    "KeyedCoBatchProcess",
    "KeyedCoProcess",
    "RecordOperator",
    "check_input",
    "per_row",
    "rows_steps",
]

RowCall = Callable[[dict[str, Any]], Iterable[dict[str, Any]] | None]


def check_input(input_index: int, who: str) -> int:
    """``input_index`` when it is 0 or 1; an operator of two inputs refuses any other."""
    if input_index not in (0, 1):
        raise InvalidArgumentError(f"{who} has two inputs (0 and 1), got input {input_index}")
    return input_index


def rows_steps(batch: pa.RecordBatch, call: RowCall) -> Generator[None, None, list[dict[str, Any]]]:
    """``call(row)`` per row of ``batch`` in arrival order; the rows it returns. A step per
    :data:`STEP_ROWS` rows."""
    out: list[dict[str, Any]] = []
    for n, row in enumerate(batch.to_pylist(), 1):
        produced = call(row)
        if produced is not None:
            out.extend(produced)
        if n % STEP_ROWS == 0:
            yield
    return out


def per_row(call: RowCall) -> Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]]]:
    """A per-key call of :func:`keyed_rows_steps` running ``call`` on each of the key's rows."""

    def each(_key: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for row in rows:
            produced = call(row)
            if produced is not None:
                out.extend(produced)
        return out

    return each


def _check_key_fields(key_fields: Any, who: str) -> tuple[str, str]:
    if (
        not isinstance(key_fields, tuple)
        or len(key_fields) != 2
        or not all(isinstance(k, str) and k for k in key_fields)
    ):
        raise InvalidArgumentError(
            f"{who} needs the key field of each input, (first, second), got {key_fields!r:.80}"
        )
    return key_fields


def _check_keyed_inputs(ctx: OperatorContext, key_fields: tuple[str | None, ...], who: str) -> None:
    """The vertex's inputs must be keyed by the fields the operator was built with."""
    if ctx.input_key_fields and tuple(ctx.input_key_fields) != key_fields:
        raise InvalidArgumentError(
            f"{who} was built for inputs keyed by {key_fields}, but vertex {ctx.vertex_id!r} "
            f"has inputs keyed by {tuple(ctx.input_key_fields)}"
        )


class FunctionOperator(Operator):
    """An operator that runs one user function of ``function_type``: checked when the operator
    is built, named after it, closed with the operator."""

    function_type: ClassVar[type] = RichFunction
    function: Any

    def _set_function(self, function: Any) -> None:
        if not isinstance(function, self.function_type):
            raise InvalidArgumentError(
                f"{type(self).__name__} needs a {self.function_type.__name__}, got "
                f"{function!r:.100}"
            )
        self.function = function

    @property
    def name(self) -> str:
        return f"{type(self).__name__}({type(self.function).__name__})"

    def close(self) -> None:
        close_function(self.function)


class RecordOperator(FunctionOperator):
    """A two-input operator over dict rows: both inputs in steps, outputs encoded to batches
    with one schema (``output_schema`` or inferred), side outputs flushed with each call."""

    output_schema: pa.Schema | None
    _encoder: RowEncoder
    _side: RowSideOutputs
    _runtime_fields: tuple[str, ...] = ("_encoder", "_side")

    def _open_outputs(self, ctx: OperatorContext) -> None:
        self._encoder = RowEncoder(self.output_schema, self.name)
        self._side = RowSideOutputs(ctx, self.name)

    def _emit(self, rows: list[dict[str, Any]]) -> list[pa.RecordBatch]:
        self._side.flush()
        return non_empty_batches([self._encoder.encode(rows)])

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return run_steps(self.process_input_steps(0, batch))

    def process_batch_steps(
        self, batch: pa.RecordBatch
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        return (yield from self.process_input_steps(0, batch))

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return run_steps(self.process_input_steps(input_index, batch))

    def process_input_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        check_input(input_index, self.name)
        if not batch.num_rows:
            return []
        rows = yield from self._rows_steps(input_index, batch)
        return self._emit(rows)

    def _rows_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[dict[str, Any]]]:
        raise NotImplementedError


class CoProcess(RecordOperator):
    """Runs a :class:`CoProcessFunction`: ``process_element1`` per row of input 0,
    ``process_element2`` per row of input 1, in arrival order."""

    function_type = CoProcessFunction
    _runtime_fields: tuple[str, ...] = ("_encoder", "_side", "_cctx")

    def __init__(self, function: CoProcessFunction, output_schema: pa.Schema | None = None) -> None:
        self._set_function(function)
        self.output_schema = output_schema

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._open_outputs(ctx)
        self._cctx = CoContext(ctx, self._side)
        open_function(self.function, runtime_context(ctx))

    def _rows_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[dict[str, Any]]]:
        fn, cctx = self.function, self._cctx
        process = fn.process_element1 if input_index == 0 else fn.process_element2
        return (yield from rows_steps(batch, lambda row: process(row, cctx)))

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        self._cctx.current_watermark = watermark_ms
        return []


class KeyedCoProcess(RecordOperator):
    """Runs a :class:`KeyedCoProcessFunction` on a keyed vertex of two inputs keyed by
    ``key_fields`` (input 0's, input 1's): each row with its key current; timers of both
    inputs' keys fire ``on_timer`` at a watermark, and every remaining one at the end of the
    input (as the final ``MAX_WATERMARK`` would)."""

    function_type = KeyedCoProcessFunction
    _runtime_fields: tuple[str, ...] = ("_encoder", "_side", "_kctx", "_backend")

    def __init__(
        self,
        key_fields: tuple[str, str],
        function: KeyedCoProcessFunction,
        output_schema: pa.Schema | None = None,
    ) -> None:
        self._set_function(function)
        self.key_fields = _check_key_fields(key_fields, "KeyedCoProcess")
        self.output_schema = output_schema

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        _check_keyed_inputs(ctx, self.key_fields, self.name)
        self._backend = ctx.require_keyed_state(self.name)
        self._open_outputs(ctx)
        self._kctx = KeyedCoContext(self._backend, ctx, self._side)
        open_function(self.function, runtime_context(ctx, self._kctx))

    def _rows_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[dict[str, Any]]]:
        fn, kctx = self.function, self._kctx
        process = fn.process_element1 if input_index == 0 else fn.process_element2
        call = per_row(lambda row: process(row, kctx))
        key_field = self.key_fields[input_index]
        return (yield from keyed_rows_steps(batch, key_field, self._backend, call, self.name))

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        fn, kctx = self.function, self._kctx
        rows = fire_keyed_timers(
            self._backend, watermark_ms, kctx, lambda ts, _key: fn.on_timer(ts, kctx)
        )
        return self._emit(rows)

    def end_input(self) -> list[pa.RecordBatch]:
        return self.process_watermark(MAX_WATERMARK)


class CoBatchProcess(FunctionOperator):
    """Runs a :class:`CoBatchFunction`: ``process_batch1`` per batch of input 0,
    ``process_batch2`` per batch of input 1."""

    function_type = CoBatchFunction
    _runtime_fields: tuple[str, ...] = ("_bctx",)

    def __init__(self, function: CoBatchFunction) -> None:
        self._set_function(function)

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._bctx = CoBatchContext(ctx)
        open_function(self.function, runtime_context(ctx))

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return self.process_input(0, batch)

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        check_input(input_index, self.name)
        if not batch.num_rows:
            return []
        fn = self.function
        process = fn.process_batch1 if input_index == 0 else fn.process_batch2
        return batches_of(process(batch, self._bctx), self.name)

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        self._bctx.current_watermark = watermark_ms
        return []


class KeyedCoBatchProcess(FunctionOperator):
    """Runs a :class:`KeyedCoBatchFunction` on a keyed vertex of two inputs keyed by
    ``key_fields``: every batch with its keys on the context (by its input's key field), due
    timers as one batch at a watermark, every remaining one at the end of the input."""

    function_type = KeyedCoBatchFunction
    _runtime_fields: tuple[str, ...] = ("_backend", "_bctx")

    def __init__(self, key_fields: tuple[str, str], function: KeyedCoBatchFunction) -> None:
        self._set_function(function)
        self.key_fields = _check_key_fields(key_fields, "KeyedCoBatchProcess")

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        _check_keyed_inputs(ctx, self.key_fields, self.name)
        self._backend = ctx.require_keyed_state(self.name)
        self._bctx = KeyedCoBatchContext(self._backend, ctx)
        open_function(self.function, runtime_context(ctx, KeyedContext(self._backend, ctx)))

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return self.process_input(0, batch)

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        check_input(input_index, self.name)
        if not batch.num_rows:
            return []
        set_batch_keys(self._bctx, batch, self.key_fields[input_index], self.name)
        fn = self.function
        process = fn.process_batch1 if input_index == 0 else fn.process_batch2
        return batches_of(process(batch, self._bctx), self.name)

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        timers = fired_timers_batch(self._backend, watermark_ms, self._bctx)
        if timers is None:
            return []
        return batches_of(self.function.on_timers(timers, self._bctx), self.name)

    def end_input(self) -> list[pa.RecordBatch]:
        return self.process_watermark(MAX_WATERMARK)

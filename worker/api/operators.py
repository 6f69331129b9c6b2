"""Operators: the user-visible processing steps of a vertex.

A vertex runs a chain of operators in one task (Flink's operator chaining). Records travel as
``pyarrow.RecordBatch``; the batch API (:class:`MapBatches`, :class:`FilterBatches`,
:class:`FlatMapBatches`) is the primary, vectorised path. The record API (:class:`Map`,
:class:`FlatMap`, :class:`Filter`) wraps Python functions over ``dict`` rows. The keyed
operators are in :mod:`snapflow.worker.api.keyed_operators`.

The life cycle and conventions every operator follows are in :mod:`snapflow.worker.runtime.operator`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.functions import close_function, open_function, runtime_context
from snapflow.worker.runtime.operator import Operator, OperatorContext


def _has_null_type(schema: pa.Schema) -> bool:
    return any(pa.types.is_null(f.type) for f in schema)


class RowEncoder:
    """Python ``dict`` rows to record batches with a stable schema: the explicit one, or the
    one inferred from the first rows (cached once no column is all-null)."""

    def __init__(self, schema: pa.Schema | None, who: str) -> None:
        self.schema = schema
        self.explicit = schema is not None
        self.who = who

    def encode(self, rows: list[dict[str, Any]]) -> pa.RecordBatch | None:
        if not rows:
            return None
        schema = self.schema
        try:
            if schema is not None:
                return pa.RecordBatch.from_pylist(rows, schema=schema)
            batch = pa.RecordBatch.from_pylist(rows)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            hint = "" if self.explicit else " (pass output_schema= to fix the output types)"
            raise InvalidArgumentError(
                f"{self.who}: output rows do not fit the output schema {schema}: {e}{hint}"
            ) from e
        if not _has_null_type(batch.schema):
            self.schema = batch.schema
        return batch


def rows_to_batch(rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> pa.RecordBatch:
    """A record batch of ``dict`` rows (``schema`` inferred when not given)."""
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def non_empty_batches(batches: Iterable[pa.RecordBatch | None]) -> list[pa.RecordBatch]:
    """The batches that hold rows (an operator's output never carries empty ones)."""
    return [b for b in batches if b is not None and b.num_rows]


def _check_batch_output(out: Any, who: str) -> pa.RecordBatch | None:
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches()[0] if out.num_rows else None
    if not isinstance(out, pa.RecordBatch):
        raise InvalidArgumentError(f"{who}: the function must return a pyarrow.RecordBatch")
    return out


class _FunctionOperator(Operator):
    """An operator running the user function ``self.fn``: a :class:`RichFunction` is opened
    with the runtime context after the operator, and closed with it."""

    fn: Any

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        open_function(self.fn, runtime_context(ctx))

    def close(self) -> None:
        close_function(self.fn)


def batches_of(out: Any, who: str) -> list[pa.RecordBatch]:
    """A batch function's result as batches: None, a RecordBatch, a Table or an iterable of them."""
    if out is None:
        return []
    if isinstance(out, pa.RecordBatch | pa.Table):
        return non_empty_batches([_check_batch_output(out, who)])
    return non_empty_batches(_check_batch_output(b, who) for b in out)


class MapBatches(_FunctionOperator):
    """``fn(batch) -> batch`` (a ``pa.Table`` is accepted too)."""

    def __init__(self, fn: Callable[[pa.RecordBatch], pa.RecordBatch]) -> None:
        self.fn = fn

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        out = self.fn(batch)
        if out is None:
            return []
        return non_empty_batches([_check_batch_output(out, self.name)])


class FilterBatches(_FunctionOperator):
    """Keeps the rows where ``fn(batch)`` (a boolean array or a list of bools) is true; nulls
    count as false."""

    def __init__(self, fn: Callable[[pa.RecordBatch], Any]) -> None:
        self.fn = fn

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        mask = self.fn(batch)
        if isinstance(mask, pa.ChunkedArray):
            mask = mask.combine_chunks()
        if not isinstance(mask, pa.Array):
            mask = pa.array(mask, pa.bool_())
        if len(mask) != batch.num_rows or not pa.types.is_boolean(mask.type):
            raise InvalidArgumentError(
                f"{self.name}: the function must return {batch.num_rows} booleans, got "
                f"{len(mask)} of type {mask.type}"
            )
        return non_empty_batches([batch.filter(mask, null_selection_behavior="drop")])


class FlatMapBatches(_FunctionOperator):
    """``fn(batch) -> list of batches`` (or any iterable; ``None`` is nothing)."""

    def __init__(self, fn: Callable[[pa.RecordBatch], Iterable[pa.RecordBatch] | None]) -> None:
        self.fn = fn

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        out = self.fn(batch)
        if out is None:
            return []
        return non_empty_batches(_check_batch_output(b, self.name) for b in out)


class Map(_FunctionOperator):
    """``fn(row: dict) -> dict``, one output row per input row. The output schema is
    ``output_schema``, or inferred from the first outputs and kept from then on."""

    _runtime_fields: tuple[str, ...] = ("_encoder",)

    def __init__(
        self, fn: Callable[[dict[str, Any]], dict[str, Any]], output_schema: pa.Schema | None = None
    ) -> None:
        self.fn = fn
        self.output_schema = output_schema
        self._encoder = RowEncoder(output_schema, self.name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._encoder = RowEncoder(self.output_schema, self.name)

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        fn = self.fn
        return non_empty_batches([self._encoder.encode([fn(row) for row in batch.to_pylist()])])


class FlatMap(_FunctionOperator):
    """``fn(row: dict) -> iterable of dict`` (``None`` is nothing)."""

    _runtime_fields: tuple[str, ...] = ("_encoder",)

    def __init__(
        self,
        fn: Callable[[dict[str, Any]], Iterable[dict[str, Any]] | None],
        output_schema: pa.Schema | None = None,
    ) -> None:
        self.fn = fn
        self.output_schema = output_schema
        self._encoder = RowEncoder(output_schema, self.name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._encoder = RowEncoder(self.output_schema, self.name)

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        fn = self.fn
        out: list[dict[str, Any]] = []
        for row in batch.to_pylist():
            produced = fn(row)
            if produced is not None:
                out.extend(produced)
        return non_empty_batches([self._encoder.encode(out)])


class Filter(_FunctionOperator):
    """Keeps the rows for which ``fn(row: dict)`` is truthy (the input schema is kept)."""

    def __init__(self, fn: Callable[[dict[str, Any]], Any]) -> None:
        self.fn = fn

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        fn = self.fn
        mask = [bool(fn(row)) for row in batch.to_pylist()]
        return non_empty_batches([batch.filter(pa.array(mask, pa.bool_()))])

"""What a keyed join emits for its matched pairs: the joined rows (:class:`SelectPairs`, the
default), a :class:`ProcessJoinFunction` per pair (:class:`PerPair`) or a
:class:`BatchJoinFunction` per batch of pairs (:class:`BatchPairs`).

The joined rows' columns (:func:`joined_schema`): every column of the left (first) input,
then every column of the right one, except the right key when it has the left key's name
(the two are equal in every pair: it appears once). A name both sides still have is
prefixed on each side (``left_prefix``, ``right_prefix``; by default ``left_``/``right_``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.functions import close_function, open_function, runtime_context
from snapflow.worker.api.join_functions import (
    BatchJoinContext,
    BatchJoinFunction,
    JoinContext,
    ProcessJoinFunction,
)
from snapflow.worker.api.operators import RowEncoder, batches_of, non_empty_batches
from snapflow.worker.runtime.operator import OperatorContext

__all__ = ["BatchPairs", "PairEmitter", "PerPair", "SelectPairs", "joined_schema"]


def _joined_names(
    left: list[str], right: list[str], left_key: str, right_key: str, lp: str, rp: str
) -> tuple[list[str], list[int], list[str]]:
    """The left's output names, the right columns kept (indices) and their output names."""
    kept = [i for i, n in enumerate(right) if not (n == right_key and right_key == left_key)]
    both = set(left) & {right[i] for i in kept}
    left_out = [lp + n if n in both else n for n in left]
    right_out = [rp + right[i] if right[i] in both else right[i] for i in kept]
    names = left_out + right_out
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InvalidArgumentError(
            f"the joined rows would have the column(s) {dup} twice; choose other prefixes "
            f"(left_prefix=, right_prefix=) or rename the columns before the join"
        )
    return left_out, kept, right_out


def joined_schema(
    left: pa.Schema, right: pa.Schema, left_key: str, right_key: str, lp: str, rp: str
) -> pa.Schema:
    """The schema of the joined rows of ``left`` and ``right`` rows (module docstring)."""
    left_out, kept, right_out = _joined_names(left.names, right.names, left_key, right_key, lp, rp)
    fields = [f.with_name(n) for f, n in zip(left, left_out, strict=True)]
    fields += [right.field(i).with_name(n) for i, n in zip(kept, right_out, strict=True)]
    return pa.schema(fields)


class PairEmitter:
    """Turns matched pairs into output batches; ``open``/``close`` with the operator."""

    def open(self, ctx: OperatorContext) -> None:
        pass

    def close(self) -> None:
        pass

    def emit(
        self,
        left: pa.RecordBatch,
        right: pa.RecordBatch,
        left_times: np.ndarray[Any, Any] | None,
        right_times: np.ndarray[Any, Any] | None,
    ) -> list[pa.RecordBatch]:
        raise NotImplementedError


class SelectPairs(PairEmitter):
    """The joined rows, as one batch per batch of pairs."""

    def __init__(self, left_key: str, right_key: str, left_prefix: str, right_prefix: str) -> None:
        self.left_key = left_key
        self.right_key = right_key
        self.left_prefix = left_prefix
        self.right_prefix = right_prefix
        self._layout: tuple[pa.Schema, pa.Schema, list[int]] | None = None
        self._schema: pa.Schema | None = None

    def emit(
        self,
        left: pa.RecordBatch,
        right: pa.RecordBatch,
        left_times: np.ndarray[Any, Any] | None,
        right_times: np.ndarray[Any, Any] | None,
    ) -> list[pa.RecordBatch]:
        if not left.num_rows:
            return []
        layout = self._layout
        if layout is None or layout[0] is not left.schema or layout[1] is not right.schema:
            schema = joined_schema(
                left.schema,
                right.schema,
                self.left_key,
                self.right_key,
                self.left_prefix,
                self.right_prefix,
            )
            _, kept, _ = _joined_names(
                left.schema.names,
                right.schema.names,
                self.left_key,
                self.right_key,
                self.left_prefix,
                self.right_prefix,
            )
            self._layout = layout = (left.schema, right.schema, kept)
            self._schema = schema
        assert self._schema is not None
        columns = list(left.columns) + [right.column(i) for i in layout[2]]
        return [pa.RecordBatch.from_arrays(columns, schema=self._schema)]


class PerPair(PairEmitter):
    """A :class:`ProcessJoinFunction` per pair; its rows encoded with ``output_schema`` (or
    the schema inferred from the first rows)."""

    def __init__(self, function: ProcessJoinFunction, output_schema: pa.Schema | None) -> None:
        if not isinstance(function, ProcessJoinFunction):
            raise InvalidArgumentError(
                f"process needs a snapflow.worker.api.join_functions.ProcessJoinFunction, got "
                f"{function!r:.100}"
            )
        self.function = function
        self.output_schema = output_schema

    def open(self, ctx: OperatorContext) -> None:
        self._ctx = ctx
        self._encoder = RowEncoder(self.output_schema, type(self.function).__name__)
        open_function(self.function, runtime_context(ctx))

    def close(self) -> None:
        close_function(self.function)

    def emit(
        self,
        left: pa.RecordBatch,
        right: pa.RecordBatch,
        left_times: np.ndarray[Any, Any] | None,
        right_times: np.ndarray[Any, Any] | None,
    ) -> list[pa.RecordBatch]:
        out: list[dict[str, Any]] = []
        jctx = JoinContext()
        lts = left_times.tolist() if left_times is not None else [None] * left.num_rows
        rts = right_times.tolist() if right_times is not None else [None] * left.num_rows
        process = self.function.process_element
        for lrow, rrow, lt, rt in zip(left.to_pylist(), right.to_pylist(), lts, rts, strict=True):
            jctx.left_timestamp, jctx.right_timestamp = lt, rt
            produced = process(lrow, rrow, jctx)
            if produced is not None:
                out.extend(produced)
        for tag, rows in jctx.side_rows.items():
            self._ctx.output(tag, pa.RecordBatch.from_pylist(rows))
        return non_empty_batches([self._encoder.encode(out)])

    def __getstate__(self) -> dict[str, Any]:
        return {"function": self.function, "output_schema": self.output_schema}


class BatchPairs(PairEmitter):
    """A :class:`BatchJoinFunction` per batch of pairs."""

    def __init__(self, function: BatchJoinFunction) -> None:
        if not isinstance(function, BatchJoinFunction):
            raise InvalidArgumentError(
                f"process_batches needs a snapflow.worker.api.join_functions.BatchJoinFunction, "
                f"got {function!r:.100}"
            )
        self.function = function

    def open(self, ctx: OperatorContext) -> None:
        self._bctx = BatchJoinContext(ctx)
        open_function(self.function, runtime_context(ctx))

    def close(self) -> None:
        close_function(self.function)

    def emit(
        self,
        left: pa.RecordBatch,
        right: pa.RecordBatch,
        left_times: np.ndarray[Any, Any] | None,
        right_times: np.ndarray[Any, Any] | None,
    ) -> list[pa.RecordBatch]:
        if not left.num_rows:
            return []
        bctx = self._bctx
        if left_times is not None and right_times is not None:
            bctx.left_timestamps = pa.array(left_times)
            bctx.right_timestamps = pa.array(right_times)
        name = type(self.function).__name__
        return batches_of(self.function.process_pairs(left, right, bctx), name)

    def __getstate__(self) -> dict[str, Any]:
        return {"function": self.function}

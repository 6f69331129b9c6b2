"""The operators of the broadcast state pattern: they run the functions of
:mod:`snapflow.worker.api.broadcast_functions` at the head of a vertex whose input 1 is
broadcast (every subtask gets every row of it).

Input 0 (the element side) gets broadcast state read-only, input 1 (the broadcast side)
writable. Broadcast state lives in the operator's operator-state backend
(``OperatorStateBackend.get_broadcast_state``), so each subtask checkpoints its own copy and a
restore gives it back (on a rescale: one old subtask's copy each, as Flink does). Rows of one
input are processed in arrival order (keyed: per key as
:class:`snapflow.worker.api.keyed_operators.KeyedProcess`); the order between the two inputs
is the order their batches reach the task.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.api.broadcast_functions import (
    BroadcastContext,
    BroadcastProcessFunction,
    KeyedBroadcastContext,
    KeyedBroadcastProcessFunction,
    ReadOnlyBroadcastContext,
    ReadOnlyKeyedBroadcastContext,
    broadcast_side_keyed_state_error,
)
from snapflow.worker.api.co_operators import RecordOperator, per_row, rows_steps
from snapflow.worker.api.functions import open_function, runtime_context
from snapflow.worker.api.keyed_operators import fire_keyed_timers, keyed_rows_steps
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.errors import NoCurrentKeyError

__all__ = ["BroadcastProcess", "KeyedBroadcastProcess"]


class BroadcastProcess(RecordOperator):
    """Runs a :class:`BroadcastProcessFunction` on a non-keyed vertex: ``process_element``
    per row of input 0, ``process_broadcast_element`` per row of the broadcast input 1."""

    function_type = BroadcastProcessFunction

    _runtime_fields: tuple[str, ...] = ("_encoder", "_side", "_read_ctx", "_write_ctx")

    def __init__(
        self, function: BroadcastProcessFunction, output_schema: pa.Schema | None = None
    ) -> None:
        self._set_function(function)
        self.output_schema = output_schema

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._open_outputs(ctx)
        self._read_ctx = ReadOnlyBroadcastContext(ctx, self._side)
        self._write_ctx = BroadcastContext(ctx, self._side)
        open_function(self.function, runtime_context(ctx))

    def _rows_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[dict[str, Any]]]:
        fn = self.function
        if input_index == 0:
            read_ctx = self._read_ctx
            return (yield from rows_steps(batch, lambda row: fn.process_element(row, read_ctx)))
        write_ctx = self._write_ctx
        return (
            yield from rows_steps(batch, lambda row: fn.process_broadcast_element(row, write_ctx))
        )

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        self._read_ctx.current_watermark = watermark_ms
        self._write_ctx.current_watermark = watermark_ms
        return []


class KeyedBroadcastProcess(RecordOperator):
    """Runs a :class:`KeyedBroadcastProcessFunction` on a keyed vertex whose input 0 is keyed
    by ``key_field`` and input 1 is broadcast: ``process_element`` per row of input 0 with its
    key current, ``process_broadcast_element`` per broadcast row with no current key (keyed
    state through ``apply_to_keyed_state``; a direct access raises an error naming it).
    Timers fire ``on_timer`` at a watermark, every remaining one at the end of the input."""

    function_type = KeyedBroadcastProcessFunction

    _runtime_fields: tuple[str, ...] = (
        "_encoder",
        "_side",
        "_backend",
        "_read_ctx",
        "_write_ctx",
    )

    def __init__(
        self,
        key_field: str,
        function: KeyedBroadcastProcessFunction,
        output_schema: pa.Schema | None = None,
    ) -> None:
        self._set_function(function)
        if not isinstance(key_field, str) or not key_field:
            raise InvalidArgumentError(
                f"KeyedBroadcastProcess needs a key field, got {key_field!r}"
            )
        self.key_field = key_field
        self.output_schema = output_schema

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        if ctx.input_key_fields and tuple(ctx.input_key_fields) != (self.key_field, None):
            raise InvalidArgumentError(
                f"{self.name} needs input 0 keyed by {self.key_field!r} and a broadcast input "
                f"1, but vertex {ctx.vertex_id!r} has inputs keyed by {ctx.input_key_fields}"
            )
        self._backend = ctx.require_keyed_state(self.name)
        self._open_outputs(ctx)
        self._read_ctx = ReadOnlyKeyedBroadcastContext(self._backend, ctx, self._side)
        self._write_ctx = KeyedBroadcastContext(ctx, self._side, self._read_ctx)
        open_function(self.function, runtime_context(ctx, self._read_ctx))

    def _rows_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[dict[str, Any]]]:
        fn = self.function
        if input_index == 0:
            read_ctx = self._read_ctx
            call = per_row(lambda row: fn.process_element(row, read_ctx))
            return (
                yield from keyed_rows_steps(batch, self.key_field, self._backend, call, self.name)
            )
        write_ctx = self._write_ctx
        self._backend.clear_current_key()  # the broadcast input has no key
        try:
            return (
                yield from rows_steps(
                    batch, lambda row: fn.process_broadcast_element(row, write_ctx)
                )
            )
        except NoCurrentKeyError as e:  # a keyed state object kept from open or an element
            raise broadcast_side_keyed_state_error("keyed state used") from e

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        fn, read_ctx = self.function, self._read_ctx
        rows = fire_keyed_timers(
            self._backend, watermark_ms, read_ctx, lambda ts, _key: fn.on_timer(ts, read_ctx)
        )
        return self._emit(rows)

    def end_input(self) -> list[pa.RecordBatch]:
        return self.process_watermark(MAX_WATERMARK)

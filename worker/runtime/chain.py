"""The chain that runs a vertex's operators in one task (Flink's operator chaining), and what
chained operators share: running an operator's batch steps to the end (:func:`run_steps`) and
the timers of one keyed backend (:func:`fire_timers`)."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Generator, Iterable, Sequence
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.runtime.operator import Operator, OperatorContext, SourceOperator
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.timers import Timer

__all__ = ["Chain", "fire_timers", "run_steps"]


class Chain:
    """The operators of one vertex, run back to back: the outputs of operator i are the input
    of operator i + 1. Watermarks, ``end_input`` and checkpoint notifications go through every
    operator in order; what operator i emits on a watermark (or on ``end_input``) reaches
    operator i + 1 *before* that operator sees the watermark (or ``end_input``) itself.

    ``open(ctx)`` gives operator i a copy of ``ctx`` with its own ``operator_id`` (the
    backends are shared). An empty chain passes batches through unchanged (a vertex that is
    only a source, run as ``Chain(operators[1:])``). When the head is a
    :class:`SourceOperator`, :meth:`poll_batch` polls it and runs the rest of the chain.
    """

    def __init__(self, operators: Sequence[Operator]) -> None:
        ops = list(operators)
        for op in ops:
            if not isinstance(op, Operator):
                raise InvalidArgumentError(f"not an operator: {op!r:.100}")
        for op in ops[1:]:
            if isinstance(op, SourceOperator):
                raise InvalidArgumentError("a source can only be the head of a chain")
        self.operators = ops

    @property
    def head(self) -> Operator | None:
        return self.operators[0] if self.operators else None

    @property
    def is_source(self) -> bool:
        return bool(self.operators) and isinstance(self.operators[0], SourceOperator)

    def __len__(self) -> int:
        return len(self.operators)

    def open(self, ctx: OperatorContext, operator_ids: Sequence[str] | None = None) -> None:
        """Open every operator with a copy of ``ctx`` whose ``operator_id`` is
        ``operator_ids[i]`` (e.g. the JobGraph's ``OperatorSpec.operator_id``), by default
        ``"<ctx.operator_id>.<i>"``. The ids must be distinct and stable across restarts."""
        if operator_ids is None:
            ids = [f"{ctx.operator_id}.{i}" for i in range(len(self.operators))]
        else:
            ids = list(operator_ids)
            if len(ids) != len(self.operators) or len(set(ids)) != len(ids):
                raise InvalidArgumentError(
                    f"need {len(self.operators)} distinct operator ids, got {ids!r}"
                )
        for op, op_id in zip(self.operators, ids, strict=True):
            op.open(dataclasses.replace(ctx, operator_id=op_id))

    def _push(self, batches: Iterable[pa.RecordBatch], start: int) -> list[pa.RecordBatch]:
        current = [b for b in batches if b.num_rows]
        for op in self.operators[start:]:
            if not current:
                return []
            nxt: list[pa.RecordBatch] = []
            for b in current:
                nxt.extend(o for o in op.process_batch(b) if o.num_rows)
            current = nxt
        return current

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> list[pa.RecordBatch]:
        """Run ``batch`` of logical input ``input_index`` through the chain (from operator 1
        when the head is a source); the head tells its inputs apart
        (:meth:`Operator.process_input`)."""
        if input_index and self.operators and batch.num_rows:
            return self._push(self.operators[0].process_input(input_index, batch), 1)
        return self._push((batch,), 1 if self.is_source else 0)

    def process_batch_steps(
        self, batch: pa.RecordBatch, input_index: int = 0
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        """:meth:`process_batch` in the steps of the first operator it reaches
        (:meth:`Operator.process_input_steps`); the rest of the chain runs in the last step."""
        start = 1 if self.is_source else 0
        if start >= len(self.operators) or not batch.num_rows:
            return self._push((batch,), start)
        out = yield from self.operators[start].process_input_steps(input_index, batch)
        return self._push(out, start + 1)

    def end_of_input(self, input_index: int) -> list[pa.RecordBatch]:
        """One of several inputs ended: only the head has several inputs."""
        head = self.head
        return self._push(head.end_of_input(input_index), 1) if head is not None else []

    def poll_batch(self, max_records: int) -> list[pa.RecordBatch] | None:
        """Source chains: poll the head and run the batch through the rest. ``None`` when the
        source is finished, ``[]`` when nothing came (or everything was filtered out)."""
        head = self.head
        if not isinstance(head, SourceOperator):
            raise InvalidArgumentError("poll_batch() needs a chain whose head is a source")
        batch = head.poll_batch(max_records)
        if batch is None:
            return None
        return self._push((batch,), 1)

    def current_watermark(self) -> int:
        head = self.head
        return head.current_watermark() if isinstance(head, SourceOperator) else MIN_WATERMARK

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        for i, op in enumerate(self.operators):
            fired = op.process_watermark(watermark_ms)
            if fired:
                out.extend(self._push(fired, i + 1))
        return out

    def next_processing_time_ms(self) -> int | None:
        """The earliest processing-time timer of the chain's operators (None: none)."""
        times = [t for op in self.operators if (t := op.next_processing_time_ms()) is not None]
        return min(times, default=None)

    def process_processing_time(self, now_ms: int) -> list[pa.RecordBatch]:
        """Every operator's due processing-time timers fire; what operator i emits runs
        through the operators after it, as for watermarks."""
        out: list[pa.RecordBatch] = []
        for i, op in enumerate(self.operators):
            fired = op.process_processing_time(now_ms)
            if fired:
                out.extend(self._push(fired, i + 1))
        return out

    def end_input(self) -> list[pa.RecordBatch]:
        out: list[pa.RecordBatch] = []
        for i, op in enumerate(self.operators):
            flushed = op.end_input()
            if flushed:
                out.extend(self._push(flushed, i + 1))
        return out

    def snapshot_state(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.snapshot_state(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        for op in self.operators:
            op.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        """Close every operator (all of them, even if one fails); re-raise the first error."""
        error: BaseException | None = None
        for op in self.operators:
            try:
                op.close()
            except BaseException as e:
                if error is None:
                    error = e
        if error is not None:
            raise error


def run_steps(steps: Generator[None, None, list[pa.RecordBatch]]) -> list[pa.RecordBatch]:
    """Run the steps of a ``process_batch_steps`` generator to the end; what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            out: list[pa.RecordBatch] = done.value
            return out


# backend -> {owner operator id: timers fired but not yet taken by their operator}
_FIRED: weakref.WeakKeyDictionary[KeyedStateBackend, dict[Any, list[Timer]]] = (
    weakref.WeakKeyDictionary()
)


def fire_timers(backend: KeyedStateBackend, watermark_ms: int, owner: str) -> list[Timer]:
    """Advance ``backend``'s timer service to ``watermark_ms`` and return the due timers of
    operator ``owner``, in timestamp order.

    Keyed operators chained in one task share one backend and so one timer service; every
    operator registers its timers with a namespace ``(owner, ...)`` (its ``operator_id``
    first). Advancing the watermark returns the timers of all operators: those of the others
    are kept here until their operator asks (the chain hands the watermark to every operator).
    """
    fired = backend.timer_service.advance_watermark(watermark_ms)
    buckets = _FIRED.get(backend)
    if not fired and not buckets:
        return []
    if buckets is None:
        buckets = _FIRED[backend] = {}
    for timer in fired:
        ns = timer.namespace
        if isinstance(ns, tuple) and ns:  # timers of no operator (other namespaces) are dropped
            buckets.setdefault(ns[0], []).append(timer)
    return buckets.pop(owner, [])

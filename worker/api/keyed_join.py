"""What the keyed two-input joins share (:mod:`snapflow.worker.api.interval_join`,
:mod:`snapflow.worker.api.regular_join`): a :class:`~snapflow.worker.api.join_buffer.JoinBuffer`
per input, kept in keyed state incrementally (``"<operator_id>/left/chunks"`` and
``"<operator_id>/right/chunks"``: chunks of rows per key group,
:class:`~snapflow.worker.api.join_checkpoint.BufferCheckpoint`), and the emitter that turns
matched pairs into output."""

from __future__ import annotations

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.join_buffer import JoinBuffer, Matches, Run
from snapflow.worker.api.join_checkpoint import BufferCheckpoint
from snapflow.worker.api.join_output import PairEmitter, SelectPairs
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state.errors import IncompatibleStateError

__all__ = ["KeyedJoinOperator"]

SIDES = ("left", "right")


class KeyedJoinOperator(Operator):
    """Base of the keyed joins: input 0 is the left side, input 1 the right one."""

    _runtime_fields: tuple[str, ...] = ("_backend", "_buffers", "_checkpoints")

    def __init__(
        self,
        left_key: str,
        right_key: str,
        emitter: PairEmitter | None,
    ) -> None:
        for what, value in (("left_key", left_key), ("right_key", right_key)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"{what} must be a field name, got {value!r}")
        self.left_key = left_key
        self.right_key = right_key
        self.emitter = (
            emitter if emitter is not None else SelectPairs(left_key, right_key, "left_", "right_")
        )

    def _time_fields(self) -> tuple[str | None, str | None]:
        return None, None

    def _with_stamps(self) -> bool:
        return False

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._backend = backend = ctx.require_keyed_state(self.name)
        times = self._time_fields()
        keys = (self.left_key, self.right_key)
        self._buffers = tuple(
            JoinBuffer(keys[i], times[i], f"{self.name} ({SIDES[i]} input)",
                       with_stamps=self._with_stamps())
            for i in range(2)
        )  # fmt: skip
        names = [ctx.state_name(f"{side}/chunks") for side in SIDES]
        self._checkpoints = tuple(
            BufferCheckpoint(buffer, backend.get_value_state(name), backend)
            for buffer, name in zip(self._buffers, names, strict=True)
        )
        if ctx.is_restored:
            for side in SIDES:
                if ctx.state_name(side) in backend.state_names():
                    raise IncompatibleStateError(
                        f"{self.name}: the snapshot holds this join's rows in the layout of "
                        f"an earlier version (state {ctx.state_name(side)!r}: one entry per "
                        "key group), which this version does not read; restart the job "
                        "without it"
                    )
            for checkpoint, name in zip(self._checkpoints, names, strict=True):
                checkpoint.load(name)
        self.emitter.open(ctx)

    def buffered(self, input_index: int) -> int:
        """Rows of input ``input_index`` held (not yet expired)."""
        return len(self._buffers[input_index])

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return self.process_input(0, batch)

    def _side(self, input_index: int) -> tuple[JoinBuffer, JoinBuffer]:
        if input_index not in (0, 1):
            raise InvalidArgumentError(
                f"{self.name} has two inputs (0: left, 1: right), got a batch of input "
                f"{input_index}"
            )
        own, other = self._buffers
        return (own, other) if input_index == 0 else (other, own)

    def _add(self, input_index: int, run: Run) -> None:
        """Buffer ``run`` on input ``input_index``'s side, writing rows ahead of the next
        checkpoint once enough arrived (``BufferCheckpoint.maybe_spill``)."""
        self._buffers[input_index].add(run)
        self._checkpoints[input_index].maybe_spill()

    def _emit(self, input_index: int, probe: Run, matches: Matches) -> list[pa.RecordBatch]:
        """What the pairs of ``probe`` (a run of input ``input_index``) and ``matches`` (rows
        of the other input) become."""
        if not len(matches):
            return []
        rows = probe.rows.take(pa.array(matches.probe))
        timed = self._time_fields()[0] is not None
        own_times = probe.times[matches.probe] if timed else None
        other_times = matches.times if timed else None
        if input_index == 0:
            return self.emitter.emit(rows, matches.rows, own_times, other_times)
        return self.emitter.emit(matches.rows, rows, other_times, own_times)

    def snapshot_state(self, checkpoint_id: int) -> None:
        for checkpoint in self._checkpoints:
            checkpoint.save()

    def close(self) -> None:
        self.emitter.close()

"""The regular (unbounded) keyed inner join, append-only, with an optional state TTL.

Every row of either input is kept (in a :class:`~snapflow.worker.api.join_buffer.JoinBuffer`)
and matched, in bulk, with every kept row of the other input that has its key; each pair is
emitted once, when its second row arrives. Without a TTL the state grows with the inputs.

``ttl_ms``: a row is kept ``ttl_ms`` of processing time after it arrived, then never matched
again (Flink's state TTL with ``OnCreateAndWrite`` and ``NeverReturnExpired``, per row; the
arrival times are part of the checkpoint, so the TTL runs on across restores). The clock is
the keyed backend's (``KeyedStateBackend.clock``, injectable in tests).

Only the inner join: Flink's regular outer joins emit a padded row and *retract* it when a
match arrives later; Snapflow's streams are append-only, so an outer join could not be exact
and is not offered.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.join_buffer import I64_MIN
from snapflow.worker.api.join_output import PairEmitter
from snapflow.worker.api.keyed_join import KeyedJoinOperator

__all__ = ["RegularJoinOperator"]


class RegularJoinOperator(KeyedJoinOperator):
    """The inner equi-join of input 0 (left) and input 1 (right) on their keys (module
    docstring)."""

    def __init__(
        self,
        left_key: str,
        right_key: str,
        *,
        ttl_ms: int | None = None,
        emitter: PairEmitter | None = None,
    ) -> None:
        super().__init__(left_key, right_key, emitter)
        if ttl_ms is not None and (
            not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or ttl_ms < 1
        ):
            raise InvalidArgumentError(f"ttl_ms must be an integer >= 1 or None, got {ttl_ms!r}")
        self.ttl_ms = ttl_ms

    @property
    def name(self) -> str:
        return "RegularJoin"

    def _with_stamps(self) -> bool:
        return self.ttl_ms is not None

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        own, other = self._side(input_index)
        if not batch.num_rows:
            return []
        batch = own.conform(batch)
        stamps: np.ndarray[Any, Any] | None = None
        if self.ttl_ms is not None:
            now = int(self._backend.clock())
            for buffer in self._buffers:
                buffer.expire(max(I64_MIN, now - self.ttl_ms))
            stamps = np.full(batch.num_rows, now, np.int64)
        run = own.sorted_run(batch, own.times_of(batch), stamps)
        out = self._emit(input_index, run, other.probe(run, own.key_field, None, None))
        self._add(input_index, run)
        return out

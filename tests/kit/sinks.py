"""Driving a sink operator by hand in unit tests: its context and small numbered batches."""

from __future__ import annotations

import pyarrow as pa

from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.backend import OperatorStateBackend


def sink_ctx(backend: OperatorStateBackend, restored: int = 0, attempt: int = 0) -> OperatorContext:
    """The context a task gives subtask 0 of a parallelism-1 sink (operator state in ``backend``)."""
    return OperatorContext(
        vertex_id="sink vertex",
        operator_id="out",
        subtask_index=0,
        parallelism=1,
        attempt=attempt,
        operator_state=backend,
        restored_checkpoint_id=restored,
    )


def kb(values: list[int]) -> pa.RecordBatch:
    """A batch of one int64 column ``v``."""
    return pa.RecordBatch.from_pydict({"v": pa.array(values, pa.int64())})

"""Driving a sink operator by hand in unit tests: its context, small numbered batches, its
checkpoints, crashes and restores, and the crash scenarios the exactly-once sink tests share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend


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


def checkpoint_sink(backend: OperatorStateBackend, sink: Any, cid: int, root: Path) -> list[Any]:
    """The barrier of checkpoint ``cid``: the sink's snapshot, then the operator state in
    ``backend`` written to local checkpoint storage under ``root`` (as the task does); returns
    the state handles."""
    sink.snapshot_state(cid)
    return backend.snapshot(cid).write(root / f"chk-{cid}")


def restore_sink(sink: Any, cid: int, handles: list[Any], attempt: int) -> Any:
    """A copy of ``sink`` as shipped to a new attempt (pickled, so without runtime state),
    opened on a backend restored from checkpoint ``cid``'s ``handles``."""
    backend = OperatorStateBackend()
    backend.restore({0: handles}, 0, 1)
    copy = cloudpickle.loads(cloudpickle.dumps(sink))
    copy.open(sink_ctx(backend, restored=cid, attempt=attempt))
    return copy


def crash_sink(sink: Any) -> None:
    """The process dies: its spooled files are closed, nothing is aborted (nor a Parquet footer
    written: the writers are marked closed so that their finalizers leave the files alone)."""
    for f, writer, _ in sink._writers.values():
        f.close()
        writer.is_open = False


def finish_sink(sink: Any, rows: list[int], cid: int, root: Path) -> None:
    """After a restore: ``rows`` written, checkpoint ``cid`` taken and completed, the sink
    closed."""
    sink.process_batch(kb(rows))
    checkpoint_sink(sink.ctx.operator_state, sink, cid, root)
    sink.notify_checkpoint_complete(cid)
    sink.close()


def crash_after_a_lost_notice(sink: Any, root: Path) -> list[Any]:
    """Opens ``sink`` and runs it to a crash: rows 1, 2 committed by checkpoint 1; rows 3, 4
    pre-committed by checkpoint 2, which completes but whose notice is lost; row 5 written
    after its barrier (the sources replay it). Returns checkpoint 2's state handles."""
    backend = OperatorStateBackend()
    sink.open(sink_ctx(backend))
    sink.process_batch(kb([1, 2]))
    checkpoint_sink(backend, sink, 1, root)
    sink.notify_checkpoint_complete(1)
    sink.process_batch(kb([3, 4]))
    handles = checkpoint_sink(backend, sink, 2, root)
    sink.process_batch(kb([5]))
    crash_sink(sink)
    return handles


def crash_before_a_completion(
    sink: Any, root: Path, after_barrier: list[int] | None = None
) -> list[Any]:
    """Opens ``sink`` and runs it to a crash: row 1 committed by checkpoint 1; row 2
    pre-committed by checkpoint 2, which never completes; then ``after_barrier`` rows, if any.
    Returns checkpoint 1's state handles."""
    backend = OperatorStateBackend()
    sink.open(sink_ctx(backend))
    sink.process_batch(kb([1]))
    handles = checkpoint_sink(backend, sink, 1, root)
    sink.notify_checkpoint_complete(1)
    sink.process_batch(kb([2]))
    checkpoint_sink(backend, sink, 2, root)
    if after_barrier:
        sink.process_batch(kb(after_barrier))
    crash_sink(sink)
    return handles

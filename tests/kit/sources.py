"""Driving a source operator by hand in unit tests: its context, and reading it to the end."""

from __future__ import annotations

from typing import Any

from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend


def src_ctx(
    index: int = 0,
    parallelism: int = 1,
    backend: OperatorStateBackend | None = None,
    restored: int = 0,
    *,
    vertex_id: str = "src",
    operator_id: str = "source",
) -> OperatorContext:
    """The context a task gives a source subtask (operator state restored into ``backend``)."""
    return OperatorContext(
        vertex_id=vertex_id,
        operator_id=operator_id,
        subtask_index=index,
        parallelism=parallelism,
        operator_state=backend or OperatorStateBackend(),
        restored_checkpoint_id=restored,
    )


def drain(source: Any, max_records: int = 1 << 30) -> list[dict[str, Any]]:
    """Every row the source emits until it ends (bounded sources)."""
    out: list[dict[str, Any]] = []
    while (b := source.poll_batch(max_records)) is not None:
        out.extend(b.to_pylist())
    return out

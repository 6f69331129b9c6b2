"""Operators the Spark benchmark ships to the executors (pickled by value: see spark_bench).

:class:`KillAfterCheckpoints` passes batches through; in one deployment attempt, in subtask 0,
once ``after_checkpoints`` checkpoints completed (``notify_checkpoint_complete``), it writes the
wall-clock time (``time.time_ns()``, the coordinator's clock too) to ``stamp_path`` and kills its
Python worker with ``os._exit(1)``, as a killed executor process would die.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa

from snapflow.worker.runtime.operator import Operator, OperatorContext


class KillAfterCheckpoints(Operator):
    _runtime_fields = ("_completed", "_last_completed")

    def __init__(self, stamp_path: str, after_checkpoints: int = 2, attempt: int = 1) -> None:
        self.stamp_path = stamp_path
        self.after_checkpoints = after_checkpoints
        self.attempt = attempt

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._completed = 0
        self._last_completed = 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._completed += 1
        self._last_completed = checkpoint_id

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        ctx = self._context()
        if (
            ctx.attempt == self.attempt
            and ctx.subtask_index == 0
            and self._completed >= self.after_checkpoints
        ):
            tmp = f"{self.stamp_path}.tmp"
            with open(tmp, "w") as f:
                f.write(
                    f"{time.time_ns()} {self._completed} {self._last_completed} {os.getpid()}\n"
                )
            os.replace(tmp, self.stamp_path)
            os._exit(1)
        return [batch] if batch.num_rows else []

"""Deterministic fault injection: an operator that fails its task at a chosen point.

For the demo, the benchmarks, the tests and chaos suites (in the spirit of bytewax's
deterministic failure injection): put :class:`FailAt` anywhere in a pipeline (typically chained
behind the source) and it fails one chosen subtask (or every subtask) at an exactly specified point.

Contract
--------
:class:`FailAt` passes every batch through unchanged until its trigger fires. The trigger is
checked on every batch, after counting it, and fires in the first batch for which *all* hold:

* the deployment attempt (``OperatorContext.attempt``; the first deployment is 1) is one of
  ``attempts``;
* the subtask index is ``subtask`` (``None``: every subtask);
* at least ``after_records`` records reached this operator since it was opened in this
  deployment (the batch that reaches the count fires; none of its records is emitted);
* at least ``after_checkpoints`` checkpoints completed (``notify_checkpoint_complete``) since it
  was opened in this deployment;
* at least ``after_s`` seconds passed since it was opened. This is the one wall-clock
  condition, for interactive runs (the demo); leave it 0 for a deterministic run;
* ``marker`` (when given) does not exist. Right before failing the operator writes it
  atomically and durably (a JSON object: :func:`read_marker`), so the fault happens once
  across processes and deployments, and the caller learns when and where it happened.

When it fires it fails the task one of two ways (``how``):

* ``"exit"``: ``os._exit(exit_code)``. The Python worker process dies at once with no clean-up
  and no error report, as a killed executor would;
* ``"raise"``: raises :class:`InjectedFailure` (``"injected failure in deployment <n> ..."``),
  which fails the task through the normal error path.

Given the same input (records and batch boundaries) and the same checkpoint notifications, the
same fault happens at the same point on every run: nothing is random at run time.
:meth:`FailAt.seeded` derives such a fault from a seed, reproducibly, for chaos suites.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any, Literal

import pyarrow as pa

from snapflow.durable_files import write_atomic
from snapflow.errors import InvalidArgumentError
from snapflow.worker.runtime.operator import Operator, OperatorContext

How = Literal["exit", "raise"]


class InjectedFailure(RuntimeError):
    """The failure :class:`FailAt` raises with ``how="raise"``."""


class FailAt(Operator):
    """Fails one subtask at a chosen point; see the module documentation for the contract."""

    _runtime_fields = ("_opened", "_records", "_checkpoints", "_last_checkpoint")

    def __init__(
        self,
        *,
        how: How = "raise",
        subtask: int | None = 0,
        attempts: tuple[int, ...] = (1,),
        after_records: int = 0,
        after_checkpoints: int = 0,
        after_s: float = 0.0,
        marker: str | None = None,
        exit_code: int = 1,
    ) -> None:
        if how not in ("exit", "raise"):
            raise InvalidArgumentError(f"how must be 'exit' or 'raise', got {how!r}")
        if min(subtask or 0, after_records, after_checkpoints) < 0 or after_s < 0:
            raise InvalidArgumentError("subtask, after_records, after_checkpoints, after_s: >= 0")
        self.how = how
        self.subtask = subtask
        self.attempts = tuple(attempts)
        self.after_records = after_records
        self.after_checkpoints = after_checkpoints
        self.after_s = after_s
        self.marker = marker
        self.exit_code = exit_code

    @classmethod
    def seeded(
        cls,
        seed: int,
        *,
        parallelism: int,
        max_records: int,
        max_checkpoints: int = 0,
        **options: Any,
    ) -> FailAt:
        """A fault at a point drawn from ``seed``: the same seed, the same fault. The subtask is
        in ``[0, parallelism)``, the record count in ``[0, max_records]``, the checkpoint count
        in ``[0, max_checkpoints]``; ``options`` are passed on (``how``, ``attempts``, ...)."""
        rng = random.Random(seed)
        return cls(
            subtask=rng.randrange(parallelism),
            after_records=rng.randint(0, max_records),
            after_checkpoints=rng.randint(0, max_checkpoints),
            **options,
        )

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._opened = time.monotonic()
        self._records = 0
        self._checkpoints = 0
        self._last_checkpoint = 0

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._checkpoints += 1
        self._last_checkpoint = checkpoint_id

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        self._records += batch.num_rows
        if self._due():
            self._fail()
        return [batch] if batch.num_rows else []

    def _due(self) -> bool:
        ctx = self._context()
        return (
            ctx.attempt in self.attempts
            and (self.subtask is None or ctx.subtask_index == self.subtask)
            and self._records >= self.after_records
            and self._checkpoints >= self.after_checkpoints
            and time.monotonic() - self._opened >= self.after_s
            and (self.marker is None or not os.path.exists(self.marker))
        )

    def _fail(self) -> None:
        ctx = self._context()
        if self.marker is not None:
            now_ns = time.time_ns()  # wall clock: comparable with the coordinator's timestamps
            record = {
                "at_ns": now_ns,
                "at_ms": now_ns // 1_000_000,
                "pid": os.getpid(),
                "vertex": ctx.vertex_id,
                "subtask": ctx.subtask_index,
                "attempt": ctx.attempt,
                "records_seen": self._records,
                "checkpoints_completed": self._checkpoints,
                "last_checkpoint_id": self._last_checkpoint,
                "how": self.how,
            }
            write_atomic(self.marker, (json.dumps(record) + "\n").encode())
        if self.how == "exit":
            os._exit(self.exit_code)
        raise InjectedFailure(
            f"injected failure in deployment {ctx.attempt}, subtask {ctx.subtask_index} of "
            f"{ctx.vertex_id!r}, after {self._records} records and {self._checkpoints} checkpoints"
        )


def read_marker(path: str) -> dict[str, Any] | None:
    """What :class:`FailAt` wrote to its marker when it fired; None if it has not fired."""
    try:
        with open(path) as f:
            record: dict[str, Any] = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record

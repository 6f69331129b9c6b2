"""The asynchronous savepoint requests of one job (Flink REST's savepoint trigger ids), pure.

``StartSavepoint`` returns a request id at once; ``GetSavepointOperation`` reports where the
request stands. The table lives in the coordinator's memory, bounded: at most ``capacity``
operations per job, the oldest *ended* one evicted first; when every slot holds a request still
in progress a new one is refused (``ResourceExhaustedError``), so polling clients never lose an
operation they could still be waiting for. A coordinator restart forgets the table (a
completed savepoint itself stays in Redis and in the checkpoint statistics).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

from snapflow.checkpointing import CheckpointKind, SavepointOperationStatus
from snapflow.coordinator.model import CompletedCheckpoint
from snapflow.errors import NotFoundError, ResourceExhaustedError

DEFAULT_CAPACITY = 64
"""Operations kept per job."""


@dataclass(frozen=True)
class SavepointOperation:
    """One asynchronous savepoint request."""

    request_id: str
    kind: CheckpointKind
    status: SavepointOperationStatus = SavepointOperationStatus.IN_PROGRESS
    savepoint: CompletedCheckpoint | None = None
    """COMPLETED: the savepoint."""
    failure: str = ""
    """FAILED: why (bounded by the caller)."""


class SavepointOperations:
    """A job's operations by request id, oldest first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ops: OrderedDict[str, SavepointOperation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ops)

    def start(self, request_id: str, kind: CheckpointKind) -> SavepointOperation:
        """Record a new request IN_PROGRESS, evicting the oldest ended one if full."""
        if request_id in self._ops:
            raise ValueError(f"request id {request_id} is already in use")
        if not kind.is_savepoint:
            raise ValueError(f"{kind.value} is not a savepoint")
        if len(self._ops) >= self.capacity:
            ended = next(
                (
                    rid
                    for rid, op in self._ops.items()
                    if op.status is not SavepointOperationStatus.IN_PROGRESS
                ),
                None,
            )
            if ended is None:
                raise ResourceExhaustedError(
                    f"{self.capacity} savepoint requests of this job are still in progress; "
                    f"wait for one to end (GetSavepointOperation) and try again"
                )
            del self._ops[ended]
        op = SavepointOperation(request_id, kind)
        self._ops[request_id] = op
        return op

    def completed(self, request_id: str, savepoint: CompletedCheckpoint) -> None:
        self._end(request_id, SavepointOperationStatus.COMPLETED, savepoint=savepoint)

    def failed(self, request_id: str, failure: str) -> None:
        self._end(request_id, SavepointOperationStatus.FAILED, failure=failure)

    def get(self, request_id: str) -> SavepointOperation:
        op = self._ops.get(request_id)
        if op is None:
            raise NotFoundError(
                f"no savepoint request {request_id[:64]!r} for this job (requests are kept in "
                f"the coordinator's memory, the last {self.capacity} per job, until it restarts)"
            )
        return op

    def _end(
        self,
        request_id: str,
        status: SavepointOperationStatus,
        *,
        savepoint: CompletedCheckpoint | None = None,
        failure: str = "",
    ) -> None:
        op = self._ops.get(request_id)
        if op is None or op.status is not SavepointOperationStatus.IN_PROGRESS:
            return  # evicted cannot happen while in progress; an end is reported once
        self._ops[request_id] = replace(op, status=status, savepoint=savepoint, failure=failure)

    def check_invariants(self) -> None:
        assert len(self._ops) <= self.capacity, "more operations than the capacity"
        for rid, op in self._ops.items():
            assert op.request_id == rid, "operation filed under another id"
            done = op.status is SavepointOperationStatus.COMPLETED
            assert done == (op.savepoint is not None), "a savepoint without COMPLETED"
            assert (op.status is SavepointOperationStatus.FAILED) or not op.failure

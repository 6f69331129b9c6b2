"""The ordered I/O of one job's checkpoints: typed operations, one queue, one task.

Redis writes, ``_metadata`` writes and storage clean-up go through this queue so that checkpoint
n is committed before n+1 and a checkpoint's pending record is in Redis before its trigger RPC
is sent. The outcome of an operation that the core waits for (an id, a commit) is reported back
through ``IoResults``, which turns it into an event of the core.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, assert_never

from snapflow.coordinator.checkpoint_coordinator import (
    CheckpointAborted,
    FinalizeCheckpoint,
    SendTrigger,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.model import CompletedCheckpoint, PendingCheckpointRecord
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.state_cleanup import StateCleanup
from snapflow.errors import StaleEpochError

# --- operations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocateId:
    """Allocate a checkpoint id (Redis INCR) and create the checkpoint's directory."""

    operation: ClassVar[str] = "allocate"
    request: TriggerRequest


@dataclass(frozen=True)
class StorePending:
    """Record a triggered checkpoint in Redis (enough to abort it after a crash)."""

    operation: ClassVar[str] = "add_pending"
    record: PendingCheckpointRecord


@dataclass(frozen=True)
class SendTriggerRpc:
    """Send the trigger RPCs; queued so the pending record is stored first."""

    operation: ClassVar[str] = "send_trigger"
    trigger: SendTrigger


@dataclass(frozen=True)
class Finalize:
    """Write ``_metadata`` and commit the completed checkpoint in Redis."""

    operation: ClassVar[str] = "finalize"
    finalize: FinalizeCheckpoint
    last_ack_at: float
    """``time.perf_counter()`` when the last ack arrived (for the completion latency)."""


@dataclass(frozen=True)
class CleanUpAborted:
    """Remove an aborted checkpoint's pending record, its unused state and its directory."""

    operation: ClassVar[str] = "cleanup_aborted"
    aborted: CheckpointAborted


@dataclass(frozen=True)
class DiscardFiles:
    """Discard state files nobody needs (late, duplicate or unknown acks)."""

    operation: ClassVar[str] = "discard"
    paths: tuple[str, ...]


@dataclass(frozen=True)
class DeleteRetired:
    """Delete the directories of checkpoints retention dropped (Redis already did)."""

    operation: ClassVar[str] = "delete_completed"
    checkpoint_ids: tuple[int, ...]
    checkpoints: tuple[CompletedCheckpoint, ...] = ()
    """The dropped checkpoints where known: on S3 their files are deleted by name, without
    reading their ``_metadata`` first (never a LIST either way)."""


IoOp = (
    AllocateId
    | StorePending
    | SendTriggerRpc
    | Finalize
    | CleanUpAborted
    | DiscardFiles
    | DeleteRetired
)


@dataclass(frozen=True)
class CommitTimings:
    """How long a completion took, in ms: ``_metadata`` write, Redis commit, and last ack to
    durable commit (including the wait in the queue)."""

    metadata_ms: float
    commit_ms: float
    completion_latency_ms: float


class IoResults(Protocol):
    """Where the executor reports outcomes and reads what it needs (the job runner)."""

    def checkpoint_id_allocated(
        self, request: TriggerRequest, checkpoint_id: int, location: str
    ) -> None: ...

    def checkpoint_id_failed(self, request: TriggerRequest, message: str) -> None: ...

    def checkpoint_committed(
        self, checkpoint: CompletedCheckpoint, dropped_ids: list[int], timings: CommitTimings
    ) -> None: ...

    def finalize_failed(self, checkpoint_id: int, message: str) -> None: ...

    def send_trigger(self, trigger: SendTrigger) -> None: ...

    def is_pending(self, checkpoint_id: int) -> bool: ...

    def snapshot_dirs(self) -> list[str]: ...

    def savepoint_dirs(self) -> list[str]: ...


class Fencing(Protocol):
    """The coordinator's fencing state (``JobManager``)."""

    fenced: bool

    def on_fenced(self, error: StaleEpochError) -> None: ...


class CheckpointIo:
    """Executes one job's I/O operations in order, one at a time."""

    def __init__(
        self,
        job_id: str,
        store: CheckpointStore,
        storage: CheckpointStorage,
        results: IoResults,
        fencing: Fencing,
        log: Any,
    ) -> None:
        self.job_id = job_id
        self.store = store
        self.storage = storage
        self.cleanup = StateCleanup(job_id, storage, log)
        self._results = results
        self._fencing = fencing
        self._log = log
        self._queue: asyncio.Queue[IoOp] = asyncio.Queue()

    def submit(self, op: IoOp) -> None:
        self._queue.put_nowait(op)

    async def join(self) -> None:
        """Wait until every submitted operation has run."""
        await self._queue.join()

    async def run(self) -> None:
        """Drain the queue forever (one task per job); a failed operation is logged."""
        while True:
            op = await self._queue.get()
            try:
                if not self._fencing.fenced:
                    await self.execute(op)
            except StaleEpochError as e:
                self._fencing.on_fenced(e)
            except Exception as e:
                self._log.exception("coordinator.io_failed", operation=op.operation, error=str(e))
            finally:
                self._queue.task_done()

    async def execute(self, op: IoOp) -> None:
        match op:
            case AllocateId(request=request):
                await self._allocate(request)
            case StorePending(record=record):
                await self.store.add_pending(record)
            case SendTriggerRpc(trigger=trigger):
                self._results.send_trigger(trigger)
            case Finalize():
                await self._finalize(op)
            case CleanUpAborted(aborted=aborted):
                await self.store.remove_pending(self.job_id, aborted.checkpoint_id)
                snapshot_dirs = self._results.snapshot_dirs()
                await asyncio.to_thread(self.cleanup.clean_up_aborted, aborted, snapshot_dirs)
            case DiscardFiles(paths=paths):
                snapshot_dirs = self._results.snapshot_dirs()
                allowed = self._results.savepoint_dirs()
                await asyncio.to_thread(self.cleanup.discard, paths, snapshot_dirs, allowed)
            case DeleteRetired(checkpoint_ids=checkpoint_ids, checkpoints=checkpoints):
                known = {c.checkpoint_id: c for c in checkpoints}
                for checkpoint_id in checkpoint_ids:
                    await asyncio.to_thread(
                        self.storage.delete_checkpoint,
                        self.job_id,
                        checkpoint_id,
                        known.get(checkpoint_id),
                    )
                    self._log.info(
                        "checkpoint.deleted", checkpoint_id=checkpoint_id, reason="retention"
                    )
            case _:
                assert_never(op)

    def location(self, request: TriggerRequest, checkpoint_id: int) -> str:
        """The directory of the checkpoint or savepoint this request triggers."""
        if request.kind.is_savepoint:
            target = request.target_directory.removeprefix("file://")
            return self.storage.savepoint_dir(target, self.job_id, checkpoint_id)
        return self.storage.checkpoint_dir(self.job_id, checkpoint_id)

    async def _allocate(self, request: TriggerRequest) -> None:
        try:
            checkpoint_id = await self.store.next_checkpoint_id(self.job_id)
            location = self.location(request, checkpoint_id)
            await asyncio.to_thread(self.storage.ensure_directory, location)
        except Exception as e:
            if isinstance(e, StaleEpochError):
                self._fencing.on_fenced(e)  # first: being fenced is no checkpoint failure
            self._results.checkpoint_id_failed(request, f"could not start the checkpoint: {e}")
            return
        self._results.checkpoint_id_allocated(request, checkpoint_id, location)

    async def _finalize(self, op: Finalize) -> None:
        cp = op.finalize.checkpoint
        if not self._results.is_pending(cp.checkpoint_id):
            return  # aborted while it waited in the queue
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.storage.write_metadata, cp.external_path, cp)
            written = time.perf_counter()
            dropped_ids = await self.store.commit_completed(cp, op.finalize.retained)
        except StaleEpochError:
            raise
        except Exception as e:
            self._results.finalize_failed(cp.checkpoint_id, f"finalize failed: {e}")
            return
        committed = time.perf_counter()
        timings = CommitTimings(
            metadata_ms=round((written - started) * 1000, 2),
            commit_ms=round((committed - written) * 1000, 2),
            completion_latency_ms=(committed - op.last_ack_at) * 1000.0,
        )
        self._results.checkpoint_committed(cp, dropped_ids, timings)

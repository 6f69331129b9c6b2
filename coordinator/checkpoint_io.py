"""The ordered I/O of one job's checkpoints: typed operations, one queue, one task.

Redis writes, ``_metadata`` writes and storage clean-up go through this queue so that checkpoint
n is committed before n+1. A checkpoint's pending record is written as part of its preparation
(``AllocateId``), before the core learns the id: a record that cannot be written fails the
preparation (``IO_EXCEPTION``, counted), so no trigger RPC is ever sent for a checkpoint Redis
does not know. The outcome of an operation that the core waits for (an id, a commit) is reported back
through ``IoResults``, which turns it into an event of the core.

Every deletion in checkpoint storage is fenced: it is planned (``StateCleanup.plan``), then
claimed in Redis (``CheckpointStore.claim_deletions``: still the current epoch, not retained in
Redis), and only then executed. A clean-up that cannot run (Redis or storage unavailable, a
late writer) is left to the orphan sweep, which runs at start, periodically and soon after such
a failure, bounded in count and time per run. A user's savepoint disposal is queued here too
(``DisposeSavepoint``); a savepoint of a job this coordinator does not host has no queue and
goes through :func:`dispose_savepoint` directly, with the same fenced claim first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, assert_never

from snapflow.coordinator.checkpoint_coordinator import (
    CheckpointAborted,
    FinalizeCheckpoint,
    SendTrigger,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.confinement import location_key
from snapflow.coordinator.model import CompletedCheckpoint, PendingCheckpointRecord
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.shared_state import creator_id, shared_paths
from snapflow.coordinator.state_cleanup import StateCleanup
from snapflow.errors import (
    FailedPreconditionError,
    SnapflowError,
    StaleEpochError,
    UnavailableError,
)

SWEEP_BUDGET_S = 5.0
"""Longest one orphan sweep run keeps deleting (the rest waits for the next run)."""
_SWEEP_CHUNK = 16
"""Ids claimed in Redis per script call during a sweep."""
_FENCED = "this coordinator was superseded by a newer incarnation: it deletes nothing"
_STOPPED = "the job's I/O queue stopped (the job is being resubmitted or the coordinator stops)"

# --- operations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AllocateId:
    """Prepare a checkpoint: allocate its id (Redis INCR), create its directory and record it
    as pending in Redis. Any of the three failing fails the preparation."""

    operation: ClassVar[str] = "allocate"
    request: TriggerRequest


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


@dataclass(frozen=True)
class DeleteUnused:
    """Delete the directory of a checkpoint id that was allocated but never triggered (the
    request was refused after the allocation, or its preparation had expired)."""

    operation: ClassVar[str] = "delete_unused"
    checkpoint_id: int
    location: str
    is_savepoint: bool


@dataclass(frozen=True)
class DisposeSavepoint:
    """Dispose a savepoint of this job that a user named (its ``_metadata`` read and checked by
    the caller): see :func:`dispose_savepoint`. ``done`` gets the outcome; the caller waits."""

    operation: ClassVar[str] = "dispose_savepoint"
    savepoint: CompletedCheckpoint
    path: str
    done: asyncio.Future[None]


@dataclass(frozen=True)
class SweepOrphans:
    """Delete what ended checkpoints left behind (bounded; see ``CheckpointIo.sweep``)."""

    operation: ClassVar[str] = "sweep_orphans"
    max_deletes: int


IoOp = (
    AllocateId
    | SendTriggerRpc
    | Finalize
    | CleanUpAborted
    | DiscardFiles
    | DeleteRetired
    | DeleteUnused
    | DisposeSavepoint
    | SweepOrphans
)
_CLEANUPS = (CleanUpAborted, DiscardFiles, DeleteRetired, DeleteUnused, SweepOrphans)


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

    def savepoint_ids(self) -> dict[str, int]:
        """Directory -> id of the pending and recorded savepoints."""
        ...

    def busy_ids(self) -> set[int]:
        """Ids of the retained snapshots and pending checkpoints (never swept)."""
        ...

    def highest_known_id(self) -> int:
        """The highest checkpoint id this incarnation allocated or found at recovery."""
        ...

    def request_sweep(self) -> None:
        """A clean-up could not run: sweep again soon."""
        ...

    def savepoint_disposed(self, checkpoint_id: int) -> None:
        """Redis forgot the savepoint and its files are about to go: the core forgets it."""
        ...


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
        clock: Callable[[], int] | None = None,
    ) -> None:
        """``clock``: epoch milliseconds for the pending records (default: wall clock)."""
        self.job_id = job_id
        self.store = store
        self.storage = storage
        self.cleanup = StateCleanup(job_id, storage, log)
        self._results = results
        self._fencing = fencing
        self._log = log
        self._queue: asyncio.Queue[IoOp] = asyncio.Queue()
        self._shared_reset = False  # the shared-file references were rebuilt (first sweep)
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._highest_burnt = 0
        """The highest id allocated whose preparation failed (the core never saw it): the
        sweep may remove what it left if its own clean-up could not run."""
        self._stopped = False
        """``stop`` was called: a waiting operation is refused, never lost."""

    def submit(self, op: IoOp) -> None:
        if self._stopped:
            _settle(op, UnavailableError(_STOPPED))
            return
        self._queue.put_nowait(op)

    async def join(self) -> None:
        """Wait until every submitted operation has run."""
        await self._queue.join()

    async def run(self) -> None:
        """Drain the queue forever (one task per job); a failed operation is logged. Nothing
        runs once this coordinator is fenced; an operation with a waiting caller is then refused
        with ``StaleEpochError``, and when the loop ends (cancelled), with ``UnavailableError``."""
        try:
            while True:
                op = await self._queue.get()
                try:
                    if not self._fencing.fenced:
                        await self.execute(op)
                    else:
                        _settle(op, StaleEpochError(_FENCED))
                except StaleEpochError as e:
                    self._fencing.on_fenced(e)
                except Exception as e:
                    if isinstance(op, _CLEANUPS) and isinstance(e, SnapflowError | OSError):
                        # Redis or storage unavailable, or a late writer: the sweep finishes it.
                        self._log.warning(
                            "storage.cleanup_deferred", operation=op.operation, error=str(e)[:300]
                        )
                        self._results.request_sweep()
                    else:
                        self._log.exception(
                            "coordinator.io_failed", operation=op.operation, error=str(e)
                        )
                finally:
                    _settle(op, UnavailableError(_STOPPED))  # only if it is still waiting
                    self._queue.task_done()
        finally:
            self.stop()

    def stop(self) -> None:
        """No operation runs any more (``run`` ended, or the runner closed before it started):
        every waiting caller, queued or submitted later, is refused, never left waiting."""
        self._stopped = True
        while not self._queue.empty():
            _settle(self._queue.get_nowait(), UnavailableError(_STOPPED))
            self._queue.task_done()

    async def execute(self, op: IoOp) -> None:
        match op:
            case AllocateId(request=request):
                await self._allocate(request)
            case SendTriggerRpc(trigger=trigger):
                self._results.send_trigger(trigger)
            case Finalize():
                await self._finalize(op)
            case CleanUpAborted(aborted=aborted):
                await self._clean_up_aborted(aborted)
            case DiscardFiles(paths=paths):
                await self.discard(paths)
            case DeleteRetired(checkpoint_ids=checkpoint_ids, checkpoints=checkpoints):
                # No claim here: the fenced commit that dropped these ids was the claim (it
                # compared the epoch, and Redis retains none of them since). One round trip
                # less per checkpoint; docs/coordinator.md, "Fencing of storage".
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
                # A checkpoint known to name no shared file registered none (``register``
                # returns before Redis): nothing to release, one round trip less per checkpoint.
                await self._release_shared(
                    [i for i in checkpoint_ids if i not in known or shared_paths(known[i])[0]]
                )
            case DeleteUnused(checkpoint_id=checkpoint_id, location=location):
                allowed = await self.store.claim_deletions(
                    self.job_id, [checkpoint_id], decided=True
                )
                # On S3 nothing was written for it (no trigger was sent; a prefix needs nothing
                # created), so nothing is listed either.
                if allowed and not self.storage.is_object_store:
                    await asyncio.to_thread(
                        self.cleanup.delete_ended, checkpoint_id, location, op.is_savepoint
                    )
            case DisposeSavepoint(savepoint=savepoint, path=path, done=done):
                if done.done():
                    return  # the caller gave up (cancelled) before it ran: nothing was done
                try:
                    await dispose_savepoint(
                        self.store, self.storage, savepoint, path, self._results.savepoint_disposed
                    )
                except StaleEpochError as e:
                    _settle(op, e)
                    raise  # run() marks this coordinator fenced
                except Exception as e:
                    _settle(op, e)  # the caller's error, not the executor's
                else:
                    if not done.done():
                        done.set_result(None)
            case SweepOrphans(max_deletes=max_deletes):
                await self.sweep(max_deletes)
            case _:
                assert_never(op)

    # --- fenced deletions ----------------------------------------------------------------------

    async def discard(
        self, paths: tuple[str, ...] | list[str], extra: dict[str, int] | None = None
    ) -> int:
        """Discard state files nobody needs: planned (layer 2), claimed in Redis without
        touching pending records (layer 3), then deleted (layer 4). ``extra``: savepoint
        directories (-> id) the core no longer lists, such as an aborted one's."""
        savepoint_ids = {**self._results.savepoint_ids(), **(extra or {})}
        plan = self.cleanup.plan(
            list(paths),
            self._results.snapshot_dirs(),
            savepoint_ids,
            self._results.highest_known_id(),
        )
        if not plan:
            return 0
        allowed = await self.store.claim_deletions(self.job_id, sorted(plan), decided=False)
        keep = [p for owner, owned in plan.items() if owner not in allowed for p in owned]
        for path in keep:
            self._log.warning(
                "checkpoint.discard_refused", path=path, why="Redis records its snapshot"
            )
        go = [p for owner, owned in plan.items() if owner in allowed for p in owned]
        dirs = [*self._results.savepoint_dirs(), *(extra or {})]
        return await asyncio.to_thread(self.cleanup.discard, go, dirs)

    async def _clean_up_aborted(self, aborted: CheckpointAborted) -> None:
        """The aborted checkpoint's pending record and directory (a savepoint's only without
        ``_metadata``) go together after one fenced claim; acknowledged files elsewhere are
        discarded like any others. On S3 the aborted checkpoint's prefix is not listed (aborts
        are on the checkpoint path): its acknowledged files go by name, and files of tasks that
        never acknowledged go with the next sweep."""
        checkpoint_id = aborted.checkpoint_id
        is_savepoint = aborted.request.kind.is_savepoint
        allowed = await self.store.claim_deletions(self.job_id, [checkpoint_id], decided=True)
        if checkpoint_id not in allowed:
            self._log.warning(
                "checkpoint.delete_refused",
                checkpoint_id=checkpoint_id,
                why="Redis records it as completed",
            )
            return
        extra = {aborted.external_path: checkpoint_id} if is_savepoint else {}
        whole_dir = is_savepoint or not self.storage.is_object_store
        owned_by_others = [
            p
            for p in aborted.discarded_paths
            if not whole_dir or self.cleanup.owner(p, extra) != checkpoint_id
        ]
        await self.discard(owned_by_others, extra)
        if whole_dir:
            await asyncio.to_thread(
                self.cleanup.delete_ended, checkpoint_id, aborted.external_path, is_savepoint
            )

    async def sweep(self, max_deletes: int) -> list[int]:
        """The orphan sweep: delete the directories (and stale pending records) of checkpoints
        that ended without completing, at most ``max_deletes`` ids and ``SWEEP_BUDGET_S`` per
        run, oldest first; returns the ids swept. Only ids up to the highest this incarnation
        knows are considered, never a retained or pending one, and each chunk is claimed in
        Redis first (fenced). On S3 one LIST of the job's prefix, plus one per swept id."""
        highest = max(self._results.highest_known_id(), self._highest_burnt)
        busy = self._results.busy_ids()
        present = set(await asyncio.to_thread(self.storage.list_checkpoint_ids, self.job_id))
        stale = {
            r.checkpoint_id: r
            for r in await self.store.list_pending(self.job_id)
            if r.checkpoint_id <= highest and r.checkpoint_id not in busy
        }
        dirs = {i for i in present if i <= highest and i not in busy}
        # Stale pending records first (few: at most max_concurrent per incarnation).
        candidates = [*sorted(stale), *sorted(dirs - set(stale))][:max_deletes]
        deadline = time.monotonic() + SWEEP_BUDGET_S
        swept: list[int] = []
        for start in range(0, len(candidates), _SWEEP_CHUNK):
            if time.monotonic() > deadline:
                break
            chunk = candidates[start : start + _SWEEP_CHUNK]
            allowed = await self.store.claim_deletions(self.job_id, chunk, decided=True)
            for checkpoint_id in chunk:
                if checkpoint_id not in allowed:
                    continue
                record = stale.get(checkpoint_id)
                if record is not None and record.kind.is_savepoint:
                    await asyncio.to_thread(
                        self.cleanup.delete_ended, checkpoint_id, record.external_path, True
                    )
                if checkpoint_id in present:
                    await asyncio.to_thread(
                        self.storage.delete_checkpoint_dir, self.job_id, checkpoint_id
                    )
                swept.append(checkpoint_id)
        if swept:
            self._log.info("storage.orphans_deleted", checkpoint_ids=swept)
        await self._sweep_shared(highest, busy)
        return swept

    async def _release_shared(self, checkpoint_ids: list[int]) -> None:
        """Drop the retired checkpoints' references to shared files; delete the files no
        retained checkpoint references any more (fenced, as every deletion)."""
        gone = await self.store.shared_state.release(self.job_id, checkpoint_ids)
        if gone:
            deleted = await self.discard(gone)
            self._log.info("checkpoint.shared_state_deleted", files=deleted)

    async def _sweep_shared(self, highest: int, busy: set[int]) -> int:
        """Shared files nothing references whose uploading checkpoint has ended (never one of
        a pending checkpoint, whose files are not registered yet). The first sweep of this
        incarnation rebuilds the references from the retained checkpoints first."""
        if not self._shared_reset:
            completed = await self.store.list_completed(self.job_id)
            await self.store.shared_state.reset(self.job_id, completed)
            self._shared_reset = True
        listed = await asyncio.to_thread(self.storage.list_shared, self.job_id)
        if not listed:
            return 0
        referenced = {
            location_key(p) for p in await self.store.shared_state.referenced(self.job_id)
        }
        orphans = [
            path
            for path in listed
            if location_key(path) not in referenced
            and (creator := creator_id(path)) is not None
            and creator <= highest
            and creator not in busy
        ]
        if not orphans:
            return 0
        deleted = await self.discard(orphans)
        self._log.info("storage.shared_orphans_deleted", files=deleted)
        return deleted

    def location(self, request: TriggerRequest, checkpoint_id: int) -> str:
        """The directory of the checkpoint or savepoint this request triggers."""
        if request.kind.is_savepoint:
            target = request.target_directory.removeprefix("file://")
            return self.storage.savepoint_dir(target, self.job_id, checkpoint_id)
        return self.storage.checkpoint_dir(self.job_id, checkpoint_id)

    async def _allocate(self, request: TriggerRequest) -> None:
        checkpoint_id = 0
        location = ""
        try:
            checkpoint_id = await self.store.next_checkpoint_id(self.job_id)
            location = self.location(request, checkpoint_id)
            if request.kind.is_savepoint:
                # The user's target: a directory that cannot be created fails the request now.
                # A checkpoint's ``chk-<id>`` is made by its first writer (a task's state file
                # or the ``_metadata``): one thread hop less per checkpoint.
                await asyncio.to_thread(self.storage.ensure_directory, location)
            # The record goes before the core knows the id, so before any trigger RPC: a
            # checkpoint Redis does not know is never started (a crash could not abort it).
            record = PendingCheckpointRecord(
                self.job_id, checkpoint_id, request.kind, self._clock(), location
            )
            await self.store.add_pending(record)
        except Exception as e:
            if isinstance(e, StaleEpochError):
                self._fencing.on_fenced(e)  # first: being fenced is no checkpoint failure
            self._results.checkpoint_id_failed(request, f"could not start the checkpoint: {e}")
            if location and not self._fencing.fenced:
                # The id is burnt: its directory (and a record whose reply was lost) go now,
                # fenced, or with a later sweep if Redis is still unavailable.
                self._highest_burnt = max(self._highest_burnt, checkpoint_id)
                self.submit(DeleteUnused(checkpoint_id, location, request.kind.is_savepoint))
            return
        self._results.checkpoint_id_allocated(request, checkpoint_id, location)

    async def _finalize(self, op: Finalize) -> None:
        cp = op.finalize.checkpoint
        if not self._results.is_pending(cp.checkpoint_id):
            return  # aborted while it waited in the queue
        started = time.perf_counter()
        registered = False
        try:
            # Shared files are counted before the commit: a crash in between leaves references
            # the next incarnation rebuilds, never a retained checkpoint whose files are not.
            registered = bool(await self.store.shared_state.register(cp))
            await asyncio.to_thread(self.storage.write_metadata, cp.external_path, cp)
            written = time.perf_counter()
            dropped_ids = await self.store.commit_completed(cp, op.finalize.retained)
        except StaleEpochError:
            raise
        except Exception as e:
            if registered:  # its own new files go with the aborted checkpoint's discard
                with contextlib.suppress(SnapflowError):
                    await self.store.shared_state.release(self.job_id, [cp.checkpoint_id])
            self._results.finalize_failed(cp.checkpoint_id, f"finalize failed: {e}")
            return
        committed = time.perf_counter()
        timings = CommitTimings(
            metadata_ms=round((written - started) * 1000, 2),
            commit_ms=round((committed - written) * 1000, 2),
            completion_latency_ms=(committed - op.last_ack_at) * 1000.0,
        )
        self._results.checkpoint_committed(cp, dropped_ids, timings)


# --- savepoint disposal --------------------------------------------------------------------


async def dispose_savepoint(
    store: CheckpointStore,
    storage: CheckpointStorage,
    savepoint: CompletedCheckpoint,
    path: str,
    forget: Callable[[int], None] | None = None,
) -> None:
    """Dispose the savepoint at ``path`` (its ``_metadata`` is ``savepoint``), fenced as every
    deletion: Redis forgets its record (a fenced script), the id is claimed
    (``claim_deletions``: still the current epoch, not retained), ``forget`` tells the job's
    core, and only then the directory is deleted. A superseded coordinator fails at the first
    step (``StaleEpochError``) and deletes nothing. A deletion that fails after the record went
    can be repeated by path."""
    job_id, checkpoint_id = savepoint.job_id, savepoint.checkpoint_id
    await store.remove_savepoint(job_id, checkpoint_id)
    if checkpoint_id not in await store.claim_deletions(job_id, [checkpoint_id], decided=False):
        raise FailedPreconditionError(
            f"Redis records checkpoint {checkpoint_id} of job {job_id} as retained: "
            f"{path} is not disposed"
        )
    if forget is not None:
        forget(checkpoint_id)
    await asyncio.to_thread(storage.dispose_savepoint, path)


def _settle(op: IoOp, error: Exception) -> None:
    """Fail the waiting caller of ``op`` with ``error``, unless it has its answer already."""
    if isinstance(op, DisposeSavepoint) and not op.done.done():
        op.done.set_exception(error)

"""The job runner and the pieces of its shell: the typed I/O executor (``CheckpointIo``, with the
real Redis of the ``redis_url`` fixture and real files), storage clean-up, watch streams, the RPC
gateway to agents (against a real gRPC server), and ``JobRunner`` itself on a real
``JobManager`` with a recording gateway: registration, trigger, acks, completion notices,
declines, heartbeat timeouts and restarts, as exact sequences of the RPCs it sends.

There is no pytest-asyncio: every test body runs in ``asyncio.run``. Nothing sleeps: each test
waits for the executor's queue (``join``), the gateway's calls (``drain``) or polls a condition
(``kit.polling``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import structlog
from kit.coordinator import two_vertex_graph
from kit.polling import wait_until_async

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator import convert
from snapflow.coordinator.agent_gateway import AgentClients, ByAddress, TriggerFailed
from snapflow.coordinator.checkpoint_coordinator import (
    BarrierOptions,
    CheckpointAborted,
    DeclineReason,
    FinalizeCheckpoint,
    SendTrigger,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_io import (
    AllocateId,
    CheckpointIo,
    CleanUpAborted,
    CommitTimings,
    DeleteRetired,
    DiscardFiles,
    DisposeSavepoint,
    Finalize,
    SendTriggerRpc,
)
from snapflow.coordinator.checkpoint_storage import CheckpointStorage
from snapflow.coordinator.embedded import local_settings
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.job_runner import JobRunner
from snapflow.coordinator.metrics import CoordinatorMetrics
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    CheckpointKind,
    CheckpointMode,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobGraph,
    JobRecord,
    JobState,
    JobVertex,
    OperatorSubtaskState,
    PendingCheckpointRecord,
    StateHandle,
    SubtaskAck,
    SubtaskMetrics,
    TaskKey,
)
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.restore_point import RestorePoint
from snapflow.coordinator.watch import WATCH_QUEUE_BOUND, JobWatch
from snapflow.errors import CheckpointFailedError, StaleEpochError, UnavailableError
from snapflow.jobgraph import TaskState
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")
JOB = "0123456789abcdef0123456789abcdef"
SRC = ExecutionAttempt("src", 0, 1)
GRAPH = JobGraph("g", (JobVertex("src", "source", 1, is_source=True),), ())
LOG = structlog.get_logger("test")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Results:
    """Records what the executor reports (the job runner's role in production)."""

    def __init__(self, snapshot_dirs: list[str] | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.pending: set[int] = set()
        self.highest_id = 1000
        self._snapshot_dirs = snapshot_dirs or []

    def checkpoint_id_allocated(
        self, request: TriggerRequest, checkpoint_id: int, location: str
    ) -> None:
        self.events.append(("allocated", request.request_id, checkpoint_id, location))

    def checkpoint_id_failed(self, request: TriggerRequest, message: str) -> None:
        self.events.append(("allocation_failed", request.request_id, message))

    def checkpoint_committed(
        self, checkpoint: CompletedCheckpoint, dropped_ids: list[int], timings: CommitTimings
    ) -> None:
        assert timings.metadata_ms >= 0 and timings.commit_ms >= 0
        self.events.append(("committed", checkpoint.checkpoint_id, dropped_ids))

    def finalize_failed(self, checkpoint_id: int, message: str) -> None:
        self.events.append(("finalize_failed", checkpoint_id, message))

    def send_trigger(self, trigger: SendTrigger) -> None:
        self.events.append(("send_trigger", trigger.checkpoint_id))

    def is_pending(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self.pending

    def snapshot_dirs(self) -> list[str]:
        return list(self._snapshot_dirs)

    def savepoint_dirs(self) -> list[str]:
        return []

    def savepoint_ids(self) -> dict[str, int]:
        return {}

    def busy_ids(self) -> set[int]:
        return set(self.pending)

    def highest_known_id(self) -> int:
        return self.highest_id

    def request_sweep(self) -> None:
        self.events.append(("sweep_requested",))

    def savepoint_disposed(self, checkpoint_id: int) -> None:
        self.events.append(("savepoint_disposed", checkpoint_id))


class Fencing:
    def __init__(self) -> None:
        self.fenced = False
        self.errors: list[StaleEpochError] = []

    def on_fenced(self, error: StaleEpochError) -> None:
        self.fenced = True
        self.errors.append(error)


class Setup:
    def __init__(self, redis_url: str, root: Path, snapshot_dirs: list[str] | None = None):
        self.store = CheckpointStore.from_url(redis_url)
        self.storage = CheckpointStorage(str(root))
        self.results = Results(snapshot_dirs)
        self.fencing = Fencing()
        self.io = CheckpointIo(JOB, self.store, self.storage, self.results, self.fencing, LOG)

    async def __aenter__(self) -> Setup:
        await self.store.acquire_epoch()
        record = JobRecord(JOB, GRAPH, CheckpointConfig(), JobState.RUNNING, created_at_ms=1)
        await self.store.create_job(record)
        self._loop = asyncio.create_task(self.io.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._loop.cancel()
        await asyncio.gather(self._loop, return_exceptions=True)
        await self.store.close()

    async def execute(self, *ops: Any) -> list[tuple[Any, ...]]:
        for op in ops:
            self.io.submit(op)
        await self.io.join()
        return list(self.results.events)


def checkpoint(storage: CheckpointStorage, checkpoint_id: int, *files: str) -> CompletedCheckpoint:
    directory = storage.checkpoint_dir(JOB, checkpoint_id)
    handles = tuple(StateHandle(os.path.join(directory, f), 1) for f in files)
    ack = SubtaskAck(SRC, 5, (OperatorSubtaskState("op", handles),), SubtaskMetrics())
    return CompletedCheckpoint(
        JOB, checkpoint_id, CheckpointKind.CHECKPOINT, 1, 5, directory, (ack,)
    )


def write(path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_text("state")
    return path


# --- CheckpointIo ---------------------------------------------------------------------------


def test_allocate_store_trigger_finalize_in_order(redis_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            request = TriggerRequest(1, CheckpointKind.CHECKPOINT)
            chk1 = s.storage.checkpoint_dir(JOB, 1)
            assert await s.execute(AllocateId(request)) == [("allocated", 1, 1, chk1)]
            # A checkpoint's directory is made by its first writer (here the ``_metadata``).
            assert not os.path.exists(chk1)
            # The pending record is written while the id is prepared, before any trigger.
            assert [
                (p.checkpoint_id, p.external_path) for p in await s.store.list_pending(JOB)
            ] == [(1, chk1)]
            options = BarrierOptions(CheckpointKind.CHECKPOINT, CheckpointMode.ALIGNED, 0, chk1)
            cp1 = checkpoint(s.storage, 1, "a")
            s.results.pending = {1}
            events = await s.execute(
                SendTriggerRpc(SendTrigger(1, 1, options, (SRC,))),
                Finalize(FinalizeCheckpoint(cp1, retained=1), last_ack_at=0.0),
            )
            assert events[1:] == [("send_trigger", 1), ("committed", 1, [])]
            assert await s.store.list_pending(JOB) == []
            assert [c.checkpoint_id for c in await s.store.list_completed(JOB)] == [1]
            assert s.storage.read_metadata(chk1) == cp1
            # Retention 1: committing checkpoint 2 drops 1; its directory goes on DeleteRetired.
            assert await s.execute(AllocateId(TriggerRequest(2, CheckpointKind.CHECKPOINT))) == [
                *events,
                ("allocated", 2, 2, s.storage.checkpoint_dir(JOB, 2)),
            ]
            s.results.pending = {2}
            cp2 = checkpoint(s.storage, 2)
            assert [p.checkpoint_id for p in await s.store.list_pending(JOB)] == [2]
            events = await s.execute(
                Finalize(FinalizeCheckpoint(cp2, retained=1), last_ack_at=0.0),
                DeleteRetired((1,)),
            )
            assert events[-1] == ("committed", 2, [1])
            assert not os.path.exists(chk1)
            assert [c.checkpoint_id for c in await s.store.list_completed(JOB)] == [2]

    run(body())


def test_finalize_of_a_checkpoint_no_longer_pending_writes_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            cp = checkpoint(s.storage, 3)
            assert await s.execute(Finalize(FinalizeCheckpoint(cp, 1), last_ack_at=0.0)) == []
            assert not os.path.exists(os.path.join(cp.external_path, "_metadata"))
            assert await s.store.list_completed(JOB) == []

    run(body())


def test_a_failed_finalize_and_a_failed_allocation_are_reported(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            blocker = write(str(tmp_path / "not-a-directory"))
            request = TriggerRequest(4, CheckpointKind.SAVEPOINT, target_directory=blocker)
            s.results.pending = {9}
            # _metadata cannot be written below a regular file.
            cp = replace(checkpoint(s.storage, 9), external_path=os.path.join(blocker, "chk-9"))
            events = await s.execute(
                AllocateId(request), Finalize(FinalizeCheckpoint(cp, 1), last_ack_at=0.0)
            )
            assert [e[:2] for e in events] == [("allocation_failed", 4), ("finalize_failed", 9)]
            assert events[0][2].startswith("could not start the checkpoint: ")
            assert events[1][2].startswith("finalize failed: ")

    run(body())


def test_clean_up_keeps_what_a_retained_snapshot_needs(redis_url: str, tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    retained = storage.checkpoint_dir(JOB, 1)

    async def body() -> None:
        async with Setup(redis_url, tmp_path, snapshot_dirs=[retained]) as s:
            kept = write(os.path.join(retained, "state"))
            shared = write(os.path.join(storage.job_dir(JOB), "shared", "x"))
            chk2 = storage.checkpoint_dir(JOB, 2)
            late = write(os.path.join(chk2, "late"))
            await s.store.add_pending(
                PendingCheckpointRecord(JOB, 2, CheckpointKind.CHECKPOINT, 1, chk2)
            )
            aborted = CheckpointAborted(
                2,
                TriggerRequest(1, CheckpointKind.CHECKPOINT),
                AbortReason.EXPIRED,
                "expired",
                5,
                1,
                chk2,
                (late, os.path.join(retained, ".", "state")),
            )
            await s.execute(CleanUpAborted(aborted), DiscardFiles((shared, kept)))
            assert await s.store.list_pending(JOB) == []
            assert not os.path.exists(chk2)
            assert not os.path.exists(shared)
            assert os.path.exists(kept)

    run(body())


def test_a_superseded_coordinator_stops_executing(redis_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            newer = CheckpointStore.from_url(redis_url)
            await newer.acquire_epoch()
            await newer.close()
            request = TriggerRequest(1, CheckpointKind.CHECKPOINT)
            events = await s.execute(AllocateId(request), AllocateId(request))
            # The first allocation fails fenced and is reported; the second never runs.
            assert [e[:2] for e in events] == [("allocation_failed", 1)]
            assert s.fencing.fenced and len(s.fencing.errors) == 1

    run(body())


def savepoint(
    storage: CheckpointStorage, directory: Path, checkpoint_id: int
) -> CompletedCheckpoint:
    """A savepoint with one state file and its ``_metadata`` in ``directory``."""
    handle = StateHandle(write(str(directory / "src-0.state")), 5)
    ack = SubtaskAck(SRC, 5, (OperatorSubtaskState("op", (handle,)),), SubtaskMetrics())
    sp = CompletedCheckpoint(
        JOB, checkpoint_id, CheckpointKind.SAVEPOINT, 1, 5, str(directory), (ack,)
    )
    storage.write_metadata(sp.external_path, sp)
    return sp


def test_dispose_savepoint_forgets_the_record_tells_the_core_then_deletes(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            sp = savepoint(s.storage, tmp_path / "sp-7", 7)
            await s.store.commit_completed(sp, retained=1)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            assert await s.execute(DisposeSavepoint(sp, sp.external_path, done)) == [
                ("savepoint_disposed", 7)
            ]
            assert done.result() is None
            assert not os.path.exists(sp.external_path)
            assert await s.store.list_savepoints(JOB) == []
            assert not s.fencing.fenced

    run(body())


def test_a_superseded_coordinator_disposes_no_savepoint(redis_url: str, tmp_path: Path) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            sp = savepoint(s.storage, tmp_path / "sp-8", 8)
            await s.store.commit_completed(sp, retained=1)
            files = sorted(os.listdir(sp.external_path))
            async with CheckpointStore.from_url(redis_url) as newer:
                await newer.acquire_epoch()
                loop = asyncio.get_running_loop()
                first, second = loop.create_future(), loop.create_future()
                events = await s.execute(
                    DisposeSavepoint(sp, sp.external_path, first),
                    DisposeSavepoint(sp, sp.external_path, second),
                )
                # The first fails at the fenced step and fences the executor; the second is
                # refused without running. The core is told nothing, nothing is deleted.
                assert events == []
                for done in (first, second):
                    with pytest.raises(StaleEpochError):
                        done.result()
                assert s.fencing.fenced and len(s.fencing.errors) == 1
                assert sorted(os.listdir(sp.external_path)) == files
                assert [c.checkpoint_id for c in await newer.list_savepoints(JOB)] == [8]
                await newer.remove_savepoint(JOB, 8)

    run(body())


def test_a_disposal_queued_when_the_executor_stops_is_refused(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with Setup(redis_url, tmp_path) as s:
            sp = savepoint(s.storage, tmp_path / "sp-9", 9)
            loop = asyncio.get_running_loop()
            queued, late = loop.create_future(), loop.create_future()
            s._loop.cancel()  # as JobRunner.close does, before the loop took the operation
            s.io.submit(DisposeSavepoint(sp, sp.external_path, queued))
            await asyncio.gather(s._loop, return_exceptions=True)
            s.io.stop()
            s.io.submit(DisposeSavepoint(sp, sp.external_path, late))
            for done in (queued, late):
                with pytest.raises(UnavailableError):
                    done.result()
            assert os.path.isfile(os.path.join(sp.external_path, "_metadata"))

    run(body())


# --- JobWatch -------------------------------------------------------------------------------


def test_watch_streams_the_current_state_then_events_in_order() -> None:
    async def body() -> None:
        watch = JobWatch(JOB, clock=lambda: 42)
        stream = watch.stream(lambda: JobState.RUNNING)
        first = await anext(stream)
        assert first == cpb.JobEvent(
            job_id=JOB,
            timestamp_ms=42,
            job_state_changed=cpb.JobStateChanged(
                state=pb.JOB_STATE_RUNNING, reason="current state"
            ),
        )
        assert watch.subscribers == 1
        watch.task_failed(SRC, "boom")
        watch.checkpoint_failed(lambda: cpb.CheckpointSummary(checkpoint_id=3))
        watch.state_changed(JobState.CANCELED, "")
        watch.close()
        events = [e async for e in stream]
        assert [e.WhichOneof("event") for e in events] == [
            "task_failed",
            "checkpoint_failed",
            "job_state_changed",
        ]
        assert events[0].task_failed.message == "boom"
        assert events[1].checkpoint_failed.checkpoint_id == 3
        assert events[2].job_state_changed.state == pb.JOB_STATE_CANCELED
        assert watch.subscribers == 0

    run(body())


def test_watch_cuts_off_a_subscriber_that_does_not_keep_up() -> None:
    async def body() -> None:
        watch = JobWatch(JOB, clock=lambda: 0)
        built: list[int] = []

        def summary() -> cpb.CheckpointSummary:
            built.append(1)
            return cpb.CheckpointSummary()

        watch.checkpoint_completed(summary)
        assert built == []  # nobody watches: the summary is never built
        stream = watch.stream(lambda: JobState.RUNNING)
        await anext(stream)
        for i in range(WATCH_QUEUE_BOUND + 1):
            watch.task_failed(SRC, str(i))
        assert watch.subscribers == 0
        rest = [e async for e in stream]
        # The oldest queued event made room for the end marker.
        assert [e.task_failed.message for e in rest] == [
            str(i) for i in range(1, WATCH_QUEUE_BOUND)
        ]

    run(body())


# --- JobRunner ------------------------------------------------------------------------------
# A real runner on a real JobManager (the session's Redis, files under tmp_path). Its one seam
# to the network, the agent RPCs, records instead of sending; the test sets the heartbeat clock.

A, B = "agent-a:7001", "agent-b:7001"
SRC_KEY, MAP_KEY = TaskKey("src", 0), TaskKey("map", 0)


class RecordingAgents:
    """The runner's ``Agents``: one entry per RPC the real gateway would send (one per agent)."""

    def __init__(
        self,
        job_id: str,
        clients: AgentClients,
        epoch: Callable[[], int],
        on_trigger_failed: TriggerFailed,
        log: Any,
    ) -> None:
        self.epoch = epoch
        self.trigger_failed = on_trigger_failed
        self.calls: list[tuple[Any, ...]] = []
        self.closed = False

    def trigger(
        self, by_address: ByAddress, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions
    ) -> None:
        for address, attempts in by_address.items():
            self.calls.append(("trigger", address, checkpoint_id, attempts))

    def notify(
        self,
        by_address: ByAddress,
        checkpoint_id: int,
        complete: bool,
        reason: str = "",
        final: bool = False,
    ) -> None:
        for address, attempts in by_address.items():
            if complete:
                self.calls.append(("complete", address, checkpoint_id, attempts, final))
            else:
                self.calls.append(("aborted", address, checkpoint_id, attempts, reason))

    def cancel(self, by_address: ByAddress) -> None:
        for address, attempts in by_address.items():
            self.calls.append(("cancel", address, attempts))

    def close(self) -> None:
        self.closed = True


class Monotonic:
    """The heartbeat clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    runner: JobRunner
    agents: RecordingAgents
    store: CheckpointStore
    monotonic: Monotonic

    def check_invariants(self) -> None:
        self.runner.core.check_invariants()
        self.runner.execution.check_invariants()

    async def deploy(self) -> tuple[ExecutionAttempt, ...]:
        """Register src#0 (on agent A) and map#0 (on agent B) and report them RUNNING."""
        attempts = []
        for key, address in ((SRC_KEY, A), (MAP_KEY, B)):
            attempt, _ = await self.runner.register_task(key, address)
            attempts.append(attempt)
        for attempt in attempts:
            await self.runner.update_task_state(attempt, TaskState.RUNNING, "")
        assert self.runner.execution.state is JobState.RUNNING
        self.check_invariants()
        return tuple(attempts)

    def ack(self, attempt: ExecutionAttempt, checkpoint_id: int) -> AckResult:
        """Acknowledge with one state file written into the checkpoint's directory."""
        directory = self.runner.storage.checkpoint_dir(JOB, checkpoint_id)
        path = write(os.path.join(directory, f"{attempt.vertex_id}-{attempt.subtask_index}"))
        states = (OperatorSubtaskState(f"{attempt.vertex_id}-op", (StateHandle(path, 5),)),)
        return self.runner.acknowledge(attempt, checkpoint_id, states, SubtaskMetrics())

    async def trigger(self, checkpoint_id: int) -> asyncio.Task[CompletedCheckpoint]:
        """Start a user checkpoint and wait until its trigger RPC (``checkpoint_id``) went out."""
        task = asyncio.create_task(self.runner.trigger(CheckpointKind.CHECKPOINT, "", 10))
        await self.triggered(checkpoint_id)
        return task

    async def triggered(self, checkpoint_id: int) -> None:
        """Wait for the trigger RPC of ``checkpoint_id`` (its id is allocated in Redis first)."""
        await wait_until_async(
            lambda: any(c[0] == "trigger" and c[2] == checkpoint_id for c in self.agents.calls),
            f"the trigger RPC of checkpoint {checkpoint_id}",
        )


@contextlib.asynccontextmanager
async def job_runner(
    redis_url: str, root: Path, config: CheckpointConfig | None = None, **settings: Any
) -> AsyncIterator[Harness]:
    """A started ``JobRunner`` of a new two-task job (src#0 -> map#0) on a started
    ``JobManager`` (its own epoch); ``settings``: coordinator setting overrides."""
    store = CheckpointStore.from_url(redis_url)
    manager = JobManager(
        local_settings(redis_url, str(root), **settings), store, CoordinatorMetrics()
    )
    await manager.start()  # takes the epoch; nothing to recover
    graph = convert.graph_from_pb(two_vertex_graph(1, 1))
    config = config or CheckpointConfig(tolerable_failures=None)
    record = JobRecord(JOB, graph, config, JobState.CREATED, created_at_ms=manager.clock())
    await store.create_job(record)
    monotonic = Monotonic()
    runner = JobRunner(manager, record, [], [], agents=RecordingAgents, monotonic=monotonic)
    assert isinstance(runner.agents, RecordingAgents)
    manager.jobs[JOB] = runner
    runner.start()
    try:
        yield Harness(runner, runner.agents, store, monotonic)
    finally:
        await manager.close()
        await store.close()
    assert runner.agents.closed


def test_runner_triggers_collects_acks_and_notifies_completion(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with job_runner(redis_url, tmp_path) as h:
            src, map_ = await h.deploy()
            assert (src, map_) == (ExecutionAttempt("src", 0, 1), ExecutionAttempt("map", 0, 1))
            assert h.agents.epoch() == await h.store.current_epoch()
            trigger = await h.trigger(1)
            assert h.agents.calls == [("trigger", A, 1, [src])]  # the sources only
            # Recorded in Redis before the trigger RPC was sent.
            assert [p.checkpoint_id for p in await h.store.list_pending(JOB)] == [1]
            assert h.ack(src, 1) is AckResult.SUCCESS
            assert h.ack(map_, 1) is AckResult.SUCCESS
            completed = await trigger
            assert completed.checkpoint_id == 1
            assert sorted(a.attempt for a in completed.subtask_states) == [map_, src]
            # One notice per agent, in the order of the attempts (map#0 < src#0).
            assert h.agents.calls[1:] == [
                ("complete", B, 1, [map_], False),
                ("complete", A, 1, [src], False),
            ]
            assert [c.checkpoint_id for c in await h.store.list_completed(JOB)] == [1]
            assert await h.store.list_pending(JOB) == []
            assert h.runner.storage.read_metadata(completed.external_path) == completed
            assert h.runner.stats_pb(0).counts.completed == 1
            h.check_invariants()

    run(body())


def test_runner_fails_a_silent_agents_tasks_and_the_restart_restores(
    redis_url: str, tmp_path: Path
) -> None:
    """Heartbeat timeout 10 s on the test's clock; the liveness loop checks every 10 ms."""

    async def body() -> None:
        async with job_runner(
            redis_url, tmp_path, heartbeat_interval_s=0.01, heartbeat_timeout_s=10.0
        ) as h:
            src, map_ = await h.deploy()  # both agents heard from at 100 s
            trigger = await h.trigger(1)
            h.ack(src, 1)
            h.ack(map_, 1)
            checkpoint_1 = await trigger
            h.agents.calls.clear()
            h.monotonic.now = 106.0
            assert h.runner.heartbeat(A, [src])
            h.monotonic.now = 111.0  # B silent for 11 s, A for 5 s
            # B's task fails; the deployment's other task is cancelled on its agent (after the
            # job's record is persisted).
            await wait_until_async(lambda: h.agents.calls, "the failover's cancel")
            assert h.agents.calls == [("cancel", A, [src])]
            assert h.runner.execution.state is JobState.RESTARTING
            failed = h.runner.execution.tasks[MAP_KEY]
            assert (failed.state, failed.failure) == (
                TaskState.FAILED,
                f"heartbeat timeout of agent {B}: no heartbeat for 11.0 s (heartbeat_timeout_s 10)",
            )
            assert not h.runner.heartbeat(B, [map_])  # not current any more
            stored = await h.store.get_job(JOB)
            assert stored is not None and stored.state is JobState.RESTARTING
            h.check_invariants()
            # The restart: the tasks register again (map#0 on another agent), deployment 2
            # restores checkpoint 1 and runs.
            src_2, restore = await h.runner.register_task(SRC_KEY, A)
            assert src_2 == ExecutionAttempt("src", 0, 2)
            assert restore == RestorePoint(checkpoint_1, is_savepoint=False)
            map_2, restore = await h.runner.register_task(MAP_KEY, "agent-c:7001")
            assert map_2 == ExecutionAttempt("map", 0, 2)
            assert restore == RestorePoint(checkpoint_1, is_savepoint=False)
            for attempt in (src_2, map_2):
                await h.runner.update_task_state(attempt, TaskState.RUNNING, "")
            execution = h.runner.execution
            assert (execution.state, execution.deployment, execution.restarts) == (
                JobState.RUNNING,
                2,
                1,
            )
            assert h.agents.calls == [("cancel", A, [src])]  # nothing else was sent
            stored = await h.store.get_job(JOB)
            assert stored is not None
            assert (stored.state, stored.deployment, stored.restarts) == (JobState.RUNNING, 2, 1)
            h.check_invariants()

    run(body())


def test_runner_aborts_a_declined_checkpoint_and_notifies_the_tasks(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with job_runner(redis_url, tmp_path) as h:
            src, map_ = await h.deploy()
            trigger = await h.trigger(1)
            assert h.ack(src, 1) is AckResult.SUCCESS
            h.runner.decline(map_, 1, DeclineReason.SNAPSHOT_FAILED, "disk full")
            with pytest.raises(CheckpointFailedError) as failed:
                await trigger
            assert failed.value.reason == "DECLINED"
            assert h.agents.calls == [
                ("trigger", A, 1, [src]),
                ("aborted", B, 1, [map_], "DECLINED"),
                ("aborted", A, 1, [src], "DECLINED"),
            ]
            await h.runner.io.join()  # the clean-up of the aborted checkpoint
            assert not os.path.exists(h.runner.storage.checkpoint_dir(JOB, 1))
            assert await h.store.list_pending(JOB) == []
            assert await h.store.list_completed(JOB) == []
            assert h.runner.execution.state is JobState.RUNNING  # failures are tolerated
            h.check_invariants()

    run(body())


def test_runner_fails_the_job_on_a_decline_beyond_the_tolerable_failures(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with job_runner(redis_url, tmp_path, CheckpointConfig(tolerable_failures=0)) as h:
            src, map_ = await h.deploy()
            trigger = await h.trigger(1)
            h.runner.decline(src, 1, DeclineReason.IO_ERROR, "disk gone")
            with pytest.raises(CheckpointFailedError):
                await trigger
            await wait_until_async(lambda: len(h.agents.calls) == 5, "the job's tasks cancelled")
            assert h.agents.calls == [
                ("trigger", A, 1, [src]),
                ("aborted", B, 1, [map_], "DECLINED"),
                ("aborted", A, 1, [src], "DECLINED"),
                ("cancel", B, [map_]),  # the attempts in order, as the notices
                ("cancel", A, [src]),
            ]
            assert h.runner.execution.state is JobState.FAILED
            stored = await h.store.get_job(JOB)
            assert stored is not None and stored.state is JobState.FAILED
            h.check_invariants()

    run(body())


def test_runner_aborts_a_checkpoint_whose_trigger_rpc_failed_without_counting_it(
    redis_url: str, tmp_path: Path
) -> None:
    async def body() -> None:
        async with job_runner(redis_url, tmp_path, CheckpointConfig(tolerable_failures=0)) as h:
            src, map_ = await h.deploy()
            trigger = await h.trigger(1)
            h.agents.trigger_failed(src, 1, f"trigger RPC to {A} failed: UNAVAILABLE")
            with pytest.raises(CheckpointFailedError) as failed:
                await trigger
            assert failed.value.reason == "TASK_NOT_READY"
            assert h.agents.calls == [
                ("trigger", A, 1, [src]),
                ("aborted", B, 1, [map_], "TASK_NOT_READY"),
                ("aborted", A, 1, [src], "TASK_NOT_READY"),
            ]
            # Not counted: the job runs on and the next checkpoint completes.
            trigger = await h.trigger(2)
            h.ack(src, 2)
            h.ack(map_, 2)
            assert (await trigger).checkpoint_id == 2
            assert h.runner.execution.state is JobState.RUNNING
            h.check_invariants()

    run(body())

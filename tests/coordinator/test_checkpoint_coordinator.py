"""Exact event -> action sequences for the pure checkpoint coordinator.

Every step is followed by ``check_invariants``. The task view is a small fake: this is a unit
test of pure logic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator.checkpoint_coordinator import (
    AllocateCheckpointId,
    BarrierOptions,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointCoordinator,
    CheckpointTriggered,
    DeclineReason,
    DeleteCompleted,
    DiscardState,
    EndCommitted,
    FailJob,
    FinalizeCheckpoint,
    NotifyAborted,
    NotifyComplete,
    RequestCovered,
    RequestRefused,
    SendTrigger,
    SubtaskAcknowledged,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_failure_manager import FailureManager
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    CheckpointKind,
    CheckpointMode,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobEdge,
    JobGraph,
    JobVertex,
    OperatorSubtaskState,
    StateHandle,
    SubtaskMetrics,
    TriggerRefusal,
)
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import PartitionerKind

SRC0 = ExecutionAttempt("src", 0, 1)
SRC1 = ExecutionAttempt("src", 1, 1)
SINK0 = ExecutionAttempt("sink", 0, 1)
ALL = (SINK0, SRC0, SRC1)  # sorted order
INLINE = CheckpointConfig().inline_state_threshold_bytes  # what every barrier carries
GRAPH = JobGraph(
    "g",
    (JobVertex("src", "source", 2, is_source=True), JobVertex("sink", "sink", 1)),
    (JobEdge("src", "sink", PartitionerKind.REBALANCE),),
)


@dataclass
class FakeTasks:
    running: bool = True
    data_ended: frozenset[ExecutionAttempt] = frozenset()

    def all_running(self) -> bool:
        return self.running

    def current_attempts(self) -> list[ExecutionAttempt]:
        return sorted(ALL)

    def source_attempts(self) -> list[ExecutionAttempt]:
        return [SRC0, SRC1]

    def every_source_data_ended(self) -> bool:
        return {SRC0, SRC1} <= self.data_ended

    def all_data_ended(self) -> bool:
        return set(ALL) <= self.data_ended


class Harness:
    def __init__(self, **config: object) -> None:
        self.tasks = FakeTasks()
        cfg = CheckpointConfig(**{"timeout_ms": 1000, **config})  # type: ignore[arg-type]
        self.cc = CheckpointCoordinator("job", GRAPH, cfg, self.tasks, random.Random(7))
        self.next_request_id = 1

    def step(self, actions: list) -> list:
        self.cc.check_invariants()
        return actions

    def manual(
        self, now: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT, target: str = ""
    ) -> tuple[TriggerRequest, list]:
        req = TriggerRequest(self.next_request_id, kind, periodic=False, target_directory=target)
        self.next_request_id += 1
        return req, self.step(self.cc.request(req, now))

    def allocate(self, req: TriggerRequest, cid: int, now: int) -> list:
        return self.step(self.cc.on_checkpoint_id(req, cid, f"/cp/job/chk-{cid}", now))

    def trigger(
        self, cid: int, now: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT
    ) -> TriggerRequest:
        req, actions = self.manual(now, kind)
        assert actions == [AllocateCheckpointId(req)]
        self.allocate(req, cid, now)
        return req

    def ack(
        self, attempt: ExecutionAttempt, cid: int, now: int, paths: tuple[str, ...] = ()
    ) -> tuple[AckResult, list]:
        states = (
            (OperatorSubtaskState("op", tuple(StateHandle(p, 10) for p in paths)),) if paths else ()
        )
        result, actions = self.cc.on_ack(
            attempt, cid, states, SubtaskMetrics(sync_duration_ms=1), now
        )
        self.cc.check_invariants()
        return result, actions

    def complete(
        self, cid: int, now: int, dropped: tuple[int, ...] = ()
    ) -> tuple[CompletedCheckpoint, list]:
        finalize = None
        for attempt in ALL:
            result, actions = self.ack(attempt, cid, now, (f"/cp/job/chk-{cid}/{attempt}",))
            assert result is AckResult.SUCCESS
            finalize = next((a for a in actions if isinstance(a, FinalizeCheckpoint)), finalize)
        assert finalize is not None
        return finalize.checkpoint, self.step(
            self.cc.on_checkpoint_committed(finalize.checkpoint, list(dropped), now)
        )


def test_happy_path_exact_sequence() -> None:
    h = Harness()
    req, actions = h.manual(now=100)
    assert actions == [AllocateCheckpointId(req)]
    actions = h.allocate(req, 1, now=105)
    assert actions == [
        CheckpointTriggered(1, req, 105, "/cp/job/chk-1", ALL),
        SendTrigger(
            1,
            105,
            BarrierOptions(
                CheckpointKind.CHECKPOINT, CheckpointMode.ALIGNED, 0, "/cp/job/chk-1", INLINE
            ),
            (SRC0, SRC1),
        ),
    ]
    result, actions = h.ack(SRC0, 1, 110, ("/cp/job/chk-1/a",))
    assert result is AckResult.SUCCESS
    assert [type(a) for a in actions] == [SubtaskAcknowledged]
    h.ack(SRC1, 1, 111)
    result, actions = h.ack(SINK0, 1, 112, ("/cp/job/chk-1/b",))
    assert result is AckResult.SUCCESS
    assert [type(a) for a in actions] == [SubtaskAcknowledged, FinalizeCheckpoint]
    finalize = actions[1]
    cp = finalize.checkpoint
    assert (cp.checkpoint_id, cp.trigger_timestamp_ms, cp.completion_timestamp_ms) == (1, 105, 112)
    assert [a.attempt for a in cp.subtask_states] == list(ALL)
    assert sorted(cp.state_paths()) == ["/cp/job/chk-1/a", "/cp/job/chk-1/b"]
    assert cp.vertex_parallelism == {"src": 2, "sink": 1}
    assert finalize.retained == 1
    actions = h.step(h.cc.on_checkpoint_committed(cp, [], 120))
    assert actions == [CheckpointCompleted(cp, req, ()), NotifyComplete(1, ALL)]
    assert h.cc.latest_completed() == cp
    assert h.cc.pending == {}


def acknowledged(actions: Sequence[object]) -> list[SubtaskAcknowledged]:
    assert all(isinstance(a, SubtaskAcknowledged) for a in actions), actions
    return [a for a in actions if isinstance(a, SubtaskAcknowledged)]


def test_a_held_ack_is_timed_when_the_agent_had_it_and_completion_when_it_arrived() -> None:
    h = Harness()
    h.trigger(1, now=100)
    metrics = SubtaskMetrics(sync_duration_ms=1)
    # The agent held the sources' acks for its sink's (held_ms); the sink's came at once.
    _, actions = h.cc.on_ack(SRC0, 1, (), metrics, 160, held_ms=50)
    assert [(a.checkpoint_id, a.ack.ack_timestamp_ms) for a in acknowledged(actions)] == [(1, 110)]
    # A held time longer than the checkpoint has existed is clamped to its trigger.
    _, actions = h.cc.on_ack(SRC1, 1, (), metrics, 160, held_ms=10_000)
    assert [(a.checkpoint_id, a.ack.ack_timestamp_ms) for a in acknowledged(actions)] == [(1, 100)]
    _, actions = h.cc.on_ack(SINK0, 1, (), metrics, 160, held_ms=0)
    h.cc.check_invariants()
    assert isinstance(actions[0], SubtaskAcknowledged) and actions[0].ack.ack_timestamp_ms == 160
    assert isinstance(actions[1], FinalizeCheckpoint)
    assert actions[1].checkpoint.completion_timestamp_ms == 160
    assert [a.ack_timestamp_ms for a in actions[1].checkpoint.subtask_states] == [160, 110, 100]


def test_triggers_go_only_to_source_tasks() -> None:
    h = Harness()
    req, _ = h.manual(0)
    send = [a for a in h.allocate(req, 1, 0) if isinstance(a, SendTrigger)]
    assert send[0].tasks == (SRC0, SRC1)


def test_periodic_first_trigger_uses_random_delay_between_min_pause_and_interval() -> None:
    h = Harness(interval_ms=1000, min_pause_ms=200)
    assert h.step(h.cc.on_tasks_running(now_ms=0)) == []
    expected_delay = random.Random(7).randint(200, 1000)
    assert h.cc.next_periodic_ms == expected_delay
    assert h.cc.next_deadline_ms() == expected_delay
    assert h.step(h.cc.on_tick(expected_delay - 1)) == []
    actions = h.step(h.cc.on_tick(expected_delay))
    assert actions == [
        AllocateCheckpointId(TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True))
    ]
    assert h.cc.next_periodic_ms == expected_delay + 1000


def test_periodic_not_started_without_interval() -> None:
    h = Harness(interval_ms=0)
    h.cc.on_tasks_running(0)
    assert h.cc.next_periodic_ms is None
    assert h.cc.next_deadline_ms() is None


def test_refusal_when_tasks_not_running() -> None:
    h = Harness()
    h.tasks.running = False
    req, actions = h.manual(0)
    assert actions == [RequestRefused(req, TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING)]


def test_refusal_when_tasks_stop_running_during_id_allocation() -> None:
    h = Harness()
    req, _ = h.manual(0)
    h.tasks.running = False
    assert h.allocate(req, 1, 0) == [
        RequestRefused(req, TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING)
    ]
    assert h.cc.pending == {}
    # a late ack for the burned id is classified as discarded, never kept
    result, actions = h.ack(SRC0, 1, 5, ("/cp/job/chk-1/x",))
    assert result is AckResult.DISCARDED
    assert actions == [DiscardState(("/cp/job/chk-1/x",), "late ack for an ended checkpoint")]


def test_periodic_and_manual_requests_queue_at_max_concurrent() -> None:
    """CheckpointRequestDeciderTest.testEnqueueOnTooManyPending: a request at max concurrency
    is queued, periodic ones too, and starts when a pending checkpoint ends."""
    h = Harness(max_concurrent=1)
    h.trigger(1, 0)
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    assert h.step(h.cc.request(periodic, 10)) == []
    req2, actions = h.manual(20)
    assert actions == []  # queued, ahead of the periodic request
    assert list(h.cc.queue) == [req2, periodic]
    cp, actions = h.complete(1, 30)
    assert actions == [
        CheckpointCompleted(cp, TriggerRequest(1, CheckpointKind.CHECKPOINT), ()),
        NotifyComplete(1, ALL),
        AllocateCheckpointId(req2),
    ]
    assert [type(a) for a in h.allocate(req2, 2, 31)] == [CheckpointTriggered, SendTrigger]
    assert list(h.cc.queue) == [periodic]  # max concurrent again: still queued
    _cp2, actions = h.complete(2, 40, dropped=(1,))
    assert actions[-2:] == [DeleteCompleted((1,)), AllocateCheckpointId(periodic)]


def test_min_pause_refuses_periodic_and_reschedules_but_not_manual() -> None:
    """CheckpointRequestDeciderTest.testCheckpointTiming: during the minimum pause a periodic
    request is dropped (and the timer rescheduled), a manual one triggers immediately."""
    h = Harness(min_pause_ms=500, interval_ms=100)
    h.trigger(1, 0)
    h.complete(1, 50)
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    assert h.step(h.cc.request(periodic, 100)) == [
        RequestRefused(periodic, TriggerRefusal.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
    ]
    assert h.cc.next_periodic_ms == 550
    req, actions = h.manual(200)
    assert actions == [AllocateCheckpointId(req)]
    assert h.cc.triggering is req


def test_savepoint_is_forced_past_max_concurrent_and_min_pause() -> None:
    h = Harness(max_concurrent=1, min_pause_ms=10_000)
    h.trigger(1, 0)
    sp, actions = h.manual(5, CheckpointKind.SAVEPOINT, "/sp")
    assert actions == [AllocateCheckpointId(sp)]
    actions = h.allocate(sp, 2, 5)
    assert isinstance(actions[1], SendTrigger)
    assert actions[1].options.kind is CheckpointKind.SAVEPOINT


def test_savepoint_of_unaligned_job_is_aligned() -> None:
    h = Harness(mode=CheckpointMode.UNALIGNED)
    sp, _ = h.manual(0, CheckpointKind.SAVEPOINT)
    send = h.allocate(sp, 1, 0)[1]
    assert send.options.mode is CheckpointMode.ALIGNED
    req, _ = h.manual(0)
    assert h.cc.triggering is None and list(h.cc.queue) == [req]  # max concurrent 1: queued


def test_aligned_timeout_passed_to_barrier() -> None:
    h = Harness(aligned_checkpoint_timeout_ms=250)
    req, _ = h.manual(0)
    assert h.allocate(req, 1, 0)[1].options.aligned_checkpoint_timeout_ms == 250


def test_duplicate_ack_discards_only_new_paths() -> None:
    h = Harness()
    h.trigger(1, 0)
    assert h.ack(SRC0, 1, 1, ("/a",))[0] is AckResult.SUCCESS
    result, actions = h.ack(SRC0, 1, 2, ("/a", "/b"))
    assert result is AckResult.DUPLICATE
    assert actions == [DiscardState(("/b",), "duplicate ack")]


def test_ack_from_unexpected_attempt_is_unknown_and_discarded() -> None:
    h = Harness()
    h.trigger(1, 0)
    stale = ExecutionAttempt("src", 0, 0)
    result, actions = h.ack(stale, 1, 1, ("/stale",))
    assert result is AckResult.UNKNOWN
    assert actions == [DiscardState(("/stale",), f"ack from unexpected attempt {stale}")]


def test_ack_for_never_triggered_checkpoint_is_unknown() -> None:
    h = Harness()
    result, actions = h.ack(SRC0, 99, 1, ("/x",))
    assert result is AckResult.UNKNOWN
    assert actions == [DiscardState(("/x",), "ack for an unknown checkpoint")]


def test_late_ack_after_expiry_is_discarded() -> None:
    h = Harness(timeout_ms=100, tolerable_failures=5)
    h.trigger(1, 0)
    h.ack(SRC0, 1, 10, ("/early",))
    actions = h.step(h.cc.on_tick(100))
    assert actions == [
        CheckpointAborted(
            1,
            TriggerRequest(1, CheckpointKind.CHECKPOINT),
            AbortReason.EXPIRED,
            "expired after 100 ms",
            100,
            0,
            "/cp/job/chk-1",
            ("/early",),
        ),
        NotifyAborted(1, ALL, AbortReason.EXPIRED),
    ]
    result, actions = h.ack(SRC1, 1, 150, ("/late",))
    assert result is AckResult.DISCARDED
    assert actions == [DiscardState(("/late",), "late ack for an ended checkpoint")]


def test_duplicate_ack_after_completion_never_discards_completed_state() -> None:
    h = Harness()
    _cp, _ = h.trigger(1, 0), None
    h.complete(1, 10)
    completed = h.cc.latest_completed()
    assert completed is not None
    own_path = f"/cp/job/chk-1/{SRC0}"
    result, actions = h.ack(SRC0, 1, 20, (own_path, "/extra"))
    assert result is AckResult.DUPLICATE
    assert actions == [DiscardState(("/extra",), "duplicate ack of a completed checkpoint")]


def test_decline_aborts_and_fails_job_when_no_failures_tolerated() -> None:
    h = Harness(tolerable_failures=0)
    req = h.trigger(1, 0)
    h.ack(SRC0, 1, 1, ("/p",))
    actions = h.step(h.cc.on_decline(SINK0, 1, "disk full", 2))
    assert actions[:2] == [
        CheckpointAborted(
            1,
            req,
            AbortReason.DECLINED,
            f"declined by {SINK0}: disk full",
            2,
            0,
            "/cp/job/chk-1",
            ("/p",),
        ),
        NotifyAborted(1, ALL, AbortReason.DECLINED),
    ]
    assert isinstance(actions[2], FailJob)
    assert "1 consecutive failures > 0 tolerable" in actions[2].message
    req2, actions = h.manual(3)
    assert actions == [RequestRefused(req2, TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN)]


def test_decline_from_unknown_attempt_or_checkpoint_is_ignored() -> None:
    h = Harness()
    h.trigger(1, 0)
    assert h.cc.on_decline(ExecutionAttempt("src", 0, 9), 1, "x", 1) == []
    assert h.cc.on_decline(SRC0, 7, "x", 1) == []
    assert 1 in h.cc.pending


def test_tolerable_failures_and_reset_on_success() -> None:
    h = Harness(tolerable_failures=1, timeout_ms=10)
    h.trigger(1, 0)
    actions = h.step(h.cc.on_tick(10))
    assert not any(isinstance(a, FailJob) for a in actions)
    h.trigger(2, 20)
    h.complete(2, 21)
    assert h.cc.failure_manager.consecutive_failures == 0
    h.trigger(3, 30)
    assert not any(isinstance(a, FailJob) for a in h.step(h.cc.on_tick(40)))
    h.trigger(4, 50)
    actions = h.step(h.cc.on_tick(60))
    assert isinstance(actions[-1], FailJob)
    assert h.cc.job_failed


def test_unlimited_tolerable_failures() -> None:
    h = Harness(tolerable_failures=None, timeout_ms=10)  # the shortest timeout allowed
    for i in range(1, 6):
        h.trigger(i, i * 100)
        assert not any(isinstance(a, FailJob) for a in h.step(h.cc.on_tick(i * 100 + 10)))


def test_failure_manager_counts_each_checkpoint_once_and_ignores_older_than_success() -> None:
    """Counted reasons and ids: EXPIRED, DECLINED, FINALIZE_FAILED and trigger I/O failures
    (Flink's CHECKPOINT_EXPIRED, CHECKPOINT_DECLINED, FINALIZE_CHECKPOINT_FAILURE, IO_EXCEPTION)
    count, each id once; subsumption, task failures and pre-flight refusals do not."""
    fm = FailureManager(tolerable=3)
    assert fm.on_failure(5, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED) is False
    assert fm.on_failure(5, CheckpointKind.CHECKPOINT, AbortReason.DECLINED) is False  # same id
    assert fm.consecutive_failures == 1
    assert fm.on_failure(6, CheckpointKind.CHECKPOINT, AbortReason.SUBSUMED) is False  # not counted
    assert fm.on_failure(6, CheckpointKind.SAVEPOINT, AbortReason.EXPIRED) is False  # savepoint
    assert fm.on_failure(6, CheckpointKind.CHECKPOINT, AbortReason.TASK_FAILURE) is False
    refusal = TriggerRefusal.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    assert fm.on_failure(None, CheckpointKind.CHECKPOINT, refusal) is False
    assert fm.consecutive_failures == 1
    assert fm.on_failure(6, CheckpointKind.CHECKPOINT, AbortReason.FINALIZE_FAILED) is False
    assert fm.consecutive_failures == 2
    fm.on_success(7)
    assert fm.on_failure(6, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED) is False  # older
    assert fm.consecutive_failures == 0
    assert fm.on_failure(8, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED) is False
    io = TriggerRefusal.IO_EXCEPTION
    assert fm.on_failure(None, CheckpointKind.SAVEPOINT, io) is False
    assert fm.on_failure(None, CheckpointKind.CHECKPOINT, io) is False  # no id: always counts
    assert fm.on_failure(None, CheckpointKind.CHECKPOINT, io) is False
    assert fm.consecutive_failures == 3
    assert fm.on_failure(10, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED) is True


def _flink_fm_sequence(fm: FailureManager, events: list[tuple[str, int]]) -> int:
    """Feed ("fail REASON" | "ok", id) events; return how often the job would have failed."""
    failed = 0
    for event, cid in events:
        if event == "ok":
            fm.on_success(cid)
        elif fm.on_failure(cid, CheckpointKind.CHECKPOINT, AbortReason[event]):
            failed += 1
    return failed


def test_flink_failure_manager_scenarios() -> None:
    """CheckpointFailureManagerTest (Flink 1.18 and 1.20), with a tolerance of 2; Flink's
    ignored JOB_FAILOVER_REGION is our TASK_FAILURE, its IO_EXCEPTION of a pending checkpoint
    our DECLINED (both count)."""
    # testIgnoresPastCheckpoints: 1, 2 expire; 2 succeeds; 1 again (older); 3, 4 expire: no failure.
    events = [("EXPIRED", 1), ("EXPIRED", 2), ("ok", 2)]
    events += [("EXPIRED", 1), ("EXPIRED", 3), ("EXPIRED", 4)]
    assert _flink_fm_sequence(FailureManager(2), events) == 0
    # testContinuousFailure: declined 1, 2, (failover 3 ignored), declined 4: the job fails once.
    events = [("DECLINED", 1), ("DECLINED", 2), ("TASK_FAILURE", 3), ("DECLINED", 4)]
    assert _flink_fm_sequence(FailureManager(2), events) == 1
    # testBreakContinuousFailure: 1, 2 fail, 3 ignored, 4 succeeds, 5 expires: no failure.
    events = [("DECLINED", 1), ("DECLINED", 2), ("TASK_FAILURE", 3), ("ok", 4), ("EXPIRED", 5)]
    assert _flink_fm_sequence(FailureManager(2), events) == 0
    # testIgnoreOneCheckpointRepeatedlyCountMultiTimes: 2 declined twice counts once.
    events = [("DECLINED", 1), ("DECLINED", 2), ("TASK_FAILURE", 3), ("DECLINED", 2)]
    assert _flink_fm_sequence(FailureManager(2), events) == 0


def test_flink_failure_manager_total_count_value() -> None:
    """CheckpointFailureManagerTest.testTotalCountValue: with no failure tolerated, exactly
    Flink's counted reasons fail the job (each reported under a fresh id here)."""
    counted = set()
    for i, reason in enumerate(AbortReason, start=1):
        if FailureManager(0).on_failure(i, CheckpointKind.CHECKPOINT, reason):
            counted.add(reason)
    assert counted == {AbortReason.EXPIRED, AbortReason.DECLINED, AbortReason.FINALIZE_FAILED}
    refused = {
        r
        for r in TriggerRefusal
        if FailureManager(0).on_failure(None, CheckpointKind.CHECKPOINT, r)
    }
    assert refused == {TriggerRefusal.IO_EXCEPTION, TriggerRefusal.CHECKPOINT_EXPIRED}


def test_savepoint_failures_count_only_when_a_task_declines_an_intermediate_savepoint() -> None:
    """CheckpointFailureManager.handleTaskLevelCheckpointException: a task's decline of a
    savepoint counts (failover may help); job-level savepoint failures (expiry, trigger I/O,
    finalisation) never count. A declined stop-with-savepoint: docs/flink-differences.md."""
    h = Harness(tolerable_failures=0, timeout_ms=100)
    h.trigger(1, 0, CheckpointKind.SAVEPOINT)
    assert [type(a) for a in h.step(h.cc.on_tick(100))] == [CheckpointAborted, NotifyAborted]
    stop = h.trigger(2, 200, CheckpointKind.SAVEPOINT_SUSPEND)
    actions = h.step(h.cc.on_decline(SRC0, 2, "snapshot failed", 210))
    assert [a.request for a in actions if isinstance(a, CheckpointAborted)] == [stop]
    assert not any(isinstance(a, FailJob) for a in actions)
    h.trigger(3, 300, CheckpointKind.SAVEPOINT)
    actions = h.step(h.cc.on_decline(SRC0, 3, "snapshot failed", 310))
    assert isinstance(actions[-1], FailJob)
    assert "1 consecutive failures > 0 tolerable" in actions[-1].message
    assert h.cc.job_failed


def test_a_success_clears_the_count_of_newer_failures_too() -> None:
    """Flink's handleCheckpointSuccess/clearCount: a success newer than every earlier success
    forgets every counted failure, those of newer checkpoints in flight included."""
    fm = FailureManager(tolerable=5)
    fm.on_failure(3, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED)
    fm.on_failure(5, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED)
    fm.on_success(4)
    assert fm.consecutive_failures == 0
    # clearCount forgets the counted ids too: 5 failing again (a second report) counts again
    assert fm.on_failure(5, CheckpointKind.CHECKPOINT, AbortReason.DECLINED) is False
    assert fm.consecutive_failures == 1
    fm.on_success(5)
    fm.on_failure(6, CheckpointKind.CHECKPOINT, AbortReason.EXPIRED)
    fm.on_success(2)  # older than the last success: changes nothing
    assert (fm.consecutive_failures, fm.last_succeeded_id) == (1, 5)


def test_declined_6_success_5_expired_7_with_a_tolerance_of_1_keeps_the_job() -> None:
    h = Harness(max_concurrent=3, tolerable_failures=1, timeout_ms=100)
    h.trigger(5, 0)
    r6 = h.trigger(6, 1)
    h.trigger(7, 2)
    actions = h.step(h.cc.on_decline(SRC0, 6, "snapshot failed", 10))
    assert actions == [
        CheckpointAborted(
            6,
            r6,
            AbortReason.DECLINED,
            f"declined by {SRC0}: snapshot failed",
            10,
            1,
            "/cp/job/chk-6",
            (),
        ),
        NotifyAborted(6, ALL, AbortReason.DECLINED),
    ]
    assert h.cc.failure_manager.consecutive_failures == 1
    _cp, actions = h.complete(5, 20)
    assert [type(a) for a in actions] == [CheckpointCompleted, NotifyComplete]
    assert h.cc.failure_manager.consecutive_failures == 0
    actions = h.step(h.cc.on_tick(102))
    assert [type(a) for a in actions] == [CheckpointAborted, NotifyAborted]  # 7 expired
    assert h.cc.failure_manager.consecutive_failures == 1
    assert not h.cc.job_failed


def test_completion_subsumes_older_pending_checkpoints_but_not_savepoints() -> None:
    h = Harness(max_concurrent=3)
    r1 = h.trigger(1, 0)
    h.trigger(2, 1, CheckpointKind.SAVEPOINT)
    h.trigger(3, 2)
    h.ack(SRC0, 1, 3, ("/one",))
    _cp, actions = h.complete(3, 10)
    assert actions[:2] == [
        CheckpointAborted(
            1,
            r1,
            AbortReason.SUBSUMED,
            "subsumed by checkpoint 3",
            10,
            0,
            "/cp/job/chk-1",
            ("/one",),
        ),
        NotifyAborted(1, ALL, AbortReason.SUBSUMED),
    ]
    assert isinstance(actions[2], CheckpointCompleted)
    assert sorted(h.cc.pending) == [2]
    assert h.cc.failure_manager.consecutive_failures == 0


def test_retention_drops_are_deleted_after_commit() -> None:
    h = Harness(retained=1)
    _cp1, _ = h.trigger(1, 0), None
    _first, _ = h.complete(1, 1)
    h.trigger(2, 2)
    second, actions = h.complete(2, 3, dropped=(1,))
    assert actions[-1] == DeleteCompleted((1,))
    assert h.cc.completed == [second]
    # a late duplicate ack for the dropped checkpoint is discarded (it is no longer referenced)
    result, acts = h.ack(SRC0, 1, 4, (f"/cp/job/chk-1/{SRC0}",))
    assert result is AckResult.DISCARDED
    assert acts == [DiscardState((f"/cp/job/chk-1/{SRC0}",), "late ack for an ended checkpoint")]


def test_intermediate_savepoint_does_not_notify_complete() -> None:
    h = Harness()
    sp = h.trigger(1, 0, CheckpointKind.SAVEPOINT)
    cp, actions = h.complete(1, 5)
    assert actions == [CheckpointCompleted(cp, sp, ())]
    assert h.cc.completed == [] and h.cc.savepoints == [cp]


def test_stop_with_savepoint_stops_periodic_and_shuts_down_after_notify() -> None:
    h = Harness(interval_ms=100)
    h.cc.on_tasks_running(0)
    assert h.cc.next_periodic_ms is not None
    stop = h.trigger(1, 10, CheckpointKind.SAVEPOINT_SUSPEND)
    assert h.cc.next_periodic_ms is None
    req, actions = h.manual(11)
    assert actions == [RequestRefused(req, TriggerRefusal.STOP_WITH_SAVEPOINT_PENDING)]
    cp, actions = h.complete(1, 20)
    assert actions == [
        CheckpointCompleted(cp, stop, ()),
        EndCommitted(1, ALL),
        NotifyComplete(1, ALL),
    ]
    req, actions = h.manual(21)
    assert actions == [RequestRefused(req, TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN)]


def test_failed_stop_with_savepoint_resumes_periodic_checkpoints() -> None:
    h = Harness(interval_ms=100, timeout_ms=50)
    h.cc.on_tasks_running(0)
    h.trigger(1, 10, CheckpointKind.SAVEPOINT_TERMINATE)
    actions = h.step(h.cc.on_tick(60))
    assert [type(a) for a in actions] == [CheckpointAborted, NotifyAborted]
    assert h.cc.next_periodic_ms == 160
    assert not h.cc.stopping_with_savepoint


def test_task_failure_aborts_pending_without_counting_and_refuses_queue() -> None:
    h = Harness(tolerable_failures=0, interval_ms=100)
    h.cc.on_tasks_running(0)
    r1 = h.trigger(1, 1)
    r2, _ = h.manual(2)
    actions = h.step(h.cc.on_tasks_not_running(3, "task src#0 failed"))
    assert actions == [
        CheckpointAborted(
            1, r1, AbortReason.TASK_FAILURE, "task src#0 failed", 3, 1, "/cp/job/chk-1", ()
        ),
        NotifyAborted(1, ALL, AbortReason.TASK_FAILURE),
        RequestRefused(r2, TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING),
    ]
    assert h.cc.next_periodic_ms is None
    assert h.cc.failure_manager.consecutive_failures == 0


def test_finalize_failure_aborts_and_counts() -> None:
    """Flink counts FINALIZE_CHECKPOINT_FAILURE (CheckpointFailureManager.checkFailureCounter,
    FLINK-32347)."""
    h = Harness(tolerable_failures=1)
    req = h.trigger(1, 0)
    for a in ALL:
        h.ack(a, 1, 1, (f"/p/{a}",))
    assert h.cc.pending[1].finalizing
    # a finalizing checkpoint does not expire
    assert h.step(h.cc.on_tick(5000)) == []
    actions = h.step(h.cc.on_finalize_failed(1, "disk full", 2))
    assert actions == [
        CheckpointAborted(
            1,
            req,
            AbortReason.FINALIZE_FAILED,
            "disk full",
            2,
            0,
            "/cp/job/chk-1",
            tuple(f"/p/{a}" for a in ALL),
        ),
        NotifyAborted(1, ALL, AbortReason.FINALIZE_FAILED),
    ]
    assert h.cc.failure_manager.consecutive_failures == 1


def test_flink_failure_to_store_a_completed_checkpoint_fails_the_job() -> None:
    """CheckpointCoordinatorTest.testExceptionInStoringCompletedCheckpointIsReportedToFailure
    Manager: with no failure tolerated, a checkpoint whose commit fails fails the job."""
    h = Harness(tolerable_failures=0)
    req = h.trigger(1, 0)
    for a in ALL:
        h.ack(a, 1, 1)
    actions = h.step(h.cc.on_finalize_failed(1, "commit failed", 2))
    assert [type(a) for a in actions] == [CheckpointAborted, NotifyAborted, FailJob]
    assert actions[0].request is req and actions[0].reason is AbortReason.FINALIZE_FAILED
    assert h.cc.job_failed


def test_id_allocation_failure_refuses_counts_and_continues_with_queue() -> None:
    h = Harness(max_concurrent=2, tolerable_failures=1)
    r1, _ = h.manual(0)
    r2, actions = h.manual(0)
    assert actions == []
    assert h.step(h.cc.on_checkpoint_id_failed(r1, 1)) == [
        RequestRefused(r1, TriggerRefusal.IO_EXCEPTION),
        AllocateCheckpointId(r2),
    ]
    assert h.cc.failure_manager.consecutive_failures == 1


def test_trigger_io_exception_beyond_the_tolerance_fails_the_job() -> None:
    """CheckpointCoordinatorTriggeringTest.testTriggerCheckpointWithCounterIOException: an
    IO_EXCEPTION while triggering counts; with no failure tolerated the job fails."""
    h = Harness(max_concurrent=2)
    r1, _ = h.manual(0)
    r2, _ = h.manual(0)
    actions = h.step(h.cc.on_checkpoint_id_failed(r1, 1))
    assert actions[0] == RequestRefused(r1, TriggerRefusal.IO_EXCEPTION)
    assert isinstance(actions[1], FailJob)
    assert "1 consecutive failures > 0 tolerable" in actions[1].message
    assert actions[2:] == [RequestRefused(r2, TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN)]
    assert h.cc.job_failed


def test_trigger_io_exception_of_a_savepoint_or_a_fenced_coordinator_is_not_counted() -> None:
    h = Harness()
    sp, _ = h.manual(0, CheckpointKind.SAVEPOINT)
    assert h.step(h.cc.on_checkpoint_id_failed(sp, 1)) == [
        RequestRefused(sp, TriggerRefusal.IO_EXCEPTION)
    ]
    req, _ = h.manual(2)
    assert h.step(h.cc.on_checkpoint_id_failed(req, 3, count_failure=False)) == [
        RequestRefused(req, TriggerRefusal.IO_EXCEPTION)
    ]
    assert h.cc.failure_manager.consecutive_failures == 0 and not h.cc.job_failed


def test_queue_order_savepoints_then_manual_then_periodic() -> None:
    h = Harness(max_concurrent=1)
    h.trigger(1, 0)  # occupies the only slot; the allocation is done
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    manual, _ = h.manual(1)
    h.cc.queue.append(periodic)  # a periodic request waiting behind (as after a min pause)
    sp, actions = h.manual(2, CheckpointKind.SAVEPOINT)
    # the savepoint is forced: it jumps the queue and starts at once
    assert actions == [AllocateCheckpointId(sp)]
    assert list(h.cc.queue) == [manual, periodic]
    manual2, _ = h.manual(3)
    assert list(h.cc.queue) == [manual, manual2, periodic]


def test_stop_with_savepoint_refuses_queued_checkpoints_at_once() -> None:
    h = Harness(max_concurrent=1)
    h.trigger(1, 0)
    queued, _ = h.manual(1)
    stop, actions = h.manual(2, CheckpointKind.SAVEPOINT_SUSPEND)
    assert actions == [
        RequestRefused(queued, TriggerRefusal.STOP_WITH_SAVEPOINT_PENDING),
        AllocateCheckpointId(stop),
    ]
    assert list(h.cc.queue) == []


def test_queue_is_bounded() -> None:
    h = Harness()
    h.cc.max_queued_requests = 2
    h.trigger(1, 0)
    h.manual(1)
    h.manual(2)
    r, actions = h.manual(3)
    assert actions == [RequestRefused(r, TriggerRefusal.TOO_MANY_CHECKPOINT_REQUESTS)]


def test_shutdown_aborts_pending_without_counting() -> None:
    h = Harness(tolerable_failures=0)
    r1 = h.trigger(1, 0)
    actions = h.step(h.cc.shut_down(AbortReason.JOB_CANCELED, 5))
    assert actions == [
        CheckpointAborted(
            1,
            r1,
            AbortReason.JOB_CANCELED,
            AbortReason.JOB_CANCELED.value,
            5,
            0,
            "/cp/job/chk-1",
            (),
        ),
        NotifyAborted(1, ALL, AbortReason.JOB_CANCELED),
    ]
    r2, actions = h.manual(6)
    assert actions == [RequestRefused(r2, TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN)]


def test_restore_completed_continues_ids_and_protects_state() -> None:
    h = Harness()
    old = CompletedCheckpoint("job", 41, CheckpointKind.CHECKPOINT, 0, 1, "/cp/job/chk-41", ())
    h.cc.restore_completed([old], [])
    assert h.cc.highest_id == 41
    req, _ = h.manual(0)
    with pytest.raises(ValueError, match="must strictly increase: 41 after 41"):
        h.cc.on_checkpoint_id(req, 41, "/x", 0)


@pytest.mark.parametrize("seed", range(30))
def test_random_event_sequences_keep_invariants(seed: int) -> None:
    """Fuzz the core with random but valid event orders; invariants hold after every step."""
    rng = random.Random(seed)
    h = Harness(
        max_concurrent=rng.choice([1, 2, 3]),
        min_pause_ms=rng.choice([0, 20]),
        interval_ms=rng.choice([0, 30]),
        timeout_ms=rng.choice([40, 200]),
        tolerable_failures=rng.choice([None, 0, 3]),
        retained=rng.choice([1, 2]),
    )
    h.cc.on_tasks_running(0)
    now = 0
    next_id = 1
    finalizing: list[FinalizeCheckpoint] = []
    for _ in range(300):
        now += rng.randint(0, 15)
        choice = rng.random()
        actions: list = []
        if choice < 0.15:
            _, actions = h.manual(
                now, rng.choice([CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT])
            )
        elif choice < 0.55 and h.cc.pending:
            cid = rng.choice(sorted(h.cc.pending))
            _, actions = h.ack(rng.choice(ALL), cid, now, (f"/s/{cid}/{rng.randint(0, 3)}",))
        elif choice < 0.6 and h.cc.pending:
            actions = h.step(
                h.cc.on_decline(rng.choice(ALL), rng.choice(sorted(h.cc.pending)), "x", now)
            )
        elif choice < 0.75 and finalizing:
            f = finalizing.pop(0)
            if f.checkpoint.checkpoint_id in h.cc.pending:
                if rng.random() < 0.9:
                    retained = [c for c in h.cc.completed]
                    keep = f.retained - 1 if not f.checkpoint.kind.is_savepoint else len(retained)
                    dropped = (
                        [c.checkpoint_id for c in retained[: max(0, len(retained) - keep)]]
                        if not f.checkpoint.kind.is_savepoint
                        else []
                    )
                    actions = h.step(
                        h.cc.on_checkpoint_committed(
                            replace(f.checkpoint, completion_timestamp_ms=now), dropped, now
                        )
                    )
                else:
                    actions = h.step(h.cc.on_finalize_failed(f.checkpoint.checkpoint_id, "io", now))
        elif choice < 0.8:
            h.ack(rng.choice(ALL), rng.randint(1, next_id + 2), now, ("/junk",))
        else:
            actions = h.step(h.cc.on_tick(now))
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, AllocateCheckpointId):
                queue.extend(h.allocate(action.request, next_id, now))
                next_id += 1
            elif isinstance(action, FinalizeCheckpoint):
                finalizing.append(action)
            elif isinstance(action, DiscardState):
                referenced = {p for c in h.cc.completed + h.cc.savepoints for p in c.state_paths()}
                assert not set(action.paths) & referenced, (
                    "discarding state of a completed checkpoint"
                )
        if h.cc.job_failed:
            break


# --- Flink's scenarios, ported (Flink 1.18 and 1.20: CheckpointRequestDecider, Coordinator) ---


def test_savepoint_with_unaligned_checkpoints_queues_at_max_concurrent() -> None:
    """Flink forces a savepoint only when unaligned checkpoints are off
    (``forSavepoint(!unalignedCheckpointsEnabled, ...)``); CheckpointRequestDeciderTest.
    testNonForcedEnqueueOnTooManyPending: the savepoint waits, first in the queue, and the
    unaligned checkpoint in flight is not aborted by its barriers."""
    h = Harness(mode=CheckpointMode.UNALIGNED, max_concurrent=1)
    r1 = h.trigger(1, 0)
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    assert h.step(h.cc.request(periodic, 1)) == []
    sp, actions = h.manual(2, CheckpointKind.SAVEPOINT, "/sp")
    assert actions == []
    assert list(h.cc.queue) == [sp, periodic] and h.cc.pending_count() == 1
    cp, actions = h.complete(1, 10)
    assert actions == [
        CheckpointCompleted(cp, r1, ()),
        NotifyComplete(1, ALL),
        AllocateCheckpointId(sp),
    ]
    send = h.allocate(sp, 2, 11)[1]
    assert isinstance(send, SendTrigger)
    assert send.options == BarrierOptions(
        CheckpointKind.SAVEPOINT, CheckpointMode.ALIGNED, 0, "/cp/job/chk-2", INLINE
    )
    assert list(h.cc.queue) == [periodic]


def test_the_barriers_carry_the_configured_inline_state_threshold() -> None:
    for threshold in (0, 4096):
        for kind in (CheckpointKind.CHECKPOINT, CheckpointKind.SAVEPOINT):
            h = Harness(inline_state_threshold_bytes=threshold)
            req, _ = h.manual(10, kind, "/sp" if kind.is_savepoint else "")
            send = h.allocate(req, 1, 11)[1]
            assert isinstance(send, SendTrigger)
            assert send.options.inline_state_threshold_bytes == threshold


def test_savepoint_is_forced_only_without_unaligned_checkpoints() -> None:
    sp = TriggerRequest(1, CheckpointKind.SAVEPOINT)
    stop = TriggerRequest(2, CheckpointKind.SAVEPOINT_SUSPEND)
    manual = TriggerRequest(3, CheckpointKind.CHECKPOINT)
    for mode, aligned_timeout, forced in [
        (CheckpointMode.ALIGNED, 0, True),
        (CheckpointMode.AT_LEAST_ONCE, 0, True),
        (CheckpointMode.UNALIGNED, 0, False),
        # Flink's aligned-with-timeout is unaligned checkpoints enabled: savepoints not forced
        (CheckpointMode.ALIGNED, 100, False),
    ]:
        cc = Harness(mode=mode, aligned_checkpoint_timeout_ms=aligned_timeout).cc
        assert [cc.is_forced(r) for r in (sp, stop, manual)] == [forced, forced, False]


def test_savepoint_with_aligned_timeout_queues_behind_the_checkpoint_in_flight() -> None:
    h = Harness(aligned_checkpoint_timeout_ms=100, max_concurrent=1)
    r1 = h.trigger(1, 0)
    sp, actions = h.manual(1, CheckpointKind.SAVEPOINT, "/sp")
    assert actions == [] and list(h.cc.queue) == [sp]
    cp, actions = h.complete(1, 10)
    assert actions == [
        CheckpointCompleted(cp, r1, ()),
        NotifyComplete(1, ALL),
        AllocateCheckpointId(sp),
    ]
    send = h.allocate(sp, 2, 11)[1]
    assert isinstance(send, SendTrigger)
    assert send.options == BarrierOptions(
        CheckpointKind.SAVEPOINT, CheckpointMode.ALIGNED, 0, "/cp/job/chk-2", INLINE
    )


def test_periodic_period_is_at_least_the_minimum_pause_at_a_fixed_rate() -> None:
    """Flink's CheckpointCoordinator: ``baseInterval = max(interval, minPause)``, the first
    delay uniform in [min pause, base interval], then a fixed rate from the scheduled time."""
    h = Harness(interval_ms=100, min_pause_ms=300)
    h.cc.on_tasks_running(now_ms=0)
    first = random.Random(7).randint(300, 300)
    assert h.cc.next_periodic_ms == first == 300
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    assert h.step(h.cc.on_tick(310)) == [AllocateCheckpointId(periodic)]
    assert h.cc.next_periodic_ms == 600  # the scheduled time + 300, not the tick's
    # A tick that comes late by more than a period skips the missed one.
    assert h.cc.triggering is not None
    h.allocate(h.cc.triggering, 1, 311)
    h.complete(1, 320)
    assert h.step(h.cc.on_tick(1250)) == [AllocateCheckpointId(periodic)]
    assert h.cc.next_periodic_ms == 1500


def test_non_forced_savepoint_ignores_the_minimum_pause() -> None:
    """CheckpointRequestDeciderTest.testSavepointTiming: every savepoint, forced or not,
    triggers immediately during the minimum pause."""
    h = Harness(mode=CheckpointMode.UNALIGNED, min_pause_ms=10_000)
    h.trigger(1, 0)
    h.complete(1, 10)
    sp, actions = h.manual(20, CheckpointKind.SAVEPOINT, "/sp")
    assert actions == [AllocateCheckpointId(sp)]


def test_a_savepoint_completion_starts_the_minimum_pause_and_clears_failures() -> None:
    """Flink's completePendingCheckpoint: every completion, savepoints included, sets the
    last completion time and reports the success to the failure manager."""
    h = Harness(min_pause_ms=500, tolerable_failures=2, timeout_ms=10)
    h.trigger(1, 0)
    h.step(h.cc.on_tick(10))  # 1 expires: counted
    assert h.cc.failure_manager.consecutive_failures == 1
    h.trigger(2, 20, CheckpointKind.SAVEPOINT)
    h.complete(2, 30)
    assert h.cc.failure_manager.consecutive_failures == 0
    assert h.cc.last_completion_ms == 30
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    assert h.step(h.cc.request(periodic, 100)) == [
        RequestRefused(periodic, TriggerRefusal.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
    ]


def test_an_intermediate_savepoint_does_not_subsume_older_checkpoints() -> None:
    """Flink 1.15+: only checkpoints and stop-with-savepoint drop older pending checkpoints
    (``!props.isSavepoint() || props.isSynchronous()``)."""
    h = Harness(max_concurrent=3)
    h.trigger(1, 0)
    sp = h.trigger(2, 1, CheckpointKind.SAVEPOINT)
    cp, actions = h.complete(2, 5)
    assert actions == [CheckpointCompleted(cp, sp, ())]
    assert sorted(h.cc.pending) == [1]
    h2 = Harness(max_concurrent=3)
    r1 = h2.trigger(1, 0)
    stop = h2.trigger(2, 1, CheckpointKind.SAVEPOINT_SUSPEND)
    cp, actions = h2.complete(2, 5)
    assert actions == [
        CheckpointAborted(
            1, r1, AbortReason.SUBSUMED, "subsumed by checkpoint 2", 5, 0, "/cp/job/chk-1", ()
        ),
        NotifyAborted(1, ALL, AbortReason.SUBSUMED),
        CheckpointCompleted(cp, stop, ()),
        EndCommitted(2, ALL),
        NotifyComplete(2, ALL),
    ]


def test_queue_full_of_periodic_requests_drops_the_newest() -> None:
    """CheckpointRequestDeciderTest.testQueueSizeLimit: while triggering, periodic requests
    queue up to the limit; beyond it the lowest ranked (the newest periodic one) is dropped."""
    h = Harness()
    h.cc.max_queued_requests = 3
    busy, _ = h.manual(0)  # triggering: everything after it queues
    periodic = [TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True) for _ in range(5)]
    for i, p in enumerate(periodic):
        actions = h.step(h.cc.request(p, i))
        if i < 3:
            assert actions == []
        else:
            assert actions == [RequestRefused(p, TriggerRefusal.TOO_MANY_CHECKPOINT_REQUESTS)]
            assert actions[0].request is p
    assert [id(r) for r in h.cc.queue] == [id(p) for p in periodic[:3]]
    assert h.cc.triggering is busy


def test_full_queue_drops_a_periodic_request_to_admit_a_savepoint() -> None:
    """CheckpointRequestDeciderTest.testQueueSizeLimitPriority."""
    h = Harness()
    h.cc.max_queued_requests = 1
    h.manual(0)  # triggering
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    assert h.step(h.cc.request(periodic, 1)) == []
    sp, actions = h.manual(2, CheckpointKind.SAVEPOINT, "/sp")
    assert actions == [RequestRefused(periodic, TriggerRefusal.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert list(h.cc.queue) == [sp]


def test_full_queue_of_user_requests_refuses_even_a_savepoint() -> None:
    """Flink retains queued user requests and drops the new one."""
    h = Harness()
    h.cc.max_queued_requests = 1
    h.manual(0)  # triggering
    queued, _ = h.manual(1)
    sp, actions = h.manual(2, CheckpointKind.SAVEPOINT, "/sp")
    assert actions == [RequestRefused(sp, TriggerRefusal.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert list(h.cc.queue) == [queued]


def test_a_decline_starts_the_queued_request_at_once() -> None:
    """Flink's abortPendingCheckpoint ends with executeQueuedRequest."""
    h = Harness(max_concurrent=1, tolerable_failures=1)
    h.trigger(1, 0)
    queued, _ = h.manual(1)
    actions = h.step(h.cc.on_decline(SINK0, 1, "x", 2, DeclineReason.SUBSUMED))
    assert [type(a) for a in actions] == [CheckpointAborted, NotifyAborted, AllocateCheckpointId]
    assert actions[-1] == AllocateCheckpointId(queued)


def test_trigger_preparation_that_hangs_expires_and_never_triggers() -> None:
    h = Harness(timeout_ms=100, tolerable_failures=1, max_concurrent=2)
    req, actions = h.manual(0)
    assert actions == [AllocateCheckpointId(req)]
    queued, _ = h.manual(5)
    assert h.cc.next_deadline_ms() == 100
    assert h.step(h.cc.on_tick(99)) == []
    assert h.step(h.cc.on_tick(100)) == [
        RequestRefused(req, TriggerRefusal.CHECKPOINT_EXPIRED),
        AllocateCheckpointId(queued),
    ]
    assert h.cc.failure_manager.consecutive_failures == 1
    assert not h.cc.is_triggering(req) and h.cc.is_triggering(queued)
    assert h.cc.next_deadline_ms() == 200
    # The hung allocation answers at last: the id is burnt, no trigger is sent.
    assert h.allocate(req, 1, 150) == []
    assert h.cc.pending == {} and h.cc.highest_id == 1
    result, actions = h.ack(SRC0, 1, 151, ("/late",))
    assert result is AckResult.DISCARDED
    # The queued request's own allocation triggers normally, with the next id.
    assert [type(a) for a in h.allocate(queued, 2, 160)] == [CheckpointTriggered, SendTrigger]
    assert h.cc.next_deadline_ms() == 260  # checkpoint 2 expires 100 ms after its trigger


def test_trigger_preparation_expiry_counts_and_fails_without_tolerance() -> None:
    h = Harness(timeout_ms=100)
    req, _ = h.manual(0)
    actions = h.step(h.cc.on_tick(100))
    assert actions[0] == RequestRefused(req, TriggerRefusal.CHECKPOINT_EXPIRED)
    assert isinstance(actions[1], FailJob) and len(actions) == 2
    # A late failure of the expired preparation is ignored (it was reported at the expiry).
    assert h.step(h.cc.on_checkpoint_id_failed(req, 200)) == []


def test_expired_stop_with_savepoint_preparation_resumes_periodic_checkpoints() -> None:
    h = Harness(timeout_ms=100, interval_ms=1000)
    h.cc.on_tasks_running(0)
    stop, _ = h.manual(10, CheckpointKind.SAVEPOINT_SUSPEND)
    assert h.cc.stopping_with_savepoint and h.cc.next_periodic_ms is None
    assert h.step(h.cc.on_tick(110)) == [RequestRefused(stop, TriggerRefusal.CHECKPOINT_EXPIRED)]
    assert not h.cc.stopping_with_savepoint and h.cc.next_periodic_ms == 1110
    assert not h.cc.job_failed  # savepoint failures never count


def test_checkpoint_ids_start_at_1_and_unknown_answers_are_refused_loudly() -> None:
    h = Harness()
    req, _ = h.manual(0)
    with pytest.raises(ValueError, match="checkpoint ids start at 1"):
        h.cc.on_checkpoint_id(req, 0, "/cp/job/chk-0", 0)
    stranger = TriggerRequest(99, CheckpointKind.CHECKPOINT)
    with pytest.raises(ValueError, match="no trigger preparation under way"):
        h.cc.on_checkpoint_id(stranger, 1, "/cp/job/chk-1", 0)
    with pytest.raises(ValueError, match="no trigger preparation under way"):
        h.cc.on_checkpoint_id_failed(stranger, 0)
    h.cc.check_invariants()
    for cid in (0, -1):
        result, actions = h.ack(SRC0, cid, 1, ("/x",))
        assert result is AckResult.UNKNOWN
        assert actions == [DiscardState(("/x",), "ack for an unknown checkpoint")]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_concurrent": 0}, "max_concurrent must be >= 1, got 0"),
        ({"timeout_ms": 0}, "timeout_ms 0 is below the minimum of 10 ms"),
        ({"retained": 0}, "retained must be >= 1, got 0"),
        ({"min_pause_ms": -1}, "min_pause_ms must be >= 0, got -1"),
        ({"interval_ms": -5}, "interval_ms must be >= 0, got -5"),
        ({"tolerable_failures": -1}, "tolerable_failures must be >= 0, got -1"),
        ({"aligned_checkpoint_timeout_ms": -1}, "aligned_checkpoint_timeout_ms must be >= 0"),
    ],
)
def test_edge_values_of_the_config_are_refused_loudly(config: dict, message: str) -> None:
    # The config refuses them itself (snapflow.checkpoint_config), before a core exists.
    with pytest.raises(InvalidArgumentError, match=message):
        Harness(**config)
    with pytest.raises(ValueError, match="max_queued_requests 0 must be at least 1"):
        CheckpointCoordinator(
            "job", GRAPH, CheckpointConfig(), FakeTasks(), random.Random(1), max_queued_requests=0
        )


def _complete_final(h: Harness, cid: int, now: int) -> tuple[CompletedCheckpoint, list]:
    """Every subtask acks ``cid``, the sources with their input ended: a final checkpoint."""
    finalize = None
    for attempt in ALL:
        result, actions = h.cc.on_ack(
            attempt, cid, (), SubtaskMetrics(), now, input_ended=attempt.vertex_id == "src"
        )
        h.cc.check_invariants()
        assert result is AckResult.SUCCESS
        finalize = next((a for a in actions if isinstance(a, FinalizeCheckpoint)), finalize)
    assert finalize is not None
    return finalize.checkpoint, h.step(h.cc.on_checkpoint_committed(finalize.checkpoint, [], now))


def test_a_final_checkpoint_refuses_the_requests_queued_behind_it() -> None:
    """Without periodic checkpoints each source asks for one when its input ends; two that
    end together queue two requests. The first, final, covers both; the second would only be
    aborted when the tasks end, so it is refused (no second checkpoint, no abort)."""
    h = Harness(max_concurrent=1)
    first = h.trigger(1, now=10)
    second, actions = h.manual(now=11)
    assert actions == []  # queued behind the pending one
    cp, actions = _complete_final(h, 1, now=20)
    assert actions == [
        CheckpointCompleted(cp, first, ()),
        EndCommitted(1, ALL),
        NotifyComplete(1, ALL, final=True),
        RequestRefused(second, TriggerRefusal.FINAL_CHECKPOINT_COMPLETED),
    ]
    assert not h.cc.queue and not h.cc.pending


def test_a_checkpoint_that_is_not_final_starts_the_next_request() -> None:
    h = Harness(max_concurrent=1)
    h.trigger(1, now=10)
    second, _ = h.manual(now=11)
    _, actions = h.complete(1, now=20)  # no source reported the end of its input
    assert actions[-1] == AllocateCheckpointId(second)


def _source_ended(h: Harness, attempt: ExecutionAttempt, now: int) -> tuple[TriggerRequest, list]:
    """``attempt``'s input ended: it asks for the job's final checkpoint (the agents do in a job
    without periodic checkpoints)."""
    req = TriggerRequest(h.next_request_id, CheckpointKind.CHECKPOINT, input_ended=attempt)
    h.next_request_id += 1
    return req, h.step(h.cc.request(req, now))


def test_the_final_checkpoint_waits_for_every_source_and_answers_them_all() -> None:
    """Each source asks as its input ends; one checkpoint, triggered when the last one asked,
    answers both (without the hold, the first source's request took a checkpoint of its own
    while the other still ran: two checkpoints at the end of the job)."""
    h = Harness()
    first, actions = _source_ended(h, SRC1, now=10)
    assert actions == [] and h.cc.held == {SRC1: first} and h.cc.triggering is None
    last, actions = _source_ended(h, SRC0, now=20)
    assert actions == [AllocateCheckpointId(last)] and h.cc.held == {SRC1: first}
    h.allocate(last, 1, now=21)
    cp, actions = _complete_final(h, 1, now=30)
    assert actions == [
        CheckpointCompleted(cp, last, ()),
        EndCommitted(1, ALL),
        NotifyComplete(1, ALL, final=True),
        RequestCovered(first, cp),
    ]
    assert not h.cc.held and not h.cc.queue and not h.cc.pending


def test_a_failed_final_checkpoint_keeps_the_held_requests_and_the_next_one_answers_them() -> None:
    h = Harness(tolerable_failures=1)
    first, _ = _source_ended(h, SRC0, now=10)
    last, _ = _source_ended(h, SRC1, now=11)
    h.allocate(last, 1, now=12)
    actions = h.step(h.cc.on_tick(12 + 1000))  # expired
    assert [type(a) for a in actions] == [CheckpointAborted, NotifyAborted]
    assert h.cc.held == {SRC0: first}
    # The last source asks again (its call failed): every source ended, so it triggers at once.
    again, actions = _source_ended(h, SRC1, now=1100)
    assert actions == [AllocateCheckpointId(again)]
    h.allocate(again, 2, now=1101)
    cp, actions = _complete_final(h, 2, now=1110)
    assert actions[-1] == RequestCovered(first, cp) and not h.cc.held


def test_a_source_asking_again_replaces_its_held_request() -> None:
    h = Harness()
    old, _ = _source_ended(h, SRC0, now=10)
    new, actions = _source_ended(h, SRC0, now=20)
    assert actions == [RequestRefused(old, TriggerRefusal.ASKED_AGAIN)]
    assert h.cc.held == {SRC0: new}


def test_held_requests_are_refused_on_failover_and_the_next_deployment_starts_afresh() -> None:
    h = Harness()
    held, _ = _source_ended(h, SRC0, now=10)
    h.tasks.running = False
    actions = h.step(h.cc.on_tasks_not_running(20, "task failed"))
    assert actions == [RequestRefused(held, TriggerRefusal.NOT_ALL_REQUIRED_TASKS_RUNNING)]
    assert not h.cc.held and not h.cc.ended_sources
    h.tasks.running = True
    h.step(h.cc.on_tasks_running(30))
    # SRC0's earlier request no longer counts: SRC1 alone is held.
    req, actions = _source_ended(h, SRC1, now=40)
    assert actions == [] and h.cc.held == {SRC1: req}


def test_a_request_naming_no_running_source_is_refused() -> None:
    h = Harness()
    for attempt in (ExecutionAttempt("src", 0, 2), SINK0, ExecutionAttempt("src", 7, 1)):
        req, actions = _source_ended(h, attempt, now=10)
        assert actions == [RequestRefused(req, TriggerRefusal.NOT_A_RUNNING_SOURCE)]
    assert not h.cc.held and not h.cc.ended_sources


def test_held_requests_are_refused_when_the_coordinator_shuts_down() -> None:
    h = Harness()
    held, _ = _source_ended(h, SRC0, now=10)
    actions = h.step(h.cc.shut_down(AbortReason.JOB_CANCELED, 20))
    assert actions == [RequestRefused(held, TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN)]
    assert not h.cc.held


def test_only_a_checkpoint_that_ends_the_tasks_commits_the_end() -> None:
    """``EndCommitted`` (the job may finish once its tasks do) follows the final checkpoint and
    a stop-with-savepoint, never an ordinary checkpoint nor an intermediate savepoint; a
    checkpoint in which only some sources had ended is not final."""
    h = Harness(retained=4)
    h.trigger(1, now=10)
    _, actions = h.complete(1, now=20)
    assert not any(isinstance(a, EndCommitted) for a in actions)
    h.trigger(2, now=30, kind=CheckpointKind.SAVEPOINT)
    _, actions = h.complete(2, now=40)
    assert not any(isinstance(a, EndCommitted) for a in actions)
    h.trigger(3, now=50)
    for attempt in ALL:  # only SRC0's input ended
        _, actions = h.cc.on_ack(attempt, 3, (), SubtaskMetrics(), 60, input_ended=attempt == SRC0)
    assert isinstance(actions[-1], FinalizeCheckpoint)
    actions = h.step(h.cc.on_checkpoint_committed(actions[-1].checkpoint, [], 60))
    assert not any(isinstance(a, EndCommitted) for a in actions)
    h.trigger(4, now=70)
    cp4, actions = _complete_final(h, 4, now=80)
    assert actions[:3] == [
        CheckpointCompleted(cp4, actions[0].request, ()),
        EndCommitted(4, ALL),
        NotifyComplete(4, ALL, final=True),
    ]


# --- the end of input: no checkpoint waits behind it -------------------------------------------


def _data_ended(h: Harness, attempt: ExecutionAttempt, now: int) -> list:
    h.tasks.data_ended = h.tasks.data_ended | {attempt}
    return h.step(h.cc.on_task_data_ended(now))


def test_periodic_checkpoints_wait_while_a_task_ends_its_input_and_the_final_one_follows_at_once() -> (
    None
):
    """Every source ended, the sink still fires its last timers: a checkpoint now would only
    wait behind them (q4 and q9 of Nexmark: 10 s). Periodic requests are refused with a named
    reason; the sink's report triggers the final checkpoint at once, not at the next period."""
    h = Harness(interval_ms=100, timeout_ms=60_000)
    h.step(h.cc.on_tasks_running(0))
    first = h.cc.next_periodic_ms
    assert first is not None
    assert _data_ended(h, SRC0, now=first - 5) == []  # one source still runs: nothing changes
    assert h.cc.ending_since_ms is None
    assert _data_ended(h, SRC1, now=first - 1) == []
    assert h.cc.ending_since_ms == first - 1
    periodic = TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True)
    for k in range(3):
        assert h.step(h.cc.on_tick(first + 100 * k)) == [
            RequestRefused(periodic, TriggerRefusal.TASKS_ENDING_INPUT)
        ]
    assert not h.cc.pending and h.cc.triggering is None
    actions = _data_ended(h, SINK0, now=first + 250)
    assert actions == [AllocateCheckpointId(periodic)]
    assert h.cc.ending_since_ms is None and h.cc.data_ended
    assert h.cc.next_periodic_ms == first + 350  # the period goes on from the final trigger
    # Later reports change nothing (the final checkpoint is under way).
    assert _data_ended(h, SINK0, now=first + 260) == []


def test_a_manual_request_waits_in_the_queue_until_every_task_ended_its_data() -> None:
    h = Harness(timeout_ms=60_000)
    _data_ended(h, SRC0, now=1)
    _data_ended(h, SRC1, now=2)
    req, actions = h.manual(10)
    assert actions == [] and list(h.cc.queue) == [req]
    assert h.cc.next_deadline_ms() == 2 + 60_000
    assert _data_ended(h, SINK0, now=20) == [AllocateCheckpointId(req)]
    assert not h.cc.queue


def test_the_final_checkpoint_request_of_ended_sources_waits_for_the_other_tasks() -> None:
    """Without periodic checkpoints the ended sources ask for the final checkpoint; it too is
    held until every task ended its data."""
    h = Harness(timeout_ms=60_000)
    _data_ended(h, SRC0, now=1)
    first, _ = _source_ended(h, SRC0, now=2)
    _data_ended(h, SRC1, now=3)
    last, actions = _source_ended(h, SRC1, now=4)
    assert actions == [] and list(h.cc.queue) == [last] and h.cc.held == {SRC0: first}
    assert _data_ended(h, SINK0, now=50) == [AllocateCheckpointId(last)]
    h.allocate(last, 1, now=51)
    cp, actions = _complete_final(h, 1, now=60)
    assert actions[-1] == RequestCovered(first, cp)


def test_a_task_that_never_reports_holds_checkpoints_for_at_most_the_timeout() -> None:
    """A lost report must not keep the job from ending: after the checkpoint timeout the
    checkpoints go ahead as before."""
    h = Harness(timeout_ms=1000)
    _data_ended(h, SRC0, now=0)
    _data_ended(h, SRC1, now=10)
    req, actions = h.manual(20)
    assert actions == []
    assert h.cc.next_deadline_ms() == 1010
    assert h.step(h.cc.on_tick(1009)) == []
    assert h.step(h.cc.on_tick(1010)) == [AllocateCheckpointId(req)]


def test_savepoints_are_not_held_by_the_end_of_input() -> None:
    h = Harness(timeout_ms=60_000)
    _data_ended(h, SRC0, now=0)
    _data_ended(h, SRC1, now=1)
    req, actions = h.manual(5, kind=CheckpointKind.SAVEPOINT)
    assert actions == [AllocateCheckpointId(req)]


def test_a_failover_forgets_which_tasks_ended_their_data() -> None:
    h = Harness(interval_ms=100, timeout_ms=60_000)
    h.step(h.cc.on_tasks_running(0))
    _data_ended(h, SRC0, now=1)
    _data_ended(h, SRC1, now=2)
    assert h.cc.ending_since_ms == 2
    h.tasks.running = False
    h.step(h.cc.on_tasks_not_running(5, "task failed"))
    assert h.cc.ending_since_ms is None and not h.cc.data_ended
    h.tasks.running, h.tasks.data_ended = True, frozenset()
    h.step(h.cc.on_tasks_running(10))
    assert h.cc.next_periodic_ms is not None
    actions = h.step(h.cc.on_tick(h.cc.next_periodic_ms))
    assert actions == [
        AllocateCheckpointId(TriggerRequest(0, CheckpointKind.CHECKPOINT, periodic=True))
    ]

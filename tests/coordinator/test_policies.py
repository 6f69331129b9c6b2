"""The pure policies of the coordinator: where a deployment restores from, and what a decline
does. Exact inputs and decisions; ``check_invariants`` after every event of the core."""

from __future__ import annotations

import random

import pytest

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.coordinator.checkpoint_coordinator import (
    AllocateCheckpointId,
    CheckpointAborted,
    CheckpointCoordinator,
    DeclineReason,
    FailJob,
    NotifyAborted,
    RequestRefused,
    TriggerRequest,
)
from snapflow.coordinator.checkpoint_failure_manager import abort_reason_for_decline
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    JobGraph,
    JobVertex,
    OperatorSubtaskState,
    StateHandle,
    SubtaskAck,
    SubtaskMetrics,
    TriggerRefusal,
)
from snapflow.coordinator.restore_point import (
    FreshStart,
    RestoreFromPath,
    RestoreFromSnapshot,
    RestorePlan,
    RestorePoint,
    choose_restore_point,
    latest_restorable,
)
from snapflow.errors import CheckpointNotFoundError

SRC = ExecutionAttempt("src", 0, 1)
GRAPH = JobGraph("g", (JobVertex("src", "source", 1, is_source=True),), ())


def snapshot(
    checkpoint_id: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT, path: str = ""
) -> CompletedCheckpoint:
    handle = StateHandle(f"/cp/job/chk-{checkpoint_id}/state", 10)
    ack = SubtaskAck(SRC, 1, (OperatorSubtaskState("op", (handle,)),), SubtaskMetrics())
    return CompletedCheckpoint(
        "job", checkpoint_id, kind, 0, 1, path or f"/cp/job/chk-{checkpoint_id}", (ack,)
    )


CHK_3 = snapshot(3)
CHK_5 = snapshot(5)
SAVEPOINT_6 = snapshot(6, CheckpointKind.SAVEPOINT, "/sp/savepoint-6")
STOP_7 = snapshot(7, CheckpointKind.SAVEPOINT_SUSPEND, "/sp/savepoint-7")
STOP_4 = snapshot(4, CheckpointKind.SAVEPOINT_TERMINATE, "/sp/savepoint-4")


# --- restore point --------------------------------------------------------------------------


def test_latest_restorable_skips_intermediate_savepoints() -> None:
    assert latest_restorable([], []) is None
    assert latest_restorable([CHK_3, CHK_5], [SAVEPOINT_6]) == CHK_5
    assert latest_restorable([CHK_5], [SAVEPOINT_6, STOP_7]) == STOP_7
    assert latest_restorable([CHK_5], [STOP_4]) == CHK_5  # an older stop-with-savepoint
    assert latest_restorable([], [SAVEPOINT_6]) is None


@pytest.mark.parametrize(
    ("plan", "completed", "savepoints", "expected"),
    [
        # 5. nothing asked, nothing completed in this run: fresh state
        (RestorePlan(), [], [], FreshStart()),
        (RestorePlan(run_start_checkpoint_id=5), [CHK_5], [], FreshStart()),
        # 1. a snapshot this run completed wins over every explicit source
        (RestorePlan(), [CHK_5], [], RestoreFromSnapshot(CHK_5)),
        (
            RestorePlan(run_start_checkpoint_id=3, savepoint_path="/sp/x", checkpoint_id=3),
            [CHK_3, CHK_5],
            [],
            RestoreFromSnapshot(CHK_5),
        ),
        (RestorePlan(run_start_checkpoint_id=5), [CHK_5], [STOP_7], RestoreFromSnapshot(STOP_7)),
        # ... but never an intermediate savepoint
        (RestorePlan(run_start_checkpoint_id=5), [CHK_5], [SAVEPOINT_6], FreshStart()),
        # 2. the run's savepoint path (its _metadata is read by the shell)
        (
            RestorePlan(run_start_checkpoint_id=5, savepoint_path="/sp/x"),
            [CHK_5],
            [],
            RestoreFromPath("/sp/x"),
        ),
        # 3. the run's checkpoint id, a retained checkpoint or a recorded savepoint
        (
            RestorePlan(run_start_checkpoint_id=5, checkpoint_id=3),
            [CHK_3, CHK_5],
            [],
            RestoreFromSnapshot(CHK_3),
        ),
        (
            RestorePlan(run_start_checkpoint_id=6, checkpoint_id=6),
            [CHK_5],
            [SAVEPOINT_6],
            RestoreFromSnapshot(SAVEPOINT_6),
        ),
        # 4. latest: the newest restorable snapshot, even from before this run
        (
            RestorePlan(run_start_checkpoint_id=7, latest=True),
            [CHK_5],
            [STOP_7],
            RestoreFromSnapshot(STOP_7),
        ),
        (RestorePlan(run_start_checkpoint_id=5, latest=True), [], [], FreshStart()),
        (
            RestorePlan(run_start_checkpoint_id=6, latest=True),
            [CHK_5],
            [SAVEPOINT_6],
            RestoreFromSnapshot(CHK_5),
        ),
    ],
)
def test_choose_restore_point_first_match_wins(
    plan: RestorePlan,
    completed: list[CompletedCheckpoint],
    savepoints: list[CompletedCheckpoint],
    expected: object,
) -> None:
    assert choose_restore_point(plan, "job", completed, savepoints) == expected


def test_choose_restore_point_refuses_a_checkpoint_no_longer_retained() -> None:
    plan = RestorePlan(run_start_checkpoint_id=5, checkpoint_id=3)
    with pytest.raises(CheckpointNotFoundError, match="checkpoint 3 of job job is not retained"):
        choose_restore_point(plan, "job", [CHK_5], [])


def test_restore_point_of_a_snapshot_says_whether_it_is_a_savepoint() -> None:
    assert RestorePoint.of(CHK_5) == RestorePoint(CHK_5, is_savepoint=False)
    assert RestorePoint.of(STOP_7) == RestorePoint(STOP_7, is_savepoint=True)


class Tasks:
    running = True

    def all_running(self) -> bool:
        return self.running

    def current_attempts(self) -> list[ExecutionAttempt]:
        return [SRC]

    def source_attempts(self) -> list[ExecutionAttempt]:
        return [SRC]

    def every_source_data_ended(self) -> bool:
        return False

    def all_data_ended(self) -> bool:
        return False


def core(**config: object) -> CheckpointCoordinator:
    cfg = CheckpointConfig(**{"timeout_ms": 1000, **config})  # type: ignore[arg-type]
    cc = CheckpointCoordinator("job", GRAPH, cfg, Tasks(), random.Random(1))
    cc.check_invariants()
    return cc


def test_core_recovery_events_and_restore_choice() -> None:
    cc = core(retained=2)
    # Recovery: two retained checkpoints, a stop-with-savepoint, and lost pending ids up to 9.
    cc.restore_completed([CHK_5, CHK_3], [STOP_7], highest_id=9)
    cc.check_invariants()
    assert cc.highest_id == 9 and cc.retained_ids() == [3, 5, 7]
    assert cc.find_snapshot(7) == STOP_7 and cc.find_snapshot(4) is None
    assert cc.snapshot_dirs() == ["/cp/job/chk-3", "/cp/job/chk-5", "/sp/savepoint-7"]
    assert cc.savepoint_dirs() == ["/sp/savepoint-7"]
    assert cc.choose_restore_point(RestorePlan()) == RestoreFromSnapshot(STOP_7)
    assert cc.choose_restore_point(
        RestorePlan(run_start_checkpoint_id=9, checkpoint_id=3)
    ) == RestoreFromSnapshot(CHK_3)
    # A late ack for a lost pending id is DISCARDED (the id was handed out).
    result, _ = cc.on_ack(SRC, 8, (), SubtaskMetrics(), 1)
    cc.check_invariants()
    assert result is AckResult.DISCARDED
    # Disposing the savepoint forgets it, and failover falls back to the checkpoint.
    cc.on_savepoint_disposed(7)
    cc.check_invariants()
    assert cc.retained_ids() == [3, 5] and cc.last_recorded_savepoint() is None
    assert cc.choose_restore_point(RestorePlan()) == RestoreFromSnapshot(CHK_5)


def test_a_terminal_job_starts_shut_down_until_a_deployment_starts() -> None:
    cc = core(interval_ms=100)
    cc.restore_completed([], [], job_ended=True)
    cc.check_invariants()
    request = TriggerRequest(1, CheckpointKind.CHECKPOINT)
    assert cc.request(request, 0) == [
        RequestRefused(request, TriggerRefusal.CHECKPOINT_COORDINATOR_SHUTDOWN)
    ]
    cc.check_invariants()
    assert cc.on_tasks_not_running(0, "the job is being redeployed") == []
    cc.check_invariants()
    cc.on_deployment_started()
    cc.check_invariants()
    assert cc.request(request, 0) == [AllocateCheckpointId(request)]
    cc.check_invariants()


# --- decline policy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decline", "abort"),
    [
        (DeclineReason.TASK_NOT_READY, AbortReason.TASK_NOT_READY),
        (DeclineReason.SUBSUMED, AbortReason.SUBSUMED),
        (DeclineReason.ALIGNMENT_CANCELED, AbortReason.ALIGNMENT_CANCELED),
        (DeclineReason.UNSPECIFIED, AbortReason.DECLINED),
        (DeclineReason.SNAPSHOT_FAILED, AbortReason.DECLINED),
        (DeclineReason.IO_ERROR, AbortReason.DECLINED),
    ],
)
def test_decline_policy(decline: DeclineReason, abort: AbortReason) -> None:
    assert abort_reason_for_decline(decline) is abort
    # Only the DECLINED outcome is counted by the failure manager.
    assert abort.counts_as_failure is (abort is AbortReason.DECLINED)


def _triggered(cc: CheckpointCoordinator, checkpoint_id: int, now: int) -> TriggerRequest:
    request = TriggerRequest(checkpoint_id, CheckpointKind.CHECKPOINT)
    cc.request(request, now)
    cc.check_invariants()
    cc.on_checkpoint_id(request, checkpoint_id, f"/cp/job/chk-{checkpoint_id}", now)
    cc.check_invariants()
    return request


@pytest.mark.parametrize(
    "decline",
    [DeclineReason.TASK_NOT_READY, DeclineReason.SUBSUMED, DeclineReason.ALIGNMENT_CANCELED],
)
def test_uncounted_declines_never_fail_the_job(decline: DeclineReason) -> None:
    cc = core(tolerable_failures=0)
    request = _triggered(cc, 1, 10)
    actions = cc.on_decline(SRC, 1, "not now", 20, decline)
    cc.check_invariants()
    reason = abort_reason_for_decline(decline)
    assert actions == [
        CheckpointAborted(
            1, request, reason, f"declined by {SRC}: not now", 20, 10, "/cp/job/chk-1", ()
        ),
        NotifyAborted(1, (SRC,), reason),
    ]
    assert cc.failure_manager.consecutive_failures == 0


def test_a_counted_decline_beyond_the_tolerance_fails_the_job() -> None:
    cc = core(tolerable_failures=0)
    request = _triggered(cc, 1, 10)
    actions = cc.on_decline(SRC, 1, "disk full", 20, DeclineReason.IO_ERROR)
    cc.check_invariants()
    assert actions[:2] == [
        CheckpointAborted(
            1,
            request,
            AbortReason.DECLINED,
            f"declined by {SRC}: disk full",
            20,
            10,
            "/cp/job/chk-1",
            (),
        ),
        NotifyAborted(1, (SRC,), AbortReason.DECLINED),
    ]
    assert isinstance(actions[2], FailJob) and len(actions) == 3
    assert cc.job_failed
    # A decline of an ended checkpoint, or by an attempt it does not expect, is ignored.
    assert cc.on_decline(SRC, 1, "again", 30, DeclineReason.IO_ERROR) == []
    cc.check_invariants()

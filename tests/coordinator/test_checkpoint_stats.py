"""Exact event sequences for the pure checkpoint statistics tracker."""

from __future__ import annotations

import pytest

from snapflow.coordinator.checkpoint_stats import (
    CheckpointStatsTracker,
    Quantiles,
    RestoreRecord,
    StateSizes,
    percentile,
)
from snapflow.coordinator.model import (
    CheckpointKind,
    CheckpointStatus,
    CompletedCheckpoint,
    ExecutionAttempt,
    OperatorSubtaskState,
    StateHandle,
    SubtaskAck,
    SubtaskMetrics,
)

A = ExecutionAttempt("src", 0, 1)
B = ExecutionAttempt("sink", 0, 1)


def ack(attempt: ExecutionAttempt, at_ms: int, size: int, **metrics: object) -> SubtaskAck:
    states = (OperatorSubtaskState("op", (StateHandle(f"/s/{attempt}/{at_ms}", size),)),)
    return SubtaskAck(attempt, at_ms, states, SubtaskMetrics(**metrics))  # type: ignore[arg-type]


def completed(checkpoint_id: int, at_ms: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT):
    return CompletedCheckpoint("job", checkpoint_id, kind, 0, at_ms, f"/cp/chk-{checkpoint_id}", ())


def test_percentile_interpolates_linearly() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0], 99) == 10.0
    assert percentile([0.0, 100.0], 90) == 90.0
    assert Quantiles.of([]) == Quantiles()
    assert Quantiles.of([3.0, 1.0, 2.0]) == Quantiles(1.0, 2.0, 2.0, 2.8, 2.98, 3.0)


def test_trigger_ack_complete() -> None:
    s = CheckpointStatsTracker(history_size=10)
    s.on_triggered(1, CheckpointKind.CHECKPOINT, 100, "/cp/chk-1", (A, B))
    r = s.get(1)
    assert r is not None and r.status is CheckpointStatus.IN_PROGRESS
    assert (s.triggered, s.in_progress, r.end_to_end_duration_ms) == (1, 1, 0)
    s.on_acknowledged(1, ack(A, 130, 10, processed_during_alignment_bytes=5, unaligned=True))
    assert (r.latest_ack_timestamp_ms, r.end_to_end_duration_ms, r.state_size_bytes) == (
        130,
        30,
        10,
    )
    s.on_acknowledged(1, ack(B, 150, 20, persisted_in_flight_bytes=7))
    assert (r.processed_during_alignment_bytes, r.persisted_in_flight_bytes, r.unaligned) == (
        5,
        7,
        True,
    )
    s.on_acknowledged(99, ack(A, 1, 1))  # unknown checkpoint: ignored
    s.on_completed(completed(1, 170))
    # mypy keeps the narrowing of r.status from the assert above across on_completed.
    assert r.status is CheckpointStatus.COMPLETED and r.end_to_end_duration_ms == 70  # type: ignore[comparison-overlap]
    assert (s.completed, s.in_progress, s.latest_completed, s.latest_savepoint) == (1, 0, r, None)
    assert s.summary()["end_to_end_duration_ms"] == Quantiles(70, 70, 70, 70, 70, 70)
    assert s.summary()["state_size_bytes"].max == 30
    assert [x.checkpoint_id for x in s.history()] == [1]


def test_failures_count_once_and_savepoints_are_tracked_apart() -> None:
    s = CheckpointStatsTracker()
    s.on_triggered(1, CheckpointKind.CHECKPOINT, 0, "/cp/chk-1", (A,))
    s.on_triggered(2, CheckpointKind.SAVEPOINT, 5, "/sp/2", (A,))
    s.on_failed(1, 40, "EXPIRED", "expired after 40 ms")
    s.on_failed(1, 50, "DECLINED", "again")  # already ended: ignored
    r1 = s.get(1)
    assert r1 is not None
    assert (r1.status, r1.failure_reason, r1.end_timestamp_ms, s.failed) == (
        CheckpointStatus.FAILED,
        "EXPIRED",
        40,
        1,
    )
    s.on_completed(completed(2, 25, CheckpointKind.SAVEPOINT))
    assert s.latest_savepoint is s.get(2) and s.latest_failed is r1
    assert [x.checkpoint_id for x in s.history()] == [2, 1]
    assert [x.checkpoint_id for x in s.history(1)] == [2]
    s.on_completed(completed(7, 1))  # never triggered in this incarnation: ignored
    assert s.completed == 1


def test_history_keeps_the_newest_ended_and_everything_in_progress() -> None:
    s = CheckpointStatsTracker(history_size=2)
    s.on_triggered(1, CheckpointKind.CHECKPOINT, 0, "", (A,))  # stays in progress
    for cid in (2, 3, 4):
        s.on_triggered(cid, CheckpointKind.CHECKPOINT, cid, "", (A,))
        s.on_completed(completed(cid, cid + 1))
    # The oldest is in progress, so nothing behind it is trimmed yet.
    assert [x.checkpoint_id for x in s.history()] == [4, 3, 2, 1]
    s.on_failed(1, 10, "EXPIRED", "x")
    assert [x.checkpoint_id for x in s.history()] == [4, 3]
    # Out of the history, but the latest failed record is still readable.
    assert s.latest_failed is not None and s.get(1) is s.latest_failed
    assert s.get(2) is None
    s.on_triggered(5, CheckpointKind.CHECKPOINT, 11, "", (A,))
    assert [x.checkpoint_id for x in s.history()] == [5, 4]
    assert s.get(3) is None and s.get(4) is s.latest_completed


def test_restores_are_counted() -> None:
    s = CheckpointStatsTracker()
    s.on_restored(7, 1_000, True, "/sp/7")
    s.on_restored(8, 2_000, False, "/cp/chk-8")
    assert s.restored == 2
    assert s.latest_restore == RestoreRecord(8, 2_000, False, "/cp/chk-8")


@pytest.mark.parametrize("size", [1, 3])
def test_summary_window_is_over_completed_checkpoints(size: int) -> None:
    s = CheckpointStatsTracker(history_size=size)
    for cid in range(1, 6):
        s.on_triggered(cid, CheckpointKind.CHECKPOINT, 0, "", (A,))
        s.on_acknowledged(cid, ack(A, cid * 10, cid))
        s.on_completed(completed(cid, cid * 10))
    q = s.summary()["end_to_end_duration_ms"]
    assert (q.min, q.max, q.avg) == (10, 50, 30)
    assert len(s.history()) == size


def incremental_ack(
    attempt: ExecutionAttempt, at_ms: int, handles: list[tuple[str, int]]
) -> SubtaskAck:
    """An ack of the disk backend's shape: ``(kind, size)`` per handle."""
    states = (
        OperatorSubtaskState(
            "op",
            tuple(
                StateHandle(f"/s/{attempt}/{i}", size, kind)
                for i, (kind, size) in enumerate(handles)
            ),
        ),
    )
    return SubtaskAck(attempt, at_ms, states)


def test_incremental_and_shared_sizes_are_summed_over_subtasks() -> None:
    s = CheckpointStatsTracker()
    # Checkpoint 1 uploads everything; checkpoint 2 reuses most of it.
    s.on_triggered(1, CheckpointKind.CHECKPOINT, 0, "/cp/chk-1", (A, B))
    s.on_acknowledged(1, incremental_ack(A, 10, [("shared-new", 1000), ("incremental", 40)]))
    s.on_acknowledged(1, incremental_ack(B, 12, [("shared-new", 700), ("timers", 3)]))
    r1 = s.get(1)
    assert r1 is not None
    assert r1.sizes == StateSizes(state=1743, incremental=1743, shared=0)
    s.on_completed(completed(1, 20))
    s.on_triggered(2, CheckpointKind.CHECKPOINT, 100, "/cp/chk-2", (A, B))
    s.on_acknowledged(
        2, incremental_ack(A, 110, [("shared", 1000), ("shared-new", 50), ("incremental", 41)])
    )
    r2 = s.get(2)
    assert r2 is not None
    # Only the acknowledged subtask counts while in progress.
    assert r2.sizes == StateSizes(state=1091, incremental=91, shared=1000)
    s.on_acknowledged(2, incremental_ack(B, 112, [("shared", 700), ("keyed", 9)]))
    assert r2.sizes == StateSizes(state=1800, incremental=100, shared=1700)
    assert r2.sizes.state == r2.state_size_bytes
    s.on_completed(completed(2, 120))
    summary = s.summary()
    assert summary["state_size_bytes"] == Quantiles.of([1743.0, 1800.0])
    assert summary["incremental_size_bytes"] == Quantiles.of([1743.0, 100.0])
    assert (summary["incremental_size_bytes"].min, summary["incremental_size_bytes"].max) == (
        100,
        1743,
    )


def test_sizes_of_an_ack_without_handles_are_its_reported_size() -> None:
    reported = SubtaskAck(A, 5, (), SubtaskMetrics(state_size_bytes=77))
    assert StateSizes.of_ack(reported) == StateSizes(77, 77, 0)
    assert StateSizes.of_acks([]) == StateSizes(0, 0, 0)
    heap = incremental_ack(B, 6, [("keyed", 30), ("timers", 2)])
    assert StateSizes.of_acks([reported, heap]) == StateSizes(109, 109, 0)

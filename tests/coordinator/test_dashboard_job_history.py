"""The pure job history behind the dashboard's Exceptions tab and the uptime metric
(``coordinator/job_history.py``): exact event sequences, invariants after every step."""

from __future__ import annotations

import pytest

from snapflow.coordinator.job_history import (
    MAX_MESSAGE_CHARS,
    ExceptionEntry,
    JobHistory,
)
from snapflow.coordinator.model import ExecutionAttempt, JobState

SRC0 = ExecutionAttempt("src", 0, 1)
MAP1 = ExecutionAttempt("map", 1, 1)


def step(history: JobHistory, event: str, now: int, *args: object) -> None:
    if event == "state":
        state, reason = args
        assert isinstance(state, JobState) and isinstance(reason, str)
        history.on_state_changed(now, state, reason)
    else:
        attempt, message = args
        assert isinstance(attempt, ExecutionAttempt) and isinstance(message, str)
        history.on_task_failed(now, attempt, message)
    history.check_invariants()


def test_a_run_with_a_failover_and_a_final_failure() -> None:
    h = JobHistory()
    h.check_invariants()
    assert h.uptime_ms(50, JobState.CREATED) == 0

    step(h, "state", 100, JobState.CREATED, "deployment 1 started")
    step(h, "state", 150, JobState.RUNNING, "task map#1@1 running")
    assert h.running_since_ms == 150
    assert h.uptime_ms(1150, JobState.RUNNING) == 1000
    # A second RUNNING report does not restart the clock.
    step(h, "state", 400, JobState.RUNNING, "again")
    assert h.uptime_ms(1150, JobState.RUNNING) == 1000

    step(h, "task", 2000, SRC0, "ValueError: boom")
    step(h, "task", 2001, MAP1, "canceled by the coordinator")
    step(h, "state", 2001, JobState.RESTARTING, "task src#0@1 failed")
    assert h.uptime_ms(2500, JobState.RESTARTING) == 0
    assert h.running_since_ms is None

    step(h, "state", 3000, JobState.RUNNING, "deployment 2 running")
    assert h.uptime_ms(3500, JobState.RUNNING) == 500
    assert h.state_timestamps == {
        JobState.CREATED: 100,
        JobState.RUNNING: 3000,
        JobState.RESTARTING: 2001,
    }

    step(h, "state", 4000, JobState.FAILED, "exceeded the tolerable checkpoint failures")
    # A repeated FAILED report is not a second exception.
    step(h, "state", 4001, JobState.FAILED, "exceeded the tolerable checkpoint failures")
    assert h.uptime_ms(5000, JobState.FAILED) == -1
    assert h.exceptions() == [
        ExceptionEntry(4000, "exceeded the tolerable checkpoint failures", None),
        ExceptionEntry(2001, "canceled by the coordinator", MAP1),
        ExceptionEntry(2000, "ValueError: boom", SRC0),
    ]
    assert (h.total_exceptions, h.truncated) == (3, False)


def test_canceled_and_finished_jobs_record_no_exception() -> None:
    for state in (JobState.CANCELED, JobState.FINISHED):
        h = JobHistory()
        step(h, "state", 10, JobState.RUNNING, "running")
        step(h, "state", 20, state, "")
        assert h.exceptions() == []
        assert h.uptime_ms(30, state) == -1


def test_history_keeps_the_newest_entries_and_bounds_messages() -> None:
    h = JobHistory(size=3)
    for i in range(5):
        step(h, "task", 100 + i, SRC0, f"failure {i}")
    assert [e.message for e in h.exceptions()] == ["failure 4", "failure 3", "failure 2"]
    assert (h.total_exceptions, h.truncated) == (5, True)

    step(h, "task", 200, MAP1, "x" * (MAX_MESSAGE_CHARS * 3))
    newest = h.exceptions()[0]
    assert len(newest.message) == MAX_MESSAGE_CHARS and newest.message.endswith("\u2026")
    step(h, "task", 201, MAP1, "")
    assert h.exceptions()[0].message == "(no message)"


def test_a_clock_step_back_keeps_the_order() -> None:
    h = JobHistory()
    step(h, "task", 1000, SRC0, "first")
    step(h, "task", 900, MAP1, "second, clock stepped back")
    assert [e.timestamp_ms for e in h.exceptions()] == [1000, 1000]


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        JobHistory(size=0)

"""Exact event sequences for ``JobExecution`` (deployments, attempts, task and job states),
with ``check_invariants`` after every event."""

from __future__ import annotations

import pytest

from snapflow.coordinator.execution import JobExecution, Registration
from snapflow.coordinator.model import (
    ExecutionAttempt,
    JobEdge,
    JobGraph,
    JobState,
    JobVertex,
    OperatorSpec,
    TaskKey,
)
from snapflow.errors import FailedPreconditionError, InvalidArgumentError, UnknownTaskError
from snapflow.jobgraph import PartitionerKind, TaskState

GRAPH = JobGraph(
    "g",
    (JobVertex("src", "source", 2, is_source=True), JobVertex("sink", "sink", 1)),
    (JobEdge("src", "sink", PartitionerKind.REBALANCE),),
)
SRC0, SRC1, SINK0 = TaskKey("src", 0), TaskKey("src", 1), TaskKey("sink", 0)
KEYS = (SRC0, SRC1, SINK0)


def attempt(key: TaskKey, n: int) -> ExecutionAttempt:
    return ExecutionAttempt(key.vertex_id, key.subtask_index, n)


class Harness:
    def __init__(self, **kwargs: object) -> None:
        self.ex = JobExecution(GRAPH, **kwargs)  # type: ignore[arg-type]
        self.ex.check_invariants()

    def register(self, key: TaskKey, address: str = "agent:1", launch: int = 0) -> Registration:
        registration = self.ex.register(key, address, launch)
        self.ex.check_invariants()
        return registration

    def update(
        self, key: TaskKey, state: TaskState, failure: str = ""
    ) -> tuple[JobState, JobState]:
        t = self.ex.update(attempt(key, self.ex.deployment), state, failure)
        self.ex.check_invariants()
        return t.job_state_before, t.job_state_after

    def deploy_all(self) -> None:
        for key in KEYS:
            self.register(key, f"agent:{key.subtask_index}")
        for key in KEYS:
            self.update(key, TaskState.RUNNING)


def test_first_deployment_runs_when_every_task_runs() -> None:
    h = Harness()
    assert h.register(SRC0) == Registration(attempt(SRC0, 1), new_deployment=True)
    assert (h.ex.state, h.ex.deployment, h.ex.restarts) == (JobState.CREATED, 1, 0)
    assert h.register(SRC1) == Registration(attempt(SRC1, 1), new_deployment=False)
    assert h.register(SINK0, "agent:2") == Registration(attempt(SINK0, 1), new_deployment=False)
    assert h.update(SRC0, TaskState.RUNNING) == (JobState.CREATED, JobState.CREATED)
    assert h.update(SRC1, TaskState.RUNNING) == (JobState.CREATED, JobState.CREATED)
    assert not h.ex.all_running() and h.ex.running_count() == 2
    assert h.update(SINK0, TaskState.RUNNING) == (JobState.CREATED, JobState.RUNNING)
    assert h.ex.all_running()
    assert h.ex.source_attempts() == [attempt(SRC0, 1), attempt(SRC1, 1)]
    assert h.ex.current_attempts() == sorted(attempt(k, 1) for k in KEYS)
    assert h.ex.group_by_address(h.ex.current_attempts()) == {
        "agent:1": [attempt(SRC0, 1), attempt(SRC1, 1)],
        "agent:2": [attempt(SINK0, 1)],
    }


def test_group_by_address_keeps_current_attempts_only() -> None:
    h = Harness()
    h.register(SRC0, "a:1")
    h.register(SRC1, "a:2")
    h.register(SINK0, "a:1")
    grouped = h.ex.group_by_address(
        [attempt(SRC0, 1), attempt(SINK0, 1), attempt(SRC1, 1), attempt(SRC1, 7)]
    )
    assert grouped == {"a:1": [attempt(SRC0, 1), attempt(SINK0, 1)], "a:2": [attempt(SRC1, 1)]}


def test_a_failure_ends_the_deployment_and_the_next_registration_starts_another() -> None:
    h = Harness()
    h.deploy_all()
    assert h.update(SRC1, TaskState.FAILED, "boom") == (JobState.RUNNING, JobState.RESTARTING)
    # The others confirm the cancel: they only update their task.
    assert h.update(SRC0, TaskState.CANCELED) == (JobState.RESTARTING, JobState.RESTARTING)
    assert h.register(SINK0) == Registration(attempt(SINK0, 2), new_deployment=True)
    assert (h.ex.state, h.ex.deployment, h.ex.restarts) == (JobState.RESTARTING, 2, 1)
    assert list(h.ex.tasks) == [SINK0]
    # Reports of the old deployment are refused.
    with pytest.raises(UnknownTaskError, match="has not registered in deployment 2"):
        h.ex.update(attempt(SRC0, 1), TaskState.RUNNING)
    h.ex.check_invariants()
    with pytest.raises(UnknownTaskError, match=r"attempt 1 of task .* is not current"):
        h.ex.update(attempt(SINK0, 1), TaskState.RUNNING)
    h.ex.check_invariants()
    h.register(SRC0)
    h.register(SRC1)
    for key in KEYS:
        h.update(key, TaskState.RUNNING)
    assert h.ex.state is JobState.RUNNING


def test_registering_again_within_a_deployment_starts_a_new_one() -> None:
    h = Harness()
    h.register(SRC0)
    assert h.register(SRC0) == Registration(attempt(SRC0, 2), new_deployment=True)
    assert (h.ex.state, h.ex.restarts) == (JobState.RESTARTING, 1)


def test_a_newer_launch_redeploys_and_an_older_one_is_refused() -> None:
    """The driver's stage submissions: launch 2 replaces launch 1's deployment even when its
    first task is one launch 1 never registered; a straggler of launch 1 is refused and
    changes nothing."""
    h = Harness()
    h.register(SRC0, launch=1)
    assert h.register(SRC1, launch=1) == Registration(attempt(SRC1, 1), new_deployment=False)
    assert h.register(SINK0, launch=2) == Registration(attempt(SINK0, 2), new_deployment=True)
    assert (h.ex.deployment, h.ex.launch, h.ex.restarts) == (2, 2, 1)
    with pytest.raises(FailedPreconditionError, match=r"from launch 1 .* superseded by launch 2"):
        h.ex.register(SRC0, "agent:9", 1)
    h.ex.check_invariants()
    assert (h.ex.deployment, set(h.ex.tasks)) == (2, {SINK0})
    # Same launch: joins; launch 0 (a `snapflow worker`) never counts as older.
    assert h.register(SRC0, launch=2) == Registration(attempt(SRC0, 2), new_deployment=False)
    assert h.register(SRC1) == Registration(attempt(SRC1, 2), new_deployment=False)
    with pytest.raises(InvalidArgumentError, match="launch must be >= 0"):
        h.ex.register(SRC0, "agent:1", -1)


def test_finishing_tasks_finish_the_job() -> None:
    h = Harness()
    h.deploy_all()
    assert h.update(SRC0, TaskState.FINISHED) == (JobState.RUNNING, JobState.RUNNING)
    assert h.update(SRC1, TaskState.FINISHED) == (JobState.RUNNING, JobState.RUNNING)
    assert h.update(SINK0, TaskState.FINISHED) == (JobState.RUNNING, JobState.FINISHED)
    with pytest.raises(FailedPreconditionError, match="already finished; it cannot become"):
        h.ex.update(attempt(SINK0, 1), TaskState.RUNNING)
    with pytest.raises(FailedPreconditionError, match="job is finished"):
        h.ex.register(SRC0, "agent:1")
    h.ex.check_invariants()


def test_end_cancels_every_live_task_and_refuses_their_late_reports() -> None:
    h = Harness()
    h.deploy_all()
    h.update(SRC0, TaskState.FINISHED)
    h.ex.end(JobState.CANCELED)
    h.ex.check_invariants()
    assert {k: t.state for k, t in h.ex.tasks.items()} == {
        SRC0: TaskState.FINISHED,
        SRC1: TaskState.CANCELED,
        SINK0: TaskState.CANCELED,
    }
    assert h.update(SRC1, TaskState.CANCELED) == (JobState.CANCELED, JobState.CANCELED)
    with pytest.raises(FailedPreconditionError):
        h.ex.update(attempt(SINK0, 1), TaskState.FINISHED)
    h.ex.check_invariants()


def test_end_failed_keeps_the_failure() -> None:
    h = Harness()
    h.deploy_all()
    h.ex.end(JobState.FAILED, "too many failures")
    h.ex.check_invariants()
    assert (h.ex.state, h.ex.failure) == (JobState.FAILED, "too many failures")


def test_bad_registrations_change_nothing() -> None:
    h = Harness()
    with pytest.raises(UnknownTaskError, match="vertex 'nope' is not part of the job graph"):
        h.ex.register(TaskKey("nope", 0), "a:1")
    with pytest.raises(UnknownTaskError, match="subtask index 2 is out of range"):
        h.ex.register(TaskKey("src", 2), "a:1")
    with pytest.raises(InvalidArgumentError, match="address is required"):
        h.ex.register(SRC0, "")
    h.ex.check_invariants()
    assert (h.ex.deployment, h.ex.tasks) == (0, {})
    with pytest.raises(UnknownTaskError, match="is not part of the job graph"):
        h.ex.require_current(ExecutionAttempt("nope", 0, 1))


def test_a_recovered_job_continues_its_counters() -> None:
    h = Harness(state=JobState.RESTARTING, deployment=3, restarts=2, failure="")
    assert h.register(SRC0) == Registration(attempt(SRC0, 4), new_deployment=True)
    assert (h.ex.deployment, h.ex.restarts, h.ex.state) == (4, 3, JobState.RESTARTING)


# --- FINISHED means committed -------------------------------------------------------------------

SINK_GRAPH = JobGraph(
    "g",
    (
        JobVertex(
            "src", "source", 2, operators=(OperatorSpec("s", "s", "source"),), is_source=True
        ),
        JobVertex(
            "sink",
            "sink",
            1,
            operators=(OperatorSpec("m", "m", "map"), OperatorSpec("k", "k", "sink")),
        ),
    ),
    (JobEdge("src", "sink", PartitionerKind.REBALANCE),),
)
ALL_1 = tuple(attempt(k, 1) for k in KEYS)


def sink_harness() -> Harness:
    h = Harness()
    h.ex = JobExecution(SINK_GRAPH)
    h.deploy_all()
    return h


def test_which_vertices_may_hold_uncommitted_output() -> None:
    assert sink_harness().ex.may_hold_uncommitted_output() == ("sink",)
    assert Harness().ex.may_hold_uncommitted_output() == ()  # no operator named: nothing to commit
    custom = JobGraph(
        "g",
        (
            JobVertex(
                "src",
                "s",
                1,
                operators=(OperatorSpec("s", "s", "source"), OperatorSpec("t", "t", "MyOperator")),
                is_source=True,
            ),
        ),
    )
    assert JobExecution(custom).may_hold_uncommitted_output() == ("src",)  # Stream.transform


def test_tasks_that_finish_after_the_final_checkpoint_finish_the_job() -> None:
    h = sink_harness()
    assert h.ex.end_committed(4, reversed(ALL_1))
    h.ex.check_invariants()
    assert h.update(SRC0, TaskState.FINISHED) == (JobState.RUNNING, JobState.RUNNING)
    assert h.update(SRC1, TaskState.FINISHED) == (JobState.RUNNING, JobState.RUNNING)
    assert h.update(SINK0, TaskState.FINISHED) == (JobState.RUNNING, JobState.FINISHED)
    assert (h.ex.end_committed_by, h.ex.failure) == (4, "")


def test_tasks_that_finish_without_a_final_checkpoint_fail_the_job() -> None:
    """An agent that never asked for the final checkpoint: its sink's output since the last
    completed checkpoint is uncommitted, so the job is FAILED, never FINISHED."""
    h = sink_harness()
    h.update(SRC0, TaskState.FINISHED)
    h.update(SRC1, TaskState.FINISHED)
    assert h.update(SINK0, TaskState.FINISHED) == (JobState.RUNNING, JobState.FAILED)
    assert "every task of deployment 1 finished, but no final checkpoint committed" in h.ex.failure
    assert "vertices sink may hold output" in h.ex.failure
    with pytest.raises(FailedPreconditionError, match="job is failed"):
        h.ex.register(SRC0, "agent:1")


def test_an_end_commit_of_other_attempts_does_not_count() -> None:
    h = sink_harness()
    assert not h.ex.end_committed(3, ALL_1[:2])  # not every task
    assert not h.ex.end_committed(3, tuple(attempt(k, 2) for k in KEYS))  # another deployment
    with pytest.raises(ValueError, match="start at 1"):
        h.ex.end_committed(0, ALL_1)
    assert h.ex.end_committed_by == 0
    h.ex.check_invariants()
    for key in KEYS:
        h.update(key, TaskState.FINISHED)
    assert h.ex.state is JobState.FAILED


def test_a_redeployment_needs_a_final_checkpoint_of_its_own() -> None:
    """The final checkpoint completed, then a task failed before every task finished: the next
    deployment restores and must commit its own end."""
    h = sink_harness()
    assert h.ex.end_committed(5, ALL_1)
    assert h.update(SINK0, TaskState.FAILED, "lost") == (JobState.RUNNING, JobState.RESTARTING)
    for key in KEYS:
        h.register(key, f"agent:{key.subtask_index}")
    assert (h.ex.deployment, h.ex.end_committed_by) == (2, 0)
    assert not h.ex.end_committed(5, ALL_1)  # the old deployment's
    for key in KEYS:
        h.update(key, TaskState.RUNNING)
    for key in KEYS:
        h.update(key, TaskState.FINISHED)
    assert h.ex.state is JobState.FAILED


def test_a_job_without_uncommitted_output_finishes_without_a_final_checkpoint() -> None:
    """The graph's operators commit nothing (built-in kinds only): the end needs no commit."""
    graph = JobGraph(
        "g",
        (
            JobVertex(
                "src",
                "s",
                1,
                operators=(OperatorSpec("s", "s", "source"), OperatorSpec("c", "c", "count")),
                is_source=True,
            ),
        ),
    )
    ex = JobExecution(graph)
    ex.register(TaskKey("src", 0), "agent:1")
    ex.update(ExecutionAttempt("src", 0, 1), TaskState.RUNNING)
    assert (
        ex.update(ExecutionAttempt("src", 0, 1), TaskState.FINISHED).job_state_after
        is JobState.FINISHED
    )
    ex.check_invariants()


def test_the_end_of_data_of_sources_and_of_all_tasks_per_deployment() -> None:
    h = Harness()
    h.deploy_all()
    assert not h.ex.every_source_data_ended() and not h.ex.all_data_ended()
    assert h.ex.still_ending() == sorted(str(k) for k in (SRC0, SRC1, SINK0))
    for key in (SRC0, SRC1):
        h.ex.update(attempt(key, 1), TaskState.RUNNING, data_ended=True)
        h.ex.check_invariants()
    assert h.ex.every_source_data_ended() and not h.ex.all_data_ended()
    assert h.ex.still_ending() == [str(SINK0)]  # what a held final checkpoint waits for
    # A plain RUNNING report later (a re-registration, say) does not take it back.
    h.update(SRC0, TaskState.RUNNING)
    assert h.ex.every_source_data_ended()
    h.ex.update(attempt(SINK0, 1), TaskState.RUNNING, data_ended=True)
    assert h.ex.all_data_ended() and h.ex.still_ending() == []
    with pytest.raises(InvalidArgumentError, match="data_ended is reported with state RUNNING"):
        h.ex.update(attempt(SINK0, 1), TaskState.FINISHED, data_ended=True)
    # The next deployment starts with nothing ended.
    h.update(SRC1, TaskState.FAILED, "boom")
    h.register(SRC0)
    assert not h.ex.every_source_data_ended() and not h.ex.all_data_ended()

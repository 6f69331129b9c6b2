"""Pure tracking of a job's subtasks, deployments and job state (Flink's ExecutionGraph, slim).

A *deployment* is one run of the job's whole graph (the Spark bridge runs it as one barrier
stage). Every subtask of deployment ``n`` has attempt number ``n``: a failure anywhere ends the
deployment, and the next registration starts deployment ``n + 1`` (Flink's full-restart
failover, which is also what Spark's barrier mode does). No I/O and no clock. Only the events
(``register``, ``update``, ``end_committed``, ``end``) change the state; ``check_invariants``
guards it.

FINISHED means committed: when every task of the deployment reported FINISHED, the job is
FINISHED only if a checkpoint that ends the tasks (the final checkpoint, taken after every
source's end of data, or a stop-with-savepoint) completed with every one of them
(``end_committed``), or if no task could hold uncommitted output (every operator of the graph
is of a kind in ``COMMIT_FREE_OPERATOR_KINDS``). Otherwise the tasks ended without committing
what they wrote since the last completed checkpoint (an agent that never asked for the final
checkpoint): the job is FAILED with a message saying so. The coordinator cannot take that
checkpoint itself any more: barriers start at the sources, and a finished task takes none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from snapflow.coordinator.model import ExecutionAttempt, JobGraph, JobState, TaskKey
from snapflow.errors import FailedPreconditionError, InvalidArgumentError, UnknownTaskError
from snapflow.jobgraph import COMMIT_FREE_OPERATOR_KINDS, TaskState


@dataclass
class TaskRecord:
    """One subtask of the current deployment."""

    attempt: ExecutionAttempt
    state: TaskState
    address: str
    failure: str = ""
    data_ended: bool = False
    """Its input ended and its end of data went downstream (reported while RUNNING)."""


@dataclass(frozen=True)
class Registration:
    """The outcome of ``JobExecution.register``."""

    attempt: ExecutionAttempt
    new_deployment: bool
    """True when this registration started a new deployment (a restart of the whole graph)."""


@dataclass(frozen=True)
class TaskTransition:
    """The outcome of ``JobExecution.update``: the task and the job state around the change."""

    task: TaskRecord
    job_state_before: JobState
    job_state_after: JobState


class JobExecution:
    """Subtasks of the current deployment and the job state derived from them."""

    def __init__(
        self,
        graph: JobGraph,
        state: JobState = JobState.CREATED,
        deployment: int = 0,
        restarts: int = 0,
        failure: str = "",
    ) -> None:
        self.graph = graph
        self.state = state
        self.deployment = deployment
        self.restarts = restarts
        self.failure = failure
        self.tasks: dict[TaskKey, TaskRecord] = {}
        # The driver's launch (stage submission) of the current deployment; 0: none seen.
        self.launch = 0
        # The next registration starts a new deployment: at first, and after a task failed.
        self._next_registration_redeploys = True
        self._all_keys = frozenset(graph.task_keys())
        self._source_keys = frozenset(graph.source_task_keys())
        self.end_committed_by = 0
        """The completed checkpoint that ended the current deployment's tasks with their output
        committed (``end_committed``); 0: none yet."""
        self._may_hold_output = tuple(
            sorted(
                v.vertex_id
                for v in graph.vertices
                if any(op.kind not in COMMIT_FREE_OPERATOR_KINDS for op in v.operators)
            )
        )

    # -- queries --------------------------------------------------------------------------

    @property
    def total_tasks(self) -> int:
        return len(self._all_keys)

    def running_count(self) -> int:
        return sum(1 for t in self.tasks.values() if t.state is TaskState.RUNNING)

    def all_running(self) -> bool:
        return len(self.tasks) == len(self._all_keys) and all(
            t.state is TaskState.RUNNING for t in self.tasks.values()
        )

    def every_source_data_ended(self) -> bool:
        """Every source subtask of the current deployment reported the end of its data."""
        return self._data_ended(self._source_keys)

    def all_data_ended(self) -> bool:
        """Every subtask of the current deployment ended its data (or finished)."""
        return self._data_ended(self._all_keys)

    def still_ending(self) -> list[str]:
        """The subtasks of the current deployment that neither reported the end of their data
        nor finished (what a held final checkpoint waits for), as ``vertex#index``."""
        return [str(key) for key in sorted(self._all_keys) if not self._has_ended(key)]

    def _data_ended(self, keys: frozenset[TaskKey]) -> bool:
        return bool(keys) and all(self._has_ended(k) for k in keys)

    def _has_ended(self, key: TaskKey) -> bool:
        """The subtask reported the end of its data, or finished."""
        r = self.tasks.get(key)
        return r is not None and (r.data_ended or r.state is TaskState.FINISHED)

    def may_hold_uncommitted_output(self) -> tuple[str, ...]:
        """The vertices whose tasks may hold output that only a completed checkpoint commits."""
        return self._may_hold_output

    def current_attempts(self) -> list[ExecutionAttempt]:
        return sorted(t.attempt for t in self.tasks.values())

    def source_attempts(self) -> list[ExecutionAttempt]:
        return sorted(t.attempt for k, t in self.tasks.items() if k in self._source_keys)

    def address_of(self, attempt: ExecutionAttempt) -> str:
        return self.tasks[attempt.key].address

    def group_by_address(
        self, attempts: Iterable[ExecutionAttempt]
    ) -> dict[str, list[ExecutionAttempt]]:
        """The current ones among ``attempts``, grouped by their agent's address (one RPC per
        agent); attempts of an older deployment are left out."""
        grouped: dict[str, list[ExecutionAttempt]] = {}
        for attempt in attempts:
            record = self.tasks.get(attempt.key)
            if record is not None and record.attempt == attempt:
                grouped.setdefault(record.address, []).append(attempt)
        return grouped

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests after each step)."""
        assert self.deployment >= 0
        assert self.launch >= 0
        assert 0 <= self.restarts <= max(0, self.deployment - 1), "more restarts than redeploys"
        assert set(self.tasks) <= self._all_keys, "task outside the graph"
        for key, task in self.tasks.items():
            assert task.attempt.key == key, "task filed under another key"
            assert task.attempt.attempt == self.deployment, "task of another deployment"
            assert task.address, "task without an address"
        if self.state is JobState.RUNNING:
            assert len(self.tasks) == len(self._all_keys), "RUNNING before every task registered"
            assert all(t.state is not TaskState.DEPLOYING for t in self.tasks.values()), (
                "RUNNING before every task ran"
            )
        if self.state in (JobState.CANCELED, JobState.FAILED):
            assert all(t.state.is_terminal for t in self.tasks.values()), "ended with live tasks"
        if self.state is JobState.CREATED and self.tasks:
            assert self.deployment == 1, "CREATED after a redeployment"
        if self.state is JobState.RUNNING:
            assert not self._next_registration_redeploys, "RUNNING after a failure"
        if self.state is JobState.FINISHED and self.tasks:  # (not a job recovered FINISHED)
            assert self.end_committed_by or not self._may_hold_output, "FINISHED uncommitted"
        assert self.end_committed_by == 0 or len(self.tasks) == len(self._all_keys), (
            "end committed before every task registered"
        )

    def require_current(self, attempt: ExecutionAttempt) -> TaskRecord:
        """The task record if ``attempt`` is the current attempt of a known subtask."""
        if attempt.key not in self._all_keys:
            raise UnknownTaskError(
                f"task {attempt.key} is not part of the job graph "
                f"(vertices: {', '.join(v.vertex_id for v in self.graph.vertices)})"
            )
        record = self.tasks.get(attempt.key)
        if record is None:
            raise UnknownTaskError(
                f"task {attempt.key} has not registered in deployment {self.deployment}"
            )
        if record.attempt != attempt:
            raise UnknownTaskError(
                f"attempt {attempt.attempt} of task {attempt.key} is not current "
                f"(current attempt is {record.attempt.attempt})"
            )
        return record

    # -- events -----------------------------------------------------------------------------

    def register(self, key: TaskKey, address: str, launch: int = 0) -> Registration:
        """A task of ``key`` registers from ``address``. ``launch`` is the Spark driver's stage
        submission it runs in (0: not launched by a driver): a newer launch starts a new
        deployment, an older one is refused (a straggler of a failed stage must not end the
        deployment that replaced it)."""
        if launch < 0:
            raise InvalidArgumentError(f"launch must be >= 0, got {launch}")
        if self.state.is_terminal:
            raise FailedPreconditionError(
                f"job is {self.state.value}; tasks cannot register any more"
            )
        if key not in self._all_keys:
            vertex = self.graph.vertex(key.vertex_id)
            if vertex is None:
                raise UnknownTaskError(f"vertex {key.vertex_id!r} is not part of the job graph")
            raise UnknownTaskError(
                f"subtask index {key.subtask_index} is out of range for vertex {key.vertex_id!r} "
                f"(parallelism {vertex.parallelism})"
            )
        if not address:
            raise InvalidArgumentError("address is required (host:port of the worker agent)")
        if launch and launch < self.launch:
            raise FailedPreconditionError(
                f"task {key} is from launch {launch} of the job's tasks, superseded by launch "
                f"{self.launch}: this task belongs to a stage that failed and must stop"
            )
        new_deployment = (
            self._next_registration_redeploys or key in self.tasks or launch > self.launch
        )
        if launch > self.launch:
            self.launch = launch
        if new_deployment:
            self._next_registration_redeploys = False
            if self.deployment > 0:
                self.restarts += 1
            self.deployment += 1
            self.tasks = {}
            self.end_committed_by = 0
            self.state = JobState.RESTARTING if self.deployment > 1 else JobState.CREATED
        attempt = ExecutionAttempt(key.vertex_id, key.subtask_index, self.deployment)
        self.tasks[key] = TaskRecord(attempt=attempt, state=TaskState.DEPLOYING, address=address)
        return Registration(attempt=attempt, new_deployment=new_deployment)

    def update(
        self,
        attempt: ExecutionAttempt,
        state: TaskState,
        failure: str = "",
        *,
        data_ended: bool = False,
    ) -> TaskTransition:
        """``attempt`` is now in ``state``; ``data_ended`` (RUNNING only): its input ended."""
        if data_ended and state is not TaskState.RUNNING:
            raise InvalidArgumentError(
                f"data_ended is reported with state RUNNING, not {state.value}"
            )
        record = self.require_current(attempt)
        before = self.state
        if record.state.is_terminal and record.state is not state:
            raise FailedPreconditionError(
                f"task {attempt} is already {record.state.value}; it cannot become {state.value}"
            )
        record.state = state
        record.failure = failure
        record.data_ended = record.data_ended or data_ended
        if state in (TaskState.FAILED, TaskState.CANCELED) and not self.state.is_terminal:
            self.state = JobState.RESTARTING
            self._next_registration_redeploys = True
        elif state is TaskState.RUNNING and self.state in (JobState.CREATED, JobState.RESTARTING):
            if self.all_running():
                self.state = JobState.RUNNING
        elif state is TaskState.FINISHED and self._all_finished() and not self.state.is_terminal:
            if self.end_committed_by or not self._may_hold_output:
                self.state = JobState.FINISHED
            else:
                self.state = JobState.FAILED
                self.failure = self._uncommitted_end()
        return TaskTransition(task=record, job_state_before=before, job_state_after=self.state)

    def end_committed(self, checkpoint_id: int, attempts: Iterable[ExecutionAttempt]) -> bool:
        """A checkpoint after which the tasks end completed (the final one, or a
        stop-with-savepoint): every task that acknowledged it committed its output. It counts
        when ``attempts`` are exactly the current deployment's tasks (an older deployment's
        checkpoint does not); returns whether it counted."""
        if checkpoint_id < 1:
            raise ValueError(f"checkpoint ids start at 1, not {checkpoint_id}")
        current = {t.attempt for t in self.tasks.values()}
        if len(current) != len(self._all_keys) or set(attempts) != current:
            return False
        self.end_committed_by = max(self.end_committed_by, checkpoint_id)
        return True

    def _uncommitted_end(self) -> str:
        return (
            f"every task of deployment {self.deployment} finished, but no final checkpoint "
            f"committed their output: vertices {', '.join(self._may_hold_output)} may hold "
            "output (sinks, custom operators) that only a checkpoint completed after every "
            "source's end of data commits, and none completed (their agents did not ask for the "
            "final checkpoint: older than the coordinator?). What they wrote after the last "
            "completed checkpoint is not committed; run the job again from that checkpoint"
        )

    def _all_finished(self) -> bool:
        return len(self.tasks) == len(self._all_keys) and all(
            t.state is TaskState.FINISHED for t in self.tasks.values()
        )

    def end(self, state: JobState, failure: str = "") -> None:
        """Move the job into a terminal state (cancel, fail, finish after stop-with-savepoint)."""
        assert state.is_terminal
        self.state = state
        self.failure = failure
        if state is not JobState.FINISHED:
            # The coordinator has told every task to cancel; their late reports are refused.
            for task in self.tasks.values():
                if not task.state.is_terminal:
                    task.state = TaskState.CANCELED

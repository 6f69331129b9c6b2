"""The job-graph vocabulary shared by the coordinator and the worker: how an edge partitions
its records, and the states a task reports. Their proto numbers appear only in
:mod:`snapflow.wire`.
"""

from __future__ import annotations

import enum


class PartitionerKind(enum.Enum):
    """How an edge of the job graph sends records to the subtasks of its target."""

    FORWARD = "forward"
    HASH = "hash"
    REBALANCE = "rebalance"
    BROADCAST = "broadcast"


class TaskState(enum.Enum):
    """The states of a task attempt (Flink's ExecutionState, slimmed)."""

    DEPLOYING = "deploying"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELED)

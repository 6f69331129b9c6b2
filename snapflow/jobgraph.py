"""The job vocabulary shared by the coordinator, the worker and the coordinator's clients: how
an edge partitions its records, the states a task reports and the states of a job, and which
operator kinds commit nothing. Their proto numbers appear only in :mod:`snapflow.wire`. Enum
values are the lower-case names, which the Redis records store.
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


class JobState(enum.Enum):
    """The states of a job (Flink's JobStatus, slimmed): the coordinator's, and what every
    client reads from ``JobInfo.state``."""

    CREATED = "created"
    """Submitted, waiting for its tasks."""
    RUNNING = "running"
    """Every task is running."""
    RESTARTING = "restarting"
    """A task failed; waiting for the driver to deploy the graph again."""
    FINISHED = "finished"
    CANCELED = "canceled"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.CANCELED, JobState.FAILED)


#: Operator kinds (``OperatorSpec.kind``) of the Spark bridge's built-in operators that hold no
#: output back for a completed checkpoint to commit. Any other kind may: a sink (``"sink"``) or
#: an operator given to ``Stream.transform`` (kind: its class name), whose
#: ``notify_checkpoint_complete`` may commit. The coordinator finishes a job with such an
#: operator only after a final checkpoint committed its output (docs/coordinator.md, "FINISHED
#: means committed").
COMMIT_FREE_OPERATOR_KINDS = frozenset(
    {
        "source",
        "map",
        "filter",
        "flat_map",
        "map_batches",
        "filter_batches",
        "flat_map_batches",
        "map_pandas",
        "count",
        "reduce",
        "window",
        "process",
        "process_batches",
        "aggregate",
    }
)

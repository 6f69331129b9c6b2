"""The coordinator's domain model: enums and records.

Everything here is plain data. The pure checkpoint coordinator works on these types, the Redis
store serialises them to JSON (``to_dict`` / ``from_dict``), and ``coordinator.convert`` maps
them to and from protobuf messages. No I/O happens in this module.
"""

from __future__ import annotations

import base64
import enum
import re
from dataclasses import asdict, dataclass, field
from typing import Any

# The vocabulary shared with the workers and the API clients lives in the foundation
# (snapflow.checkpointing, snapflow.jobgraph); the coordinator's modules take it from here like
# the rest. A job's CheckpointConfig is the foundation's too (snapflow.checkpoint_config),
# imported from there.
from snapflow.checkpoint_config import CheckpointConfig
from snapflow.checkpointing import BarrierOptions as BarrierOptions
from snapflow.checkpointing import CheckpointKind as CheckpointKind
from snapflow.checkpointing import CheckpointMode as CheckpointMode
from snapflow.checkpointing import CheckpointStatus as CheckpointStatus
from snapflow.checkpointing import DeclineReason as DeclineReason
from snapflow.checkpointing import StateHandle as StateHandle
from snapflow.jobgraph import JobState as JobState
from snapflow.jobgraph import PartitionerKind
from snapflow.state_backend_options import StateBackendOptions

JOB_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_MAX_PARALLELISM = 128


class TriggerRefusal(enum.Enum):
    """Why a checkpoint trigger was refused (Flink's CheckpointFailureReason for pre-checks)."""

    TOO_MANY_CHECKPOINT_REQUESTS = "too many pending checkpoints (max concurrent reached)"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "minimum pause since the last checkpoint has not passed"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "not all tasks are running"
    CHECKPOINT_COORDINATOR_SHUTDOWN = "the checkpoint coordinator is shut down"
    IO_EXCEPTION = "could not allocate a checkpoint id or create its directory"
    STOP_WITH_SAVEPOINT_PENDING = "a stop-with-savepoint is already in progress"
    CHECKPOINT_EXPIRED = "preparing the trigger (id, storage) did not finish within the timeout"
    FINAL_CHECKPOINT_COMPLETED = (
        "a final checkpoint completed (every source had ended): the job is finishing, and that "
        "checkpoint covers this request"
    )
    NOT_A_RUNNING_SOURCE = (
        "input_ended names no source subtask attempt of the running deployment (a task of an "
        "earlier attempt, or not a source)"
    )
    ASKED_AGAIN = "the same source subtask asked for the final checkpoint again"
    TASKS_ENDING_INPUT = (
        "every source ended its input and some task is still ending its own (firing its last "
        "timers, running end_input): the final checkpoint is triggered once every task ended"
    )


class AbortReason(enum.Enum):
    """Why a pending checkpoint failed. ``counts_as_failure`` feeds the failure manager."""

    EXPIRED = "checkpoint expired before completing"
    DECLINED = "a task declined the checkpoint"
    SUBSUMED = "a newer checkpoint completed"
    TASK_FAILURE = "a task failed"
    JOB_CANCELED = "the job was canceled"
    JOB_FINISHED = "the job finished"
    JOB_FAILED = "the job failed"
    COORDINATOR_SHUTDOWN = "the coordinator shut down"
    COORDINATOR_RESTARTED = "the coordinator restarted while the checkpoint was pending"
    FINALIZE_FAILED = "writing the checkpoint metadata or committing it failed"
    TASK_NOT_READY = "a task was not ready for the checkpoint"
    ALIGNMENT_CANCELED = "a task canceled the barrier alignment (cancel marker)"

    @property
    def counts_as_failure(self) -> bool:
        # Flink's CheckpointFailureManager.checkFailureCounter counts CHECKPOINT_EXPIRED,
        # CHECKPOINT_DECLINED, CHECKPOINT_ASYNC_EXCEPTION, IO_EXCEPTION and
        # FINALIZE_CHECKPOINT_FAILURE (1.18, 1.20): not subsumption, shutdown or failover.
        return self in (AbortReason.EXPIRED, AbortReason.DECLINED, AbortReason.FINALIZE_FAILED)


class AckResult(enum.Enum):
    SUCCESS = "success"
    DUPLICATE = "duplicate"
    UNKNOWN = "unknown"
    DISCARDED = "discarded"


@dataclass(frozen=True, order=True)
class TaskKey:
    """A subtask of a vertex, independent of the attempt."""

    vertex_id: str
    subtask_index: int

    def __str__(self) -> str:
        return f"{self.vertex_id}#{self.subtask_index}"


@dataclass(frozen=True, order=True)
class ExecutionAttempt:
    """One execution attempt of a subtask (Flink's ExecutionAttemptID)."""

    vertex_id: str
    subtask_index: int
    attempt: int

    @property
    def key(self) -> TaskKey:
        return TaskKey(self.vertex_id, self.subtask_index)

    def __str__(self) -> str:
        return f"{self.vertex_id}#{self.subtask_index}@{self.attempt}"


@dataclass(frozen=True)
class OperatorSpec:
    operator_id: str
    name: str
    kind: str
    payload: bytes = b""


@dataclass(frozen=True)
class JobVertex:
    vertex_id: str
    name: str
    parallelism: int
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    operators: tuple[OperatorSpec, ...] = ()
    is_source: bool = False


@dataclass(frozen=True)
class JobEdge:
    source_vertex_id: str
    target_vertex_id: str
    partitioner: PartitionerKind
    key_field: str = ""
    """HASH edges: the key column; the target vertex is keyed by it."""
    target_input: int = 0
    """The logical input of the target that the edge feeds (several for connect and joins)."""
    output_tag: str = ""
    """The source's output the edge carries: "" the main one, else that side output."""


@dataclass(frozen=True)
class JobGraph:
    name: str
    vertices: tuple[JobVertex, ...]
    edges: tuple[JobEdge, ...] = ()

    def vertex(self, vertex_id: str) -> JobVertex | None:
        for v in self.vertices:
            if v.vertex_id == vertex_id:
                return v
        return None

    def task_keys(self) -> list[TaskKey]:
        return [TaskKey(v.vertex_id, i) for v in self.vertices for i in range(v.parallelism)]

    def source_task_keys(self) -> list[TaskKey]:
        return [
            TaskKey(v.vertex_id, i)
            for v in self.vertices
            if v.is_source
            for i in range(v.parallelism)
        ]


@dataclass(frozen=True)
class OperatorSubtaskState:
    operator_id: str
    handles: tuple[StateHandle, ...] = ()

    @property
    def size_bytes(self) -> int:
        return sum(h.size_bytes for h in self.handles)


@dataclass(frozen=True)
class SubtaskMetrics:
    sync_duration_ms: int = 0
    async_duration_ms: int = 0
    alignment_duration_ms: int = 0
    start_delay_ms: int = 0
    state_size_bytes: int = 0
    processed_during_alignment_bytes: int = 0
    persisted_in_flight_bytes: int = 0
    unaligned: bool = False
    records_in: int = 0


@dataclass(frozen=True)
class SubtaskAck:
    """What one subtask attempt reported for one checkpoint."""

    attempt: ExecutionAttempt
    ack_timestamp_ms: int
    """When the subtask acked: the ack's arrival minus the time its agent held it (``held_ms``),
    never before the checkpoint's trigger."""
    operator_states: tuple[OperatorSubtaskState, ...] = ()
    metrics: SubtaskMetrics = field(default_factory=SubtaskMetrics)
    input_ended: bool = False
    """A source that had reached the end of its input (bounded jobs end after such a checkpoint)."""

    @property
    def state_size_bytes(self) -> int:
        reported = sum(s.size_bytes for s in self.operator_states)
        return reported or self.metrics.state_size_bytes


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint whose metadata is durable. Stored in Redis and in ``_metadata``."""

    job_id: str
    checkpoint_id: int
    kind: CheckpointKind
    trigger_timestamp_ms: int
    completion_timestamp_ms: int
    external_path: str
    """Directory holding ``_metadata`` (``<root>/<job>/chk-<id>`` or the savepoint directory)."""
    subtask_states: tuple[SubtaskAck, ...]
    vertex_parallelism: dict[str, int] = field(default_factory=dict)
    vertex_max_parallelism: dict[str, int] = field(default_factory=dict)

    @property
    def state_size_bytes(self) -> int:
        return sum(a.state_size_bytes for a in self.subtask_states)

    def state_paths(self) -> list[str]:
        """The files of the checkpoint's state (inline state has none)."""
        return [
            h.path
            for a in self.subtask_states
            for s in a.operator_states
            for h in s.handles
            if not h.is_inline
        ]

    def to_dict(self) -> dict[str, Any]:
        # Written by hand: dataclasses.asdict deep-copies and dominated completion time at 1024
        # subtasks. The keys are the same as asdict's.
        return {
            "job_id": self.job_id,
            "checkpoint_id": self.checkpoint_id,
            "kind": self.kind.value,
            "trigger_timestamp_ms": self.trigger_timestamp_ms,
            "completion_timestamp_ms": self.completion_timestamp_ms,
            "external_path": self.external_path,
            "subtask_states": [subtask_ack_to_dict(a) for a in self.subtask_states],
            "vertex_parallelism": dict(self.vertex_parallelism),
            "vertex_max_parallelism": dict(self.vertex_max_parallelism),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CompletedCheckpoint:
        return CompletedCheckpoint(
            job_id=d["job_id"],
            checkpoint_id=int(d["checkpoint_id"]),
            kind=CheckpointKind(d["kind"]),
            trigger_timestamp_ms=int(d["trigger_timestamp_ms"]),
            completion_timestamp_ms=int(d["completion_timestamp_ms"]),
            external_path=d["external_path"],
            subtask_states=tuple(subtask_ack_from_dict(a) for a in d["subtask_states"]),
            vertex_parallelism={k: int(v) for k, v in d.get("vertex_parallelism", {}).items()},
            vertex_max_parallelism={
                k: int(v) for k, v in d.get("vertex_max_parallelism", {}).items()
            },
        )


def subtask_ack_to_dict(a: SubtaskAck) -> dict[str, Any]:
    return {
        "attempt": {
            "vertex_id": a.attempt.vertex_id,
            "subtask_index": a.attempt.subtask_index,
            "attempt": a.attempt.attempt,
        },
        "ack_timestamp_ms": a.ack_timestamp_ms,
        "operator_states": [
            {"operator_id": s.operator_id, "handles": [_handle_to_dict(h) for h in s.handles]}
            for s in a.operator_states
        ],
        "metrics": dict(a.metrics.__dict__),
        "input_ended": a.input_ended,
    }


def _handle_to_dict(h: StateHandle) -> dict[str, Any]:
    # The keys and their order are the JSON the Redis records have always held (read back
    # by _handle_from_dict); a slotted dataclass has no __dict__ to copy. Inline bytes are
    # base64 under "data", only where there are any: file handles keep their old records.
    d: dict[str, Any] = {
        "path": h.path,
        "size_bytes": h.size_bytes,
        "kind": h.kind,
        "key_group_start": h.key_group_start,
        "key_group_end": h.key_group_end,
        "offset": h.offset,
    }
    if h.data:
        d["data"] = base64.b64encode(h.data).decode("ascii")
    return d


def _handle_from_dict(d: dict[str, Any]) -> StateHandle:
    data = d.get("data")
    if data is None:
        return StateHandle(**d)
    return StateHandle(**{**d, "data": base64.b64decode(data)})


def subtask_ack_from_dict(d: dict[str, Any]) -> SubtaskAck:
    return SubtaskAck(
        attempt=ExecutionAttempt(**d["attempt"]),
        ack_timestamp_ms=int(d["ack_timestamp_ms"]),
        operator_states=tuple(
            OperatorSubtaskState(
                operator_id=s["operator_id"],
                handles=tuple(_handle_from_dict(h) for h in s["handles"]),
            )
            for s in d["operator_states"]
        ),
        metrics=SubtaskMetrics(**d["metrics"]),
        input_ended=bool(d.get("input_ended", False)),
    )


@dataclass(frozen=True)
class PendingCheckpointRecord:
    """The Redis record of a pending checkpoint: enough to abort it after a coordinator crash."""

    job_id: str
    checkpoint_id: int
    kind: CheckpointKind
    trigger_timestamp_ms: int
    external_path: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PendingCheckpointRecord:
        return PendingCheckpointRecord(
            job_id=d["job_id"],
            checkpoint_id=int(d["checkpoint_id"]),
            kind=CheckpointKind(d["kind"]),
            trigger_timestamp_ms=int(d["trigger_timestamp_ms"]),
            external_path=d["external_path"],
        )


@dataclass(frozen=True)
class JobRecord:
    """The durable description of a job (Redis). Task attempts are not durable: after a
    coordinator restart every task registers again."""

    job_id: str
    graph: JobGraph
    checkpoint_config: CheckpointConfig
    state: JobState
    created_at_ms: int
    restarts: int = 0
    failure: str = ""
    restore_checkpoint_id: int = 0
    """The checkpoint the job was first submitted to restore from (0 = none)."""
    restore_savepoint_path: str = ""
    deployment: int = 0
    """Deployments so far; task attempt numbers continue from here after a coordinator restart."""
    restore_latest: bool = False
    """Resubmitted with ``restore.latest``: start from the newest restorable snapshot."""
    run_start_checkpoint_id: int = 0
    """Highest checkpoint id when this run was submitted. The explicit restore source applies
    until a newer checkpoint completes; failover then restores from the newest one."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        d["checkpoint_config"]["mode"] = self.checkpoint_config.mode.value
        for v in d["graph"]["vertices"]:
            for op in v["operators"]:
                op["payload"] = op["payload"].hex()
        for e in d["graph"]["edges"]:
            e["partitioner"] = e["partitioner"].value
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> JobRecord:
        g = d["graph"]
        graph = JobGraph(
            name=g["name"],
            vertices=tuple(
                JobVertex(
                    vertex_id=v["vertex_id"],
                    name=v["name"],
                    parallelism=int(v["parallelism"]),
                    max_parallelism=int(v["max_parallelism"]),
                    operators=tuple(
                        OperatorSpec(
                            operator_id=o["operator_id"],
                            name=o["name"],
                            kind=o["kind"],
                            payload=bytes.fromhex(o["payload"]),
                        )
                        for o in v["operators"]
                    ),
                    is_source=bool(v["is_source"]),
                )
                for v in g["vertices"]
            ),
            edges=tuple(
                JobEdge(
                    e["source_vertex_id"],
                    e["target_vertex_id"],
                    PartitionerKind(e["partitioner"]),
                    e.get("key_field", ""),
                    int(e.get("target_input", 0)),
                    e.get("output_tag", ""),
                )
                for e in g["edges"]
            ),
        )
        c = dict(d["checkpoint_config"])
        c["mode"] = CheckpointMode(c["mode"])
        if "state_backend_options" in c:
            c["state_backend_options"] = StateBackendOptions(**c["state_backend_options"])
        return JobRecord(
            job_id=d["job_id"],
            graph=graph,
            checkpoint_config=CheckpointConfig(**c),
            state=JobState(d["state"]),
            created_at_ms=int(d["created_at_ms"]),
            restarts=int(d.get("restarts", 0)),
            failure=d.get("failure", ""),
            restore_checkpoint_id=int(d.get("restore_checkpoint_id", 0)),
            restore_savepoint_path=d.get("restore_savepoint_path", ""),
            deployment=int(d.get("deployment", 0)),
            restore_latest=bool(d.get("restore_latest", False)),
            run_start_checkpoint_id=int(d.get("run_start_checkpoint_id", 0)),
        )

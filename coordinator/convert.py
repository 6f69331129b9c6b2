"""Protobuf <-> the coordinator's domain model, with validation of everything a client sends.

A job's checkpoint config is the foundation's type and validates itself; its mapping is
``snapflow.wire.checkpoint_config_from_pb`` / ``checkpoint_config_to_pb``.

Validation errors are ``InvalidArgumentError`` with a message that says which field is wrong and
what would be accepted, so a caller can fix the request.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

from snapflow import limits, wire
from snapflow.coordinator.model import (
    DEFAULT_MAX_PARALLELISM,
    JOB_ID_PATTERN,
    AckResult,
    CompletedCheckpoint,
    DeclineReason,
    ExecutionAttempt,
    JobEdge,
    JobGraph,
    JobVertex,
    OperatorSpec,
    OperatorSubtaskState,
    SubtaskMetrics,
)
from snapflow.coordinator.savepoint_operations import SavepointOperation
from snapflow.errors import InvalidArgumentError, InvalidFieldError
from snapflow.jobgraph import PartitionerKind
from snapflow.task_metrics import TaskMetrics
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

# The numbers live in snapflow/limits.py (documented in docs/coordinator.md, "Limits").
MAX_PARALLELISM_LIMIT = limits.MAX_PARALLELISM
MAX_VERTICES = limits.MAX_VERTICES
MAX_ID_LENGTH = limits.MAX_ID_CHARS
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]+$")

# The coordinator's own enums; the shared vocabulary (job and task states, checkpoint kinds,
# statuses, ...) is mapped in snapflow.wire.
ACK_RESULT: wire.EnumMapping[AckResult, cpb.AckResult] = wire.EnumMapping(
    AckResult,
    cpb.AckResult,
    {
        AckResult.SUCCESS: cpb.ACK_RESULT_SUCCESS,
        AckResult.DUPLICATE: cpb.ACK_RESULT_DUPLICATE,
        AckResult.UNKNOWN: cpb.ACK_RESULT_UNKNOWN,
        AckResult.DISCARDED: cpb.ACK_RESULT_DISCARDED,
    },
)


# --- ids -----------------------------------------------------------------------------------


def parse_job_id(value: str, *, field: str = "job_id", allow_empty: bool = False) -> str:
    if not value:
        if allow_empty:
            return uuid.uuid4().hex
        raise InvalidArgumentError(f"{field} is required")
    if not JOB_ID_PATTERN.match(value):
        raise InvalidArgumentError(
            f"{field} {limits.echo(value)} is malformed: expected 32 lowercase hex characters"
        )
    return value


def _check_id(value: str, what: str) -> str:
    if not value:
        raise InvalidArgumentError(f"{what} is required")
    if len(value) > MAX_ID_LENGTH or not ID_PATTERN.match(value):
        raise InvalidArgumentError(
            f"{what} {limits.echo(value)} is invalid: use 1-{MAX_ID_LENGTH} characters of "
            f"A-Z a-z 0-9 _ . : -"
        )
    return value


def _check_name(value: str, what: str) -> str:
    return limits.check_length(value, limits.MAX_NAME_CHARS, what)


def attempt_from_pb(msg: pb.TaskAttempt) -> ExecutionAttempt:
    _check_id(msg.vertex_id, "attempt.vertex_id")
    if msg.subtask_index < 0:
        raise InvalidArgumentError(f"attempt.subtask_index must be >= 0, got {msg.subtask_index}")
    if msg.attempt < 1:
        raise InvalidArgumentError(
            f"attempt.attempt must be >= 1 (from RegisterTask), got {msg.attempt}"
        )
    return ExecutionAttempt(msg.vertex_id, msg.subtask_index, msg.attempt)


def attempt_to_pb(a: ExecutionAttempt) -> pb.TaskAttempt:
    return pb.TaskAttempt(vertex_id=a.vertex_id, subtask_index=a.subtask_index, attempt=a.attempt)


def checkpoint_id_from_pb(value: int) -> int:
    if value < 1:
        raise InvalidArgumentError(f"checkpoint_id must be >= 1, got {value}")
    return value


def held_ms_from_pb(value: int) -> int:
    """How long an agent held an ack (``AcknowledgeCheckpointRequest.held_ms``): refused when
    negative, like the ack's metrics, or above the longest duration the coordinator takes."""
    if value < 0:
        raise InvalidArgumentError(f"held_ms must be >= 0, got {value}")
    return limits.check_duration_ms(value, "held_ms")


# --- job graph ------------------------------------------------------------------------


def graph_from_pb(msg: pb.JobGraph) -> JobGraph:
    if not msg.vertices:
        raise InvalidArgumentError("graph.vertices is empty: a job needs at least one vertex")
    if len(msg.vertices) > MAX_VERTICES:
        raise InvalidArgumentError(
            f"graph has {len(msg.vertices)} vertices; at most {MAX_VERTICES}"
        )
    if len(msg.edges) > limits.MAX_EDGES:
        raise InvalidArgumentError(f"graph has {len(msg.edges)} edges; at most {limits.MAX_EDGES}")
    _check_name(msg.name, "graph.name")
    vertices: list[JobVertex] = []
    seen: set[str] = set()
    for i, v in enumerate(msg.vertices):
        vid = _check_id(v.vertex_id, f"graph.vertices[{i}].vertex_id")
        if vid in seen:
            raise InvalidArgumentError(f"graph.vertices[{i}].vertex_id {vid!r} is duplicated")
        seen.add(vid)
        limits.check_length(v.name, limits.MAX_VERTEX_NAME_CHARS, f"vertex {vid!r} name")
        if not v.operators:
            raise InvalidArgumentError(
                f"vertex {vid!r} has no operators: a vertex runs a chain of at least one"
            )
        if len(v.operators) > limits.MAX_OPERATORS_PER_VERTEX:
            raise InvalidArgumentError(
                f"vertex {vid!r} has {len(v.operators)} operators; at most "
                f"{limits.MAX_OPERATORS_PER_VERTEX}"
            )
        max_p = v.max_parallelism or DEFAULT_MAX_PARALLELISM
        if not 1 <= max_p <= MAX_PARALLELISM_LIMIT:
            raise InvalidArgumentError(
                f"vertex {vid!r}: max_parallelism {max_p} out of range 1..{MAX_PARALLELISM_LIMIT}"
            )
        if not 1 <= v.parallelism <= max_p:
            raise InvalidArgumentError(
                f"vertex {vid!r}: parallelism {v.parallelism} out of range 1..{max_p} (max_parallelism)"
            )
        ops = []
        op_ids: set[str] = set()
        for j, o in enumerate(v.operators):
            oid = _check_id(o.operator_id, f"vertex {vid!r} operators[{j}].operator_id")
            if oid in op_ids:
                raise InvalidArgumentError(f"vertex {vid!r}: operator_id {oid!r} is duplicated")
            op_ids.add(oid)
            _check_name(o.name, f"vertex {vid!r} operator {oid!r} name")
            _check_name(o.kind, f"vertex {vid!r} operator {oid!r} kind")
            ops.append(OperatorSpec(oid, o.name or oid, o.kind, bytes(o.payload)))
        vertices.append(
            JobVertex(vid, v.name or vid, v.parallelism, max_p, tuple(ops), v.is_source)
        )
    by_id = {v.vertex_id: v for v in vertices}
    edges: list[JobEdge] = []
    for i, e in enumerate(msg.edges):
        for end in (e.source_vertex_id, e.target_vertex_id):
            if end not in by_id:
                raise InvalidArgumentError(
                    f"graph.edges[{i}] names unknown vertex {limits.echo(end)}"
                )
        _check_name(e.key_field, f"graph.edges[{i}].key_field")
        if e.source_vertex_id == e.target_vertex_id:
            raise InvalidArgumentError(f"graph.edges[{i}] is a self loop on {e.source_vertex_id!r}")
        kind = wire.PARTITIONER_KIND.from_pb_or(e.partitioner, None)
        if kind is None:
            raise InvalidArgumentError(
                f"graph.edges[{i}].partitioner must be FORWARD, HASH, REBALANCE or BROADCAST"
            )
        src, dst = by_id[e.source_vertex_id], by_id[e.target_vertex_id]
        if kind is PartitionerKind.FORWARD and src.parallelism != dst.parallelism:
            raise InvalidArgumentError(
                f"graph.edges[{i}]: FORWARD needs equal parallelism, "
                f"{src.vertex_id!r} has {src.parallelism} and {dst.vertex_id!r} has {dst.parallelism}"
            )
        if by_id[e.target_vertex_id].is_source:
            raise InvalidArgumentError(
                f"graph.edges[{i}] points into source vertex {dst.vertex_id!r}"
            )
        if e.key_field and kind is not PartitionerKind.HASH:
            raise InvalidArgumentError(f"graph.edges[{i}]: key_field is only for HASH edges")
        if not 0 <= e.target_input < limits.MAX_INPUTS_PER_VERTEX:
            raise InvalidArgumentError(
                f"graph.edges[{i}].target_input {e.target_input} out of range "
                f"0..{limits.MAX_INPUTS_PER_VERTEX - 1}"
            )
        _check_name(e.output_tag, f"graph.edges[{i}].output_tag")
        edges.append(
            JobEdge(
                e.source_vertex_id,
                e.target_vertex_id,
                kind,
                e.key_field,
                e.target_input,
                e.output_tag,
            )
        )
    if not any(v.is_source for v in vertices):
        raise InvalidArgumentError("graph has no source vertex (set is_source on at least one)")
    _check_inputs(edges)
    _check_acyclic(vertices, edges)
    return JobGraph(msg.name or "job", tuple(vertices), tuple(edges))


def _check_inputs(edges: list[JobEdge]) -> None:
    """A vertex's inputs are numbered 0..k-1 without gaps, and the edges of one input are
    either all HASH (the input is keyed) or none: key-group locality needs every record of a
    keyed input routed by its key."""
    inputs: dict[str, dict[int, set[bool]]] = {}
    for e in edges:
        hashed = e.partitioner is PartitionerKind.HASH
        inputs.setdefault(e.target_vertex_id, {}).setdefault(e.target_input, set()).add(hashed)
    for vertex_id, by_input in inputs.items():
        if sorted(by_input) != list(range(len(by_input))):
            raise InvalidArgumentError(
                f"vertex {vertex_id!r}: its edges feed inputs {sorted(by_input)}; inputs must "
                f"be numbered 0..{len(by_input) - 1} without gaps (JobEdge.target_input)"
            )
        for index, kinds in by_input.items():
            if len(kinds) > 1:
                raise InvalidArgumentError(
                    f"vertex {vertex_id!r} input {index}: HASH and other edges mixed; the edges "
                    f"of one input are either all HASH or none"
                )


def _check_acyclic(vertices: list[JobVertex], edges: list[JobEdge]) -> None:
    incoming = {v.vertex_id: 0 for v in vertices}
    for e in edges:
        incoming[e.target_vertex_id] += 1
    ready = [v for v, n in incoming.items() if n == 0]
    visited = 0
    while ready:
        v = ready.pop()
        visited += 1
        for e in edges:
            if e.source_vertex_id == v:
                incoming[e.target_vertex_id] -= 1
                if incoming[e.target_vertex_id] == 0:
                    ready.append(e.target_vertex_id)
    if visited != len(vertices):
        raise InvalidArgumentError("graph has a cycle; a job graph must be a DAG")


def graph_to_pb(g: JobGraph, include_payloads: bool = True) -> pb.JobGraph:
    return pb.JobGraph(
        name=g.name,
        vertices=[
            pb.JobVertex(
                vertex_id=v.vertex_id,
                name=v.name,
                parallelism=v.parallelism,
                max_parallelism=v.max_parallelism,
                is_source=v.is_source,
                operators=[
                    pb.OperatorSpec(
                        operator_id=o.operator_id,
                        name=o.name,
                        kind=o.kind,
                        payload=o.payload if include_payloads else b"",
                    )
                    for o in v.operators
                ],
            )
            for v in g.vertices
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id=e.source_vertex_id,
                target_vertex_id=e.target_vertex_id,
                partitioner=wire.PARTITIONER_KIND.to_pb(e.partitioner),
                key_field=e.key_field,
                target_input=e.target_input,
                output_tag=e.output_tag,
            )
            for e in g.edges
        ],
    )


# --- task state ----------------------------------------------------------------------------


def operator_states_from_pb(
    msgs: Iterable[pb.OperatorSubtaskState],
) -> tuple[OperatorSubtaskState, ...]:
    out = []
    for s in msgs:
        limits.check_length(s.operator_id, MAX_ID_LENGTH, "operator_states.operator_id")
        handles = []
        for h in s.handles:
            if not h.path:
                raise InvalidArgumentError(
                    f"operator {s.operator_id!r}: a state handle has an empty path"
                )
            limits.check_location(h.path, f"operator {s.operator_id!r}: state handle path")
            _check_name(h.kind, f"state handle {limits.echo(h.path)} kind")
            if h.size_bytes < 0:
                raise InvalidArgumentError(
                    f"state handle {limits.echo(h.path)}: size_bytes must be >= 0"
                )
            if h.offset < 0:
                raise InvalidArgumentError(
                    f"state handle {limits.echo(h.path)}: offset must be >= 0"
                )
            if h.data:
                # Inline state: the bytes are the state; the path only names it.
                if len(h.data) > limits.MAX_INLINE_STATE_THRESHOLD_BYTES:
                    raise InvalidArgumentError(
                        f"state handle {limits.echo(h.path)}: {len(h.data)} bytes of inline "
                        f"data, above the maximum of {limits.MAX_INLINE_STATE_THRESHOLD_BYTES}: "
                        "write larger state to a file"
                    )
                if h.size_bytes != len(h.data) or h.offset:
                    raise InvalidArgumentError(
                        f"state handle {limits.echo(h.path)}: inline data of {len(h.data)} "
                        f"bytes needs size_bytes {len(h.data)} (got {h.size_bytes}) and offset 0 "
                        f"(got {h.offset})"
                    )
            handles.append(wire.state_handle_from_pb(h))
        out.append(OperatorSubtaskState(s.operator_id, tuple(handles)))
    return tuple(out)


def operator_states_to_pb(
    states: tuple[OperatorSubtaskState, ...],
) -> list[pb.OperatorSubtaskState]:
    return [
        pb.OperatorSubtaskState(
            operator_id=s.operator_id, handles=[wire.state_handle_to_pb(h) for h in s.handles]
        )
        for s in states
    ]


def metrics_from_pb(m: pb.SubtaskCheckpointMetrics) -> SubtaskMetrics:
    metrics = SubtaskMetrics(
        sync_duration_ms=m.sync_duration_ms,
        async_duration_ms=m.async_duration_ms,
        alignment_duration_ms=m.alignment_duration_ms,
        start_delay_ms=m.start_delay_ms,
        state_size_bytes=m.state_size_bytes,
        processed_during_alignment_bytes=m.processed_during_alignment_bytes,
        persisted_in_flight_bytes=m.persisted_in_flight_bytes,
        unaligned=m.unaligned,
        records_in=m.records_in,
    )
    negative = [k for k, v in metrics.__dict__.items() if not isinstance(v, bool) and v < 0]
    if negative:
        raise InvalidArgumentError(f"metrics: {', '.join(negative)} must be >= 0")
    return metrics


def metrics_to_pb(m: SubtaskMetrics) -> pb.SubtaskCheckpointMetrics:
    return pb.SubtaskCheckpointMetrics(
        sync_duration_ms=m.sync_duration_ms,
        async_duration_ms=m.async_duration_ms,
        alignment_duration_ms=m.alignment_duration_ms,
        start_delay_ms=m.start_delay_ms,
        state_size_bytes=m.state_size_bytes,
        processed_during_alignment_bytes=m.processed_during_alignment_bytes,
        persisted_in_flight_bytes=m.persisted_in_flight_bytes,
        unaligned=m.unaligned,
        records_in=m.records_in,
    )


def task_metrics_reports_from_pb(
    reports: Iterable[cpb.TaskMetricsReport],
) -> list[tuple[ExecutionAttempt, TaskMetrics]]:
    """What a heartbeat reports per task; a bad report refuses the heartbeat, naming it."""
    out = []
    for i, r in enumerate(reports):
        attempt = attempt_from_pb(r.attempt)
        try:
            out.append((attempt, wire.task_metrics_from_pb(r.metrics)))
        except InvalidFieldError as e:
            raise e.within(f"task_metrics[{i}].metrics") from None
    return out


def task_restore_to_pb(cp: CompletedCheckpoint | None, vertex_id: str) -> cpb.TaskRestore:
    if cp is None:
        return cpb.TaskRestore()
    return cpb.TaskRestore(
        checkpoint_id=cp.checkpoint_id,
        checkpoint_path=cp.external_path,
        previous_parallelism=cp.vertex_parallelism.get(vertex_id, 0),
        vertex_state=[
            cpb.VertexSubtaskState(
                subtask_index=a.attempt.subtask_index,
                operators=operator_states_to_pb(a.operator_states),
            )
            for a in cp.subtask_states
            if a.attempt.vertex_id == vertex_id
        ],
    )


def decline_reason_from_pb(value: int) -> DeclineReason:
    """Unknown values (a newer task) are ``UNSPECIFIED``: the decline still aborts and counts."""
    return wire.DECLINE_REASON.from_pb_or(value, DeclineReason.UNSPECIFIED)


def savepoint_operation_to_pb(
    job_id: str, operation: SavepointOperation, savepoint: cpb.CheckpointSummary | None
) -> cpb.SavepointOperation:
    """An asynchronous savepoint request; ``savepoint``: its summary once COMPLETED."""
    out = cpb.SavepointOperation(
        job_id=job_id,
        request_id=operation.request_id,
        status=wire.SAVEPOINT_OPERATION_STATUS.to_pb(operation.status),
        failure=operation.failure,
    )
    if savepoint is not None:
        out.savepoint.CopyFrom(savepoint)
    return out

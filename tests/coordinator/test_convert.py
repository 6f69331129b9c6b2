"""The coordinator's proto conversion (``coordinator/convert.py``), pure: every converter pair
round-trips the model, defaults are filled as documented, and what a client may not send is
refused with an ``InvalidArgumentError`` naming the field. The service tests
(``test_*_bad_input.py``) check the same refusals end to end over gRPC."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from snapflow import limits, wire
from snapflow.checkpointing import CheckpointKind, SavepointOperationStatus
from snapflow.coordinator import convert
from snapflow.coordinator.model import (
    DEFAULT_MAX_PARALLELISM,
    AckResult,
    CompletedCheckpoint,
    DeclineReason,
    ExecutionAttempt,
    JobEdge,
    JobGraph,
    JobVertex,
    OperatorSpec,
    OperatorSubtaskState,
    StateHandle,
    SubtaskAck,
    SubtaskMetrics,
)
from snapflow.coordinator.savepoint_operations import SavepointOperation
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import PartitionerKind
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

JOB = "0123456789abcdef0123456789abcdef"


def _refused(match: str, call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        call()


# --- ids -------------------------------------------------------------------------------------


def test_job_ids_are_32_lowercase_hex_characters() -> None:
    assert convert.parse_job_id(JOB) == JOB
    generated = convert.parse_job_id("", allow_empty=True)
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert convert.parse_job_id("", allow_empty=True) != generated
    _refused(r"^job_id is required$", lambda: convert.parse_job_id(""))
    _refused(r"^request.job is required$", lambda: convert.parse_job_id("", field="request.job"))
    for bad in (JOB.upper(), JOB[:-1], JOB + "0", "g" * 32):
        with pytest.raises(InvalidArgumentError, match=r"^job_id '.*' is malformed: expected 32"):
            convert.parse_job_id(bad)


def test_checkpoint_ids_start_at_one() -> None:
    assert convert.checkpoint_id_from_pb(1) == 1
    assert convert.checkpoint_id_from_pb(2**62) == 2**62
    for bad in (0, -1):
        with pytest.raises(InvalidArgumentError, match=rf"^checkpoint_id must be >= 1, got {bad}$"):
            convert.checkpoint_id_from_pb(bad)


@pytest.mark.parametrize(
    "attempt",
    [ExecutionAttempt("map", 0, 1), ExecutionAttempt("a.b:c-d_e", 31, 7)],
    ids=str,
)
def test_attempts_round_trip(attempt: ExecutionAttempt) -> None:
    msg = convert.attempt_to_pb(attempt)
    assert convert.attempt_from_pb(pb.TaskAttempt.FromString(msg.SerializeToString())) == attempt


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (pb.TaskAttempt(subtask_index=0, attempt=1), r"^attempt.vertex_id is required$"),
        (pb.TaskAttempt(vertex_id="a b", attempt=1), r"^attempt.vertex_id 'a b' is invalid"),
        (
            pb.TaskAttempt(vertex_id="v" * (limits.MAX_ID_CHARS + 1), attempt=1),
            r"is invalid: use 1-200 characters",
        ),
        (
            pb.TaskAttempt(vertex_id="map", subtask_index=-1, attempt=1),
            r"^attempt.subtask_index must be >= 0, got -1$",
        ),
        (pb.TaskAttempt(vertex_id="map"), r"^attempt.attempt must be >= 1 \(from RegisterTask\)"),
    ],
)
def test_malformed_attempts_are_refused(msg: pb.TaskAttempt, match: str) -> None:
    _refused(match, lambda: convert.attempt_from_pb(msg))


# --- job graph -------------------------------------------------------------------------------


def _graph() -> JobGraph:
    return JobGraph(
        "wordcount",
        (
            JobVertex(
                "src", "source", 2, 128, (OperatorSpec("read", "read", "source", b"\x01"),), True
            ),
            JobVertex(
                "count",
                "count per word",
                4,
                64,
                (
                    OperatorSpec("agg", "aggregate", "process", b"pickled"),
                    OperatorSpec("out", "print", "sink"),
                ),
            ),
            JobVertex("side", "side", 4, 64, (OperatorSpec("s", "s", "sink"),)),
            JobVertex("all", "all", 1, 1, (OperatorSpec("b", "b", "sink"),)),
        ),
        (
            JobEdge("src", "count", PartitionerKind.HASH, "word"),
            JobEdge("count", "side", PartitionerKind.FORWARD),
            JobEdge("src", "all", PartitionerKind.BROADCAST),
            JobEdge("side", "all", PartitionerKind.REBALANCE),
        ),
    )


def test_a_graph_round_trips_with_every_partitioner() -> None:
    graph = _graph()
    assert {e.partitioner for e in graph.edges} == set(PartitionerKind)
    msg = convert.graph_to_pb(graph)
    assert convert.graph_from_pb(pb.JobGraph.FromString(msg.SerializeToString())) == graph


def test_a_graph_without_payloads_keeps_everything_else() -> None:
    msg = convert.graph_to_pb(_graph(), include_payloads=False)
    assert all(not o.payload for v in msg.vertices for o in v.operators)
    stripped = replace(
        _graph(),
        vertices=tuple(
            replace(v, operators=tuple(replace(o, payload=b"") for o in v.operators))
            for v in _graph().vertices
        ),
    )
    assert convert.graph_from_pb(msg) == stripped


def test_graph_defaults_names_and_max_parallelism() -> None:
    msg = pb.JobGraph(
        vertices=[
            pb.JobVertex(
                vertex_id="v",
                parallelism=3,
                is_source=True,
                operators=[pb.OperatorSpec(operator_id="o")],
            )
        ]
    )
    assert convert.graph_from_pb(msg) == JobGraph(
        "job",
        (JobVertex("v", "v", 3, DEFAULT_MAX_PARALLELISM, (OperatorSpec("o", "o", ""),), True),),
    )


def _vertex(vid: str, parallelism: int = 1, *, source: bool = False, **kw: Any) -> pb.JobVertex:
    ops = kw.pop("operators", [pb.OperatorSpec(operator_id="op")])
    return pb.JobVertex(
        vertex_id=vid, parallelism=parallelism, is_source=source, operators=ops, **kw
    )


def _edge(
    src: str, dst: str, kind: PartitionerKind = PartitionerKind.FORWARD, **kw: Any
) -> pb.JobEdge:
    return pb.JobEdge(
        source_vertex_id=src,
        target_vertex_id=dst,
        partitioner=wire.PARTITIONER_KIND.to_pb(kind),
        **kw,
    )


SRC = _vertex("src", source=True)
SINK = _vertex("sink")


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (pb.JobGraph(), r"^graph.vertices is empty"),
        (pb.JobGraph(vertices=[SRC, SRC]), r"^graph.vertices\[1\].vertex_id 'src' is duplicated$"),
        (
            pb.JobGraph(vertices=[_vertex("", source=True)]),
            r"^graph.vertices\[0\].vertex_id is required$",
        ),
        (
            pb.JobGraph(vertices=[_vertex("v", source=True, operators=[])]),
            r"^vertex 'v' has no operators",
        ),
        (
            pb.JobGraph(vertices=[_vertex("v", 0, source=True)]),
            r"^vertex 'v': parallelism 0 out of range 1..128",
        ),
        (
            pb.JobGraph(vertices=[_vertex("v", 5, source=True, max_parallelism=4)]),
            r"^vertex 'v': parallelism 5 out of range 1..4 \(max_parallelism\)$",
        ),
        (
            pb.JobGraph(
                vertices=[_vertex("v", source=True, max_parallelism=limits.MAX_PARALLELISM + 1)]
            ),
            r"^vertex 'v': max_parallelism 32769 out of range 1..32768$",
        ),
        (
            pb.JobGraph(
                vertices=[
                    _vertex(
                        "v",
                        source=True,
                        operators=[
                            pb.OperatorSpec(operator_id="o"),
                            pb.OperatorSpec(operator_id="o"),
                        ],
                    )
                ]
            ),
            r"^vertex 'v': operator_id 'o' is duplicated$",
        ),
        (
            pb.JobGraph(
                vertices=[_vertex(f"v{i}", source=True) for i in range(limits.MAX_VERTICES + 1)]
            ),
            r"^graph has 1001 vertices; at most 1000$",
        ),
        (pb.JobGraph(vertices=[SINK]), r"^graph has no source vertex"),
        (
            pb.JobGraph(vertices=[SRC, SINK], edges=[_edge("src", "nope")]),
            r"^graph.edges\[0\] names unknown vertex",
        ),
        (
            pb.JobGraph(vertices=[SRC, SINK], edges=[_edge("sink", "sink")]),
            r"^graph.edges\[0\] is a self loop",
        ),
        (
            pb.JobGraph(
                vertices=[SRC, SINK],
                edges=[pb.JobEdge(source_vertex_id="src", target_vertex_id="sink")],
            ),
            r"^graph.edges\[0\].partitioner must be FORWARD, HASH, REBALANCE or BROADCAST$",
        ),
        (
            pb.JobGraph(vertices=[SRC, _vertex("sink", 2)], edges=[_edge("src", "sink")]),
            r"^graph.edges\[0\]: FORWARD needs equal parallelism",
        ),
        (
            pb.JobGraph(vertices=[SRC, _vertex("s2", source=True)], edges=[_edge("src", "s2")]),
            r"^graph.edges\[0\] points into source vertex 's2'$",
        ),
        (
            pb.JobGraph(vertices=[SRC, SINK], edges=[_edge("src", "sink", key_field="k")]),
            r"^graph.edges\[0\]: key_field is only for HASH edges$",
        ),
        (
            pb.JobGraph(
                vertices=[SRC, _vertex("a"), _vertex("b")],
                edges=[_edge("src", "a"), _edge("a", "b"), _edge("b", "a")],
            ),
            r"^graph has a cycle",
        ),
    ],
)
def test_malformed_graphs_are_refused(msg: pb.JobGraph, match: str) -> None:
    _refused(match, lambda: convert.graph_from_pb(msg))


def test_an_unknown_partitioner_number_is_refused() -> None:
    edge = _edge("src", "sink")
    edge.partitioner = 99  # type: ignore[assignment]  # a number a newer client might send
    _refused(
        r"partitioner must be",
        lambda: convert.graph_from_pb(pb.JobGraph(vertices=[SRC, SINK], edges=[edge])),
    )


# --- task state, metrics, restore ------------------------------------------------------------


STATES = (
    OperatorSubtaskState(
        "agg",
        (
            StateHandle("/chk/chk-3/agg-0", 1024, "keyed", 0, 63, 0),
            StateHandle("/chk/shared/agg-0.sst", 4096, "keyed", 0, 63, 512),
        ),
    ),
    OperatorSubtaskState("src", (StateHandle("s3://b/chk-3/src-0", 10, "operator"),)),
    OperatorSubtaskState("empty"),
)


def test_operator_states_round_trip() -> None:
    msgs = convert.operator_states_to_pb(STATES)
    assert convert.operator_states_from_pb(msgs) == STATES


def test_a_handle_without_a_kind_is_keyed() -> None:
    msg = pb.OperatorSubtaskState(
        operator_id="o", handles=[pb.StateHandle(path="/p", size_bytes=1)]
    )
    assert convert.operator_states_from_pb([msg]) == (
        OperatorSubtaskState("o", (StateHandle("/p", 1),)),
    )


@pytest.mark.parametrize(
    ("handle", "match"),
    [
        (pb.StateHandle(size_bytes=1), r"^operator 'o': a state handle has an empty path$"),
        (pb.StateHandle(path="/p", size_bytes=-1), r"^state handle '/p': size_bytes must be >= 0$"),
        (pb.StateHandle(path="/p", offset=-1), r"^state handle '/p': offset must be >= 0$"),
        (
            pb.StateHandle(path="/chk/" + "x" * 256),
            r"^operator 'o': state handle path has a path segment of 256 bytes",
        ),
    ],
)
def test_malformed_state_handles_are_refused(handle: pb.StateHandle, match: str) -> None:
    msg = pb.OperatorSubtaskState(operator_id="o", handles=[handle])
    _refused(match, lambda: convert.operator_states_from_pb([msg]))


def test_metrics_round_trip_and_negative_values_are_refused() -> None:
    metrics = SubtaskMetrics(1, 2, 3, 4, 5, 6, 7, True, 8)
    assert convert.metrics_from_pb(convert.metrics_to_pb(metrics)) == metrics
    assert convert.metrics_from_pb(pb.SubtaskCheckpointMetrics()) == SubtaskMetrics()
    bad = pb.SubtaskCheckpointMetrics(sync_duration_ms=-1, records_in=-2)
    _refused(
        r"^metrics: sync_duration_ms, records_in must be >= 0$",
        lambda: convert.metrics_from_pb(bad),
    )


def test_a_task_restore_carries_only_its_vertex_states() -> None:
    assert convert.task_restore_to_pb(None, "map") == cpb.TaskRestore()
    cp = CompletedCheckpoint(
        JOB,
        3,
        CheckpointKind.CHECKPOINT,
        100,
        200,
        "/chk/chk-3",
        (
            SubtaskAck(ExecutionAttempt("agg", 1, 2), 150, STATES[:1]),
            SubtaskAck(ExecutionAttempt("src", 0, 1), 140, STATES[1:2]),
            SubtaskAck(ExecutionAttempt("agg", 0, 2), 160, ()),
        ),
        vertex_parallelism={"agg": 2, "src": 1},
    )
    assert convert.task_restore_to_pb(cp, "agg") == cpb.TaskRestore(
        checkpoint_id=3,
        checkpoint_path="/chk/chk-3",
        previous_parallelism=2,
        vertex_state=[
            cpb.VertexSubtaskState(
                subtask_index=1, operators=convert.operator_states_to_pb(STATES[:1])
            ),
            cpb.VertexSubtaskState(subtask_index=0),
        ],
    )


# --- enums -----------------------------------------------------------------------------------


def test_every_ack_result_round_trips_under_its_proto_name() -> None:
    for result in AckResult:
        number = convert.ACK_RESULT.to_pb(result)
        assert cpb.AckResult.Name(number) == f"ACK_RESULT_{result.name}"
        assert convert.ACK_RESULT.from_pb(number) is result
    assert set(cpb.AckResult.values()) - {0} == {convert.ACK_RESULT.to_pb(r) for r in AckResult}


def test_decline_reasons_a_newer_task_sends_are_unspecified() -> None:
    for reason in DeclineReason:
        assert convert.decline_reason_from_pb(wire.DECLINE_REASON.to_pb(reason)) is reason
    assert convert.decline_reason_from_pb(99) is DeclineReason.UNSPECIFIED


@pytest.mark.parametrize("status", list(SavepointOperationStatus), ids=lambda s: s.name)
def test_savepoint_operations(status: SavepointOperationStatus) -> None:
    op = SavepointOperation("req-1", CheckpointKind.SAVEPOINT, status, failure="disk full")
    summary = cpb.CheckpointSummary(checkpoint_id=9, external_path="/sp/savepoint-9")
    msg = convert.savepoint_operation_to_pb(JOB, op, summary)
    assert msg == cpb.SavepointOperation(
        job_id=JOB,
        request_id="req-1",
        status=wire.SAVEPOINT_OPERATION_STATUS.to_pb(status),
        failure="disk full",
        savepoint=summary,
    )
    assert wire.SAVEPOINT_OPERATION_STATUS.from_pb(msg.status) is status
    assert not convert.savepoint_operation_to_pb(JOB, op, None).HasField("savepoint")


def test_inline_state_is_bounded_and_must_say_its_own_size() -> None:
    """Inline bytes above Flink's 1 MB maximum of the memory threshold are refused (a gRPC
    message larger than the server's limit is refused before this, RESOURCE_EXHAUSTED)."""
    most = limits.MAX_INLINE_STATE_THRESHOLD_BYTES

    def states(data: bytes, size: int, offset: int = 0) -> list[pb.OperatorSubtaskState]:
        handle = pb.StateHandle(path="/chk/op.state", size_bytes=size, data=data, offset=offset)
        return [pb.OperatorSubtaskState(operator_id="op", handles=[handle])]

    (state,) = convert.operator_states_from_pb(states(b"s" * most, most))
    assert state.handles[0].is_inline and len(state.handles[0].data) == most
    for msg, match in [
        (states(b"s" * (most + 1), most + 1), "1048577 bytes of inline data, above the maximum"),
        (states(b"abc", 5), r"inline data of 3 bytes needs size_bytes 3 \(got 5\)"),
        (states(b"abc", 3, 7), r"and offset 0 \(got 7\)"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            convert.operator_states_from_pb(msg)

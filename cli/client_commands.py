"""The client commands (README.md, "The CLI against a running coordinator"): ``jobs``, ``job``,
``info`` (a job's graph), ``checkpoints list|show``, ``trigger``, ``savepoint``, ``stop``,
``cancel``, ``dispose-savepoint``, and ``savepoint-status`` for a ``savepoint``/``stop
--detach``. Each calls the coordinator's gRPC API with a deadline (``--timeout``) and prints
tables, or the raw response with ``--json`` (``snapflow.cli.formatting``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from snapflow import wire
from snapflow.checkpointing import CheckpointMode, CheckpointStatus, SavepointOperationStatus
from snapflow.cli.client import absolute_target, connect
from snapflow.cli.formatting import (
    NAME_WIDTH,
    PATH_WIDTH,
    Column,
    checkpoint_kind,
    checkpoint_mode,
    enum_name,
    failure_text,
    fitted_table,
    format_attempt,
    format_bytes,
    format_ms,
    format_time,
    job_state,
    key_values,
    print_json,
    size_text,
    status_text,
    stdout_console,
    summary_line,
    summary_status,
    task_state,
    to_dict,
)
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb


def cmd_jobs(args: argparse.Namespace) -> int:
    with connect(args) as c:
        response = c.stub.ListJobs(cpb.ListJobsRequest(), timeout=c.timeout)
    if args.state:  # the coordinator has no filter: keep the jobs in the asked states here
        kept = [job for job in response.jobs if job.state in args.state]
        del response.jobs[:]
        response.jobs.extend(kept)
    if args.json:
        print_json(response)
        return 0
    console = stdout_console()
    if not response.jobs:
        console.print("no jobs" if not args.state else "no jobs in that state")
        return 0
    columns = [
        Column("Job ID"),
        Column("Name", 3, wrap=NAME_WIDTH),
        Column("State"),
        Column("Tasks", 1, justify="right"),
        Column("Restarts", 4, justify="right"),
        Column("Latest", 2, justify="right"),  # the latest completed checkpoint
        Column("Created", 5),
    ]
    rows = [
        [
            job.job_id,
            job.name or "-",
            job_state(job.state),
            f"{job.running_tasks}/{job.total_tasks}",
            str(job.restarts),
            str(job.latest_completed_checkpoint_id or "-"),
            format_time(job.created_at_ms),
        ]
        for job in response.jobs
    ]
    console.print(fitted_table(console, columns, rows))
    return 0


def _job_rows(job: cpb.JobInfo) -> list[tuple[str, str]]:
    cfg = job.checkpoint_config
    vertices = ", ".join(
        f"{v.name or v.vertex_id} ({v.vertex_id}) x{v.parallelism}" for v in job.graph.vertices
    )
    interval = f"{cfg.interval_ms} ms" if cfg.interval_ms else "disabled"
    # UNSPECIFIED is ALIGNED (snapflow.wire); an unknown number is shown as itself.
    mode = cfg.mode or wire.CHECKPOINT_MODE.to_pb(CheckpointMode.ALIGNED)
    rows = [
        ("Job ID", job.job_id),
        ("Name", job.name or "-"),
        ("State", job_state(job.state)),
        ("Created", format_time(job.created_at_ms)),
        ("Tasks running", f"{job.running_tasks}/{job.total_tasks}"),
        ("Restarts", str(job.restarts)),
        ("Latest checkpoint", str(job.latest_completed_checkpoint_id or "-")),
        ("Vertices", vertices or "-"),
        ("Checkpoint interval", interval),
        ("Checkpoint mode", checkpoint_mode(mode)),
        ("Checkpoint timeout", f"{cfg.timeout_ms} ms" if cfg.timeout_ms else "default"),
        ("Checkpoint storage", cfg.storage_uri or "coordinator default"),
    ]
    if job.failure:
        rows.append(("Failure", job.failure))
    return rows


def cmd_job(args: argparse.Namespace) -> int:
    with connect(args) as c:
        job = c.stub.GetJob(cpb.GetJobRequest(job_id=args.job_id), timeout=c.timeout)
        tasks = c.stub.ListTasks(cpb.ListTasksRequest(job_id=args.job_id), timeout=c.timeout)
    if args.json:
        print(json.dumps({"job": to_dict(job), "tasks": to_dict(tasks)["tasks"]}, indent=2))
        return 0
    console = stdout_console()
    console.print(key_values(None, _job_rows(job)))
    console.print()
    if not tasks.tasks:
        console.print("no tasks registered")
        return 0
    columns = [
        Column("Vertex"),
        Column("Subtask", justify="right"),
        Column("Attempt", 2, justify="right"),
        Column("State"),
        Column("Address", 1),
        Column("Failure", wrap=PATH_WIDTH),
    ]
    rows = [
        [
            t.attempt.vertex_id,
            str(t.attempt.subtask_index),
            str(t.attempt.attempt),
            task_state(t.state),
            t.address or "-",
            t.failure or "",
        ]
        for t in tasks.tasks
    ]
    console.print(fitted_table(console, columns, rows, title="Tasks"))
    return 0


def _partitioning(edge: pb.JobEdge) -> str:
    name = enum_name(pb.PartitionerKind, edge.partitioner, "PARTITIONER_KIND_")
    return f"{name}({edge.key_field})" if edge.key_field else name


def _edge_source(edge: pb.JobEdge) -> str:
    """An edge's upstream vertex, with the side output it carries: ``v1-x [side: late]``."""
    tag = f" [side: {edge.output_tag}]" if edge.output_tag else ""
    return edge.source_vertex_id + tag


def _inputs(vertex: pb.JobVertex, edges: list[pb.JobEdge]) -> str:
    """Where a vertex's data comes from: ``-`` for a source, the upstream vertices of its one
    input joined by ``+`` (a union), or per logical input ``in0: ...; in1: ...``."""
    by_input: dict[int, list[str]] = {}
    for e in edges:
        if e.target_vertex_id == vertex.vertex_id:
            by_input.setdefault(e.target_input, []).append(_edge_source(e))
    if not by_input:
        return "-"
    if len(by_input) == 1 and 0 in by_input:
        return " + ".join(by_input[0])
    return "; ".join(f"in{i}: {' + '.join(by_input[i])}" for i in sorted(by_input))


def cmd_info(args: argparse.Namespace) -> int:
    with connect(args) as c:
        job = c.stub.GetJob(cpb.GetJobRequest(job_id=args.job_id), timeout=c.timeout)
    graph = job.graph
    if args.json:
        print_json(job)
        return 0
    console = stdout_console()
    edges = list(graph.edges)
    console.print(
        f"Job {job.job_id} ({job.name or '-'}): {job_state(job.state)}, "
        f"{len(graph.vertices)} vertices, {len(edges)} edges"
    )
    vertex_rows = [
        [
            v.vertex_id + (" (source)" if v.is_source else ""),
            str(v.parallelism),
            str(v.max_parallelism or 128),
            " -> ".join(o.name or o.kind or o.operator_id for o in v.operators) or v.name or "-",
            _inputs(v, edges),
        ]
        for v in graph.vertices
    ]
    vertex_columns = [
        Column("Vertex"),
        Column("Parallelism", justify="right"),
        Column("Max", 2, justify="right"),  # max parallelism (key groups)
        Column("Operators (chained)", wrap=NAME_WIDTH),
        Column("Inputs", 1, wrap=NAME_WIDTH),
    ]
    console.print(
        fitted_table(console, vertex_columns, vertex_rows, title="Vertices", title_justify="left")
    )
    parallelism = {v.vertex_id: v.parallelism for v in graph.vertices}
    # The logical input an edge feeds, for the targets with several inputs.
    several_inputs = {e.target_vertex_id for e in edges if e.target_input}
    edge_rows = [
        [
            _edge_source(e),
            e.target_vertex_id
            + (f" in{e.target_input}" if e.target_vertex_id in several_inputs else ""),
            _partitioning(e),
            f"{parallelism.get(e.source_vertex_id, '?')} -> {parallelism.get(e.target_vertex_id, '?')}",
        ]
        for e in edges
    ]
    edge_columns = [
        Column("From"),
        Column("To"),
        Column("Partitioning", wrap=NAME_WIDTH),
        Column("Parallelism", 1),
    ]
    if edges:
        console.print(
            fitted_table(console, edge_columns, edge_rows, title="Edges", title_justify="left")
        )
    else:
        console.print("no edges")
    return 0


def _quantile_row(name: str, q: cpb.Quantiles, fmt: Callable[[float], str]) -> list[str]:
    return [name, *(fmt(v) for v in (q.min, q.avg, q.p50, q.p90, q.p99, q.max))]


def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    with connect(args) as c:
        stats = c.stub.GetCheckpointStats(
            cpb.GetCheckpointStatsRequest(job_id=args.job_id, history_size=args.history),
            timeout=c.timeout,
        )
    if args.json:
        print_json(stats)
        return 0
    console = stdout_console()
    n = stats.counts
    console.print(
        f"Checkpoints: triggered {n.triggered}, in progress {n.in_progress}, "
        f"completed {n.completed}, failed {n.failed}, restored {n.restored}"
    )
    latest = [
        (
            "Latest completed",
            summary_line(stats.latest_completed) if stats.HasField("latest_completed") else "-",
        ),
        (
            "Latest failed",
            summary_line(stats.latest_failed) if stats.HasField("latest_failed") else "-",
        ),
        (
            "Latest savepoint",
            summary_line(stats.latest_savepoint) if stats.HasField("latest_savepoint") else "-",
        ),
    ]
    if stats.HasField("latest_restore"):
        r = stats.latest_restore
        what = "savepoint" if r.is_savepoint else "checkpoint"
        restore = f"#{r.checkpoint_id} ({what}) at {format_time(r.restore_timestamp_ms)}"
        if r.external_path:
            restore += f", {r.external_path}"
        latest.append(("Latest restore", restore))
    else:
        latest.append(("Latest restore", "-"))
    console.print(key_values(None, latest))
    console.print()

    if stats.history:
        columns = [
            Column("ID", justify="right"),
            Column("Kind"),
            Column("Status"),
            Column("Triggered", 5),
            Column("Duration", 2, justify="right"),
            Column("State size", 3, justify="right"),
            Column("Incremental", 6, justify="right"),
            Column("Acked", 4, justify="right"),
            Column("Path / failure", wrap=PATH_WIDTH),
        ]
        rows = []
        for s in stats.history:
            in_progress = summary_status(s) is CheckpointStatus.IN_PROGRESS
            rows.append(
                [
                    str(s.checkpoint_id),
                    checkpoint_kind(s.kind),
                    status_text(s),
                    format_time(s.trigger_timestamp_ms),
                    "-" if in_progress else f"{format_ms(s.end_to_end_duration_ms)} ms",
                    format_bytes(s.state_size_bytes),
                    format_bytes(s.incremental_size_bytes),
                    f"{s.num_acknowledged}/{s.num_tasks}",
                    failure_text(s)
                    if summary_status(s) is CheckpointStatus.FAILED
                    else s.external_path,
                ]
            )
        title = "History (newest first)"
        if any(s.discarded for s in stats.history):
            title += "; DISCARDED: completed, its files deleted by retention or disposal"
        console.print(fitted_table(console, columns, rows, title=title, title_justify="left"))
    else:
        console.print("no checkpoints in the history")

    if stats.end_to_end_duration_ms.max or stats.state_size_bytes.max:
        columns = [
            Column("", wrap=NAME_WIDTH),
            Column("min", 3, justify="right"),
            Column("avg", 2, justify="right"),
            Column("p50", justify="right"),
            Column("p90", 1, justify="right"),
            Column("p99", justify="right"),
            Column("max", justify="right"),
        ]
        rows = [
            _quantile_row("End-to-end duration (ms)", stats.end_to_end_duration_ms, format_ms),
            _quantile_row("State size", stats.state_size_bytes, format_bytes),
            _quantile_row("Incremental size", stats.incremental_size_bytes, format_bytes),
            _quantile_row(
                "Processed during alignment", stats.processed_during_alignment_bytes, format_bytes
            ),
            _quantile_row("Persisted in-flight", stats.persisted_in_flight_bytes, format_bytes),
        ]
        console.print()
        console.print(
            fitted_table(
                console,
                columns,
                rows,
                title="Summary of completed checkpoints (since the coordinator started)",
                title_justify="left",
            )
        )
    return 0


def cmd_checkpoints_show(args: argparse.Namespace) -> int:
    with connect(args) as c:
        details = c.stub.GetCheckpointDetails(
            cpb.GetCheckpointDetailsRequest(job_id=args.job_id, checkpoint_id=args.checkpoint_id),
            timeout=c.timeout,
        )
    if args.json:
        print_json(details)
        return 0
    console = stdout_console()
    s = details.summary
    rows = [
        ("Checkpoint", str(s.checkpoint_id)),
        ("Kind", checkpoint_kind(s.kind)),
        ("Status", status_text(s)),
        ("Triggered", format_time(s.trigger_timestamp_ms)),
        ("Latest ack", format_time(s.latest_ack_timestamp_ms)),
        ("End-to-end duration", f"{format_ms(s.end_to_end_duration_ms)} ms"),
        ("State size", format_bytes(s.state_size_bytes)),
        ("Incremental size", format_bytes(s.incremental_size_bytes)),
        ("Shared (reused)", format_bytes(s.shared_size_bytes)),
        ("Processed during alignment", format_bytes(s.processed_during_alignment_bytes)),
        ("Persisted in-flight", format_bytes(s.persisted_in_flight_bytes)),
        ("Unaligned", "yes" if s.unaligned else "no"),
        ("Acknowledged", f"{s.num_acknowledged}/{s.num_tasks}"),
        ("Path", s.external_path or "-"),
    ]
    if summary_status(s) is CheckpointStatus.FAILED:
        rows.append(("Failure", failure_text(s)))
    console.print(key_values(None, rows))
    console.print()
    columns = [
        Column("Task"),
        Column("Acked"),
        Column("Ack time", 8),
        Column("E2E (ms)", 1, justify="right"),
        Column("Sync (ms)", 3, justify="right"),
        Column("Async (ms)", 3, justify="right"),
        Column("Alignment (ms)", 4, justify="right"),
        Column("Start delay (ms)", 6, justify="right"),
        Column("State size", 2, justify="right"),
        Column("Incremental", 7, justify="right"),
        Column("In-flight", 5, justify="right"),
    ]
    table_rows: list[list[str]] = []
    for sub in details.subtasks:
        if sub.acknowledged:
            m = sub.metrics
            metrics = [
                format_time(sub.ack_timestamp_ms),
                format_ms(sub.end_to_end_duration_ms),
                format_ms(m.sync_duration_ms),
                format_ms(m.async_duration_ms),
                format_ms(m.alignment_duration_ms),
                format_ms(m.start_delay_ms),
                format_bytes(m.state_size_bytes),
                format_bytes(sub.incremental_size_bytes),
                format_bytes(m.persisted_in_flight_bytes),
            ]
        else:
            metrics = ["-"] * 9
        table_rows.append(
            [format_attempt(sub.attempt), "yes" if sub.acknowledged else "no", *metrics]
        )
    console.print(
        fitted_table(console, columns, table_rows, title="Subtasks", title_justify="left")
    )
    return 0


def _print_completed(what: str, s: cpb.CheckpointSummary, suffix: str = "") -> None:
    stdout_console().print(
        f"{what} {s.checkpoint_id} completed in {format_ms(s.end_to_end_duration_ms)} ms "
        f"({size_text(s)}, {s.num_acknowledged}/{s.num_tasks} tasks)"
        f"{suffix}: {s.external_path}"
    )


def cmd_trigger(args: argparse.Namespace) -> int:
    with connect(args) as c:
        summary = c.stub.TriggerCheckpoint(
            cpb.TriggerCheckpointRequest(job_id=args.job_id), timeout=c.timeout
        )
    if args.json:
        print_json(summary)
    else:
        _print_completed("Checkpoint", summary)
    return 0


def _start_savepoint(args: argparse.Namespace, stop: bool, drain: bool) -> int:
    """``--detach``: start the savepoint, print its request id and return (Flink REST's
    trigger id); ``snapflow savepoint-status JOB ID`` polls it."""
    with connect(args) as c:
        op = c.stub.StartSavepoint(
            cpb.StartSavepointRequest(
                job_id=args.job_id,
                target_directory=absolute_target(args.target),
                stop=stop,
                drain=drain,
            ),
            timeout=c.timeout,
        )
    if args.json:
        print_json(op)
    else:
        stdout_console().print(
            f"savepoint request {op.request_id} started for job {op.job_id}; poll it with: "
            f"snapflow savepoint-status {op.job_id} {op.request_id}",
            soft_wrap=True,
        )
    return 0


SAVEPOINT_STATUS_EXIT = {
    SavepointOperationStatus.IN_PROGRESS: 0,
    SavepointOperationStatus.COMPLETED: 0,
    SavepointOperationStatus.FAILED: 1,
}


def cmd_savepoint_status(args: argparse.Namespace) -> int:
    with connect(args) as c:
        op = c.stub.GetSavepointOperation(
            cpb.GetSavepointOperationRequest(job_id=args.job_id, request_id=args.request_id),
            timeout=c.timeout,
        )
    status = wire.SAVEPOINT_OPERATION_STATUS.from_pb_or(op.status, None)
    if args.json:
        print_json(op)
    elif status is SavepointOperationStatus.COMPLETED:
        _print_completed("Savepoint", op.savepoint)
    elif status is SavepointOperationStatus.FAILED:
        stdout_console().print(
            f"savepoint request {op.request_id} FAILED: {op.failure}", soft_wrap=True
        )
    else:
        stdout_console().print(f"savepoint request {op.request_id} IN_PROGRESS")
    return 1 if status is None else SAVEPOINT_STATUS_EXIT[status]


def cmd_savepoint(args: argparse.Namespace) -> int:
    if args.detach:
        return _start_savepoint(args, stop=False, drain=False)
    with connect(args) as c:
        summary = c.stub.TriggerSavepoint(
            cpb.TriggerSavepointRequest(
                job_id=args.job_id, target_directory=absolute_target(args.target)
            ),
            timeout=c.timeout,
        )
    if args.json:
        print_json(summary)
    else:
        _print_completed("Savepoint", summary)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    if args.detach:
        return _start_savepoint(args, stop=True, drain=args.drain)
    with connect(args) as c:
        summary = c.stub.StopWithSavepoint(
            cpb.StopWithSavepointRequest(
                job_id=args.job_id, target_directory=absolute_target(args.target), drain=args.drain
            ),
            timeout=c.timeout,
        )
    if args.json:
        print_json(summary)
    else:
        how = "drained and stopped" if args.drain else "stopped"
        _print_completed("Savepoint", summary, f"; job {args.job_id} {how}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with connect(args) as c:
        job = c.stub.CancelJob(cpb.CancelJobRequest(job_id=args.job_id), timeout=c.timeout)
    if args.json:
        print_json(job)
    else:
        stdout_console().print(f"job {job.job_id}: {job_state(job.state)}")
    return 0


def cmd_dispose_savepoint(args: argparse.Namespace) -> int:
    path = absolute_target(args.path)
    with connect(args) as c:
        response = c.stub.DisposeSavepoint(
            cpb.DisposeSavepointRequest(savepoint_path=path), timeout=c.timeout
        )
    if args.json:
        print_json(response)
    else:
        stdout_console().print(f"savepoint {path} disposed")
    return 0

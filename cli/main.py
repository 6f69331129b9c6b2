"""The ``snapflow`` command line (README.md, "The CLI against a running coordinator").

``snapflow coordinator`` runs the coordinator service. The client commands (``jobs``, ``job``,
``checkpoints list|show``, ``trigger``, ``savepoint``, ``stop``, ``cancel``,
``dispose-savepoint``, and ``savepoint-status`` for a ``savepoint``/``stop --detach``) call its gRPC API with a deadline (``--timeout``) and print tables, or
the raw response with ``--json`` (int64 fields as JSON numbers, not the strings of the proto3
JSON mapping); ``info`` shows a job's graph. Tables fit the terminal (80 columns and up): ids,
states and numbers are never cut or wrapped, paths, names and failures wrap, and the least
important columns are left out when they do not fit (``--json`` has everything). ``snapflow run PIPELINE.py``
runs a pipeline file on Spark (see docs/spark_bridge.md). ``snapflow demo`` runs the demo
(``snapflow.cli.demo``).

Exit codes: 0 success; 1 the server refused or failed the call (``error: CODE: details`` on
stderr), or the coordinator failed to start; 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from snapflow import wire
from snapflow.checkpointing import CheckpointMode, CheckpointStatus, SavepointOperationStatus
from snapflow.errors import ConfigError
from snapflow.jobgraph import JobState
from snapflow.leader_channel import sync_leader_channel
from snapflow.security import SECURITY_FIELDS, SecuritySettings
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

ADDRESS_ENV = "SNAPFLOW_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0
# The CLI trusts its coordinator: accept responses up to gRPC's own limit.
MAX_RECEIVE_BYTES = 2**31 - 1
# Width of tables when stdout is not a terminal (and COLUMNS is not set): wide enough that a
# 32-character job id and a checkpoint path are never wrapped, so the output stays greppable.
PIPE_WIDTH = 200

Handler = Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------------------------------------
# Formatting helpers
# ---------------------------------------------------------------------------------------------


def _console() -> Console:
    """A console on the current ``sys.stdout`` (looked up per call, so redirection works)."""
    stdout = sys.stdout
    tty = bool(getattr(stdout, "isatty", lambda: False)())
    width = None if tty or "COLUMNS" in os.environ else PIPE_WIDTH
    # No markup or emoji codes: job names, paths and failure messages are printed verbatim.
    return Console(
        file=stdout, width=width, highlight=False, markup=False, emoji=False, soft_wrap=False
    )


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    """``JOB_STATE_RUNNING`` -> ``RUNNING``; an unknown number prints as itself."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return str(value)
    return name.removeprefix(prefix)


def job_state(value: int) -> str:
    return _enum_name(pb.JobState, value, "JOB_STATE_")


def task_state(value: int) -> str:
    return _enum_name(pb.TaskState, value, "TASK_STATE_")


def checkpoint_kind(value: int) -> str:
    return _enum_name(pb.CheckpointKind, value, "CHECKPOINT_KIND_")


def checkpoint_status(value: int) -> str:
    return _enum_name(pb.CheckpointStatus, value, "CHECKPOINT_STATUS_")


def checkpoint_mode(value: int) -> str:
    return _enum_name(pb.CheckpointMode, value, "CHECKPOINT_MODE_")


def format_time(timestamp_ms: int) -> str:
    """Epoch milliseconds as ISO local time with the UTC offset; ``-`` for 0 (not set)."""
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000).astimezone()
    return moment.isoformat(timespec="milliseconds")


def format_bytes(size: float) -> str:
    """``1536`` -> ``1.5 KiB``; whole bytes below 1 KiB."""
    value = float(size)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_ms(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def format_attempt(attempt: pb.TaskAttempt) -> str:
    return f"{attempt.vertex_id}#{attempt.subtask_index}@{attempt.attempt}"


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _int64_as_numbers(message: Message, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (``MessageToDict`` of ``message``) with every 64-bit integer field as a JSON
    number. The proto3 JSON mapping writes them as strings (JavaScript's numbers lose
    precision above 2**53); Python's ``json`` and ``jq`` read big integers exactly, and ids,
    sizes and timestamps are numbers to a script."""
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value, nested = data[field.name], getattr(message, field.name)
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            for key in value:
                if value_field.message_type is not None:
                    _int64_as_numbers(nested[_map_key(entry, key)], value[key])
                elif value_field.type in _INT64_TYPES:
                    value[key] = int(value[key])
        elif entry is not None:
            if field.is_repeated:
                for item, item_data in zip(nested, value, strict=True):
                    _int64_as_numbers(item, item_data)
            else:
                _int64_as_numbers(nested, value)
        elif field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if field.is_repeated else int(value)
    return data


def _map_key(entry: Any, key: str) -> Any:
    """A JSON map key (always a string) as the map's key type."""
    key_type = entry.fields_by_name["key"].type
    if key_type == FieldDescriptor.TYPE_STRING:
        return key
    if key_type == FieldDescriptor.TYPE_BOOL:
        return key == "true"
    return int(key)


def _to_dict(message: Message) -> dict[str, Any]:
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _int64_as_numbers(message, data)


def _to_json(message: Message) -> str:
    return json.dumps(_to_dict(message), indent=2)


def _print_json(message: Message) -> None:
    print(_to_json(message))


# --- tables that fit -------------------------------------------------------------------------


class Column:
    """A table column. ``keep``: 0 for columns never left out (ids, states, paths); larger
    numbers are left out first when the table does not fit. ``wrap``: the content may wrap
    (names, paths, failures; folded at the width, never cut) in a column at least ``wrap``
    wide (less when the content is shorter); ``wrap=0``: never wrapped or cut (ids, states,
    numbers, times)."""

    def __init__(self, header: str, keep: int = 0, *, wrap: int = 0, justify: str = "left") -> None:
        self.header = header
        self.keep = keep
        self.wrap = wrap
        self.justify = justify


NAME_WIDTH = 12  # the narrowest a wrapped name gets before columns are left out
PATH_WIDTH = 34  # the narrowest a wrapped path gets: a checkpoint path in two or three lines


def _fitted_table(
    console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], **options: Any
) -> Table:
    """A table of ``rows`` that fits ``console.width``: columns are left out, highest ``keep``
    first, until the widths it needs (full width for unwrapped columns, their ``wrap`` width
    for wrapping ones, plus borders and padding) fit."""
    shown = list(range(len(columns)))

    def needed(index: int) -> int:
        column = columns[index]
        widest = max([cell_len(column.header), *(cell_len(r[index]) for r in rows)])
        return min(widest, column.wrap) if column.wrap else widest

    while True:
        # Default box: one border per column plus one, one space of padding on each side.
        width = sum(needed(i) + 3 for i in shown) + 1
        droppable = [i for i in shown if columns[i].keep > 0]
        if width <= console.width or not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (columns[i].keep, i)))
    table = Table(**options)
    for i in shown:
        column = columns[i]
        table.add_column(
            column.header,
            no_wrap=not column.wrap,
            overflow="fold",
            justify=column.justify,  # type: ignore[arg-type]
            min_width=None if column.wrap else needed(i),
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def _key_values(title: str | None, rows: Sequence[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, box=None, title_justify="left", pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _summary_line(s: cpb.CheckpointSummary) -> str:
    """One line about a checkpoint: id, kind, status, time, duration, size and path or reason."""
    parts = [
        f"#{s.checkpoint_id} {checkpoint_kind(s.kind)} {_status_text(s)}",
        f"triggered {format_time(s.trigger_timestamp_ms)}",
    ]
    if _status(s) is not CheckpointStatus.IN_PROGRESS:
        parts.append(f"{format_ms(s.end_to_end_duration_ms)} ms")
    parts.append(_size_text(s))
    parts.append(f"{s.num_acknowledged}/{s.num_tasks} acked")
    if _status(s) is CheckpointStatus.FAILED:
        parts.append(_failure(s))
    elif s.external_path:
        parts.append(s.external_path)
    return ", ".join(parts)


def _status(s: cpb.CheckpointSummary) -> CheckpointStatus | None:
    """The summary's status; None for a number this version does not know."""
    return wire.CHECKPOINT_STATUS.from_pb_or(s.status, None)


def _size_text(s: cpb.CheckpointSummary) -> str:
    """The state size; with what this checkpoint wrote when it reused shared files (an
    incremental checkpoint)."""
    size = format_bytes(s.state_size_bytes)
    if s.shared_size_bytes:
        size += f" ({format_bytes(s.incremental_size_bytes)} new)"
    return size


def _status_text(s: cpb.CheckpointSummary) -> str:
    """The status; a completed checkpoint whose files are gone (retention, disposal) shows as
    DISCARDED, as Flink's history marks it."""
    if _status(s) is CheckpointStatus.COMPLETED and s.discarded:
        return "DISCARDED"
    return checkpoint_status(s.status)


def _failure(s: cpb.CheckpointSummary) -> str:
    if s.failure_reason and s.failure_message:
        return f"{s.failure_reason}: {s.failure_message}"
    return s.failure_reason or s.failure_message or "-"


# ---------------------------------------------------------------------------------------------
# The gRPC client
# ---------------------------------------------------------------------------------------------


class Client:
    """A coordinator stub plus the per-call deadline."""

    def __init__(self, stub: cgrpc.CoordinatorServiceStub, timeout_s: float) -> None:
        self.stub = stub
        self.timeout = timeout_s


CLIENT_SECURITY_FLAGS = (
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_server_name",
    "token_file",
)


def _security(args: argparse.Namespace) -> SecuritySettings:
    """TLS and token of a client or worker: ``SNAPFLOW_TLS_*``/``SNAPFLOW_TOKEN_FILE`` (or
    ``SNAPFLOW_TOKEN``), overridden by the file flags; a token itself is never a flag."""
    base = SecuritySettings.from_env()
    flags = {
        name: value for name in SECURITY_FIELDS if (value := getattr(args, name, None)) is not None
    }
    return base.replace(**flags) if flags else base


def _add_security_flags(group: Any, names: Sequence[str]) -> None:
    helps = {
        "tls_ca_file": "PEM CA bundle to verify the server's certificate (turns TLS on)",
        "tls_cert_file": "PEM certificate to present (mutual TLS; a server's own certificate)",
        "tls_key_file": "PEM private key of --tls-cert-file",
        "tls_server_name": "name to check the server certificate against",
        "tls_client_ca_file": "PEM CA bundle to verify client certificates (mutual TLS)",
        "token_file": "file with the bearer token to send (else $SNAPFLOW_TOKEN)",
        "auth_tokens_file": "accepted tokens, one 'ROLE[,ROLE] TOKEN' per line",
        "auth_identities": "roles of client certificates: NAME=ROLE[+ROLE],...",
    }
    for name in names:
        env = "SNAPFLOW_" + name.upper()
        group.add_argument(
            "--" + name.replace("_", "-"), default=None, help=f"{helps[name]} (default ${env})"
        )


def _address(args: argparse.Namespace) -> str:
    return str(args.address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS)


@contextlib.contextmanager
def _client(args: argparse.Namespace) -> Iterator[Client]:
    channel = sync_leader_channel(  # host:port, or several: the leader is found
        _address(args),
        _security(args),
        options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.enable_retries", 0),
        ],
    )
    try:
        yield Client(cgrpc.CoordinatorServiceStub(channel), args.timeout)
    finally:
        channel.close()


# ---------------------------------------------------------------------------------------------
# Client commands
# ---------------------------------------------------------------------------------------------


JOB_STATES = tuple(state.name for state in JobState)


def _job_state_filter(value: str) -> int:
    name = value.strip().upper()
    if name not in JOB_STATES:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a job state; use one of {', '.join(JOB_STATES).lower()}"
        )
    return int(wire.JOB_STATE.to_pb(JobState[name]))


def cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as c:
        response = c.stub.ListJobs(cpb.ListJobsRequest(), timeout=c.timeout)
    if args.state:  # the coordinator has no filter: keep the jobs in the asked states here
        kept = [job for job in response.jobs if job.state in args.state]
        del response.jobs[:]
        response.jobs.extend(kept)
    if args.json:
        _print_json(response)
        return 0
    console = _console()
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
    console.print(_fitted_table(console, columns, rows))
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
    with _client(args) as c:
        job = c.stub.GetJob(cpb.GetJobRequest(job_id=args.job_id), timeout=c.timeout)
        tasks = c.stub.ListTasks(cpb.ListTasksRequest(job_id=args.job_id), timeout=c.timeout)
    if args.json:
        print(json.dumps({"job": _to_dict(job), "tasks": _to_dict(tasks)["tasks"]}, indent=2))
        return 0
    console = _console()
    console.print(_key_values(None, _job_rows(job)))
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
    console.print(_fitted_table(console, columns, rows, title="Tasks"))
    return 0


def _partitioning(edge: pb.JobEdge) -> str:
    name = _enum_name(pb.PartitionerKind, edge.partitioner, "PARTITIONER_KIND_")
    return f"{name}({edge.key_field})" if edge.key_field else name


def cmd_info(args: argparse.Namespace) -> int:
    with _client(args) as c:
        job = c.stub.GetJob(cpb.GetJobRequest(job_id=args.job_id), timeout=c.timeout)
    graph = job.graph
    if args.json:
        _print_json(job)
        return 0
    console = _console()
    console.print(
        f"Job {job.job_id} ({job.name or '-'}): {job_state(job.state)}, "
        f"{len(graph.vertices)} vertices, {len(graph.edges)} edges"
    )
    vertex_rows = [
        [
            v.vertex_id + (" (source)" if v.is_source else ""),
            str(v.parallelism),
            str(v.max_parallelism or 128),
            " -> ".join(o.name or o.kind or o.operator_id for o in v.operators) or v.name or "-",
        ]
        for v in graph.vertices
    ]
    vertex_columns = [
        Column("Vertex"),
        Column("Parallelism", justify="right"),
        Column("Max", 1, justify="right"),  # max parallelism (key groups)
        Column("Operators (chained)", wrap=NAME_WIDTH),
    ]
    console.print(
        _fitted_table(console, vertex_columns, vertex_rows, title="Vertices", title_justify="left")
    )
    parallelism = {v.vertex_id: v.parallelism for v in graph.vertices}
    edge_rows = [
        [
            e.source_vertex_id,
            e.target_vertex_id,
            _partitioning(e),
            f"{parallelism.get(e.source_vertex_id, '?')} -> {parallelism.get(e.target_vertex_id, '?')}",
        ]
        for e in graph.edges
    ]
    edge_columns = [
        Column("From"),
        Column("To"),
        Column("Partitioning", wrap=NAME_WIDTH),
        Column("Parallelism", 1),
    ]
    if graph.edges:
        console.print(
            _fitted_table(console, edge_columns, edge_rows, title="Edges", title_justify="left")
        )
    else:
        console.print("no edges")
    return 0


def _quantile_row(name: str, q: cpb.Quantiles, fmt: Callable[[float], str]) -> list[str]:
    return [name, *(fmt(v) for v in (q.min, q.avg, q.p50, q.p90, q.p99, q.max))]


def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        stats = c.stub.GetCheckpointStats(
            cpb.GetCheckpointStatsRequest(job_id=args.job_id, history_size=args.history),
            timeout=c.timeout,
        )
    if args.json:
        _print_json(stats)
        return 0
    console = _console()
    n = stats.counts
    console.print(
        f"Checkpoints: triggered {n.triggered}, in progress {n.in_progress}, "
        f"completed {n.completed}, failed {n.failed}, restored {n.restored}"
    )
    latest = [
        (
            "Latest completed",
            _summary_line(stats.latest_completed) if stats.HasField("latest_completed") else "-",
        ),
        (
            "Latest failed",
            _summary_line(stats.latest_failed) if stats.HasField("latest_failed") else "-",
        ),
        (
            "Latest savepoint",
            _summary_line(stats.latest_savepoint) if stats.HasField("latest_savepoint") else "-",
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
    console.print(_key_values(None, latest))
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
            in_progress = _status(s) is CheckpointStatus.IN_PROGRESS
            rows.append(
                [
                    str(s.checkpoint_id),
                    checkpoint_kind(s.kind),
                    _status_text(s),
                    format_time(s.trigger_timestamp_ms),
                    "-" if in_progress else f"{format_ms(s.end_to_end_duration_ms)} ms",
                    format_bytes(s.state_size_bytes),
                    format_bytes(s.incremental_size_bytes),
                    f"{s.num_acknowledged}/{s.num_tasks}",
                    _failure(s) if _status(s) is CheckpointStatus.FAILED else s.external_path,
                ]
            )
        title = "History (newest first)"
        if any(s.discarded for s in stats.history):
            title += "; DISCARDED: completed, its files deleted by retention or disposal"
        console.print(_fitted_table(console, columns, rows, title=title, title_justify="left"))
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
            _fitted_table(
                console,
                columns,
                rows,
                title="Summary of completed checkpoints (since the coordinator started)",
                title_justify="left",
            )
        )
    return 0


def cmd_checkpoints_show(args: argparse.Namespace) -> int:
    with _client(args) as c:
        details = c.stub.GetCheckpointDetails(
            cpb.GetCheckpointDetailsRequest(job_id=args.job_id, checkpoint_id=args.checkpoint_id),
            timeout=c.timeout,
        )
    if args.json:
        _print_json(details)
        return 0
    console = _console()
    s = details.summary
    rows = [
        ("Checkpoint", str(s.checkpoint_id)),
        ("Kind", checkpoint_kind(s.kind)),
        ("Status", _status_text(s)),
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
    if _status(s) is CheckpointStatus.FAILED:
        rows.append(("Failure", _failure(s)))
    console.print(_key_values(None, rows))
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
        _fitted_table(console, columns, table_rows, title="Subtasks", title_justify="left")
    )
    return 0


def _print_completed(what: str, s: cpb.CheckpointSummary, suffix: str = "") -> None:
    _console().print(
        f"{what} {s.checkpoint_id} completed in {format_ms(s.end_to_end_duration_ms)} ms "
        f"({_size_text(s)}, {s.num_acknowledged}/{s.num_tasks} tasks)"
        f"{suffix}: {s.external_path}"
    )


def _target(value: str | None) -> str:
    """A target directory made absolute against the current directory (URIs are kept)."""
    if not value:
        return ""
    if "://" in value:
        return value
    return os.path.abspath(os.path.expanduser(value))


def cmd_trigger(args: argparse.Namespace) -> int:
    with _client(args) as c:
        summary = c.stub.TriggerCheckpoint(
            cpb.TriggerCheckpointRequest(job_id=args.job_id), timeout=c.timeout
        )
    if args.json:
        _print_json(summary)
    else:
        _print_completed("Checkpoint", summary)
    return 0


def _start_savepoint(args: argparse.Namespace, stop: bool, drain: bool) -> int:
    """``--detach``: start the savepoint, print its request id and return (Flink REST's
    trigger id); ``snapflow savepoint-status JOB ID`` polls it."""
    with _client(args) as c:
        op = c.stub.StartSavepoint(
            cpb.StartSavepointRequest(
                job_id=args.job_id, target_directory=_target(args.target), stop=stop, drain=drain
            ),
            timeout=c.timeout,
        )
    if args.json:
        _print_json(op)
    else:
        _console().print(
            f"savepoint request {op.request_id} started for job {op.job_id}; poll it with: "
            f"snapflow savepoint-status {op.job_id} {op.request_id}",
            soft_wrap=True,
        )
    return 0


DETACH_HELP = "start it, print its request id and return (poll with savepoint-status)"


SAVEPOINT_STATUS_EXIT = {
    SavepointOperationStatus.IN_PROGRESS: 0,
    SavepointOperationStatus.COMPLETED: 0,
    SavepointOperationStatus.FAILED: 1,
}


def cmd_savepoint_status(args: argparse.Namespace) -> int:
    with _client(args) as c:
        op = c.stub.GetSavepointOperation(
            cpb.GetSavepointOperationRequest(job_id=args.job_id, request_id=args.request_id),
            timeout=c.timeout,
        )
    status = wire.SAVEPOINT_OPERATION_STATUS.from_pb_or(op.status, None)
    if args.json:
        _print_json(op)
    elif status is SavepointOperationStatus.COMPLETED:
        _print_completed("Savepoint", op.savepoint)
    elif status is SavepointOperationStatus.FAILED:
        _console().print(f"savepoint request {op.request_id} FAILED: {op.failure}", soft_wrap=True)
    else:
        _console().print(f"savepoint request {op.request_id} IN_PROGRESS")
    return 1 if status is None else SAVEPOINT_STATUS_EXIT[status]


def cmd_savepoint(args: argparse.Namespace) -> int:
    if args.detach:
        return _start_savepoint(args, stop=False, drain=False)
    with _client(args) as c:
        summary = c.stub.TriggerSavepoint(
            cpb.TriggerSavepointRequest(job_id=args.job_id, target_directory=_target(args.target)),
            timeout=c.timeout,
        )
    if args.json:
        _print_json(summary)
    else:
        _print_completed("Savepoint", summary)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    if args.detach:
        return _start_savepoint(args, stop=True, drain=args.drain)
    with _client(args) as c:
        summary = c.stub.StopWithSavepoint(
            cpb.StopWithSavepointRequest(
                job_id=args.job_id, target_directory=_target(args.target), drain=args.drain
            ),
            timeout=c.timeout,
        )
    if args.json:
        _print_json(summary)
    else:
        how = "drained and stopped" if args.drain else "stopped"
        _print_completed("Savepoint", summary, f"; job {args.job_id} {how}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as c:
        job = c.stub.CancelJob(cpb.CancelJobRequest(job_id=args.job_id), timeout=c.timeout)
    if args.json:
        _print_json(job)
    else:
        _console().print(f"job {job.job_id}: {job_state(job.state)}")
    return 0


def cmd_dispose_savepoint(args: argparse.Namespace) -> int:
    path = _target(args.path)
    with _client(args) as c:
        response = c.stub.DisposeSavepoint(
            cpb.DisposeSavepointRequest(savepoint_path=path), timeout=c.timeout
        )
    if args.json:
        _print_json(response)
    else:
        _console().print(f"savepoint {path} disposed")
    return 0


# ---------------------------------------------------------------------------------------------
# The coordinator and demo commands
# ---------------------------------------------------------------------------------------------

# flag destination -> CoordinatorSettings field
COORDINATOR_FLAGS = (
    "host",
    "port",
    "redis_url",
    "redis_namespace",
    "storage_root",
    "metrics_port",
    "log_level",
    "log_format",
    *SECURITY_FIELDS,
    "savepoint_roots",
    "redis_password_file",
    "metrics_host",
    "high_availability",
    "lease_ttl_s",
    "lease_renew_interval_s",
    "advertised_address",
)


def cmd_coordinator(args: argparse.Namespace) -> int:
    import asyncio

    from snapflow.coordinator.config import load_settings
    from snapflow.coordinator.server import serve
    from snapflow.errors import ConfigError, SnapflowError
    from snapflow.logging import configure_logging, get_logger, route_native_stderr

    overrides = {name: getattr(args, name) for name in COORDINATOR_FLAGS}
    try:
        settings = load_settings(args.config, overrides)
    except ConfigError as e:
        print(f"snapflow coordinator: configuration error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    json_log = route_native_stderr()  # gRPC's C core and crashes as JSON events too
    log = get_logger("snapflow.cli")
    log.info("coordinator.settings", **settings.to_dict())
    try:
        asyncio.run(serve(settings))
    except ConfigError as e:
        print(f"snapflow coordinator: configuration error: {e}", file=sys.stderr)
        return 2
    except (SnapflowError, OSError) as e:
        log.error("coordinator.failed", error=f"{type(e).__name__}: {e}")
        if not json_log:  # a JSON log has it in the event, and only events
            print(f"snapflow coordinator: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0


# ---------------------------------------------------------------------------------------------
# snapflow run
# ---------------------------------------------------------------------------------------------

RUN_DETACH_WAIT_S = 300.0  # --detach: how long to wait for the background driver to submit
_DETACHED: list[Any] = []


def _run_context(args: argparse.Namespace) -> Any:
    from snapflow.spark_bridge.submission import SubmitContext

    return SubmitContext(
        coordinator=args.coordinator,
        spark_master=args.spark_master,
        spark_conf=dict(args.conf),
        parallelism=args.parallelism,
        restore=_target(args.restore) if args.restore else None,
        allow_non_restored_state=args.allow_non_restored_state,
        checkpoint_interval_ms=args.checkpoint_interval,
        checkpoint_mode=args.checkpoint_mode,
        job_id=args.job_id,
    )


def _run_usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags of ``snapflow run``, or None."""
    if not os.path.isfile(args.pipeline):
        return (
            f"{args.pipeline}: no such file (the Python file that builds and executes a Pipeline)"
        )
    if args.allow_non_restored_state and not args.restore:
        return "--allow-non-restored-state needs --restore PATH"
    if args.detach and not args.coordinator:
        return (
            "--detach needs --coordinator HOST:PORT of a running `snapflow coordinator`: an "
            "embedded coordinator lives only as long as the driver process, and nothing else "
            "could reach the detached job"
        )
    if args.job_id is not None and not _is_job_id(args.job_id):
        return f"--job-id must be 32 lowercase hex characters, got {args.job_id!r}"
    return None


def _is_job_id(value: str) -> bool:
    return len(value) == 32 and all(c in "0123456789abcdef" for c in value)


def cmd_run(args: argparse.Namespace) -> int:
    error = _run_usage_error(args)
    if error is not None:
        print(f"snapflow run: {error}", file=sys.stderr)
        return 2
    if args.detach:
        return _run_detached(args)
    return _run_attached(args)


def _run_attached(args: argparse.Namespace) -> int:
    """Run the pipeline file in this process as ``__main__`` inside a submission context; its
    ``Pipeline.execute()`` calls pick up the flags."""
    import runpy

    from snapflow.errors import SnapflowError
    from snapflow.logging import configure_logging
    from snapflow.spark_bridge.driver import JobFailedError
    from snapflow.spark_bridge.submission import submission

    configure_logging(args.log_level, "auto")
    ctx = _run_context(args)
    path = os.path.abspath(args.pipeline)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args.args]
    sys.path.insert(0, os.path.dirname(path))  # as `python PIPELINE.py` does
    code = 0
    try:
        with submission(ctx):
            try:
                runpy.run_path(path, run_name="__main__")
            except SystemExit as e:  # the file's own exit status
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
            except JobFailedError as e:
                print(f"snapflow run: {e}", file=sys.stderr)
                code = 1
            except SnapflowError as e:  # bad pipeline or options: say what to fix
                print(f"snapflow run: {type(e).__name__}: {e}", file=sys.stderr)
                code = 2 if type(e).__name__ == "InvalidArgumentError" else 1
    finally:
        sys.argv, sys.path = saved_argv, saved_path
        session = ctx.spark_session_created
        if session is not None:
            with contextlib.suppress(Exception):
                session.stop()
    for r in ctx.results:
        print(
            f"Job {r.job_id} ({r.name}) {r.state.value}: {r.checkpoints_completed} checkpoints, "
            f"{r.restarts} restarts, {r.duration_s:.1f} s"
        )
    if code == 0 and ctx.executions == 0:
        print(
            f"snapflow run: {args.pipeline} executed no pipeline: call pipeline.execute() "
            "(snapflow run's options reach a pipeline only through execute(); see "
            "docs/spark_bridge.md)",
            file=sys.stderr,
        )
        return 2
    return code


def _run_detached(args: argparse.Namespace) -> int:
    """Start ``snapflow run`` (without --detach, with a job id chosen here) as a background
    process in its own session, wait until the coordinator knows the job, print its id and the
    driver's pid, and return. The Spark driver loop runs in that process until the job ends."""
    import subprocess
    import tempfile
    import uuid

    job_id = args.job_id or uuid.uuid4().hex
    log_path = args.log_file or os.path.join(tempfile.gettempdir(), f"snapflow-run-{job_id}.log")
    argv = [sys.executable, "-m", "snapflow.cli", "run", "--coordinator", args.coordinator]
    argv += ["--job-id", job_id]
    if args.spark_master:
        argv += ["--spark-master", args.spark_master]
    for key, value in args.conf:
        argv += ["--conf", f"{key}={value}"]
    if args.parallelism is not None:
        argv += ["--parallelism", str(args.parallelism)]
    if args.restore:
        argv += ["--restore", _target(args.restore)]
    if args.allow_non_restored_state:
        argv.append("--allow-non-restored-state")
    if args.checkpoint_interval is not None:
        argv += ["--checkpoint-interval", str(args.checkpoint_interval)]
    if args.checkpoint_mode is not None:
        argv += ["--checkpoint-mode", args.checkpoint_mode]
    argv += ["--log-level", args.log_level]
    argv += [os.path.abspath(args.pipeline), *args.args]
    with open(log_path, "ab") as log_file:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C or hang-up of this terminal does not reach it
        )
    _DETACHED.append(child)  # not waited for on purpose: no "still running" warning
    deadline = time.monotonic() + args.detach_timeout
    with _client(argparse.Namespace(address=args.coordinator, timeout=5.0)) as c:
        while True:
            try:
                job = c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=c.timeout)
                break
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise
            if child.poll() is not None:
                print(
                    f"snapflow run: the driver process exited with code {child.returncode} "
                    f"before submitting the job; its output:\n{_tail(log_path)}",
                    file=sys.stderr,
                )
                return 1
            if time.monotonic() > deadline:
                print(
                    f"snapflow run: job {job_id} not submitted within {args.detach_timeout:g} s; "
                    f"the driver (pid {child.pid}) keeps trying, its log: {log_path}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.2)
    print(f"Job has been submitted with JobID {job_id}")
    print(f"Job {job.name!r} is {job_state(job.state)} on {args.coordinator}")
    print(f"Driver process: pid {child.pid}, log {log_path}")
    return 0


def _tail(path: str, limit: int = 4000) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode("utf-8", "replace")
    return ""


def cmd_demo(args: argparse.Namespace) -> int:
    import importlib

    try:
        demo = importlib.import_module("snapflow.cli.demo")
    except ModuleNotFoundError as e:
        if e.name != "snapflow.cli.demo":
            raise
        print("demo is not available yet", file=sys.stderr)
        return 2
    return int(demo.run_demo(args))


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version("snapflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _client_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("connection")
    group.add_argument(
        "--address",
        default=None,
        help=f"coordinator host:port, or several comma-separated (highly available "
        f"coordinators) (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})",
    )
    group.add_argument(
        "--timeout",
        type=_positive_float,
        default=DEFAULT_TIMEOUT_S,
        help=f"deadline of the call in seconds (default: {DEFAULT_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--json", action="store_true", help="print the raw response as JSON instead of tables"
    )
    _add_security_flags(parent.add_argument_group("security"), CLIENT_SECURITY_FLAGS)
    return parent


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of seconds")
    return number


def _add_coordinator(sub: Any) -> None:
    p = sub.add_parser(
        "coordinator",
        help="run the checkpoint coordinator service",
        description="Run the coordinator until SIGINT/SIGTERM. Settings come from the flags, "
        "SNAPFLOW_* environment variables and a TOML file, in that precedence.",
    )
    p.add_argument("--config", default=None, help="TOML settings file (default: $SNAPFLOW_CONFIG)")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", default=None, help="gRPC port; 0 picks a free one (default 50051)")
    p.add_argument(
        "--redis-url",
        default=None,
        help="redis://host:port/db, rediss://... or unix:///path; empty starts an embedded "
        "redis-server",
    )
    p.add_argument("--redis-namespace", default=None, help="prefix of every Redis key")
    ha = p.add_argument_group("high availability (docs/coordinator.md)")
    ha.add_argument(
        "--high-availability",
        default=None,
        help="none (default) or redis: several coordinators on one Redis namespace, one "
        "leader holding a lease, standbys taking over",
    )
    ha.add_argument("--lease-ttl-s", default=None, help="leader lease TTL in seconds (default 5)")
    ha.add_argument(
        "--lease-renew-interval-s", default=None, help="lease renew interval (default 1)"
    )
    ha.add_argument(
        "--advertised-address",
        default=None,
        help="host:port clients reach this coordinator at (default: --host and the port)",
    )
    p.add_argument(
        "--storage-root", default=None, help="checkpoint storage directory or file:// URI"
    )
    p.add_argument(
        "--metrics-port",
        default=None,
        help="Prometheus /metrics port; 0 picks a free one, -1 disables (default 9464)",
    )
    p.add_argument("--log-level", default=None, help="debug, info, warning, error or critical")
    p.add_argument("--log-format", default=None, help="auto, json or console")
    security = p.add_argument_group("security (docs/security.md)")
    _add_security_flags(security, SECURITY_FIELDS)
    security.add_argument(
        "--savepoint-roots",
        default=None,
        help="comma-separated roots where savepoints, restores and disposals may lie",
    )
    security.add_argument(
        "--redis-password-file", default=None, help="file with the Redis password"
    )
    security.add_argument(
        "--metrics-host", default=None, help="address of the /metrics endpoint (default: --host)"
    )
    p.set_defaults(handler=cmd_coordinator)


def _add_worker(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="run a worker agent hosting one slot of a job",
        description="Deploy and run the subtasks of one slot of a submitted job: with --slots N, "
        "slot I hosts subtask i of every vertex where i mod N == I. Exits 0 when they finish, "
        "1 when one fails.",
    )
    p.add_argument(
        "--coordinator",
        default=None,
        help="coordinator host:port[,host:port...] (default $SNAPFLOW_ADDRESS)",
    )
    p.add_argument("--job", required=True, help="the job id")
    p.add_argument("--slot", type=int, default=0, help="this agent's slot (default 0)")
    p.add_argument("--slots", type=int, default=1, help="number of agents of the job (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    p.add_argument("--log-level", default="info", help="log level (default info)")
    p.add_argument(
        "--wait-for-coordinator",
        type=_non_negative_float,
        default=WORKER_WAIT_S,
        metavar="SECONDS",
        help="while the coordinator is not reachable yet, retry with back-off for this long "
        f"(default {WORKER_WAIT_S:g}; 0: fail at once)",
    )
    dataplane = p.add_argument_group("data plane (docs/worker.md)")
    dataplane.add_argument(
        "--debloat-target-ms",
        type=_non_negative_int,
        default=None,
        metavar="MS",
        help="buffer debloating: each output channel holds what its consumer drains in this "
        "time (default 100; 0: off)",
    )
    dataplane.add_argument(
        "--task-thread",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each subtask's operators on a thread of its own, so checkpoints never wait "
        "for user code (the default); --no-task-thread: on the agent's event loop, in steps",
    )
    dataplane.add_argument(
        "--no-adaptive-task-thread",
        dest="adaptive_task_thread",
        action="store_false",
        help="with --no-task-thread: keep operators on the agent's loop even when their calls "
        "block (by default a subtask whose calls spend most of their time blocked moves to a "
        "task thread)",
    )
    _add_security_flags(
        p.add_argument_group("security (docs/security.md)"),
        (*CLIENT_SECURITY_FLAGS, "tls_client_ca_file", "auth_tokens_file", "auth_identities"),
    )
    p.set_defaults(handler=cmd_worker)


WORKER_WAIT_S = 300.0
WORKER_BACKOFF_S = (0.2, 5.0)  # first and largest delay between attempts to reach the coordinator


def _non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds >= 0")
    return number


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer >= 0")
    return number


def _rpc_text(error: grpc.RpcError) -> str:
    """``CODE: details`` of a gRPC error, without its debug string (addresses, file names and
    timestamps of the C core, which say nothing to fix)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return f"{name}: {details or 'no details'}"


async def _wait_for_coordinator(
    stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str, address: str, wait_s: float, log: Any
) -> cpb.JobInfo:
    """The job, once the coordinator answers: retried with exponential back-off (capped at
    ``WORKER_BACKOFF_S[1]``) while it is UNAVAILABLE or does not answer, for ``wait_s``."""

    deadline = time.monotonic() + wait_s
    delay, attempt = WORKER_BACKOFF_S[0], 1
    while True:
        try:
            return await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5.0)
        except grpc.aio.AioRpcError as e:
            retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            left = deadline - time.monotonic()
            if not retry or left <= 0:
                raise
            log.info(
                "worker.waiting_for_coordinator",
                address=address,
                attempt=attempt,
                retry_in_s=round(min(delay, left), 3),
                error=_rpc_text(e),
            )
        await asyncio.sleep(min(delay, max(0.0, left)))
        delay, attempt = min(delay * 2, WORKER_BACKOFF_S[1]), attempt + 1


def cmd_worker(args: argparse.Namespace) -> int:
    from snapflow.logging import configure_logging, get_logger, route_native_stderr
    from snapflow.worker.runtime.agent import Agent, DataplaneSettings

    configure_logging(args.log_level, "auto")
    route_native_stderr()
    log = get_logger("snapflow.cli")
    address = args.coordinator or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    if not 0 <= args.slot < args.slots:
        print(f"snapflow worker: --slot must be in 0..{args.slots - 1}", file=sys.stderr)
        return 2
    try:
        security = _security(args)
    except ConfigError as e:
        print(f"snapflow worker: configuration error: {e}", file=sys.stderr)
        return 2

    target = args.debloat_target_ms
    dataplane = DataplaneSettings(
        task_thread=args.task_thread,
        adaptive_task_thread=args.adaptive_task_thread,
        **({} if target is None else {"debloat_target_ms": target}),
    )

    async def run() -> int:
        agent = Agent(
            address,
            args.job,
            slot=args.slot,
            num_slots=args.slots,
            host=args.host,
            port=args.port,
            security=security,
            dataplane=dataplane,
        )
        await agent.start()
        try:
            await _wait_for_coordinator(
                agent.stub, args.job, address, args.wait_for_coordinator, log
            )
            await agent.run()
            return await after_tasks_finished(agent.stub, args.job)
        except asyncio.CancelledError:  # CancelTask: the job was canceled or failed over
            return await _after_cancel(agent, args.job)
        except grpc.aio.AioRpcError as e:
            print(f"snapflow worker: {_rpc_text(e)}", file=sys.stderr)
            if e.code() is grpc.StatusCode.UNAVAILABLE:
                print(f"hint: is the coordinator running at {address}?", file=sys.stderr)
            return 1
        except Exception as e:
            print(f"snapflow worker: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            await agent.stop()

    return asyncio.run(run())


FINISHED_POLL_S = 0.2
FINISHED_UNREACHABLE_S = 60.0


async def after_tasks_finished(
    stub: Any,
    job_id: str,
    poll_s: float = FINISHED_POLL_S,
    unreachable_s: float = FINISHED_UNREACHABLE_S,
) -> int:
    """Exit code once this worker's tasks finished. The job may still fail over (a task of
    another worker fails before the job ends), and a restarted job needs every slot's worker
    again, this one too: so wait for the job to end. 0 when it finished or was canceled; 1 when
    it failed, or waits for its workers (``RESTARTING`` or ``CREATED``: start the workers
    again), or the coordinator stayed unreachable for ``unreachable_s``."""
    unreachable_since: float | None = None
    while True:
        try:
            job = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5.0)
        except grpc.aio.AioRpcError as e:
            retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            now = time.monotonic()
            unreachable_since = unreachable_since if unreachable_since is not None else now
            if not retry or now - unreachable_since >= unreachable_s:
                print(
                    f"snapflow worker: this worker's tasks finished; the job's state is unknown "
                    f"({_rpc_text(e)})",
                    file=sys.stderr,
                )
                return 1
            await asyncio.sleep(poll_s)
            continue
        unreachable_since = None
        state = wire.JOB_STATE.from_pb_or(job.state, None)
        if state in (JobState.FINISHED, JobState.CANCELED):
            return 0
        if state in (JobState.RESTARTING, JobState.CREATED, JobState.FAILED):
            print(
                f"snapflow worker: this worker's tasks finished, then job {job_id} became "
                f"{job_state(job.state)}"
                + ("" if state is JobState.FAILED else " (a failover: start the workers again)"),
                file=sys.stderr,
            )
            return 1
        await asyncio.sleep(poll_s)


async def _after_cancel(agent: Any, job_id: str) -> int:
    """Exit code after the coordinator canceled this worker's tasks: 0 when the job was
    canceled (or has ended), 1 when they were canceled for a failover (the job restarts and
    needs its workers again)."""
    try:
        job = await agent.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5.0)
    except grpc.aio.AioRpcError as e:
        print(
            f"snapflow worker: the tasks were canceled; the job's state is unknown "
            f"({_rpc_text(e)})",
            file=sys.stderr,
        )
        return 1
    state = job_state(job.state)
    if wire.JOB_STATE.from_pb_or(job.state, None) in (JobState.CANCELED, JobState.FINISHED):
        print(f"snapflow worker: job {job_id} is {state}; its tasks here stopped")
        return 0
    print(
        f"snapflow worker: the coordinator canceled the tasks; job {job_id} is {state}"
        + (" (a failover: start the workers again)" if state == "RESTARTING" else ""),
        file=sys.stderr,
    )
    return 1


def _key_value(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE")
    return key, val


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}, got {number}")
        return number

    return parse


def _checkpoint_interval(value: str) -> int:
    number = _int_at_least(0, "the checkpoint interval")(value)
    if 0 < number < 10:
        raise argparse.ArgumentTypeError(
            f"the checkpoint interval is 0 (off) or >= 10 ms, got {number}"
        )
    return number


def _add_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a pipeline file on Spark (like flink run / spark-submit)",
        description="Run PIPELINE.py, a Python file that builds a Pipeline and calls "
        "pipeline.execute(), in this process with the options below (the same file runs with "
        "plain `python PIPELINE.py`, on its own settings). Blocks until the job ends and prints "
        "its result; exit code 0 when every job finished, 1 when one failed, 2 on bad usage. "
        "By default an embedded coordinator runs for the duration (local masters only).",
        epilog="Precedence: --parallelism is the default of pipelines built without "
        "parallelism= (the program's value wins, as over flink run -p); --checkpoint-interval "
        "and --checkpoint-mode override the program's checkpointing. --restore and --job-id "
        "apply to the first job the file executes.",
    )
    p.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="a running coordinator (`snapflow coordinator`); default: an embedded one for "
        "the duration of the run (local masters only)",
    )
    p.add_argument(
        "--spark-master",
        default=None,
        metavar="URL",
        help="master of the SparkSession execute() creates when none is active (default: "
        "local[N], N = the pipeline's task slots)",
    )
    p.add_argument(
        "--conf",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration of that session (repeatable)",
    )
    p.add_argument(
        "-p",
        "--parallelism",
        type=_int_at_least(1, "--parallelism"),
        default=None,
        help="default parallelism of the pipelines (default: the program's, else 1)",
    )
    p.add_argument(
        "-s",
        "--restore",
        default=None,
        metavar="PATH",
        help="start from this savepoint or retained checkpoint directory (at any parallelism); "
        "state of operators the program no longer has makes the submission fail unless "
        "--allow-non-restored-state is given",
    )
    p.add_argument(
        "-n",
        "--allow-non-restored-state",
        action="store_true",
        help="with --restore: drop the state of operators the program no longer has",
    )
    p.add_argument(
        "--checkpoint-interval",
        type=_checkpoint_interval,
        default=None,
        metavar="MS",
        help="checkpoint interval in ms; 0: periodic checkpoints off (a bounded job still "
        "takes a final checkpoint that commits its sinks)",
    )
    p.add_argument(
        "--checkpoint-mode",
        choices=("aligned", "unaligned", "at_least_once"),
        default=None,
        help="checkpoint mode",
    )
    p.add_argument(
        "--job-id",
        default=None,
        help="id of the (first) job: 32 lowercase hex characters (default: generated)",
    )
    p.add_argument(
        "-d",
        "--detach",
        action="store_true",
        help="return once the job is submitted: print its id, then leave it to a background "
        "driver process (the Spark driver loop, which restarts the job after failures) whose "
        "pid and log are printed. Needs --coordinator; stop the job with `snapflow cancel` or "
        "`snapflow stop`, watch it with `snapflow info`",
    )
    p.add_argument(
        "--detach-timeout",
        type=_positive_float,
        default=RUN_DETACH_WAIT_S,
        metavar="SECONDS",
        help=f"--detach: how long to wait for the submission (default {RUN_DETACH_WAIT_S:g})",
    )
    p.add_argument(
        "--log-file",
        default=None,
        metavar="PATH",
        help="--detach: the driver process's output (default: snapflow-run-JOB.log in the "
        "temporary directory)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error", "critical"),
        default="warning",
        help="log level of the driver loop and an embedded coordinator (default warning)",
    )
    p.add_argument("pipeline", metavar="PIPELINE.py", help="the pipeline file")
    p.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments of the pipeline file"
    )
    p.set_defaults(handler=cmd_run)


def _add_demo(sub: Any) -> None:
    from snapflow.cli import demo

    p = sub.add_parser(
        "demo",
        help="run the demo job on Spark: a task killed mid-run, an exactly-once check",
        description="Run a NexMark-style bid stream aggregated per auction in tumbling "
        "event-time windows as one Snapflow job on Spark, checkpointing every --interval-ms, "
        "kill one task mid-run, recover from the latest checkpoint, and compare the committed "
        "output with a batch Spark computation of the same query. Exit code 0 when the result "
        "is exactly-once, 1 when not. By default everything is embedded: a redis-server from "
        "the Python environment, the coordinator and local Spark.",
    )
    p.add_argument(
        "--records",
        type=demo.parse_size,
        default=demo.DEFAULT_SIZE,
        metavar="SIZE",
        help="bids to generate: "
        + ", ".join(f"{k} ({n:,})" for k, (n, _) in demo.SIZES.items())
        + f", or a count like 500k (default {demo.DEFAULT_SIZE})",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="bids per second over all source subtasks; 0: as fast as possible (default: "
        + ", ".join(f"{r:,}/s for {k}" for k, (_, r) in demo.SIZES.items())
        + ")",
    )
    p.add_argument(
        "--parallelism", type=int, default=2, help="parallelism of every vertex (default 2)"
    )
    p.add_argument(
        "--mode",
        choices=demo.MODES,
        default="aligned",
        help="checkpoint mode (default aligned)",
    )
    p.add_argument(
        "--interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)"
    )
    p.add_argument(
        "--window-ms",
        type=int,
        default=10_000,
        help="tumbling event-time window size (default 10000)",
    )
    failure = p.add_mutually_exclusive_group()
    failure.add_argument(
        "--kill-after-s",
        type=float,
        default=None,
        help="kill a task this many seconds into the run, once a checkpoint completed "
        "(default: 40%% of the nominal run time)",
    )
    failure.add_argument("--no-failure", action="store_true", help="do not kill a task")
    p.add_argument(
        "--spark-master",
        default="local[4]",
        help="Spark master URL of the session the demo creates (default local[4])",
    )
    p.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="a running coordinator (`snapflow coordinator`); default: an embedded one "
        "(local masters only)",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )
    p.add_argument(
        "--storage-root",
        "--data-dir",
        dest="storage_root",
        default="./data/demo",
        metavar="DIR",
        help="the demo's data directory, cleaned at the start of every run: output, "
        "checkpoints (default ./data/demo); on a cluster, a path every executor and the "
        "coordinator see",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log at info level")
    sim = p.add_argument_group(
        "simulated demo", "the coordinator with simulated worker agents, no Spark (fast)"
    )
    sim.add_argument("--simulated", action="store_true", help="run the simulated demo instead")
    sim.add_argument("--seconds", type=float, default=15.0, help="how long to run (default 15)")
    sim.add_argument("--tasks", type=int, default=8, help="number of tasks (default 8)")
    sim.add_argument(
        "--fail-at-s",
        type=float,
        default=5.0,
        help="inject a task failure after this many seconds; < 0: never (default 5)",
    )
    sim.add_argument(
        "--port",
        "--address-port",
        dest="port",
        type=int,
        default=0,
        help="coordinator gRPC port of the demo; 0 picks a free one (default 0)",
    )
    p.set_defaults(handler=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snapflow",
        description="Snapflow: Flink-style checkpoint coordination for Python dataflows.",
    )
    parser.add_argument("--version", action="version", version=f"snapflow {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    client = [_client_options()]

    _add_coordinator(sub)
    _add_worker(sub)

    p = sub.add_parser("jobs", parents=client, help="list jobs")
    p.add_argument(
        "--state",
        type=_job_state_filter,
        action="append",
        default=None,
        metavar="STATE",
        help="only jobs in this state (repeatable): " + ", ".join(JOB_STATES).lower(),
    )
    p.set_defaults(handler=cmd_jobs)

    p = sub.add_parser(
        "info", parents=client, help="show a job's graph: vertices, chained operators, edges"
    )
    p.add_argument("job_id", metavar="JOB")
    p.set_defaults(handler=cmd_info)

    p = sub.add_parser("job", parents=client, help="show a job and its tasks")
    p.add_argument("job_id", metavar="JOB")
    p.set_defaults(handler=cmd_job)

    cps = sub.add_parser("checkpoints", help="checkpoint statistics of a job")
    cps_sub = cps.add_subparsers(dest="checkpoints_command", metavar="ACTION", required=True)
    p = cps_sub.add_parser("list", parents=client, help="counts, latest, history and summary")
    p.add_argument("job_id", metavar="JOB")
    p.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="show the N newest checkpoints (default 0: all the coordinator keeps)",
    )
    p.set_defaults(handler=cmd_checkpoints_list)
    p = cps_sub.add_parser("show", parents=client, help="one checkpoint, per subtask")
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("checkpoint_id", metavar="ID", type=int)
    p.set_defaults(handler=cmd_checkpoints_show)

    p = sub.add_parser("trigger", parents=client, help="take a checkpoint now and wait for it")
    p.add_argument("job_id", metavar="JOB")
    p.set_defaults(handler=cmd_trigger)

    p = sub.add_parser("savepoint", parents=client, help="take a savepoint and wait for it")
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("--target", metavar="DIR", help="savepoint directory (default: job storage)")
    p.add_argument("--detach", action="store_true", help=DETACH_HELP)
    p.set_defaults(handler=cmd_savepoint)

    p = sub.add_parser(
        "savepoint-status",
        parents=client,
        help="where a savepoint started with --detach stands (exit 1 if it failed)",
    )
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("request_id", metavar="REQUEST_ID")
    p.set_defaults(handler=cmd_savepoint_status)

    p = sub.add_parser("stop", parents=client, help="take a savepoint, then stop the job")
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("--target", metavar="DIR", help="savepoint directory (default: job storage)")
    p.add_argument(
        "--drain", action="store_true", help="sources emit MAX_WATERMARK before the savepoint"
    )
    p.add_argument("--detach", action="store_true", help=DETACH_HELP)
    p.set_defaults(handler=cmd_stop)

    p = sub.add_parser("cancel", parents=client, help="cancel a job without a savepoint")
    p.add_argument("job_id", metavar="JOB")
    p.set_defaults(handler=cmd_cancel)

    p = sub.add_parser("dispose-savepoint", parents=client, help="delete a savepoint")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(handler=cmd_dispose_savepoint)

    _add_run(sub)
    _add_demo(sub)
    return parser


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _report_rpc_error(error: grpc.RpcError, args: argparse.Namespace) -> None:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    print(f"error: {name}: {details or str(error)}", file=sys.stderr)
    if code is grpc.StatusCode.UNAVAILABLE:
        print(f"hint: is the coordinator running at {_address(args)}?", file=sys.stderr)
    elif code is grpc.StatusCode.DEADLINE_EXCEEDED:
        print(
            f"hint: no answer within --timeout {args.timeout:g} s; a triggered checkpoint may "
            "still complete",
            file=sys.stderr,
        )
    elif code is grpc.StatusCode.UNAUTHENTICATED:
        print(
            "hint: set SNAPFLOW_TOKEN_FILE (or --token-file) to a file with a valid token, and "
            "SNAPFLOW_TLS_CA_FILE to the coordinator's CA",
            file=sys.stderr,
        )


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's C core logs connection-level INFO lines (GOAWAY on shutdown, ...) to stderr; our
    # own logs say what matters. Read by the core when it initialises, after this point.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except grpc.RpcError as error:
        _report_rpc_error(error, args)
        return 1
    except ConfigError as error:  # TLS or token files (messages name files, never contents)
        print(f"snapflow {args.command}: configuration error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `snapflow jobs | head -1`: stop quietly
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 1

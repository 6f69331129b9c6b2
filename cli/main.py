"""The ``snapflow`` command line (README.md, "The CLI against a running coordinator").

``snapflow coordinator`` runs the coordinator service. The client commands (``jobs``, ``job``,
``checkpoints list|show``, ``trigger``, ``savepoint``, ``stop``, ``cancel``,
``dispose-savepoint``) call its gRPC API with a deadline (``--timeout``) and print tables, or
the raw response with ``--json``. ``snapflow demo`` runs the demo (``snapflow.cli.demo``).

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
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

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


def _to_json(message: Message) -> str:
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=2,
    )


def _to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def _print_json(message: Message) -> None:
    print(_to_json(message))


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
        f"#{s.checkpoint_id} {checkpoint_kind(s.kind)} {checkpoint_status(s.status)}",
        f"triggered {format_time(s.trigger_timestamp_ms)}",
    ]
    if s.status != pb.CHECKPOINT_STATUS_IN_PROGRESS:
        parts.append(f"{format_ms(s.end_to_end_duration_ms)} ms")
    parts.append(format_bytes(s.state_size_bytes))
    parts.append(f"{s.num_acknowledged}/{s.num_tasks} acked")
    if s.status == pb.CHECKPOINT_STATUS_FAILED:
        parts.append(_failure(s))
    elif s.external_path:
        parts.append(s.external_path)
    return ", ".join(parts)


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


def _address(args: argparse.Namespace) -> str:
    return str(args.address or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS)


@contextlib.contextmanager
def _client(args: argparse.Namespace) -> Iterator[Client]:
    channel = grpc.insecure_channel(
        _address(args),
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


def cmd_jobs(args: argparse.Namespace) -> int:
    with _client(args) as c:
        response = c.stub.ListJobs(cpb.ListJobsRequest(), timeout=c.timeout)
    if args.json:
        _print_json(response)
        return 0
    console = _console()
    if not response.jobs:
        console.print("no jobs")
        return 0
    table = Table("Job ID", "Name", "State", "Tasks", "Restarts", "Latest checkpoint", "Created")
    table.columns[0].no_wrap = True
    for job in response.jobs:
        table.add_row(
            job.job_id,
            job.name or "-",
            job_state(job.state),
            f"{job.running_tasks}/{job.total_tasks}",
            str(job.restarts),
            str(job.latest_completed_checkpoint_id or "-"),
            format_time(job.created_at_ms),
        )
    console.print(table)
    return 0


def _job_rows(job: cpb.JobInfo) -> list[tuple[str, str]]:
    cfg = job.checkpoint_config
    vertices = ", ".join(
        f"{v.name or v.vertex_id} ({v.vertex_id}) x{v.parallelism}" for v in job.graph.vertices
    )
    interval = f"{cfg.interval_ms} ms" if cfg.interval_ms else "disabled"
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
        ("Checkpoint mode", checkpoint_mode(cfg.mode or pb.CHECKPOINT_MODE_ALIGNED)),
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
    table = Table("Vertex", "Subtask", "Attempt", "State", "Address", "Failure", title="Tasks")
    for t in tasks.tasks:
        table.add_row(
            t.attempt.vertex_id,
            str(t.attempt.subtask_index),
            str(t.attempt.attempt),
            task_state(t.state),
            t.address or "-",
            t.failure or "",
        )
    console.print(table)
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
        table = Table(
            "ID",
            "Kind",
            "Status",
            "Triggered",
            "Duration (ms)",
            "Size",
            "Acked",
            "Path / failure",
            title="History (newest first)",
            title_justify="left",
        )
        for s in stats.history:
            in_progress = s.status == pb.CHECKPOINT_STATUS_IN_PROGRESS
            table.add_row(
                str(s.checkpoint_id),
                checkpoint_kind(s.kind),
                checkpoint_status(s.status),
                format_time(s.trigger_timestamp_ms),
                "-" if in_progress else format_ms(s.end_to_end_duration_ms),
                format_bytes(s.state_size_bytes),
                f"{s.num_acknowledged}/{s.num_tasks}",
                _failure(s) if s.status == pb.CHECKPOINT_STATUS_FAILED else s.external_path,
            )
        console.print(table)
    else:
        console.print("no checkpoints in the history")

    if n.completed:
        summary = Table(
            "",
            "min",
            "avg",
            "p50",
            "p90",
            "p99",
            "max",
            title="Summary of completed checkpoints",
            title_justify="left",
        )
        for column in summary.columns[1:]:
            column.justify = "right"
        summary.add_row(
            *_quantile_row("End-to-end duration (ms)", stats.end_to_end_duration_ms, format_ms)
        )
        summary.add_row(*_quantile_row("Checkpointed size", stats.state_size_bytes, format_bytes))
        summary.add_row(
            *_quantile_row(
                "Processed during alignment", stats.processed_during_alignment_bytes, format_bytes
            )
        )
        summary.add_row(
            *_quantile_row("Persisted in-flight", stats.persisted_in_flight_bytes, format_bytes)
        )
        console.print()
        console.print(summary)
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
        ("Status", checkpoint_status(s.status)),
        ("Triggered", format_time(s.trigger_timestamp_ms)),
        ("Latest ack", format_time(s.latest_ack_timestamp_ms)),
        ("End-to-end duration", f"{format_ms(s.end_to_end_duration_ms)} ms"),
        ("Checkpointed size", format_bytes(s.state_size_bytes)),
        ("Processed during alignment", format_bytes(s.processed_during_alignment_bytes)),
        ("Persisted in-flight", format_bytes(s.persisted_in_flight_bytes)),
        ("Unaligned", "yes" if s.unaligned else "no"),
        ("Acknowledged", f"{s.num_acknowledged}/{s.num_tasks}"),
        ("Path", s.external_path or "-"),
    ]
    if s.status == pb.CHECKPOINT_STATUS_FAILED:
        rows.append(("Failure", _failure(s)))
    console.print(_key_values(None, rows))
    console.print()
    table = Table(
        "Task",
        "Acked",
        "Ack time",
        "E2E (ms)",
        "Sync (ms)",
        "Async (ms)",
        "Alignment (ms)",
        "Start delay (ms)",
        "State size",
        "In-flight",
        title="Subtasks",
        title_justify="left",
    )
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
                format_bytes(m.persisted_in_flight_bytes),
            ]
        else:
            metrics = ["-"] * 8
        table.add_row(format_attempt(sub.attempt), "yes" if sub.acknowledged else "no", *metrics)
    console.print(table)
    return 0


def _print_completed(what: str, s: cpb.CheckpointSummary, suffix: str = "") -> None:
    _console().print(
        f"{what} {s.checkpoint_id} completed in {format_ms(s.end_to_end_duration_ms)} ms "
        f"({format_bytes(s.state_size_bytes)}, {s.num_acknowledged}/{s.num_tasks} tasks)"
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


def cmd_savepoint(args: argparse.Namespace) -> int:
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
)


def cmd_coordinator(args: argparse.Namespace) -> int:
    import asyncio

    from snapflow.coordinator.config import load_settings
    from snapflow.coordinator.server import serve
    from snapflow.errors import ConfigError, SnapflowError
    from snapflow.logging import configure_logging, get_logger

    overrides = {name: getattr(args, name) for name in COORDINATOR_FLAGS}
    try:
        settings = load_settings(args.config, overrides)
    except ConfigError as e:
        print(f"snapflow coordinator: configuration error: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    log = get_logger("snapflow.cli")
    log.info("coordinator.settings", **settings.to_dict())
    try:
        asyncio.run(serve(settings))
    except ConfigError as e:
        print(f"snapflow coordinator: configuration error: {e}", file=sys.stderr)
        return 2
    except (SnapflowError, OSError) as e:
        log.error("coordinator.failed", error=f"{type(e).__name__}: {e}")
        print(f"snapflow coordinator: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 130
    return 0


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
        help=f"coordinator host:port (default: ${ADDRESS_ENV}, else {DEFAULT_ADDRESS})",
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
        "--coordinator", default=None, help="coordinator host:port (default $SNAPFLOW_ADDRESS)"
    )
    p.add_argument("--job", required=True, help="the job id")
    p.add_argument("--slot", type=int, default=0, help="this agent's slot (default 0)")
    p.add_argument("--slots", type=int, default=1, help="number of agents of the job (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    p.add_argument("--log-level", default="info", help="log level (default info)")
    p.set_defaults(handler=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from snapflow.logging import configure_logging
    from snapflow.worker.runtime.agent import Agent

    configure_logging(args.log_level, "auto")
    address = args.coordinator or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    if not 0 <= args.slot < args.slots:
        print(f"snapflow worker: --slot must be in 0..{args.slots - 1}", file=sys.stderr)
        return 2

    async def run() -> int:
        agent = Agent(
            address, args.job, slot=args.slot, num_slots=args.slots, host=args.host, port=args.port
        )
        await agent.start()
        try:
            await agent.run()
            return 0
        except Exception as e:
            print(f"snapflow worker: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            await agent.stop()

    return asyncio.run(run())


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
    p.set_defaults(handler=cmd_jobs)

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
    p.set_defaults(handler=cmd_savepoint)

    p = sub.add_parser("stop", parents=client, help="take a savepoint, then stop the job")
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("--target", metavar="DIR", help="savepoint directory (default: job storage)")
    p.add_argument(
        "--drain", action="store_true", help="sources emit MAX_WATERMARK before the savepoint"
    )
    p.set_defaults(handler=cmd_stop)

    p = sub.add_parser("cancel", parents=client, help="cancel a job without a savepoint")
    p.add_argument("job_id", metavar="JOB")
    p.set_defaults(handler=cmd_cancel)

    p = sub.add_parser("dispose-savepoint", parents=client, help="delete a savepoint")
    p.add_argument("path", metavar="PATH")
    p.set_defaults(handler=cmd_dispose_savepoint)

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
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `snapflow jobs | head -1`: stop quietly
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 1

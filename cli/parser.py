"""The ``snapflow`` argument parser: every command's flags, their types and help, and the
handler each command runs. Building it imports no Spark, no worker and no coordinator service:
a command's heavy modules are imported when it runs (tests/cli/test_light_cli.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from snapflow import wire
from snapflow.cli import demo, demo_config
from snapflow.cli.client import (
    ADDRESS_ENV,
    CLIENT_SECURITY_FLAGS,
    DEFAULT_ADDRESS,
    DEFAULT_TIMEOUT_S,
)
from snapflow.cli.client_commands import (
    cmd_cancel,
    cmd_checkpoints_list,
    cmd_checkpoints_show,
    cmd_dispose_savepoint,
    cmd_info,
    cmd_job,
    cmd_jobs,
    cmd_savepoint,
    cmd_savepoint_status,
    cmd_stop,
    cmd_trigger,
)
from snapflow.cli.coordinator_command import cmd_coordinator
from snapflow.cli.run_command import RUN_DETACH_WAIT_S, cmd_run
from snapflow.cli.worker_command import WORKER_WAIT_S, cmd_worker
from snapflow.jobgraph import JobState
from snapflow.security import SECURITY_FIELDS
from snapflow.version import installed_version


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


JOB_STATES = tuple(state.name for state in JobState)


def _job_state_filter(value: str) -> int:
    name = value.strip().upper()
    if name not in JOB_STATES:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a job state; use one of {', '.join(JOB_STATES).lower()}"
        )
    return int(wire.JOB_STATE.to_pb(JobState[name]))


DETACH_HELP = "start it, print its request id and return (poll with savepoint-status)"


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
        "--no-builtins-on-loop",
        dest="builtins_on_loop",
        action="store_false",
        help="with task threads: run every subtask on its task thread (by default a subtask of "
        "built-in vectorised operators only, such as a generator source or a keyed count on the "
        "heap backend, runs on the agent's loop)",
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
        type=demo_config.parse_size,
        default=demo_config.DEFAULT_SIZE,
        metavar="SIZE",
        help="bids to generate: "
        + ", ".join(f"{k} ({n:,})" for k, (n, _) in demo_config.SIZES.items())
        + f", or a count like 500k (default {demo_config.DEFAULT_SIZE})",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="bids per second over all source subtasks; 0: as fast as possible (default: "
        + ", ".join(f"{r:,}/s for {k}" for k, (_, r) in demo_config.SIZES.items())
        + ")",
    )
    p.add_argument(
        "--parallelism", type=int, default=2, help="parallelism of every vertex (default 2)"
    )
    p.add_argument(
        "--mode",
        choices=demo_config.MODES,
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
    p.set_defaults(handler=demo.run_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snapflow",
        description="Snapflow: Flink-style checkpoint coordination for Python dataflows.",
    )
    parser.add_argument(
        "--version", action="version", version=f"snapflow {installed_version('unknown')}"
    )
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

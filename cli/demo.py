"""``snapflow demo`` (what ``make run`` runs): an exactly-once streaming job on Spark, a task
killed mid-run, and a batch Spark check of the result.

The job (:func:`snapflow.cli.demo_pipeline.build_pipeline`): a NexMark-style bid stream (:class:`snapflow.cli.nexmark.BidSource`,
bounded, rate-limited) keyed by auction into tumbling event-time windows with the number of
bids, the sum and the maximum of their prices per auction and window
(:class:`snapflow.cli.nexmark.PriceStatsWindow`), written by the exactly-once
:class:`snapflow.worker.connectors.file_sink.TransactionalFileSink`. It runs as one barrier-mode Spark stage
(:mod:`spark_bridge`) with a checkpoint every ``--interval-ms``.

By default everything is embedded: a ``redis-server`` child process from the Python
environment and the coordinator (spark_bridge's embedded default), and a local SparkSession
(``local[4]``). ``--coordinator host:port`` and ``--spark-master spark://...`` run the same
demo against a coordinator service and a Spark cluster (the compose ``submitter``); the data
directory must then be on a file system that the executors and the coordinator see at the
same path.

Unless ``--no-failure``, one task's Python worker is killed (``os._exit``) in the first
deployment, once a checkpoint completed and ``--kill-after-s`` passed: the stage fails, the
driver resubmits it, the job restores from the latest completed checkpoint and replays. At the
end the committed output is compared with the same query computed by a batch Spark job over
the same bids (generated on the executors from the source's scalar definition), and a summary
says whether the result is exactly-once (exit code 0) or not (1).

This module is the flow (set up, run, watch, check, report); the flags and the summary are in
:mod:`snapflow.cli.demo_config`, the job in :mod:`snapflow.cli.demo_pipeline`, the batch check
in :mod:`snapflow.cli.demo_check`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from snapflow.cli.demo_check import BatchCheck
from snapflow.cli.demo_config import MODES, DemoConfig, DemoSummary, config_from_args
from snapflow.cli.demo_pipeline import build_pipeline, read_kill

# Spark, the Spark bridge and the worker are imported where used: the `snapflow` parser imports
# this module (run_demo is the command's handler), so it and its demo_* modules must stay light
# (tests/cli/test_light_cli.py).
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from snapflow.spark_bridge import JobHandle
    from snapflow.v1 import coordinator_pb2 as cpb

__all__ = ["run_demo", "run_spark_demo"]

MARKER = ".snapflow-demo"
# Names a demo run leaves in its data directory: a directory holding only these is cleaned.
_DEMO_ENTRIES = {MARKER, "out", "checkpoints", "redis", "kill.json"}


def prepare_data_dir(path: str) -> None:
    """Create ``path`` empty (a previous demo run's files are removed). A non-empty directory
    that no demo made is left alone (an error), so a mistyped path deletes nothing."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        entries = set(os.listdir(path))
        if entries and MARKER not in entries and not entries <= _DEMO_ENTRIES:
            raise ValueError(
                f"{path} is not empty and was not made by `snapflow demo` (no {MARKER}); "
                f"choose another --data-dir or empty it"
            )
        for name in entries:
            target = os.path.join(path, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, MARKER), "w") as f:
        f.write("a `snapflow demo` data directory: cleaned at the start of every demo run\n")


def _console() -> Console:
    """A console on the current stdout; 120 columns when it is not a terminal (no wrapping of
    the progress lines in a log or a pipe)."""
    tty = sys.stdout.isatty()
    return Console(highlight=False, width=None if tty or "COLUMNS" in os.environ else 120)


def _spark_log_level(config: DemoConfig) -> str:
    return "WARN" if config.verbose else "FATAL"


_QUIET_LOG4J2 = """\
# Written by `snapflow demo` for Spark's driver JVM: no start-up banner or warnings; the level
# is lowered further with setLogLevel once the session runs (the demo reports failures itself).
# Root at WARN, the level Spark gives the shell's logger, so that Spark does not announce it.
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
"""


def create_spark_session(config: DemoConfig) -> SparkSession:
    """The demo's SparkSession: Snapflow's settings (spark_bridge.session: no UI, Python workers
    on this interpreter, no stage retries by Spark), quiet logs, the user's --spark-conf last."""
    from snapflow.spark_bridge.session import session_builder

    builder = session_builder(
        config.spark_master,
        "snapflow-demo",
        {"spark.sql.shuffle.partitions": str(max(2, config.parallelism))},
    )
    user_keys = {key for key, _ in config.spark_conf}
    log4j: str | None = None
    if not config.verbose and "spark.driver.extraJavaOptions" not in user_keys:
        # Spark's start-up banner and warnings: keep the terminal for the demo's own output.
        fd, log4j = tempfile.mkstemp(prefix="snapflow-demo-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as f:
            f.write(_QUIET_LOG4J2)
        builder = builder.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"
        )
    for key, value in config.spark_conf:
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    finally:
        if log4j is not None:
            with contextlib.suppress(OSError):
                os.unlink(log4j)
    session.sparkContext.setLogLevel(_spark_log_level(config))
    return session


def _wait_for_executors(
    spark: SparkSession, slots: int, timeout_s: float, console: Console
) -> None:
    """On a cluster, wait (bounded) until an executor registered and the cores add up to the
    job's slots: a barrier stage submitted before is refused for lack of slots and only
    retried after 15 s."""
    from snapflow.spark_bridge.session import is_local_master

    sc = spark.sparkContext
    if is_local_master(sc.master or ""):
        return
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        executors = 0
        with contextlib.suppress(Exception):
            jsc = sc._jsc.sc()
            executors = len(jsc.statusTracker().getExecutorInfos()) - 1  # minus the driver
            # defaultParallelism: the registered executors' cores (at least 2)
            if executors >= 1 and int(jsc.defaultParallelism()) >= slots:
                return
        if time.monotonic() > deadline:
            console.print(
                f"[yellow]{executors} executor(s) registered after {timeout_s:g} s; the job "
                f"needs {slots} task slots: submitting anyway[/yellow]"
            )
            return
        if not said:
            console.print(f"  waiting for executors of {sc.master} ...")
            said = True
        time.sleep(0.5)


def _watch(
    handle: JobHandle,
    config: DemoConfig,
    console: Console,
    t0: float,
    t0_wall: float,
    on_running: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Print the job's progress until it ends; what was seen (checkpoints, kill, restore).
    ``on_running`` is called once the job runs (or ended)."""
    from snapflow import wire
    from snapflow.checkpointing import CheckpointStatus
    from snapflow.errors import SnapflowError
    from snapflow.spark_bridge import JobStatus

    completed: dict[int, tuple[int, int]] = {}  # id -> (trigger ms, completion ms)
    state = JobStatus.CREATED
    restored_from = 0
    kill: dict[str, Any] | None = None
    kill_said = False

    def say(message: str) -> None:
        console.print(f"[dim]\\[{time.monotonic() - t0:5.1f}s][/dim] {message}", highlight=False)

    while True:
        done = handle.done()
        kill = read_kill(config) if kill is None else kill
        if kill is not None and not kill_said:
            kill_said = True
            console.print(
                f"[dim]\\[{kill['at_ms'] / 1000 - t0_wall:5.1f}s][/dim] "
                f"[bold red]killed[/bold red] {_kill_text(kill)}",
                highlight=False,
            )
        try:
            info = handle.info()
            stats: cpb.CheckpointStats | None = handle.checkpoint_stats()
        except SnapflowError:
            info, stats = None, None  # the job ended (the embedded coordinator is gone)
        if stats is not None:
            for h in sorted(stats.history, key=lambda h: h.checkpoint_id):
                status = wire.CHECKPOINT_STATUS.from_pb_or(h.status, None)
                if status is not CheckpointStatus.COMPLETED or h.checkpoint_id in completed:
                    continue
                done_ms = h.trigger_timestamp_ms + h.end_to_end_duration_ms
                completed[h.checkpoint_id] = (h.trigger_timestamp_ms, done_ms)
                say(
                    f"checkpoint {h.checkpoint_id} completed in {h.end_to_end_duration_ms} ms "
                    f"({h.state_size_bytes / 1024:,.0f} KiB)"
                )
            if stats.HasField("latest_restore") and stats.latest_restore.checkpoint_id:
                restored_from = int(stats.latest_restore.checkpoint_id)
        if info is not None:
            now = JobStatus.from_pb(info.state)
            if now is not state:
                if now is JobStatus.RESTARTING:
                    say("[yellow]deployment failed[/yellow]: the job is RESTARTING")
                elif now is JobStatus.RUNNING and info.restarts:
                    where = f"checkpoint {restored_from}" if restored_from else "the start"
                    say(
                        f"[green]redeployed[/green] (restart {info.restarts}): "
                        f"{info.running_tasks} tasks running again, restored from {where}"
                    )
                elif now is JobStatus.RUNNING:
                    say(f"job running: {info.running_tasks} tasks")
                    on_running()
                state = now
        if done:
            on_running()
            break
        time.sleep(0.2)
    return {"completed": completed, "restored_from": restored_from}


def _kill_text(kill: dict[str, Any]) -> str:
    return (
        f"the Python worker (pid {kill.get('pid')}) running subtask {kill.get('subtask')} of "
        f"{kill.get('vertex')!r}, after {kill.get('records_seen', 0):,} bids"
    )


def run_spark_demo(
    config: DemoConfig, spark: SparkSession | None = None, console: Console | None = None
) -> DemoSummary:
    """Run the demo (see the module docstring) on ``spark`` (None: a session made for the run
    and stopped after it)."""
    from snapflow.cli.nexmark import window_stats_rows
    from snapflow.spark_bridge import JobFailedError
    from snapflow.spark_bridge.session import is_local_master
    from snapflow.worker.connectors.file_sink import read_committed

    console = console or _console()
    started = time.monotonic()
    summary = DemoSummary(records=config.records)
    if config.mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    if spark is None and not is_local_master(config.spark_master) and not config.coordinator:
        raise ValueError(
            f"--spark-master {config.spark_master} needs --coordinator HOST:PORT (a "
            f"`snapflow coordinator` its executors can reach): the embedded coordinator "
            f"binds 127.0.0.1"
        )
    if spark is None and not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise ValueError(
            "Spark needs a Java runtime (17 or newer): install one (e.g. apt-get install "
            "openjdk-17-jre-headless) or set JAVA_HOME"
        )
    prepare_data_dir(config.data_dir)
    rate = f"{config.rate_per_s:,.0f}/s" if config.rate_per_s else "full speed"
    failure = (
        f"a task killed ~{config.kill_after:g} s in (after a checkpoint)"
        if config.failure
        else "no failure"
    )
    console.print(
        "[bold]Snapflow demo[/bold]: NexMark bids -> key_by(auction) -> "
        f"{config.window_ms / 1000:g} s tumbling event-time windows (bids, sum and max of the "
        "price) -> exactly-once file sink"
    )
    console.print(
        f"  {config.records:,} bids at {rate}, parallelism {config.parallelism}, "
        f"{config.mode} checkpoints every {config.interval_ms} ms, {failure}"
    )
    own = spark is None
    if spark is None:
        console.print(f"  starting Spark ({config.spark_master}) ...")
        spark = create_spark_session(config)
        summary.spark_start_s = time.monotonic() - started
    try:
        sc = spark.sparkContext
        pipeline = build_pipeline(config)
        _wait_for_executors(spark, pipeline.slots, 60.0, console)
        where = (
            f"coordinator {config.coordinator}"
            if config.coordinator
            else "embedded coordinator (redis-server + coordinator)"
        )
        console.print(
            f"  Spark {spark.version} {sc.master}, {where}; data in {os.path.abspath(config.data_dir)}"
        )
        # The expected result does not depend on the stream: compute it alongside the job (once
        # it runs), on the task slots the job leaves free.
        check = BatchCheck(spark, config, pipeline.slots)
        t0, t0_wall = time.monotonic(), time.time()
        handle = pipeline.run_async(
            spark,
            coordinator_address=config.coordinator,
            # The surviving tasks log the kill as errors: expected here, the demo reports it.
            executor_log_level="info" if config.verbose else "critical",
        )
        console.print(
            f"[dim]\\[  0.0s][/dim] job {handle.job_id} submitted to {handle.coordinator_address}: "
            f"one barrier stage of {handle.slots} Spark tasks",
            highlight=False,
        )
        summary.job_id = handle.job_id
        try:
            seen = _watch(handle, config, console, t0, t0_wall, on_running=check.start)
            try:
                result = handle.result()
            except JobFailedError as e:
                result = e.result
        except KeyboardInterrupt:
            handle.cancel()
            raise
        summary.job_s = time.monotonic() - t0
        summary.state = result.state.value
        summary.failure = result.failure
        summary.checkpoints_completed = max(result.checkpoints_completed, len(seen["completed"]))
        summary.restarts = result.restarts
        summary.restored_from = seen["restored_from"]
        if result.recovery_times_s:
            summary.running_again_s = result.recovery_times_s[0]
        kill = read_kill(config)
        if kill is not None:
            kill_ms = int(kill["at_ms"])
            summary.killed_at_s = kill_ms / 1000 - t0_wall
            summary.killed_what = _kill_text(kill)
            after = [done for trigger, done in seen["completed"].values() if trigger >= kill_ms]
            if after:
                summary.recovery_s = (min(after) - kill_ms) / 1000
        console.print(
            f"[dim]\\[{summary.job_s:5.1f}s][/dim] job {summary.state}"
            + (f": {summary.failure}" if summary.failure else ""),
            highlight=False,
        )

        # The check: the committed output against the same query as a batch Spark job.
        check_started = time.monotonic()
        committed = window_stats_rows(read_committed(config.out_dir))
        console.print(
            "checking: the committed output against the batch Spark result (the same query over "
            "the same bids)"
        )
        expected = check.result()
        summary.check_s = time.monotonic() - check_started
        summary.batch_s = check.duration_s
        summary.committed_rows = sum(committed.values())
        summary.expected_rows = sum(expected.values())
        summary.missing = expected - committed
        summary.extra = committed - expected
    finally:
        if own:
            spark.stop()
    summary.total_s = time.monotonic() - started
    _print_spark_summary(console, config, summary)
    return summary


def _print_spark_summary(console: Console, config: DemoConfig, s: DemoSummary) -> None:
    table = Table(title="Summary", show_header=False, title_justify="left", box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_row("records", f"{s.records:,} bids")
    table.add_row(
        "checkpoints completed",
        f"{s.checkpoints_completed} ({config.mode}, every {config.interval_ms} ms)",
    )
    restarts = str(s.restarts)
    if s.restarts and s.restored_from:
        restarts += f" (restored from checkpoint {s.restored_from})"
    table.add_row("restarts", restarts)
    if s.killed_at_s is not None:
        table.add_row("task killed", f"at {s.killed_at_s:.1f} s ({s.killed_what})")
        table.add_row(
            "recovery time",
            f"{s.recovery_s:.2f} s from the kill to the first checkpoint completed after the restart"
            if s.recovery_s is not None
            else "no checkpoint completed after the restart",
        )
        if s.running_again_s is not None:
            table.add_row(
                "redeployed in",
                f"{s.running_again_s:.2f} s (failure noticed -> every task running)",
            )
    elif config.failure:
        table.add_row("task killed", "no: the job ended before the kill was due")
    table.add_row("committed rows", f"{s.committed_rows:,} (auction x window)")
    table.add_row("batch Spark rows", f"{s.expected_rows:,}")
    table.add_row(
        "time",
        f"{s.total_s:.1f} s (Spark start {s.spark_start_s:.1f} s, job {s.job_s:.1f} s, "
        f"check {s.check_s:.1f} s; the batch job took {s.batch_s:.1f} s alongside)",
    )
    console.print(table)
    if not s.exactly_once:
        if s.state != "FINISHED":
            console.print(f"[red]the job did not finish: {s.state} {s.failure}[/red]")
        if s.missing:
            console.print(
                f"[red]{sum(s.missing.values())} row(s) of the batch result are not in the "
                f"committed output[/red], e.g. {next(iter(s.missing))}"
            )
        if s.extra:
            console.print(
                f"[red]{sum(s.extra.values())} committed row(s) are not in the batch result "
                f"(or are duplicates)[/red], e.g. {next(iter(s.extra))}"
            )
        if config.mode == "at_least_once":
            console.print("(at_least_once checkpoints do not promise exactly-once results)")
    verdict = "[bold green]yes[/bold green]" if s.exactly_once else "[bold red]no[/bold red]"
    console.print(f"exactly-once: {verdict}", highlight=False)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def run_demo(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """``snapflow demo``: 0 when the result is exactly-once, 1 when not, 2 on bad arguments."""
    from snapflow.errors import SnapflowError
    from snapflow.logging import configure_logging

    verbose = bool(getattr(args, "verbose", False))
    configure_logging("info" if verbose else "error", "auto")
    console = _console()
    try:
        config = config_from_args(args)
        if config.parallelism < 1:
            raise ValueError(f"--parallelism must be at least 1, got {config.parallelism}")
        if config.failure and config.kill_after < 0:
            raise ValueError("--kill-after-s must be >= 0")
        summary = run_spark_demo(config, spark, console)
    except (ValueError, SnapflowError) as e:
        console.print(f"[red]snapflow demo: {e}[/red]", highlight=False)
        return 2
    return 0 if summary.exactly_once else 1

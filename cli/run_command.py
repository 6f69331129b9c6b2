"""``snapflow run PIPELINE.py``: run a pipeline file on Spark in this process, or with
``--detach`` hand it to a background driver process and return once the job is submitted
(docs/spark_bridge.md). The Spark bridge is imported when the command runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from typing import Any

import grpc

from snapflow.cli.client import absolute_target, connect
from snapflow.cli.formatting import job_state
from snapflow.v1 import coordinator_pb2 as cpb

RUN_DETACH_WAIT_S = 300.0  # --detach: how long to wait for the background driver to submit


def _run_context(args: argparse.Namespace) -> Any:
    from snapflow.spark_bridge.submission import SubmitContext

    return SubmitContext(
        coordinator=args.coordinator,
        spark_master=args.spark_master,
        spark_conf=dict(args.conf),
        parallelism=args.parallelism,
        restore=absolute_target(args.restore) if args.restore else None,
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
    from snapflow.spark_bridge.run_options import JobFailedError
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
        argv += ["--restore", absolute_target(args.restore)]
    if args.allow_non_restored_state:
        argv.append("--allow-non-restored-state")
    if args.checkpoint_interval is not None:
        argv += ["--checkpoint-interval", str(args.checkpoint_interval)]
    if args.checkpoint_mode is not None:
        argv += ["--checkpoint-mode", args.checkpoint_mode]
    argv += ["--log-level", args.log_level]
    argv += [os.path.abspath(args.pipeline), *args.args]
    pid = _spawn_driver(argv, log_path)
    deadline = time.monotonic() + args.detach_timeout
    with connect(argparse.Namespace(address=args.coordinator, timeout=5.0)) as c:
        while True:
            try:
                job = c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=c.timeout)
                break
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise
            exit_code = _exit_code(pid)
            if exit_code is not None:
                print(
                    f"snapflow run: the driver process exited with code {exit_code} "
                    f"before submitting the job; its output:\n{_tail(log_path)}",
                    file=sys.stderr,
                )
                return 1
            if time.monotonic() > deadline:
                print(
                    f"snapflow run: job {job_id} not submitted within {args.detach_timeout:g} s; "
                    f"the driver (pid {pid}) keeps trying, its log: {log_path}",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.2)
    print(f"Job has been submitted with JobID {job_id}")
    print(f"Job {job.name!r} is {job_state(job.state)} on {args.coordinator}")
    print(f"Driver process: pid {pid}, log {log_path}")
    return 0


def _spawn_driver(argv: list[str], log_path: str) -> int:
    """Start the detached driver and return its pid: in its own session (a Ctrl-C or hang-up of
    this terminal does not reach it), stdin from /dev/null, stdout and stderr appended to
    ``log_path``. A bare pid, not a ``subprocess.Popen``: this process never waits for the
    driver, and a ``Popen`` dropped while its child runs warns and is reaped behind its back."""
    with open(log_path, "ab") as log_file, open(os.devnull, "rb") as devnull:
        return os.posix_spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull.fileno(), 0),
                (os.POSIX_SPAWN_DUP2, log_file.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, log_file.fileno(), 2),
            ],
            setsid=True,
            # Python ignores these; a child gets their default action, as subprocess does.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )


def _exit_code(pid: int) -> int | None:
    """The driver's exit code once it has exited (-N: killed by signal N), else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def _tail(path: str, limit: int = 4000) -> str:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode("utf-8", "replace")
    return ""

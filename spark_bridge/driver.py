"""Run a pipeline on Spark: the whole job graph in one barrier-mode stage, and the driver loop.

``run(pipeline, spark)`` (or ``Pipeline.run``) blocks until the job ends and returns a
:class:`JobResult`; ``submit(pipeline, spark)`` (``Pipeline.run_async``) returns a
:class:`JobHandle` at once (cancel, stop with a savepoint, checkpoints, the result).

1. **Coordinator.** With no ``coordinator_address``, an *embedded* coordinator is started for the
   duration of the run: a ``redis-server`` child process (:class:`snapflow.redis_server.RedisServer`)
   and :class:`snapflow.coordinator.server.Coordinator` on its own asyncio loop in a background thread,
   bound to 127.0.0.1 on a free port. Only a local master's executors can reach it; on a
   cluster, run ``snapflow coordinator`` and pass its address.
2. **Submit.** ``SubmitJob`` with the pipeline's JobGraph, checkpoint settings and, with
   ``restore_from``, ``RestoreSettings.savepoint_path`` (the parallelism may differ).
3. **The stage.** ``sc.parallelize(range(n), n).barrier().mapPartitions(run_slot).collect()``
   with ``n`` = the largest vertex parallelism (slot sharing): Spark gang-schedules the ``n``
   tasks; task ``i`` runs an :class:`snapflow.worker.runtime.agent.Agent` for slot ``i`` (it hosts subtask ``j``
   of every vertex where ``j % n == i``). Address exchange and checkpoints go through the
   coordinator; ``BarrierTaskContext.barrier()`` is called at most once, at start-up, and only
   with ``startup_barrier=True`` (it polls about once a second). The stage's Spark job runs in
   a job group, so :meth:`JobHandle.cancel` can cancel it.
4. **Failover.** A failed task fails the barrier stage (Spark kills the other tasks). The stage
   is a barrier *ResultStage*, which Spark's DAGScheduler never re-attempts ("Could not recover
   from a failed barrier ResultStage"; only barrier ShuffleMapStages are retried under
   ``spark.stage.maxConsecutiveAttempts``), so every failure comes back here whatever that
   setting is (``tests/spark_bridge/test_spark_stage_retries.py``). The driver waits (bounded) until the coordinator has seen the deployment fail,
   asks :func:`snapflow.spark_bridge.restart.next_action`, waits the restart strategy's delay and
   submits the stage again: its tasks register, which starts a new deployment that restores
   from the latest completed checkpoint (the coordinator does that on registration).
5. **End.** A bounded job ends when its final checkpoint committed: every agent returns, the
   stage completes, the coordinator reports FINISHED. Stop-with-savepoint ends it the same way.
   A job the coordinator failed, or a failure the restart strategy does not restart, raises
   :class:`JobFailedError`.

What a run takes and gives (:class:`JobDefinition`, :class:`RunOptions`, :class:`JobResult`) is in
:mod:`snapflow.spark_bridge.run_options`; the coordinator client in
:mod:`snapflow.spark_bridge.coordinator_client`; the progress line in
:mod:`snapflow.spark_bridge.progress`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import structlog

from snapflow import wire
from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    SnapflowError,
)
from snapflow.jobgraph import TaskState
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.spark_bridge.coordinator_client import CoordinatorClient, agent_security
from snapflow.spark_bridge.executor import SlotConfig, run_slot
from snapflow.spark_bridge.preflight import check_executors
from snapflow.spark_bridge.progress import Progress
from snapflow.spark_bridge.restart import (
    Finish,
    JobStatus,
    RecoveryTracker,
    StageOutcome,
    next_action,
)
from snapflow.spark_bridge.run_options import JobDefinition, JobFailedError, JobResult, RunOptions
from snapflow.v1 import coordinator_pb2 as cpb

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession


log = structlog.get_logger("snapflow.spark")


def _spark_context(spark: Any) -> SparkContext:
    from pyspark import SparkContext

    sc = getattr(spark, "sparkContext", spark)
    if not isinstance(sc, SparkContext):
        raise InvalidArgumentError(
            f"need a classic SparkSession or SparkContext (barrier-mode RDDs are not available "
            f"through Spark Connect), got {type(spark).__name__}"
        )
    return sc


def local_slots(master: str, task_cpus: int = 1) -> int | None:
    """Task slots of a local master (``local``, ``local[4]``, ``local[*]``, ``local[4,2]``,
    ``local-cluster[2,1,1024]``); None for other masters."""
    if master == "local":
        return 1 // task_cpus
    m = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if m:
        cores = (os.cpu_count() or 1) if m[1] == "*" else int(m[1])
        return cores // task_cpus
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if m:
        return int(m[1]) * (int(m[2]) // task_cpus)
    return None


def summarize_spark_error(error: BaseException, limit: int = 800) -> str:
    """A short message for a failed stage: Spark's reason (the abort reason, or the first
    ``SparkException`` message) and the last Python exception line of a failed task, if any."""
    text = str(error)
    parts = []
    aborted = re.search(r"Job aborted due to stage failure: ([^\n]*)", text)
    spark = re.search(r"SparkException: ([^\n]*)", text)
    if aborted:
        parts.append(aborted.group(1).strip())
    elif spark:
        parts.append(spark.group(1).strip())
    python = re.findall(r"^(?:[\w.]+(?:Error|Exception|Exit)\b.*)$", text, re.MULTILINE)
    if python:
        parts.append(python[-1].strip())
    if not parts:
        lines = text.strip().splitlines()
        parts.append(lines[0] if lines else type(error).__name__)
    return " | ".join(parts)[:limit]


class JobHandle:
    """A submitted job whose driver loop runs in a background thread.

    Thread-safe: call :meth:`cancel`, :meth:`stop_with_savepoint` or :meth:`trigger_savepoint`
    from any thread while another waits in :meth:`result`.
    """

    def __init__(
        self,
        *,
        pipeline_name: str,
        job_id: str,
        spark_context: SparkContext,
        client: CoordinatorClient,
        embedded: EmbeddedCoordinator | None,
        slots: int,
        options: RunOptions,
        restart: Any,
        agent_host: str | None,
    ) -> None:
        self.job_id = job_id
        self.name = pipeline_name
        self.coordinator_address = client.address
        self.slots = slots
        self._sc = spark_context
        self._client = client
        self._embedded = embedded
        self._options = options
        self._restart = restart
        self._agent_host = agent_host
        self._group = f"snapflow-{job_id}"
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._stop_monitor = threading.Event()
        self._tracker = RecoveryTracker()
        self._result: JobResult | None = None
        self._error: BaseException | None = None
        self._savepoint_path = ""
        self._stage_attempts = 0
        self._started = time.monotonic()
        self._last_info: cpb.JobInfo | None = None
        self._log = log.bind(job_id=job_id)
        self._thread: threading.Thread | None = None
        self._monitor: threading.Thread | None = None

    # --- user API -------------------------------------------------------------------------

    def info(self) -> cpb.JobInfo:
        """The coordinator's view of the job (state, restarts, latest checkpoint)."""
        return self._client.job(self.job_id)

    def status(self) -> JobStatus:
        return JobStatus.from_pb(self.info().state)

    def checkpoint_stats(self) -> cpb.CheckpointStats:
        return self._client.stats(self.job_id)

    def wait_for_checkpoints(self, count: int, timeout_s: float = 60.0) -> int:
        """Block until at least ``count`` checkpoints completed; returns how many did. Raises
        DeadlineExceededError after ``timeout_s``, FailedPreconditionError if the job ended."""
        deadline = time.monotonic() + timeout_s
        while True:
            completed = int(self.checkpoint_stats().counts.completed)
            if completed >= count:
                return completed
            if self._done.is_set():
                raise FailedPreconditionError(
                    f"job {self.job_id} ended after {completed} completed checkpoints (waited for {count})"
                )
            if time.monotonic() > deadline:
                raise DeadlineExceededError(
                    f"only {completed} of {count} checkpoints completed within {timeout_s:g} s"
                )
            time.sleep(0.05)

    def trigger_checkpoint(self, timeout_s: float = 60.0) -> cpb.CheckpointSummary:
        return self._client.call(
            "TriggerCheckpoint", cpb.TriggerCheckpointRequest(job_id=self.job_id), timeout_s
        )

    def trigger_savepoint(
        self, target_directory: str | os.PathLike[str], timeout_s: float = 60.0
    ) -> str:
        """Take a savepoint under ``target_directory`` (absolute); the job goes on. Returns its path."""
        summary = self._client.call(
            "TriggerSavepoint",
            cpb.TriggerSavepointRequest(
                job_id=self.job_id, target_directory=_abs_dir(target_directory)
            ),
            timeout_s,
        )
        return str(summary.external_path)

    def stop_with_savepoint(
        self,
        target_directory: str | os.PathLike[str],
        *,
        drain: bool = False,
        timeout_s: float = 60.0,
    ) -> str:
        """Stop the job with a savepoint under ``target_directory``: the sources stop, the
        savepoint completes and commits, the tasks finish and the stage ends normally. Returns
        the savepoint's path (restore with ``Pipeline.run(spark, restore_from=path)``).
        ``drain``: emit the maximum watermark first (fire every event-time window)."""
        summary = self._client.call(
            "StopWithSavepoint",
            cpb.StopWithSavepointRequest(
                job_id=self.job_id, target_directory=_abs_dir(target_directory), drain=drain
            ),
            timeout_s,
        )
        with self._lock:
            self._savepoint_path = str(summary.external_path)
        return self._savepoint_path

    def cancel(self) -> None:
        """Cancel the job: ``CancelJob`` on the coordinator, then the Spark stage. Returns at
        once; :meth:`result` then gives a CANCELED result."""
        if self._cancel.is_set() or self._done.is_set():
            return
        self._cancel.set()
        self._log.info("job.cancel_requested")
        try:
            self._client.call("CancelJob", cpb.CancelJobRequest(job_id=self.job_id))
        except FailedPreconditionError:
            pass  # already ended
        finally:
            self._sc.cancelJobGroup(self._group)

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float | None = None) -> JobResult:
        """Wait until the job ended; its :class:`JobResult`. Raises JobFailedError when it
        failed, DeadlineExceededError after ``timeout_s``. An interrupt (Ctrl-C) while waiting
        cancels the job."""
        try:
            if not self._done.wait(timeout_s):
                raise DeadlineExceededError(
                    f"job {self.job_id} still running after {timeout_s:g} s"
                )
        except KeyboardInterrupt:
            self.cancel()
            self._done.wait(60.0)
            raise
        if self._error is not None:
            raise self._error
        assert self._result is not None
        if self._result.state is JobStatus.FAILED:
            raise JobFailedError(self._result)
        return self._result

    # --- driver loop ----------------------------------------------------------------------

    def _start(self) -> None:
        from pyspark import InheritableThread

        self._monitor = threading.Thread(
            target=self._monitor_loop, name=f"snapflow-monitor-{self.job_id[:8]}", daemon=True
        )
        self._monitor.start()
        self._thread = InheritableThread(
            self._drive, name=f"snapflow-driver-{self.job_id[:8]}", daemon=True
        )
        self._thread.start()
        _LIVE.add(self)

    def _drive(self) -> None:
        final: Finish | None = None
        summaries: tuple[Mapping[str, Any], ...] = ()
        restarts_done = 0
        try:
            while final is None:
                if self._cancel.is_set():
                    final = Finish(JobStatus.CANCELED, "canceled")
                    break
                outcome, stage_summaries = self._run_stage()
                if outcome.succeeded:
                    summaries = stage_summaries
                action = next_action(
                    outcome,
                    restarts_done=restarts_done,
                    strategy=self._restart,
                    cancel_requested=self._cancel.is_set(),
                )
                if isinstance(action, Finish):
                    final = action
                    break
                self._log.warning(
                    "job.restarting",
                    restart=action.restart,
                    delay_s=action.delay_s,
                    reason=action.reason,
                )
                if self._cancel.wait(action.delay_s):
                    continue  # cancelled during the delay: the loop's head finishes
                restarts_done = action.restart
            if final.status is JobStatus.FAILED:
                # Do not leave the job RESTARTING on the coordinator (there is no "fail" RPC).
                with contextlib.suppress(SnapflowError):
                    self._client.call("CancelJob", cpb.CancelJobRequest(job_id=self.job_id))
            self._result = self._make_result(final, summaries)
            self._log.info(
                "job.ended",
                state=final.status.value,
                restarts=self._result.restarts,
                reason=final.reason,
            )
        except BaseException as e:
            self._error = e
            self._log.error("driver.failed", error=f"{type(e).__name__}: {e}")
            with contextlib.suppress(Exception):  # the job must not stay deployed without a driver
                self._client.call("CancelJob", cpb.CancelJobRequest(job_id=self.job_id), 5.0)
        finally:
            self._stop_monitor.set()
            if self._monitor is not None:
                self._monitor.join(5.0)
            self._client.close()
            if self._embedded is not None:
                self._embedded.stop()
            self._done.set()

    def _run_stage(self) -> tuple[StageOutcome, tuple[Mapping[str, Any], ...]]:
        sc = self._sc
        if getattr(sc, "_jsc", None) is None:
            raise FailedPreconditionError(
                f"the SparkContext was stopped: job {self.job_id} cannot be (re)deployed"
            )
        self._stage_attempts += 1
        o = self._options
        config = SlotConfig(
            coordinator_address=self.coordinator_address,
            job_id=self.job_id,
            num_slots=self.slots,
            agent_host=self._agent_host,
            source_batch_records=o.source_batch_records,
            log_level=o.executor_log_level,
            startup_barrier=o.startup_barrier,
            security=agent_security(self._client.security),
            debloat_target_ms=o.debloat_target_ms,
            task_thread=o.task_thread,
            builtins_on_loop=o.builtins_on_loop,
            adaptive_task_thread=o.adaptive_task_thread,
            launch=self._stage_attempts,
        )
        rdd = (
            sc.parallelize(range(self.slots), self.slots)
            .barrier()
            .mapPartitions(functools.partial(run_slot, config))
        )
        keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
        previous = {k: sc.getLocalProperty(k) for k in keys}
        sc.setJobGroup(
            self._group,
            f"snapflow {self.name} ({self.job_id}) stage attempt {self._stage_attempts}",
            interruptOnCancel=True,
        )
        summaries: tuple[Mapping[str, Any], ...] = ()
        error = ""
        try:
            if self._cancel.is_set():
                raise _Canceled
            self._log.info("stage.submitted", attempt=self._stage_attempts, slots=self.slots)
            summaries = tuple(rdd.collect())
            succeeded = True
        except Exception as e:  # Py4JJavaError and friends: the stage failed
            succeeded = False
            if self._cancel.is_set():
                error = "canceled"
                self._log.info("stage.canceled", attempt=self._stage_attempts)
            else:
                error = summarize_spark_error(e)
                with self._lock:
                    self._tracker.failure_noticed(time.monotonic())
                self._log.warning("stage.failed", attempt=self._stage_attempts, error=error)
        finally:
            for k, v in previous.items():
                sc.setLocalProperty(k, v)  # type: ignore[arg-type]  # None removes it
        status, failure = self._settle(succeeded)
        if not succeeded and error != "canceled":
            root = self._root_cause()
            if root:
                error = f"{root} | {error}"
        return StageOutcome(succeeded, status, error, failure), summaries

    def _root_cause(self) -> str:
        """The failure a task reported to the coordinator, root causes first: Spark names the
        task it saw fail first, often a consumer whose producer died (a ChannelFailedError)."""
        try:
            tasks = self._client.call("ListTasks", cpb.ListTasksRequest(job_id=self.job_id)).tasks
        except SnapflowError:
            return ""
        failed = [
            t
            for t in tasks
            if wire.TASK_STATE.from_pb_or(t.state, None) is TaskState.FAILED and t.failure
        ]
        failed.sort(key=lambda t: "ChannelFailedError" in t.failure)
        if not failed:
            return ""
        t = failed[0]
        return f"task {t.attempt.vertex_id}#{t.attempt.subtask_index}@{t.attempt.attempt} failed: {t.failure}"

    def _settle(self, succeeded: bool) -> tuple[JobStatus, str]:
        """Wait (bounded) until the coordinator reports the deployment's end: a terminal state or
        RESTARTING (or, after a failed stage, CREATED: no deployment had started). A job still
        RUNNING when the time is up had its tasks killed before any could report: the next
        registration starts a new deployment anyway."""
        deadline = time.monotonic() + self._options.settle_timeout_s
        while True:
            try:
                info = self._client.job(self.job_id)
            except SnapflowError as e:
                if time.monotonic() > deadline:
                    return JobStatus.UNKNOWN, str(e)
                time.sleep(self._options.poll_interval_s)
                continue
            self._observe(info)
            status = JobStatus.from_pb(info.state)
            if status.is_terminal or status is JobStatus.RESTARTING:
                return status, info.failure
            if not succeeded and status is JobStatus.CREATED:
                return status, info.failure  # no deployment started: nothing to wait for
            if time.monotonic() > deadline:
                return status, info.failure
            time.sleep(self._options.poll_interval_s)

    def _observe(self, info: cpb.JobInfo) -> None:
        with self._lock:
            self._last_info = info
            self._tracker.observe(
                time.monotonic(), JobStatus.from_pb(info.state), int(info.restarts)
            )

    def _monitor_loop(self) -> None:
        show = self._options.progress
        if show is None:
            show = sys.stderr.isatty()
        progress = Progress(self.name) if show else None
        try:
            while not self._stop_monitor.wait(self._options.poll_interval_s):
                with contextlib.suppress(SnapflowError):
                    info = self._client.job(self.job_id)
                    self._observe(info)
                    if progress is not None:
                        progress.update(info, self._client.stats(self.job_id))
        finally:
            if progress is not None:
                with contextlib.suppress(SnapflowError):  # the final state and counts
                    progress.update(self._client.job(self.job_id), self._client.stats(self.job_id))
                progress.stop()

    def _make_result(self, final: Finish, summaries: tuple[Mapping[str, Any], ...]) -> JobResult:
        info: cpb.JobInfo | None
        try:
            info = self._client.job(self.job_id)
            self._observe(info)
            stats = self._client.stats(self.job_id)
            completed = int(stats.counts.completed)
        except SnapflowError:
            info, completed = self._last_info, 0
        with self._lock:
            recovery = tuple(round(t, 3) for t in self._tracker.recovery_times_s)
            savepoint = self._savepoint_path
        return JobResult(
            job_id=self.job_id,
            name=self.name,
            state=final.status,
            checkpoints_completed=completed,
            latest_checkpoint_id=int(info.latest_completed_checkpoint_id) if info else 0,
            restarts=int(info.restarts) if info else 0,
            stage_attempts=self._stage_attempts,
            recovery_times_s=recovery,
            duration_s=round(time.monotonic() - self._started, 3),
            savepoint_path=savepoint,
            failure=final.reason if final.status is not JobStatus.FINISHED else "",
            coordinator_address=self.coordinator_address,
            slot_summaries=summaries,
        )


class _Canceled(Exception):
    pass


_LIVE: weakref.WeakSet[JobHandle] = weakref.WeakSet()


@atexit.register
def _stop_live_jobs() -> None:
    """At interpreter exit, a job still running (``run_async`` without waiting) is cancelled
    and its embedded coordinator stopped: its redis-server child must not outlive the driver."""
    for handle in list(_LIVE):
        if handle.done():
            continue
        with contextlib.suppress(Exception):
            handle._client.call("CancelJob", cpb.CancelJobRequest(job_id=handle.job_id), 2.0)
        if handle._embedded is not None:
            with contextlib.suppress(Exception):
                handle._embedded.stop(timeout_s=5.0)


def _abs_dir(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise InvalidArgumentError(f"target_directory must be a non-empty path, got {path!r}")
    # A URI (file://, s3://) is the coordinator's to check; a plain path is made absolute here,
    # where the caller's working directory means something.
    return text if "://" in text else os.path.abspath(text)


def submit(
    pipeline: JobDefinition,
    spark: SparkSession | SparkContext,
    *,
    coordinator_address: str | None = None,
    restore_from: str | os.PathLike[str] | None = None,
    allow_non_restored_state: bool = False,
    **options: Any,
) -> JobHandle:
    """Submit ``pipeline`` and start its driver loop in a background thread.

    ``coordinator_address``: ``host:port`` of a running coordinator; None starts an embedded
    one for the run (local masters only). ``restore_from``: a savepoint (or retained checkpoint)
    directory to start from; the pipeline's parallelism may differ. ``options``: see
    :class:`RunOptions`.
    """
    try:
        opts = RunOptions(**options)
    except TypeError as e:  # an unknown option
        raise InvalidArgumentError(f"{e}; options are the fields of RunOptions") from None
    graph = pipeline.job_graph()
    if opts.driver_log_level is not None:
        from snapflow.logging import configure_logging

        configure_logging(opts.driver_log_level)
    sc = _spark_context(spark)
    slots = pipeline.slots
    task_cpus = int(sc.getConf().get("spark.task.cpus", "1") or 1)
    local = local_slots(sc.master or "", task_cpus)
    if local is not None and slots > local:
        raise InvalidArgumentError(
            f"pipeline {pipeline.name!r} needs {slots} task slots (its largest parallelism) in one "
            f"barrier stage, but master {sc.master!r} has {local}"
        )
    agent_host = opts.agent_host or ("127.0.0.1" if local is not None else None)
    restore = cpb.RestoreSettings(allow_non_restored_state=allow_non_restored_state)
    if restore_from is not None:
        restore.savepoint_path = _abs_dir(restore_from)
    if coordinator_address is None and local is None:
        raise InvalidArgumentError(
            f"an embedded coordinator binds 127.0.0.1, which executors of master {sc.master!r} "
            f"cannot reach: start `snapflow coordinator` and pass coordinator_address"
        )
    # Before anything is started or submitted: executors with another Snapflow would fail the
    # stage over and over (spark_bridge/preflight.py).
    check_executors(sc, slots)
    embedded: EmbeddedCoordinator | None = None
    if coordinator_address is None:
        embedded = EmbeddedCoordinator().start()
        coordinator_address = embedded.address
    security = PLAINTEXT if embedded is not None else (opts.security or SecuritySettings.from_env())
    client = CoordinatorClient(coordinator_address, security)
    try:
        response = client.call(
            "SubmitJob",
            cpb.SubmitJobRequest(
                graph=graph,
                checkpoint_config=wire.checkpoint_config_to_pb(pipeline.checkpoint_config),
                restore=restore,
                job_id=opts.job_id or "",
            ),
        )
    except BaseException:
        client.close()
        if embedded is not None:
            embedded.stop()
        raise
    job_id = str(response.job.job_id)
    log.info(
        "job.submitted",
        job_id=job_id,
        name=pipeline.name,
        slots=slots,
        coordinator=coordinator_address,
        embedded=embedded is not None,
        restore_from=restore.savepoint_path or None,
    )
    handle = JobHandle(
        pipeline_name=pipeline.name,
        job_id=job_id,
        spark_context=sc,
        client=client,
        embedded=embedded,
        slots=slots,
        options=opts,
        restart=pipeline.restart,
        agent_host=agent_host,
    )
    handle._start()
    return handle


def run(
    pipeline: JobDefinition,
    spark: SparkSession | SparkContext,
    coordinator_address: str | None = None,
    *,
    restore_from: str | os.PathLike[str] | None = None,
    timeout_s: float | None = None,
    **options: Any,
) -> JobResult:
    """Run ``pipeline`` on ``spark`` until the job ends (see :func:`submit`); its result.
    Raises :class:`JobFailedError` when the job failed."""
    handle = submit(
        pipeline,
        spark,
        coordinator_address=coordinator_address,
        restore_from=restore_from,
        **options,
    )
    try:
        return handle.result(timeout_s)
    except DeadlineExceededError:
        handle.cancel()
        handle.result(60.0)
        raise

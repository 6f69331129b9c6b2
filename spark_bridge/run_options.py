"""The terms of a run: what the driver takes (a :class:`JobDefinition` and :class:`RunOptions`)
and what it gives back (a :class:`JobResult`, or :class:`JobFailedError`).

Kept apart from the driver loop (:mod:`snapflow.spark_bridge.driver`) so that the builder and
``execute`` can name these types without depending on the loop's machinery.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.errors import InvalidArgumentError, SnapflowError
from snapflow.security import SecuritySettings
from snapflow.spark_bridge.restart import JobStatus, RestartStrategy
from snapflow.v1 import common_pb2 as pb


class JobDefinition(Protocol):
    """What the driver needs of a job: :class:`snapflow.spark_bridge.pipeline.Pipeline` is one.

    The driver depends on this shape, not on the builder, so the builder can call the driver
    (``Pipeline.run``) without an import cycle.
    """

    name: str
    restart: RestartStrategy

    @property
    def checkpoint_config(self) -> CheckpointConfig: ...

    @property
    def slots(self) -> int: ...

    def job_graph(self) -> pb.JobGraph: ...


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class JobFailedError(SnapflowError):
    """The job failed: the coordinator failed it, or the restart strategy allowed no more
    restarts. ``result`` is the job's :class:`JobResult`."""

    def __init__(self, result: JobResult) -> None:
        super().__init__(f"job {result.name!r} ({result.job_id}) failed: {result.failure}")
        self.result = result


@dataclass(frozen=True)
class RunOptions:
    """How the driver runs a job (all optional).

    ``startup_barrier``: each task calls ``BarrierTaskContext.barrier()`` once before its agent
    registers, so that every slot is launched before a deployment starts. Off by default: the
    agents already wait for each other through the coordinator (every subtask of the deployment
    registered), and the barrier polls about once a second, which measured about +1 s on every
    start and +1.5 to 2.5 s on every recovery (local[4], two slots). ``agent_host``: the address agents bind and advertise
    (default: 127.0.0.1 on a local master, else the executor's host as Spark reports it).
    ``executor_log_level``: the agents' log level (structlog, JSON on the executors' stderr).
    ``driver_log_level``: when set, configure Snapflow's logging in the driver process (the
    driver loop and an embedded coordinator log through structlog; by default their output
    is left to the application's configuration, see :mod:`snapflow.logging`).
    ``settle_timeout_s``: after a stage ends, how long to wait for the coordinator to report
    the deployment's end. ``poll_interval_s``: how often the driver polls the job's state.
    ``job_id``: 32 lowercase hex characters, generated when None. ``progress``: show a live
    progress line (state, records the sources emitted as of the latest checkpoint, checkpoints,
    restarts) on stderr; None (default) = only when stderr is a terminal.
    """

    startup_barrier: bool = False
    agent_host: str | None = None
    source_batch_records: int = 65_536
    executor_log_level: str = "warning"
    driver_log_level: str | None = None
    settle_timeout_s: float = 5.0
    poll_interval_s: float = 0.1
    job_id: str | None = None
    progress: bool | None = None
    security: SecuritySettings | None = None
    """TLS and token of the driver's and the agents' calls to a coordinator given by address
    (docs/security.md); None: from the ``SNAPFLOW_*`` environment. An embedded coordinator is
    plaintext on 127.0.0.1."""
    debloat_target_ms: int | None = None
    """The agents' buffer debloating: each output channel holds what its consumer drains in
    this many milliseconds (0: off); None: the agent's default, 100 (docs/worker.md)."""
    task_thread: bool = True
    """Run every subtask's operators on a task thread of its own (the default), so checkpoints
    never wait for user code; False: on the agent's loop, in steps (docs/worker.md, "Where
    user code runs")."""
    builtins_on_loop: bool = True
    """With ``task_thread``: a subtask of built-in vectorised operators only (a generator
    source, a keyed count on the heap backend) runs on the agent's loop, where it is faster;
    False: every subtask on its task thread (``DataplaneSettings.builtins_on_loop``)."""
    adaptive_task_thread: bool = True
    """Without ``task_thread``: a subtask's operators move from the agent's loop to a task
    thread once their calls are found to block (``DataplaneSettings.adaptive_task_thread``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.task_thread, bool):
            raise InvalidArgumentError(f"task_thread must be a bool, got {self.task_thread!r}")
        if not isinstance(self.builtins_on_loop, bool):
            raise InvalidArgumentError(
                f"builtins_on_loop must be a bool, got {self.builtins_on_loop!r}"
            )
        if not isinstance(self.adaptive_task_thread, bool):
            raise InvalidArgumentError(
                f"adaptive_task_thread must be a bool, got {self.adaptive_task_thread!r}"
            )
        t = self.debloat_target_ms
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise InvalidArgumentError(
                f"debloat_target_ms must be None or an integer >= 0 (0: off), got {t!r}"
            )
        if not isinstance(self.startup_barrier, bool):
            raise InvalidArgumentError(
                f"startup_barrier must be a bool, got {self.startup_barrier!r}"
            )
        if self.agent_host is not None and (
            not isinstance(self.agent_host, str) or not self.agent_host
        ):
            raise InvalidArgumentError(
                f"agent_host must be a non-empty string, got {self.agent_host!r}"
            )
        n = self.source_batch_records
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(f"source_batch_records must be an integer >= 1, got {n!r}")
        if self.executor_log_level not in LOG_LEVELS:
            raise InvalidArgumentError(
                f"executor_log_level must be one of {', '.join(LOG_LEVELS)}, got {self.executor_log_level!r}"
            )
        if self.driver_log_level is not None and self.driver_log_level not in LOG_LEVELS:
            raise InvalidArgumentError(
                f"driver_log_level must be None or one of {', '.join(LOG_LEVELS)}, got {self.driver_log_level!r}"
            )
        for name in ("settle_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidArgumentError(f"{name} must be a number > 0, got {value!r}")
        if self.job_id is not None and not re.fullmatch(r"[0-9a-f]{32}", str(self.job_id)):
            raise InvalidArgumentError(
                f"job_id must be 32 lowercase hex characters, got {self.job_id!r}"
            )


@dataclass(frozen=True)
class JobResult:
    """How a job ended."""

    job_id: str
    name: str
    state: JobStatus
    """FINISHED, CANCELED or FAILED."""
    checkpoints_completed: int
    latest_checkpoint_id: int
    restarts: int
    """Redeployments of the graph (the coordinator's count)."""
    stage_attempts: int
    """Barrier stages the driver submitted (restarts + 1 unless Spark retried a stage itself)."""
    recovery_times_s: tuple[float, ...]
    """Per recovery: from the failure noticed to every task running again."""
    duration_s: float
    savepoint_path: str = ""
    """The savepoint of :meth:`JobHandle.stop_with_savepoint`, if the job was stopped so."""
    failure: str = ""
    coordinator_address: str = ""
    slot_summaries: tuple[Mapping[str, Any], ...] = ()
    """What each Spark task of the last successful stage reported."""

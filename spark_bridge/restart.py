"""Restart strategies and the driver loop's decisions: pure (no Spark, no I/O, no clock).

The driver runs a job's whole graph as one barrier-mode Spark stage (docs/spark_bridge.md). When
the stage ends, :func:`next_action` decides from what happened (did ``collect()`` return, what
the coordinator says about the job, how many restarts were made, the restart strategy, whether
the user cancelled) whether the job is over (:class:`Finish`) or the stage must be submitted
again after a delay (:class:`Resubmit`). :class:`RecoveryTracker` turns the coordinator's job
states, observed over time, into recovery times (failure noticed -> all tasks running again).

Restart strategies (Flink's, bounded):

* :class:`FixedDelay` ``(attempts, delay_s)``: at most ``attempts`` restarts, each after
  ``delay_s``.
* :class:`ExponentialBackoff` ``(initial_s, max_s, attempts, multiplier=2.0)``: restart ``k``
  (1-based) waits ``min(initial_s * multiplier ** (k - 1), max_s)``; at most ``attempts``.
* :class:`NoRestart`: the first failure fails the job.

:data:`DEFAULT_RESTART_STRATEGY` (a pipeline without ``restart_strategy``): exponential
back-off from 1 s to at most 60 s, multiplier 1.5, :data:`UNLIMITED_ATTEMPTS`; a job with
checkpoints should not fail because of its fourth task failure (Flink's default with
checkpointing on never gives up either, see docs/flink-differences.md).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum

from snapflow import wire
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import JobState

__all__ = [
    "DEFAULT_RESTART_STRATEGY",
    "UNLIMITED_ATTEMPTS",
    "ExponentialBackoff",
    "Finish",
    "FixedDelay",
    "JobStatus",
    "NoRestart",
    "RecoveryTracker",
    "RestartStrategy",
    "Resubmit",
    "StageOutcome",
    "next_action",
]


class JobStatus(StrEnum):
    """A job's state as the Spark bridge reports it (``JobResult.state``): a
    :class:`snapflow.jobgraph.JobState` by name, or ``UNKNOWN`` when the coordinator could not
    be asked or sent a number this version does not know.

    Kept beside ``JobState`` (not an alias of it) because it is public API with its own values:
    ``JobResult.state.value`` is the upper-case name ("FINISHED"), while ``JobState`` values are
    the lower-case names stored in Redis; and the driver needs ``UNKNOWN``, which no job on the
    coordinator ever is. Its members are checked against ``JobState`` at import, its proto
    numbers come from ``snapflow.wire.JOB_STATE``.
    """

    UNKNOWN = "UNKNOWN"
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    FINISHED = "FINISHED"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    @classmethod
    def of(cls, state: JobState | None) -> JobStatus:
        """The status of a job state; ``UNKNOWN`` for None."""
        return cls.UNKNOWN if state is None else cls[state.name]

    @classmethod
    def from_pb(cls, value: int) -> JobStatus:
        """The status of a ``JobInfo.state`` number; ``UNKNOWN`` for UNSPECIFIED or a number
        this version does not know."""
        return cls.of(wire.JOB_STATE.from_pb_or(value, None))

    @property
    def job_state(self) -> JobState | None:
        """The coordinator's job state; None for ``UNKNOWN``."""
        return None if self is JobStatus.UNKNOWN else JobState[self.name]

    @property
    def is_terminal(self) -> bool:
        state = self.job_state
        return state is not None and state.is_terminal


# A state added to JobState must be added here too (a JobStatus per JobState): fail at import.
if {s.name for s in JobStatus} != {s.name for s in JobState} | {JobStatus.UNKNOWN.name}:
    raise TypeError(f"JobStatus {list(JobStatus)} does not match JobState {list(JobState)}")


# ---------------------------------------------------------------------------------------------
# Restart strategies
# ---------------------------------------------------------------------------------------------


UNLIMITED_ATTEMPTS = 2**31 - 1
"""As many restarts as Flink's ``Integer.MAX_VALUE``: never give up."""


def _check_attempts(attempts: object) -> int:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise InvalidArgumentError(f"attempts must be an integer >= 0, got {attempts!r}")
    return attempts


def _check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InvalidArgumentError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


class RestartStrategy(ABC):
    """Decides whether and when a failed job is restarted."""

    @abstractmethod
    def next_delay_s(self, restarts_done: int) -> float | None:
        """The delay before restart number ``restarts_done + 1``, or None: no more restarts
        (the job fails)."""


@dataclass(frozen=True)
class NoRestart(RestartStrategy):
    """Never restart: the first failure fails the job."""

    def next_delay_s(self, restarts_done: int) -> float | None:
        return None


@dataclass(frozen=True)
class FixedDelay(RestartStrategy):
    """At most ``attempts`` restarts, each ``delay_s`` after the failure."""

    attempts: int = 3
    delay_s: float = 1.0

    def __post_init__(self) -> None:
        _check_attempts(self.attempts)
        object.__setattr__(self, "delay_s", _check_seconds("delay_s", self.delay_s))

    def next_delay_s(self, restarts_done: int) -> float | None:
        return self.delay_s if restarts_done < self.attempts else None


@dataclass(frozen=True)
class ExponentialBackoff(RestartStrategy):
    """At most ``attempts`` restarts; restart ``k`` (1-based) waits
    ``min(initial_s * multiplier ** (k - 1), max_s)``."""

    initial_s: float = 1.0
    max_s: float = 60.0
    attempts: int = 10
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial_s", _check_seconds("initial_s", self.initial_s))
        object.__setattr__(self, "max_s", _check_seconds("max_s", self.max_s))
        _check_attempts(self.attempts)
        if self.max_s < self.initial_s:
            raise InvalidArgumentError(
                f"max_s ({self.max_s:g}) must be >= initial_s ({self.initial_s:g})"
            )
        m = self.multiplier
        if isinstance(m, bool) or not isinstance(m, int | float) or not math.isfinite(m) or m < 1:
            raise InvalidArgumentError(f"multiplier must be a finite number >= 1, got {m!r}")
        object.__setattr__(self, "multiplier", float(m))

    def next_delay_s(self, restarts_done: int) -> float | None:
        if restarts_done >= self.attempts:
            return None
        delay = self.initial_s
        for _ in range(restarts_done):  # stops once past max_s: no overflow for many attempts
            if delay >= self.max_s:
                break
            delay *= self.multiplier
        return min(delay, self.max_s)


# ---------------------------------------------------------------------------------------------
# Driver decisions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageOutcome:
    """How one run of the barrier stage ended."""

    succeeded: bool
    """``collect()`` returned (every slot's agent ended without an error)."""
    job_status: JobStatus
    """The coordinator's state of the job once the stage ended (settled, see the runner)."""
    error: str = ""
    """The stage's error (Spark's message) when it did not succeed."""
    job_failure: str = ""
    """The coordinator's failure message of the job, if any."""


@dataclass(frozen=True)
class Finish:
    """The job is over: ``status`` is FINISHED, CANCELED or FAILED."""

    status: JobStatus
    reason: str = ""


@dataclass(frozen=True)
class Resubmit:
    """Run the stage again after ``delay_s``: restart number ``restart`` (1-based)."""

    delay_s: float
    restart: int
    reason: str = ""


def next_action(
    outcome: StageOutcome,
    *,
    restarts_done: int,
    strategy: RestartStrategy,
    cancel_requested: bool = False,
) -> Finish | Resubmit:
    """What the driver does after a stage ended.

    * a cancel requested by the user, or a job the coordinator cancelled: CANCELED;
    * a job the coordinator failed (e.g. too many failed checkpoints): FAILED, no restart;
    * a FINISHED job: FINISHED, even if the stage failed afterwards (its output is committed);
    * otherwise the deployment failed (a task failed, or the stage ended without the job
      finishing): restart after the strategy's delay, or FAILED when it allows no more.
    """
    status = outcome.job_status
    if cancel_requested or status is JobStatus.CANCELED:
        return Finish(JobStatus.CANCELED, "canceled" if cancel_requested else outcome.job_failure)
    if status is JobStatus.FAILED:
        return Finish(JobStatus.FAILED, outcome.job_failure or outcome.error or "job failed")
    if status is JobStatus.FINISHED:
        return Finish(JobStatus.FINISHED)
    if outcome.succeeded:
        reason = f"the stage ended but the job is {status.value}, not FINISHED"
    else:
        reason = outcome.error or "the stage failed"
    delay = strategy.next_delay_s(restarts_done)
    if delay is None:
        return Finish(
            JobStatus.FAILED,
            f"restart strategy {strategy!r} allows no more restarts after {restarts_done}; "
            f"last failure: {reason}",
        )
    return Resubmit(delay, restarts_done + 1, reason)


@dataclass
class RecoveryTracker:
    """Recovery times from observations of the job over time.

    A recovery starts when a failure is noticed: the driver saw the stage fail
    (:meth:`failure_noticed`) or the job was seen RESTARTING. It ends when the job is next seen
    RUNNING with a higher restart count (``JobInfo.restarts``, which grows when a new deployment
    registers): the old deployment may still be reported RUNNING for a moment after its stage
    failed. Times are seconds on one monotonic clock chosen by the caller.
    """

    recovery_times_s: list[float] = field(default_factory=list)
    _failed_at: float | None = None
    _baseline: int = 0
    _restarts: int = 0

    def failure_noticed(self, now: float) -> None:
        if self._failed_at is None:
            self._failed_at = now
            self._baseline = self._restarts

    def observe(self, now: float, status: JobStatus, restarts: int) -> None:
        if status is JobStatus.RESTARTING:
            # Either the failed deployment (same restart count) or, if the failure itself was
            # not seen, the next deployment registering (count already raised): the failure
            # belongs to the previously observed count in both cases.
            self.failure_noticed(now)
        elif status is JobStatus.RUNNING and self._failed_at is not None:
            if restarts > self._baseline:
                self.recovery_times_s.append(max(0.0, now - self._failed_at))
                self._failed_at = None
        elif status.is_terminal:
            self._failed_at = None
        self._restarts = max(self._restarts, restarts)

    @property
    def recovering(self) -> bool:
        return self._failed_at is not None


DEFAULT_RESTART_STRATEGY = ExponentialBackoff(
    initial_s=1.0, max_s=60.0, attempts=UNLIMITED_ATTEMPTS, multiplier=1.5
)
"""The driver's strategy when the pipeline names none (Flink 1.19+'s exponential-delay
defaults for initial, maximum and multiplier, without jitter or reset)."""

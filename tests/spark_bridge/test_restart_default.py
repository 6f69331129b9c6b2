"""The driver's default restart strategy: exponential back-off that never gives up."""

from __future__ import annotations

from snapflow.spark_bridge.pipeline import Pipeline
from snapflow.spark_bridge.restart import (
    DEFAULT_RESTART_STRATEGY,
    UNLIMITED_ATTEMPTS,
    ExponentialBackoff,
    JobStatus,
    Resubmit,
    StageOutcome,
    next_action,
)


def test_a_pipeline_without_a_strategy_backs_off_exponentially_up_to_a_minute() -> None:
    assert Pipeline("p", parallelism=1).restart == DEFAULT_RESTART_STRATEGY
    assert (
        ExponentialBackoff(initial_s=1.0, max_s=60.0, attempts=UNLIMITED_ATTEMPTS, multiplier=1.5)
        == DEFAULT_RESTART_STRATEGY
    )
    delays = [DEFAULT_RESTART_STRATEGY.next_delay_s(k) for k in range(12)]
    assert delays[:4] == [1.0, 1.5, 2.25, 3.375]
    assert delays[-1] == 60.0


def test_the_default_still_restarts_after_many_task_failures() -> None:
    # Encoded the bug: FixedDelay(3) failed the job at its 4th task failure.
    failed = StageOutcome(succeeded=False, job_status=JobStatus.RESTARTING, error="task lost")
    for restarts_done in (3, 4, 100, 10_000):
        action = next_action(failed, restarts_done=restarts_done, strategy=DEFAULT_RESTART_STRATEGY)
        delay = min(1.5**restarts_done, 60.0) if restarts_done < 20 else 60.0
        assert action == Resubmit(delay, restarts_done + 1, "task lost")

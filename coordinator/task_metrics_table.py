"""The latest metrics each task's agent reported with its heartbeats (busy and backpressured
time, the watermark: ``snapflow.task_metrics``), for the views (``ListTasks``, the dashboard).

In memory only: they are a live reading, not state to recover; a coordinator that takes over
shows them again after the agents' next heartbeats. One entry per subtask, of its latest
attempt: a redeployment replaces, never adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapflow.coordinator.model import ExecutionAttempt, TaskKey
from snapflow.task_metrics import TaskMetrics


@dataclass(frozen=True)
class ReportedMetrics:
    attempt: ExecutionAttempt
    metrics: TaskMetrics
    received_ms: int
    """When the coordinator received them (its clock)."""


class TaskMetricsTable:
    """The latest reported metrics per subtask."""

    def __init__(self) -> None:
        self._latest: dict[TaskKey, ReportedMetrics] = {}

    def record(self, attempt: ExecutionAttempt, metrics: TaskMetrics, now_ms: int) -> None:
        """``attempt``'s metrics; older ones of its subtask (any attempt) are dropped."""
        self._latest[attempt.key] = ReportedMetrics(attempt, metrics, now_ms)

    def latest(self, attempt: ExecutionAttempt) -> ReportedMetrics | None:
        """The metrics ``attempt`` reported last; None if it reported none (yet)."""
        reported = self._latest.get(attempt.key)
        return reported if reported is not None and reported.attempt == attempt else None

"""A running task's load and event time, as its agent reports them with each heartbeat and the
coordinator shows them (the dashboard's task table, ``ListTasks``). The worker measures them
(``worker/runtime/busy_time.py``, ``TaskShell.watermark``); ``snapflow/wire.py`` maps them to
and from ``snapflow.v1.TaskMetrics``.
"""

from __future__ import annotations

from dataclasses import dataclass

MS_PER_SECOND = 1000.0


@dataclass(frozen=True)
class TaskMetrics:
    """Over one reporting period: of every second, the milliseconds the task spent in operator
    calls (``busy``) and waiting for output credit (``backpressured``), Flink's
    ``busyTimeMsPerSecond`` and ``backPressuredTimeMsPerSecond``; and the watermark it emitted
    last (None: none yet, Flink's ``Long.MIN_VALUE``)."""

    busy_ms_per_second: float = 0.0
    backpressured_ms_per_second: float = 0.0
    watermark_ms: int | None = None
    period_ms: int = 0

"""Prometheus metrics of the coordinator (docs/coordinator.md, "Metrics").

Every coordinator owns a :class:`CoordinatorMetrics` with its own ``CollectorRegistry`` (not
the process-global one), so several coordinators in one process (tests) do not clash.
Names have the ``snapflow_`` prefix and base units (seconds, bytes); the registry also holds
prometheus_client's process, platform and GC collectors (``process_*``, ``python_*``).

Labels: no label ever carries a checkpoint id. The coordinator-wide metrics take label values
from small fixed sets (abort reasons, ack results, refusal reasons, job states), all
pre-initialised to 0 so ``rate()`` works from the start. The per-job metrics
(``snapflow_job_*``) have one label, ``job_id``: they are read from the jobs at scrape time by
:class:`JobMetricsCollector`, so there is one series per job the coordinator hosts (at most
``max_jobs``) and a job's series go when the job goes. The HTTP endpoint is in
``coordinator/dashboard.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from snapflow.coordinator.model import AbortReason, AckResult, JobState, TriggerRefusal

# 5 ms .. 10 min
DURATION_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# 1 KiB .. 16 GiB, x4
SIZE_BUCKETS_BYTES: tuple[float, ...] = tuple(float(1024 * 4**i) for i in range(13))


def label_value(value: enum.Enum | str) -> str:
    """The label value of an enum member (its lower-case name) or a string as is."""
    if isinstance(value, enum.Enum):
        return value.name.lower()
    return str(value)


class CoordinatorMetrics:
    """The coordinator's metrics, registered in ``self.registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.checkpoints_triggered = Counter(
            "snapflow_checkpoints_triggered",
            "Checkpoints and savepoints triggered (an id was allocated and tasks were asked).",
            registry=r,
        )
        self.checkpoints_completed = Counter(
            "snapflow_checkpoints_completed",
            "Checkpoints and savepoints completed (metadata durable and committed).",
            registry=r,
        )
        self.checkpoints_failed = Counter(
            "snapflow_checkpoints_failed",
            "Checkpoints and savepoints aborted, by reason.",
            ["reason"],
            registry=r,
        )
        self.checkpoint_acks = Counter(
            "snapflow_checkpoint_acks",
            "Task acknowledgements received, by result (success, duplicate, unknown, discarded).",
            ["result"],
            registry=r,
        )
        self.trigger_refusals = Counter(
            "snapflow_trigger_refusals",
            "Checkpoint trigger requests refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.task_failures = Counter(
            "snapflow_task_failures",
            "Task attempts reported failed.",
            registry=r,
        )
        self.jobs = Gauge(
            "snapflow_jobs",
            "Jobs known to the coordinator, by state.",
            ["state"],
            registry=r,
        )
        self.checkpoints_in_progress = Gauge(
            "snapflow_checkpoints_in_progress",
            "Checkpoints and savepoints pending right now, over all jobs.",
            registry=r,
        )
        self.last_checkpoint_duration = Gauge(
            "snapflow_last_checkpoint_duration_seconds",
            "End-to-end duration of the most recently completed checkpoint.",
            registry=r,
        )
        self.last_checkpoint_size = Gauge(
            "snapflow_last_checkpoint_size_bytes",
            "State size of the most recently completed checkpoint.",
            registry=r,
        )
        self.checkpoint_duration = Histogram(
            "snapflow_checkpoint_duration_seconds",
            "End-to-end duration of completed checkpoints (trigger to completion).",
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.checkpoint_size = Histogram(
            "snapflow_checkpoint_size_bytes",
            "State size of completed checkpoints.",
            buckets=SIZE_BUCKETS_BYTES,
            registry=r,
        )
        for reason in AbortReason:
            self.checkpoints_failed.labels(reason=label_value(reason))
        for result in AckResult:
            self.checkpoint_acks.labels(result=label_value(result))
        for refusal in TriggerRefusal:
            self.trigger_refusals.labels(reason=label_value(refusal))
        for state in JobState:
            self.jobs.labels(state=label_value(state)).set(0)
        # The coordinator process: CPU, memory, open files, start time; Python version; GC.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.job_collector: JobMetricsCollector | None = None

    def collect_jobs(self, sample: Callable[[], Iterable[JobSample]]) -> None:
        """Export the per-job metrics of ``sample()`` (called at each scrape); once."""
        if self.job_collector is not None:
            raise RuntimeError("the per-job metrics are already collected")
        self.job_collector = JobMetricsCollector(sample)
        self.registry.register(self.job_collector)

    # --- convenience --------------------------------------------------------------------------

    def record_triggered(self) -> None:
        self.checkpoints_triggered.inc()

    def record_completed(self, duration_s: float, size_bytes: int) -> None:
        """A checkpoint completed: counter, histograms and the "last" gauges."""
        duration_s = max(0.0, float(duration_s))
        size = max(0, int(size_bytes))
        self.checkpoints_completed.inc()
        self.checkpoint_duration.observe(duration_s)
        self.checkpoint_size.observe(size)
        self.last_checkpoint_duration.set(duration_s)
        self.last_checkpoint_size.set(size)

    def record_failed(self, reason: AbortReason | str) -> None:
        self.checkpoints_failed.labels(reason=label_value(reason)).inc()

    def record_ack(self, result: AckResult | str) -> None:
        self.checkpoint_acks.labels(result=label_value(result)).inc()

    def record_refusal(self, reason: TriggerRefusal | str) -> None:
        self.trigger_refusals.labels(reason=label_value(reason)).inc()

    def record_task_failure(self) -> None:
        self.task_failures.inc()

    def set_job_counts(self, counts: Mapping[JobState | str, int]) -> None:
        """Set ``snapflow_jobs`` for every state; states missing from ``counts`` become 0."""
        values = {label_value(k): int(v) for k, v in counts.items()}
        for state in JobState:
            name = label_value(state)
            self.jobs.labels(state=name).set(values.pop(name, 0))
        for name, v in values.items():
            self.jobs.labels(state=name).set(v)

    def set_in_progress(self, count: int) -> None:
        self.checkpoints_in_progress.set(count)


# --- per-job metrics ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSample:
    """The per-job values at one scrape. As in Flink's checkpoint and job gauges, -1 means
    "none yet": no completed checkpoint, no restore; and an uptime of -1 an ended job."""

    job_id: str
    last_completed_checkpoint_id: int
    last_checkpoint_duration_s: float
    last_checkpoint_size_bytes: int
    last_restore_timestamp_s: float
    restarts: int
    uptime_s: float


JOB_METRICS: tuple[tuple[str, str, str], ...] = (
    (
        "snapflow_job_last_completed_checkpoint_id",
        "last_completed_checkpoint_id",
        "Id of the job's latest completed checkpoint or savepoint (-1: none yet).",
    ),
    (
        "snapflow_job_last_checkpoint_duration_seconds",
        "last_checkpoint_duration_s",
        "End-to-end duration of the job's latest completed checkpoint (-1: none yet).",
    ),
    (
        "snapflow_job_last_checkpoint_size_bytes",
        "last_checkpoint_size_bytes",
        "State size of the job's latest completed checkpoint (-1: none yet).",
    ),
    (
        "snapflow_job_last_checkpoint_restore_timestamp_seconds",
        "last_restore_timestamp_s",
        "Unix time the job's tasks last restored from a checkpoint or savepoint (-1: never).",
    ),
    (
        "snapflow_job_uptime_seconds",
        "uptime_s",
        "How long the job has been RUNNING without interruption (0: not running yet or "
        "restarting, -1: ended).",
    ),
)


class JobMetricsCollector(Collector):
    """``snapflow_job_*`` with a ``job_id`` label, read from ``sample()`` at each scrape.

    ``sample`` reads the jobs' state, which the coordinator's event loop owns: the HTTP
    server (``coordinator/dashboard.py``) runs on that loop, so a scrape sees a consistent
    state without locks."""

    def __init__(self, sample: Callable[[], Iterable[JobSample]]) -> None:
        self._sample = sample

    def describe(self) -> Iterator[Metric]:
        return self._families([])

    def collect(self) -> Iterator[Metric]:
        return self._families(list(self._sample()))

    @staticmethod
    def _families(samples: list[JobSample]) -> Iterator[Metric]:
        for name, attribute, documentation in JOB_METRICS:
            gauge = GaugeMetricFamily(name, documentation, labels=["job_id"])
            for s in samples:
                gauge.add_metric([s.job_id], float(getattr(s, attribute)))
            yield gauge
        restarts = CounterMetricFamily(
            "snapflow_job_restarts",
            "Times the job's tasks were redeployed after a failure (Flink's numRestarts).",
            labels=["job_id"],
        )
        for s in samples:
            restarts.add_metric([s.job_id], float(s.restarts))
        yield restarts

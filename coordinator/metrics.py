"""Prometheus metrics of the coordinator (docs/coordinator.md, "Metrics").

Every coordinator owns a :class:`CoordinatorMetrics` with its own ``CollectorRegistry`` (not
the process-global one), so several coordinators in one process (tests) do not clash.
Names have the ``snapflow_`` prefix and base units (seconds, bytes). No label carries a
checkpoint id or a job id: label values come from small fixed sets (abort reasons, ack results,
refusal reasons, job states), all pre-initialised to 0 so ``rate()`` works from the start.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from snapflow.coordinator.model import AbortReason, AckResult, JobState, TriggerRefusal
from snapflow.security import PLAINTEXT, SecuritySettings

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


class MetricsServer:
    """The running ``/metrics`` HTTP server. ``shutdown()`` stops it, closes its socket and
    joins its thread; it is idempotent."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread, host: str, port: int) -> None:
        self._httpd = httpd
        self.thread = thread
        self.host = host
        self.port = port
        self._stopped = False
        self._lock = threading.Lock()

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self.thread.join(timeout)

    close = shutdown

    def __repr__(self) -> str:
        return f"MetricsServer(host={self.host!r}, port={self.port})"


def start_metrics_server(
    metrics: CoordinatorMetrics, host: str, port: int, security: SecuritySettings = PLAINTEXT
) -> tuple[MetricsServer, int]:
    """Serve ``metrics.registry`` at ``http://host:port/metrics`` in a daemon thread.

    With TLS in ``security`` the endpoint serves HTTPS with the gRPC server's certificate,
    and with ``tls_client_ca_file`` it requires a client certificate signed by that CA
    (the scraper's); otherwise bind it (``metrics_host``) to the scrape network only.

    ``port`` 0 picks a free port. Returns the server (stop it with ``server.shutdown()`` or
    :func:`stop_metrics_server`) and the bound port. A negative port (disabled) is the caller's
    business and raises ``ValueError``.
    """
    if port < 0 or port > 65535:
        raise ValueError(f"metrics port {port} is out of range 0..65535 (-1 means disabled)")
    tls: dict[str, Any] = {}
    if security.server_tls:
        tls = {
            "certfile": security.tls_cert_file,
            "keyfile": security.tls_key_file,
            "client_cafile": security.tls_client_ca_file or None,
            "client_auth_required": bool(security.tls_client_ca_file),
        }
    result = start_http_server(port, addr=host, registry=metrics.registry, **tls)
    if not isinstance(result, tuple):  # prometheus_client < 0.20 returned None
        raise RuntimeError("prometheus_client >= 0.20 is required (start_http_server -> tuple)")
    httpd, thread = result
    bound_port = int(httpd.server_address[1])
    return MetricsServer(httpd, thread, host, bound_port), bound_port


def stop_metrics_server(server: MetricsServer, timeout: float = 5.0) -> None:
    server.shutdown(timeout)

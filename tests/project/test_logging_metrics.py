"""Structured logging (one JSON event per line with the bound job context) and the Prometheus
metrics registry and HTTP endpoint."""

from __future__ import annotations

import io
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator

import prometheus_client
import pytest
import structlog

from snapflow.coordinator.metrics import (
    CoordinatorMetrics,
    start_metrics_server,
    stop_metrics_server,
)
from snapflow.coordinator.model import (
    AbortReason,
    AckResult,
    ExecutionAttempt,
    JobState,
    TriggerRefusal,
)
from snapflow.logging import bind_job, configure_logging

# --- logging -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state: put it back for the other tests."""
    saved = structlog.get_config()
    root = logging.getLogger()
    level = root.level
    try:
        yield
    finally:
        structlog.configure(**saved)
        for handler in list(root.handlers):
            if type(handler).__module__ == "snapflow.logging":
                root.removeHandler(handler)
        root.setLevel(level)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def test_json_line_with_bound_job_context_when_not_a_tty(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info", "auto")  # pytest's captured stderr is not a TTY
    log = structlog.get_logger("snapflow.test")
    with bind_job("job-1", checkpoint_id=42, task=ExecutionAttempt("map", 1, 0)):
        log.info("checkpoint.completed", bytes=1024, duration_ms=12)
    log.info("job.restored")
    out = lines(capsys.readouterr().err)
    assert len(out) == 2
    event = json.loads(out[0])
    assert event["event"] == "checkpoint.completed"
    assert event["job_id"] == "job-1"
    assert event["checkpoint_id"] == 42
    assert event["task"] == "map#1@0"
    assert event["bytes"] == 1024
    assert event["level"] == "info"
    assert event["timestamp"].endswith("Z") and "T" in event["timestamp"]
    after = json.loads(out[1])
    assert after["event"] == "job.restored"
    assert "job_id" not in after and "checkpoint_id" not in after


def test_level_filter_and_explicit_stream() -> None:
    stream = io.StringIO()
    configure_logging("warning", "json", stream=stream)
    log = structlog.get_logger()
    log.info("dropped")
    log.warning("checkpoint.expired", reason="timeout")
    out = lines(stream.getvalue())
    assert [json.loads(line)["event"] for line in out] == ["checkpoint.expired"]


def test_exceptions_stay_on_one_line() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    try:
        raise RuntimeError("disk full")
    except RuntimeError:
        structlog.get_logger().exception("checkpoint.aborted")
    out = lines(stream.getvalue())
    assert len(out) == 1
    assert "RuntimeError: disk full" in json.loads(out[0])["exception"]


def test_configure_twice_is_idempotent_and_routes_stdlib_logging() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    configure_logging("info", "json", stream=stream)
    structlog.get_logger().info("task.failed")
    with bind_job("job-2"):
        logging.getLogger("grpc.test").warning("channel %s closed", "c1")
    out = [json.loads(line) for line in lines(stream.getvalue())]
    assert [e["event"] for e in out] == ["task.failed", "channel c1 closed"]
    assert out[1]["logger"] == "grpc.test"
    assert out[1]["level"] == "warning"
    assert out[1]["job_id"] == "job-2"


def test_cached_logger_follows_a_later_configuration() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first)
    log = structlog.get_logger()
    log.info("one")  # assembles and caches the logger
    configure_logging("error", "json", stream=second)
    log.info("two")  # now below the level
    log.error("three")
    assert [json.loads(x)["event"] for x in lines(first.getvalue())] == ["one"]
    assert [json.loads(x)["event"] for x in lines(second.getvalue())] == ["three"]


def test_console_on_a_tty() -> None:
    tty = FakeTTY()
    configure_logging("info", "auto", stream=tty)
    structlog.get_logger().info("checkpoint.triggered", job_id="j")
    text = tty.getvalue()
    assert "checkpoint.triggered" in text
    assert len(lines(text)) == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="log level"):
        configure_logging("loud")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml")


# --- metrics -----------------------------------------------------------------------------------


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        body: bytes = resp.read()
    return body.decode()


def test_metrics_server_serves_snapflow_metrics_and_stops() -> None:
    metrics = CoordinatorMetrics()
    metrics.record_triggered()
    metrics.record_completed(duration_s=0.2, size_bytes=5000)
    metrics.record_failed(AbortReason.EXPIRED)
    metrics.record_ack(AckResult.SUCCESS)
    metrics.record_refusal(TriggerRefusal.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
    metrics.record_task_failure()
    metrics.set_job_counts({JobState.RUNNING: 2})
    metrics.set_in_progress(1)

    server, port = start_metrics_server(metrics, "127.0.0.1", 0)
    try:
        assert port > 0 and server.port == port
        text = scrape(port)
    finally:
        stop_metrics_server(server)
    for expected in [
        "snapflow_checkpoints_triggered_total 1.0",
        "snapflow_checkpoints_completed_total 1.0",
        'snapflow_checkpoints_failed_total{reason="expired"} 1.0',
        'snapflow_checkpoints_failed_total{reason="declined"} 0.0',
        'snapflow_checkpoint_acks_total{result="success"} 1.0',
        'snapflow_trigger_refusals_total{reason="minimum_time_between_checkpoints"} 1.0',
        "snapflow_task_failures_total 1.0",
        'snapflow_jobs{state="running"} 2.0',
        'snapflow_jobs{state="failed"} 0.0',
        "snapflow_checkpoints_in_progress 1.0",
        "snapflow_last_checkpoint_duration_seconds 0.2",
        "snapflow_last_checkpoint_size_bytes 5000.0",
        'snapflow_checkpoint_duration_seconds_bucket{le="0.005"} 0.0',
        'snapflow_checkpoint_duration_seconds_bucket{le="0.25"} 1.0',
        'snapflow_checkpoint_duration_seconds_bucket{le="600.0"} 1.0',
        "snapflow_checkpoint_duration_seconds_count 1.0",
        "snapflow_checkpoint_size_bytes_count 1.0",
    ]:
        assert expected in text, expected
    server.shutdown()  # idempotent
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_registries_are_separate_and_labels_are_low_cardinality() -> None:
    a, b = CoordinatorMetrics(), CoordinatorMetrics()
    a.record_triggered()
    assert a.registry.get_sample_value("snapflow_checkpoints_triggered_total") == 1.0
    assert b.registry.get_sample_value("snapflow_checkpoints_triggered_total") == 0.0
    global_names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert "snapflow_checkpoints_triggered" not in global_names

    names = set()
    for family in a.registry.collect():
        names.add(family.name)
        for sample in family.samples:
            assert not {"checkpoint_id", "job_id"} & set(sample.labels), sample
    assert all(n.startswith("snapflow_") for n in names)
    assert len(names) == 12


def test_metrics_server_rejects_disabled_port() -> None:
    with pytest.raises(ValueError, match="disabled"):
        start_metrics_server(CoordinatorMetrics(), "127.0.0.1", -1)

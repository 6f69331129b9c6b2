"""Structured logging (one JSON event per line with the bound job context). The Prometheus
metrics and their HTTP endpoint are tested in tests/coordinator/test_metrics.py and
tests/coordinator/test_dashboard_*.py."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from snapflow.coordinator.model import ExecutionAttempt
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

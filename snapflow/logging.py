"""Structured logging for every Snapflow process (docs/coordinator.md, "Log events").

``configure_logging`` sets up structlog: context variables merged into every event (bind
``job_id``, ``checkpoint_id`` and ``task`` with :func:`bind_job`), the level, an ISO-8601 UTC
timestamp, and one event per line: JSON when the output is not a terminal (or ``fmt="json"``),
a coloured console rendering on a terminal (or ``fmt="console"``). Records of the standard
``logging`` module (grpc, redis, ...) are rendered the same way.

It is cheap and idempotent, and it works with ``cache_logger_on_first_use``: the processor list
is updated in place and the output stream is looked up on every write, so loggers that were
cached under an earlier configuration follow a later one's format, stream and a *raised* level.
(A cached logger whose level was higher keeps dropping the lower levels: configure once, at
start, before logging.)
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["bind_job", "configure_logging", "get_logger"]

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
FORMATS = ("auto", "json", "console")

# Method names of a bound logger -> level (``exception`` logs at error level).
_METHOD_LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "msg": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "err": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


class _State:
    level: int = logging.INFO
    stream: TextIO | None = None  # None: whatever sys.stderr is at the time of the write


_state = _State()
_lock = threading.Lock()
# Handed to structlog once and then only mutated in place, so cached loggers see changes.
_processors: list[Processor] = []


class _Sink:
    """A file-like object that writes to the configured stream or the current ``sys.stderr``
    (so pytest's capture and redirected stderr work after ``configure_logging``)."""

    def _target(self) -> TextIO:
        return _state.stream if _state.stream is not None else sys.stderr

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        try:
            return bool(self._target().isatty())
        except (AttributeError, ValueError):
            return False


_sink = _Sink()


def _filter_level(_: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    # Loggers cached under a lower level still honour a later, higher level.
    if _METHOD_LEVELS.get(method_name, logging.INFO) < _state.level:
        raise structlog.DropEvent
    return event_dict


class _StdlibHandler(logging.Handler):
    """Renders stdlib ``logging`` records with the same processors, to the same stream."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _sink.write(self.format(record) + "\n")
            _sink.flush()
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def configure_logging(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog (and the stdlib root logger) for this process.

    ``level``: debug, info, warning, error or critical. ``fmt``: ``json``, ``console`` or
    ``auto`` (console on a terminal, JSON otherwise). ``stream``: where lines go; default the
    current ``sys.stderr``. Calling it again replaces the previous configuration.
    """
    level_no = LEVELS.get(str(level).strip().lower())
    if level_no is None:
        raise ValueError(f"unknown log level {level!r}; allowed: {', '.join(LEVELS)}")
    fmt = str(fmt).strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; allowed: {', '.join(FORMATS)}")

    with _lock:
        _state.stream = stream
        _state.level = level_no
        tty = _sink.isatty()
        use_console = fmt == "console" or (fmt == "auto" and tty)

        shared: list[Processor] = [
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
        ]
        renderer: Processor
        if use_console:
            # ConsoleRenderer renders exceptions itself (and warns if format_exc_info runs).
            renderer = structlog.dev.ConsoleRenderer(colors=tty)
            tail: list[Processor] = []
        else:
            renderer = structlog.processors.JSONRenderer()
            tail = [structlog.processors.format_exc_info, structlog.processors.UnicodeDecoder()]
        _processors[:] = [_filter_level, *shared, *tail, renderer]
        structlog.configure(
            processors=_processors,
            wrapper_class=structlog.make_filtering_bound_logger(level_no),
            logger_factory=structlog.WriteLoggerFactory(file=_sink),  # type: ignore[arg-type]
            context_class=dict,
            cache_logger_on_first_use=True,
        )

        formatter = structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, *tail],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
        root = logging.getLogger()
        for h in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
            root.removeHandler(h)
        handler = _StdlibHandler()
        handler.setFormatter(formatter)
        root.addHandler(handler)
        root.setLevel(level_no)


def get_logger(name: str | None = None, **initial_values: Any) -> Any:
    """``structlog.get_logger`` (kept here so callers import one module)."""
    return structlog.get_logger(name, **initial_values)


@contextmanager
def bind_job(
    job_id: str, checkpoint_id: int | None = None, task: object | None = None
) -> Iterator[MutableMapping[str, Any]]:
    """Bind ``job_id`` (and ``checkpoint_id`` / ``task`` when given) to every event logged in
    this context (this thread or asyncio task); restored on exit. ``task`` is rendered with
    ``str`` (``TaskKey`` / ``ExecutionAttempt`` print as ``vertex#index[@attempt]``)."""
    values: dict[str, Any] = {"job_id": job_id}
    if checkpoint_id is not None:
        values["checkpoint_id"] = checkpoint_id
    if task is not None:
        values["task"] = str(task)
    with structlog.contextvars.bound_contextvars(**values):
        yield values

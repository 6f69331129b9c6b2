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

Native output in a JSON log (:func:`route_native_stderr`, used by ``snapflow coordinator`` and
``snapflow worker`` with JSON logs): gRPC's C core logs through absl straight to file
descriptor 2 (``W1124 21:27:45.601426 4077 log.cc:110] ...``, more with ``GRPC_VERBOSITY`` and
``GRPC_TRACE``), and so do a Python traceback at a crash, faulthandler, and child processes.
None of that goes through ``logging``. So descriptor 2 becomes a pipe read by a small relay
process, which passes JSON lines through unchanged and wraps every other line in a JSON event
(``grpc.core_log`` for absl's format with its level, file and thread; ``stderr.line``
otherwise). A separate process, not a thread: it outlives a crash of the process and still
writes the crash's last lines; it runs in its own process group, so a Ctrl-C of the
terminal does not stop it before the process it serves, and it ends when every writer
has closed the pipe.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["bind_job", "configure_logging", "get_logger", "route_native_stderr"]

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
    json: bool = False  # the last configuration renders JSON
    relay: subprocess.Popen[bytes] | None = None  # route_native_stderr's relay process


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
        _state.json = not use_console

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


def route_native_stderr() -> bool:
    """With JSON logs on this process's stderr, turn every line written to file descriptor 2
    (gRPC C core, absl, crashes, child processes) into a JSON event, through a relay process
    (module docstring). Returns whether it is routed; a no-op for console logs, a configured
    stream other than stderr, or when already routed. Call it once, after
    :func:`configure_logging` and before starting gRPC or child processes."""
    with _lock:
        if _state.relay is not None:
            return True
        if not _state.json or _state.stream is not None:
            return False
        try:
            sys.stderr.flush()
            stderr_fd = sys.stderr.fileno()  # the real stderr, before it becomes the pipe
        except (AttributeError, ValueError, OSError):
            return False  # not a file descriptor (a test's capture): nothing native lands there
        if stderr_fd != 2:
            return False
        read_end, write_end = os.pipe()
        try:
            relay = subprocess.Popen(
                [sys.executable, "-c", "from snapflow.logging import relay_main; relay_main()"],
                stdin=read_end,
                stdout=stderr_fd,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                process_group=0,  # Ctrl-C of the terminal does not reach it
            )
        except OSError:
            os.close(read_end)
            os.close(write_end)
            return False
        os.close(read_end)
        original = os.dup(2)
        os.set_inheritable(original, False)
        os.dup2(write_end, 2)
        os.close(write_end)
        _state.relay = relay
        atexit.register(_drain_relay, relay, original)
        return True


RELAY_DRAIN_S = 5.0


def _drain_relay(relay: subprocess.Popen[bytes], original: int) -> None:
    """At exit: give descriptor 2 back to the real stderr (which closes this process's end of
    the pipe) and wait, bounded, until the relay has written every line, so that whoever
    reads the log after this process exited finds its last events."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    with contextlib.suppress(OSError):
        os.dup2(original, 2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        relay.wait(RELAY_DRAIN_S)  # longer only if a child process still holds the pipe


# absl's prefix: severity letter, MMDD HH:MM:SS.micros, thread id, file:line]
_ABSL_LINE = re.compile(
    r"^(?P<severity>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(?P<thread>\d+)\s+"
    r"(?P<source>[^\]\s]+)\]\s?(?P<message>.*)$"
)
_ABSL_LEVELS = {"I": "info", "W": "warning", "E": "error", "F": "critical"}
MAX_RELAYED_LINE_CHARS = 16 * 1024


def wrap_native_line(line: str, now: str) -> str:
    """One line of native stderr as a JSON event line (a JSON object line passes unchanged)."""
    stripped = line.rstrip("\r\n")
    if stripped.startswith("{"):
        try:
            if isinstance(json.loads(stripped), dict):
                return stripped
        except ValueError:
            pass
    if len(stripped) > MAX_RELAYED_LINE_CHARS:
        stripped = stripped[:MAX_RELAYED_LINE_CHARS] + f"... ({len(stripped)} characters, cut)"
    match = _ABSL_LINE.match(stripped)
    event: dict[str, Any]
    if match:
        event = {
            "event": "grpc.core_log",
            "level": _ABSL_LEVELS[match["severity"]],
            "logger": "grpc",
            "message": match["message"],
            "source": match["source"],
            "thread": int(match["thread"]),
        }
    else:
        event = {"event": "stderr.line", "level": "warning", "logger": "stderr", "line": stripped}
    event["timestamp"] = now
    return json.dumps(event)


def relay_main() -> None:
    """The relay process: stdin (the pipe) to stdout (the real stderr), line by line, until
    every writer has closed the pipe. Signals are left to the process it serves."""
    import datetime
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    out = sys.stdout
    for raw in sys.stdin.buffer:
        now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
        out.write(wrap_native_line(raw.decode("utf-8", "replace"), now) + "\n")
        out.flush()


def get_logger(name: str | None = None, **initial_values: Any) -> Any:
    """``structlog.get_logger`` (kept here so callers import one module)."""
    return structlog.get_logger(name, **initial_values)


@contextlib.contextmanager
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

"""A source of text lines from a TCP socket.

* :class:`SocketTextSource` -- unbounded text lines from a TCP socket. **Not replayable** (see
  its docstring for the exact guarantee: at-most-once, not exactly-once).
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections import deque
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.runtime.operator import OperatorContext, SourceOperator
from snapflow.worker.state.operator_state import OperatorListState

LINE_SCHEMA = pa.schema([("line", pa.string())])


class SocketTextSource(SourceOperator):
    """Unbounded text lines (one string column ``line``) read from a TCP server.

    **Delivery guarantee: at-most-once -- this source is NOT replayable.** A socket cannot be
    rewound, so nothing read from it can be read again after a failure:

    * Lines received *and emitted* after the last completed checkpoint are lost when the job
      restores from it (the downstream state rolls back, the source cannot re-read them); so
      is everything the socket or the kernel held at the failure. Nothing is duplicated by the
      source itself.
    * Lines received but not yet emitted when a checkpoint is taken (at most a few batches
      pending behind ``max_records``) are part of the checkpoint and emitted after a restore.
      A partial line (no newline yet) is not: a new connection is a new stream.
    * At-least-once (or better) is possible only if the *sender* resends, after the source
      reconnects, everything since the last completed checkpoint -- this source sends no
      acknowledgements, so that needs an application-level protocol outside Snapflow. Use a
      replayable source (files, a DataFrame) when the results must be exactly-once.

    Only subtask 0 connects (like Flink's non-parallel socket source); the others idle with
    watermark ``MAX_WATERMARK``. The socket is non-blocking: ``poll_batch`` returns what has
    arrived (up to ``max_records`` complete lines; ``\\r\\n`` or ``\\n``; UTF-8, invalid bytes
    replaced) or a 0-row batch. On a connection error or end of stream the source closes the
    socket (emitting a final unterminated line on a clean end of stream) and reconnects after
    ``reconnect_delay_s``; ``max_reconnects`` (None: forever) consecutive failed attempts raise
    ``ConnectionError``. No event time: the watermark is ``MIN_WATERMARK``.
    """

    _runtime_fields = (
        "_sock",
        "_buffer",
        "_pending",
        "_pending_state",
        "_next_connect",
        "_failures",
        "_active",
    )

    def __init__(
        self,
        host: str,
        port: int,
        *,
        reconnect_delay_s: float = 1.0,
        max_reconnects: int | None = None,
        connect_timeout_s: float = 1.0,
        encoding: str = "utf-8",
        max_line_bytes: int = 1 << 20,
    ) -> None:
        if not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidArgumentError(f"port must be an integer in 1..65535, got {port!r}")
        if reconnect_delay_s < 0 or connect_timeout_s <= 0:
            raise InvalidArgumentError("need reconnect_delay_s >= 0 and connect_timeout_s > 0")
        if max_reconnects is not None and (
            not isinstance(max_reconnects, int) or max_reconnects < 0
        ):
            raise InvalidArgumentError(
                f"max_reconnects must be an integer >= 0 or None, got {max_reconnects!r}"
            )
        self.host = host
        self.port = port
        self.reconnect_delay_s = reconnect_delay_s
        self.max_reconnects = max_reconnects
        self.connect_timeout_s = connect_timeout_s
        self.encoding = encoding
        self.max_line_bytes = max_line_bytes

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._pending_state: OperatorListState[Any] = ctx.operator_state.get_list_state(
            ctx.state_name("pending-lines")
        )
        self._pending: deque[str] = deque(self._pending_state.get() if ctx.is_restored else [])
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._next_connect = 0.0
        self._failures = 0
        self._active = ctx.subtask_index == 0

    @property
    def connected(self) -> bool:
        return getattr(self, "_sock", None) is not None

    def snapshot_state(self, checkpoint_id: int) -> None:
        self._pending_state.update(list(self._pending))

    def close(self) -> None:
        self._disconnect()

    def _disconnect(self) -> None:
        sock = getattr(self, "_sock", None)
        self._sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _connect(self) -> None:
        now = time.monotonic()
        if now < self._next_connect:
            return
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except OSError as exc:
            self._failures += 1
            self._next_connect = now + self.reconnect_delay_s
            if self.max_reconnects is not None and self._failures > self.max_reconnects:
                raise ConnectionError(
                    f"{self.name}: cannot connect to {self.host}:{self.port} after "
                    f"{self._failures} attempts: {exc}"
                ) from exc
            return
        sock.setblocking(False)
        self._sock = sock
        self._failures = 0

    def _lost(self, clean_eof: bool) -> None:
        if clean_eof and self._buffer:
            self._pending.append(self._decode(bytes(self._buffer)))
        self._buffer.clear()
        self._disconnect()
        self._next_connect = time.monotonic() + self.reconnect_delay_s

    def _decode(self, raw: bytes) -> str:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        return raw.decode(self.encoding, errors="replace")

    def _receive(self, wanted: int) -> None:
        sock = self._sock
        while sock is not None and len(self._pending) < wanted:
            try:
                chunk = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return
                self._lost(clean_eof=False)
                return
            if not chunk:
                self._lost(clean_eof=True)
                return
            self._buffer += chunk
            *lines, rest = bytes(self._buffer).split(b"\n")
            self._pending.extend(self._decode(line) for line in lines)
            if len(rest) > self.max_line_bytes:  # a runaway line: emit it in pieces
                self._pending.append(self._decode(rest))
                rest = b""
            self._buffer = bytearray(rest)

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        self._context()
        wanted = max(0, int(max_records))
        if self._active and wanted:
            if self._sock is None:
                self._connect()
            self._receive(wanted)
        n = min(wanted, len(self._pending))
        lines = [self._pending.popleft() for _ in range(n)]
        return pa.RecordBatch.from_arrays([pa.array(lines, pa.string())], schema=LINE_SCHEMA)

    def current_watermark(self) -> int:
        self._context()
        return MIN_WATERMARK if self._active or self._pending else MAX_WATERMARK

    def __repr__(self) -> str:
        return f"SocketTextSource({self.host!r}, {self.port})"

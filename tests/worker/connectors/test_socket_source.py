"""worker/connectors/socket_source.py: the socket text source (non-blocking reads,
reconnect, at-most-once), against a local TCP server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.polling import wait_until
from kit.sources import src_ctx as _src_ctx
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.connectors.socket_source import SocketTextSource
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend


def src_ctx(*args: Any, **kwargs: Any) -> OperatorContext:
    return _src_ctx(*args, vertex_id="src", operator_id="socket", **kwargs)


def snapshot(backend: OperatorStateBackend, source: Any, cid: int, directory: Path) -> list[Any]:
    source.snapshot_state(cid)
    return backend.snapshot(cid).write(str(directory / f"chk-{cid}"))


# ---------------------------------------------------------------------------------------------
# SocketTextSource
# ---------------------------------------------------------------------------------------------


class LineServer:
    """A local TCP server: each accepted connection gets the next script (a list of byte
    chunks, sent with a short pause), then is closed."""

    def __init__(self, scripts: list[list[bytes]]) -> None:
        self.scripts = list(scripts)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set() and self.scripts:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            script = self.scripts.pop(0)
            with conn:
                for chunk in script:
                    if chunk == b"WAIT":
                        self.release.wait(5)
                        continue
                    conn.sendall(chunk)
                    time.sleep(0.01)

    def close(self) -> None:
        self.stop.set()
        self.release.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    servers: list[LineServer] = []

    def make(scripts: list[list[bytes]]) -> LineServer:
        servers.append(LineServer(scripts))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def poll_until(src: SocketTextSource, count: int, max_records: int = 100) -> list[str]:
    """The lines the source emits until ``count`` came (or the wait timed out: fewer)."""
    lines: list[str] = []

    def enough() -> bool:
        b = src.poll_batch(max_records)
        assert b is not None  # unbounded: never None
        assert b.num_rows <= max_records
        lines.extend(b.column("line").to_pylist())
        return len(lines) >= count

    wait_until(enough, f"{count} lines", timeout_s=5, interval_s=0.005)
    return lines


def test_socket_source_lines_nonblocking_and_reconnect(server_factory: Any) -> None:
    server = server_factory(
        [
            [b"hello\nwor", b"ld\r\n", b"WAIT", "caf\u00e9\n".encode(), b"tail-no-newline"],
            [b"second connection\n"],
        ]
    )
    src = SocketTextSource("127.0.0.1", server.port, reconnect_delay_s=0.01)
    src.open(src_ctx())
    assert poll_until(src, 2) == ["hello", "world"]
    # Nothing more is sent until released: polls return 0-row batches (a poll that waited for
    # data would get the next line once the server's hold ends, or hang the test).
    for _ in range(5):
        b = src.poll_batch(10)
        assert b is not None and b.num_rows == 0
    assert src.connected
    server.release.set()
    # clean end of stream: the unterminated last line is emitted; then reconnect
    assert poll_until(src, 3) == ["caf\u00e9", "tail-no-newline", "second connection"]
    assert server.accepted == 2
    assert src.current_watermark() == MIN_WATERMARK
    src.close()
    assert not src.connected


def test_socket_source_max_records_pending_survive_checkpoint(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory([[b"".join(b"l%d\n" % i for i in range(10)), b"WAIT"]])
    backend = OperatorStateBackend()
    src = SocketTextSource("127.0.0.1", server.port)
    src.open(src_ctx(backend=backend))
    got = poll_until(src, 3, max_records=3)
    assert got == ["l0", "l1", "l2"]

    def received_all() -> bool:  # received, not yet emitted
        src.poll_batch(0)
        src._receive(100)
        return len(src._pending) >= 7

    wait_until(received_all, "7 lines pending", timeout_s=5, interval_s=0.005)
    handles = snapshot(backend, src, 1, tmp_path)
    src.close()
    # restore: the lines received before the checkpoint but not emitted come out; nothing is
    # replayed from the socket (lines received after the checkpoint would be lost)
    restored = OperatorStateBackend()
    restored.restore({0: handles}, 0, 1)
    again = cloudpickle.loads(cloudpickle.dumps(SocketTextSource("127.0.0.1", server.port)))
    again.open(src_ctx(backend=restored, restored=1))
    b = again.poll_batch(100)
    assert b is not None
    assert b.column("line").to_pylist()[:7] == [f"l{i}" for i in range(3, 10)]
    again.close()


def test_socket_source_other_subtasks_idle_and_connect_failures(server_factory: Any) -> None:
    idle = SocketTextSource("127.0.0.1", 9)
    idle.open(src_ctx(1, 2))
    b = idle.poll_batch(10)
    assert b is not None and b.num_rows == 0
    assert not idle.connected
    assert idle.current_watermark() == MAX_WATERMARK

    # a port with no listener: retried after the delay, then ConnectionError
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    failing = SocketTextSource("127.0.0.1", port, reconnect_delay_s=0.0, max_reconnects=2)
    failing.open(src_ctx())
    for _ in range(2):
        b = failing.poll_batch(10)
        assert b is not None and b.num_rows == 0
    with pytest.raises(ConnectionError):
        failing.poll_batch(10)
    with pytest.raises(InvalidArgumentError):
        SocketTextSource("127.0.0.1", 0)

"""Fault injection for S3: a real HTTP reverse proxy on 127.0.0.1 in front of the session's moto
server that answers chosen requests with the errors S3 gives under load or failure.

A client pointed at :attr:`FaultProxy.url` talks to moto through the proxy. Everything is
forwarded unchanged (method, target, headers such as ``If-None-Match``, bodies, multipart
uploads) except the next ``times`` requests that match a rule of :meth:`FaultProxy.inject`,
which get the rule's :class:`Fault` instead. Every request is recorded (:meth:`FaultProxy.seen`)
with what it got, so a test can count the attempts a client made.

Bodies are buffered whole in both directions (test objects are a few MiB at most); the proxy
speaks HTTP/1.1 with keep-alive, as the SDKs' connection pools expect.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from kit.s3 import S3Server


class Fault(StrEnum):
    """What a matched request gets instead of moto's answer."""

    SLOW_DOWN = "slow-down"
    """503 ``SlowDown``: S3's throttling answer. Not forwarded."""
    INTERNAL_ERROR = "internal-error"
    """500 ``InternalError``: S3's transient server error. Not forwarded."""
    RESET = "reset"
    """The connection is reset (TCP RST) without an answer. Not forwarded."""
    RESET_AFTER_FORWARD = "reset-after-forward"
    """Forwarded (moto applies it), then the connection is reset: the answer is lost."""
    TRUNCATED_BODY = "truncated-body"
    """Forwarded; the answer's status line, headers and half its body are sent, then the
    connection is reset (a GET whose download breaks off)."""


_ERRORS = {
    Fault.SLOW_DOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    Fault.INTERNAL_ERROR: (
        500,
        "Internal Server Error",
        "InternalError",
        "We encountered an internal error. Please try again.",
    ),
}

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes: never forwarded as is.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}


@dataclass(frozen=True)
class Seen:
    """One request the proxy received and what it answered."""

    method: str
    target: str  # path and query, as sent
    fault: Fault | None  # None: forwarded to moto
    status: int | None  # the status the client got (None: a reset)
    headers: dict[str, str]  # the request's headers, names lower-cased


@dataclass
class _Rule:
    fault: Fault
    method: str | None
    target: re.Pattern[str]
    left: int


class FaultProxy:
    """The proxy of :func:`fault_proxy`; thread-safe."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname and parts.port, upstream
        self._upstream = (parts.hostname, parts.port)
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._seen: list[Seen] = []
        self._connections: set[socket.socket] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3-fault-proxy", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def inject(
        self, fault: Fault, *, times: int, method: str | None = None, target: str = ""
    ) -> None:
        """Answer the next ``times`` requests whose method is ``method`` (any if None) and
        whose target (path and query, e.g. ``/bucket/chk-1/_metadata`` or
        ``/bucket/key?partNumber=2&uploadId=...``) matches the regular expression ``target``
        (searched) with ``fault``. Rules are tried in the order they were added."""
        with self._lock:
            self._rules.append(_Rule(fault, method, re.compile(target), times))

    def clear(self) -> None:
        """Drop the rules not used up."""
        with self._lock:
            self._rules.clear()

    def seen(self, method: str | None = None, target: str = "") -> list[Seen]:
        """The requests received so far that match ``method`` and ``target`` (as in
        :meth:`inject`), in order of arrival."""
        pattern = re.compile(target)
        with self._lock:
            return [
                s
                for s in self._seen
                if (method is None or s.method == method) and pattern.search(s.target)
            ]

    def _match(self, method: str, target: str) -> Fault | None:
        with self._lock:
            for rule in self._rules:
                if rule.left > 0 and rule.method in (None, method) and rule.target.search(target):
                    rule.left -= 1
                    return rule.fault
        return None

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            if body or method in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        finally:
            conn.close()

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, end the open keep-alive connections and join the server thread."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:  # their handler threads return once their socket ends
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the S3 fault proxy did not stop"


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            with proxy._lock:
                proxy._connections.add(self.connection)

        def finish(self) -> None:
            with proxy._lock:
                proxy._connections.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the tests read what the proxy saw through FaultProxy.seen

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _reset(self) -> None:
            # SO_LINGER 0: closing sends RST, not FIN (the client sees a reset connection).
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def _error(self, fault: Fault) -> None:
            status, reason, code, message = _ERRORS[fault]
            request_id = uuid.uuid4().hex[:16].upper()
            body = (
                b""
                if self.command == "HEAD"
                else (
                    '<?xml version="1.0" encoding="UTF-8"?>\n'
                    f"<Error><Code>{code}</Code><Message>{message}</Message>"
                    f"<RequestId>{request_id}</RequestId><HostId>fault-proxy</HostId></Error>"
                ).encode()
            )
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("x-amz-request-id", request_id)
            self.end_headers()
            self.wfile.write(body)

        def _serve(self) -> None:
            method, target = self.command, self.path
            sent = {k.lower(): v for k, v in self.headers.items()}
            body = self._body()
            fault = proxy._match(method, target)
            # Recorded before the answer is sent: a client that got it finds it in seen().
            if fault in _ERRORS:
                assert fault is not None
                proxy._record(Seen(method, target, fault, _ERRORS[fault][0], sent))
                self._error(fault)
                return
            if fault is Fault.RESET:
                proxy._record(Seen(method, target, fault, None, sent))
                self._reset()
                return
            headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP]
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            status, reason, out_headers, data = proxy._forward(method, target, headers, body)
            if fault is Fault.RESET_AFTER_FORWARD:
                proxy._record(Seen(method, target, fault, None, sent))
                self._reset()
                return
            proxy._record(Seen(method, target, fault, status, sent))
            self.send_response_only(status, reason)
            length_sent = False
            for name, value in out_headers:
                lower = name.lower()
                if lower in _HOP:
                    continue
                if lower == "content-length":
                    if method == "HEAD":  # a HEAD answer states the object's length
                        length_sent = True
                        self.send_header(name, value)
                    continue
                self.send_header(name, value)
            if not length_sent:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if fault is Fault.TRUNCATED_BODY:
                self.wfile.write(data[: len(data) // 2])
                self._reset()
            elif method != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _serve

    return Handler


@contextmanager
def fault_proxy(server: S3Server) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of ``server`` for the duration of the block."""
    proxy = FaultProxy(server.endpoint_url).start()
    try:
        yield proxy
    finally:
        proxy.close()

"""The coordinator's HTTP endpoint: ``/metrics`` (Prometheus), the web dashboard and its JSON
API (docs/coordinator.md, "Dashboard").

Served by aiohttp on the coordinator's own event loop, the loop that owns the jobs' state: a
request reads the same views as the gRPC service (``coordinator/dashboard_views.py``) without
locks or copies. The dashboard itself is static files in ``dashboard_static/`` (plain HTML,
CSS and JavaScript drawing SVG, no library and no build step) that poll the JSON API.

Security, as for gRPC (``snapflow/security.py``, ``tls.py`` and ``access_control.py``; docs/security.md): with TLS settings the
endpoint serves HTTPS with the same certificate (re-read when the files change) and, with
``tls_client_ca_file``, requires a client certificate signed by that CA. With authorisation on
(``auth_tokens_file``/``auth_identities``), ``/metrics`` and ``/api/`` need a bearer token or a
verified client certificate with the ``read`` or ``operator`` role; the static files hold no
data and stay open, so a browser can load the page and then ask for a token.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from snapflow.access_control import Authenticator
from snapflow.coordinator import dashboard_views as views
from snapflow.coordinator.grpc_errors import status_for
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.metrics import CoordinatorMetrics
from snapflow.errors import ConfigError, SnapflowError
from snapflow.security import PLAINTEXT, CallerRole, SecuritySettings

log = structlog.get_logger("snapflow.coordinator")

STATIC_DIR = Path(__file__).resolve().parent / "dashboard_static"
HTTP_ROLES = frozenset({CallerRole.READ, CallerRole.OPERATOR})
"""Roles that may read ``/metrics`` and the dashboard's API: everything there is read-only."""

MAX_ERROR_CHARS = 500

# gRPC status -> HTTP status, as in Google's HTTP mapping of google.rpc.Code.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

SECURITY_HEADERS = {
    # The page loads only its own files and talks only to its own origin.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- TLS ------------------------------------------------------------------------------------


class _TlsFiles:
    """The server's SSL context; rebuilt from the files when one of them changed, checked at
    each handshake (as grpc does for the gRPC port)."""

    def __init__(self, security: SecuritySettings) -> None:
        self.security = security
        self._paths = [
            p
            for p in (security.tls_cert_file, security.tls_key_file, security.tls_client_ca_file)
            if p
        ]
        self._stamp = self._stamps()
        self.context = self._build()
        self.context.sni_callback = self._on_hello

    def _stamps(self) -> tuple[int, ...]:
        out = []
        for p in self._paths:
            try:
                out.append(os.stat(p).st_mtime_ns)
            except OSError:
                out.append(-1)
        return tuple(out)

    def _build(self) -> ssl.SSLContext:
        s = self.security
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(s.tls_cert_file, s.tls_key_file)
            if s.tls_client_ca_file:
                context.load_verify_locations(cafile=s.tls_client_ca_file)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"the HTTP endpoint cannot load tls_cert_file/tls_key_file/tls_client_ca_file: "
                f"{e.strerror or e}"[:MAX_ERROR_CHARS]
            ) from None
        return context

    def _on_hello(self, connection: ssl.SSLObject, server_name: str | None, _: Any) -> None:
        stamp = self._stamps()
        if stamp == self._stamp:
            return
        try:
            context = self._build()
        except ConfigError as e:  # half-written or removed: keep serving with the old files
            log.warning("tls.reload_failed", endpoint="http", error=str(e)[:300])
            return
        context.sni_callback = self._on_hello
        self._stamp, self.context = stamp, context
        connection.context = context
        log.info("tls.reloaded", endpoint="http", files=len(self._paths))


# --- authentication -------------------------------------------------------------------------


def _auth_context(request: web.Request) -> dict[str, list[bytes]]:
    """The verified client certificate of the connection in grpc's auth-context terms, so
    that ``Authenticator`` decides for HTTP exactly as for gRPC."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if ssl_object is None:
        return {}
    der = ssl_object.getpeercert(binary_form=True)
    cert = ssl_object.getpeercert()
    if not der or not cert:  # no certificate, or not verified (no client CA configured)
        return {}
    common_names = [
        value.encode()
        for rdn in cert.get("subject", ())
        for key, value in rdn
        if key == "commonName"
    ]
    alt_names = [value.encode() for _, value in cert.get("subjectAltName", ())]
    return {
        "transport_security_type": [b"ssl"],
        "x509_pem_cert": [der],
        "x509_common_name": common_names,
        "x509_subject_alternative_name": alt_names,
    }


def _refusal(status: int, message: str) -> web.Response:
    response = _error(status, message)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="snapflow"'
    return response


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {"error": message[:MAX_ERROR_CHARS]}, status=status, headers={"Cache-Control": "no-store"}
    )


def _auth_middleware(authenticator: Authenticator | None) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        protected = request.path == "/metrics" or request.path.startswith("/api/")
        if authenticator is not None and protected:
            header = request.headers.get("Authorization")
            metadata = [("authorization", header)] if header is not None else []
            principal = authenticator.authenticate(metadata, _auth_context(request))
            if principal is None:
                log.info("auth.unauthenticated", endpoint="http", path=request.path[:100])
                return _refusal(
                    401,
                    "no valid credentials: send 'Authorization: Bearer <token>' with a known "
                    "token or a client certificate whose name has a role",
                )
            if not principal.roles & HTTP_ROLES:
                log.info("auth.denied", endpoint="http", path=request.path[:100], via=principal.via)
                return _refusal(
                    403, "the dashboard and /metrics need one of the roles: operator, read"
                )
        response = await handler(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    return middleware


# --- handlers -------------------------------------------------------------------------------


class _Routes:
    def __init__(self, metrics: CoordinatorMetrics, manager: JobManager) -> None:
        self.metrics = metrics
        self.manager = manager

    async def metrics_text(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(self.metrics.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def jobs(self, request: web.Request) -> web.Response:
        return _json(views.jobs(self.manager))

    async def job(self, request: web.Request) -> web.Response:
        runner = views.runner(self.manager, request.match_info["job_id"])
        return _json(views.job(runner, self.manager.clock()))

    async def checkpoints(self, request: web.Request) -> web.Response:
        runner = views.runner(self.manager, request.match_info["job_id"])
        return _json(views.checkpoints(runner))

    async def checkpoint(self, request: web.Request) -> web.Response:
        runner = views.runner(self.manager, request.match_info["job_id"])
        checkpoint_id = views.parse_checkpoint_id(request.match_info["checkpoint_id"])
        return _json(views.checkpoint_details(runner, checkpoint_id))

    async def not_found(self, request: web.Request) -> web.Response:
        return _error(404, f"no such API path: {request.path[:100]}")


def _json(data: dict[str, Any]) -> web.Response:
    return web.json_response(
        data,
        dumps=lambda d: json.dumps(d, separators=(",", ":")),
        headers={"Cache-Control": "no-store"},
    )


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Snapflow errors become their HTTP status (through their gRPC status) with the message;
    anything else a logged 500."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except SnapflowError as error:
        code, message = status_for(error)
        return _error(HTTP_STATUS.get(code, 500), message)
    except Exception:
        log.exception("http.internal_error", path=request.path[:100])
        return _error(500, "internal error (see the coordinator's log)")


def make_app(
    metrics: CoordinatorMetrics, manager: JobManager, security: SecuritySettings = PLAINTEXT
) -> web.Application:
    authenticator = Authenticator(security) if security.auth_enabled else None
    app = web.Application(middlewares=[_auth_middleware(authenticator), _errors_middleware])
    routes = _Routes(metrics, manager)
    app.router.add_get("/metrics", routes.metrics_text)
    app.router.add_get("/", routes.index)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    app.router.add_get("/api/jobs", routes.jobs)
    app.router.add_get("/api/jobs/{job_id}", routes.job)
    app.router.add_get("/api/jobs/{job_id}/checkpoints", routes.checkpoints)
    app.router.add_get("/api/jobs/{job_id}/checkpoints/{checkpoint_id}", routes.checkpoint)
    app.router.add_get("/api/{tail:.*}", routes.not_found)
    return app


# --- the server -----------------------------------------------------------------------------


@dataclass
class HttpServer:
    """The running endpoint; ``await stop()`` closes it (idempotent)."""

    runner: web.AppRunner
    host: str
    port: int
    tls: bool
    _stopped: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.runner.cleanup()


async def start_http_server(
    metrics: CoordinatorMetrics,
    manager: JobManager,
    host: str,
    port: int,
    security: SecuritySettings = PLAINTEXT,
) -> HttpServer:
    """Serve ``/metrics``, the dashboard and its API at ``host:port`` on the running loop;
    port 0 picks a free port (``server.port`` is the bound one). Also registers the per-job
    metrics of ``manager``'s jobs. Raises OSError when the port cannot be bound."""
    if port < 0 or port > 65535:
        raise ValueError(f"metrics port {port} is out of range 0..65535 (-1 means disabled)")
    if metrics.job_collector is None:
        metrics.collect_jobs(lambda: views.job_samples(manager))
    tls = _TlsFiles(security).context if security.server_tls else None
    runner = web.AppRunner(make_app(metrics, manager, security), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls).start()
    except BaseException:
        await runner.cleanup()
        raise
    return HttpServer(runner, host, int(runner.addresses[0][1]), tls is not None)

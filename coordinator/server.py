"""The coordinator process: gRPC server, health, reflection, metrics, Redis, graceful stop.

``create_server(address, manager)`` follows the grpc examples: it returns ``(server, port)``
with the port actually bound (bind ``127.0.0.1:0`` in tests). ``Coordinator`` wires a whole
incarnation together: settings -> Redis (or an embedded redis-server) -> bound ports (gRPC
and ``/metrics``) -> store epoch -> recovered jobs -> serving.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from snapflow.coordinator.config import CoordinatorSettings
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.metrics import CoordinatorMetrics, MetricsServer, start_metrics_server
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.service import CoordinatorServicer
from snapflow.errors import ConfigError
from snapflow.filestore import is_object_store_uri
from snapflow.redis_server import RedisServer
from snapflow.request_parsing import add_servicer
from snapflow.security import (
    PLAINTEXT,
    SecuritySettings,
    add_port,
    read_secret_file,
    server_interceptors,
)
from snapflow.v1 import coordinator_pb2

log = structlog.get_logger("snapflow.coordinator")

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second coordinator on the same port must fail, not share it
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


async def create_server(
    address: str,
    manager: JobManager,
    max_message_bytes: int = 16 * 1024 * 1024,
    security: SecuritySettings = PLAINTEXT,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """A started-but-not-yet-serving gRPC server bound to ``address``; returns the bound port.
    ``security``: TLS and the access check (``snapflow.security``); default plaintext, open."""
    server = grpc.aio.server(
        options=server_options(max_message_bytes),
        interceptors=server_interceptors(security),
    )
    add_servicer(
        server,
        coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
        CoordinatorServicer(manager),
    )
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    try:
        port = add_port(server, address, security)
    except RuntimeError:  # grpc >= 1.60 raises instead of returning 0
        port = 0
    if port == 0:
        raise PortInUseError(address, "gRPC")
    return server, port, health


class PortInUseError(OSError):
    """A port of the coordinator could not be bound: in use, or not a local address."""

    def __init__(self, address: str, what: str) -> None:
        super().__init__(
            f"could not bind the {what} port {address}: it is in use (another coordinator?) "
            f"or the address is not local"
        )
        self.address = address


def _redis_password(settings: CoordinatorSettings) -> dict[str, str]:
    """``password=`` for redis-py from ``redis_password_file`` (never logged); TLS and the ACL
    user come with the URL (``rediss://user@host:6380/0?ssl_ca_certs=/path/ca.pem``)."""
    if not settings.redis_password_file:
        return {}
    raw = read_secret_file(settings.redis_password_file, "redis_password_file")
    try:
        password = raw.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(
            f"redis_password_file: {settings.redis_password_file} is not UTF-8 text"
        ) from None
    if not password:
        raise ConfigError(f"redis_password_file: {settings.redis_password_file} is empty")
    return {"password": password}


@dataclass
class Coordinator:
    """One coordinator incarnation. ``await start()``, then ``await stop()``."""

    settings: CoordinatorSettings
    port: int = 0
    metrics_port: int = 0
    redis_url: str = ""
    manager: JobManager | None = None
    _server: grpc.aio.Server | None = None
    _health: HealthServicer | None = None
    _metrics_server: MetricsServer | None = None
    _embedded_redis: RedisServer | None = None
    _store: CheckpointStore | None = None
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Start everything; on failure, stop what was started and re-raise."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        s = self.settings
        self.redis_url = s.redis_url
        if not self.redis_url:
            if is_object_store_uri(s.storage_root):
                data_dir = os.path.join("data", "redis")  # the AOF needs a local directory
            else:
                data_dir = os.path.join(
                    os.path.dirname(os.path.abspath(s.storage_root)) or ".", "redis"
                )
            self._embedded_redis = await asyncio.to_thread(RedisServer(data_dir=data_dir).start)
            self.redis_url = self._embedded_redis.url
            log.info(
                "redis.embedded_started",
                url=self.redis_url,
                data_dir=data_dir,
                pid=self._embedded_redis.pid,
            )
        self._store = CheckpointStore.from_url(
            self.redis_url,
            namespace=s.redis_namespace,
            socket_timeout=5.0,
            socket_connect_timeout=5.0,
            **_redis_password(s),
        )
        metrics = CoordinatorMetrics()
        self.manager = JobManager(s, self._store, metrics)
        self.manager.on_fenced_callbacks.append(self._on_fenced)
        # Ports first: a second coordinator started on a busy port must fail before it takes
        # the fencing epoch, which would fence the live one.
        self._server, self.port, self._health = await create_server(
            f"{s.host}:{s.port}", self.manager, s.max_message_bytes, s.security()
        )
        if s.metrics_port >= 0:
            try:
                self._metrics_server, self.metrics_port = start_metrics_server(
                    metrics, s.metrics_host or s.host, s.metrics_port, s.security()
                )
            except OSError:
                raise PortInUseError(f"{s.host}:{s.metrics_port}", "metrics") from None
        await self.manager.start()
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "coordinator.started",
            address=f"{s.host}:{self.port}",
            metrics_port=self.metrics_port if s.metrics_port >= 0 else None,
            epoch=self.manager.epoch,
            jobs=len(self.manager.jobs),
            storage_root=s.storage_root,
        )

    def _on_fenced(self) -> None:
        if self._health is not None:
            health = self._health
            asyncio.get_running_loop().create_task(health.enter_graceful_shutdown())

    async def stop(self) -> None:
        """Graceful: NOT_SERVING, finish in-flight calls within the grace period, then close."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
        if self.manager is not None:
            await self.manager.close()
        if self._store is not None:
            await self._store.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if self._embedded_redis is not None:
            await asyncio.to_thread(self._embedded_redis.stop)
        log.info("coordinator.stopped")

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


async def serve(settings: CoordinatorSettings) -> None:
    """Run a coordinator until SIGINT/SIGTERM (``snapflow coordinator``)."""
    coordinator = Coordinator(settings)
    await coordinator.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("coordinator.stopping", grace_s=settings.shutdown_grace_s)
    await coordinator.stop()

"""The coordinator process: gRPC server, health, reflection, metrics, Redis, graceful stop.

``create_server(address, manager)`` follows the grpc examples: it returns ``(server, port)``
with the port actually bound (bind ``127.0.0.1:0`` in tests). ``Coordinator`` wires a whole
incarnation together: settings -> Redis (or an embedded redis-server) -> bound ports (gRPC
and HTTP: ``/metrics`` and the dashboard) -> store epoch -> recovered jobs -> serving.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from snapflow.access_control import server_interceptors
from snapflow.coordinator.config import CoordinatorSettings
from snapflow.coordinator.dashboard import HttpServer, start_http_server
from snapflow.coordinator.job_manager import JobManager
from snapflow.coordinator.leader_election import LeaderElector, LeaderGate
from snapflow.coordinator.leadership import LeaseTiming
from snapflow.coordinator.metrics import CoordinatorMetrics
from snapflow.coordinator.redis_store import CheckpointStore
from snapflow.coordinator.reflection import enable_server_reflection
from snapflow.coordinator.service import CoordinatorServicer
from snapflow.errors import ConfigError, SnapflowError, StaleEpochError
from snapflow.filestore import is_object_store_uri
from snapflow.redis_server import RedisServer
from snapflow.request_parsing import add_servicer
from snapflow.security import PLAINTEXT, SecuritySettings, read_secret_file
from snapflow.tls import add_port
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
    gate: LeaderGate | None = None,
) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """A started-but-not-yet-serving gRPC server bound to ``address``; returns the bound port.
    ``security``: TLS (``snapflow.tls``) and the access check (``snapflow.access_control``), as ``snapflow.security`` settings say; default plaintext, open.
    ``gate``: a highly available coordinator's standby gate (after the access check)."""
    server = grpc.aio.server(
        options=server_options(max_message_bytes),
        interceptors=[*server_interceptors(security), *([gate] if gate is not None else [])],
    )
    add_servicer(
        server,
        coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
        CoordinatorServicer(manager),
    )
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    enable_server_reflection(  # v1 and v1alpha
        [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name], server
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
    _metrics_server: HttpServer | None = None
    """``/metrics`` and the dashboard (``coordinator/dashboard.py``)."""
    _embedded_redis: RedisServer | None = None
    _store: CheckpointStore | None = None
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)
    # High availability (high_availability = "redis"): the election, the standby gate, the
    # view of the current term's job manager, and the previous term's closing.
    _elector: LeaderElector | None = None
    _gate: LeaderGate | None = None
    _terms: _CurrentTerm | None = None
    _metrics: CoordinatorMetrics | None = None
    _closing: asyncio.Task[None] | None = None
    _idle: JobManager | None = None

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
        metrics = self._metrics = CoordinatorMetrics()
        manager = served = JobManager(s, self._store, metrics)
        if s.high_availability == "redis":
            # The gRPC service and the dashboard are built once; each leadership term has a
            # job manager of its own (its own epoch), which they reach through this view. While
            # standby they see an idle manager (no jobs, no epoch) and ``manager`` is None.
            self._idle = manager
            self._terms = _CurrentTerm(manager)
            served = cast(JobManager, self._terms)
            self._gate = LeaderGate(SERVICE_NAME)
        else:
            self.manager = manager
            manager.on_fenced_callbacks.append(self._on_fenced)
        # Ports first: a second coordinator started on a busy port must fail before it takes
        # the fencing epoch, which would fence the live one.
        self._server, self.port, self._health = await create_server(
            f"{s.host}:{s.port}", served, s.max_message_bytes, s.security(), self._gate
        )
        if s.metrics_port >= 0:
            try:
                self._metrics_server = await start_http_server(
                    metrics, served, s.metrics_host or s.host, s.metrics_port, s.security()
                )
                self.metrics_port = self._metrics_server.port
            except OSError:
                raise PortInUseError(f"{s.host}:{s.metrics_port}", "metrics") from None
        if self._gate is not None:
            await self._start_election()
            return
        await manager.start()
        await self._server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "coordinator.started",
            address=f"{s.host}:{self.port}",
            metrics_port=self.metrics_port if s.metrics_port >= 0 else None,
            epoch=manager.epoch,
            jobs=len(manager.jobs),
            storage_root=s.storage_root,
        )

    def _on_fenced(self) -> None:
        if self._health is not None:
            health = self._health
            asyncio.get_running_loop().create_task(health.enter_graceful_shutdown())

    # --- high availability (docs/coordinator.md, "High availability") --------------------------

    @property
    def advertised_address(self) -> str:
        """Where clients reach this coordinator (``advertised_address``, else host:port)."""
        s = self.settings
        if s.advertised_address:
            return s.advertised_address
        host = socket.gethostname() if s.host in ("0.0.0.0", "::", "") else s.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def is_leader(self) -> bool:
        """Serving as the leader (always, without high availability, once started)."""
        return self._gate.serving if self._gate is not None else self.manager is not None

    async def _start_election(self) -> None:
        """Serve as a standby (NOT_SERVING, coordinator RPCs refused) and run the election;
        returns once the first attempt was answered (and, if it won, the jobs recovered)."""
        s = self.settings
        assert self._server is not None and self._gate is not None and self._store is not None
        self._gate.own_address = self.advertised_address
        await self._server.start()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self._elector = LeaderElector(
            self._store,
            LeaseTiming(s.lease_ttl_s, s.lease_renew_interval_s),
            self.advertised_address,
            on_lead=self._lead,
            on_step_down=self._step_down,
        )
        election = self._elector.election
        self._gate.hint = lambda: (election.leader_address, election.leader_epoch)
        await self._elector.start()
        log.info(
            "coordinator.started",
            address=self.advertised_address,
            metrics_port=self.metrics_port if s.metrics_port >= 0 else None,
            role=election.role.value,
            epoch=election.epoch if election.is_leader else None,
            leader=election.leader_address or None,
            storage_root=s.storage_root,
        )

    async def _lead(self, epoch: int) -> None:
        """A won term: a job manager of its own on a store fenced by ``epoch``; recover the
        jobs, then open the gate and report SERVING."""
        assert self._store is not None and self._gate is not None and self._terms is not None
        assert self._elector is not None and self._metrics is not None
        await self._quiet_previous_term(epoch)
        elector = self._elector
        manager = JobManager(self.settings, self._store.with_epoch(epoch), self._metrics)
        manager.on_fenced_callbacks.append(
            lambda: elector.superseded("a newer coordinator epoch exists in Redis")
        )
        self.manager = manager
        try:
            # Bounded: a term stuck recovering would hold the lease without serving.
            async with asyncio.timeout(_recovery_timeout_s(self.settings)):
                await manager.start()
        except Exception as e:
            # A leader that holds the lease must serve: a term whose recovery failed in any way
            # gives the lease up (and retries) instead of renewing it while refusing every call.
            log.error(
                "coordinator.recovery_failed",
                epoch=epoch,
                error=f"{type(e).__name__}: {e}",
                exc_info=not isinstance(e, SnapflowError | OSError),
            )
            self._elector.resign(f"recovering the jobs failed: {type(e).__name__}: {e}")
            return
        self._terms.current = manager
        self._gate.serving = True
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("coordinator.leading", epoch=epoch, jobs=len(manager.jobs))

    async def _quiet_previous_term(self, epoch: int) -> None:
        """Let the previous term's manager finish closing, for at most one renew interval.
        Waiting longer is not needed for safety (that manager is fenced: its store has no
        epoch, and agents refuse its older epoch once they see this one) and must not keep a
        leader that holds the lease from serving (an unbounded wait here, like a term task that
        died silently, left both coordinators NOT_SERVING)."""
        closing = self._closing
        if closing is None or closing.done():
            return
        try:
            async with asyncio.timeout(self.settings.lease_renew_interval_s):
                await asyncio.shield(closing)
        except TimeoutError:
            log.warning(
                "coordinator.previous_term_still_closing",
                epoch=epoch,
                waited_s=self.settings.lease_renew_interval_s,
                stack="".join(_task_stack(closing))[-2000:],
            )
        except Exception:  # the old term's close errors are its own (it logs them)
            pass

    def _step_down(self, epoch: int, reason: str) -> None:
        """Stop acting at once: refuse calls, fence the term's manager (no write of it can
        pass any more: its store has no epoch), close it in the background."""
        assert self._gate is not None and self._terms is not None and self._idle is not None
        self._gate.serving = False
        self._terms.current = self._idle
        manager, self.manager = self.manager, None
        if manager is not None and not self._stopped.is_set():
            manager.store.epoch = None
            manager.on_fenced(
                StaleEpochError(f"stepped down as the leader of epoch {epoch}: {reason}")
            )
            self._closing = asyncio.get_running_loop().create_task(manager.close())
        elif manager is not None:
            self.manager = manager  # stopping: stop() closes it gracefully
        if self._health is not None and not self._stopped.is_set():
            asyncio.get_running_loop().create_task(
                self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            )

    async def _close_term(self) -> None:
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)
        if self.manager is not None:
            await self.manager.close()
            self.manager = None
        if self._idle is not None:
            await self._idle.close()

    async def _set_health(self, status: int) -> None:
        if self._health is not None:
            await self._health.set("", status)
            await self._health.set(SERVICE_NAME, status)

    async def stop(self) -> None:
        """Graceful: NOT_SERVING, finish in-flight calls within the grace period, then close."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_s)
        if self._elector is not None:
            # The term's jobs close while the lease is still held; then it is released, so a
            # standby takes over at its next attempt instead of after the lease TTL.
            await self._elector.stop(before_release=self._close_term)
        if self.manager is not None:
            await self.manager.close()
        if self._store is not None:
            await self._store.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        if self._embedded_redis is not None:
            await asyncio.to_thread(self._embedded_redis.stop)
        log.info("coordinator.stopped")

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


def _recovery_timeout_s(settings: CoordinatorSettings) -> float:
    """How long a won term may take to recover its jobs before it resigns (each Redis call
    is bounded by the client's 5 s socket timeout; this bounds the whole)."""
    return max(60.0, 20 * settings.lease_ttl_s)


def _task_stack(task: asyncio.Task[Any]) -> list[str]:
    """Where a task is suspended (a log line for a close that takes too long)."""
    out = io.StringIO()
    task.print_stack(limit=12, file=out)
    return [out.getvalue()]


class _CurrentTerm:
    """The current leadership term's job manager, as the gRPC service and the dashboard see
    it (they are built once; a term that ended keeps its own, fenced, manager)."""

    def __init__(self, manager: JobManager) -> None:
        self.current = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


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

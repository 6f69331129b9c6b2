"""The processes of one chaos run, each started on 127.0.0.1 and tracked by its PID.

``Cluster`` starts a ``redis-server`` (AOF with ``appendfsync always``: a Redis SIGKILL must
not lose an acknowledged checkpoint commit, or a restore would replay committed output), one
or more ``snapflow coordinator`` processes and ``snapflow worker`` processes. Every process is
killed by its own PID (SIGKILL) and reaped; nothing is ever killed by name. Ports are picked
free on 127.0.0.1; nothing binds another interface.

``Cluster(..., sentinel=True)`` runs Redis as a Sentinel setup instead: a master, a replica and
three ``redis-server --sentinel`` processes (quorum 2, a master is down after 1 s), and gives
the coordinators a ``redis+sentinel://`` URL; ``fail_over`` SIGKILLs the master, waits for
the sentinels to promote the replica and starts the dead node again as the new replica.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapflow.redis_server import find_redis_server_binary

HOST = "127.0.0.1"
SENTINEL_SERVICE = "chaos"
SENTINELS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPFLOW_")}
    env["GRPC_VERBOSITY"] = "ERROR"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _ping(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class Tracked:
    """One child process, known by its PID."""

    name: str
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    address: str = ""
    """``host:port`` the process serves on, when the run chose it (a worker agent's)."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this PID (never a name) and reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)


class Cluster:
    """Redis, coordinators and workers of one run, in ``work_dir`` (logs, storage, AOF)."""

    def __init__(self, work_dir: Path, namespace: str = "chaos", sentinel: bool = False) -> None:
        self.work_dir = work_dir
        self.namespace = namespace
        self.storage = work_dir / "checkpoints"
        self.redis_port = free_port()
        """The plain Redis's port; with ``sentinel``, the current master's."""
        self.redis: Tracked | None = None
        """The plain Redis; with ``sentinel``, the current master."""
        self.sentinel = sentinel
        self.replica_port = free_port()
        self.replica: Tracked | None = None
        self.sentinel_ports = [free_port() for _ in range(SENTINELS)] if sentinel else []
        self.coordinators: dict[int, Tracked] = {}
        """Port -> coordinator process (the ports stay fixed across restarts)."""
        self.ha = False
        self.coordinator_settings: dict[str, str] = {}
        self.processes: list[Tracked] = []
        self._sequence = 0

    @property
    def redis_url(self) -> str:
        if self.sentinel:
            hosts = ",".join(f"{HOST}:{p}" for p in self.sentinel_ports)
            return f"redis+sentinel://{hosts}/{SENTINEL_SERVICE}/0"
        return f"redis://{HOST}:{self.redis_port}/0"

    @property
    def addresses(self) -> str:
        """What clients and workers are given: every coordinator, comma-separated."""
        return ",".join(f"{HOST}:{p}" for p in sorted(self.coordinators))

    def _log(self, name: str) -> Path:
        self._sequence += 1
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        return logs / f"{self._sequence:05d}-{name}.log"

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Tracked:
        with open(self._log(name), "wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        tracked = Tracked(name, proc)
        self.processes.append(tracked)
        return tracked

    # --- Redis -----------------------------------------------------------------------------

    def start_redis(self, timeout_s: float = 10.0) -> Tracked:
        if self.sentinel:
            return self._start_sentinel_setup(timeout_s)
        data = self.work_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            find_redis_server_binary(),
            "--port", str(self.redis_port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--dir", str(data),
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self.redis = self._spawn("redis", argv, _env())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.redis.alive():
                raise RuntimeError(f"redis-server exited with {self.redis.proc.returncode}")
            if _ping(self.redis_port):
                return self.redis
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.redis_port}: no PONG in {timeout_s} s")

    # --- Redis Sentinel ------------------------------------------------------------------------

    def _start_node(
        self, name: str, port: int, replica_of: int | None, timeout_s: float
    ) -> Tracked:
        """A master or replica of the Sentinel setup, without persistence (the replica holds
        the copy); a restarted node starts as a replica and syncs from the master."""
        data = self.work_dir / f"redis-{port}"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            find_redis_server_binary(),
            "--port", str(port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(data),
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        if replica_of is not None:
            argv += ["--replicaof", HOST, str(replica_of)]
        tracked = self._spawn(name, argv, _env())
        self._wait_pong(tracked, port, timeout_s)
        return tracked

    def _wait_pong(self, tracked: Tracked, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not tracked.alive():
                raise RuntimeError(f"{tracked.name} exited with {tracked.proc.returncode}")
            if _ping(port):
                return
            time.sleep(0.02)
        raise RuntimeError(f"{tracked.name} on port {port}: no PONG in {timeout_s} s")

    def _start_sentinel_setup(self, timeout_s: float) -> Tracked:
        self.redis = self._start_node("redis-master", self.redis_port, None, timeout_s)
        self.replica = self._start_node(
            "redis-replica", self.replica_port, self.redis_port, timeout_s
        )
        for port in self.sentinel_ports:
            data = self.work_dir / f"sentinel-{port}"
            data.mkdir(parents=True, exist_ok=True)
            config = data / "sentinel.conf"  # Sentinel rewrites its config: one per sentinel
            config.write_text(
                f"port {port}\nbind {HOST}\ndaemonize no\ndir {data}\nloglevel warning\n"
                f"sentinel monitor {SENTINEL_SERVICE} {HOST} {self.redis_port} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n"
                f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n"
                f"sentinel parallel-syncs {SENTINEL_SERVICE} 1\n"
            )
            argv = [find_redis_server_binary(), str(config), "--sentinel"]
            self._wait_pong(self._spawn(f"sentinel-{port}", argv, _env()), port, timeout_s)
        deadline = time.monotonic() + 30.0
        while not self._sentinels_ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not see the master, replica and each other")
            time.sleep(0.1)
        return self.redis

    def _sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(host=HOST, port=port, socket_timeout=1.0, socket_connect_timeout=1.0)

    def _sentinels_ready(self) -> bool:
        """Every sentinel sees the master up, its replica up and the two other sentinels."""
        for port in self.sentinel_ports:
            try:
                with self._sentinel_client(port) as client:
                    state = client.sentinel_master(SENTINEL_SERVICE)
                    replicas = client.sentinel_slaves(SENTINEL_SERVICE)
            except redis.RedisError:
                return False
            if state["is_sdown"] or state["num-other-sentinels"] < SENTINELS - 1:
                return False
            if int(state["port"]) != self.redis_port:
                return False
            if not any(r["port"] == self.replica_port and not r["is_sdown"] for r in replicas):
                return False
        return True

    def sentinel_master_port(self) -> int | None:
        """The master's port as the first sentinel that answers sees it."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                with self._sentinel_client(port) as client:
                    address = client.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
                if address:
                    return int(address[1])
        return None

    def fail_over(self, timeout_s: float = 60.0) -> float:
        """SIGKILL the master by its PID, wait until the sentinels promoted the replica,
        start the dead node again as the new master's replica and wait until every sentinel
        sees that setup; returns the seconds from the kill to the promotion."""
        assert self.sentinel and self.redis is not None and self.replica is not None
        old_port, new_port = self.redis_port, self.replica_port
        killed = time.monotonic()
        self.redis.kill()
        deadline = killed + timeout_s
        while self.sentinel_master_port() != new_port:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels did not promote the replica in {timeout_s} s")
            time.sleep(0.05)
        promoted = time.monotonic() - killed
        self.redis, self.redis_port = self.replica, new_port
        self.replica_port = old_port
        self.replica = self._start_node("redis-replica", old_port, new_port, 10.0)
        while not self._sentinels_ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the new replica was not seen in {timeout_s} s")
            time.sleep(0.1)
        return promoted

    # --- coordinators ----------------------------------------------------------------------

    def configure_coordinators(self, count: int, ha: bool, **settings: str) -> None:
        self.ha = ha
        self.coordinator_settings = settings
        for _ in range(count):
            self.coordinators[free_port()] = None  # type: ignore[assignment]

    def start_coordinator(self, port: int) -> Tracked:
        extra = {f"SNAPFLOW_{k.upper()}": v for k, v in self.coordinator_settings.items()}
        if self.ha:
            extra["SNAPFLOW_HIGH_AVAILABILITY"] = "redis"
            extra["SNAPFLOW_ADVERTISED_ADDRESS"] = f"{HOST}:{port}"
        argv = [
            sys.executable, "-m", "snapflow.cli", "coordinator",
            "--host", HOST,
            "--port", str(port),
            "--redis-url", self.redis_url,
            "--redis-namespace", self.namespace,
            "--metrics-port", "-1",
            "--storage-root", str(self.storage),
            "--log-format", "json",
        ]  # fmt: skip
        tracked = self._spawn(f"coordinator-{port}", argv, _env(**extra))
        self.coordinators[port] = tracked
        return tracked

    def start_coordinators(self) -> None:
        for port in sorted(self.coordinators):
            self.start_coordinator(port)

    def serving(self, port: int) -> bool:
        """The coordinator on ``port`` answers health SERVING (the leader, or the only one)."""
        with grpc.insecure_channel(f"{HOST}:{port}") as channel:
            try:
                response = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1
                )
            except grpc.RpcError:
                return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def leader(self, timeout_s: float = 30.0) -> int:
        """The port of the serving coordinator (waits for one)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for port in sorted(self.coordinators):
                if self.serving(port):
                    return port
            time.sleep(0.05)
        raise TimeoutError(f"no coordinator serving within {timeout_s} s")

    # --- workers ---------------------------------------------------------------------------

    def start_worker(self, job_id: str, slot: int, slots: int) -> Tracked:
        """A worker agent on a port chosen here, so the run knows its address without asking
        a coordinator (which may be taking over or without Redis just then)."""
        port = free_port()
        argv = [
            sys.executable, "-m", "snapflow.cli", "worker",
            "--coordinator", self.addresses,
            "--job", job_id,
            "--slot", str(slot),
            "--slots", str(slots),
            "--port", str(port),
            "--log-level", "warning",
        ]  # fmt: skip
        tracked = self._spawn(f"worker-{job_id[:8]}-{slot}", argv, _env())
        tracked.address = f"{HOST}:{port}"
        return tracked

    # --- end -------------------------------------------------------------------------------

    def kill_all(self) -> None:
        """SIGKILL every process this run started that still runs, by PID, and reap it."""
        for tracked in self.processes:
            tracked.kill()

    def alive_count(self) -> int:
        return sum(1 for t in self.processes if t.alive())

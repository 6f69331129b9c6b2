"""Highly available `snapflow coordinator` processes for a test: several on one Redis
namespace (``high_availability = "redis"``), each on its own port, started one after another
so the first one leads; clients get every address comma-separated."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kit.polling import wait_until
from kit.processes import CoordinatorProcess

#: Short lease and heartbeats, so a takeover takes seconds (a test's scale, not production's).
HA_SETTINGS = {
    "high_availability": "redis",
    "lease_ttl_s": "2",
    "lease_renew_interval_s": "0.5",
    "heartbeat_interval_s": "0.2",
    "heartbeat_timeout_s": "1.5",
}


def health(address: str) -> int | None:
    """The gRPC health status at ``address`` (None while it does not answer)."""
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return None
    return int(response.status)


def is_leader(address: str) -> bool:
    return health(address) == health_pb2.HealthCheckResponse.SERVING


def start_ha_coordinators(
    redis_url: str,
    namespace: str,
    storage_root: Path,
    log_dir: Path,
    count: int = 2,
    **settings: str,
) -> list[CoordinatorProcess]:
    """Start ``count`` coordinators; the first leads (waited for), the others answer health
    (NOT_SERVING: standbys). The caller kills them (``Processes`` or ``kill()``)."""
    procs: list[CoordinatorProcess] = []
    try:
        for i in range(count):
            merged: dict[str, str] = {**HA_SETTINGS, **settings}
            proc = CoordinatorProcess.start(
                redis_url, namespace, storage_root, log_dir / f"coordinator-{i}.log", 0, **merged
            )
            procs.append(proc)

            def up(address: str = proc.address, leading: bool = i == 0) -> bool:
                status = health(address)
                if leading:
                    return status == health_pb2.HealthCheckResponse.SERVING
                return status is not None

            wait_until(
                up,
                f"coordinator {i} {'leading' if i == 0 else 'answering as a standby'}",
                timeout_s=30,
                interval_s=0.05,
                procs=[proc.proc],
            )
        return procs
    except BaseException:
        for proc in procs:
            proc.kill()
        raise


def addresses(procs: list[CoordinatorProcess]) -> str:
    """Every coordinator's address, comma-separated (what clients are given)."""
    return ",".join(p.address for p in procs)


def wait_for_leader(
    procs: list[CoordinatorProcess], timeout_s: float = 30.0
) -> tuple[CoordinatorProcess, float]:
    """The coordinator that serves (leads), and when it was first seen serving (monotonic)."""
    live = [p for p in procs if p.proc.poll() is None]
    leader = wait_until(
        lambda: next((p for p in live if is_leader(p.address)), None),
        "a leader serving",
        timeout_s=timeout_s,
        interval_s=0.02,
    )
    assert leader is not None
    return leader, time.monotonic()

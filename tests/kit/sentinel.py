"""A Redis Sentinel setup on 127.0.0.1 for a test: a master, a replica and three sentinels
(quorum 2, a master is down after 1 s), all real ``redis-server`` processes on free ports,
each stopped by its PID at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from kit.polling import wait_until
from snapflow.redis_server import RedisServer, SentinelServer

SERVICE = "mymaster"


@dataclass
class SentinelSetup:
    master: RedisServer
    replica: RedisServer
    sentinels: list[SentinelServer]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL of the service (db 0)."""
        hosts = ",".join(s.address for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def master_port(self) -> int | None:
        """The master's port as the first sentinel that answers sees it."""
        for sentinel in self.sentinels:
            if not sentinel.running:
                continue
            with contextlib.suppress(redis.RedisError):
                with redis.Redis(host="127.0.0.1", port=sentinel.port) as client:
                    address = client.sentinel_get_master_addr_by_name(SERVICE)
                if address:
                    return int(address[1])
        return None


def _ready(setup: SentinelSetup) -> bool:
    """Every sentinel sees the master up, its replica, and the two other sentinels."""
    for sentinel in setup.sentinels:
        with redis.Redis(host="127.0.0.1", port=sentinel.port) as client:
            state = client.sentinel_master(SERVICE)
            replicas = client.sentinel_slaves(SERVICE)
        if state["is_sdown"] or state["num-other-sentinels"] < 2:
            return False
        if not any(r["port"] == setup.replica.port and not r["is_sdown"] for r in replicas):
            return False
    return True


@contextlib.contextmanager
def sentinel_setup() -> Iterator[SentinelSetup]:
    servers: list[RedisServer] = []
    try:
        master = RedisServer().start()
        servers.append(master)
        replica = RedisServer(replica_of=master.port).start()
        servers.append(replica)
        sentinels = []
        for _ in range(3):
            sentinel = SentinelServer(master.port, SERVICE).start()
            assert isinstance(sentinel, SentinelServer)
            servers.append(sentinel)
            sentinels.append(sentinel)
        setup = SentinelSetup(master, replica, sentinels)
        wait_until(lambda: _ready(setup), "the sentinels ready", timeout_s=30, interval_s=0.1)
        yield setup
    finally:
        for server in reversed(servers):
            server.stop()

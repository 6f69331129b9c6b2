"""Redis Sentinel through snapflow/redis_client.py: ``redis+sentinel://`` URLs, and a real
master failover (a master, a replica and three sentinels, all ``redis-server`` processes):
the asyncio and the synchronous clients re-discover the new master by themselves."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
from kit.sentinel import SERVICE, sentinel_setup

from snapflow.errors import ConfigError
from snapflow.redis_client import (
    SentinelUrl,
    async_redis,
    describe_client,
    parse_redis_url,
    sync_redis,
)


def test_sentinel_urls_are_parsed_and_checked() -> None:
    assert parse_redis_url("redis://127.0.0.1:6379/0") is None
    assert parse_redis_url("redis+sentinel://u:p%40ss@a:26379,b:26380/svc/3") == SentinelUrl(
        (("a", 26379), ("b", 26380)), "svc", 3, "u", "p@ss"
    )
    parsed = parse_redis_url("REDIS+SENTINEL://[::1]:26379/svc")
    assert parsed == SentinelUrl((("::1", 26379),), "svc")
    assert ":p@ss" not in parsed.describe()
    for bad, message in [
        ("redis+sentinel://a:1/", "service name"),
        ("redis+sentinel://a:1/svc/x", "not a database number"),
        ("redis+sentinel://a/svc", "not a sentinel host:port"),
        ("redis+sentinel://a:99999/svc", "not a sentinel host:port"),
        ("redis+sentinel://a:\u00b2/svc", "not a sentinel host:port"),
        ("redis+sentinel://a:1/svc/\u00b2", "not a database number"),
        ("redis+sentinel://a:1/svc/" + "9" * 5000, "not a database number"),
        ("redis+sentinel://a:1/svc?ssl=true", "no query"),
        ("redis+sentinel://u:secret@a:1/", "service name"),
    ]:
        with pytest.raises(ConfigError, match=message) as error:
            parse_redis_url(bad)
        assert "secret" not in str(error.value)


def test_clients_rediscover_the_new_master_after_a_failover() -> None:
    with sentinel_setup() as setup:

        async def main() -> None:
            client = async_redis(setup.url, socket_timeout=1.0, socket_connect_timeout=1.0)
            try:
                assert describe_client(client) == (
                    f"redis+sentinel://{','.join(s.address for s in setup.sentinels)}/{SERVICE}/0"
                )
                await client.set("k", "before")
                info = await client.info("server")
                assert info["tcp_port"] == setup.master.port
                await asyncio.to_thread(_wait_replicated, setup.replica.port, "k", b"before")
                setup.master.kill()  # SIGKILL by PID
                started = time.monotonic()
                attempts = 0
                while True:  # the client's own retries, bounded: every error is a failover one
                    attempts += 1
                    try:
                        await client.set("k", "after")
                        break
                    except redis.ConnectionError:
                        assert time.monotonic() - started < 30, "no new master within 30 s"
                        await asyncio.sleep(0.2)
                # the same client object now talks to the promoted replica
                info = await client.info("server")
                assert info["tcp_port"] == setup.replica.port
                assert await client.get("k") == b"after"
                assert setup.master_port() == setup.replica.port
                assert attempts >= 1
            finally:
                await client.aclose()
            # a new synchronous client (the Redis sink's) finds the new master at once
            sync = sync_redis(setup.url, socket_timeout=1.0)
            try:
                assert sync.get("k") == b"after"
                assert sync.info("server")["tcp_port"] == setup.replica.port
            finally:
                sync.close()

        asyncio.run(main())


def _wait_replicated(port: int, key: str, value: bytes) -> None:
    deadline = time.monotonic() + 10
    with redis.Redis(host="127.0.0.1", port=port) as replica:
        while replica.get(key) != value:
            assert time.monotonic() < deadline, "the replica did not receive the write"
            time.sleep(0.02)

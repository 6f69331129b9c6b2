"""Redis clients from a URL, with Redis Sentinel: the one Redis connection factory.

Plain URLs (``redis://``, ``rediss://``, ``unix://``) go to redis-py's ``from_url``. A
Sentinel URL names the sentinels and the monitored service::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]

The client then asks the sentinels for the service's master (redis-py's
``Sentinel.master_for``: a ``SentinelConnectionPool`` whose every new connection asks the
sentinels where the master is; a connection to a master that was demoted answers
``READONLY``, which redis-py turns into a reconnect). The user and password are the master's
(and replicas'); the sentinels are reached without a password. redis-py's Sentinel support is
used rather than our own discovery because it is the client the Redis project maintains and
it handles the demoted-master case.

Replication in Redis is asynchronous: a write the old master acknowledged but had not yet sent
to the replica is lost in a failover (docs/coordinator.md, "Redis Sentinel").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel

from snapflow.errors import ConfigError

SENTINEL_SCHEME = "redis+sentinel"
MAX_SENTINELS = 32
_SERVICE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_SOCKET_OPTIONS = ("socket_timeout", "socket_connect_timeout", "socket_keepalive")

__all__ = ["SentinelUrl", "async_redis", "describe_client", "parse_redis_url", "sync_redis"]


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def describe(self) -> str:
        """The URL without credentials (for messages)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"{SENTINEL_SCHEME}://{hosts}/{self.service_name}/{self.db}"


def parse_redis_url(url: str) -> SentinelUrl | None:
    """The parsed Sentinel URL, None for any other scheme; ConfigError (naming the problem,
    never the password) for a malformed Sentinel URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != SENTINEL_SCHEME:
        return None
    usage = f"{SENTINEL_SCHEME}://[[user]:password@]host:port[,host:port...]/service_name[/db]"
    if "?" in rest or "#" in rest:
        raise ConfigError(f"a Sentinel URL takes no query or fragment; expected {usage}")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        host = host.strip("[]")
        # isascii: str.isdigit accepts digits int() refuses (superscripts); <= 5: int() of a
        # huge digit string raises ValueError, not ConfigError.
        valid_port = port.isascii() and port.isdigit() and len(port) <= 5
        if not colon or not host or not valid_port or not 0 < int(port) <= 65535:
            raise ConfigError(
                f"{item.strip()!r:.100} is not a sentinel host:port; expected {usage}"
            )
        sentinels.append((host, int(port)))
    if len(sentinels) > MAX_SENTINELS:
        raise ConfigError(f"{len(sentinels)} sentinels; at most {MAX_SENTINELS}")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2 or not _SERVICE_RE.match(parts[0]):
        raise ConfigError(f"the Sentinel URL needs a service name; expected {usage}")
    db = 0
    if len(parts) == 2:
        db_text = parts[1]
        if (
            not (db_text.isascii() and db_text.isdigit() and len(db_text) <= 7)
            or int(db_text) > 1_000_000
        ):
            raise ConfigError(f"{parts[1]!r:.50} is not a database number; expected {usage}")
        db = int(parts[1])
    return SentinelUrl(tuple(sentinels), parts[0], db, username, password)


def _split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k in _SOCKET_OPTIONS}


def _master_options(parsed: SentinelUrl, kwargs: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {"db": parsed.db}
    if parsed.username is not None:
        options["username"] = parsed.username
    if parsed.password is not None:
        options["password"] = parsed.password
    options.update(kwargs)  # an explicit password (a password file) wins over the URL's
    return options


class _AsyncSentinelMaster(aioredis.Redis):
    """The master's client; closing it also closes its sentinel clients."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if manager is not None:
            await manager.aclose()


class _SyncSentinelMaster(redis.Redis):
    """The master's client; closing it also closes its sentinel clients."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


def async_redis(url: str, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client for ``url`` (``kwargs``: redis-py connection options such as
    ``socket_timeout`` or ``password``)."""
    parsed = parse_redis_url(url)
    if parsed is None:
        return aioredis.Redis.from_url(url, **kwargs)
    sentinel = aiosentinel.Sentinel(list(parsed.sentinels), sentinel_kwargs=_split_options(kwargs))
    client: aioredis.Redis = sentinel.master_for(
        parsed.service_name, redis_class=_AsyncSentinelMaster, **_master_options(parsed, kwargs)
    )
    return client


def sync_redis(url: str, **kwargs: Any) -> redis.Redis:
    """A synchronous client for ``url`` (see :func:`async_redis`)."""
    parsed = parse_redis_url(url)
    if parsed is None:
        return redis.Redis.from_url(url, **kwargs)
    sentinel = redis.sentinel.Sentinel(
        list(parsed.sentinels), sentinel_kwargs=_split_options(kwargs)
    )
    client: redis.Redis = sentinel.master_for(
        parsed.service_name, redis_class=_SyncSentinelMaster, **_master_options(parsed, kwargs)
    )
    return client


def describe_client(client: aioredis.Redis | redis.Redis) -> str:
    """Where ``client`` points, for messages (never credentials)."""
    pool = client.connection_pool
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        hosts = ",".join(
            f"{s.connection_pool.connection_kwargs.get('host')}:"
            f"{s.connection_pool.connection_kwargs.get('port')}"
            for s in manager.sentinels
        )
        db = pool.connection_kwargs.get("db", 0)
        return f"{SENTINEL_SCHEME}://{hosts}/{getattr(pool, 'service_name', '?')}/{db}"
    kwargs = pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"

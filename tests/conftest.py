"""Shared pytest fixtures for Snapflow's tests.

There is no pytest-asyncio: an async test body runs via ``asyncio.run(...)`` inside a plain
(sync) test function.

Sections (add new fixtures to the matching section, or start a new one):

1. Redis: a real ``redis-server`` process for the whole session (``snapflow/redis_server.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from snapflow.redis_server import RedisServer

# ---------------------------------------------------------------------------------------------
# 1. Redis
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A started ``redis-server`` (no persistence) shared by the session; stopped at the end."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session's Redis, emptied (FLUSHALL) before the test. The server is ours, so
    flushing it is safe."""
    redis_server.flushall()
    return redis_server.url

"""Fixtures of the coordinator tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kit.coordinator_env import Env, open_env

from snapflow.redis_server import RedisServer


@pytest.fixture(scope="module")
def env(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One coordinator shared by the test module (see tests/kit/coordinator_env.py)."""
    yield from open_env(redis_server, tmp_path_factory)

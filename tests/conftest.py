"""Shared pytest fixtures for Snapflow's tests.

There is no pytest-asyncio: an async test body runs via ``asyncio.run(...)`` inside a plain
(sync) test function.

Sections (add new fixtures to the matching section, or start a new one):

1. Redis: a real ``redis-server`` process for the whole session (``snapflow/redis_server.py``).
2. Spark: a local ``SparkSession`` for the whole session (tests marked ``spark``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

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


# ---------------------------------------------------------------------------------------------
# 2. Spark
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local ``SparkSession`` (``local[4]``) shared by the session; stopped at the end.

    Python workers run this interpreter (``PYSPARK_PYTHON``); the driver binds 127.0.0.1 (no UI,
    no console progress bars); a failed barrier stage is not retried by Spark
    (``spark.stage.maxConsecutiveAttempts=1``), so the Spark bridge's driver loop owns retries.
    Tests using it are marked ``@pytest.mark.spark``. No warning filter is needed: with pyspark
    4.3.0 nothing warns at start, during the tests or at stop (checked with ``filterwarnings =
    error`` and under ``python -X dev``); add targeted ones here if a Spark upgrade starts to.
    """
    for var in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ[var] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[4]")
        .appName("snapflow-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.stage.maxConsecutiveAttempts", "1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()

"""Shared pytest fixtures for Snapflow's tests.

There is no pytest-asyncio: an async test body runs via ``asyncio.run(...)`` inside a plain
(sync) test function.

Sections (add new fixtures to the matching section, or start a new one):

1. Redis: a real ``redis-server`` process for the whole session (``snapflow/redis_server.py``).
2. Spark: a local ``SparkSession`` for the whole session (tests marked ``spark``).
3. S3: moto's S3 server on 127.0.0.1 for the whole session, reached through the ``AWS_*``
   variables (set for this process and the processes it starts); a fresh bucket per test.
4. Kafka: a Tansu broker (Kafka protocol, in memory) on 127.0.0.1 for the whole session; a
   fresh topic name per test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kit.kafka_broker import KafkaBroker, kafka_broker
from kit.s3 import S3Server, create_bucket, s3_server

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
def spark(s3: S3Server) -> Iterator[Any]:
    """A local ``SparkSession`` (``local[4]``) shared by the session; stopped at the end.

    It depends on ``s3`` so that the JVM, hence the Python workers it starts, inherits the
    ``AWS_*`` variables: jobs can read and write ``s3://`` on the session's S3 server.

    Built by :func:`snapflow.spark_bridge.session.local_session`: Python workers run this
    interpreter (``PYSPARK_PYTHON``); the driver binds 127.0.0.1 (no UI,
    no console progress bars); ``spark.stage.maxConsecutiveAttempts=1`` (Spark never retries a
    failed barrier ResultStage whatever it is), so the Spark bridge's driver loop owns retries.
    Tests using it are marked ``@pytest.mark.spark``. No warning filter is needed: with pyspark
    4.3.0 nothing warns at start, during the tests or at stop (checked with ``filterwarnings =
    error`` and under ``python -X dev``); add targeted ones here if a Spark upgrade starts to.
    """
    from snapflow.spark_bridge.session import local_session

    session = local_session("local[4]", "snapflow-tests")
    try:
        yield session
    finally:
        session.stop()


# ---------------------------------------------------------------------------------------------
# 3. S3
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """moto's S3 server for the session; ``AWS_*`` point at it while the session runs."""
    with s3_server() as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def s3_bucket(s3: S3Server) -> str:
    """A new, empty bucket on the session's S3 server; its name."""
    name = f"snapflow-{uuid.uuid4().hex[:12]}"
    create_bucket(s3, name)
    return name


# ---------------------------------------------------------------------------------------------
# 4. Kafka
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaBroker]:
    """The session's Kafka-protocol broker (Tansu, in memory, on 127.0.0.1)."""
    with kafka_broker() as broker:
        yield broker


@pytest.fixture
def kafka_topic_name() -> str:
    """A topic name no other test uses (create it with ``kafka.create_topic``)."""
    return f"snapflow-{uuid.uuid4().hex[:12]}"

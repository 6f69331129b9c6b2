"""Bad input to a Kafka job, at the pipeline level on local Spark: brokers down at the start, a
topic that does not exist, undecodable records under both policies, and an exactly-once sink
whose transaction timeout the checkpointing cannot fit (refused before anything is submitted).

Each attempt to reach the brokers is bounded (``connect_attempts`` x ``request_timeout_s``); how
many times the job is restarted is the restart strategy's (the default one never gives up, as a
checkpointed Flink job's default does not: these tests bound it)."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from kit.kafka_broker import KafkaBroker
from kit.processes import free_port
from pyspark import cloudpickle

from snapflow import KafkaSource, KafkaStop, KafkaValueFormat, Pipeline
from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge import FixedDelay, JobFailedError, JobStatus
from snapflow.worker.connectors.kafka_sink import KafkaSink
from snapflow.worker.connectors.parquet_sink import TransactionalParquetSink, read_committed_parquet

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

SCHEMA = pa.schema([("key", pa.int64())])


def _job(source: KafkaSource, out: Path, attempts: int = 1) -> Pipeline:
    p = Pipeline("kafka-bad-input", parallelism=1)
    p.source(source, name="kafka").key_by("key").count().sink(TransactionalParquetSink(str(out)))
    p.checkpointing(interval_ms=200, storage=out.parent / "cp")
    p.restart_strategy(FixedDelay(attempts=attempts, delay_s=0.1))
    return p


def test_brokers_down_at_the_start_fail_the_job_naming_them(spark: Any, tmp_path: Path) -> None:
    servers = f"127.0.0.1:{free_port()}"
    source = KafkaSource(servers, topics=["t"], connect_attempts=2, request_timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(JobFailedError) as failed:
        _job(source, tmp_path / "out").run(spark, timeout_s=120)
    message = str(failed.value)
    # the restart strategy's one restart, then the job fails
    assert "allows no more restarts after 1" in message, message
    assert f"Kafka brokers {servers} did not answer (listing topics) in 2 attempts" in message
    assert time.monotonic() - started < 90


def test_a_topic_that_does_not_exist_fails_the_job_naming_it(
    spark: Any, kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    source = KafkaSource(kafka.bootstrap_servers, topics=[kafka_topic_name])
    with pytest.raises(JobFailedError, match=f"topic '{kafka_topic_name}' does not exist"):
        _job(source, tmp_path / "out", attempts=0).run(spark, timeout_s=120)


@pytest.fixture
def mixed_topic(kafka: KafkaBroker, kafka_topic_name: str) -> str:
    """20 records, JSON ``{"key": i % 4}`` but for offsets 7 and 13, which are not JSON."""
    kafka.create_topic(kafka_topic_name)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "batch.num.messages": 1})
    for i in range(20):
        producer.produce(
            kafka_topic_name, b"\xff not json" if i in (7, 13) else b'{"key": %d}' % (i % 4)
        )
    assert producer.flush(30) == 0
    return kafka_topic_name


def _decoding(kafka: KafkaBroker, topic: str, policy: Any) -> KafkaSource:
    return KafkaSource(
        kafka.bootstrap_servers,
        topics=[topic],
        stop=KafkaStop.latest(),
        value_format=KafkaValueFormat.json(SCHEMA),
        metadata=(),
        on_undecodable=policy,
    )


def test_undecodable_records_fail_the_job_with_their_offset(
    spark: Any, kafka: KafkaBroker, mixed_topic: str, tmp_path: Path
) -> None:
    source = _decoding(kafka, mixed_topic, "fail")
    with pytest.raises(JobFailedError) as failed:
        _job(source, tmp_path / "out", attempts=0).run(spark, timeout_s=120)
    assert mixed_topic in str(failed.value) and "offset 7" in str(failed.value), failed.value


def test_undecodable_records_are_skipped_and_the_rest_counted_once(
    spark: Any, kafka: KafkaBroker, mixed_topic: str, tmp_path: Path
) -> None:
    source = _decoding(kafka, mixed_topic, "skip")
    result = _job(source, tmp_path / "out").run(spark, timeout_s=120)
    assert result.state is JobStatus.FINISHED, result.failure
    table = read_committed_parquet(tmp_path / "out")
    finals = dict(
        zip(table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True)
    )
    assert finals == Counter(i % 4 for i in range(20) if i not in (7, 13))


def test_a_transaction_timeout_the_checkpoints_cannot_fit_is_refused_before_submission(
    spark: Any, tmp_path: Path
) -> None:
    p = Pipeline("kafka-timeout", parallelism=1)
    p.source(_never_read_source(), name="kafka").sink(
        KafkaSink(
            "127.0.0.1:9092",
            "out",
            guarantee="exactly_once",
            transactional_id_prefix="kafka-timeout",
            transaction_timeout_ms=60_000,
        )
    )
    p.checkpointing(interval_ms=5_000, timeout_ms=120_000, storage=tmp_path / "cp")
    with pytest.raises(InvalidArgumentError, match="set transaction_timeout_ms=125000 or more"):
        p.run(spark, timeout_s=60)
    assert not (tmp_path / "cp").exists()  # nothing was submitted


def _never_read_source() -> KafkaSource:
    return KafkaSource("127.0.0.1:9092", topics=["in"])

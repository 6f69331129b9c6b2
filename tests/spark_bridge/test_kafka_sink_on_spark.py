"""End to end on local Spark: GeneratorSource -> key_by -> count -> KafkaSink exactly once,
bounded; the topic read back with a ``read_committed`` consumer and checked record by record.

With a failure injected, the records of the transactions the failure aborted are visible to
``read_committed`` readers of Tansu (it does not hide aborted records; a real broker does), so
that run checks no loss (every key's largest and last count) and the markers, while no duplicates among the
committed records is left to the operator tests and the transaction model
(tests/worker/connectors/test_kafka_sink*.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from kit.kafka_broker import KafkaBroker
from kit.workers import check_exactly_once, expected_counts
from pyspark import cloudpickle

from snapflow.spark_bridge import FixedDelay, JobStatus, Pipeline
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.connectors.kafka_sink import KafkaSink
from snapflow.worker.connectors.kafka_sink_encoding import KafkaSerializer
from snapflow.worker.connectors.kafka_sink_settings import KafkaPartitioner
from snapflow.worker.connectors.kafka_sink_transactions import marker_group
from snapflow.worker.connectors.split_sources import GeneratorSource

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 40_000
KEYS = 50
RUN_TIMEOUT_S = 180.0


def _source() -> GeneratorSource:
    return GeneratorSource(
        total_records=RECORDS, rate_per_s=20_000, num_keys=KEYS, batch_size=1024, seed=5
    )


def _pipeline(kafka: KafkaBroker, topic: str, storage: Path, crash: FailAt | None) -> Pipeline:
    p = Pipeline("kafka-count", parallelism=2)
    events = p.source(_source(), name="events")
    if crash is not None:
        events = events.transform(crash, name="crash-once")
    events.key_by("key").count().sink(
        KafkaSink(
            kafka.bootstrap_servers,
            topic,
            key="key",
            value=KafkaSerializer.json(["key", "count"]),
            guarantee="exactly_once",
            transactional_id_prefix=topic,
            partitioner=KafkaPartitioner.fixed(),  # one partition a subtask (kit/kafka_broker.py)
        ),
        name="kafka",
    )
    p.checkpointing(interval_ms=300, storage=storage)
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    return p


def _read_committed(kafka: KafkaBroker, topic: str) -> pa.Table:
    """Every record a ``read_committed`` reader gets, per partition in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "check",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    rows: list[tuple[int, int, dict[str, int]]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        last = time.monotonic()
        while time.monotonic() - last < 3.0:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            rows.append((msg.partition() or 0, msg.offset() or 0, json.loads(msg.value() or b"")))
            assert msg.key() == str(rows[-1][2]["key"]).encode()
            last = time.monotonic()
    finally:
        consumer.close()
    rows.sort(key=lambda r: (r[0], r[1]))
    return pa.table({"key": [r[2]["key"] for r in rows], "count": [r[2]["count"] for r in rows]})


def _markers(kafka: KafkaBroker, topic: str, operator_id: str) -> list[int]:
    out = []
    for subtask in range(2):
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": marker_group(topic, operator_id, subtask),
            }
        )
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        consumer.close()
        out.append(int(tp.offset))
    return out


def _sink_operator_id(p: Pipeline) -> str:
    return next(o.operator_id for v in p.graph.vertices for o in v.operators if o.name == "kafka")


@pytest.mark.spark
def test_keyed_count_to_kafka_exactly_once(
    spark: Any, kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    p = _pipeline(kafka, kafka_topic_name, tmp_path / "cp", crash=None)
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED
    assert result.checkpoints_completed >= 2
    check_exactly_once(_read_committed(kafka, kafka_topic_name), expected_counts(_source(), 2))
    assert min(_markers(kafka, kafka_topic_name, _sink_operator_id(p))) >= 2


@pytest.mark.spark
def test_keyed_count_to_kafka_with_a_failure(
    spark: Any, kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    crash = FailAt(how="raise", after_records=8_000, after_checkpoints=1)
    p = _pipeline(kafka, kafka_topic_name, tmp_path / "cp", crash=crash)
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED
    assert result.restarts == 1
    table = _read_committed(kafka, kafka_topic_name)
    expected = expected_counts(_source(), 2)
    # No loss: each key's largest committed count is its true total (records of aborted
    # transactions are visible here too, so the strictly increasing chain of committed counts
    # is checked by the uninterrupted test above only).
    seen: dict[int, set[int]] = {}
    for key, count in zip(
        table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True
    ):
        seen.setdefault(key, set()).add(count)
    assert {k: max(v) for k, v in seen.items()} == dict(expected)
    # The last committed records carry the true totals, in commit order per partition.
    finals: Counter[int] = Counter()
    for key, count in zip(
        table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True
    ):
        finals[key] = count
    assert dict(finals) == dict(expected)
    assert min(_markers(kafka, kafka_topic_name, _sink_operator_id(p))) >= 2

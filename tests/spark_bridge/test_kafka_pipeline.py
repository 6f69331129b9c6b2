"""A Kafka topic into a keyed count into the transactional Parquet sink, on local Spark, bounded
(the job finishes and takes its final checkpoint): uninterrupted and with a task failure after a
checkpoint, exactly once both times, checked record by record (every key's committed running
counts strictly rise, so no record was counted twice, and end at its true count, so none was
lost)."""

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
from kit.workers import check_exactly_once
from pyspark import cloudpickle

from snapflow import KafkaSource, KafkaStop, KafkaValueFormat, Pipeline
from snapflow.spark_bridge import FixedDelay, JobStatus
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.connectors.parquet_sink import TransactionalParquetSink, read_committed_parquet
from snapflow.worker.runtime.operator import Operator

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 4_000
KEYS = 37
PARTITIONS = 3
SCHEMA = pa.schema([("key", pa.int64()), ("seq", pa.int64())])


class Slow(Operator):
    """Passes batches on after a pause, so that checkpoints complete while the topic is read."""

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        time.sleep(0.01)
        return [batch] if batch.num_rows else []


@pytest.fixture(scope="module")
def topic(kafka: KafkaBroker) -> str:
    name = f"kafka-e2e-{time.monotonic_ns()}"
    kafka.create_topic(name, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "batch.num.messages": 1})
    for i in range(RECORDS):
        value = f'{{"key": {i % KEYS}, "seq": {i}}}'.encode()
        producer.produce(name, value=value, partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    return name


def _pipeline(kafka: KafkaBroker, topic: str, out: Path, crash: FailAt | None) -> Pipeline:
    p = Pipeline("kafka-count", parallelism=2, max_parallelism=128)
    records = p.source(
        KafkaSource(
            kafka.bootstrap_servers,
            topics=[topic],
            stop=KafkaStop.latest(),
            value_format=KafkaValueFormat.json(SCHEMA),
            metadata=("partition", "offset"),
            batch_size=40,
        ),
        name="kafka",
    ).transform(Slow(), name="slow")
    if crash is not None:
        records = records.transform(crash, name="crash-once")
    records.key_by("key").count().sink(TransactionalParquetSink(str(out)))
    p.checkpointing(interval_ms=100, storage=str(out.parent / "cp"))
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    return p


def _expected() -> Counter[int]:
    return Counter(i % KEYS for i in range(RECORDS))


@pytest.mark.spark
@pytest.mark.parametrize("crash", [False, True])
def test_kafka_to_keyed_count_to_parquet_exactly_once(
    spark: Any, kafka: KafkaBroker, topic: str, tmp_path: Path, crash: bool
) -> None:
    fault = FailAt(how="raise", after_records=800, after_checkpoints=1) if crash else None
    result = _pipeline(kafka, topic, tmp_path / "out", fault).run(spark, timeout_s=120)
    assert result.state is JobStatus.FINISHED
    assert result.restarts == (1 if crash else 0)
    committed = read_committed_parquet(tmp_path / "out")
    check_exactly_once(committed, _expected())

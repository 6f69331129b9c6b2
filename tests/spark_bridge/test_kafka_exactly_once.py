"""Kafka in, keyed event-time window, Kafka out, exactly once under kills, on local Spark.

The job: a topic the test produces (3 partitions, JSON ``{key, v, ts}`` with the Kafka
timestamp set to ``ts``) -> ``KafkaSource`` (bounded at the offsets seen at start) ->
rebalance -> a slow pass-through (so data queues at the window's inputs and unaligned
checkpoints have something to overtake) [-> ``FailAt``] -> key_by(key) -> 1 s tumbling
event-time windows summing ``v`` (event time from the Kafka timestamp or from the ``ts``
field, alternating) -> ``KafkaSink(guarantee="exactly_once")``, or
``TransactionalParquetSink``.

Checked record by record against the windows computed in plain Python: each
``(key, window_start, sum)`` exactly once. The Kafka output is read with
``kit.kafka_log.committed_records``, which resolves every transaction by its marker in the
log as a broker's ``read_committed`` does (Tansu does not hide aborted records itself), so a
duplicate the sink committed would show, and an aborted copy would not.

* every checkpoint mode (aligned, unaligned, aligned with a 1 ms alignment timeout, at least
  once: no window lost, sums at least the true ones) with a task killed after a checkpoint;
* a run into ``TransactionalParquetSink`` with a kill;
* stop with a savepoint at parallelism 2, resume at 3;
* a crash between a checkpoint's completion and the sink's commit (the process dies in the
  sink's completion notice, before committing): the restore re-produces exactly the
  transactions whose marker is missing;
* partitions added mid-job: a topic pattern, and a second matching topic created while the
  (unbounded) job runs (Tansu cannot add partitions to a topic); keyed count, exactly once.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kit.checkpoint_modes import MODES, unaligned_checkpoints
from kit.kafka_broker import KafkaBroker
from kit.kafka_log import committed_records
from kit.polling import wait_until
from kit.workers import check_exactly_once
from pyspark import cloudpickle

from snapflow import KafkaSource, KafkaStop, KafkaValueFormat, Pipeline, TumblingEventTimeWindows
from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.spark_bridge import FixedDelay, JobStatus
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.connectors.kafka_sink import KafkaSink
from snapflow.worker.connectors.kafka_sink_encoding import KafkaSerializer
from snapflow.worker.connectors.kafka_sink_settings import KafkaPartitioner
from snapflow.worker.connectors.kafka_sink_transactions import marker_group
from snapflow.worker.connectors.parquet_sink import TransactionalParquetSink, read_committed_parquet
from snapflow.worker.runtime.operator import Operator

# The executors cannot import this test module: ship its classes and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

RUN_TIMEOUT_S = 150.0
RECORDS = 3_000
KEYS = 20
PARTITIONS = 3
OUT_PARTITIONS = 3  # one per sink subtask (KafkaPartitioner.fixed(), see tests/kit/kafka_broker.py)
BASE_MS = 1_700_000_000_000
STEP_MS = 5  # event time of record i: BASE_MS + i * STEP_MS; 15 s, 15 windows
WINDOW_MS = 1_000
SCHEMA = pa.schema([("key", pa.int64()), ("v", pa.int64()), ("ts", pa.int64())])
Window = tuple[int, int, int]  # key, window_start, sum


class Slow(Operator):
    """Passes batches on after a pause (1 ms a record), so that checkpoints complete while the
    topic is read: a run reads for about 1.5 s."""

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        time.sleep(0.001 * batch.num_rows)
        return [batch] if batch.num_rows else []


def _record(i: int) -> dict[str, int]:
    return {"key": i % KEYS, "v": i + 1, "ts": BASE_MS + i * STEP_MS}


def _produce(kafka: KafkaBroker, topic: str, numbers: range) -> None:
    # One record a batch: Tansu's high watermark is the last batch's first offset + 1, and the
    # bounded source stops at the high watermark it sees at start (KafkaStop.latest()).
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "batch.num.messages": 1})
    for i in numbers:
        row = _record(i)
        producer.produce(
            topic, json.dumps(row).encode(), partition=i % PARTITIONS, timestamp=row["ts"]
        )
    assert producer.flush(60) == 0


@pytest.fixture(scope="module")
def topic(kafka: KafkaBroker) -> str:
    name = f"kafka-window-in-{time.monotonic_ns()}"
    kafka.create_topic(name, partitions=PARTITIONS)
    _produce(kafka, name, range(RECORDS))
    return name


def _expected() -> Counter[Window]:
    sums: Counter[tuple[int, int]] = Counter()
    for i in range(RECORDS):
        row = _record(i)
        sums[(row["key"], row["ts"] - row["ts"] % WINDOW_MS)] += row["v"]
    return Counter((key, start, total) for (key, start), total in sums.items())


def _source(kafka: KafkaBroker, topic: str, event_time: str) -> KafkaSource:
    return KafkaSource(
        kafka.bootstrap_servers,
        topics=[topic],
        stop=KafkaStop.latest(),
        value_format=KafkaValueFormat.json(SCHEMA),
        metadata=("timestamp",),
        event_time=event_time,
        batch_size=40,
    )


def _kafka_sink(kafka: KafkaBroker, out: str, exactly_once: bool) -> KafkaSink:
    return KafkaSink(
        kafka.bootstrap_servers,
        out,
        key="key",
        value=KafkaSerializer.json(["key", "window_start", "sum"]),
        guarantee="exactly_once" if exactly_once else "at_least_once",
        transactional_id_prefix=out if exactly_once else None,
        partitioner=KafkaPartitioner.fixed(),
    )


def window_pipeline(
    kafka: KafkaBroker,
    topic: str,
    sink: Operator,
    storage: Path,
    mode: str = "aligned",
    *,
    parallelism: int = 2,
    crash: FailAt | None = None,
    event_time: Literal["kafka", "ts"] = "kafka",
) -> Pipeline:
    p = Pipeline("kafka-window", parallelism=parallelism, max_parallelism=128)
    records = (
        p.source(_source(kafka, topic, event_time), name="kafka")
        .rebalance()
        .transform(Slow(), name="slow")
    )
    if crash is not None:
        records = records.transform(crash, name="crash-once")
    records.key_by("key").window(
        TumblingEventTimeWindows(WINDOW_MS),
        "timestamp" if event_time == "kafka" else "ts",
        "v",
        "sum",
        output_field="sum",
    ).sink(sink, name="out")
    checkpoint_mode, aligned_timeout_ms = MODES[mode]
    p.checkpointing(
        interval_ms=150,
        mode=checkpoint_mode,
        aligned_checkpoint_timeout_ms=aligned_timeout_ms,
        tolerable_failures=None,
        storage=storage,
    )
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    return p


def _kafka_windows(kafka: KafkaBroker, out: str) -> Counter[Window]:
    rows = [
        json.loads(r.value or b"")
        for r in committed_records(kafka.bootstrap_servers, out, OUT_PARTITIONS)
    ]
    return Counter((r["key"], r["window_start"], r["sum"]) for r in rows)


def _parquet_windows(out: Path) -> Counter[Window]:
    table = read_committed_parquet(out)
    columns = (table.column(c).to_pylist() for c in ("key", "window_start", "sum"))
    return Counter(zip(*columns, strict=True))


def _check(committed: Counter[Window], exactly_once: bool) -> None:
    expected = _expected()
    if exactly_once:
        lost, extra = expected - committed, committed - expected
        assert not lost, f"{sum(lost.values())} windows lost or wrong, e.g. {sorted(lost)[:3]}"
        assert not extra, f"{sum(extra.values())} windows extra, e.g. {sorted(extra)[:3]}"
        return
    best: dict[tuple[int, int], int] = {}
    for key, start, total in committed:
        best[(key, start)] = max(best.get((key, start), 0), total)
    for key, start, total in expected:
        assert best.get((key, start), 0) >= total, f"window {(key, start)} lost records"


# ---------------------------------------------------------------------------------------------
# Kills in every mode
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
def test_kafka_window_kafka_with_a_kill_in_every_mode(
    spark: Any, kafka: KafkaBroker, topic: str, kafka_topic_name: str, tmp_path: Path, mode: str
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=OUT_PARTITIONS)
    flip = list(MODES).index(mode) % 2
    crash = FailAt(how="exit" if flip else "raise", after_records=600, after_checkpoints=1)
    exactly_once = mode != "at-least-once"
    sink = _kafka_sink(kafka, kafka_topic_name, exactly_once)
    p = window_pipeline(
        kafka, topic, sink, tmp_path / "cp", mode, crash=crash, event_time="ts" if flip else "kafka"
    )
    with EmbeddedCoordinator(storage_root=str(tmp_path / "root")) as coordinator:
        result = p.run(spark, timeout_s=RUN_TIMEOUT_S, coordinator_address=coordinator.address)
        unaligned = unaligned_checkpoints(coordinator.address, result.job_id)
    assert result.state is JobStatus.FINISHED, result.failure
    assert result.restarts == 1 and result.stage_attempts == 2, result
    assert (unaligned > 0) is (mode in ("unaligned", "aligned-timeout")), unaligned
    _check(_kafka_windows(kafka, kafka_topic_name), exactly_once)


def test_kafka_window_parquet_with_a_kill(
    spark: Any, kafka: KafkaBroker, topic: str, tmp_path: Path
) -> None:
    crash = FailAt(how="exit", after_records=600, after_checkpoints=1)
    out = tmp_path / "out"
    p = window_pipeline(
        kafka, topic, TransactionalParquetSink(str(out)), tmp_path / "cp", "unaligned", crash=crash
    )
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED, result.failure
    assert result.restarts == 1, result
    _check(_parquet_windows(out), True)


# ---------------------------------------------------------------------------------------------
# Rescale from a savepoint
# ---------------------------------------------------------------------------------------------


def test_stop_with_savepoint_at_2_and_resume_at_3_is_exactly_once(
    spark: Any, kafka: KafkaBroker, topic: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=OUT_PARTITIONS)
    storage = tmp_path / "cp"

    def build(parallelism: int) -> Pipeline:
        sink = _kafka_sink(kafka, kafka_topic_name, True)
        return window_pipeline(kafka, topic, sink, storage, parallelism=parallelism)

    handle = build(2).run_async(spark)
    try:
        handle.wait_for_checkpoints(1, timeout_s=60)
        savepoint = handle.stop_with_savepoint(tmp_path / "sp", timeout_s=60)
    except BaseException:
        handle.cancel()
        raise
    first = handle.result(RUN_TIMEOUT_S)
    assert first.state is JobStatus.FINISHED and first.savepoint_path == savepoint
    stopped = _kafka_windows(kafka, kafka_topic_name)
    assert stopped != _expected()  # stopped before its input ended
    resumed = build(3).run(spark, restore_from=savepoint, timeout_s=RUN_TIMEOUT_S)
    assert resumed.state is JobStatus.FINISHED and resumed.restarts == 0, resumed.failure
    assert sorted(s["slot"] for s in resumed.slot_summaries) == [0, 1, 2]
    _check(_kafka_windows(kafka, kafka_topic_name), True)


# ---------------------------------------------------------------------------------------------
# A crash between a checkpoint's completion and the sink's commit
# ---------------------------------------------------------------------------------------------


class CrashBeforeCommit(KafkaSink):
    """The Kafka sink whose process dies in the completion notice of its ``after``-th
    checkpoint, before committing (subtask 0, first deployment), as a killed executor would."""

    def __init__(self, *args: Any, after: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after = after

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        ctx = self._context()
        if ctx.attempt == 1 and ctx.subtask_index == 0 and checkpoint_id >= self.after:
            os._exit(1)
        super().notify_checkpoint_complete(checkpoint_id)


def _markers(kafka: KafkaBroker, prefix: str, operator_id: str, topic: str) -> list[int]:
    out = []
    for subtask in range(2):
        consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": marker_group(prefix, operator_id, subtask),
            }
        )
        try:
            (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        finally:
            consumer.close()
        out.append(int(tp.offset))
    return out


def test_a_crash_between_completion_and_commit_loses_and_duplicates_nothing(
    spark: Any, kafka: KafkaBroker, topic: str, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=OUT_PARTITIONS)
    sink = CrashBeforeCommit(
        kafka.bootstrap_servers,
        kafka_topic_name,
        key="key",
        value=KafkaSerializer.json(["key", "window_start", "sum"]),
        guarantee="exactly_once",
        transactional_id_prefix=kafka_topic_name,
        partitioner=KafkaPartitioner.fixed(),
        after=3,
    )
    p = window_pipeline(kafka, topic, sink, tmp_path / "cp")
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED, result.failure
    assert result.restarts == 1, result
    _check(_kafka_windows(kafka, kafka_topic_name), True)
    operator_id = next(
        o.operator_id for v in p.graph.vertices for o in v.operators if o.name == "out"
    )
    assert min(_markers(kafka, kafka_topic_name, operator_id, kafka_topic_name)) >= 3


# ---------------------------------------------------------------------------------------------
# Partitions added mid-job
# ---------------------------------------------------------------------------------------------


def test_a_topic_added_mid_job_is_read_exactly_once(
    spark: Any, kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    """Unbounded, ``topic_pattern``: the second topic (3 more partitions) appears after the
    first checkpoint; its records are counted once. The job is stopped with a savepoint once
    every count is committed."""
    first, second = f"{kafka_topic_name}-in-a", f"{kafka_topic_name}-in-b"
    out = f"{kafka_topic_name}-out"  # (not matching the pattern)
    kafka.create_topic(first, partitions=PARTITIONS)
    kafka.create_topic(out, partitions=OUT_PARTITIONS)
    half = RECORDS // 2
    _produce(kafka, first, range(half))
    p = Pipeline("kafka-discovery", parallelism=2, max_parallelism=128)
    p.source(
        KafkaSource(
            kafka.bootstrap_servers,
            topic_pattern=f"{kafka_topic_name}-in-.*",
            value_format=KafkaValueFormat.json(SCHEMA),
            metadata=(),
            discovery_interval_ms=200,
            batch_size=200,
        ),
        name="kafka",
    ).key_by("key").count().sink(
        KafkaSink(
            kafka.bootstrap_servers,
            out,
            key="key",
            value=KafkaSerializer.json(["key", "count"]),
            guarantee="exactly_once",
            transactional_id_prefix=out,
        ),
        name="out",
    )
    p.checkpointing(interval_ms=150, storage=tmp_path / "cp")
    expected = Counter(i % KEYS for i in range(RECORDS))

    def committed() -> pa.Table:
        rows = [
            json.loads(r.value or b"")
            for r in committed_records(kafka.bootstrap_servers, out, OUT_PARTITIONS)
        ]
        return pa.table({"key": [r["key"] for r in rows], "count": [r["count"] for r in rows]})

    def finals() -> dict[int, int]:
        table = committed()
        keys, counts = table.column("key").to_pylist(), table.column("count").to_pylist()
        return dict(zip(keys, counts, strict=True))

    handle = p.run_async(spark)
    try:
        handle.wait_for_checkpoints(1, timeout_s=60)
        kafka.create_topic(second, partitions=PARTITIONS)
        _produce(kafka, second, range(half, RECORDS))
        wait_until(
            lambda: finals() == dict(expected),
            "every count committed",
            timeout_s=60,
            interval_s=0.3,
        )
        handle.stop_with_savepoint(tmp_path / "sp", timeout_s=60)
    except BaseException:
        handle.cancel()
        raise
    result = handle.result(RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED, result.failure
    check_exactly_once(committed(), expected)

"""The Kafka source against the session's real broker (Tansu): start positions, the bounded end,
a restore mid-topic and rescales of the split state (no loss, no duplicates), partition
discovery, decoding policies, per-partition watermarks with an idle partition, offsets
committed only after a checkpoint completes, and bad input.

Tansu answers ListOffsets at record-batch granularity, so the tests produce one record per
batch (``batch.num.messages=1``) where an end offset matters; it does not support
CreatePartitions, so partitions new to a running job come from a new topic that the
subscription pattern matches."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kit.kafka_broker import KafkaBroker
from kit.polling import wait_until
from kit.sources import drain, src_ctx
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError, NotFoundError, UnavailableError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.connectors.kafka_positions import KafkaStart, KafkaStop
from snapflow.worker.connectors.kafka_records import KafkaValueFormat, UndecodableRecordError
from snapflow.worker.connectors.kafka_source import KafkaSource
from snapflow.worker.state.operator_state import OperatorStateBackend

Record = tuple[int, bytes | None, bytes | None]  # partition, key, value


def produce(
    kafka: KafkaBroker, topic: str, records: Iterable[Record], timestamps: Iterable[int] = ()
) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "batch.num.messages": 1})
    stamps = list(timestamps)
    for i, (partition, key, value) in enumerate(records):
        stamp = stamps[i] if stamps else 0  # 0: now
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=stamp)
    assert producer.flush(30) == 0


def numbered(partitions: int, per_partition: int, start: int = 0) -> list[Record]:
    """``per_partition`` records in each partition; value ``p:i`` (i from ``start``)."""
    return [
        (p, str(i).encode(), f"{p}:{i}".encode())
        for i in range(start, start + per_partition)
        for p in range(partitions)
    ]


def source(kafka: KafkaBroker, topic: str, **kwargs: Any) -> KafkaSource:
    kwargs.setdefault("poll_timeout_ms", 50)
    if "topic_pattern" not in kwargs:
        kwargs["topics"] = [topic]
    return KafkaSource(kafka.bootstrap_servers, **kwargs)


def read(src: KafkaSource, n: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """At least ``n`` rows polled from ``src`` (all it gave until then)."""
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(rows) < n:
        assert time.monotonic() < deadline, f"only {len(rows)} of {n} rows"
        batch = src.poll_batch(7)  # small batches: many polls
        assert batch is not None
        rows.extend(batch.to_pylist())
    return rows


def values(rows: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(r["value"].decode() for r in rows)


def snapshot(backend: OperatorStateBackend, src: KafkaSource, cid: int, root: Path) -> list[Any]:
    src.snapshot_state(cid)
    return backend.snapshot(cid).write(root / f"chk-{cid}-{uuid.uuid4().hex[:6]}")


def test_reads_every_record_with_its_metadata(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    produce(kafka, kafka_topic_name, numbered(2, 5))
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(kafka_topic_name, value=b"h", partition=0, headers=[("k", b"v")], timestamp=77)
    producer.flush(30)
    src = cloudpickle.loads(
        cloudpickle.dumps(
            source(
                kafka,
                kafka_topic_name,
                stop=KafkaStop.latest(),
                key_format="utf-8",
                metadata=("key", "topic", "partition", "offset", "timestamp", "headers"),
            )
        )
    )
    src.open(src_ctx())
    rows = drain(src, 4)
    assert src.output_schema.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "headers",
    ]
    assert len(rows) == 11
    by_partition = {p: [r["offset"] for r in rows if r["partition"] == p] for p in (0, 1)}
    assert by_partition == {0: list(range(6)), 1: list(range(5))}
    assert {r["topic"] for r in rows} == {kafka_topic_name}
    last = next(r for r in rows if r["value"] == b"h")
    assert last["timestamp"] == 77 and last["headers"] == [{"key": "k", "value": b"v"}]
    assert last["key"] is None
    assert rows[0]["headers"] is None and isinstance(rows[0]["key"], str)
    assert src.current_watermark() == MAX_WATERMARK and src.splits == [
        (kafka_topic_name, 0, 6, 6),
        (kafka_topic_name, 1, 5, 5),
    ]
    src.close()


def test_start_positions(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    topic = kafka_topic_name
    kafka.create_topic(topic, partitions=2)
    produce(kafka, topic, numbered(2, 5))
    time.sleep(0.05)
    between = int(time.time() * 1000)
    time.sleep(0.05)
    produce(kafka, topic, numbered(2, 2, start=5))
    everything = values({"value": v} for _, _, v in numbered(2, 7))

    def bounded(start: KafkaStart, **kwargs: Any) -> list[str]:
        src = source(kafka, topic, start=start, stop=KafkaStop.latest(), **kwargs)
        src.open(src_ctx())
        try:
            return values(drain(src, 5))
        finally:
            src.close()

    assert bounded(KafkaStart.earliest()) == everything
    assert bounded(KafkaStart.latest()) == []
    assert bounded(KafkaStart.timestamp(between)) == ["0:5", "0:6", "1:5", "1:6"]
    explicit = KafkaStart.from_offsets({(topic, 0): 6}, default="latest")
    assert bounded(explicit) == ["0:6"]
    # committed: partition 0 has a group offset, partition 1 falls back
    group = f"g-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    committer.close()
    assert bounded(KafkaStart.committed("latest"), group_id=group) == ["0:4", "0:5", "0:6"]
    assert bounded(KafkaStart.committed("earliest"), group_id=group) == sorted(
        ["0:4", "0:5", "0:6"] + [f"1:{i}" for i in range(7)]
    )

    # latest, unbounded: exactly what is produced after the start
    src = source(kafka, topic, start=KafkaStart.latest())
    src.open(src_ctx())
    assert src.poll_batch(100).num_rows == 0  # type: ignore[union-attr]
    produce(kafka, topic, [(1, None, b"new")])
    assert values(read(src, 1)) == ["new"]
    src.close()


def test_bounded_source_stops_at_the_offsets_of_its_start(
    kafka: KafkaBroker, kafka_topic_name: str
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    produce(kafka, kafka_topic_name, numbered(2, 3))
    src = source(kafka, kafka_topic_name, stop=KafkaStop.latest())
    src.open(src_ctx())
    produce(kafka, kafka_topic_name, numbered(2, 3, start=3))  # after the start: not read
    assert values(drain(src, 2)) == ["0:0", "0:1", "0:2", "1:0", "1:1", "1:2"]
    assert src.poll_batch(10) is None and src.current_watermark() == MAX_WATERMARK
    src.close()
    given = source(kafka, kafka_topic_name, stop=KafkaStop.from_offsets({(kafka_topic_name, 1): 4}))
    given.open(src_ctx())
    # partition 0: its end at the start (6); partition 1: offset 4, even mid-batch
    assert values(drain(given, 100)) == [f"0:{i}" for i in range(6)] + [f"1:{i}" for i in range(4)]
    given.close()
    # a subtask that owns no partition ends at once
    idle = source(kafka, kafka_topic_name, stop=KafkaStop.latest())
    idle.open(src_ctx(idle_subtask(kafka_topic_name, 5), 5))
    assert idle.poll_batch(10) is None
    idle.close()


def idle_subtask(topic: str, parallelism: int) -> int:
    """A subtask that owns neither partition of ``topic`` (the owners depend on its name)."""
    from snapflow.worker.connectors.kafka_splits import split_owner

    owners = {split_owner(topic, p, parallelism) for p in range(2)}
    return next(i for i in range(parallelism) if i not in owners)


def test_restore_mid_topic_reads_on_without_loss_or_duplicates(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=3)
    produce(kafka, kafka_topic_name, numbered(3, 20))
    backend = OperatorStateBackend()
    src = source(kafka, kafka_topic_name, stop=KafkaStop.latest())
    src.open(src_ctx(backend=backend))
    before = read(src, 25)
    handles = snapshot(backend, src, 1, tmp_path)
    lost = read(src, 10)  # emitted after the checkpoint: rolled back with it
    src.close()

    restored = OperatorStateBackend()
    restored.restore({0: handles}, 0, 1)
    again = source(kafka, kafka_topic_name, stop=KafkaStop.latest())
    again.open(src_ctx(backend=restored, restored=1))
    after = drain(again, 7)
    assert values(before + after) == values({"value": v} for _, _, v in numbered(3, 20))
    assert set(values(lost)) <= set(values(after))
    again.close()


@pytest.mark.parametrize(("old_p", "new_p"), [(2, 3), (3, 1)])
def test_rescale_reassigns_the_split_state(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path, old_p: int, new_p: int
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=6)
    produce(kafka, kafka_topic_name, numbered(6, 10))
    before: list[dict[str, Any]] = []
    handles: dict[int, list[Any]] = {}
    for s in range(old_p):
        backend = OperatorStateBackend()
        src = source(kafka, kafka_topic_name, stop=KafkaStop.latest())
        src.open(src_ctx(s, old_p, backend))
        before.extend(read(src, 5 * (s + 1)))
        handles[s] = snapshot(backend, src, 4, tmp_path / str(s))
        src.close()
    after: list[dict[str, Any]] = []
    owned: list[tuple[str, int]] = []
    for s in range(new_p):
        backend = OperatorStateBackend()
        backend.restore(handles, s, new_p)
        src = source(kafka, kafka_topic_name, stop=KafkaStop.latest())
        src.open(src_ctx(s, new_p, backend, restored=4))
        owned.extend((t, p) for t, p, _, _ in src.splits)
        after.extend(drain(src, 6))
        src.close()
    assert sorted(owned) == [(kafka_topic_name, p) for p in range(6)]  # each split once
    assert values(before + after) == values({"value": v} for _, _, v in numbered(6, 10))


def test_discovers_partitions_added_while_running(kafka: KafkaBroker) -> None:
    prefix = f"disc-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(f"{prefix}-a", partitions=2)
    produce(kafka, f"{prefix}-a", numbered(2, 2))
    subtasks = [
        source(kafka, "", topic_pattern=f"{prefix}-.*", discovery_interval_ms=100) for _ in range(2)
    ]
    for s, src in enumerate(subtasks):
        src.open(src_ctx(s, 2))
    rows = [r for src in subtasks for r in read(src, 2)]
    kafka.create_topic(f"{prefix}-b", partitions=3)  # new partitions: read from the earliest
    produce(kafka, f"{prefix}-b", numbered(3, 2))
    seen: list[dict[str, Any]] = []

    def all_read() -> bool:
        for src in subtasks:
            seen.extend(src.poll_batch(100).to_pylist())  # type: ignore[union-attr]
        return len(seen) >= 6

    wait_until(all_read, "the new topic's records", timeout_s=20, interval_s=0.05)
    assert values(rows) == ["0:0", "0:1", "1:0", "1:1"]
    assert values(seen) == ["0:0", "0:1", "1:0", "1:1", "2:0", "2:1"]
    assert {r["topic"] for r in seen} == {f"{prefix}-b"}
    owned = sorted((t, p) for src in subtasks for t, p, _, _ in src.splits)
    assert owned == [(f"{prefix}-a", p) for p in range(2)] + [(f"{prefix}-b", p) for p in range(3)]
    for src in subtasks:
        src.close()


SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64())])


def test_json_values_and_the_undecodable_policy(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name, partitions=1)
    docs: list[bytes | None] = [
        b'{"user": "a", "amount": 1}',
        b'{\n  "user": "b",\n  "amount": 2, "extra": true\n}',  # pretty-printed, extra field
        None,  # a tombstone: null fields
        b'{"user": "c", "amount": "three"}',  # offset 3: does not fit the schema
        b"null",
        b"not json",
        b'{"user": "d", "amount": 4}',
    ]
    produce(kafka, kafka_topic_name, [(0, None, d) for d in docs])
    fmt = KafkaValueFormat.json(SCHEMA)

    failing = source(kafka, kafka_topic_name, stop=KafkaStop.latest(), value_format=fmt)
    failing.open(src_ctx())
    with pytest.raises(
        UndecodableRecordError, match=f"topic '{kafka_topic_name}' partition 0 offset 3"
    ):
        drain(failing, 100)
    failing.close()

    skipping = source(
        kafka, kafka_topic_name, stop=KafkaStop.latest(), value_format=fmt, on_undecodable="skip"
    )
    skipping.open(src_ctx())
    rows = drain(skipping, 100)
    assert [(r["user"], r["amount"], r["offset"]) for r in rows] == [
        ("a", 1, 0),
        ("b", 2, 1),
        (None, None, 2),
        ("d", 4, 6),
    ]
    assert skipping.records_skipped == 3
    assert skipping.splits == [(kafka_topic_name, 0, 7, 7)]  # skipped records are consumed
    skipping.close()

    utf8 = source(
        kafka, kafka_topic_name, stop=KafkaStop.latest(), value_format=KafkaValueFormat.utf8()
    )
    utf8.open(src_ctx())
    assert [r["value"] for r in drain(utf8, 100)][:3] == [docs[0].decode(), docs[1].decode(), None]  # type: ignore[union-attr]
    utf8.close()

    def parse(value: bytes) -> dict[str, Any]:
        doc = json.loads(value)
        return {"user": doc["user"].upper(), "amount": doc["amount"] * 10}

    custom = source(
        kafka,
        kafka_topic_name,
        stop=KafkaStop.latest(),
        value_format=KafkaValueFormat.from_function(parse, SCHEMA),
        on_undecodable="skip",
        metadata=("offset",),
    )
    custom.open(src_ctx())
    assert drain(custom, 100) == [
        {"user": "A", "amount": 10, "offset": 0},
        {"user": "B", "amount": 20, "offset": 1},
        {"user": None, "amount": None, "offset": 2},
        {"user": "D", "amount": 40, "offset": 6},
    ]
    assert custom.records_skipped == 3
    custom.close()


def test_not_utf8_values_fail_or_skip(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name, partitions=1)
    produce(kafka, kafka_topic_name, [(0, None, b"ok"), (0, None, b"\xff\xfe"), (0, None, b"ok2")])
    for policy, expected in (("fail", None), ("skip", ["ok", "ok2"])):
        src = source(
            kafka,
            kafka_topic_name,
            stop=KafkaStop.latest(),
            value_format=KafkaValueFormat.utf8(),
            on_undecodable=policy,
        )
        src.open(src_ctx())
        if expected is None:
            with pytest.raises(UndecodableRecordError, match="offset 1: the value is not UTF-8"):
                drain(src)
        else:
            assert [r["value"] for r in drain(src)] == expected
        src.close()


def test_watermark_is_the_minimum_over_partitions_that_are_not_idle(
    kafka: KafkaBroker, kafka_topic_name: str
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    produce(
        kafka, kafka_topic_name, numbered(2, 3), timestamps=[1000, 5000, 1001, 5001, 1002, 5002]
    )
    src = source(
        kafka, kafka_topic_name, event_time="kafka", max_out_of_orderness_ms=10, idle_timeout_ms=300
    )
    src.open(src_ctx())
    assert src.current_watermark() == MIN_WATERMARK
    read(src, 6)
    assert src.current_watermark() == 1002 - 10 - 1  # partition 0 holds it back
    assert src.idle_timeout_ms == 300  # the subtask's own idleness too
    time.sleep(0.4)
    produce(kafka, kafka_topic_name, [(1, None, b"late-p1")], timestamps=[9000])
    read(src, 1)
    # partition 0 had no records for longer than idle_timeout_ms: it no longer holds it back
    assert src.current_watermark() == 9000 - 10 - 1
    produce(kafka, kafka_topic_name, [(0, None, b"p0-again")], timestamps=[1003])
    read(src, 1)
    assert src.current_watermark() == 9000 - 10 - 1  # never goes back
    src.close()


def test_event_time_from_a_field(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name, partitions=1)
    schema = pa.schema([("ts", pa.int64())])
    produce(kafka, kafka_topic_name, [(0, None, b'{"ts": 40}'), (0, None, b'{"ts": 30}')])
    src = source(
        kafka,
        kafka_topic_name,
        value_format=KafkaValueFormat.json(schema),
        event_time="ts",
    )
    src.open(src_ctx())
    read(src, 2)
    assert src.current_watermark() == 39
    src.close()


def test_offsets_are_committed_only_when_a_checkpoint_completes(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    produce(kafka, kafka_topic_name, numbered(2, 5))
    group = f"g-{uuid.uuid4().hex[:8]}"
    backend = OperatorStateBackend()
    src = source(kafka, kafka_topic_name, group_id=group)
    src.open(src_ctx(backend=backend))
    read(src, 10)
    checker = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    tps = [TopicPartition(kafka_topic_name, p) for p in (0, 1)]

    def committed() -> list[int]:
        return [tp.offset for tp in checker.committed(tps, timeout=10)]

    snapshot(backend, src, 1, tmp_path)
    snapshot(backend, src, 2, tmp_path)
    src.notify_checkpoint_aborted(2)
    src.poll_batch(10)
    assert committed() == [-1001, -1001]  # nothing before a completion
    src.notify_checkpoint_complete(1)

    def done() -> bool:
        src.poll_batch(10)  # commit callbacks are served while polling
        return src.commits_done == 1

    wait_until(done, "the commit of checkpoint 1", timeout_s=20, interval_s=0.05)
    assert committed() == [5, 5]
    # a restore does not read them back: it starts from the checkpoint's state (earliest here)
    restart = source(kafka, kafka_topic_name, group_id=group, stop=KafkaStop.latest())
    restart.open(src_ctx())
    assert len(drain(restart)) == 10
    restart.close()
    # a failed commit is logged and counted, never raised
    src._on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [])
    assert src.commits_failed == 1
    checker.close()
    src.close()


def test_a_broker_that_is_down_fails_clearly_after_bounded_retries(kafka_topic_name: str) -> None:
    src = KafkaSource(
        "127.0.0.1:1", topics=[kafka_topic_name], connect_attempts=2, request_timeout_s=0.3
    )
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=r"127\.0\.0\.1:1 did not answer .* 2 attempts"):
        src.open(src_ctx())
    assert time.monotonic() - started < 5
    src.close()


def test_a_missing_topic_is_named(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    src = source(kafka, kafka_topic_name)
    with pytest.raises(NotFoundError, match=f"topic '{kafka_topic_name}' does not exist"):
        src.open(src_ctx())
    src.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"properties": {"no.such.property": 1}}, "No such configuration property"),
        ({"properties": {"fetch.max.bytes": -1}}, "fetch.max.bytes"),
        ({"properties": {"enable.auto.commit": True}}, "committed when checkpoints complete"),
        ({"properties": {"auto.offset.reset": "latest"}}, "start=KafkaStart"),
        ({"topic_pattern": "x.*"}, "either as topics"),
        ({"topics": []}, "non-empty topic names"),
        ({"start": KafkaStart.committed()}, "needs a group_id"),
        ({"event_time": "nope"}, "event_time"),
        ({"batch_size": 0}, "batch_size"),
        ({"metadata": ("key", "where")}, "metadata columns"),
        ({"value_format": KafkaValueFormat.json(pa.schema([("key", pa.int64())]))}, "clash"),
        ({"on_undecodable": "ignore"}, "on_undecodable"),
    ],
)
def test_bad_settings_are_refused_at_construction(kwargs: dict[str, Any], message: str) -> None:
    kwargs.setdefault("topics", ["t"])
    with pytest.raises(InvalidArgumentError, match=message):
        KafkaSource("127.0.0.1:9092", **kwargs)
    with pytest.raises(InvalidArgumentError, match="bootstrap_servers"):
        KafkaSource("", topics=["t"])

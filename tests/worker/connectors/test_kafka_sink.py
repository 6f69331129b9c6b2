"""The Kafka sink against the session's real broker (Tansu): at least once, exactly once
(commit on completion, a lost notice, a crash between completion and commit, lingering
transactions aborted on restore, a down-scale), and bad input.

What rests on the broker here: Tansu holds ``read_committed`` readers back at an open
transaction (so "nothing before the completion" is the broker's answer), commits a
transaction's offsets with it (the marker), and lets ``init_transactions`` end a lingering
transaction (readers move past it). It does not hide aborted records from ``read_committed``
readers, so the tests of re-production check the marker and the offsets the sink appended,
not what a real broker would hide; fencing a zombie is not tested (Tansu does not fence).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from kit.kafka_broker import KafkaBroker, kafka_broker
from kit.processes import free_port
from pyspark import cloudpickle

from snapflow.errors import ConfigError, InvalidArgumentError, UnavailableError
from snapflow.worker.connectors.kafka_sink import KafkaSink, KafkaSinkError
from snapflow.worker.connectors.kafka_sink_encoding import KafkaSerializer
from snapflow.worker.connectors.kafka_sink_settings import KafkaPartitioner
from snapflow.worker.connectors.kafka_sink_transactions import marker_group
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend

OPERATOR_ID = "v1-out.0-sink"


def _ctx(
    backend: OperatorStateBackend, subtask: int = 0, parallelism: int = 1, restored: int = 0
) -> OperatorContext:
    return OperatorContext(
        vertex_id="v1-out",
        operator_id=OPERATOR_ID,
        subtask_index=subtask,
        parallelism=parallelism,
        operator_state=backend,
        restored_checkpoint_id=restored,
    )


def _rows(values: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"k": pa.array([f"k{v % 3}" for v in values]), "v": pa.array(values, pa.int64())}
    )


_CREATED: list[KafkaSink] = []


@pytest.fixture(autouse=True)
def _release_clients() -> Any:
    """After each test, close the sinks it made: a test that plays a crash leaves its sink
    unclosed on purpose, and its producers (which hold the sink through their delivery
    callback, a cycle the garbage collector cannot see through librdkafka) would otherwise
    live, and reconnect, until the test session's process ends."""
    yield
    while _CREATED:
        _CREATED.pop().close()


def _sink(kafka: KafkaBroker, topic: str, **options: Any) -> KafkaSink:
    sink = KafkaSink(kafka.bootstrap_servers, topic, key="k", value="v", **options)
    _CREATED.append(sink)
    return sink


def _exactly_once(kafka: KafkaBroker, topic: str, **options: Any) -> KafkaSink:
    return _sink(kafka, topic, guarantee="exactly_once", transactional_id_prefix=topic, **options)


def _checkpoint(sink: KafkaSink, backend: OperatorStateBackend, cid: int, root: Path) -> list[Any]:
    sink.snapshot_state(cid)
    return backend.snapshot(cid).write(root / f"{cid}-{sink.ctx.subtask_index if sink.ctx else 0}")


def _restore(
    sink: KafkaSink,
    cid: int,
    handles: dict[int, list[Any]],
    subtask: int = 0,
    parallelism: int = 1,
) -> KafkaSink:
    """A copy of ``sink`` as shipped to a new attempt, opened on checkpoint ``cid``'s state."""
    backend = OperatorStateBackend()
    backend.restore(handles, subtask, parallelism, old_parallelism=len(handles))
    copy: KafkaSink = cloudpickle.loads(cloudpickle.dumps(sink))
    copy.open(_ctx(backend, subtask, parallelism, restored=cid))
    return copy


class Record(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: int


def _read(
    kafka: KafkaBroker,
    topic: str,
    *,
    committed: bool = True,
    expect: int | None = None,
    quiet_s: float = 1.0,
    after: int = -1,
) -> list[Record]:
    """Every record of ``topic`` at an offset above ``after``,
    polling until ``expect`` records arrived or nothing came for ``quiet_s``."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Record] = []
        last = time.monotonic()
        while time.monotonic() - last < quiet_s and (expect is None or len(out) < expect):
            msg = consumer.poll(0.1)
            if msg is None or msg.error() is not None or (msg.offset() or 0) <= after:
                continue
            out.append(
                Record(msg.partition() or 0, msg.offset() or 0, msg.key(), int(msg.value() or b""))
            )
            last = time.monotonic()
        return out
    finally:
        consumer.close()


def kafka_marker(kafka: KafkaBroker, group: str, topic: str) -> int:
    """The offset ``group`` committed for partition 0 of ``topic`` (-1001: none)."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def _marker(kafka: KafkaBroker, topic: str, subtask: int) -> int:
    return kafka_marker(kafka, marker_group(topic, OPERATOR_ID, subtask), topic)


def _values(records: list[Record]) -> list[int]:
    return sorted(r.value for r in records)


# --- at least once ----------------------------------------------------------------------------


def test_at_least_once_delivers_everything_before_the_barrier_passes(
    kafka: KafkaBroker, kafka_topic_name: str
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=3)
    sink = _sink(kafka, kafka_topic_name)
    sink.open(_ctx(OperatorStateBackend()))
    try:
        sink.process_batch(_rows(list(range(100))))
        sink.process_batch(_rows(list(range(100, 130))))
        sink.snapshot_state(1)  # returns once Kafka acknowledged every record
        records = _read(kafka, kafka_topic_name, expect=130)
        assert _values(records) == list(range(130))
        # by key: one partition per key
        by_key: dict[bytes | None, set[int]] = {}
        for r in records:
            by_key.setdefault(r.key, set()).add(r.partition)
        assert set(by_key) == {b"k0", b"k1", b"k2"}
        assert all(len(p) == 1 for p in by_key.values())
    finally:
        sink.close()


def test_a_delivery_error_fails_the_barrier(kafka_topic_name: str) -> None:
    with kafka_broker() as own:
        own.create_topic(kafka_topic_name)
        sink = KafkaSink(
            own.bootstrap_servers,
            kafka_topic_name,
            value="v",
            producer_config={"message.timeout.ms": 1000},
        )
        sink.open(_ctx(OperatorStateBackend()))
    try:  # the broker is gone: the records cannot be delivered
        sink.process_batch(_rows([1, 2, 3]))
        with pytest.raises(KafkaSinkError, match=r"3 record\(s\) could not be written"):
            sink.snapshot_state(1)
    finally:
        sink.close()


def test_partitioners_fixed_and_round_robin(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name, partitions=3)
    fixed = KafkaSink(
        kafka.bootstrap_servers, kafka_topic_name, value="v", partitioner=KafkaPartitioner.fixed()
    )
    fixed.open(_ctx(OperatorStateBackend(), subtask=4, parallelism=5))
    fixed.process_batch(_rows([1, 2, 3]))
    fixed.snapshot_state(1)
    fixed.close()
    assert {r.partition for r in _read(kafka, kafka_topic_name, expect=3)} == {4 % 3}
    spread = KafkaSink(
        kafka.bootstrap_servers,
        kafka_topic_name,
        value="v",
        partitioner=KafkaPartitioner.round_robin(),
    )
    spread.open(_ctx(OperatorStateBackend()))
    spread.process_batch(_rows([10, 11, 12, 13, 14, 15]))
    spread.snapshot_state(1)
    spread.close()
    got = [
        (r.partition, r.value) for r in _read(kafka, kafka_topic_name, expect=9) if r.value >= 10
    ]
    assert sorted(got) == [(0, 10), (0, 13), (1, 11), (1, 14), (2, 12), (2, 15)]


def test_json_values_and_headers(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name)
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([1, 2]),
            "name": pa.array(['a "quoted"\nline', None]),
            "h": pa.array([[("trace", b"t1")], None], pa.map_(pa.string(), pa.binary())),
        }
    )
    sink = KafkaSink(
        kafka.bootstrap_servers,
        kafka_topic_name,
        key=KafkaSerializer.function(lambda b: [f"id-{i}" for i in b.column("id").to_pylist()]),
        value=KafkaSerializer.json(["id", "name"]),
        headers="h",
    )
    sink.open(_ctx(OperatorStateBackend()))
    sink.process_batch(batch)
    sink.snapshot_state(1)
    sink.close()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "j",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(kafka_topic_name, 0, 0)])
    msgs = []
    for _ in range(100):
        msg = consumer.poll(0.1)
        if msg is not None and msg.error() is None:
            msgs.append(msg)
        if len(msgs) == 2:
            break
    consumer.close()
    assert [m.key() for m in msgs] == [b"id-1", b"id-2"]
    assert [json.loads(m.value() or b"") for m in msgs] == [
        {"id": 1, "name": 'a "quoted"\nline'},
        {"id": 2, "name": None},
    ]
    assert msgs[0].headers() == [("trace", b"t1")]
    assert msgs[1].headers() is None


# --- exactly once -----------------------------------------------------------------------------


def test_exactly_once_commits_only_on_completion(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    backend = OperatorStateBackend()
    sink = _exactly_once(kafka, kafka_topic_name)
    sink.open(_ctx(backend))
    try:
        sink.process_batch(_rows(list(range(50))))
        _checkpoint(sink, backend, 1, tmp_path)
        written = _read(kafka, kafka_topic_name, committed=False, expect=50)
        assert _values(written) == list(range(50))  # written, not committed
        assert _read(kafka, kafka_topic_name, quiet_s=1.0) == []  # held back until the commit
        sink.notify_checkpoint_complete(1)
        assert _values(_read(kafka, kafka_topic_name, expect=50)) == list(range(50))
        assert _marker(kafka, kafka_topic_name, 0) == 1  # sequence 1 committed
    finally:
        sink.close()


def test_a_lost_notice_is_covered_by_the_next_one(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name)
    backend = OperatorStateBackend()
    sink = _exactly_once(kafka, kafka_topic_name)
    sink.open(_ctx(backend))
    try:
        sink.process_batch(_rows([1, 2]))
        _checkpoint(sink, backend, 1, tmp_path)  # its notice is lost
        sink.process_batch(_rows([3]))
        _checkpoint(sink, backend, 2, tmp_path)
        assert [t.checkpoint_id for t in sink.transactions.pending] == [1, 2]
        sink.notify_checkpoint_complete(2)
        assert sink.transactions.pending == []
        assert _values(_read(kafka, kafka_topic_name, expect=3)) == [1, 2, 3]
        assert _marker(kafka, kafka_topic_name, 0) == 2
    finally:
        sink.close()


def test_a_crash_between_completion_and_commit_is_reproduced_exactly_once(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name)
    backend = OperatorStateBackend()
    sink = _exactly_once(kafka, kafka_topic_name)
    sink.open(_ctx(backend))
    sink.process_batch(_rows([1, 2]))
    handles = _checkpoint(sink, backend, 1, tmp_path)
    sink.notify_checkpoint_complete(1)
    sink.process_batch(_rows([3, 4, 5]))
    handles = _checkpoint(sink, backend, 2, tmp_path)  # completes; the process dies before
    sink.process_batch(_rows([6]))  # its notice (6: after the barrier, replayed by the source)
    written = _read(kafka, kafka_topic_name, committed=False, expect=6)
    assert _values(written) == [1, 2, 3, 4, 5, 6]
    before = max(r.offset for r in written)  # (Tansu's watermark offsets are not exact)
    assert _marker(kafka, kafka_topic_name, 0) == 1
    # the crash: nothing closed, nothing aborted; the restore aborts the lingering
    # transactions, sees the marker at 1 and re-produces sequence 2 (checkpoint 2) once
    restored = _restore(sink, 2, {0: handles})
    try:
        assert _marker(kafka, kafka_topic_name, 0) == 2
        appended = _read(kafka, kafka_topic_name, committed=False, after=before, expect=3)
        assert _values(appended) == [3, 4, 5]  # the one new copy
        # a real broker hides the aborted copies of 3, 4, 5 and 6; Tansu shows them, so the
        # committed view is checked after the re-production's offsets only (above)
        assert restored.transactions.next_sequence > 2
        restored.process_batch(_rows([6]))
        _checkpoint(restored, restored.ctx.operator_state, 3, tmp_path)  # type: ignore[union-attr]
        restored.notify_checkpoint_complete(3)
        assert _marker(kafka, kafka_topic_name, 0) > 2
    finally:
        restored.close()
    # restoring from checkpoint 2 again re-produces nothing: its marker is there
    high = max(r.offset for r in _read(kafka, kafka_topic_name, committed=False, quiet_s=0.5))
    again = _restore(sink, 2, {0: handles})
    again.close()
    assert _read(kafka, kafka_topic_name, committed=False, after=high, quiet_s=0.5) == []


def test_a_restore_aborts_lingering_transactions_also_of_removed_subtasks(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    kafka.create_topic(kafka_topic_name)
    sinks, backends, handles = [], [], {}
    for i in range(2):
        backends.append(OperatorStateBackend())
        sinks.append(_exactly_once(kafka, kafka_topic_name))
        sinks[i].open(_ctx(backends[i], subtask=i, parallelism=2))
    for i, sink in enumerate(sinks):
        sink.process_batch(_rows([10 * i + 1]))
        handles[i] = _checkpoint(sink, backends[i], 1, tmp_path)
    sinks[0].notify_checkpoint_complete(1)  # subtask 1's notice never arrives: it crashes
    for i, sink in enumerate(sinks):
        sink.process_batch(_rows([10 * i + 2]))  # open transactions when the job dies
    probe = KafkaSink(kafka.bootstrap_servers, kafka_topic_name, value="v")  # plain writes
    probe.open(_ctx(OperatorStateBackend()))
    probe.process_batch(_rows([99]))
    probe.snapshot_state(1)
    probe.close()
    seen = _values(_read(kafka, kafka_topic_name, quiet_s=1.0))
    assert 99 not in seen  # held back behind the lingering transactions (broker)
    written = _read(kafka, kafka_topic_name, committed=False, expect=5)
    assert _values(written) == [1, 2, 11, 12, 99]
    before = max(r.offset for r in written)
    # down-scale to 1: subtask 0 answers for ids 0 and 1: aborts both, re-produces 1's
    # checkpoint-1 transaction (its marker is missing) with 1's id and marker
    restored = _restore(sinks[0], 1, handles, subtask=0, parallelism=1)
    try:
        assert _marker(kafka, kafka_topic_name, 0) == 1
        assert _marker(kafka, kafka_topic_name, 1) == 1
        seen = _values(_read(kafka, kafka_topic_name, quiet_s=2.0))
        assert 99 in seen  # the lingering transactions ended: readers move past them
        # one new copy of 11, committed; the aborted 2, 12 and first 11 a real broker hides
        # from read_committed readers (Tansu does not, so they are not checked here)
        assert _values(_read(kafka, kafka_topic_name, committed=False, after=before)) == [11]
    finally:
        restored.close()


def test_the_test_broker_applies_a_marker_once_older_transactions_on_its_partitions_end(
    kafka: KafkaBroker, kafka_topic_name: str
) -> None:
    """Why the tests' exactly-once sinks that restore write one partition per subtask
    (tests/kit/kafka_broker.py): Tansu 0.6 applies a committed transaction's offsets only
    once no older transaction is open on a partition it wrote. Kafka applies them with the
    commit. If this starts failing, Tansu changed; the kit's note must change with it."""
    from confluent_kafka import Producer

    kafka.create_topic(kafka_topic_name, partitions=2)
    group, servers = f"{kafka_topic_name}-g", kafka.bootstrap_servers
    meta = Consumer({"bootstrap.servers": servers, "group.id": group})
    older, newer = (
        Producer({"bootstrap.servers": servers, "transactional.id": f"{kafka_topic_name}-{i}"})
        for i in range(2)
    )
    try:
        for producer in (older, newer):
            producer.init_transactions(10)
        older.begin_transaction()
        older.produce(kafka_topic_name, b"a", partition=0)
        older.flush(10)
        newer.begin_transaction()
        newer.produce(kafka_topic_name, b"b", partition=0)
        newer.send_offsets_to_transaction(
            [TopicPartition(kafka_topic_name, 0, 7)], meta.consumer_group_metadata(), 10
        )
        newer.commit_transaction(10)
        late = kafka_marker(kafka, group, kafka_topic_name)
        older.abort_transaction(10)
        assert (late, kafka_marker(kafka, group, kafka_topic_name)) == (-1001, 7)
    finally:
        meta.close()


def test_a_restore_reads_markers_the_other_subtasks_do_not_hold_back(
    kafka: KafkaBroker, kafka_topic_name: str, tmp_path: Path
) -> None:
    """Subtask 1 commits checkpoint 1 while subtask 0 (its own partition) still has open
    transactions, then the job fails: each restore reads its own marker right and only
    subtask 0's checkpoint-1 transaction is written again."""
    kafka.create_topic(kafka_topic_name, partitions=2)
    sinks, backends, handles = [], [], {}
    for i in range(2):
        backends.append(OperatorStateBackend())
        sinks.append(_exactly_once(kafka, kafka_topic_name, partitioner=KafkaPartitioner.fixed()))
        sinks[i].open(_ctx(backends[i], subtask=i, parallelism=2))
    for i, sink in enumerate(sinks):
        sink.process_batch(_rows([10 * i + 1]))
        handles[i] = _checkpoint(sink, backends[i], 1, tmp_path)
    for i, sink in enumerate(sinks):
        sink.process_batch(_rows([10 * i + 2]))  # open transactions when the job dies
    sinks[1].notify_checkpoint_complete(1)  # subtask 0 dies before its notice
    written = _read(kafka, kafka_topic_name, committed=False, expect=4)
    high = {p: max(r.offset for r in written if r.partition == p) for p in (0, 1)}
    restored = [_restore(sinks[i], 1, handles, subtask=i, parallelism=2) for i in range(2)]
    try:
        assert [_marker(kafka, kafka_topic_name, i) for i in range(2)] == [1, 1]
        again = [
            r
            for r in _read(kafka, kafka_topic_name, committed=False, quiet_s=1.0)
            if r.offset > high[r.partition]
        ]
        assert [(r.partition, r.value) for r in again] == [(0, 1)]
    finally:
        for sink in restored:
            sink.close()


# --- bad input --------------------------------------------------------------------------------


def test_a_broker_that_is_down_fails_open_after_bounded_attempts(kafka_topic_name: str) -> None:
    sink = KafkaSink(
        f"127.0.0.1:{free_port()}",
        kafka_topic_name,
        value="v",
        connect_attempts=2,
        connect_timeout_s=0.5,
    )
    started = time.monotonic()
    with pytest.raises(
        UnavailableError, match=r"brokers 127\.0\.0\.1:\d+ did not answer .* in 2 attempts"
    ):
        sink.open(_ctx(OperatorStateBackend()))
    assert time.monotonic() - started < 10
    sink.close()


def test_a_missing_topic_fails_open(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    sink = KafkaSink(kafka.bootstrap_servers, kafka_topic_name, value="v")
    with pytest.raises(ConfigError, match=r"does not exist.*create it first"):
        sink.open(_ctx(OperatorStateBackend()))
    sink.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"guarantee": "exactly_once"}, "needs transactional_id_prefix"),
        ({"transactional_id_prefix": "p"}, "exactly_once' only"),
        ({"guarantee": "twice"}, "guarantee must be one of"),
        ({"producer_config": {"transactional.id": "x"}}, "transactional_id_prefix="),
        ({"producer_config": {"transaction.timeout.ms": 1}}, "transaction_timeout_ms="),
        ({"producer_config": {"no.such.setting": 1}}, "No such configuration property"),
        ({"max_pending_transactions": 0}, "max_pending_transactions"),
        ({"connect_attempts": 0}, "connect_attempts"),
        ({"partitioner": "key"}, "KafkaPartitioner"),
        ({"value": 3}, "column name or a KafkaSerializer"),
    ],
)
def test_bad_settings_are_refused_when_the_sink_is_built(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        KafkaSink("127.0.0.1:9092", "t", **options)


def test_bad_names_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="topic"):
        KafkaSink("127.0.0.1:9092", "a topic")
    with pytest.raises(InvalidArgumentError, match="bootstrap_servers"):
        KafkaSink("", "t")

"""The Kafka sink: at least once, or exactly once with Kafka transactions (librdkafka through
``confluent-kafka``, imported when a sink is built or opened, so ``import snapflow`` stays
light).

KafkaSink
    Each row of a batch becomes one Kafka record: its value, key and headers encoded as
    :mod:`snapflow.worker.connectors.kafka_sink_encoding` says, its partition chosen by a
    :class:`~snapflow.worker.connectors.kafka_sink_settings.KafkaPartitioner`.

At least once
    Records are produced as rows arrive; ``snapshot_state`` (the barrier) waits until Kafka
    acknowledged every one of them (``acks=all``, idempotent producer), so the barrier passes
    only once every record before it is written. A delivery error fails the task, whose
    restore replays from the last completed checkpoint: records after it may be written twice.

Exactly once (the recovery contract)
    * One Kafka transaction per subtask per checkpoint: the records between two barriers go
      into one transaction. On the barrier of checkpoint ``n`` the sink flushes it and adds,
      inside it, the *marker*: an offset commit of a sink-owned consumer group whose offset is
      the transaction's sequence number (``send_offsets_to_transaction``). It is then
      pre-committed: the checkpoint keeps its records (operator state) and the next
      transaction opens on another producer.
    * On the completion notice of ``n`` it commits every pre-committed transaction of a
      checkpoint ``<= n``, oldest first, so a lost notice is covered by the next one. A
      ``read_committed`` reader sees a checkpoint's records once it completed and the notice
      reached the sink, and never before.
    * Transactional ids ``<transactional_id_prefix>-<operator id>-<subtask>-<slot>``: unique
      per sink and subtask, and per job when the prefix is (choose one per job; keep it when
      the job is restored from a checkpoint or savepoint).
    * A restore first aborts every lingering transaction of the subtasks it answers for: its
      own, and those a down-scale removed (old subtask ``s`` goes to new subtask
      ``s % parallelism``), by ``init_transactions`` on each of their ids, which also fences
      the producers of the failed run. Then it reads each one's marker and re-produces, each in
      a new transaction with its own marker, exactly the pre-committed transactions of the
      restored checkpoint whose marker is missing. So a checkpoint that completed survives a
      crash between its completion and its commit, with no loss and no duplicate; Flink
      resumes such a transaction by reflection into the Java client, which the Python client
      cannot do.
    * Bounded state: a subtask has ``max_pending_transactions + 1`` producers (slots); the
      checkpoint keeps the records of at most ``max_pending_transactions`` pre-committed
      transactions, each one checkpoint interval of output. When every slot is taken
      (completion notices stopped arriving) the task fails. A job without periodic
      checkpoints is refused at submission (:meth:`KafkaSink.check_job`), as is a
      ``transaction_timeout_ms`` too short for its checkpointing
      (:mod:`snapflow.worker.connectors.kafka_sink_settings`).
    * What rests on the broker (docs/kafka.md): that ``read_committed`` readers skip aborted
      records, that ``init_transactions`` fences a zombie producer of the same id, that the
      marker commits atomically with the records, and the transaction timeout.

Bad input: a broker that does not answer at ``open`` fails it after ``connect_attempts``
bounded attempts naming the servers (``kafka_config.retry_broker_call``, as the source); a topic that does not exist fails ``open`` (the sink
never creates topics); settings it owns or librdkafka does not know are refused when the sink
is built.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import pyarrow as pa

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.errors import ConfigError, InvalidArgumentError, SnapflowError, StateError
from snapflow.worker.connectors.kafka_config import (
    KafkaClientSettings,
    PropertyValue,
    confluent_kafka,
    retry_broker_call,
)
from snapflow.worker.connectors.kafka_sink_encoding import KafkaSerializer, headers_of
from snapflow.worker.connectors.kafka_sink_settings import (
    RESERVED_PROPERTIES,
    DeliveryGuarantee,
    KafkaPartitioner,
    check_exactly_once_job,
    parse_guarantee,
)
from snapflow.worker.connectors.kafka_sink_transactions import (
    SubtaskRecord,
    SubtaskTransactions,
    Txn,
    marker_group,
    next_sequence,
    recovered_by,
    slots_to_abort,
    to_reproduce,
    transactional_id,
)
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.state import arrow_pickling

__all__ = ["KafkaSink", "KafkaSinkError"]

_STATE_VERSION = 1
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_RECORDS = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("partition", pa.int32()),
        ("headers", _HEADERS),
    ]
)
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_UNASSIGNED = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses
_MAX_ERRORS_KEPT = 5


class KafkaSinkError(SnapflowError):
    """Kafka did not take records the sink produced (delivery errors, a commit that failed)."""


def _kafka_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value) or len(value) > 200:
        raise InvalidArgumentError(
            f"KafkaSink {what} must be 1..200 characters of letters, digits, '.', '_' and '-', "
            f"got {value!r:.80}"
        )
    return value


def _positive(what: str, value: object, *, maximum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgumentError(f"KafkaSink {what} must be a number > 0, got {value!r:.80}")
    if maximum is not None and value > maximum:
        raise InvalidArgumentError(f"KafkaSink {what} must be <= {maximum:g}, got {value!r}")
    return value


class KafkaSink(Operator):
    """Writes rows to a Kafka topic, at least once or exactly once (see the module docstring).

    ``value``, ``key``: a column name or a :class:`KafkaSerializer` (default value: a JSON
    object of every column; default key: none). ``headers``: a column of headers.
    ``partitioner``: :class:`KafkaPartitioner` (default: by key, murmur2 as Java's default
    partitioner). ``guarantee``: ``"at_least_once"`` (default) or ``"exactly_once"``, which
    needs ``transactional_id_prefix`` (unique per job and stable across its restores).
    ``transaction_timeout_ms``: Kafka's ``transaction.timeout.ms`` (default 15 minutes, the
    broker's default maximum). ``max_pending_transactions``: pre-committed transactions a
    subtask may hold before it fails. ``producer_config``: more librdkafka properties
    (:class:`~snapflow.worker.connectors.kafka_config.KafkaClientSettings`; those the sink
    sets itself are refused).
    ``connect_attempts`` of ``connect_timeout_s`` each reach the broker at ``open``;
    ``operation_timeout_s`` bounds each flush, commit and transactional call."""

    _partitions: int
    _next_partition: int
    _runtime_fields: tuple[str, ...] = (
        "_producer",
        "_producers",
        "_txns",
        "_current_records",
        "_pending_records",
        "_state",
        "_marker",
        "_errors",
        "_failed",
        "_partitions",
        "_next_partition",
    )

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        value: KafkaSerializer | str | None = None,
        key: KafkaSerializer | str | None = None,
        headers: str | None = None,
        partitioner: KafkaPartitioner | None = None,
        guarantee: DeliveryGuarantee | str = DeliveryGuarantee.AT_LEAST_ONCE,
        transactional_id_prefix: str | None = None,
        transaction_timeout_ms: int = 900_000,
        max_pending_transactions: int = 3,
        producer_config: Mapping[str, PropertyValue] | None = None,
        connect_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        operation_timeout_s: float = 60.0,
    ) -> None:
        self.settings = KafkaClientSettings(bootstrap_servers, dict(producer_config or {}))
        self.settings.refuse(RESERVED_PROPERTIES)
        self.topic = _kafka_name("topic", topic)
        self.value = (
            KafkaSerializer.of(value, "value") if value is not None else KafkaSerializer.json()
        )
        self.key = KafkaSerializer.of(key, "key") if key is not None else None
        if headers is not None and (not isinstance(headers, str) or not headers):
            raise InvalidArgumentError(
                f"KafkaSink headers must be a column name, got {headers!r:.80}"
            )
        self.headers = headers
        partitioner = partitioner if partitioner is not None else KafkaPartitioner.by_key()
        if not isinstance(partitioner, KafkaPartitioner):
            raise InvalidArgumentError(
                f"KafkaSink partitioner must be a KafkaPartitioner (by_key, fixed, round_robin), "
                f"got {partitioner!r:.80}"
            )
        self.partitioner = partitioner
        self.guarantee = parse_guarantee(guarantee)
        if self.guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            if transactional_id_prefix is None:
                raise InvalidArgumentError(
                    "KafkaSink(guarantee='exactly_once') needs transactional_id_prefix=..., "
                    "unique per job (two jobs sharing one fence each other's transactions) "
                    "and the same when the job is restored"
                )
            self.transactional_id_prefix: str | None = _kafka_name(
                "transactional_id_prefix", transactional_id_prefix
            )
        elif transactional_id_prefix is not None:
            raise InvalidArgumentError(
                "KafkaSink: transactional_id_prefix is for guarantee='exactly_once' only"
            )
        else:
            self.transactional_id_prefix = None
        self.transaction_timeout_ms = int(
            _positive("transaction_timeout_ms", transaction_timeout_ms, maximum=2**31 - 1)
        )
        if (
            isinstance(max_pending_transactions, bool)
            or not isinstance(max_pending_transactions, int)
            or not 1 <= max_pending_transactions <= 64
        ):
            raise InvalidArgumentError(
                f"KafkaSink max_pending_transactions must be an integer in 1..64, got "
                f"{max_pending_transactions!r:.80}"
            )
        self.max_pending_transactions = max_pending_transactions
        if (
            isinstance(connect_attempts, bool)
            or not isinstance(connect_attempts, int)
            or not (1 <= connect_attempts <= 100)
        ):
            raise InvalidArgumentError(
                f"KafkaSink connect_attempts must be an integer in 1..100, got {connect_attempts!r:.80}"
            )
        self.connect_attempts = connect_attempts
        self.connect_timeout_s = _positive("connect_timeout_s", connect_timeout_s, maximum=600)
        self.operation_timeout_s = _positive(
            "operation_timeout_s", operation_timeout_s, maximum=3600
        )
        self.settings.check_producer(self._config(None))

    # --- job check -------------------------------------------------------------------------

    def check_job(self, config: CheckpointConfig) -> None:
        if self.guarantee is DeliveryGuarantee.EXACTLY_ONCE:
            check_exactly_once_job(
                config, self.transaction_timeout_ms, self.max_pending_transactions
            )

    # --- producers -------------------------------------------------------------------------

    def _config(self, txn_id: str | None) -> dict[str, PropertyValue]:
        """The producer properties the sink sets itself (``RESERVED_PROPERTIES``)."""
        config: dict[str, PropertyValue] = {
            "acks": "all",
            "enable.idempotence": True,
        }
        if self.partitioner.kind == "key":
            config["partitioner"] = self.partitioner.hash
        if txn_id is not None:
            config["transactional.id"] = txn_id
            config["transaction.timeout.ms"] = self.transaction_timeout_ms
        return config

    def _new_producer(self, txn_id: str | None) -> Any:
        config = self.settings.config(self._config(txn_id))
        return confluent_kafka().Producer({**config, "on_delivery": self._on_delivery})

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._failed += 1
            if len(self._errors) < _MAX_ERRORS_KEPT:
                self._errors.append(f"partition {msg.partition()}: {err}")

    def _raise_delivery_errors(self) -> None:
        if self._failed:
            raise KafkaSinkError(
                f"{self.name}: {self._failed} record(s) could not be written to topic "
                f"{self.topic!r}: {'; '.join(self._errors)}"
            )

    def _flush(self, producer: Any) -> None:
        """Wait until Kafka acknowledged every record produced so far; raise on any error."""
        left = producer.flush(self.operation_timeout_s)
        self._raise_delivery_errors()
        if left:
            raise KafkaSinkError(
                f"{self.name}: {left} record(s) not acknowledged by {self.settings.bootstrap_servers} "
                f"within {self.operation_timeout_s:g} s"
            )

    def _connect(self) -> int:
        """The topic's partition count; bounded attempts to reach the broker."""
        probe = self._new_producer(None)
        metadata = retry_broker_call(
            lambda: probe.list_topics(timeout=self.connect_timeout_s),
            f"{self.name} listing topics, {self.connect_timeout_s:g} s each",
            bootstrap_servers=self.settings.bootstrap_servers,
            attempts=self.connect_attempts,
            backoff_s=0.2,
            max_backoff_s=5.0,
        )
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            servers = self.settings.bootstrap_servers
            raise ConfigError(
                f"{self.name}: topic {self.topic!r} does not exist on {servers}: "
                f"create it first (the sink never creates topics)"
            )
        return len(topic.partitions)

    # --- encoding and producing ------------------------------------------------------------

    def _encode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        keys = self.key.encode(batch) if self.key is not None else pa.nulls(n, pa.binary())
        values = self.value.encode(batch)
        kind = self.partitioner.kind
        if kind == "key":
            partitions = pa.array([_UNASSIGNED] * n, pa.int32())
        elif kind == "fixed":
            fixed = self._context().subtask_index % self._partitions
            partitions = pa.array([fixed] * n, pa.int32())
        else:
            start = self._next_partition
            partitions = pa.array([(start + i) % self._partitions for i in range(n)], pa.int32())
            self._next_partition = (start + n) % self._partitions
        if self.headers is not None:
            cells = headers_of(batch, self.headers)
            headers = pa.array(
                [None if c is None else [{"key": k, "value": v} for k, v in c] for c in cells],
                _HEADERS,
            )
        else:
            headers = pa.nulls(n, _HEADERS)
        return pa.RecordBatch.from_arrays([keys, values, partitions, headers], schema=_RECORDS)

    def _produce(self, producer: Any, records: pa.RecordBatch) -> None:
        keys = records.column(0).to_pylist()
        values = records.column(1).to_pylist()
        partitions = records.column(2).to_pylist()
        headers = records.column(3).to_pylist()
        produce = producer.produce
        for i in range(records.num_rows):
            h = headers[i]
            kwargs: dict[str, Any] = {"key": keys[i], "partition": partitions[i]}
            if h:
                kwargs["headers"] = [(p["key"], p["value"]) for p in h]
            while True:
                try:
                    produce(self.topic, values[i], **kwargs)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
        producer.poll(0)
        self._raise_delivery_errors()

    # --- operator ----------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._errors: list[str] = []
        self._failed = 0
        self._next_partition = ctx.subtask_index
        self._producer: Any = None
        self._producers: dict[int, Any] = {}
        self._marker: Any = None
        self._partitions = self._connect()
        if self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
            self._producer = self._new_producer(None)
        else:
            self._open_transactions(ctx)

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if not batch.num_rows:
            return []
        records = self._encode(batch)
        if self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
            self._produce(self._producer, records)
        else:
            txn = self._txns.current
            if txn is None:
                raise StateError(f"{self.name}: no open transaction (closed?)")
            self._produce(self._producers[txn.slot], records)
            self._current_records.append(records)
        return []

    def snapshot_state(self, checkpoint_id: int) -> None:
        if self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
            self._flush(self._producer)
        else:
            self._pre_commit(checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
            return
        for txn in self._txns.to_commit(checkpoint_id):
            self._commit(self._producers[txn.slot], txn)
            self._txns.committed(txn)
            self._pending_records.pop(txn.sequence, None)

    def end_input(self) -> list[pa.RecordBatch]:
        if self.guarantee is DeliveryGuarantee.AT_LEAST_ONCE:
            self._flush(self._producer)
        return []

    def close(self) -> None:
        # Pre-committed transactions stay open: a later notice commits them, or a restore
        # aborts and re-produces them. The current one is aborted (the replay rewrites it).
        txns: SubtaskTransactions | None = getattr(self, "_txns", None)
        producers: dict[int, Any] = getattr(self, "_producers", {})
        if txns is not None and txns.current is not None:
            producer = producers.get(txns.current.slot)
            txns.current = None
            if producer is not None:
                with suppress(Exception):
                    producer.abort_transaction(min(self.operation_timeout_s, 10.0))
        marker = getattr(self, "_marker", None)
        if marker is not None:
            with suppress(Exception):
                marker.close()
        self._marker = None
        self._producers = {}
        self._producer = None

    # --- exactly once ------------------------------------------------------------------------

    @property
    def transactions(self) -> SubtaskTransactions:
        """This (opened, exactly-once) subtask's transactions."""
        return self._txns

    def _txn_id(self, subtask: int, slot: int) -> str:
        assert self.transactional_id_prefix is not None
        return transactional_id(
            self.transactional_id_prefix, self._context().operator_id, subtask, slot
        )

    def _marker_consumer(self, subtask: int) -> Any:
        assert self.transactional_id_prefix is not None
        group = marker_group(self.transactional_id_prefix, self._context().operator_id, subtask)
        # Only the connection properties (brokers, security): the user's are a producer's.
        return confluent_kafka().Consumer(
            self.settings.connection_config({"group.id": group, "enable.auto.commit": False})
        )

    def _read_marker(self, consumer: Any) -> int | None:
        (tp,) = consumer.committed(
            [confluent_kafka().TopicPartition(self.topic, 0)], timeout=self.operation_timeout_s
        )
        if tp.error is not None:
            raise KafkaSinkError(f"{self.name}: cannot read the marker: {tp.error}")
        return int(tp.offset) if tp.offset >= 0 else None

    def _add_marker(self, producer: Any, consumer: Any, sequence: int) -> None:
        producer.send_offsets_to_transaction(
            [confluent_kafka().TopicPartition(self.topic, 0, sequence)],
            consumer.consumer_group_metadata(),
            self.operation_timeout_s,
        )

    def _commit(self, producer: Any, txn: Txn) -> None:
        try:
            producer.commit_transaction(self.operation_timeout_s)
        except Exception as e:
            raise KafkaSinkError(
                f"{self.name}: commit of checkpoint {txn.checkpoint_id}'s transaction "
                f"(sequence {txn.sequence}) failed: {e}; a restore re-produces it"
            ) from e

    def _open_transactions(self, ctx: OperatorContext) -> None:
        self._state = ctx.operator_state.get_union_list_state(ctx.state_name("kafka-txns"))
        restored: dict[int, tuple[SubtaskRecord, dict[int, list[pa.RecordBatch]]]] = {}
        for blob in self._state.get() if ctx.is_restored else []:
            try:
                version, record, records = pickle.loads(blob)
            except Exception as e:
                raise StateError(f"{self.name}: unreadable transaction state: {e!r}") from e
            if version != _STATE_VERSION:
                raise StateError(f"{self.name}: transaction state version {version} unknown")
            restored[record.subtask] = (record, records)
        own = ctx.subtask_index
        slots = self.max_pending_transactions + 1
        mine = recovered_by(own, ctx.parallelism, (r for r, _ in restored.values()))
        # 1. Abort every lingering transaction of the ids this subtask answers for (this also
        #    fences the producers of the failed run), before reading any marker.
        others: dict[tuple[int, int], Any] = {}
        for subtask, count in slots_to_abort(own, slots, mine).items():
            for slot in range(count):
                producer = self._new_producer(self._txn_id(subtask, slot))
                producer.init_transactions(self.operation_timeout_s)
                if subtask == own and slot < slots:
                    self._producers[slot] = producer
                else:
                    others[(subtask, slot)] = producer
        # 2. Re-produce the pre-committed transactions whose marker is missing, in order.
        self._marker = self._marker_consumer(own)
        own_marker = self._read_marker(self._marker)
        for record in mine:
            consumer = (
                self._marker if record.subtask == own else self._marker_consumer(record.subtask)
            )
            try:
                marker = own_marker if record.subtask == own else self._read_marker(consumer)
                for txn in to_reproduce(record, marker):
                    producer = (
                        self._producers[txn.slot]
                        if record.subtask == own and txn.slot < slots
                        else others[(record.subtask, txn.slot)]
                    )
                    producer.begin_transaction()
                    for batch in restored[record.subtask][1].get(txn.sequence, []):
                        self._produce(producer, batch)
                    self._flush(producer)
                    self._add_marker(producer, consumer, txn.sequence)
                    self._commit(producer, txn)
                    if record.subtask == own:
                        own_marker = txn.sequence
            finally:
                if consumer is not self._marker:
                    consumer.close()
        others.clear()
        own_record = restored[own][0] if own in restored else None
        self._txns = SubtaskTransactions(own, slots, next_sequence(own_record, own_marker))
        self._pending_records: dict[int, list[pa.RecordBatch]] = {}
        self._state.clear()
        self._begin()

    def _begin(self) -> None:
        txn = self._txns.begin()
        self._producers[txn.slot].begin_transaction()
        self._current_records: list[pa.RecordBatch] = []

    def _pre_commit(self, checkpoint_id: int) -> None:
        txn = self._txns.current
        if txn is None:
            raise StateError(f"{self.name}: no open transaction (closed?)")
        producer = self._producers[txn.slot]
        self._flush(producer)
        self._add_marker(producer, self._marker, txn.sequence)
        pending = self._txns.pre_commit(checkpoint_id)
        self._pending_records[pending.sequence] = self._current_records
        self._begin()
        record = self._txns.record()
        kept = {t.sequence: self._pending_records.get(t.sequence, []) for t in record.pending}
        self._state.update([arrow_pickling.dumps((_STATE_VERSION, record, kept))])

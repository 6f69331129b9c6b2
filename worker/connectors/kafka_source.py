"""A checkpointed Kafka source (Flink's ``KafkaSource``: one split per topic-partition, the next
offset to read of each split in the checkpoint).

* **Splits.** Every subtask lists the subscribed topics' partitions and reads those it owns
  (``kafka_splits.split_owner``, Flink's ``getSplitOwner``), through one ``assign``-ed consumer:
  no consumer-group membership, no rebalance. The splits are operator *union* list state: on a
  restore every subtask sees every split of the checkpoint and resumes those it owns at the
  current parallelism, so a restore or a rescale reads every partition from exactly where the
  checkpoint left it. Offsets stored in Kafka are never read back after a start.
* **Start and stop** (``kafka_positions``): a fresh start reads each partition from ``start``;
  partitions new to a restored job, and partitions discovered later, from the earliest offset.
  ``stop`` makes the source bounded: each split ends at its stop offset (resolved when the job
  first reads it) and the source ends once all have, so the job can finish and take its final
  checkpoint. A bounded source does not discover partitions (as in Flink).
* **Discovery.** Unbounded, every ``discovery_interval_ms`` each subtask lists the partitions
  again (and, with a pattern, the topics) and starts those it owns and does not read yet.
* **Committed offsets.** With a ``group_id``, the offsets of a checkpoint are committed to the
  group asynchronously when the checkpoint completes (for lag monitoring only); a failed commit
  is logged and counted (``commits_failed``), never fails the job.
* **Records** (``kafka_records``): key, value columns, topic, partition, offset, timestamp and
  optionally headers; undecodable values fail the task with their topic, partition and offset,
  or are skipped and counted (``records_skipped``).
* **Event time.** ``event_time``: ``"kafka"`` (the record's Kafka timestamp) or a column of the
  output (int64 milliseconds or a timestamp). Each split has its bounded out-of-orderness
  watermark; the source's watermark is the minimum over its unfinished splits that are not
  idle (no records for ``idle_timeout_ms``), and never goes back. The same ``idle_timeout_ms``
  makes the whole subtask idle downstream (``SourceOperator.idle_timeout_ms``); a subtask that
  owns no split is idle at once.
* **Backpressure.** The consumer is asked for records only in ``poll_batch``, which the source
  loop calls only when the outputs have room (``consume(n, timeout)``: at most
  ``min(max_records, batch_size)`` records, waiting at most ``poll_timeout_ms``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from snapflow.errors import InvalidArgumentError, NotFoundError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.connectors.kafka_config import (
    KafkaClientSettings,
    PropertyValue,
    confluent_kafka,
    retry_broker_call,
)
from snapflow.worker.connectors.kafka_positions import (
    KafkaStart,
    KafkaStop,
    resolve_start,
    resolve_stop,
)
from snapflow.worker.connectors.kafka_records import (
    DEFAULT_METADATA,
    KafkaValueFormat,
    RecordDecoder,
)
from snapflow.worker.connectors.kafka_splits import (
    KafkaSplit,
    TopicPartition,
    new_splits,
    plan_splits,
    select_topics,
)
from snapflow.worker.runtime.operator import OperatorContext, SourceOperator
from snapflow.worker.runtime.watermarks import BoundedOutOfOrdernessWatermarks
from snapflow.worker.state.operator_state import OperatorListState

__all__ = ["KafkaSource"]

log = structlog.get_logger("snapflow.worker")

RESERVED_PROPERTIES = {
    "group.id": "give the group as group_id",
    "enable.auto.commit": "offsets are committed when checkpoints complete",
    "enable.auto.offset.store": "offsets are committed when checkpoints complete",
    "auto.offset.reset": "give the start position as start=KafkaStart...",
    "enable.partition.eof": "the source sets it (bounded splits end at it)",
    "on_commit": "the source counts failed offset commits itself (commits_failed)",
}

PLACEHOLDER_GROUP = "snapflow-kafka-source"
"""librdkafka's consumer needs a group id; without ``group_id`` the source never uses it (it
assigns partitions itself and commits nothing)."""


class KafkaSource(SourceOperator):
    """Records of Kafka topics, exactly once through checkpoints (module docstring)."""

    _runtime_fields = (
        "_consumer",
        "_splits",
        "_watermarks",
        "_active_at",
        "_split_state",
        "_started_state",
        "_pending_commits",
        "_next_discovery",
        "_watermark",
        "_one_topic",
        "_decoder",
        "_error_codes",
    )

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        topics: str | Sequence[str] | None = None,
        topic_pattern: str | None = None,
        group_id: str | None = None,
        start: KafkaStart | None = None,
        stop: KafkaStop | None = None,
        value_format: KafkaValueFormat | None = None,
        key_format: Literal["bytes", "utf-8"] = "bytes",
        metadata: Sequence[str] = DEFAULT_METADATA,
        on_undecodable: Literal["fail", "skip"] = "fail",
        event_time: str | None = None,
        max_out_of_orderness_ms: int = 0,
        idle_timeout_ms: int | None = None,
        discovery_interval_ms: int | None = 30_000,
        batch_size: int = 65_536,
        poll_timeout_ms: int = 10,
        properties: Mapping[str, PropertyValue] | None = None,
        connect_attempts: int = 5,
        request_timeout_s: float = 5.0,
    ) -> None:
        self.settings = KafkaClientSettings(bootstrap_servers, dict(properties or {}))
        self.settings.refuse(RESERVED_PROPERTIES)
        if isinstance(topics, str):
            topics = [topics]
        if (topics is None) == (topic_pattern is None):
            raise InvalidArgumentError("give the topics either as topics=[...] or topic_pattern")
        if topics is not None and (not topics or not all(isinstance(t, str) and t for t in topics)):
            raise InvalidArgumentError(f"topics must be non-empty topic names, got {topics!r}")
        try:
            self.pattern = None if topic_pattern is None else re.compile(topic_pattern)
        except re.error as exc:
            raise InvalidArgumentError(f"topic_pattern {topic_pattern!r}: {exc}") from exc
        self.topics = None if topics is None else tuple(topics)
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise InvalidArgumentError(f"group_id must be a non-empty string, got {group_id!r}")
        self.group_id = group_id
        self.start = start if start is not None else KafkaStart.earliest()
        if not isinstance(self.start, KafkaStart):
            raise InvalidArgumentError(f"start must be a KafkaStart, got {start!r:.60}")
        if self.start.kind == "committed" and group_id is None:
            raise InvalidArgumentError("start=KafkaStart.committed() needs a group_id")
        if stop is not None and not isinstance(stop, KafkaStop):
            raise InvalidArgumentError(f"stop must be a KafkaStop or None, got {stop!r:.60}")
        self.stop = stop
        self.decoder_config = RecordDecoder(
            value_format if value_format is not None else KafkaValueFormat.bytes(),
            metadata=metadata,
            key_format=key_format,
            on_undecodable=on_undecodable,
        )
        self.output_schema = self.decoder_config.schema
        if event_time is not None and event_time != "kafka":
            index = self.output_schema.get_field_index(event_time)
            kind = self.output_schema.field(event_time).type if index >= 0 else None
            if kind is None or not (pa.types.is_integer(kind) or pa.types.is_timestamp(kind)):
                raise InvalidArgumentError(
                    f"event_time is 'kafka' (the record timestamp) or an integer (ms) or "
                    f"timestamp column of {self.output_schema.names}, got {event_time!r}"
                )
        self.event_time = event_time
        for name, value, low in (
            ("max_out_of_orderness_ms", max_out_of_orderness_ms, 0),
            ("batch_size", batch_size, 1),
            ("poll_timeout_ms", poll_timeout_ms, 0),
            ("connect_attempts", connect_attempts, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidArgumentError(f"{name} must be an integer >= {low}, got {value!r}")
        for name, optional in (
            ("idle_timeout_ms", idle_timeout_ms),
            ("discovery_interval_ms", discovery_interval_ms),
        ):
            if optional is not None and (not isinstance(optional, int) or optional < 1):
                raise InvalidArgumentError(f"{name} must be an integer >= 1 or None")
        if not request_timeout_s > 0:
            raise InvalidArgumentError(f"request_timeout_s must be > 0, got {request_timeout_s!r}")
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.discovery_interval_ms = discovery_interval_ms
        self.batch_size = batch_size
        self.poll_timeout_ms = poll_timeout_ms
        self.connect_attempts = connect_attempts
        self.request_timeout_s = request_timeout_s
        self.settings.check_consumer(self._owned_properties())
        self.commits_failed = 0
        self.commits_done = 0
        self.records_skipped = 0
        self.consumer_errors = 0

    @property
    def bounded(self) -> bool:
        return self.stop is not None

    def _owned_properties(self) -> dict[str, PropertyValue]:
        return {
            "group.id": self.group_id or PLACEHOLDER_GROUP,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",  # a restored offset retention deleted: the earliest
            "enable.partition.eof": True,
        }

    # --- life cycle -------------------------------------------------------------------------

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        ck = confluent_kafka()
        self._decoder = self.decoder_config
        self._error_codes = (
            ck.KafkaError._PARTITION_EOF,
            (
                ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
                ck.KafkaError._UNKNOWN_PARTITION,
                ck.KafkaError._UNKNOWN_TOPIC,
            ),
        )
        conf = self.settings.config(self._owned_properties())
        conf["on_commit"] = self._on_commit
        self._consumer: Any = ck.Consumer(conf)
        self._split_state: OperatorListState[Any] = ctx.operator_state.get_union_list_state(
            ctx.state_name("kafka-splits")
        )
        self._started_state: OperatorListState[Any] = ctx.operator_state.get_union_list_state(
            ctx.state_name("kafka-started")
        )
        self._pending_commits: dict[int, list[tuple[str, int, int]]] = {}
        self._watermark = MIN_WATERMARK
        restored = ctx.is_restored and bool(self._started_state.get())
        entries = self._split_state.get() if restored else None
        topics, partitions = self._list_partitions(at_start=True)
        plan = plan_splits(
            partitions,
            None if entries is None else [KafkaSplit.from_entry(e) for e in entries],
            topics if not restored or self.topics is None else self.topics,
            ctx.subtask_index,
            ctx.parallelism,
        )
        started = plan.started
        if restored and self.bounded:
            started = []  # a bounded input is the partitions of its start
        self._splits: dict[TopicPartition, KafkaSplit] = {s.tp: s for s in plan.resumed}
        self._watermarks: dict[TopicPartition, BoundedOutOfOrdernessWatermarks] = {}
        self._active_at: dict[TopicPartition, float] = {}
        self._start_splits(started, KafkaStart.earliest() if restored else self.start)
        self._next_discovery = self._discovery_due()
        self._assign()

    def _discovery_due(self) -> float | None:
        if self.bounded or self.discovery_interval_ms is None:
            return None
        return time.monotonic() + self.discovery_interval_ms / 1000

    def _list_partitions(self, *, at_start: bool) -> tuple[list[str], list[TopicPartition]]:
        """The subscribed topics and their partitions, as the brokers list them now."""
        ck = confluent_kafka()
        metadata = retry_broker_call(
            lambda: self._consumer.list_topics(timeout=self.request_timeout_s),
            "listing topics",
            bootstrap_servers=self.settings.bootstrap_servers,
            attempts=self.connect_attempts if at_start else 1,
            backoff_s=min(1.0, self.request_timeout_s),
        )
        available = {
            name: t for name, t in metadata.topics.items() if t.error is None or not at_start
        }
        if at_start and self.topics is not None:
            missing = sorted(set(self.topics) - set(available))
            if missing:
                raise NotFoundError(
                    f"KafkaSource: topic {missing[0]!r} does not exist on "
                    f"{self.settings.bootstrap_servers}"
                    + (f" (nor {missing[1:]})" if len(missing) > 1 else "")
                    + "; create it or fix topics="
                )
        del ck
        topics = select_topics(available, self.topics, self.pattern)
        partitions = [(t, p) for t in topics for p in available[t].partitions]
        return topics, partitions

    def _start_splits(self, tps: list[TopicPartition], start: KafkaStart) -> None:
        if not tps:
            return
        lookup = _ConsumerLookup(self._consumer, self.request_timeout_s)
        offsets = self._retry(lambda: resolve_start(start, tps, lookup), "start offsets")
        stops: dict[TopicPartition, int] = {}
        if self.stop is not None:
            stop = self.stop
            stops = self._retry(lambda: resolve_stop(stop, tps, lookup), "stop offsets")
        for tp in tps:
            self._splits[tp] = KafkaSplit(tp[0], tp[1], offsets[tp], stops.get(tp))
        log.info(
            "kafka_source.splits_started",
            operator=self._context().operator_id,
            subtask=self._context().subtask_index,
            splits=[f"{t}-{p}@{offsets[(t, p)]}" for t, p in tps][:50],
        )

    def _retry(
        self, lookup: Callable[[], dict[TopicPartition, int]], what: str
    ) -> dict[TopicPartition, int]:
        return retry_broker_call(
            lookup,
            f"looking up {what}",
            bootstrap_servers=self.settings.bootstrap_servers,
            attempts=self.connect_attempts,
            backoff_s=min(1.0, self.request_timeout_s),
        )

    def _assign(self) -> None:
        """Assign every unfinished split at its next offset (fetching resumes there)."""
        ck = confluent_kafka()
        now = time.monotonic()
        live = [s for s in self._splits.values() if not s.finished]
        for split in self._splits.values():
            if split.tp not in self._watermarks:
                wm = BoundedOutOfOrdernessWatermarks(self.max_out_of_orderness_ms)
                wm.restore(split.max_timestamp)
                self._watermarks[split.tp] = wm
            self._active_at.setdefault(split.tp, now)
        self._consumer.assign(
            [ck.TopicPartition(s.topic, s.partition, s.next_offset) for s in live]
        )
        topics = {s.topic for s in self._splits.values()}
        self._one_topic = next(iter(topics)) if len(topics) == 1 else None

    def close(self) -> None:
        consumer = getattr(self, "_consumer", None)
        if consumer is not None:
            self._consumer = None
            consumer.close()

    @property
    def splits(self) -> list[tuple[str, int, int, int | None]]:
        """``(topic, partition, next_offset, stop_offset)`` of the splits this subtask reads."""
        return [
            (s.topic, s.partition, s.next_offset, s.stop_offset)
            for s in sorted(self._splits.values(), key=lambda s: s.tp)
        ]

    # --- checkpoints ------------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> None:
        for tp, split in self._splits.items():
            split.max_timestamp = self._watermarks[tp].snapshot()
        self._split_state.update([s.entry() for s in self._splits.values()])
        self._started_state.update([True])
        self._pending_commits[checkpoint_id] = [
            (s.topic, s.partition, s.next_offset) for s in self._splits.values()
        ]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        offsets = self._pending_commits.pop(checkpoint_id, None)
        for older in [c for c in self._pending_commits if c < checkpoint_id]:
            del self._pending_commits[older]  # covered by this one
        if offsets is None or self.group_id is None or not offsets:
            return
        ck = confluent_kafka()
        try:
            self._consumer.commit(
                offsets=[ck.TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=True
            )
        except ck.KafkaException as exc:
            self._commit_failed(checkpoint_id, exc)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._pending_commits.pop(checkpoint_id, None)

    def _on_commit(self, error: Any, partitions: list[Any]) -> None:
        failed = [p for p in partitions or () if p.error is not None]
        if error is not None or failed:
            self._commit_failed(None, error or failed[0].error)
        else:
            self.commits_done += 1

    def _commit_failed(self, checkpoint_id: int | None, error: Any) -> None:
        self.commits_failed += 1
        log.warning(
            "kafka_source.commit_failed",
            group=self.group_id,
            checkpoint_id=checkpoint_id,
            error=str(error),
            failed=self.commits_failed,
        )

    # --- reading ----------------------------------------------------------------------------

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        self._context()
        if self._next_discovery is not None and time.monotonic() >= self._next_discovery:
            self._discover()
        if self.bounded and all(s.finished for s in self._splits.values()):
            return None
        wanted = min(max(0, int(max_records)), self.batch_size)
        if wanted == 0 or not self._splits:
            return self._decoder.empty()
        messages = self._consumer.consume(wanted, self.poll_timeout_ms / 1000)
        if not messages:
            return self._decoder.empty()
        errors = [m for m in messages if m.error() is not None]
        if errors:
            messages = [m for m in messages if m.error() is None]
            self._on_errors(errors)
        if not messages:
            self._unassign_finished()
            return self._decoder.empty()
        batch = self._take(messages)
        self._unassign_finished()
        return batch

    def _take(self, messages: list[Any]) -> pa.RecordBatch:
        """Decode ``messages``, advance their splits, feed their watermarks."""
        timestamps_needed = self.event_time == "kafka"
        decoded = self._decoder.decode(messages, self._one_topic, timestamps_needed)
        self.records_skipped += decoded.skipped
        n = len(messages)
        topics = (
            pa.nulls(n, pa.string()).fill_null(self._one_topic)
            if decoded.topics is None
            else pa.array(decoded.topics, pa.string())
        )
        table = pa.table({"t": topics, "p": decoded.partitions, "o": decoded.offsets})
        ends = table.group_by(["t", "p"]).aggregate([("o", "max")])
        last = list(zip(*(ends.column(c).to_pylist() for c in ("t", "p", "o_max")), strict=True))
        kept = decoded.kept
        if any(self._past_end((t, p), o) for t, p, o in last):
            # records past a bounded split's end (or of a split no longer read): dropped
            mask = pa.array(
                [
                    not self._past_end((t, p), o)
                    for t, p, o in zip(
                        topics.to_pylist(),
                        decoded.partitions.to_pylist(),
                        decoded.offsets.to_pylist(),
                        strict=True,
                    )
                ],
                pa.bool_(),
            )
            kept = mask if kept is None else pc.and_(kept, mask)
        for t, p, o in last:
            split = self._splits.get((t, p))
            if split is not None:
                end = o + 1 if split.stop_offset is None else min(o + 1, split.stop_offset)
                split.next_offset = max(split.next_offset, end)
        batch = decoded.batch if kept is None else decoded.batch.filter(kept)
        if self.event_time is not None:
            times = (
                decoded.timestamps
                if self.event_time == "kafka"
                else decoded.batch.column(self.event_time)
            )
            assert times is not None
            if pa.types.is_timestamp(times.type):
                times = pc.cast(pc.cast(times, pa.timestamp("ms", times.type.tz)), pa.int64())
            events = pa.table(
                {"t": topics, "p": decoded.partitions, "e": pc.cast(times, pa.int64())}
            )
            if kept is not None:
                events = events.filter(kept)
            tops = events.group_by(["t", "p"]).aggregate([("e", "max")])
            now = time.monotonic()
            for t, p, e in zip(
                *(tops.column(c).to_pylist() for c in ("t", "p", "e_max")), strict=True
            ):
                self._active_at[(t, p)] = now
                if e is not None:
                    self._watermarks[(t, p)].on_timestamp(int(e))
        return batch

    def _past_end(self, tp: TopicPartition, offset: int) -> bool:
        split = self._splits.get(tp)
        return split is None or (split.stop_offset is not None and offset >= split.stop_offset)

    def _on_errors(self, errors: list[Any]) -> None:
        eof, unknown = self._error_codes
        for message in errors:
            error = message.error()
            tp = (message.topic(), message.partition())
            if error.code() == eof:
                split = self._splits.get(tp)
                if split is not None and message.offset() >= 0:
                    end = message.offset()
                    if split.stop_offset is not None:
                        end = min(end, split.stop_offset)
                    split.next_offset = max(split.next_offset, end)
                continue
            if error.code() in unknown:
                raise NotFoundError(
                    f"KafkaSource: topic {tp[0]!r} partition {tp[1]} no longer exists on "
                    f"{self.settings.bootstrap_servers}: {error.str()}"
                )
            if error.fatal():
                raise RuntimeError(f"KafkaSource: fatal consumer error: {error.str()}")
            self.consumer_errors += 1
            log.warning(
                "kafka_source.consumer_error", topic=tp[0], partition=tp[1], error=error.str()
            )

    def _unassign_finished(self) -> None:
        if not self.bounded:
            return
        done = [s for s in self._splits.values() if s.finished]
        ck = confluent_kafka()
        if done and self._consumer.assignment():
            still = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
            gone = [ck.TopicPartition(s.topic, s.partition) for s in done if s.tp in still]
            if gone:
                self._consumer.incremental_unassign(gone)

    def _discover(self) -> None:
        ck = confluent_kafka()
        self._next_discovery = self._discovery_due()
        ctx = self._context()
        try:
            _, partitions = self._list_partitions(at_start=False)
        except Exception as exc:  # the brokers are away: try again at the next interval
            log.warning("kafka_source.discovery_failed", error=str(exc))
            return
        new = new_splits(partitions, self._splits, ctx.subtask_index, ctx.parallelism)
        if not new:
            return
        try:
            self._start_splits(new, KafkaStart.earliest())
        except ck.KafkaException as exc:
            log.warning("kafka_source.discovery_failed", error=str(exc))
            return
        self._assign()

    # --- event time -------------------------------------------------------------------------

    def idle_at_once(self) -> bool:
        """No split to read: idle at once (it may get one by discovery)."""
        return all(s.finished for s in self._splits.values())

    def current_watermark(self) -> int:
        self._context()
        live = [s for s in self._splits.values() if not s.finished]
        if not live and self.bounded:
            return MAX_WATERMARK
        if self.event_time is None:
            return MIN_WATERMARK
        now = time.monotonic()
        timeout_s = None if self.idle_timeout_ms is None else self.idle_timeout_ms / 1000
        active = [s for s in live if timeout_s is None or now - self._active_at[s.tp] < timeout_s]
        if active:
            low = min(self._watermarks[s.tp].current_watermark() for s in active)
            self._watermark = max(self._watermark, low)
        return self._watermark

    def __repr__(self) -> str:
        what = f"topics={list(self.topics)!r}" if self.topics else f"pattern={self.pattern!r}"
        return f"KafkaSource({self.settings.bootstrap_servers!r}, {what})"


class _ConsumerLookup:
    """The brokers' answers resolution needs, from the source's consumer."""

    def __init__(self, consumer: Any, timeout_s: float) -> None:
        self._consumer = consumer
        self._timeout_s = timeout_s

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        ck = confluent_kafka()
        low, high = self._consumer.get_watermark_offsets(
            ck.TopicPartition(tp[0], tp[1]), timeout=self._timeout_s, cached=False
        )
        return int(low), int(high)

    def committed(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        ck = confluent_kafka()
        found = self._consumer.committed(
            [ck.TopicPartition(t, p) for t, p in tps], timeout=self._timeout_s
        )
        return {(f.topic, f.partition): f.offset if f.offset >= 0 else None for f in found}

    def for_time(self, tps: Sequence[TopicPartition], ms: int) -> dict[TopicPartition, int | None]:
        ck = confluent_kafka()
        found = self._consumer.offsets_for_times(
            [ck.TopicPartition(t, p, ms) for t, p in tps], timeout=self._timeout_s
        )
        return {(f.topic, f.partition): f.offset if f.offset >= 0 else None for f in found}

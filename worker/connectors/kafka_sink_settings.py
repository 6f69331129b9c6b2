"""The Kafka sink's settings: the delivery guarantee, the partitioner, the producer properties
it sets itself and so refuses (what every Kafka client shares is ``kafka_config``), and the job
check of exactly once (checkpointing that the transactions can fit).

The transaction timeout rule
    A transaction of checkpoint ``n`` opens at the barrier of ``n - 1`` and commits on the
    completion notice of ``n``: without failures it lives for at most one interval (or the
    minimum pause, when longer) plus one checkpoint's duration, itself at most the
    checkpoint timeout. :func:`check_exactly_once_job` refuses a ``transaction.timeout.ms``
    below ``max(interval_ms, min_pause_ms) + timeout_ms``: the broker would abort
    transactions in normal running. Unlike Flink's sink, the restart time does not enter: a
    transaction pre-committed before a crash is not resumed after the restart but re-produced
    from the checkpoint when its marker is missing, so one the broker aborted meanwhile loses
    nothing (docs/kafka.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.checkpointing import CheckpointMode
from snapflow.errors import InvalidArgumentError


class DeliveryGuarantee(StrEnum):
    """What the Kafka sink promises (Flink's ``DeliveryGuarantee``, without ``NONE``)."""

    AT_LEAST_ONCE = "at_least_once"
    """Every record before a completed checkpoint's barrier is acknowledged by Kafka before
    the barrier passes; records after it may be written twice after a restore."""
    EXACTLY_ONCE = "exactly_once"
    """Kafka transactions committed when the checkpoint completes; ``read_committed``
    readers see every record once."""


def parse_guarantee(value: object) -> DeliveryGuarantee:
    if isinstance(value, str) and value in {g.value for g in DeliveryGuarantee}:
        return DeliveryGuarantee(value)
    raise InvalidArgumentError(
        f"guarantee must be one of {', '.join(repr(g.value) for g in DeliveryGuarantee)}, "
        f"got {value!r:.80}"
    )


PartitionerKind = Literal["key", "fixed", "round_robin"]

#: librdkafka's ``partitioner`` values (by key; null keys: ``_random`` random, else hashed).
KEY_HASHES = (
    "murmur2_random",
    "murmur2",
    "consistent_random",
    "consistent",
    "fnv1a_random",
    "fnv1a",
    "random",
)


@dataclass(frozen=True)
class KafkaPartitioner:
    """Which partition of the topic a record goes to: :meth:`by_key` (librdkafka's
    ``partitioner`` setting; the default ``murmur2_random`` is the Java client's default
    partitioner for keyed records), :meth:`fixed` (subtask ``i`` writes to partition
    ``i % partitions``, Flink's ``FlinkFixedPartitioner``) or :meth:`round_robin` (each
    subtask spreads its rows over all partitions in turn)."""

    kind: PartitionerKind = "key"
    hash: str = "murmur2_random"

    @classmethod
    def by_key(cls, hash: str = "murmur2_random") -> KafkaPartitioner:
        if hash not in KEY_HASHES:
            raise InvalidArgumentError(
                f"KafkaPartitioner.by_key: hash must be one of {', '.join(KEY_HASHES)}, "
                f"got {hash!r:.80}"
            )
        return cls("key", hash)

    @classmethod
    def fixed(cls) -> KafkaPartitioner:
        return cls("fixed")

    @classmethod
    def round_robin(cls) -> KafkaPartitioner:
        return cls("round_robin")


RESERVED_PROPERTIES = {
    "transactional.id": "the sink derives one per subtask from transactional_id_prefix=",
    "transaction.timeout.ms": "pass transaction_timeout_ms=",
    "enable.idempotence": "the sink enables it (and exactly once needs it)",
    "acks": "the sink uses acks=all (every in-sync replica)",
    "partitioner": "pass partitioner=KafkaPartitioner.by_key(hash)",
    "on_delivery": "the sink counts delivery errors itself and fails the task on one",
    "delivery.report.only.error": "the sink needs every delivery report",
}
"""The producer properties the sink sets itself, each with what to do instead
(``bootstrap.servers`` is refused by ``KafkaClientSettings``)."""


def required_transaction_timeout_ms(config: CheckpointConfig) -> int:
    """The least ``transaction.timeout.ms`` that fits a transaction's life without failures
    (see the module docstring)."""
    return max(config.interval_ms, config.min_pause_ms) + config.timeout_ms


def check_exactly_once_job(
    config: CheckpointConfig, transaction_timeout_ms: int, max_pending_transactions: int
) -> None:
    """Refuse a job whose checkpointing an exactly-once Kafka sink cannot work with, each
    refusal saying what to set."""
    if config.interval_ms <= 0:
        raise InvalidArgumentError(
            "KafkaSink(guarantee='exactly_once') needs periodic checkpoints: without them one "
            "transaction (and the records the sink keeps for it) would span the whole job; "
            "set checkpointing(interval_ms=...)"
        )
    if config.mode is CheckpointMode.AT_LEAST_ONCE:
        raise InvalidArgumentError(
            "KafkaSink(guarantee='exactly_once') needs checkpointing(mode='aligned' or "
            "'unaligned'): with 'at_least_once' barriers, a replay writes records twice; or "
            "use guarantee='at_least_once'"
        )
    if config.max_concurrent >= max_pending_transactions:
        raise InvalidArgumentError(
            f"KafkaSink: checkpointing(max_concurrent={config.max_concurrent}) lets more "
            f"checkpoints be pending than max_pending_transactions={max_pending_transactions}; "
            f"set max_pending_transactions={config.max_concurrent + 1} or more"
        )
    need = required_transaction_timeout_ms(config)
    if transaction_timeout_ms < need:
        raise InvalidArgumentError(
            f"KafkaSink: transaction_timeout_ms={transaction_timeout_ms} is shorter than a "
            f"transaction can live without a failure: max(interval_ms={config.interval_ms}, "
            f"min_pause_ms={config.min_pause_ms}) + checkpoint timeout_ms={config.timeout_ms} "
            f"= {need}; set transaction_timeout_ms={need} or more (and the broker's "
            f"transaction.max.timeout.ms at least as high), or lower checkpointing(timeout_ms=...)"
        )

"""The Kafka source's splits, pure: one split per topic-partition, which subtask owns it, which
topics a subscription selects, and what a subtask reads after a start, a restore or a discovery.

Ownership is a function of the split and the parallelism alone (:func:`split_owner`, the
formula of Flink's ``KafkaSourceEnumerator.getSplitOwner``), so every subtask decides on its own,
with no enumerator, and the same way after a restore at any parallelism: every split in the
checkpoint (the union of all subtasks' splits) is resumed by exactly one subtask, and a
partition that is not in it is new to the job and read by exactly one subtask too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from snapflow.errors import StateError

__all__ = [
    "KafkaSplit",
    "SplitPlan",
    "TopicPartition",
    "java_string_hash",
    "new_splits",
    "plan_splits",
    "select_topics",
    "split_owner",
]

TopicPartition = tuple[str, int]
"""A split's identity: ``(topic, partition)``."""


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, 32-bit signed)."""
    h = 0
    for unit in _utf16_units(text):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _utf16_units(text: str) -> Iterable[int]:
    data = text.encode("utf-16-be", "surrogatepass")
    return (int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))


def split_owner(topic: str, partition: int, parallelism: int) -> int:
    """The subtask that reads ``topic``'s ``partition``: consecutive partitions of a topic go
    round-robin to consecutive subtasks, from a start that depends on the topic (so several
    topics' partition 0 do not all land on subtask 0)."""
    start = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % parallelism
    return (start + partition) % parallelism


def select_topics(
    available: Iterable[str], topics: Sequence[str] | None, pattern: re.Pattern[str] | None
) -> list[str]:
    """The subscribed topics among ``available``, sorted: the listed ``topics`` that exist, or
    the names ``pattern`` matches in full (internal topics, ``__*``, never)."""
    names = set(available)
    if topics is not None:
        return sorted(t for t in set(topics) if t in names)
    assert pattern is not None
    return sorted(t for t in names if not t.startswith("__") and pattern.fullmatch(t))


@dataclass
class KafkaSplit:
    """A topic-partition this subtask reads: the next offset to read and, bounded, where to
    stop (exclusive); ``max_timestamp`` is its watermark generator's state."""

    topic: str
    partition: int
    next_offset: int
    stop_offset: int | None = None
    max_timestamp: int | None = None

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def finished(self) -> bool:
        return self.stop_offset is not None and self.next_offset >= self.stop_offset

    def entry(self) -> tuple[str, int, int, int | None, int | None]:
        """The split as checkpointed (operator union list state)."""
        return (self.topic, self.partition, self.next_offset, self.stop_offset, self.max_timestamp)

    @classmethod
    def from_entry(cls, entry: Any) -> KafkaSplit:
        ok = (
            isinstance(entry, tuple)
            and len(entry) == 5
            and isinstance(entry[0], str)
            and all(isinstance(x, int) for x in entry[1:3])
            and all(x is None or isinstance(x, int) for x in entry[3:])
        )
        if not ok:
            raise StateError(f"KafkaSource: malformed split in the checkpoint: {entry!r:.100}")
        return cls(*entry)


@dataclass(frozen=True)
class SplitPlan:
    """What a subtask reads after ``open``: the splits it resumes from the checkpoint and the
    partitions it starts (from the start position on a fresh start, from the earliest offset
    when they are new to a restored job)."""

    resumed: list[KafkaSplit]
    started: list[TopicPartition]


def plan_splits(
    partitions: Iterable[TopicPartition],
    restored: Iterable[KafkaSplit] | None,
    subscribed: Iterable[str],
    subtask: int,
    parallelism: int,
) -> SplitPlan:
    """The splits of ``subtask`` of ``parallelism``. ``partitions``: those the brokers list now;
    ``restored``: every split in the checkpoint (None on a fresh start). Splits of topics no
    longer ``subscribed`` are dropped; a split in the checkpoint whose partition the brokers do
    not list (yet) is still resumed."""
    topics = set(subscribed)
    resumed: dict[TopicPartition, KafkaSplit] = {}
    for split in restored or ():
        if split.topic in topics and split_owner(split.topic, split.partition, parallelism) == (
            subtask
        ):
            if split.tp in resumed:
                raise StateError(f"KafkaSource: split {split.tp} twice in the checkpoint")
            resumed[split.tp] = split
    started = new_splits(partitions, resumed, subtask, parallelism)
    return SplitPlan(sorted(resumed.values(), key=lambda s: s.tp), started)


def new_splits(
    partitions: Iterable[TopicPartition],
    owned: Iterable[TopicPartition],
    subtask: int,
    parallelism: int,
) -> list[TopicPartition]:
    """The partitions ``subtask`` owns among ``partitions`` that it does not read yet, sorted
    (partition discovery)."""
    have = set(owned)
    return sorted(
        tp
        for tp in set(partitions)
        if tp not in have and split_owner(tp[0], tp[1], parallelism) == subtask
    )

"""The Kafka source's pure parts: split ownership, topic selection, split plans after a start,
a restore, a rescale and a discovery, and start/stop offset resolution, as exact sequences."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.connectors.kafka_positions import (
    KafkaStart,
    KafkaStop,
    resolve_start,
    resolve_stop,
)
from snapflow.worker.connectors.kafka_splits import (
    KafkaSplit,
    TopicPartition,
    java_string_hash,
    new_splits,
    plan_splits,
    select_topics,
    split_owner,
)


def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("topic") == 110546223
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)  # 32-bit signed overflow
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # two UTF-16 code units


def test_split_owner_is_round_robin_from_a_topic_start() -> None:
    # "t": start ((116 * 31) & 0x7FFFFFFF) % 4 == 0; "topic": 1279449265 % 4 == 1
    assert [split_owner("t", p, 4) for p in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [split_owner("topic", p, 4) for p in range(6)] == [1, 2, 3, 0, 1, 2]
    assert [split_owner("topic", p, 1) for p in range(3)] == [0, 0, 0]


def test_select_topics() -> None:
    available = ["orders", "orders-eu", "__consumer_offsets", "payments"]
    assert select_topics(available, ["payments", "orders", "gone"], None) == ["orders", "payments"]
    assert select_topics(available, None, re.compile("orders.*")) == ["orders", "orders-eu"]
    assert select_topics(available, None, re.compile(".*")) == [
        "orders",
        "orders-eu",
        "payments",
    ]
    assert select_topics(available, None, re.compile("order")) == []  # full match only


def _parts(topic: str, n: int) -> list[TopicPartition]:
    return [(topic, p) for p in range(n)]


def test_fresh_plan_spreads_partitions() -> None:
    plans = [plan_splits(_parts("t", 6), None, ["t"], s, 4) for s in range(4)]
    assert [p.resumed for p in plans] == [[], [], [], []]
    assert [p.started for p in plans] == [
        [("t", 0), ("t", 4)],
        [("t", 1), ("t", 5)],
        [("t", 2)],
        [("t", 3)],
    ]


def _restored(entries: Sequence[tuple[str, int, int]]) -> list[KafkaSplit]:
    return [KafkaSplit(t, p, o) for t, p, o in entries]


@pytest.mark.parametrize(
    ("new_p", "expected"),
    [
        # "t" at parallelism 3 starts at subtask (116 * 31) % 3 == 2
        (3, [[("t", 1, 11), ("t", 4, 14)], [("t", 2, 12)], [("t", 0, 10), ("t", 3, 13)]]),
        (1, [[("t", 0, 10), ("t", 1, 11), ("t", 2, 12), ("t", 3, 13), ("t", 4, 14)]]),
    ],
)
def test_rescaled_plan_resumes_every_split_once(
    new_p: int, expected: list[list[tuple[str, int, int]]]
) -> None:
    checkpoint = _restored([("t", p, 10 + p) for p in range(5)])  # the union of all subtasks
    plans = [plan_splits(_parts("t", 5), checkpoint, ["t"], s, new_p) for s in range(new_p)]
    assert [[(s.topic, s.partition, s.next_offset) for s in p.resumed] for p in plans] == expected
    assert [p.started for p in plans] == [[]] * new_p


def test_restored_plan_starts_partitions_new_to_the_job_and_drops_unsubscribed_topics() -> None:
    checkpoint = _restored([("t", 0, 5), ("t", 1, 6), ("old", 0, 7)])
    plans = [plan_splits(_parts("t", 4), checkpoint, ["t"], s, 2) for s in range(2)]
    assert [[s.tp for s in p.resumed] for p in plans] == [[("t", 0)], [("t", 1)]]
    assert [p.started for p in plans] == [[("t", 2)], [("t", 3)]]
    # a split in the checkpoint that the brokers do not list (yet) is resumed all the same
    only = plan_splits([], _restored([("t", 1, 6)]), ["t"], 0, 1)
    assert [s.tp for s in only.resumed] == [("t", 1)] and only.started == []
    with pytest.raises(StateError, match="twice"):
        plan_splits([], _restored([("t", 1, 6), ("t", 1, 7)]), ["t"], 0, 1)


def test_discovery_takes_only_new_owned_partitions() -> None:
    owned = [("t", 0), ("t", 2)]
    assert new_splits(_parts("t", 6), owned, 0, 2) == [("t", 4)]
    assert new_splits(_parts("t", 6), [], 1, 2) == [("t", 1), ("t", 3), ("t", 5)]
    assert new_splits(_parts("t", 2), owned, 0, 2) == []


def test_split_entries_round_trip_and_refuse_garbage() -> None:
    split = KafkaSplit("t", 3, 42, 50, 1234)
    assert KafkaSplit.from_entry(split.entry()) == split
    assert not split.finished and KafkaSplit("t", 3, 50, 50).finished
    assert not KafkaSplit("t", 3, 10**9).finished  # unbounded
    for bad in [("t", 3, 42), ("t", "3", 42, None, None), ["t", 3, 42, None, None]]:
        with pytest.raises(StateError, match="malformed"):
            KafkaSplit.from_entry(bad)


class _Lookup:
    """Partition ("t", p) holds offsets 10 .. 20; group offsets and timestamps as given."""

    def __init__(self) -> None:
        self.group = {("t", 0): 15, ("t", 1): None}
        self.times = {("t", 0): 12, ("t", 1): None}

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        return 10, 20

    def committed(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        return {tp: self.group.get(tp) for tp in tps}

    def for_time(self, tps: Sequence[TopicPartition], ms: int) -> dict[TopicPartition, int | None]:
        return {tp: self.times.get(tp) for tp in tps}


def test_start_positions() -> None:
    tps, lookup = _parts("t", 2), _Lookup()
    assert resolve_start(KafkaStart.earliest(), tps, lookup) == {("t", 0): 10, ("t", 1): 10}
    assert resolve_start(KafkaStart.latest(), tps, lookup) == {("t", 0): 20, ("t", 1): 20}
    assert resolve_start(KafkaStart.committed(), tps, lookup) == {("t", 0): 15, ("t", 1): 10}
    assert resolve_start(KafkaStart.committed("latest"), tps, lookup) == {
        ("t", 0): 15,
        ("t", 1): 20,
    }
    # no record at or after the timestamp: the end
    assert resolve_start(KafkaStart.timestamp(99), tps, lookup) == {("t", 0): 12, ("t", 1): 20}
    explicit = KafkaStart.from_offsets({("t", 0): 3, ("t", 1): 17, ("u", 0): 1}, "latest")
    assert resolve_start(explicit, [*tps, ("t", 2)], lookup) == {
        ("t", 0): 10,  # clamped into what the partition holds
        ("t", 1): 17,
        ("t", 2): 20,  # not given: the default
    }
    assert resolve_start(KafkaStart.earliest(), [], lookup) == {}


def test_stop_positions() -> None:
    tps, lookup = _parts("t", 2), _Lookup()
    assert resolve_stop(KafkaStop.latest(), tps, lookup) == {("t", 0): 20, ("t", 1): 20}
    assert resolve_stop(KafkaStop.timestamp(5), tps, lookup) == {("t", 0): 12, ("t", 1): 20}
    assert resolve_stop(KafkaStop.from_offsets({("t", 1): 25}), tps, lookup) == {
        ("t", 0): 20,
        ("t", 1): 25,
    }


@pytest.mark.parametrize(
    "make",
    [
        lambda: KafkaStart.committed("middle"),  # type: ignore[arg-type]
        lambda: KafkaStart.timestamp(-1),
        lambda: KafkaStart.from_offsets({("t", -1): 0}),
        lambda: KafkaStart.from_offsets({("t", 0): -5}),
        lambda: KafkaStop.from_offsets({"t": 3}),  # type: ignore[dict-item]
    ],
)
def test_bad_positions_are_refused(make: object) -> None:
    with pytest.raises(InvalidArgumentError):
        make()  # type: ignore[operator]

"""Where the Kafka source starts and, bounded, where it stops: the option types
(:class:`KafkaStart`, :class:`KafkaStop`) and their resolution to offsets.

Resolution happens once per partition, when the partition is first read on a fresh start
(or when it is discovered: from the earliest offset); after that the offsets are the split's
state in the checkpoint, never the offsets Kafka stores for the group. It asks the brokers
through an :class:`OffsetLookup` (the source's consumer), so the rules here are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.kafka_splits import TopicPartition

__all__ = ["KafkaStart", "KafkaStop", "OffsetLookup", "resolve_start", "resolve_stop"]

StartKind = Literal["earliest", "latest", "committed", "timestamp", "offsets"]
StopKind = Literal["latest", "timestamp", "offsets"]


def _check_offsets(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for tp, offset in dict(offsets).items():
        ok = (
            isinstance(tp, tuple)
            and len(tp) == 2
            and isinstance(tp[0], str)
            and isinstance(tp[1], int)
            and tp[1] >= 0
        )
        if not ok or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(
                f"offsets map (topic, partition) to an offset >= 0, got {tp!r:.60}: {offset!r:.30}"
            )
        out[tp] = offset
    return out


def _check_timestamp(ms: int) -> int:
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
        raise InvalidArgumentError(f"a timestamp is an integer of milliseconds >= 0, got {ms!r}")
    return ms


@dataclass(frozen=True)
class KafkaStart:
    """Where a fresh start reads each partition (Flink's ``OffsetsInitializer`` for starting):
    ``earliest()``, ``latest()``, ``committed(fallback)`` (the group's committed offset, or the
    fallback, earliest or latest, for a partition without one), ``timestamp(ms)`` (the first
    record with a timestamp >= ms; the end of the partition when there is none) and
    ``offsets({(topic, partition): offset}, default)`` (the rest from ``default``). Offsets
    outside what the partition holds are clamped into it."""

    kind: StartKind = "earliest"
    fallback: Literal["earliest", "latest"] = "earliest"
    timestamp_ms: int = 0
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)

    @classmethod
    def earliest(cls) -> KafkaStart:
        return cls("earliest")

    @classmethod
    def latest(cls) -> KafkaStart:
        return cls("latest")

    @classmethod
    def committed(cls, fallback: Literal["earliest", "latest"] = "earliest") -> KafkaStart:
        if fallback not in ("earliest", "latest"):
            raise InvalidArgumentError(
                f"the fallback of committed() is 'earliest' or 'latest', got {fallback!r}"
            )
        return cls("committed", fallback=fallback)

    @classmethod
    def timestamp(cls, ms: int) -> KafkaStart:
        return cls("timestamp", timestamp_ms=_check_timestamp(ms))

    @classmethod
    def from_offsets(
        cls,
        offsets: Mapping[TopicPartition, int],
        default: Literal["earliest", "latest"] = "earliest",
    ) -> KafkaStart:
        if default not in ("earliest", "latest"):
            raise InvalidArgumentError(f"default is 'earliest' or 'latest', got {default!r}")
        return cls("offsets", fallback=default, offsets=_check_offsets(offsets))


@dataclass(frozen=True)
class KafkaStop:
    """Where a bounded source stops (exclusive; Flink's bounded ``OffsetsInitializer``):
    ``latest()``, the end of each partition when the job first reads it; ``timestamp(ms)``, the
    first record with a timestamp >= ms (the end when there is none); ``offsets({...})``,
    given offsets (the partitions not given: their end at the start)."""

    kind: StopKind = "latest"
    timestamp_ms: int = 0
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)

    @classmethod
    def latest(cls) -> KafkaStop:
        return cls("latest")

    @classmethod
    def timestamp(cls, ms: int) -> KafkaStop:
        return cls("timestamp", timestamp_ms=_check_timestamp(ms))

    @classmethod
    def from_offsets(cls, offsets: Mapping[TopicPartition, int]) -> KafkaStop:
        return cls("offsets", offsets=_check_offsets(offsets))


class OffsetLookup(Protocol):
    """What resolution asks the brokers (the source's consumer answers)."""

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        """``(low, high)``: the first offset the partition holds and the next to be written."""
        ...

    def committed(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None: none)."""
        ...

    def for_time(self, tps: Sequence[TopicPartition], ms: int) -> dict[TopicPartition, int | None]:
        """The first offset with a timestamp >= ms (None: no such record)."""
        ...


def resolve_start(
    start: KafkaStart, tps: Sequence[TopicPartition], lookup: OffsetLookup
) -> dict[TopicPartition, int]:
    """The first offset to read of each of ``tps``."""
    if not tps:
        return {}
    marks = {tp: lookup.watermarks(tp) for tp in tps}
    wanted: dict[TopicPartition, int | None]
    if start.kind == "earliest":
        return {tp: low for tp, (low, _) in marks.items()}
    if start.kind == "latest":
        return {tp: high for tp, (_, high) in marks.items()}
    if start.kind == "committed":
        wanted = lookup.committed(tps)
    elif start.kind == "timestamp":
        found = lookup.for_time(tps, start.timestamp_ms)
        wanted = {tp: marks[tp][1] if found.get(tp) is None else found[tp] for tp in tps}
    else:
        wanted = {tp: start.offsets.get(tp) for tp in tps}
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        low, high = marks[tp]
        offset = wanted.get(tp)
        if offset is None:
            offset = low if start.fallback == "earliest" else high
        out[tp] = min(max(offset, low), high)
    return out


def resolve_stop(
    stop: KafkaStop, tps: Sequence[TopicPartition], lookup: OffsetLookup
) -> dict[TopicPartition, int]:
    """The offset (exclusive) where each of ``tps`` ends."""
    if not tps:
        return {}
    if stop.kind == "offsets":
        given = {tp: stop.offsets[tp] for tp in tps if tp in stop.offsets}
        rest = [tp for tp in tps if tp not in given]
        return {**given, **{tp: lookup.watermarks(tp)[1] for tp in rest}}
    ends = {tp: lookup.watermarks(tp)[1] for tp in tps}
    if stop.kind == "latest":
        return ends
    found = lookup.for_time(tps, stop.timestamp_ms)
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        offset = found.get(tp)
        out[tp] = ends[tp] if offset is None else min(offset, ends[tp])
    return out

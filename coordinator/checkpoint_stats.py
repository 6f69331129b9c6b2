"""Checkpoint statistics of one job: the data behind Flink's Checkpoints tab.

Pure and in memory (like Flink's CheckpointStatsTracker): it is fed by the coordinator's
actions and read by the stats API. After a coordinator restart the history starts empty;
completed checkpoints themselves are durable in Redis.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from snapflow.coordinator.model import (
    CheckpointKind,
    CheckpointStatus,
    CompletedCheckpoint,
    ExecutionAttempt,
    SubtaskAck,
)
from snapflow.coordinator.shared_state import SHARED

SUMMARY_WINDOW = 1000  # completed checkpoints the percentiles are computed over


@dataclass(frozen=True)
class StateSizes:
    """The bytes a snapshot's state handles name, split by who wrote them (Flink's "full
    checkpoint data size" and "checkpointed data size").

    ``state``: every byte the handles name (a full snapshot's whole state; an incremental
    checkpoint's files plus the shared files it reuses). ``shared``: bytes of the reused shared
    files (handles of kind ``shared``, uploaded by an earlier checkpoint). ``incremental``:
    the rest, what this snapshot wrote (its own files and the shared files it uploaded,
    ``shared-new``). Always ``state == incremental + shared``."""

    state: int = 0
    incremental: int = 0
    shared: int = 0

    @staticmethod
    def of_ack(ack: SubtaskAck) -> StateSizes:
        # A subtask that reported a size but no handles (``state_size_bytes`` falls back to its
        # metrics) wrote what it reported.
        state = ack.state_size_bytes
        shared = sum(
            h.size_bytes for s in ack.operator_states for h in s.handles if h.kind == SHARED
        )
        return StateSizes(state, state - shared, shared)

    @staticmethod
    def of_acks(acks: Iterable[SubtaskAck]) -> StateSizes:
        state = incremental = shared = 0
        for ack in acks:
            sizes = StateSizes.of_ack(ack)
            state += sizes.state
            incremental += sizes.incremental
            shared += sizes.shared
        return StateSizes(state, incremental, shared)


@dataclass
class CheckpointRecord:
    checkpoint_id: int
    kind: CheckpointKind
    status: CheckpointStatus
    trigger_timestamp_ms: int
    external_path: str
    tasks: tuple[ExecutionAttempt, ...]
    acks: dict[ExecutionAttempt, SubtaskAck] = field(default_factory=dict)
    end_timestamp_ms: int = 0
    failure_reason: str = ""
    failure_message: str = ""
    completion_latency_ms: float = 0.0
    """Last ack's arrival to the durable commit (metadata + Redis), measured by the shell."""

    @property
    def latest_ack_timestamp_ms(self) -> int:
        return max((a.ack_timestamp_ms for a in self.acks.values()), default=0)

    @property
    def end_to_end_duration_ms(self) -> int:
        end = self.end_timestamp_ms or self.latest_ack_timestamp_ms
        return max(0, end - self.trigger_timestamp_ms) if end else 0

    @property
    def sizes(self) -> StateSizes:
        """Summed over the acknowledged subtasks."""
        return StateSizes.of_acks(self.acks.values())

    @property
    def state_size_bytes(self) -> int:
        return sum(a.state_size_bytes for a in self.acks.values())

    @property
    def max_alignment_duration_ms(self) -> int:
        """The longest alignment of the acknowledged subtasks."""
        return max((a.metrics.alignment_duration_ms for a in self.acks.values()), default=0)

    @property
    def processed_during_alignment_bytes(self) -> int:
        return sum(a.metrics.processed_during_alignment_bytes for a in self.acks.values())

    @property
    def persisted_in_flight_bytes(self) -> int:
        return sum(a.metrics.persisted_in_flight_bytes for a in self.acks.values())

    @property
    def unaligned(self) -> bool:
        return any(a.metrics.unaligned for a in self.acks.values())


@dataclass(frozen=True)
class Quantiles:
    min: float = 0.0
    avg: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @staticmethod
    def of(values: list[float]) -> Quantiles:
        if not values:
            return Quantiles()
        ordered = sorted(values)
        return Quantiles(
            min=ordered[0],
            avg=sum(ordered) / len(ordered),
            p50=percentile(ordered, 50),
            p90=percentile(ordered, 90),
            p99=percentile(ordered, 99),
            max=ordered[-1],
        )


def percentile(ordered: list[float], pct: float) -> float:
    """Linear-interpolation percentile of an ascending list (numpy's default method)."""
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * pct / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class RestoreRecord:
    checkpoint_id: int
    timestamp_ms: int
    is_savepoint: bool
    external_path: str


class CheckpointStatsTracker:
    def __init__(self, history_size: int = 10) -> None:
        self.history_size = history_size
        self.records: dict[int, CheckpointRecord] = {}
        self._history: deque[int] = deque()
        self.triggered = 0
        self.completed = 0
        self.failed = 0
        self.restored = 0
        self.latest_completed: CheckpointRecord | None = None
        self.latest_failed: CheckpointRecord | None = None
        self.latest_savepoint: CheckpointRecord | None = None
        self.latest_restore: RestoreRecord | None = None
        self._durations: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self._sizes: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self._incremental_sizes: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self._aligned_bytes: deque[float] = deque(maxlen=SUMMARY_WINDOW)
        self._in_flight_bytes: deque[float] = deque(maxlen=SUMMARY_WINDOW)

    @property
    def in_progress(self) -> int:
        return sum(1 for r in self.records.values() if r.status is CheckpointStatus.IN_PROGRESS)

    def history(self, limit: int | None = None) -> list[CheckpointRecord]:
        """Newest first."""
        ids = list(reversed(self._history))
        if limit is not None:
            ids = ids[:limit]
        return [self.records[i] for i in ids]

    def get(self, checkpoint_id: int) -> CheckpointRecord | None:
        return self.records.get(checkpoint_id)

    def summary(self) -> dict[str, Quantiles]:
        return {
            "end_to_end_duration_ms": Quantiles.of(list(self._durations)),
            "state_size_bytes": Quantiles.of(list(self._sizes)),
            "incremental_size_bytes": Quantiles.of(list(self._incremental_sizes)),
            "processed_during_alignment_bytes": Quantiles.of(list(self._aligned_bytes)),
            "persisted_in_flight_bytes": Quantiles.of(list(self._in_flight_bytes)),
        }

    # --- events ----------------------------------------------------------------------------

    def on_triggered(
        self,
        checkpoint_id: int,
        kind: CheckpointKind,
        timestamp_ms: int,
        external_path: str,
        tasks: tuple[ExecutionAttempt, ...],
    ) -> None:
        self.triggered += 1
        self.records[checkpoint_id] = CheckpointRecord(
            checkpoint_id, kind, CheckpointStatus.IN_PROGRESS, timestamp_ms, external_path, tasks
        )
        self._history.append(checkpoint_id)
        self._trim()

    def on_acknowledged(self, checkpoint_id: int, ack: SubtaskAck) -> None:
        record = self.records.get(checkpoint_id)
        if record is not None:
            record.acks[ack.attempt] = ack

    def on_completed(self, checkpoint: CompletedCheckpoint) -> None:
        record = self.records.get(checkpoint.checkpoint_id)
        if record is None:
            return
        record.status = CheckpointStatus.COMPLETED
        record.end_timestamp_ms = checkpoint.completion_timestamp_ms
        self.completed += 1
        self.latest_completed = record
        if checkpoint.kind.is_savepoint:
            self.latest_savepoint = record
        self._durations.append(record.end_to_end_duration_ms)
        sizes = record.sizes
        self._sizes.append(sizes.state)
        self._incremental_sizes.append(sizes.incremental)
        self._aligned_bytes.append(record.processed_during_alignment_bytes)
        self._in_flight_bytes.append(record.persisted_in_flight_bytes)
        self._trim()

    def on_failed(self, checkpoint_id: int, timestamp_ms: int, reason: str, message: str) -> None:
        record = self.records.get(checkpoint_id)
        if record is None or record.status is not CheckpointStatus.IN_PROGRESS:
            return
        record.status = CheckpointStatus.FAILED
        record.end_timestamp_ms = timestamp_ms
        record.failure_reason = reason
        record.failure_message = message
        self.failed += 1
        self.latest_failed = record
        self._trim()

    def on_restored(
        self, checkpoint_id: int, timestamp_ms: int, is_savepoint: bool, path: str
    ) -> None:
        self.restored += 1
        self.latest_restore = RestoreRecord(checkpoint_id, timestamp_ms, is_savepoint, path)

    def _trim(self) -> None:
        # Keep the newest ``history_size`` ended checkpoints plus everything still in progress.
        keep = {
            self.latest_completed.checkpoint_id if self.latest_completed else -1,
            self.latest_failed.checkpoint_id if self.latest_failed else -1,
            self.latest_savepoint.checkpoint_id if self.latest_savepoint else -1,
        }
        while len(self._history) > self.history_size:
            oldest = self._history[0]
            if self.records[oldest].status is CheckpointStatus.IN_PROGRESS:
                break
            self._history.popleft()
            if oldest not in keep:
                self.records.pop(oldest, None)

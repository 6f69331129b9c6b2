"""A job's checkpoint configuration: the one type the Spark bridge builds, the coordinator
validates, stores and runs, and the workers read their state backend from.

Validated on construction (and so on ``dataclasses.replace``): a ``CheckpointConfig`` that
exists is a valid one. Every refusal is an ``InvalidFieldError`` whose message starts with the
field's name and says what would be accepted; ``snapflow.wire`` (the only proto mapping of
this type) prefixes it with ``checkpoint_config.`` for an API caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from snapflow import limits
from snapflow.checkpointing import CheckpointMode
from snapflow.errors import ConfigError, InvalidArgumentError, InvalidFieldError
from snapflow.filestore import is_object_store_uri
from snapflow.state_backend_options import HEAP, STATE_BACKENDS, StateBackendOptions
from snapflow.storage_location import local_path_from_uri, s3_location

__all__ = ["CHECKPOINT_MODES", "CheckpointConfig", "parse_checkpoint_mode"]

CHECKPOINT_MODES = tuple(m.value for m in CheckpointMode)
"""The mode names a user writes: the values of ``snapflow.checkpointing.CheckpointMode``."""


def parse_checkpoint_mode(value: str | CheckpointMode) -> CheckpointMode:
    """A mode as a user writes it (``"aligned"``, ``"unaligned"``, ``"at_least_once"``) or
    a ``CheckpointMode``; ``InvalidFieldError`` naming ``mode`` otherwise."""
    if isinstance(value, CheckpointMode):
        return value
    if isinstance(value, str) and value in CHECKPOINT_MODES:
        return CheckpointMode(value)
    raise InvalidFieldError(
        "mode", f"mode must be one of {', '.join(map(repr, CHECKPOINT_MODES))}, got {value!r:.80}"
    )


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFieldError(name, f"{name} must be an integer, got {value!r:.80}")
    return value


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise InvalidFieldError(name, f"{name} must be >= {low}, got {value}")


def _at_most(name: str, value: int, high: int) -> None:
    if value > high:
        raise InvalidFieldError(name, f"{name} {value} is above the maximum of {high}")


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint settings of one job (proto ``snapflow.v1.CheckpointConfig``). Defaults
    follow Flink's: no periodic checkpoints, 10 minutes timeout, one at a time, one
    retained."""

    interval_ms: int = 0
    """Period of automatic checkpoints: 0 (none: manual triggers still work, and a bounded
    job still ends with a final checkpoint) or at least ``limits.MIN_INTERVAL_MS``."""
    timeout_ms: int = 600_000
    """A pending checkpoint older than this expires; at least ``limits.MIN_INTERVAL_MS``."""
    min_pause_ms: int = 0
    """Minimum time from the completion of one checkpoint to the trigger of the next."""
    max_concurrent: int = 1
    """Most checkpoints pending at once (savepoints included); 1 with unaligned barriers."""
    mode: CheckpointMode = CheckpointMode.ALIGNED
    """Barrier handling on the task side: aligned (exactly once), unaligned (exactly once,
    barriers overtake in-flight data) or at least once."""
    aligned_checkpoint_timeout_ms: int = 0
    """ALIGNED only: switch a checkpoint to unaligned when alignment takes longer; 0 = never."""
    tolerable_failures: int | None = 0
    """Consecutive failed checkpoints tolerated before the job fails; None = unlimited."""
    retained: int = 1
    """Completed checkpoints kept; older ones are deleted from storage."""
    storage_uri: str = ""
    """Checkpoint storage root for this job: an absolute path, ``file:///absolute/path`` or
    ``s3://bucket/prefix`` that every worker sees; empty = the coordinator's default."""
    state_backend: str = HEAP
    """Keyed state backend of the tasks: one of ``snapflow.state_backend_options.STATE_BACKENDS``."""
    state_backend_options: StateBackendOptions = field(default_factory=StateBackendOptions)
    """Sizing of the rocksdb backend's instances; unset fields keep the worker's defaults."""
    inline_state_threshold_bytes: int = limits.DEFAULT_INLINE_STATE_THRESHOLD_BYTES
    """A subtask's snapshot of at most this many bytes is sent inline with its acknowledgement
    and stored in the Redis record and ``_metadata`` instead of as files (Flink's
    ``state.storage.fs.memory-threshold``, 20 KB by default): a small snapshot then costs no
    file, fsync or object-store request. 0 = always files; at most
    ``limits.MAX_INLINE_STATE_THRESHOLD_BYTES`` (1 MB). Savepoints inline too: their
    ``_metadata`` then holds that state, and they stay relocatable."""

    def __post_init__(self) -> None:
        for name in ("interval_ms", "timeout_ms", "min_pause_ms", "aligned_checkpoint_timeout_ms"):
            value = _integer(name, getattr(self, name))
            _at_least(name, value, 0)
            try:
                limits.check_duration_ms(value, name)
            except InvalidArgumentError as e:
                raise InvalidFieldError(name, str(e)) from None
        minimum = limits.MIN_INTERVAL_MS
        if 0 < self.interval_ms < minimum:
            raise InvalidFieldError(
                "interval_ms",
                f"interval_ms {self.interval_ms} is below the minimum of {minimum} ms: use 0 "
                f"(checkpointing off) or >= {minimum}",
            )
        if self.timeout_ms < minimum:
            raise InvalidFieldError(
                "timeout_ms", f"timeout_ms {self.timeout_ms} is below the minimum of {minimum} ms"
            )
        for name, high in (
            ("max_concurrent", limits.MAX_CONCURRENT_CHECKPOINTS),
            ("retained", limits.MAX_RETAINED_CHECKPOINTS),
        ):
            value = _integer(name, getattr(self, name))
            _at_least(name, value, 1)
            _at_most(name, value, high)
        if self.tolerable_failures is not None:
            _at_least(
                "tolerable_failures", _integer("tolerable_failures", self.tolerable_failures), 0
            )
        if not isinstance(self.mode, CheckpointMode):
            raise InvalidFieldError(
                "mode",
                f"mode must be a CheckpointMode (parse_checkpoint_mode reads a name), got "
                f"{self.mode!r:.80}",
            )
        if self.aligned_checkpoint_timeout_ms and self.mode is not CheckpointMode.ALIGNED:
            raise InvalidFieldError(
                "aligned_checkpoint_timeout_ms",
                "aligned_checkpoint_timeout_ms applies only to ALIGNED mode",
            )
        unaligned = self.mode is CheckpointMode.UNALIGNED or self.aligned_checkpoint_timeout_ms > 0
        if unaligned and self.max_concurrent > 1:
            # Flink's CheckpointCoordinatorConfiguration refuses the same: a newer unaligned
            # barrier would have to overtake the older checkpoint's in-flight data.
            raise InvalidFieldError(
                "max_concurrent",
                f"max_concurrent {self.max_concurrent} needs aligned checkpoints: with UNALIGNED "
                f"mode or an aligned_checkpoint_timeout_ms at most 1 checkpoint may be in flight",
            )
        _check_storage_uri(self.storage_uri)
        name = "inline_state_threshold_bytes"
        threshold = _integer(name, self.inline_state_threshold_bytes)
        _at_least(name, threshold, 0)
        _at_most(name, threshold, limits.MAX_INLINE_STATE_THRESHOLD_BYTES)
        if self.state_backend not in STATE_BACKENDS:
            raise InvalidFieldError(
                "state_backend",
                f"state_backend {self.state_backend!r:.80} is not one of {', '.join(STATE_BACKENDS)}",
            )
        if not isinstance(self.state_backend_options, StateBackendOptions):
            raise InvalidFieldError(
                "state_backend_options",
                f"state_backend_options must be a StateBackendOptions, got "
                f"{self.state_backend_options!r:.80}",
            )


def _check_storage_uri(value: object) -> None:
    name = "storage_uri"
    if not isinstance(value, str):
        raise InvalidFieldError(name, f"{name} must be a string, got {value!r:.80}")
    if not value:
        return
    try:
        limits.check_location(value, name)
        if is_object_store_uri(value):
            s3_location(value, what=name)
            return
        local = local_path_from_uri(value, what=name)
    except (InvalidArgumentError, ConfigError) as e:
        raise InvalidFieldError(name, str(e)) from None
    if "\x00" in local:
        raise InvalidFieldError(name, f"{name} contains a NUL byte")
    if not os.path.isabs(local):
        raise InvalidFieldError(
            name,
            f"{name} {limits.echo(value)} must be an absolute path or file:///absolute/path "
            f"(every worker must see the same location)",
        )

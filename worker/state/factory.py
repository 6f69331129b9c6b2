"""Choosing a keyed state backend: ``heap`` (the default) or ``rocksdb`` (on local disk, with
incremental checkpoints). Both have one interface (:class:`KeyedStateBackend`'s) and the same
recovery contract; a savepoint of either restores into the other."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import TypeVar

from snapflow.state_backend_options import (
    HEAP,
    ROCKSDB,
    StateBackendOptions,
    parse_state_backend,
)
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.rocksdb_backend import DEFAULT_CACHE_ENTRIES, RocksDBKeyedStateBackend
from snapflow.worker.state.rocksdb_local_recovery import discard_local_copies, local_copy_dir
from snapflow.worker.state.rocksdb_tuning import RocksDBTuning
from snapflow.worker.state.ttl import Clock

__all__ = ["StateBackendConfig", "create_keyed_backend"]

LOCAL_DIR_ENV = "SNAPFLOW_STATE_DIR"

_TUNING = RocksDBTuning()  # the instance defaults, stated once (in rocksdb_tuning.py)


@dataclass(frozen=True)
class StateBackendConfig:
    """How this worker opens a job's keyed state backends: the job's choice (``kind`` and
    ``options``, as the job's ``CheckpointConfig`` carries them; an unset option takes the
    worker's default) and this machine's directories."""

    kind: str = HEAP
    """One of ``snapflow.state_backend_options.STATE_BACKENDS``."""
    options: StateBackendOptions = field(default_factory=StateBackendOptions)
    """The rocksdb sizing the job chose (each field documented there)."""
    local_dir: str = ""
    """rocksdb: where the instances live; empty = ``$SNAPFLOW_STATE_DIR``, else the system
    temporary directory."""
    local_recovery_dir: str = ""
    """rocksdb, local recovery: the root of the local copies (``<root>/<job>/<vertex>/
    <subtask>``); empty = ``snapflow-local-recovery`` in the system temporary directory."""

    def __post_init__(self) -> None:
        # The name rule is the job config's (any case; empty = heap); the options validated
        # themselves.
        object.__setattr__(self, "kind", parse_state_backend(self.kind))

    @property
    def cache_entries(self) -> int:
        """rocksdb: decoded values kept in the write-back cache (0 = none)."""
        chosen = self.options.cache_entries
        return DEFAULT_CACHE_ENTRIES if chosen is None else chosen

    @property
    def local_recovery(self) -> bool:
        """rocksdb: keep local copies of the last completed checkpoint (off by default)."""
        return bool(self.options.local_recovery)

    def tuning(self) -> RocksDBTuning:
        """The disk backend's instance settings: the job's options over the defaults."""
        o = self.options
        return RocksDBTuning(
            memory_budget_bytes=_or(o.memory_budget_bytes, _TUNING.memory_budget_bytes),
            compaction_style=_or(o.compaction_style, _TUNING.compaction_style),
            compaction_trigger=_or(o.compaction_trigger, _TUNING.compaction_trigger),
            max_size_amplification_percent=_or(
                o.max_size_amplification_percent, _TUNING.max_size_amplification_percent
            ),
            upload_threads=_or(o.upload_threads, _TUNING.upload_threads),
        )

    @classmethod
    def parse(cls, value: str | StateBackendConfig | None) -> StateBackendConfig:
        """A config from a backend name (any case; ``""`` means heap) or a config."""
        if isinstance(value, StateBackendConfig):
            return value
        return cls(kind=value or HEAP)

    def local_recovery_root(self) -> str:
        """The root directory of the local copies."""
        return self.local_recovery_dir or os.path.join(
            tempfile.gettempdir(), "snapflow-local-recovery"
        )

    def discard_local_copies(self, job_id: str) -> None:
        """Delete job ``job_id``'s local copies (it ended); nothing when local recovery is
        off."""
        if self.kind == ROCKSDB and self.local_recovery:
            discard_local_copies(self.local_recovery_root(), job_id)


T = TypeVar("T")


def _or(chosen: T | None, default: T) -> T:
    return default if chosen is None else chosen


def create_keyed_backend(
    config: StateBackendConfig | str | None,
    max_parallelism: int,
    parallelism: int,
    index: int,
    *,
    name: str = "",
    clock: Clock | None = None,
    job_id: str = "",
) -> KeyedStateBackend:
    """The keyed backend of subtask ``index`` of ``parallelism``; with local recovery on, its
    local copy is kept per ``job_id``, ``name`` and ``index`` (none without a job id)."""
    config = StateBackendConfig.parse(config)
    kg_range = kgs.key_group_range_for_subtask(max_parallelism, parallelism, index)
    if config.kind == ROCKSDB:
        return RocksDBKeyedStateBackend(
            max_parallelism,
            kg_range,
            name=name,
            local_dir=config.local_dir or os.environ.get(LOCAL_DIR_ENV) or None,
            cache_entries=config.cache_entries,
            tuning=config.tuning(),
            clock=clock,
            local_recovery_dir=(
                local_copy_dir(config.local_recovery_root(), job_id, name, index)
                if config.local_recovery and job_id
                else None
            ),
        )
    return KeyedStateBackend(max_parallelism, kg_range, name=name, clock=clock)

"""Choosing a keyed state backend: ``heap`` (the default) or ``rocksdb`` (on local disk, with
incremental checkpoints). Both have one interface (:class:`KeyedStateBackend`'s) and the same
recovery contract; a savepoint of either restores into the other."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.backend import KeyedStateBackend
from snapflow.worker.state.rocksdb_backend import (
    COMPACTION_STYLES,
    DEFAULT_CACHE_ENTRIES,
    DEFAULT_MEMORY_BUDGET_BYTES,
    UNIVERSAL,
    RocksDBKeyedStateBackend,
    RocksDBTuning,
)
from snapflow.worker.state.ttl import Clock

__all__ = ["BACKENDS", "HEAP", "ROCKSDB", "StateBackendConfig", "create_keyed_backend"]

HEAP = "heap"
ROCKSDB = "rocksdb"
BACKENDS = (HEAP, ROCKSDB)

LOCAL_DIR_ENV = "SNAPFLOW_STATE_DIR"


@dataclass(frozen=True)
class StateBackendConfig:
    """Which keyed state backend a job's tasks use, and how the disk backend is sized."""

    kind: str = HEAP
    """``heap`` (Python dicts) or ``rocksdb`` (a local RocksDB per keyed subtask)."""
    local_dir: str = ""
    """rocksdb: where the instances live; empty = ``$SNAPFLOW_STATE_DIR``, else the system
    temporary directory."""
    cache_entries: int = DEFAULT_CACHE_ENTRIES
    """rocksdb: decoded values kept in the write-back cache (0 = none)."""
    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES
    """rocksdb: memtables (a quarter) and block cache (a half) of one instance."""
    compaction_style: str = UNIVERSAL
    """rocksdb: ``universal`` (tiered: sorted runs merged when enough of similar size
    accumulate; low write amplification, so an incremental checkpoint uploads a few times the
    bytes it changed; up to ``max_size_amplification_percent`` more space) or ``level``
    (RocksDB's default: least space, but compactions rewrite about ten times the changed
    bytes, all of which the next checkpoint uploads). Why universal: docs/storage.md."""
    compaction_trigger: int = 8
    """rocksdb: sorted runs (each checkpoint's memtable flush adds one) that accumulate before
    a compaction merges them; more runs, fewer rewrites, slower reads of absent keys."""
    max_size_amplification_percent: int = 200
    """rocksdb, universal: a full compaction runs when the runs above the oldest hold this
    percentage of its size (bounds the space; that checkpoint uploads the whole state)."""
    upload_threads: int = 4
    """rocksdb: new SST files uploaded at once by a checkpoint's asynchronous part."""

    def __post_init__(self) -> None:
        if self.kind not in BACKENDS:
            raise InvalidArgumentError(
                f"unknown state backend {self.kind!r}: choose one of {', '.join(BACKENDS)}"
            )
        if self.cache_entries < 0:
            raise InvalidArgumentError("state backend: cache_entries must be >= 0")
        if self.compaction_style not in COMPACTION_STYLES:
            raise InvalidArgumentError(
                f"unknown compaction style {self.compaction_style!r}: choose one of "
                f"{', '.join(COMPACTION_STYLES)}"
            )
        try:
            self.tuning()
        except StateError as e:
            raise InvalidArgumentError(f"state backend: {e}") from None

    def tuning(self) -> RocksDBTuning:
        """The disk backend's instance settings."""
        return RocksDBTuning(
            memory_budget_bytes=self.memory_budget_bytes,
            compaction_style=self.compaction_style,
            compaction_trigger=self.compaction_trigger,
            max_size_amplification_percent=self.max_size_amplification_percent,
            upload_threads=self.upload_threads,
        )

    @classmethod
    def parse(cls, value: str | StateBackendConfig | None) -> StateBackendConfig:
        """A config from a name (``""`` means heap) or a config."""
        if isinstance(value, StateBackendConfig):
            return value
        return cls(kind=(value or HEAP).strip().lower())

    #: The fields a job's config (``StateBackendOptions``) can set.
    OPTION_FIELDS = (
        "memory_budget_bytes",
        "cache_entries",
        "compaction_style",
        "compaction_trigger",
        "max_size_amplification_percent",
        "upload_threads",
    )

    @classmethod
    def from_pb(cls, config: pb.CheckpointConfig, local_dir: str = "") -> StateBackendConfig:
        """The config a job's ``CheckpointConfig`` names: its backend, and each sizing field
        its ``state_backend_options`` sets (the others keep the defaults above)."""
        options = config.state_backend_options
        chosen = {
            name: getattr(options, name) for name in cls.OPTION_FIELDS if options.HasField(name)
        }
        return dataclasses.replace(cls.parse(config.state_backend), local_dir=local_dir, **chosen)

    def options_pb(self) -> pb.StateBackendOptions:
        """The sizing fields that differ from the defaults, for a job's config."""
        default = StateBackendConfig()
        return pb.StateBackendOptions(
            **{
                name: getattr(self, name)
                for name in self.OPTION_FIELDS
                if getattr(self, name) != getattr(default, name)
            }
        )


def create_keyed_backend(
    config: StateBackendConfig | str | None,
    max_parallelism: int,
    parallelism: int,
    index: int,
    *,
    name: str = "",
    clock: Clock | None = None,
) -> KeyedStateBackend:
    """The keyed backend of subtask ``index`` of ``parallelism``."""
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
        )
    return KeyedStateBackend(max_parallelism, kg_range, name=name, clock=clock)

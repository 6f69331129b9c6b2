"""Choosing a keyed state backend: ``heap`` (the default) or ``rocksdb`` (on local disk, with
incremental checkpoints). Both have one interface (:class:`KeyedStateBackend`'s) and the same
recovery contract; a savepoint of either restores into the other."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.rocksdb_backend import DEFAULT_CACHE_ENTRIES, RocksDBKeyedStateBackend
from snapflow.worker.state.rocksdb_local_recovery import discard_local_copies, local_copy_dir
from snapflow.worker.state.rocksdb_tuning import COMPACTION_STYLES, RocksDBTuning
from snapflow.worker.state.ttl import Clock

__all__ = ["BACKENDS", "HEAP", "ROCKSDB", "StateBackendConfig", "create_keyed_backend"]

HEAP = "heap"
ROCKSDB = "rocksdb"
BACKENDS = (HEAP, ROCKSDB)

LOCAL_DIR_ENV = "SNAPFLOW_STATE_DIR"

_TUNING = RocksDBTuning()  # the instance defaults, stated once (in rocksdb_backend.py)


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
    memory_budget_bytes: int = _TUNING.memory_budget_bytes
    """rocksdb: memtables (a quarter) and block cache (a half) of one instance."""
    compaction_style: str = _TUNING.compaction_style
    """rocksdb: ``universal`` (tiered: sorted runs merged when enough of similar size
    accumulate; low write amplification, so an incremental checkpoint uploads a few times the
    bytes it changed; up to ``max_size_amplification_percent`` more space) or ``level``
    (RocksDB's default: least space, but compactions rewrite about ten times the changed
    bytes, all of which the next checkpoint uploads). Why universal: docs/storage.md."""
    compaction_trigger: int = _TUNING.compaction_trigger
    """rocksdb: sorted runs (each checkpoint's memtable flush adds one) that accumulate before
    a compaction merges them; more runs, fewer rewrites, slower reads of absent keys."""
    max_size_amplification_percent: int = _TUNING.max_size_amplification_percent
    """rocksdb, universal: a full compaction runs when the runs above the oldest hold this
    percentage of its size (bounds the space; that checkpoint uploads the whole state)."""
    upload_threads: int = _TUNING.upload_threads
    """rocksdb: new SST files uploaded at once by a checkpoint's asynchronous part."""
    local_recovery: bool = False
    """rocksdb: keep the last completed checkpoint's files on the local disk and restore from
    them, not from checkpoint storage, when the subtask restarts on the same machine (Flink's
    ``state.backend.local-recovery``, off by default there too). Costs the disk space of
    one extra checkpoint per subtask; docs/storage.md, "Local recovery"."""
    local_recovery_dir: str = ""
    """rocksdb, local recovery: the root of the local copies (``<root>/<job>/<vertex>/
    <subtask>``); empty = ``snapflow-local-recovery`` in the system temporary directory."""

    def __post_init__(self) -> None:
        if self.kind not in BACKENDS:
            raise InvalidArgumentError(
                f"unknown state backend {self.kind!r:.100}: choose one of {', '.join(BACKENDS)}"
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
        "local_recovery",
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

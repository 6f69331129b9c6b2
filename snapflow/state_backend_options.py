"""A job's choice of keyed state backend and the sizing of the disk backend.

The one definition for everyone who handles it: the Spark bridge builds it
(``Pipeline.state_backend``), the coordinator validates and stores it in the job's
``CheckpointConfig`` (``snapflow.checkpoint_config``), and each worker opens its backends with
it (``snapflow.worker.state.factory``), where an unset field keeps the worker's default
(``worker/state/rocksdb_tuning.py``). Its proto mapping is in ``snapflow.wire``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from snapflow import limits
from snapflow.errors import InvalidFieldError

__all__ = [
    "COMPACTION_STYLES",
    "HEAP",
    "ROCKSDB",
    "STATE_BACKENDS",
    "StateBackendOptions",
    "parse_state_backend",
]

HEAP = "heap"
"""Python dicts in the task's memory; full snapshots."""
ROCKSDB = "rocksdb"
"""A local RocksDB instance per keyed subtask: state larger than memory, incremental
checkpoints (docs/storage.md)."""
STATE_BACKENDS = (HEAP, ROCKSDB)
LEVEL = "level"
UNIVERSAL = "universal"
COMPACTION_STYLES = (LEVEL, UNIVERSAL)
"""The rocksdb compaction styles (``worker/state/rocksdb_tuning.py`` applies them)."""

# Each integer field's bounds: wide enough for any real machine, narrow enough that a typo
# cannot ask for an absurd instance.
_BOUNDS: dict[str, tuple[int, int]] = {
    "memory_budget_bytes": (
        limits.MIN_STATE_MEMORY_BUDGET_BYTES,
        limits.MAX_STATE_MEMORY_BUDGET_BYTES,
    ),
    "cache_entries": (0, limits.MAX_STATE_CACHE_ENTRIES),
    "compaction_trigger": (2, limits.MAX_COMPACTION_TRIGGER),
    "max_size_amplification_percent": (1, limits.MAX_SIZE_AMPLIFICATION_PERCENT),
    "upload_threads": (1, limits.MAX_UPLOAD_THREADS),
}


def parse_state_backend(name: str) -> str:
    """A backend name as a user or a client writes it (any case, spaces around; empty means
    ``heap``) as one of :data:`STATE_BACKENDS`; ``InvalidFieldError`` naming
    ``state_backend`` otherwise."""
    if not isinstance(name, str):
        raise InvalidFieldError(
            "state_backend", f"state_backend must be a string ({', '.join(STATE_BACKENDS)})"
        )
    kind = name.strip().lower() or HEAP
    if kind not in STATE_BACKENDS:
        raise InvalidFieldError(
            "state_backend",
            f"state_backend {limits.echo(name)} is not one of {', '.join(STATE_BACKENDS)}",
        )
    return kind


@dataclass(frozen=True)
class StateBackendOptions:
    """The rocksdb backend's sizing as a job's config carries it. ``None`` keeps the worker's
    default for that field; the heap backend ignores them all. Validated on construction
    (``InvalidFieldError`` naming the field and its allowed range)."""

    memory_budget_bytes: int | None = None
    """Memtables (a quarter) and block cache (a half) of one instance; 1 MiB to 1 TiB."""
    cache_entries: int | None = None
    """Decoded values kept in the write-back cache of one instance (0 = none)."""
    compaction_style: str | None = None
    """``universal`` (tiered: sorted runs merged when enough of similar size accumulate; low
    write amplification, so an incremental checkpoint uploads a few times the bytes it changed;
    up to ``max_size_amplification_percent`` more space) or ``level`` (RocksDB's default: least
    space, but compactions rewrite about ten times the changed bytes, all of which the next
    checkpoint uploads). Why universal is the default: docs/storage.md."""
    compaction_trigger: int | None = None
    """Sorted runs (each checkpoint's memtable flush adds one) that accumulate before a
    compaction merges them (at least 2); more runs, fewer rewrites, slower reads of absent
    keys."""
    max_size_amplification_percent: int | None = None
    """Universal compaction: a full compaction runs when the runs above the oldest hold this
    percentage of its size (bounds the space; that checkpoint uploads the whole state)."""
    upload_threads: int | None = None
    """New SST files uploaded at once by a checkpoint's asynchronous part."""
    local_recovery: bool | None = None
    """Keep the last completed checkpoint's files on the local disk and restore from them, not
    from checkpoint storage, when the subtask restarts on the same machine (Flink's
    ``state.backend.local-recovery``, off by default there too). Costs the disk space of one
    extra checkpoint per subtask; docs/storage.md, "Local recovery"."""

    def __post_init__(self) -> None:
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidFieldError(name, f"{name} must be an integer, got {value!r:.80}")
            if not low <= value <= high:
                raise InvalidFieldError(name, f"{name} {value} is outside [{low}, {high}]")
        style = self.compaction_style
        if style is not None and style not in COMPACTION_STYLES:
            shown = limits.echo(style) if isinstance(style, str) else f"{style!r:.80}"
            raise InvalidFieldError(
                "compaction_style",
                f"compaction_style {shown} is not one of {', '.join(COMPACTION_STYLES)}",
            )
        if self.local_recovery is not None and not isinstance(self.local_recovery, bool):
            raise InvalidFieldError(
                "local_recovery",
                f"local_recovery must be True or False, got {self.local_recovery!r:.80}",
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The settings a job can choose, in declaration order."""
        return tuple(f.name for f in fields(cls))

"""How one RocksDB instance of the disk backend is sized and compacted: :class:`RocksDBTuning`
(its database's options, and those of the SST files it exports) and the write options.

Why universal compaction by default, and what the trigger trades: docs/storage.md, "State
larger than memory".
"""

from __future__ import annotations

from dataclasses import dataclass

import rocksdict

from snapflow.errors import StateError
from snapflow.state_backend_options import COMPACTION_STYLES, LEVEL, UNIVERSAL

__all__ = [
    "COMPACTION_STYLES",
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "LEVEL",
    "UNIVERSAL",
    "RocksDBTuning",
    "write_options",
]

DEFAULT_MEMORY_BUDGET_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RocksDBTuning:
    """How one RocksDB instance is sized and compacted (a job chooses these fields in its
    ``snapflow.state_backend_options.StateBackendOptions``, documented there)."""

    memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES
    compaction_style: str = UNIVERSAL
    compaction_trigger: int = 8
    max_size_amplification_percent: int = 200
    upload_threads: int = 4

    def __post_init__(self) -> None:
        if self.compaction_style not in COMPACTION_STYLES:
            raise StateError(
                f"unknown compaction style {self.compaction_style!r}: choose one of "
                f"{', '.join(COMPACTION_STYLES)}"
            )
        if (
            self.memory_budget_bytes <= 0
            or self.compaction_trigger < 2
            or self.max_size_amplification_percent < 1
            or self.upload_threads < 1
        ):
            raise StateError(
                "rocksdb tuning: memory_budget_bytes must be > 0, compaction_trigger >= 2, "
                "max_size_amplification_percent >= 1 and upload_threads >= 1"
            )

    def options(self) -> rocksdict.Options:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        # A quarter of the budget for memtables (two of them), half for the block cache.
        write_buffer = max(1 << 20, self.memory_budget_bytes // 8)
        opts.set_write_buffer_size(write_buffer)
        opts.set_max_write_buffer_number(2)
        opts.set_target_file_size_base(max(4 << 20, write_buffer))
        # Every checkpoint flushes the memtable, so each adds one small sorted run; the trigger
        # is how many runs accumulate before a compaction merges them (docs/storage.md).
        opts.set_level_zero_file_num_compaction_trigger(self.compaction_trigger)
        if self.compaction_style == UNIVERSAL:
            opts.set_compaction_style(rocksdict.DBCompactionStyle.universal())
            uco = rocksdict.UniversalCompactOptions()
            uco.max_size_amplification_percent = self.max_size_amplification_percent
            opts.set_universal_compaction_options(uco)
        else:
            opts.set_max_bytes_for_level_base(max(16 << 20, 4 * write_buffer))
        opts.set_compression_type(rocksdict.DBCompressionType.lz4())
        opts.set_max_background_jobs(2)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(rocksdict.Cache(max(1 << 20, self.memory_budget_bytes // 2)))
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        return opts


def write_options() -> rocksdict.WriteOptions:
    """The database's write options: no write-ahead log."""
    # No write-ahead log: the database is rebuilt from a checkpoint after any failure (as in
    # Flink), and a RocksDB checkpoint flushes the memtable itself.
    opts = rocksdict.WriteOptions()
    setattr(opts, "disable_wal", True)  # noqa: B010 - a property; the stubs call it a method
    return opts

"""worker/connectors/parquet_sink.py: the transactional Parquet sink (two-phase commit, only
committed files visible to pyarrow and to ``spark.read.parquet``)."""

from __future__ import annotations

import os
import pickle
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kit.sinks import (
    crash_after_a_lost_notice,
    crash_before_a_completion,
    crash_sink,
    finish_sink,
    kb,
    restore_sink,
    sink_ctx,
)
from kit.workers import check_exactly_once, expected_counts
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.worker.connectors.parquet_sink import (
    TransactionalParquetSink,
    committed_parquet_files,
    read_committed_parquet,
)
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.connectors.two_phase_commit import SinkCommitError
from snapflow.worker.state.operator_state import OperatorStateBackend

# The executors cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def committed(directory: Path) -> list[int]:
    table = read_committed_parquet(directory)
    return table.column("v").to_pylist() if table.num_rows else []


def visible(directory: Path) -> list[int]:
    """What a Hadoop-convention reader sees: pyarrow.dataset skips ``_``/``.`` names."""
    table = pq.read_table(directory)
    return sorted(table.column("v").to_pylist()) if table.num_rows else []


# ---------------------------------------------------------------------------------------------
# TransactionalParquetSink
# ---------------------------------------------------------------------------------------------


def test_parquet_two_phase_commit(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = TransactionalParquetSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1, 2]))
    sink.process_batch(kb([]))  # no rows: nothing
    sink.snapshot_state(1)
    assert committed(out) == [] and committed_parquet_files(out) == []  # pre-committed only
    (staged,) = os.listdir(out / "_staging")
    assert staged.endswith(".parquet")
    # the pre-committed staging file is a complete Parquet file, invisible in the directory
    assert pq.read_table(out / "_staging" / staged).column("v").to_pylist() == [1, 2]
    sink.process_batch(kb([3]))
    sink.notify_checkpoint_complete(1)
    assert committed(out) == [1, 2]
    assert visible(out) == [1, 2]
    # checkpoint 2's notification is lost, 3 is aborted: 4's completion commits them all
    sink.snapshot_state(2)
    sink.process_batch(kb([4]))
    sink.snapshot_state(3)
    sink.notify_checkpoint_aborted(3)
    assert [cid for cid, _ in sink.pending_transactions] == [2, 3]
    assert visible(out) == [1, 2]
    sink.snapshot_state(4)  # empty transaction: no file
    sink.notify_checkpoint_complete(4)
    assert committed(out) == [1, 2, 3, 4] and visible(out) == [1, 2, 3, 4]
    assert sink.pending_transactions == []
    sink.notify_checkpoint_complete(4)  # repeated: nothing happens
    sink.process_batch(kb([5]))
    sink.close()  # aborts the open transaction: its staging file is removed
    assert committed(out) == [1, 2, 3, 4] and os.listdir(out / "_staging") == []
    parts = sorted(n for n in os.listdir(out) if n != "_staging")
    assert all(n.startswith("part-0-") and n.endswith(".parquet") for n in parts)
    assert {n.split("-")[2] for n in parts} == {"1", "2", "3"}
    assert [os.path.basename(p) for p in committed_parquet_files(out)] == [
        sorted(parts, key=lambda n: int(n.split("-")[2]))[i] for i in range(3)
    ]


def test_parquet_errors_idempotent_commit_and_options(tmp_path: Path) -> None:
    sink = TransactionalParquetSink(tmp_path, compression="zstd", row_group_size=2)
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1, 2, 3, 4, 5]))
    with pytest.raises(InvalidArgumentError, match="schema"):
        sink.process_batch(pa.RecordBatch.from_pydict({"w": [1]}))
    sink.snapshot_state(1)
    txn = sink.pending_transactions[0][1]
    sink.notify_checkpoint_complete(1)
    sink.commit(txn)  # committed already: a no-op
    assert committed(tmp_path) == [1, 2, 3, 4, 5]
    (part,) = committed_parquet_files(tmp_path)
    meta = pq.ParquetFile(part).metadata
    assert meta.num_row_groups == 3
    assert meta.row_group(0).column(0).compression == "ZSTD"
    lost = txn.__class__(**{**txn.__dict__, "part_name": "part-0-9-9-abcdef12.parquet"})
    with pytest.raises(SinkCommitError):
        sink.commit(lost)  # neither staging nor target: the data is gone
    (tmp_path / "part-junk.parquet").write_bytes(b"not ours")
    assert committed(tmp_path) == [1, 2, 3, 4, 5]
    assert read_committed_parquet(tmp_path / "missing").num_rows == 0
    schema = pa.schema([("v", pa.int64())])
    assert read_committed_parquet(tmp_path / "missing", schema).schema == schema
    with pytest.raises(InvalidArgumentError):
        TransactionalParquetSink(tmp_path, row_group_size=0)
    sink.close()


def test_parquet_sink_pickles_without_runtime_state(tmp_path: Path) -> None:
    sink = TransactionalParquetSink(tmp_path, compression="gzip")
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1]))
    copy = pickle.loads(pickle.dumps(sink))
    assert copy.directory == str(tmp_path) and copy.compression == "gzip"
    assert not hasattr(copy, "_writers") and not hasattr(copy, "_current")
    sink.close()


def _restored(out: Path, cid: int, handles: list[Any], attempt: int) -> Any:
    return restore_sink(TransactionalParquetSink(out), cid, handles, attempt)


@pytest.mark.parametrize("twice", [False, True])
def test_parquet_restore_recommits_pending_no_duplicates(tmp_path: Path, twice: bool) -> None:
    out = tmp_path / "out"
    h2 = crash_after_a_lost_notice(TransactionalParquetSink(out), tmp_path)
    assert visible(out) == [1, 2]
    attempt = 1
    if twice:  # the first recovery re-commits 2, then crashes again before any checkpoint
        again = _restored(out, 2, h2, attempt)
        assert visible(out) == [1, 2, 3, 4]
        again.process_batch(kb([5, 6]))
        crash_sink(again)
        attempt += 1
    restored = _restored(out, 2, h2, attempt)  # re-commit: idempotent
    assert committed(out) == [1, 2, 3, 4]
    finish_sink(restored, [5, 6], 3, tmp_path)  # the replay
    assert committed(out) == [1, 2, 3, 4, 5, 6]
    assert visible(out) == [1, 2, 3, 4, 5, 6]
    # the restored current transaction (row 5) was aborted; the one written after the first
    # recovery (no checkpoint recorded it) stays as an orphan in _staging, never visible
    assert len(os.listdir(out / "_staging")) == (1 if twice else 0)


def test_parquet_restore_of_an_earlier_checkpoint_discards_later_data(tmp_path: Path) -> None:
    out = tmp_path / "out"
    h1 = crash_before_a_completion(TransactionalParquetSink(out), tmp_path)  # 2 never completes
    restored = _restored(out, 1, h1, 1)
    finish_sink(restored, [2, 3], 2, tmp_path)
    assert committed(out) == [1, 2, 3] and visible(out) == [1, 2, 3]
    # the file pre-committed for the failed checkpoint 2 was checkpoint 1's current
    # transaction: the restore aborted (deleted) it
    assert os.listdir(out / "_staging") == []


# ---------------------------------------------------------------------------------------------
# On local Spark: a keyed count into the Parquet sink, read back by spark.read.parquet
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_pipeline_on_spark_writes_parquet_spark_reads(spark: Any, tmp_path: Path) -> None:
    from snapflow.spark_bridge import JobStatus, Pipeline

    out = tmp_path / "out"
    source = GeneratorSource(
        total_records=2000, rate_per_s=8000, num_keys=25, batch_size=256, seed=5
    )
    p = Pipeline("parquet-count", parallelism=2, max_parallelism=64)
    p.source(source, name="events").key_by("key").count().sink(TransactionalParquetSink(out))
    p.checkpointing(interval_ms=100, storage=tmp_path / "cp")
    result = p.run(spark, timeout_s=120.0)
    assert result.state is JobStatus.FINISHED and result.restarts == 0
    assert result.checkpoints_completed >= 1
    expected = expected_counts(source, 2)
    committed_table = read_committed_parquet(out)
    check_exactly_once(committed_table, expected)
    # an uncommitted (staging) Parquet file with rows that must never be read
    pq.write_table(
        pa.table({"key": pa.array([999], pa.int64()), "count": pa.array([1], pa.int64())}),
        out / "_staging" / "orphan.parquet",
    )
    rows = [(r["key"], r["count"]) for r in spark.read.parquet(str(out)).collect()]
    assert len(rows) == committed_table.num_rows  # the committed rows, each once
    assert Counter(rows) == Counter(
        zip(
            committed_table.column("key").to_pylist(),
            committed_table.column("count").to_pylist(),
            strict=True,
        )
    )
    assert len(set(rows)) == len(rows), "a running count was committed twice"
    finals: dict[int, int] = {}
    for key, count in rows:
        finals[key] = max(finals.get(key, 0), count)
    assert finals == dict(expected)

"""Extra sinks (worker/sinks_extra.py): the transactional Parquet sink (two-phase commit, only
committed files visible to pyarrow and to ``spark.read.parquet``), and the idempotent Redis hash
sink against a real redis-server."""

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
import redis
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

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.connectors.parquet_sink import (
    TransactionalParquetSink,
    committed_parquet_files,
    read_committed_parquet,
)
from snapflow.worker.connectors.redis_sink import RedisSink
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.connectors.two_phase_commit import SinkCommitError
from snapflow.worker.runtime.operator import Chain, OperatorContext
from snapflow.worker.state.backend import OperatorStateBackend

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


# ---------------------------------------------------------------------------------------------
# RedisSink
# ---------------------------------------------------------------------------------------------


def counts(rows: list[tuple[int, int]]) -> pa.RecordBatch:
    keys, values = zip(*rows, strict=True) if rows else ((), ())
    return pa.RecordBatch.from_pydict(
        {"key": pa.array(keys, pa.int64()), "count": pa.array(values, pa.int64())}
    )


def hashes(url: str, pattern: str = "*") -> dict[str, dict[str, str]]:
    r: Any = redis.Redis.from_url(url, decode_responses=True)
    try:
        keys: list[str] = sorted(r.scan_iter(match=pattern))
        return {k: dict(r.hgetall(k)) for k in keys}
    finally:
        r.close()


def test_redis_sink_writes_on_snapshot_only(redis_url: str) -> None:
    sink = RedisSink(redis_url, "key", ["count"], key_prefix="cnt:")
    sink.open(sink_ctx(OperatorStateBackend()))
    assert sink._client is None  # lazy: no connection before the first write
    assert sink.process_batch(counts([(1, 1), (2, 1), (1, 2)])) == []
    assert sink.buffered_rows == 3
    assert hashes(redis_url) == {}  # buffered until the barrier
    sink.snapshot_state(1)
    assert sink.buffered_rows == 0
    assert hashes(redis_url) == {"cnt:1": {"count": "2"}, "cnt:2": {"count": "1"}}
    sink.process_batch(counts([(2, 2)]))
    sink.notify_checkpoint_complete(1)
    assert hashes(redis_url)["cnt:2"] == {"count": "1"}
    assert sink.end_input() == []  # end of input flushes too
    assert hashes(redis_url)["cnt:2"] == {"count": "2"}
    sink.snapshot_state(2)  # nothing buffered: nothing to write
    sink.close()
    assert sink._client is None


def test_redis_sink_replay_is_idempotent(redis_url: str) -> None:
    rows = [(k, c) for c in range(1, 4) for k in range(5)]  # running counts, upserts
    once = RedisSink(redis_url, "key", key_prefix="a:")
    once.open(sink_ctx(OperatorStateBackend()))
    once.process_batch(counts(rows))
    once.snapshot_state(1)
    once.close()
    # a run that checkpoints after 6 rows, writes 4 more, fails, and replays from the checkpoint
    twice = RedisSink(redis_url, "key", key_prefix="b:", max_buffered_rows=4)
    twice.open(sink_ctx(OperatorStateBackend()))
    twice.process_batch(counts(rows[:6]))  # flushed early (buffer of 4 rows reached)
    twice.snapshot_state(1)
    twice.process_batch(counts(rows[6:10]))  # flushed (threshold): after the checkpoint
    assert hashes(redis_url, "b:*")["b:0"] == {"count": "2"}
    twice.close()  # the failure
    replay = cloudpickle.loads(cloudpickle.dumps(RedisSink(redis_url, "key", key_prefix="b:")))
    replay.open(sink_ctx(OperatorStateBackend(), restored=1))
    replay.process_batch(counts(rows[6:]))  # rows 6..9 are written a second time
    replay.snapshot_state(2)
    replay.close()
    a, b = hashes(redis_url, "a:*"), hashes(redis_url, "b:*")
    assert {k[2:]: v for k, v in a.items()} == {k[2:]: v for k, v in b.items()}
    assert a == {f"a:{k}": {"count": "3"} for k in range(5)}
    # the same rows written twice: the same final hashes
    again = RedisSink(redis_url, "key", key_prefix="a:")
    again.open(sink_ctx(OperatorStateBackend()))
    again.process_batch(counts(rows))
    again.process_batch(counts(rows))
    again.snapshot_state(3)
    again.close()
    assert hashes(redis_url, "a:*") == a


def test_redis_sink_composite_keys_values_and_nulls(redis_url: str) -> None:
    sink = RedisSink(redis_url, ("key", "window_start"), key_prefix="win:", key_separator="|")
    sink.open(sink_ctx(OperatorStateBackend()))
    batch = pa.RecordBatch.from_pydict(
        {
            "key": ["a", "b"],
            "window_start": pa.array([0, 1000], pa.int64()),
            "sum": [1.5, None],
            "ok": [True, False],
            "tag": [b"x", b"y"],
        }
    )
    sink.process_batch(batch)
    sink.snapshot_state(1)
    assert hashes(redis_url) == {
        "win:a|0": {"sum": "1.5", "ok": "true", "tag": "x"},
        "win:b|1000": {"ok": "false", "tag": "y"},
    }
    # a null deletes the field; other fields are left as they are
    sink.process_batch(
        pa.RecordBatch.from_pydict(
            {"key": ["a"], "window_start": [0], "sum": [None], "ok": [False], "tag": ["z"]}
        )
    )
    sink.snapshot_state(2)
    assert hashes(redis_url)["win:a|0"] == {"ok": "false", "tag": "z"}
    with pytest.raises(InvalidArgumentError, match="no field"):
        sink.process_batch(pa.RecordBatch.from_pydict({"key": ["a"], "sum": [1]}))
    with pytest.raises(InvalidArgumentError, match="null key"):
        sink.process_batch(
            pa.RecordBatch.from_pydict({"key": [None], "window_start": [0], "sum": [1]})
        )
    sink.close()


def test_redis_sink_validation_pickling_and_failed_flush(redis_url: str) -> None:
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, ())
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, "key", ["key"])
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, "key", [])
    with pytest.raises(InvalidArgumentError):
        RedisSink(redis_url, "key", max_buffered_rows=0)
    with pytest.raises(StateError):
        RedisSink(redis_url, "key").flush()  # not open
    sink = RedisSink(redis_url, "key", ["count"])
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(counts([(1, 1)]))
    sink.snapshot_state(1)
    assert sink._client is not None
    copy = pickle.loads(pickle.dumps(sink))  # the open client is not shipped
    assert "_client" not in copy.__dict__ and copy.url == redis_url
    sink.close()
    # Redis unreachable: the snapshot (hence the checkpoint) fails, the rows stay buffered
    down = RedisSink("redis://127.0.0.1:1/0", "key")
    down.open(sink_ctx(OperatorStateBackend()))
    down.process_batch(counts([(1, 1)]))
    with pytest.raises(redis.ConnectionError):
        down.snapshot_state(1)
    assert down.buffered_rows == 1
    down.url = redis_url
    down._client = None
    down.snapshot_state(2)  # the retry writes them
    assert down.buffered_rows == 0 and hashes(redis_url) == {"1": {"count": "1"}}
    down.close()


def test_redis_sink_in_a_chain_flushes_at_the_barrier(redis_url: str) -> None:
    source = GeneratorSource(500, batch_size=50, num_keys=7, seed=1)
    sink = RedisSink(redis_url, "key", ["value", "ts"], key_prefix="g:")
    chain = Chain([source, sink])
    chain.open(OperatorContext(vertex_id="v", operator_id="x"))
    while chain.poll_batch(64) is not None:
        pass
    chain.snapshot_state(1)
    chain.close()
    last: dict[int, dict[str, str]] = {}
    for i in range(500):
        rec = source.record(0, i)
        last[rec["key"]] = {"value": str(rec["value"]), "ts": str(rec["ts"])}
    assert hashes(redis_url) == {f"g:{k}": v for k, v in sorted(last.items())}

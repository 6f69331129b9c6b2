"""worker/connectors/file_sources.py: the file source (every format, exact resume, rescale,
rate limit) and the DataFrame source (Spark: exactly once, resume, end to end)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kit.clock import ManualClock
from kit.sources import drain
from kit.sources import src_ctx as _src_ctx
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.connectors.file_sources import (
    DataFrameSource,
    FileSource,
    list_data_files,
    source_from_dataframe,
)
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("ts", pa.int64())])


def src_ctx(*args: Any, **kwargs: Any) -> OperatorContext:
    return _src_ctx(*args, vertex_id="src", operator_id="files", **kwargs)


def snapshot(backend: OperatorStateBackend, source: Any, cid: int, directory: Path) -> list[Any]:
    source.snapshot_state(cid)
    return backend.snapshot(cid).write(str(directory / f"chk-{cid}"))


def rows_of(file_no: int, n: int) -> list[dict[str, Any]]:
    return [
        {"id": file_no * 1000 + i, "name": f"f{file_no}-r{i}", "ts": file_no * 100 + i}
        for i in range(n)
    ]


def write_files(directory: Path, fmt: str, sizes: list[int]) -> list[dict[str, Any]]:
    """Files ``part-<k>`` with ``sizes[k]`` rows each; returns all rows in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    everything: list[dict[str, Any]] = []
    for k, n in enumerate(sizes):
        rows = rows_of(k, n)
        everything.extend(rows)
        path = directory / f"part-{k:03d}.{fmt}"
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        if fmt == "csv":
            lines = ["id,name,ts"] + [f"{r['id']},{r['name']},{r['ts']}" for r in rows]
            path.write_text("\n".join(lines) + "\n")
        elif fmt == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif fmt == "parquet":
            pq.write_table(table, path, row_group_size=7)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
                writer.write_table(table, max_chunksize=5)
    (directory / "_SUCCESS").write_text("")
    (directory / ".hidden.crc").write_text("x")
    return everything


# ---------------------------------------------------------------------------------------------
# FileSource
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet", "arrow"])
def test_file_source_reads_every_format_in_file_order(fmt: str, tmp_path: Path) -> None:
    expected = write_files(tmp_path / "in", fmt, [5, 0, 12, 3])
    schema = SCHEMA if fmt in ("csv", "jsonl") else None
    src = FileSource(tmp_path / "in", fmt, schema, batch_size=4)
    src.open(src_ctx())
    batches = []
    while (b := src.poll_batch(1 << 20)) is not None:
        assert b.schema == SCHEMA
        assert b.num_rows <= 4
        batches.append(b)
    assert [r for b in batches for r in b.to_pylist()] == expected
    assert src.poll_batch(10) is None
    assert src.current_watermark() == MAX_WATERMARK
    assert list_data_files(tmp_path / "in") == [f"part-{k:03d}.{fmt}" for k in range(4)]


def test_file_source_schema_inferred_from_first_file_and_errors(tmp_path: Path) -> None:
    expected = write_files(tmp_path / "in", "csv", [3, 4])
    src = FileSource(tmp_path / "in", "csv", batch_size=100)
    src.open(src_ctx())
    assert drain(src) == expected
    empty = tmp_path / "empty"
    empty.mkdir()
    none = FileSource(empty, "parquet")
    none.open(src_ctx())
    assert none.poll_batch(10) is None
    assert none.current_watermark() == MAX_WATERMARK
    with pytest.raises(InvalidArgumentError):
        FileSource(tmp_path, "xml")
    with pytest.raises(InvalidArgumentError):
        FileSource(tmp_path / "in", "csv", batch_size=0)
    missing = FileSource(tmp_path / "nope", "csv")
    with pytest.raises(InvalidArgumentError):
        missing.open(src_ctx())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.csv").write_text("id,name,ts\n1,a,2\n")
    (bad / "b.csv").write_text("other\n1\n")
    mismatch = FileSource(bad, "csv")
    mismatch.open(src_ctx())
    with pytest.raises(StateError, match=r"b\.csv"):
        drain(mismatch)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_file_source_resumes_exactly_after_restore(fmt: str, tmp_path: Path) -> None:
    write_files(tmp_path / "in", fmt, [10, 7, 9])
    backend = OperatorStateBackend()
    src = FileSource(tmp_path / "in", fmt, SCHEMA, batch_size=4, timestamp_field="ts")
    src.open(src_ctx(backend=backend))
    # a batch never spans two files: 3 + 3 + 3 + 1 rows of file 0, then 3 rows of file 1
    before = [r for _ in range(5) for r in src.poll_batch(3).to_pylist()]  # type: ignore[union-attr]
    assert src.positions == [
        (f"part-000.{fmt}", 10, 10),
        (f"part-001.{fmt}", 3, 7),
        (f"part-002.{fmt}", 0, None),
    ]
    handles = snapshot(backend, src, 1, tmp_path)
    wm = src.current_watermark()
    lost = drain(src, 5)

    # a file appearing after the first start is not read by the restored job
    write_files(tmp_path / "in", fmt, [10, 7, 9, 4])
    restored = OperatorStateBackend()
    restored.restore({0: handles}, 0, 1)
    again = cloudpickle.loads(
        cloudpickle.dumps(
            FileSource(tmp_path / "in", fmt, SCHEMA, batch_size=4, timestamp_field="ts")
        )
    )
    again.open(src_ctx(backend=restored, restored=1))
    assert again.positions == [
        (f"part-000.{fmt}", 10, 10),
        (f"part-001.{fmt}", 3, 7),
        (f"part-002.{fmt}", 0, None),
    ]
    assert again.current_watermark() == wm
    replay = drain(again, 5)
    assert replay == lost
    assert before + replay == rows_of(0, 10) + rows_of(1, 7) + rows_of(2, 9)
    assert again.current_watermark() == MAX_WATERMARK


def test_file_source_watermark_waits_for_unread_files(tmp_path: Path) -> None:
    write_files(tmp_path / "in", "parquet", [3, 3])
    src = FileSource(tmp_path / "in", "parquet", batch_size=2, timestamp_field="ts")
    src.open(src_ctx())
    src.poll_batch(10)
    assert src.current_watermark() < 0  # file 1 not started: could hold any event time
    no_ts = FileSource(tmp_path / "in", "parquet")
    no_ts.open(src_ctx())
    no_ts.poll_batch(1)
    assert no_ts.current_watermark() == MIN_WATERMARK


@pytest.mark.parametrize(("old_p", "new_p"), [(3, 2), (2, 5), (3, 1), (1, 3)])
def test_file_source_rescale_no_loss_no_duplicates(old_p: int, new_p: int, tmp_path: Path) -> None:
    expected = write_files(tmp_path / "in", "jsonl", [11, 4, 0, 9, 13, 6, 1])
    before: list[dict[str, Any]] = []
    handles: dict[int, list[Any]] = {}
    for s in range(old_p):
        backend = OperatorStateBackend()
        src = FileSource(tmp_path / "in", "jsonl", SCHEMA, batch_size=3)
        src.open(src_ctx(s, old_p, backend))
        for _ in range(s + 2):
            b = src.poll_batch(3)
            if b is not None:
                before.extend(b.to_pylist())
        handles[s] = snapshot(backend, src, 7, tmp_path / f"s{s}")
    after: list[dict[str, Any]] = []
    for s in range(new_p):
        backend = OperatorStateBackend()
        backend.restore(handles, s, new_p)
        src = FileSource(tmp_path / "in", "jsonl", SCHEMA, batch_size=3)
        src.open(src_ctx(s, new_p, backend, restored=7))
        after.extend(drain(src, 2))
        assert src.current_watermark() == MAX_WATERMARK
    everything = before + after
    assert len(everything) == len(expected)
    assert sorted(r["id"] for r in everything) == sorted(r["id"] for r in expected)


def test_file_source_fixed_file_list_and_rate_limit(tmp_path: Path) -> None:
    write_files(tmp_path / "in", "parquet", [50, 50])
    src = FileSource(tmp_path / "in", "parquet", files=["part-001.parquet"], rate_per_s=20)
    # The token bucket on a manual clock. FileSource.open may start the bucket on the real
    # monotonic clock: the manual one starts there, and the first poll comes after a stall,
    # which re-bases the bucket on it (with at most one second of burst).
    clock = ManualClock(time.monotonic())
    src.clock = clock
    src.open(src_ctx())
    clock.advance(3600)
    polled = [src.poll_batch(1000) for _ in range(2)]
    clock.advance(0.5)
    polled.append(src.poll_batch(1000))
    clock.advance(1.0)
    polled += [src.poll_batch(1000), src.poll_batch(1000)]
    assert [None if b is None else b.num_rows for b in polled] == [20, 0, 10, 20, None]
    assert [r for b in polled if b is not None for r in b.to_pylist()] == rows_of(1, 50)
    gone = FileSource(tmp_path / "in", "parquet", files=["missing.parquet"])
    gone.open(src_ctx())
    with pytest.raises(StateError, match="gone"):
        gone.poll_batch(10)


# ---------------------------------------------------------------------------------------------
# DataFrameSource
# ---------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_dataframe_source_reads_exactly_once_and_resumes(spark: Any, tmp_path: Path) -> None:
    n = 1000
    df = spark.range(n).selectExpr("id", "concat('row-', cast(id AS string)) AS name")
    src = DataFrameSource.from_dataframe(df, tmp_path / "staging", partitions=4, batch_size=64)
    assert src.files is not None and len(src.files) == 4
    assert src.schema is not None and src.schema.names == ["id", "name"]
    with pytest.raises(InvalidArgumentError, match="not empty"):
        DataFrameSource.from_dataframe(df, tmp_path / "staging")

    # a complete read with 3 subtasks: every row exactly once
    ids: list[int] = []
    for s in range(3):
        sub = cloudpickle.loads(cloudpickle.dumps(src))
        sub.open(src_ctx(s, 3))
        ids.extend(r["id"] for r in drain(sub, 100))
    assert sorted(ids) == list(range(n))

    # 2 subtasks, snapshot mid-way, restore with parallelism 3
    before: list[int] = []
    handles: dict[int, list[Any]] = {}
    for s in range(2):
        backend = OperatorStateBackend()
        sub = cloudpickle.loads(cloudpickle.dumps(src))
        sub.open(src_ctx(s, 2, backend))
        for _ in range(3):
            b = sub.poll_batch(50)
            assert b is not None
            before.extend(b.column("id").to_pylist())
        handles[s] = snapshot(backend, sub, 3, tmp_path / f"s{s}")
        sub.poll_batch(50)  # read after the checkpoint: replayed after the restore
    after: list[int] = []
    for s in range(3):
        backend = OperatorStateBackend()
        backend.restore(handles, s, 3)
        sub = cloudpickle.loads(cloudpickle.dumps(src))
        sub.open(src_ctx(s, 3, backend, restored=3))
        after.extend(r["id"] for r in drain(sub, 70))
    assert len(before) == 300
    assert sorted(before + after) == list(range(n))


@pytest.mark.spark
def test_source_from_dataframe_adds_a_source_vertex(spark: Any, tmp_path: Path) -> None:
    from snapflow.spark_bridge.pipeline import Pipeline

    spark.range(10).createOrReplaceTempView("extra_sources_t")
    p = Pipeline("dfsrc", parallelism=2)
    stream = source_from_dataframe(p, spark.range(20), tmp_path / "a", name="df")
    assert stream is not None
    table_src = DataFrameSource.from_table(spark, "extra_sources_t", tmp_path / "b")
    files = table_src.files or []
    rows: list[int] = []
    for s in range(2):
        table_src.open(src_ctx(s, 2))
        rows.extend(r["id"] for r in drain(table_src))
    assert files and sorted(rows) == list(range(10))


@pytest.mark.spark
def test_dataframe_source_end_to_end_on_spark(spark: Any, tmp_path: Path) -> None:
    from snapflow.spark_bridge.pipeline import Pipeline
    from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed

    n = 500
    df = spark.range(n).selectExpr("id", "id * 2 AS double_id")
    p = Pipeline("df-to-files", parallelism=2)
    stream = source_from_dataframe(
        p, df, tmp_path / "staging", name="df", partitions=5, batch_size=37
    )
    stream.sink(TransactionalFileSink(str(tmp_path / "out")))
    p.checkpointing(interval_ms=100, storage=tmp_path / "cp")
    p.run(spark, timeout_s=120)
    committed = read_committed(tmp_path / "out")
    assert sorted(committed.column("id").to_pylist()) == list(range(n))
    assert sorted(committed.column("double_id").to_pylist()) == [2 * i for i in range(n)]

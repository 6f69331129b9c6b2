"""worker/sources_extra.py: file source (exact resume, rescale), DataFrame source (Spark), and
the socket text source (non-blocking reads, reconnect, at-most-once)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kit.polling import wait_until
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
from snapflow.worker.connectors.socket_source import SocketTextSource
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.backend import OperatorStateBackend

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
    src = FileSource(tmp_path / "in", "parquet", files=["part-001.parquet"], rate_per_s=1000)
    src.open(src_ctx())
    start = time.monotonic()
    rows = drain(src)
    assert rows == rows_of(1, 50)
    assert time.monotonic() - start >= 0.03  # 50 rows at 1000/s: ~50 ms, not instant
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


# ---------------------------------------------------------------------------------------------
# SocketTextSource
# ---------------------------------------------------------------------------------------------


class LineServer:
    """A local TCP server: each accepted connection gets the next script (a list of byte
    chunks, sent with a short pause), then is closed."""

    def __init__(self, scripts: list[list[bytes]]) -> None:
        self.scripts = list(scripts)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set() and self.scripts:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            script = self.scripts.pop(0)
            with conn:
                for chunk in script:
                    if chunk == b"WAIT":
                        self.release.wait(5)
                        continue
                    conn.sendall(chunk)
                    time.sleep(0.01)

    def close(self) -> None:
        self.stop.set()
        self.release.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    servers: list[LineServer] = []

    def make(scripts: list[list[bytes]]) -> LineServer:
        servers.append(LineServer(scripts))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def poll_until(src: SocketTextSource, count: int, max_records: int = 100) -> list[str]:
    """The lines the source emits until ``count`` came (or the wait timed out: fewer)."""
    lines: list[str] = []

    def enough() -> bool:
        b = src.poll_batch(max_records)
        assert b is not None  # unbounded: never None
        assert b.num_rows <= max_records
        lines.extend(b.column("line").to_pylist())
        return len(lines) >= count

    wait_until(enough, f"{count} lines", timeout_s=5, interval_s=0.005)
    return lines


def test_socket_source_lines_nonblocking_and_reconnect(server_factory: Any) -> None:
    server = server_factory(
        [
            [b"hello\nwor", b"ld\r\n", b"WAIT", "caf\u00e9\n".encode(), b"tail-no-newline"],
            [b"second connection\n"],
        ]
    )
    src = SocketTextSource("127.0.0.1", server.port, reconnect_delay_s=0.01)
    src.open(src_ctx())
    assert poll_until(src, 2) == ["hello", "world"]
    # nothing more is sent until released: polls return 0-row batches right away
    start = time.monotonic()
    for _ in range(5):
        b = src.poll_batch(10)
        assert b is not None and b.num_rows == 0
    assert time.monotonic() - start < 0.5
    assert src.connected
    server.release.set()
    # clean end of stream: the unterminated last line is emitted; then reconnect
    assert poll_until(src, 3) == ["caf\u00e9", "tail-no-newline", "second connection"]
    assert server.accepted == 2
    assert src.current_watermark() == MIN_WATERMARK
    src.close()
    assert not src.connected


def test_socket_source_max_records_pending_survive_checkpoint(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory([[b"".join(b"l%d\n" % i for i in range(10)), b"WAIT"]])
    backend = OperatorStateBackend()
    src = SocketTextSource("127.0.0.1", server.port)
    src.open(src_ctx(backend=backend))
    got = poll_until(src, 3, max_records=3)
    assert got == ["l0", "l1", "l2"]

    def received_all() -> bool:  # received, not yet emitted
        src.poll_batch(0)
        src._receive(100)
        return len(src._pending) >= 7

    wait_until(received_all, "7 lines pending", timeout_s=5, interval_s=0.005)
    handles = snapshot(backend, src, 1, tmp_path)
    src.close()
    # restore: the lines received before the checkpoint but not emitted come out; nothing is
    # replayed from the socket (lines received after the checkpoint would be lost)
    restored = OperatorStateBackend()
    restored.restore({0: handles}, 0, 1)
    again = cloudpickle.loads(cloudpickle.dumps(SocketTextSource("127.0.0.1", server.port)))
    again.open(src_ctx(backend=restored, restored=1))
    b = again.poll_batch(100)
    assert b is not None
    assert b.column("line").to_pylist()[:7] == [f"l{i}" for i in range(3, 10)]
    again.close()


def test_socket_source_other_subtasks_idle_and_connect_failures(server_factory: Any) -> None:
    idle = SocketTextSource("127.0.0.1", 9)
    idle.open(src_ctx(1, 2))
    b = idle.poll_batch(10)
    assert b is not None and b.num_rows == 0
    assert not idle.connected
    assert idle.current_watermark() == MAX_WATERMARK

    # a port with no listener: retried after the delay, then ConnectionError
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    failing = SocketTextSource("127.0.0.1", port, reconnect_delay_s=0.0, max_reconnects=2)
    failing.open(src_ctx())
    for _ in range(2):
        b = failing.poll_batch(10)
        assert b is not None and b.num_rows == 0
    with pytest.raises(ConnectionError):
        failing.poll_batch(10)
    with pytest.raises(InvalidArgumentError):
        SocketTextSource("127.0.0.1", 0)


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

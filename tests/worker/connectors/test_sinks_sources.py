"""Split sources (worker/connectors/split_sources.py) and sinks (file_sink.py, debug_sinks.py):
determinism, exact resume, and exactly-once output of the two-phase-commit file sink across
simulated crashes."""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kit.clock import ManualClock
from kit.sinks import kb, sink_ctx
from kit.sources import drain
from kit.sources import src_ctx as _src_ctx
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.connectors.debug_sinks import CollectSink, PrintSink
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import (
    GENERATOR_SCHEMA,
    GeneratorSource,
    SequenceSource,
)
from snapflow.worker.connectors.two_phase_commit import SinkCommitError, TwoPhaseCommitSink
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.operator import OperatorContext
from snapflow.worker.state.operator_state import OperatorStateBackend


def src_ctx(*args: Any, **kwargs: Any) -> OperatorContext:
    return _src_ctx(*args, vertex_id="src", operator_id="gen", **kwargs)


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


def test_generator_is_a_pure_function_of_seed_split_index() -> None:
    a = GeneratorSource(None, num_keys=17, batch_size=100, seed=3, max_out_of_orderness_ms=5)
    b = GeneratorSource(None, num_keys=17, batch_size=37, seed=3, max_out_of_orderness_ms=5)
    a.open(src_ctx(1, 2))
    b.open(src_ctx(1, 2))
    rows_a = [r for _ in range(3) for r in a.poll_batch(100).to_pylist()]  # type: ignore[union-attr]
    rows_b = [r for _ in range(9) for r in b.poll_batch(1000).to_pylist()]  # type: ignore[union-attr]
    assert rows_a == rows_b[:300]
    assert rows_a == [a.record(1, i) for i in range(300)]
    assert all(0 <= r["key"] < 17 and 0 <= r["value"] < 1000 for r in rows_a)
    assert all(i - 5 <= r["ts"] <= i for i, r in enumerate(rows_a))
    assert len({r["key"] for r in rows_a}) == 17
    other_split = GeneratorSource(None, num_keys=17, seed=3)
    other_seed = GeneratorSource(None, num_keys=17, seed=4)
    assert [other_split.record(0, i) for i in range(50)] != rows_a[:50]
    assert [other_seed.record(1, i) for i in range(50)] != rows_a[:50]


def test_generator_watermark_never_makes_its_records_late() -> None:
    src = GeneratorSource(
        None, num_keys=5, batch_size=50, max_out_of_orderness_ms=20, start_ms=1000, interval_ms=3
    )
    src.open(src_ctx())
    assert src.current_watermark() == MIN_WATERMARK
    wm = MIN_WATERMARK
    for _ in range(40):
        batch = src.poll_batch(50)
        assert batch is not None and batch.schema == GENERATOR_SCHEMA
        assert min(batch["ts"].to_pylist()) > wm
        new = src.current_watermark()
        assert new >= wm
        wm = new
    assert wm == max(src.record(0, i)["ts"] for i in range(2000)) - 21


def test_bounded_generator_splits_total_over_subtasks() -> None:
    totals = []
    for s in range(3):
        src = GeneratorSource(10, batch_size=2)
        src.open(src_ctx(s, 3))
        rows = drain(src)
        assert rows == [src.record(s, i) for i in range(len(rows))]
        assert src.poll_batch(5) is None and src.current_watermark() == MAX_WATERMARK
        totals.append(len(rows))
    assert totals == [4, 3, 3]
    src = GeneratorSource(0)
    src.open(src_ctx())
    assert src.poll_batch(10) is None


def test_max_records_and_empty_batches() -> None:
    src = GeneratorSource(None, batch_size=100)
    src.open(src_ctx())
    assert src.poll_batch(7).num_rows == 7  # type: ignore[union-attr]
    assert src.poll_batch(1000).num_rows == 100  # type: ignore[union-attr]
    empty = src.poll_batch(0)
    assert empty is not None and empty.num_rows == 0 and empty.schema == GENERATOR_SCHEMA
    with pytest.raises(InvalidArgumentError):
        GeneratorSource(-1)
    with pytest.raises(InvalidArgumentError):
        GeneratorSource(None, batch_size=0)


def _snapshot(backend: OperatorStateBackend, source: Any, cid: int, directory: Path) -> list[Any]:
    source.snapshot_state(cid)
    return backend.snapshot(cid).write(directory / f"chk-{cid}")


def test_generator_resumes_exactly_after_restore(tmp_path: Path) -> None:
    backend = OperatorStateBackend()
    src = GeneratorSource(None, batch_size=64, seed=9, max_out_of_orderness_ms=3)
    src.open(src_ctx(backend=backend))
    for _ in range(5):
        src.poll_batch(50)
    handles = _snapshot(backend, src, 1, tmp_path)
    wm_at_checkpoint = src.current_watermark()
    lost = [r for _ in range(4) for r in src.poll_batch(64).to_pylist()]  # type: ignore[union-attr]

    restored = OperatorStateBackend()
    restored.restore({0: handles}, 0, 1)
    again = cloudpickle.loads(
        cloudpickle.dumps(GeneratorSource(None, batch_size=64, seed=9, max_out_of_orderness_ms=3))
    )
    again.open(src_ctx(backend=restored, restored=1))
    assert again.splits == [(0, 250, None)]
    assert again.current_watermark() == wm_at_checkpoint
    replay = [r for _ in range(4) for r in again.poll_batch(64).to_pylist()]
    assert replay == lost


@pytest.mark.parametrize(("old_p", "new_p"), [(3, 2), (2, 5), (3, 1)])
def test_bounded_generator_rescale_no_loss_no_duplicates(
    old_p: int, new_p: int, tmp_path: Path
) -> None:
    total = 1000
    before: list[tuple[int, int, int]] = []
    handles: dict[int, list[Any]] = {}
    for s in range(old_p):
        backend = OperatorStateBackend()
        src = GeneratorSource(total, batch_size=50, seed=2, num_keys=1 << 30)
        src.open(src_ctx(s, old_p, backend))
        for _ in range(s + 1):
            before.extend(tuple(r.values()) for r in src.poll_batch(50).to_pylist())  # type: ignore[union-attr]
        handles[s] = _snapshot(backend, src, 7, tmp_path / f"s{s}")
    after: list[tuple[int, int, int]] = []
    for s in range(new_p):
        backend = OperatorStateBackend()
        backend.restore(handles, s, new_p)
        src = GeneratorSource(total, batch_size=50, seed=2, num_keys=1 << 30)
        src.open(src_ctx(s, new_p, backend, restored=7))
        after.extend(tuple(r.values()) for r in drain(src, 30))
        assert src.current_watermark() == MAX_WATERMARK
    everything = before + after
    assert len(everything) == total
    gen = GeneratorSource(total, seed=2, num_keys=1 << 30)
    sizes = [total // old_p + (1 if s < total % old_p else 0) for s in range(old_p)]
    expected = [tuple(gen.record(s, i).values()) for s in range(old_p) for i in range(sizes[s])]
    assert sorted(everything) == sorted(expected)


def test_unbounded_subtask_without_splits_idles_with_max_watermark(tmp_path: Path) -> None:
    backend = OperatorStateBackend()
    src = GeneratorSource(None, batch_size=10)
    src.open(src_ctx(0, 1, backend))
    src.poll_batch(10)
    handles = {0: _snapshot(backend, src, 1, tmp_path)}
    idle_backend = OperatorStateBackend()
    idle_backend.restore(handles, 1, 2)
    idle = GeneratorSource(None, batch_size=10)
    idle.open(src_ctx(1, 2, idle_backend, restored=1))
    assert idle.splits == []
    assert idle.poll_batch(10).num_rows == 0  # type: ignore[union-attr]
    assert idle.current_watermark() == MAX_WATERMARK
    assert idle.idle_at_once()  # nothing to read: announced idle at once (not held back)
    # restored, but this operator had no state (e.g. added to the job): a fresh start
    fresh = GeneratorSource(None, batch_size=10)
    fresh.open(dataclasses.replace(src_ctx(1, 2, OperatorStateBackend(), restored=1)))
    assert fresh.splits == [(1, 0, None)]
    assert not fresh.idle_at_once()


def test_rate_limit() -> None:
    clock = ManualClock(100.0)
    src = GeneratorSource(None, rate_per_s=4000, batch_size=1000, clock=clock)
    src.open(src_ctx(0, 2))  # 2000 records/s for this subtask
    polled = []
    for _ in range(25):  # 0.25 s in steps of 10 ms
        clock.advance(0.01)
        polled.append(src.poll_batch(1000).num_rows)  # type: ignore[union-attr]
    # 2000/s, released at least 20 ms (40 records) at a time: 480 by 0.24 s, and the 20 due
    # by 0.25 s wait for the next release.
    assert polled == [0, 40] * 12 + [0]
    clock.advance(10.0)  # a stall: one second of burst afterwards, in batches of 1000
    burst = [src.poll_batch(5000).num_rows for _ in range(3)]  # type: ignore[union-attr]
    assert burst == [1000, 1000, 0]


def test_sequence_source() -> None:
    rows = []
    for s in range(3):
        seq = SequenceSource(10, 21, batch_size=4, field="n")
        seq.open(src_ctx(s, 3))
        assert seq.current_watermark() == MIN_WATERMARK
        part = drain(seq)
        assert part == sorted(part, key=lambda r: r["n"])
        rows.extend(part)
        assert seq.current_watermark() == MAX_WATERMARK
    assert [r["n"] for r in rows] == list(range(10, 21))
    chain = Chain([SequenceSource(0, 5), CollectSink()])
    chain.open(src_ctx())
    while chain.poll_batch(2) is not None:
        pass
    assert [r["value"] for r in chain.operators[1].rows()] == [0, 1, 2, 3, 4]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Two-phase-commit file sink
# ---------------------------------------------------------------------------------------------


def committed(directory: Path) -> list[int]:
    table = read_committed(directory)
    return table.column("v").to_pylist() if table.num_rows else []


def test_two_phase_commit_basic_lost_and_aborted_notifications(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = TransactionalFileSink(out)
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1, 2]))
    sink.snapshot_state(1)
    assert committed(out) == []  # pre-committed only
    assert len(os.listdir(out / "_staging")) == 1
    sink.process_batch(kb([3]))
    sink.notify_checkpoint_complete(1)
    assert committed(out) == [1, 2]
    # checkpoint 2's notification is lost, 3 is aborted: 4's completion commits them all
    sink.snapshot_state(2)
    sink.process_batch(kb([4]))
    sink.snapshot_state(3)
    sink.notify_checkpoint_aborted(3)
    assert [cid for cid, _ in sink.pending_transactions] == [2, 3]
    sink.snapshot_state(4)  # empty transaction: no file
    sink.notify_checkpoint_complete(4)
    assert committed(out) == [1, 2, 3, 4]
    assert sink.pending_transactions == []
    sink.notify_checkpoint_complete(4)  # repeated: nothing happens
    sink.process_batch(kb([5]))
    sink.close()  # aborts the open transaction: its staging file is removed
    assert committed(out) == [1, 2, 3, 4] and os.listdir(out / "_staging") == []
    assert sorted(os.listdir(out)) == [
        "_staging",
        *sorted(n for n in os.listdir(out) if n.startswith("part-0-")),
    ]
    assert {n.split("-")[2] for n in os.listdir(out) if n.startswith("part-")} == {"1", "2", "3"}


def test_file_sink_errors_and_idempotent_commit(tmp_path: Path) -> None:
    sink = TransactionalFileSink(tmp_path)
    sink.open(sink_ctx(OperatorStateBackend()))
    sink.process_batch(kb([1]))
    with pytest.raises(InvalidArgumentError, match="schema"):
        sink.process_batch(pa.RecordBatch.from_pydict({"w": [1]}))
    sink.snapshot_state(1)
    txn = sink.pending_transactions[0][1]
    sink.notify_checkpoint_complete(1)
    sink.commit(txn)  # committed already: a no-op
    assert committed(tmp_path) == [1]
    lost = dataclasses.replace(txn, part_name="part-0-9-9-abcdef12.arrow")
    with pytest.raises(SinkCommitError):
        sink.commit(lost)  # neither staging nor target: the data is gone
    (tmp_path / "part-junk.arrow").write_bytes(b"not ours")
    (tmp_path / "_staging" / "x.arrow").write_bytes(b"not committed")
    assert committed(tmp_path) == [1]
    assert read_committed(tmp_path / "missing").num_rows == 0
    schema = pa.schema([("v", pa.int64())])
    assert read_committed(tmp_path / "missing", schema).schema == schema


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_file_sink_compresses_its_files_and_readers_decompress_them(
    tmp_path: Path, compression: str
) -> None:
    rows = [i % 100 for i in range(100_000)]  # compressible: 800 KB of int64 raw
    sizes = {}
    for name, codec in (("plain", None), (compression, compression)):
        sink = TransactionalFileSink(tmp_path / name, compression=codec)
        sink.open(sink_ctx(OperatorStateBackend()))
        sink.process_batch(kb(rows))
        sink.snapshot_state(1)
        sink.notify_checkpoint_complete(1)
        sink.close()
        assert committed(tmp_path / name) == rows
        (part,) = [p for p in (tmp_path / name).iterdir() if p.name.startswith("part-")]
        sizes[name] = part.stat().st_size
    assert sizes[compression] < sizes["plain"] / 2, sizes
    with pytest.raises(InvalidArgumentError, match="compression must be one of None, lz4, zstd"):
        TransactionalFileSink(tmp_path, compression="gzip")


def test_transaction_state_is_serialised_at_snapshot_time(tmp_path: Path) -> None:
    backend = OperatorStateBackend()
    sink = TransactionalFileSink(tmp_path)
    sink.open(sink_ctx(backend))
    sink.process_batch(kb([1]))
    sink.snapshot_state(1)
    state_before = backend.get_list_state("out/2pc").get()
    sink.process_batch(kb([2, 3]))  # mutates the current transaction (row count)
    assert backend.get_list_state("out/2pc").get() == state_before
    assert all(isinstance(x, bytes) for x in state_before)
    sink.close()


class _Pipeline:
    """A bounded generator feeding a transactional file sink, one task, shared operator state;
    checkpoints write the operator state like the task does."""

    TOTAL = 2000

    def __init__(self, root: Path, restore: tuple[int, list[Any]] | None, attempt: int) -> None:
        self.root = root
        self.backend = OperatorStateBackend()
        cid = 0
        if restore is not None:
            cid, handles = restore
            self.backend.restore({0: handles}, 0, 1)
        ctx = OperatorContext(
            vertex_id="job",
            operator_id="x",
            attempt=attempt,
            operator_state=self.backend,
            restored_checkpoint_id=cid,
        )
        # the operators are shipped pickled, as the JobGraph does
        self.source = cloudpickle.loads(
            cloudpickle.dumps(GeneratorSource(self.TOTAL, batch_size=64, num_keys=1 << 40, seed=5))
        )
        self.sink = cloudpickle.loads(cloudpickle.dumps(TransactionalFileSink(root / "out")))
        self.chain = Chain([self.source, self.sink])
        self.chain.open(ctx)

    def steps(self, n: int, size: int = 37) -> bool:
        return all(self.chain.poll_batch(size) is not None for _ in range(n))

    def checkpoint(self, cid: int) -> list[Any]:
        self.chain.snapshot_state(cid)
        return self.backend.snapshot(cid).write(self.root / f"chk-{cid}")

    def crash(self) -> None:
        """Drop everything; the process would close its files (without aborting anything)."""
        for entry in self.sink._writers.values():
            entry[0].close()

    def expected(self) -> list[int]:
        return sorted(self.source.record(0, i)["key"] for i in range(self.TOTAL))

    def committed_keys(self) -> list[int]:
        table = read_committed(self.root / "out")
        return sorted(table.column("key").to_pylist()) if table.num_rows else []


def _finish(p: _Pipeline, cid: int) -> None:
    while p.steps(10):
        pass
    p.checkpoint(cid)  # the final checkpoint commits the last transaction
    p.chain.notify_checkpoint_complete(cid)
    p.chain.close()


@pytest.mark.parametrize(
    "scenario",
    [
        "crash-after-complete-before-notify",
        "crash-before-complete",
        "crash-mid-commit",
        "crash-twice",
        "no-crash",
    ],
)
def test_exactly_once_across_crashes(scenario: str, tmp_path: Path) -> None:
    p = _Pipeline(tmp_path, None, attempt=0)
    p.steps(5)
    h1 = p.checkpoint(1)
    p.chain.notify_checkpoint_complete(1)
    p.steps(7)
    h2 = p.checkpoint(2)  # pre-committed for 2
    p.steps(4)  # written into the next transaction
    attempt = 1
    if scenario == "no-crash":
        p.chain.notify_checkpoint_complete(2)
        _finish(p, 3)
        assert p.committed_keys() == p.expected()
        return
    if scenario == "crash-before-complete":
        restore = (1, h1)  # checkpoint 2 never completed: restore 1, replay
    elif scenario == "crash-mid-commit":
        # notification 2 lost; 3 completes; the crash hits after committing only txn 2
        h3 = p.checkpoint(3)
        sink = p.sink
        original = sink.commit
        calls: list[Any] = []

        def commit_then_crash(txn: Any) -> None:
            if calls:
                raise RuntimeError("crash")
            calls.append(txn)
            original(txn)

        sink.commit = commit_then_crash
        with pytest.raises(RuntimeError):
            p.chain.notify_checkpoint_complete(3)
        restore = (3, h3)
    else:
        restore = (2, h2)  # 2 completed, its notification never arrived
    p.crash()  # every object is gone, only files remain
    del p
    if scenario == "crash-twice":
        q = _Pipeline(tmp_path, restore, attempt=attempt)  # re-commits txn 2
        q.steps(3)
        q.crash()  # crashes again before any checkpoint: re-commit must be idempotent
        attempt += 1
    r = _Pipeline(tmp_path, restore, attempt=attempt)
    _finish(r, 10)
    assert r.committed_keys() == r.expected()
    # staging files left: only those of transactions no completed checkpoint recorded (the
    # data written after checkpoint 2 in "crash-before-complete", after the restore in
    # "crash-twice"); a restore aborts the current transaction it finds in its state
    leftovers = os.listdir(tmp_path / "out" / "_staging")
    assert len(leftovers) == (1 if scenario in ("crash-before-complete", "crash-twice") else 0)


def test_two_phase_commit_base_contract() -> None:
    class MemorySink(TwoPhaseCommitSink[list[int]]):
        def __init__(self) -> None:
            self.log: list[Any] = []

        def begin_transaction(self) -> list[int]:
            return []

        def write(self, txn: list[int], batch: pa.RecordBatch) -> None:
            txn.extend(batch.column(0).to_pylist())

        def pre_commit(self, txn: list[int]) -> None:
            self.log.append(("pre", self.pending_checkpoint_id, list(txn)))

        def commit(self, txn: list[int]) -> None:
            self.log.append(("commit", list(txn)))

        def abort(self, txn: list[int]) -> None:
            self.log.append(("abort", list(txn)))

    backend = OperatorStateBackend()
    sink = MemorySink()
    sink.open(sink_ctx(backend))
    sink.process_batch(kb([1]))
    sink.snapshot_state(5)
    sink.process_batch(kb([2]))
    blob = backend.get_list_state("out/2pc").get()
    sink.close()
    assert sink.log == [("pre", 5, [1]), ("abort", [2])]
    # restore: re-commit the pending [1], abort the restored current (empty) transaction
    restored_backend = OperatorStateBackend()
    restored_backend.get_list_state("out/2pc").update(blob)
    again = MemorySink()
    again.open(sink_ctx(restored_backend, restored=5))
    assert again.log == [("commit", [1]), ("abort", [])]


def test_collect_and_print_sinks() -> None:
    sink = CollectSink()
    copy = cloudpickle.loads(cloudpickle.dumps(sink))
    sink.open(OperatorContext())
    copy.open(OperatorContext())
    assert sink.process_batch(kb([1, 2])) == []
    copy.process_batch(kb([3]))
    assert [r["v"] for r in sink.rows()] == [1, 2, 3]
    assert CollectSink.table(sink.collect_name).num_rows == 3
    CollectSink.clear(sink.collect_name)
    assert sink.batches == []
    stream = io.StringIO()
    printer = PrintSink("out:", stream)
    printer.open(OperatorContext(subtask_index=2))
    printer.process_batch(kb([7]))
    assert stream.getvalue() == "out:2> {'v': 7}\n"
    assert cloudpickle.loads(cloudpickle.dumps(printer)).stream is None

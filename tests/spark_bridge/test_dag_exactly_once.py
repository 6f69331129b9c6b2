"""Exactly once where checkpointing is hardest: DAGs whose tasks have several inputs, on Spark.

Two jobs, each the whole DAG in one barrier stage on the session's local Spark:

* **two-source keyed join**: two ``SequenceSource``s (numbers ``a`` and ``b``, key ``n % KEYS``)
  keyed alike and connected into one keyed two-input operator (:func:`_join`: a per-key
  buffer-and-match equi join, written here as user code until the library's joins land), then
  a ``TransactionalFileSink``; source ``a`` also fans out to a second sink (several sources,
  several sinks).
* **diamond**: one source keyed into two keyed vertices (a running count and a running sum
  per record, both ``KeyedProcessFunction``s emitting one schema), their outputs unioned,
  keyed again and re-joined per record by a keyed operator, into a sink; the source also feeds
  the library's keyed ``count()`` into a second sink.

Every run kills a task in the middle (``FailAt`` behind the operator of the vertex with
several inputs, in the first deployment after a completed checkpoint: ``how="exit"`` kills the
Spark Python worker that hosts the agent, as a lost executor would; ``"raise"`` fails the task)
in every checkpoint mode (aligned, unaligned, aligned with a 1 ms timeout, at least once; the
coordinator's history must show unaligned checkpoints exactly in the unaligned modes); and
one run per job stops with a savepoint at parallelism 2 and resumes at 3 (diamond) or 1 (join).
The committed output is checked record by record against what the sources produce, computed in
plain Python: exactly once, or for at least once no record lost (duplicates allowed).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from kit.checkpoint_modes import MODES, unaligned_checkpoints
from kit.workers import check_exactly_once
from pyspark import cloudpickle

from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.spark_bridge import FixedDelay, JobStatus, Pipeline
from snapflow.spark_bridge.streams import KeyedStream, Stream
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.api.functions import KeyedContext, KeyedProcessFunction
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import SequenceSource

# The executors cannot import this test module: ship its classes and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(240)]

RUN_TIMEOUT_S = 150.0
JOIN_RECORDS = 2_400  # per source: KEYS keys, 8 records of each side per key, 64 matches per key
JOIN_KEYS = 300
DIAMOND_RECORDS = 5_000
DIAMOND_KEYS = 200
RATE = 1_200  # records/s of each source: a run takes 2-4 s

I64 = pa.int64()


def _mode_params() -> list[Any]:
    return [pytest.param(name, id=name) for name in MODES]


# ---------------------------------------------------------------------------------------------
# The join operator (user code): swap in the library's keyed join here
# ---------------------------------------------------------------------------------------------


def _join(left: KeyedStream, right: KeyedStream) -> Stream:
    """The keyed two-input join under test (the library's regular inner join): rows
    ``(key, a, b)``, one per matching pair."""
    return left.join(right, name="join")


# ---------------------------------------------------------------------------------------------
# The jobs and what their sources produce (plain Python)
# ---------------------------------------------------------------------------------------------


def _numbers(field: str, count: int) -> SequenceSource:
    return SequenceSource(0, count, batch_size=40, field=field, rate_per_s=RATE)


def _with_key(field: str, keys: int) -> Any:
    """A batch function: ``(key, field)`` rows with ``key = field % keys``."""

    def add_key(batch: pa.RecordBatch) -> pa.RecordBatch:
        values = batch.column(field)
        return pa.RecordBatch.from_arrays(
            [pc.modulo(values, pa.scalar(keys, I64)), values], names=["key", field]
        )

    return add_key


def _sink_dirs(base: Path) -> dict[str, Path]:
    return {name: base / name for name in ("main", "side")}


def _configure(p: Pipeline, storage: Path, mode: str) -> Pipeline:
    checkpoint_mode, aligned_timeout_ms = MODES[mode]
    p.checkpointing(
        interval_ms=150,
        mode=checkpoint_mode,
        aligned_checkpoint_timeout_ms=aligned_timeout_ms,
        tolerable_failures=None,
        storage=storage,
    )
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    return p


def join_pipeline(
    out: Path, storage: Path, mode: str, parallelism: int = 2, crash: FailAt | None = None
) -> Pipeline:
    """Sources ``a`` and ``b`` -> key_by(key) each -> connect -> join [-> crash] -> sink;
    source ``a`` -> rebalance -> a second sink."""
    p = Pipeline("dag-join", parallelism=parallelism, max_parallelism=128)
    dirs = _sink_dirs(out)
    left = p.source(_numbers("a", JOIN_RECORDS), name="a").map_batches(
        _with_key("a", JOIN_KEYS), name="key-a"
    )
    right = p.source(_numbers("b", JOIN_RECORDS), name="b").map_batches(
        _with_key("b", JOIN_KEYS), name="key-b"
    )
    joined = _join(left.key_by("key"), right.key_by("key"))
    if crash is not None:
        joined = joined.transform(crash, name="crash-once")
    joined.sink(TransactionalFileSink(str(dirs["main"])))
    left.rebalance().sink(TransactionalFileSink(str(dirs["side"])))
    return _configure(p, storage, mode)


def expected_join() -> Counter[tuple[int, int, int]]:
    by_key: dict[int, list[int]] = {}
    for b in range(JOIN_RECORDS):
        by_key.setdefault(b % JOIN_KEYS, []).append(b)
    return Counter(
        (a % JOIN_KEYS, a, b) for a in range(JOIN_RECORDS) for b in by_key[a % JOIN_KEYS]
    )


class RunningCount(KeyedProcessFunction):
    """Per record: ``(key, v, n)``, ``n`` the records of the key so far (this one included)."""

    def process_element(self, row: dict[str, Any], ctx: KeyedContext) -> Any:
        state = ctx.get_value_state("n", 0)
        n = (state.value() or 0) + 1
        state.update(n)
        return [{"key": row["key"], "v": row["v"], "branch": 0, "x": n}]


class RunningSum(KeyedProcessFunction):
    """Per record: ``(key, v, s)``, ``s`` the sum of ``v + 1`` over the key's records so far."""

    def process_element(self, row: dict[str, Any], ctx: KeyedContext) -> Any:
        state = ctx.get_value_state("s", 0)
        s = (state.value() or 0) + row["v"] + 1
        state.update(s)
        return [{"key": row["key"], "v": row["v"], "branch": 1, "x": s}]


class Rejoin(KeyedProcessFunction):
    """The diamond's fan-in: the two branches' rows of one record ``v`` (either may come
    first) become one row ``(key, v, n, s)``; the first waits in map state."""

    def process_element(self, row: dict[str, Any], ctx: KeyedContext) -> Any:
        pending = ctx.get_map_state("pending")
        first = pending.get(row["v"])
        if first is None or first[0] == row["branch"]:
            # (the same branch twice: a replay at least once; the newer row waits instead)
            pending.put(row["v"], (row["branch"], row["x"]))
            return None
        pending.remove(row["v"])
        x = {first[0]: first[1], row["branch"]: row["x"]}
        return [{"key": row["key"], "v": row["v"], "n": x[0], "s": x[1]}]


BRANCH = pa.schema([("key", I64), ("v", I64), ("branch", I64), ("x", I64)])
REJOINED = pa.schema([("key", I64), ("v", I64), ("n", I64), ("s", I64)])


def diamond_pipeline(
    out: Path, storage: Path, mode: str, parallelism: int = 2, crash: FailAt | None = None
) -> Pipeline:
    """Source -> key_by(key) twice -> running count | running sum -> union -> key_by(key) ->
    rejoin [-> crash] -> sink; the source also -> key_by(key) -> count() -> a second sink."""
    p = Pipeline("dag-diamond", parallelism=parallelism, max_parallelism=128)
    dirs = _sink_dirs(out)
    numbers = p.source(_numbers("v", DIAMOND_RECORDS), name="numbers").map_batches(
        _with_key("v", DIAMOND_KEYS), name="key"
    )
    counted = numbers.key_by("key").process_function(
        RunningCount(), output_schema=BRANCH, name="running-count"
    )
    summed = numbers.key_by("key").process_function(
        RunningSum(), output_schema=BRANCH, name="running-sum"
    )
    rejoined = (
        counted.union(summed)
        .key_by("key")
        .process_function(Rejoin(), output_schema=REJOINED, name="rejoin")
    )
    if crash is not None:
        rejoined = rejoined.transform(crash, name="crash-once")
    rejoined.sink(TransactionalFileSink(str(dirs["main"])))
    numbers.key_by("key").count().sink(TransactionalFileSink(str(dirs["side"])))
    return _configure(p, storage, mode)


def diamond_counts() -> Counter[int]:
    return Counter(v % DIAMOND_KEYS for v in range(DIAMOND_RECORDS))


# ---------------------------------------------------------------------------------------------
# Record-by-record checks
# ---------------------------------------------------------------------------------------------


def _rows(table: pa.Table, *fields: str) -> list[tuple[int, ...]]:
    if not table.num_rows:
        return []
    return list(zip(*(table.column(f).to_pylist() for f in fields), strict=True))


def _compare(
    committed: Counter[Any], expected: Counter[Any], exactly_once: bool, what: str
) -> None:
    lost = expected - committed
    assert not lost, f"{what}: {sum(lost.values())} rows lost, e.g. {sorted(lost)[:5]}"
    unknown = set(committed) - set(expected)
    assert not unknown, f"{what}: rows no source produced, e.g. {sorted(unknown)[:5]}"
    if exactly_once:
        dup = committed - expected
        assert not dup, f"{what}: {sum(dup.values())} rows committed twice, e.g. {sorted(dup)[:5]}"


def check_join(out: Path, exactly_once: bool) -> None:
    dirs = _sink_dirs(out)
    joined = Counter(_rows(read_committed(dirs["main"]), "key", "a", "b"))
    _compare(joined, expected_join(), exactly_once, "join")
    side = Counter(_rows(read_committed(dirs["side"]), "key", "a"))
    _compare(side, Counter((a % JOIN_KEYS, a) for a in range(JOIN_RECORDS)), exactly_once, "a")


def check_diamond(out: Path, exactly_once: bool) -> None:
    """Each record ``v`` once, with its key; per key the running counts are exactly
    ``1..count`` and the running sums, in order, grow by ``v + 1`` of the row that carries
    them (a state update lost or applied twice breaks both chains); the keyed count's committed
    running counts strictly increase to the true count. At least once: every record there and
    every count reached."""
    dirs = _sink_dirs(out)
    rows = _rows(read_committed(dirs["main"]), "key", "v", "n", "s")
    seen = Counter((key, v) for key, v, _, _ in rows)
    expected = Counter((v % DIAMOND_KEYS, v) for v in range(DIAMOND_RECORDS))
    _compare(seen, expected, exactly_once, "diamond")
    totals = diamond_counts()
    if exactly_once:
        by_key: dict[int, list[tuple[int, int, int]]] = {}
        for key, v, n, s in rows:
            by_key.setdefault(key, []).append((v, n, s))
        for key, entries in by_key.items():
            assert sorted(n for _, n, _ in entries) == list(range(1, totals[key] + 1)), (
                f"key {key}: running counts {sorted(n for _, n, _ in entries)}"
            )
            previous = 0
            for v, _, s in sorted(entries, key=lambda e: e[2]):
                assert s - previous == v + 1, f"key {key}: sum {s} after {previous}, v {v}"
                previous = s
        counts = read_committed(dirs["side"])
        check_exactly_once(counts, totals)
    else:
        counts = read_committed(dirs["side"])
        finals: Counter[int] = Counter()
        for key, count in _rows(counts, "key", "count"):
            finals[key] = max(finals[key], count)
        assert all(finals[k] >= n for k, n in totals.items()), "at least once lost records"


JOBS = {
    "join": (join_pipeline, check_join),
    "diamond": (diamond_pipeline, check_diamond),
}


# ---------------------------------------------------------------------------------------------
# Kills in every mode
# ---------------------------------------------------------------------------------------------


def _how(job: str, mode: str) -> Literal["exit", "raise"]:
    """Both ways of failing for each job, alternating over the modes."""
    flip = list(MODES).index(mode) % 2 == (job == "diamond")
    return "exit" if flip else "raise"


@pytest.mark.parametrize("mode", _mode_params())
@pytest.mark.parametrize("job", ["join", "diamond"])
def test_a_task_killed_in_the_vertex_with_several_inputs_loses_and_duplicates_nothing(
    spark: Any, tmp_path: Path, job: str, mode: str
) -> None:
    build, check = JOBS[job]
    # The first deployment, subtask 0 of the vertex with several inputs, after a completed
    # checkpoint and a few hundred rows of its operator's output.
    crash = FailAt(how=_how(job, mode), after_records=600, after_checkpoints=1)
    with EmbeddedCoordinator(storage_root=str(tmp_path / "root")) as coordinator:
        result = build(tmp_path / "out", tmp_path / "cp", mode, crash=crash).run(
            spark, timeout_s=RUN_TIMEOUT_S, coordinator_address=coordinator.address
        )
        unaligned = unaligned_checkpoints(coordinator.address, result.job_id)
    assert result.state is JobStatus.FINISHED, result.failure
    assert result.restarts == 1 and result.stage_attempts == 2, result
    # Unaligned: some checkpoint's barriers overtook data (with the 1 ms timeout, an
    # alignment switched to unaligned); aligned and at least once: none did.
    assert (unaligned > 0) is (mode in ("unaligned", "aligned-timeout")), unaligned
    check(tmp_path / "out", mode != "at-least-once")


# ---------------------------------------------------------------------------------------------
# Rescale from a savepoint
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("job", "resume_at"), [("join", 1), ("diamond", 3)])
def test_stop_with_savepoint_and_resume_at_another_parallelism_is_exactly_once(
    spark: Any, tmp_path: Path, job: str, resume_at: int
) -> None:
    build, check = JOBS[job]
    out, storage = tmp_path / "out", tmp_path / "cp"
    handle = build(out, storage, "aligned", parallelism=2).run_async(spark)
    try:
        handle.wait_for_checkpoints(1, timeout_s=60)
        savepoint = handle.stop_with_savepoint(tmp_path / "sp", timeout_s=60)
    except BaseException:
        handle.cancel()
        raise
    first = handle.result(RUN_TIMEOUT_S)
    assert first.state is JobStatus.FINISHED and first.savepoint_path == savepoint
    stopped = read_committed(_sink_dirs(out)["main"]).num_rows
    with pytest.raises(AssertionError, match="lost"):
        check(out, True)  # the job was stopped before its input ended

    resumed = build(out, storage, "aligned", parallelism=resume_at).run(
        spark, restore_from=savepoint, timeout_s=RUN_TIMEOUT_S
    )
    assert resumed.state is JobStatus.FINISHED and resumed.restarts == 0, resumed.failure
    assert sorted(s["slot"] for s in resumed.slot_summaries) == list(range(resume_at))
    assert read_committed(_sink_dirs(out)["main"]).num_rows > stopped
    check(out, True)

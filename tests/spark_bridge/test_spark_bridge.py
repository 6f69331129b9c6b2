"""The Spark bridge: pipelines built with the builder, run as one barrier stage on local Spark.

The Spark tests (marked ``spark``) share one local SparkSession (``tests/conftest.py``) and run
a bounded, rate-limited keyed count into the transactional file sink, each with its own
embedded coordinator: an uninterrupted run (exactly once), a run whose Python worker is killed
in the first deployment after a checkpoint (one stage resubmission, exactly once), a cancel,
and stop-with-savepoint followed by a resume at parallelism 3 (same final counts as the
uninterrupted run). The other tests check the pure parts: restart strategies, the driver's
decisions, recovery times, and the builder's validation and translation.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from kit.workers import check_exactly_once, expected_counts
from pyspark import cloudpickle

from snapflow import wire
from snapflow.errors import FailedPreconditionError, InvalidArgumentError
from snapflow.filestore_registry import store_for
from snapflow.spark_bridge import (
    ExponentialBackoff,
    FixedDelay,
    JobFailedError,
    JobStatus,
    NoRestart,
    Pipeline,
)
from snapflow.spark_bridge.driver import local_slots, summarize_spark_error
from snapflow.spark_bridge.executor import _host_of
from snapflow.spark_bridge.restart import (
    Finish,
    RecoveryTracker,
    Resubmit,
    StageOutcome,
    next_action,
)
from snapflow.spark_bridge.run_options import RunOptions
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.api.window_assigners import TumblingEventTimeWindows
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.operator import Operator

# The executors cannot import this test module: ship its classes and functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 200_000
KEYS = 300
RATE = 100_000  # records/s over both source subtasks: a run takes about 2 s
RUN_TIMEOUT_S = 120.0


def _source() -> GeneratorSource:
    return GeneratorSource(
        total_records=RECORDS, rate_per_s=RATE, num_keys=KEYS, batch_size=2048, seed=11
    )


def _pipeline(
    out: Path, storage: Path | str, parallelism: int = 2, crash: FailAt | None = None
) -> Pipeline:
    p = Pipeline("keyed-count", parallelism=parallelism, max_parallelism=128)
    events = p.source(_source(), name="events")
    if crash is not None:
        events = events.transform(crash, name="crash-once")
    events.key_by("key").count().sink(TransactionalFileSink(str(out)))
    p.checkpointing(interval_ms=150, storage=storage)
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    return p


def _finals(table: pa.Table) -> dict[int, int]:
    finals: Counter[int] = Counter()
    for key, count in zip(
        table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True
    ):
        finals[key] = max(finals[key], count)
    return dict(finals)


# ---------------------------------------------------------------------------------------------
# On local Spark
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, pa.Table, Path]:
    """One uninterrupted run at parallelism 2: its JobResult, the committed table, the sink's
    directory."""
    base = tmp_path_factory.mktemp("uninterrupted")
    result = _pipeline(base / "out", base / "cp").run(spark, timeout_s=RUN_TIMEOUT_S)
    return result, read_committed(base / "out"), base / "out"


@pytest.mark.spark
def test_pipeline_on_spark_is_exactly_once(
    spark: Any, uninterrupted: tuple[Any, pa.Table, Path]
) -> None:
    result, committed, out_dir = uninterrupted
    assert result.state is JobStatus.FINISHED
    assert result.checkpoints_completed >= 1
    assert result.restarts == 0 and result.stage_attempts == 1
    assert result.recovery_times_s == ()
    assert sorted(s["slot"] for s in result.slot_summaries) == [0, 1]
    assert {s["status"] for s in result.slot_summaries} == {"finished"}
    check_exactly_once(committed, expected_counts(_source(), 2))
    # The committed part files, read by Spark: the largest running count per key is its total.
    totals = (
        spark.sparkContext.binaryFiles(f"{out_dir}/part-*.arrow")
        .flatMap(_key_counts)
        .reduceByKey(max)
        .collectAsMap()
    )
    assert totals == dict(expected_counts(_source(), 2))


def _key_counts(item: tuple[str, bytes]) -> list[tuple[int, int]]:
    table = pa.ipc.open_file(pa.BufferReader(item[1])).read_all()
    return list(
        zip(table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True)
    )


@pytest.mark.spark
@pytest.mark.parametrize("how", ["exit", "raise"])
def test_killed_task_resubmits_the_stage_without_loss_or_duplicates(
    spark: Any, tmp_path: Path, how: Literal["exit", "raise"]
) -> None:
    # deployment 1, subtask 0, after a checkpoint and 30,000 records
    crash = FailAt(how=how, after_records=30_000, after_checkpoints=1)
    p = _pipeline(tmp_path / "out", tmp_path / "cp", crash=crash)
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED
    assert result.restarts == 1
    assert result.stage_attempts == 2
    assert len(result.recovery_times_s) == 1
    assert 0 < result.recovery_times_s[0] < 30
    check_exactly_once(read_committed(tmp_path / "out"), expected_counts(_source(), 2))


@pytest.mark.spark
def test_progress_line_on_stderr(spark: Any, tmp_path: Path, capfd: Any) -> None:
    p = _pipeline(tmp_path / "out", tmp_path / "cp")
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S, progress=True)
    assert result.state is JobStatus.FINISHED
    err = capfd.readouterr().err
    assert "keyed-count:" in err and "checkpoints" in err and "records" in err


@pytest.mark.spark
def test_restarts_are_bounded_by_the_restart_strategy(spark: Any, tmp_path: Path) -> None:
    # every subtask of every deployment, on its first batch
    always = FailAt(how="raise", subtask=None, attempts=(1, 2, 3))
    p = _pipeline(tmp_path / "out", tmp_path / "cp", crash=always)
    p.restart_strategy(FixedDelay(attempts=1, delay_s=0))
    with pytest.raises(JobFailedError, match="injected failure in deployment 2") as failed:
        p.run(spark, timeout_s=RUN_TIMEOUT_S)
    result = failed.value.result
    assert result.state is JobStatus.FAILED
    assert result.restarts == 1 and result.stage_attempts == 2
    assert "allows no more restarts after 1" in result.failure
    # Every subtask fails on its first batch, so nothing can be committed; a checkpoint may
    # still complete before the first batches on a loaded machine (it covers no records).
    assert read_committed(tmp_path / "out").num_rows == 0


@pytest.mark.spark
def test_stop_with_savepoint_and_resume_with_other_parallelism(
    spark: Any, tmp_path: Path, uninterrupted: tuple[Any, pa.Table, Path]
) -> None:
    out = tmp_path / "out"
    handle = _pipeline(out, tmp_path / "cp", parallelism=2).run_async(spark)
    try:
        handle.wait_for_checkpoints(1, timeout_s=60)
        savepoint = handle.stop_with_savepoint(tmp_path / "sp", timeout_s=60)
    except BaseException:
        handle.cancel()
        raise
    first = handle.result(RUN_TIMEOUT_S)
    assert first.state is JobStatus.FINISHED
    assert first.savepoint_path == savepoint and os.path.isfile(
        os.path.join(savepoint, "_metadata")
    )
    stopped = _finals(read_committed(out))
    assert sum(stopped.values()) < RECORDS, "the job ended before the stop"

    resumed = _pipeline(out, tmp_path / "cp", parallelism=3).run(
        spark, restore_from=savepoint, timeout_s=RUN_TIMEOUT_S
    )
    assert resumed.state is JobStatus.FINISHED and resumed.restarts == 0
    assert sorted(s["slot"] for s in resumed.slot_summaries) == [0, 1, 2]
    committed = read_committed(out)
    seen: set[tuple[int, int]] = set()
    for row in zip(
        committed.column("key").to_pylist(), committed.column("count").to_pylist(), strict=True
    ):
        assert row not in seen, f"key {row[0]}: count {row[1]} committed twice"
        seen.add(row)
    assert _finals(committed) == _finals(uninterrupted[1])


@pytest.mark.spark
def test_checkpoints_on_s3_survive_a_killed_task_exactly_once(
    spark: Any, tmp_path: Path, s3_bucket: str
) -> None:
    crash = FailAt(how="exit", after_records=30_000, after_checkpoints=1)
    p = _pipeline(tmp_path / "out", f"s3://{s3_bucket}/cp", crash=crash)
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED
    assert result.restarts == 1 and result.stage_attempts == 2
    check_exactly_once(read_committed(tmp_path / "out"), expected_counts(_source(), 2))
    # The checkpoints really went to S3 (the retained one is there, with its metadata).
    assert any(
        path.endswith("/_metadata")
        for path in store_for(f"s3://{s3_bucket}").list(f"s3://{s3_bucket}/cp")
    )


@pytest.mark.spark
def test_savepoint_on_s3_resumes_with_other_parallelism(
    spark: Any, tmp_path: Path, s3_bucket: str, uninterrupted: tuple[Any, pa.Table, Path]
) -> None:
    out = tmp_path / "out"
    storage = f"s3://{s3_bucket}/cp"
    handle = _pipeline(out, storage, parallelism=2).run_async(spark)
    try:
        handle.wait_for_checkpoints(1, timeout_s=60)
        savepoint = handle.stop_with_savepoint(f"s3://{s3_bucket}/savepoints", timeout_s=60)
    except BaseException:
        handle.cancel()
        raise
    assert handle.result(RUN_TIMEOUT_S).state is JobStatus.FINISHED
    assert savepoint.startswith(f"s3://{s3_bucket}/savepoints/savepoint-")
    assert store_for(savepoint).exists(f"{savepoint}/_metadata")
    assert sum(_finals(read_committed(out)).values()) < RECORDS, "the job ended before the stop"

    resumed = _pipeline(out, storage, parallelism=3).run(
        spark, restore_from=savepoint, timeout_s=RUN_TIMEOUT_S
    )
    assert resumed.state is JobStatus.FINISHED and resumed.restarts == 0
    assert sorted(s["slot"] for s in resumed.slot_summaries) == [0, 1, 2]
    assert _finals(read_committed(out)) == _finals(uninterrupted[1])


@pytest.mark.spark
def test_cancel_from_another_thread(spark: Any, tmp_path: Path) -> None:
    p = Pipeline("unbounded", parallelism=2)
    (
        p.source(GeneratorSource(rate_per_s=20_000, num_keys=10, batch_size=1024), name="events")
        .key_by("key")
        .count()
        .sink(TransactionalFileSink(str(tmp_path / "out")))
    )
    p.checkpointing(interval_ms=100)
    handle = p.run_async(spark)
    try:
        handle.wait_for_checkpoints(1, timeout_s=60)
    finally:
        handle.cancel()
    result = handle.result(60)
    assert result.state is JobStatus.CANCELED
    assert result.checkpoints_completed >= 1 and result.restarts == 0


# ---------------------------------------------------------------------------------------------
# Restart strategies and the driver's decisions (pure)
# ---------------------------------------------------------------------------------------------


def test_fixed_delay() -> None:
    s = FixedDelay(attempts=3, delay_s=1)
    assert [s.next_delay_s(k) for k in range(5)] == [1.0, 1.0, 1.0, None, None]
    assert FixedDelay(attempts=0).next_delay_s(0) is None


def test_exponential_backoff() -> None:
    s = ExponentialBackoff(initial_s=0.5, max_s=3, attempts=6)
    assert [s.next_delay_s(k) for k in range(7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, None]
    tripled = ExponentialBackoff(1, 100, 3, multiplier=3)
    assert [tripled.next_delay_s(k) for k in range(4)] == [1.0, 3.0, 9.0, None]
    assert ExponentialBackoff(1, 10, 10_000).next_delay_s(9_999) == 10.0  # no overflow
    assert NoRestart().next_delay_s(0) is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FixedDelay(attempts=-1), "attempts"),
        (lambda: FixedDelay(attempts=1.5), "attempts"),  # type: ignore[arg-type]
        (lambda: FixedDelay(delay_s=-1), "delay_s"),
        (lambda: FixedDelay(delay_s=float("nan")), "delay_s"),
        (lambda: ExponentialBackoff(initial_s=2, max_s=1), "max_s"),
        (lambda: ExponentialBackoff(multiplier=0.5), "multiplier"),
        (lambda: ExponentialBackoff(attempts=True), "attempts"),
    ],
)
def test_restart_strategy_validation(make: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        make()


def _outcome(succeeded: bool, status: JobStatus, error: str = "boom") -> StageOutcome:
    return StageOutcome(succeeded, status, "" if succeeded else error, "")


def test_next_action() -> None:
    fixed = FixedDelay(attempts=2, delay_s=0.5)
    # A finished job is over, even when the stage failed afterwards.
    assert next_action(
        _outcome(True, JobStatus.FINISHED), restarts_done=0, strategy=fixed
    ) == Finish(JobStatus.FINISHED)
    assert next_action(
        _outcome(False, JobStatus.FINISHED), restarts_done=0, strategy=fixed
    ) == Finish(JobStatus.FINISHED)
    # A failed deployment restarts while the strategy allows it.
    assert next_action(
        _outcome(False, JobStatus.RESTARTING), restarts_done=0, strategy=fixed
    ) == Resubmit(0.5, 1, "boom")
    assert next_action(
        _outcome(False, JobStatus.RUNNING), restarts_done=1, strategy=fixed
    ) == Resubmit(0.5, 2, "boom")
    exhausted = next_action(_outcome(False, JobStatus.RESTARTING), restarts_done=2, strategy=fixed)
    assert isinstance(exhausted, Finish) and exhausted.status is JobStatus.FAILED
    assert "no more restarts after 2" in exhausted.reason and "boom" in exhausted.reason
    # A stage that ended without the job finishing is a failed deployment too.
    odd = next_action(_outcome(True, JobStatus.RESTARTING), restarts_done=0, strategy=fixed)
    assert isinstance(odd, Resubmit) and "not FINISHED" in odd.reason
    # Cancelled or failed by the coordinator: over, no restart.
    assert (
        next_action(_outcome(False, JobStatus.CANCELED), restarts_done=0, strategy=fixed).status  # type: ignore[union-attr]
        is JobStatus.CANCELED
    )
    assert next_action(
        _outcome(False, JobStatus.RESTARTING),
        restarts_done=0,
        strategy=fixed,
        cancel_requested=True,
    ) == Finish(JobStatus.CANCELED, "canceled")
    failed = next_action(
        StageOutcome(False, JobStatus.FAILED, "stage", "too many failed checkpoints"),
        restarts_done=0,
        strategy=fixed,
    )
    assert failed == Finish(JobStatus.FAILED, "too many failed checkpoints")
    no_restart = next_action(
        _outcome(False, JobStatus.RESTARTING), restarts_done=0, strategy=NoRestart()
    )
    assert isinstance(no_restart, Finish) and no_restart.status is JobStatus.FAILED


def test_recovery_tracker() -> None:
    t = RecoveryTracker()
    t.observe(0.0, JobStatus.CREATED, 0)
    t.observe(1.0, JobStatus.RUNNING, 0)
    t.failure_noticed(2.0)  # the driver saw the stage fail
    t.observe(2.1, JobStatus.RUNNING, 0)  # the old deployment, not yet reported failed
    t.observe(2.5, JobStatus.RESTARTING, 0)
    t.observe(3.0, JobStatus.RESTARTING, 1)  # the new deployment registering
    assert t.recovering
    t.observe(3.5, JobStatus.RUNNING, 1)
    assert t.recovery_times_s == [1.5] and not t.recovering
    # A failure seen only as RESTARTING (e.g. Spark re-ran the stage by itself).
    t.observe(5.0, JobStatus.RESTARTING, 1)
    t.observe(5.2, JobStatus.RUNNING, 2)
    assert t.recovery_times_s == [1.5, pytest.approx(0.2)]
    # A failure that ends the job is no recovery.
    t.failure_noticed(6.0)
    t.observe(6.1, JobStatus.FAILED, 2)
    assert not t.recovering and len(t.recovery_times_s) == 2


def test_job_status_from_pb() -> None:
    assert JobStatus.from_pb(pb.JOB_STATE_RESTARTING) is JobStatus.RESTARTING
    assert JobStatus.from_pb(pb.JOB_STATE_FINISHED).is_terminal
    assert JobStatus.from_pb(99) is JobStatus.UNKNOWN


def test_local_slots_and_error_summaries() -> None:
    assert local_slots("local[4]") == 4
    assert local_slots("local[4,2]") == 4
    assert local_slots("local[4]", task_cpus=2) == 2
    assert local_slots("local") == 1
    assert local_slots("local[*]") == (os.cpu_count() or 1)
    assert local_slots("local-cluster[2,3,1024]") == 6
    assert local_slots("spark://host:7077") is None
    assert _host_of("10.0.0.7:4040") == "10.0.0.7" and _host_of("[::1]:4040") == "::1"
    text = (
        "An error occurred while calling o1.collect.\n: org.apache.spark.SparkException: Job "
        "aborted due to stage failure: Task 0 in stage 1.0 failed 1 times\nTraceback (most "
        'recent call last):\n  File "x.py", line 1\nRuntimeError: injected failure\n\tat org...'
    )
    summary = summarize_spark_error(Exception(text))
    assert "Task 0 in stage 1.0 failed" in summary and "RuntimeError: injected failure" in summary
    cancelled = (
        "calling o9.collect.\n: org.apache.spark.SparkException: Job 3 cancelled part of "
        "cancelled job group snapflow-x\n\tat org..."
    )
    assert summarize_spark_error(Exception(cancelled)).startswith("Job 3 cancelled part of")


# ---------------------------------------------------------------------------------------------
# The builder
# ---------------------------------------------------------------------------------------------


def test_builder_translates_to_a_job_graph(tmp_path: Path) -> None:
    p = Pipeline("bids", parallelism=2, max_parallelism=64)
    (
        p.source(GeneratorSource(total_records=10), name="bids")
        .filter(lambda row: row["value"] > 1)
        .map_batches(lambda b: b)
        .key_by("key", parallelism=3)
        .window(TumblingEventTimeWindows(1000), "ts", "value", "sum")
        .map(lambda row: row)
        .sink(TransactionalFileSink(str(tmp_path)))
    )
    graph = p.job_graph()
    assert graph.name == "bids"
    assert [
        (v.vertex_id, v.parallelism, v.is_source, v.max_parallelism) for v in graph.vertices
    ] == [
        ("v0-bids", 2, True, 64),
        ("v1-key-by-key", 3, False, 64),
    ]
    assert [o.kind for o in graph.vertices[0].operators] == ["source", "filter", "map_batches"]
    assert [o.kind for o in graph.vertices[1].operators] == ["window", "map", "sink"]
    assert graph.vertices[0].name == "bids -> filter -> map_batches"
    ids = [o.operator_id for v in graph.vertices for o in v.operators]
    assert len(set(ids)) == len(ids)
    (edge,) = graph.edges
    assert (edge.source_vertex_id, edge.target_vertex_id) == ("v0-bids", "v1-key-by-key")
    assert edge.partitioner == pb.PARTITIONER_KIND_HASH and edge.key_field == "key"
    assert p.slots == 3
    # Operators travel cloudpickled and come back usable.
    window = cloudpickle.loads(graph.vertices[1].operators[0].payload)
    assert type(window).__name__ == "WindowAggregate" and window.key_field == "key"
    # The same program gives the same ids (savepoints map back onto it).
    again = Pipeline("bids", parallelism=4, max_parallelism=64)
    (
        again.source(GeneratorSource(total_records=10), name="bids")
        .filter(lambda row: True)
        .map_batches(lambda b: b)
        .key_by("key")
        .window(TumblingEventTimeWindows(1000), "ts", "value")
        .map(lambda row: row)
        .sink(TransactionalFileSink(str(tmp_path)))
    )
    assert [o.operator_id for v in again.job_graph().vertices for o in v.operators] == ids


def test_builder_fan_out_and_settings(tmp_path: Path) -> None:
    p = Pipeline("fan-out", parallelism=2)
    events = p.source(GeneratorSource(total_records=10), name="events")
    events.key_by("key").count().sink(TransactionalFileSink(str(tmp_path / "a")))
    events.rebalance(parallelism=1).sink(TransactionalFileSink(str(tmp_path / "b")))
    assert p.checkpointing(interval_ms=200, mode="unaligned", storage=tmp_path / "cp") is p
    assert p.restart_strategy(ExponentialBackoff(0.1, 1.0, 5)) is p
    graph = p.job_graph()
    assert [e.partitioner for e in graph.edges] == [
        pb.PARTITIONER_KIND_HASH,
        pb.PARTITIONER_KIND_REBALANCE,
    ]
    config = wire.checkpoint_config_to_pb(p.checkpoint_config)
    assert config.interval_ms == 200 and config.mode == pb.CHECKPOINT_MODE_UNALIGNED
    assert config.storage_uri == str(tmp_path / "cp")
    relative = Pipeline("x").checkpointing(storage="cp").checkpoint_config.storage_uri
    assert os.path.isabs(relative)


def _runnable(p: Pipeline) -> Any:
    return p.source(GeneratorSource(total_records=1), name="s")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Pipeline(""), "pipeline name"),
        (lambda: Pipeline("x", parallelism=0), "parallelism"),
        (lambda: Pipeline("x", parallelism=5, max_parallelism=4), "parallelism"),
        (lambda: Pipeline("x", max_parallelism=40_000), "max_parallelism"),
        (lambda: Pipeline("x").source(object()), "SourceOperator"),  # type: ignore[arg-type]
        (lambda: _runnable(Pipeline("x")).map(42), "callable"),
        (lambda: _runnable(Pipeline("x")).key_by(""), "key_by"),
        (lambda: _runnable(Pipeline("x")).key_by("key", parallelism=-1), "parallelism"),
        (lambda: _runnable(Pipeline("x")).sink("out"), "sink needs"),
        (lambda: _runnable(Pipeline("x")).transform(lambda b: b), "transform needs"),
        (lambda: Pipeline("x").checkpointing(interval_ms=5), "interval_ms"),
        (lambda: Pipeline("x").checkpointing(interval_ms=1.5), "interval_ms"),  # type: ignore[arg-type]
        (lambda: Pipeline("x").checkpointing(mode="exactly_once"), "mode"),
        (
            lambda: Pipeline("x").checkpointing(mode="unaligned", aligned_checkpoint_timeout_ms=5),
            "aligned",
        ),
        (lambda: Pipeline("x").checkpointing(retained=0), "retained"),
        (lambda: Pipeline("x").checkpointing(storage="gs://bucket/cp"), "storage"),
        (lambda: Pipeline("x").checkpointing(storage="s3:///no-bucket"), "storage"),
        (lambda: Pipeline("x").restart_strategy("fixed"), "restart_strategy"),  # type: ignore[arg-type]
        (lambda: _runnable(Pipeline("x")).key_by("key").reduce("value", agg="median"), "agg"),
        (
            lambda: _runnable(Pipeline("x")).key_by("key").window(42, "ts", "value"),
            "window assigner",
        ),
        (lambda: RunOptions(executor_log_level="loud"), "executor_log_level"),
        (lambda: RunOptions(job_id="nope"), "job_id"),
        (lambda: RunOptions(settle_timeout_s=0), "settle_timeout_s"),
    ],
)
def test_builder_rejects_bad_arguments(build: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        build()


def test_builder_rejects_incomplete_or_branching_pipelines(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="no source"):
        Pipeline("empty").job_graph()
    p = Pipeline("no-sink")
    _runnable(p).map(lambda r: r)
    with pytest.raises(InvalidArgumentError, match="has no sink"):
        p.job_graph()
    p = Pipeline("dangling-key-by")
    _runnable(p).key_by("key")
    with pytest.raises(InvalidArgumentError, match="keyed operation"):
        p.job_graph()
    p = Pipeline("branch")
    s = _runnable(p)
    s.map(lambda r: r)
    with pytest.raises(InvalidArgumentError, match="already consumed"):
        s.filter(lambda r: True)
    p = Pipeline("after-sink")
    s = _runnable(p)
    s.sink(TransactionalFileSink(str(tmp_path)))
    with pytest.raises(InvalidArgumentError, match=r"consumed|sink"):
        s.map(lambda r: r)
    p = Pipeline("after-edge")
    s = _runnable(p)
    s.key_by("key").count().sink(TransactionalFileSink(str(tmp_path)))
    with pytest.raises(InvalidArgumentError, match="edge"):
        s.map(lambda r: r)
    p = Pipeline("keyed-twice")
    keyed = _runnable(p).key_by("key")
    keyed.count()
    with pytest.raises(InvalidArgumentError, match="consumed"):
        keyed.reduce("value")
    p = Pipeline("unpicklable")
    _runnable(p).map(lambda r: r).sink(_Unpicklable())
    with pytest.raises(InvalidArgumentError, match="cannot be pickled"):
        p.job_graph()


class _Unpicklable(Operator):
    def __reduce__(self) -> Any:
        raise TypeError("no pickling")


def test_run_checks_slots_and_master_before_submitting(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeContext:
        master = "local[2]"

        def getConf(self) -> Any:
            return {"spark.task.cpus": "1"}

    from snapflow.spark_bridge import driver as runner

    p = Pipeline("wide", parallelism=3)
    _runnable(p).key_by("key").count().sink(TransactionalFileSink("/tmp/unused"))
    monkeypatch.setattr(runner, "_spark_context", lambda spark: spark)
    with pytest.raises(InvalidArgumentError, match="fields of RunOptions"):
        runner.submit(p, FakeContext(), no_such_option=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="needs 3 task slots"):
        runner.submit(p, FakeContext())  # type: ignore[arg-type]
    FakeContext.master = "spark://cluster:7077"
    with pytest.raises(InvalidArgumentError, match="coordinator_address"):
        runner.submit(p, FakeContext())  # type: ignore[arg-type]


def test_embedded_coordinator_serves_the_driver_and_stops_cleanly(tmp_path: Path) -> None:
    from snapflow.coordinator.embedded import EmbeddedCoordinator
    from snapflow.spark_bridge.coordinator_client import CoordinatorClient
    from snapflow.v1 import coordinator_pb2 as cpb

    p = Pipeline("embedded")
    _runnable(p).key_by("key").count().sink(TransactionalFileSink(str(tmp_path / "out")))
    with EmbeddedCoordinator() as coordinator:
        client = CoordinatorClient(coordinator.address)
        try:
            job = client.call(
                "SubmitJob",
                cpb.SubmitJobRequest(
                    graph=p.job_graph(),
                    checkpoint_config=wire.checkpoint_config_to_pb(p.checkpoint_config),
                ),
            ).job
            assert JobStatus.from_pb(client.job(job.job_id).state) is JobStatus.CREATED
            with pytest.raises(InvalidArgumentError, match="job_id"):
                client.call("GetJob", cpb.GetJobRequest(job_id="not-hex"))
        finally:
            client.close()
        with pytest.raises(FailedPreconditionError, match="closed"):
            client.job(job.job_id)
    assert coordinator.address and coordinator._loop is None and coordinator._redis is None

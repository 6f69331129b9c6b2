"""Windows end to end on local Spark: a session window count and a window join, each into a
TransactionalFileSink, checked row by row against a plain-Python computation."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from snapflow.spark_bridge import Pipeline
from snapflow.spark_bridge.restart import JobStatus
from snapflow.worker.api.window_assigners import EventTimeSessionWindows, TumblingEventTimeWindows
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PARALLELISM = 2
GAP = 40
WINDOW = 200
RUN_TIMEOUT_S = 120.0


def _source(seed: int, records: int = 8_000) -> GeneratorSource:
    return GeneratorSource(
        total_records=records,
        num_keys=40,
        batch_size=500,
        seed=seed,
        interval_ms=10,
        max_out_of_orderness_ms=6,
    )


def _records(source: GeneratorSource) -> list[dict[str, int]]:
    assert source.total_records is not None
    base, rest = divmod(source.total_records, PARALLELISM)
    return [
        source.record(split, i)
        for split in range(PARALLELISM)
        for i in range(base + (1 if split < rest else 0))
    ]


def _sessions(records: list[dict[str, int]]) -> Counter[tuple[int, int, int, int]]:
    """Per key, the union of ``[ts, ts + GAP)`` intervals (touching ones merged) and their
    record counts: no record of the generator is late."""
    by_key: dict[int, list[int]] = {}
    for r in records:
        by_key.setdefault(r["key"], []).append(r["ts"])
    out: Counter[tuple[int, int, int, int]] = Counter()
    for key, stamps in by_key.items():
        stamps.sort()
        start, end, n = stamps[0], stamps[0] + GAP, 1
        for ts in stamps[1:]:
            if ts <= end:
                end, n = max(end, ts + GAP), n + 1
            else:
                out[(key, start, end, n)] += 1
                start, end, n = ts, ts + GAP, 1
        out[(key, start, end, n)] += 1
    return out


def _run(p: Pipeline, spark: Any, storage: Path) -> None:
    p.checkpointing(interval_ms=150, storage=str(storage))
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED


@pytest.mark.spark
def test_session_window_count_on_spark(spark: Any, tmp_path: Path) -> None:
    p = Pipeline("sessions", parallelism=PARALLELISM, max_parallelism=128)
    (
        p.source(_source(5), name="events")
        .key_by("key")
        .window(EventTimeSessionWindows(GAP), "ts")
        .aggregate("count", output_field="n")
        .sink(TransactionalFileSink(str(tmp_path / "out")))
    )
    _run(p, spark, tmp_path / "cp")
    table = read_committed(tmp_path / "out")
    got = Counter(
        zip(
            table.column("key").to_pylist(),
            table.column("window_start").to_pylist(),
            table.column("window_end").to_pylist(),
            table.column("n").to_pylist(),
            strict=True,
        )
    )
    expected = _sessions(_records(_source(5)))
    assert len(expected) > 100  # sessions of several sizes, not one per key
    assert got == expected


@pytest.mark.spark
def test_window_join_on_spark(spark: Any, tmp_path: Path) -> None:
    orders, payments = _source(7, 3_000), _source(8, 3_000)
    p = Pipeline("window-join", parallelism=PARALLELISM, max_parallelism=128)
    (
        p.source(orders, name="orders")
        .join(p.source(payments, name="payments"))
        .where("key")
        .equal_to("key")
        .window(TumblingEventTimeWindows(WINDOW), "ts")
        .apply()
        .sink(TransactionalFileSink(str(tmp_path / "out")))
    )
    _run(p, spark, tmp_path / "cp")
    table = read_committed(tmp_path / "out")
    columns = ["left_key", "left_value", "left_ts", "right_key", "right_value", "right_ts"]
    assert table.column_names == columns
    got = Counter(zip(*(table.column(c).to_pylist() for c in columns), strict=True))
    by_window: dict[tuple[int, int], list[dict[str, int]]] = {}
    for r in _records(payments):
        by_window.setdefault((r["key"], r["ts"] // WINDOW), []).append(r)
    expected: Counter[tuple[int, ...]] = Counter()
    for a in _records(orders):
        for b in by_window.get((a["key"], a["ts"] // WINDOW), []):
            expected[(a["key"], a["value"], a["ts"], b["key"], b["value"], b["ts"])] += 1
    assert len(expected) > 1000
    assert got == expected

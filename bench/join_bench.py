"""The join benchmark of issue 21: a two-source keyed interval join on local Spark.

The job: two ``JoinEventsSource`` (``bench.join_ops``: ``key = i % 10000``, ten rows per ms of
event time, bounded, unthrottled) -> ``key_by("key")`` on both ->
``interval_join(...).between(-250, 250)`` with the vectorised default output (the joined rows)
-> ``MeasuringSink`` (discards, counts), parallelism 2 (two Spark task slots of one barrier
stage) on ``local[4]``, checkpoints every ``INTERVAL_MS``, the coordinator embedded (one per
run, as in ``bench.keyed_count_bench``, whose watcher and Spark session this reuses).

Runs, in order: ``aligned`` and ``unaligned`` at full load, then ``skew``: unaligned, the left
source throttled to ``SKEW_RATE`` rows/s and the right one to a tenth of that (its rows ten
times further apart in event time, so that both inputs' event times keep pace and the join's
state stays bounded: the skew is in rows per second, what unaligned checkpoints are for).

``join_events_per_s`` (per mode) = input rows of both sources / (last - first joined row seen
by the sinks, over both subtasks); ``join_checkpoint_p50_ms``/``_p99_ms`` = the aligned run's
(``join_aligned_*``, ``join_unaligned_*`` for both): the coordinator's end-to-end durations
(trigger to the last ack) of the periodic checkpoints (the final one of the bounded job waits
for the end of the input, not for data). ``join_skew_unaligned_p99_ms`` the same in the skew
run. Each full-load run checks that the sinks saw exactly ``2 x left rows`` pairs.

Sizes: ``SNAPFLOW_BENCH_JOIN_RECORDS`` (rows per source at full load, default 12 M),
``SNAPFLOW_BENCH_JOIN_SKEW_S`` (default 12 s of the skew run). ``SNAPFLOW_BENCH_RESULTS``
names the results file (default ``join``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark import cloudpickle
from rich.console import Console

import bench.join_ops as ops
from bench.common import write_results
from bench.spark_bench import _spark, _Watcher
from snapflow.coordinator.checkpoint_stats import percentile
from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.errors import DeadlineExceededError
from snapflow.logging import configure_logging
from snapflow.spark_bridge import JobStatus, NoRestart, Pipeline
from snapflow.spark_bridge.coordinator_client import CoordinatorClient

PARALLELISM = 2
INTERVAL_MS = 1000
BATCH_SIZE = 65_536
LOWER_MS, UPPER_MS = -250, 250
RECORDS = int(os.environ.get("SNAPFLOW_BENCH_JOIN_RECORDS", 12_000_000))
SKEW_S = float(os.environ.get("SNAPFLOW_BENCH_JOIN_SKEW_S", 12))
SKEW_RATE = 400_000
WARMUP_RECORDS = 400_000
RUN_TIMEOUT_S = 240.0
RESULTS = os.environ.get("SNAPFLOW_BENCH_RESULTS") or "join"

TARGET_EVENTS_PER_S = 1_000_000
TARGET_P99_MS = 250.0
TARGET_SKEW_RATIO = 3.0


@dataclass
class Run:
    name: str
    mode: str
    left_rows: int
    right_rows: int
    events_per_s: float = 0.0
    measured_s: float = 0.0
    job_s: float = 0.0
    pairs: int = 0
    exactly_once: bool | None = None
    durations_ms: list[float] = field(default_factory=list)
    phases_ms: list[dict[str, float]] = field(default_factory=list)
    failed_checkpoints: int = 0

    def q(self, pct: float) -> float:
        return percentile(sorted(self.durations_ms), pct) if self.durations_ms else float("nan")


def _pipeline(run: Run, stats: str, storage: Path, skew: bool) -> Pipeline:
    p = Pipeline(f"join-{run.name}", parallelism=PARALLELISM)
    if skew:
        left_src = ops.JoinEventsSource(run.left_rows, batch_size=BATCH_SIZE, rate_per_s=SKEW_RATE)
        right_src = ops.JoinEventsSource(
            run.right_rows, ms_per_10_rows=10, batch_size=BATCH_SIZE, rate_per_s=SKEW_RATE / 10
        )
    else:
        left_src = ops.JoinEventsSource(run.left_rows, batch_size=BATCH_SIZE)
        right_src = ops.JoinEventsSource(run.right_rows, batch_size=BATCH_SIZE)
    left = p.source(left_src, name="left").key_by("key")
    right = p.source(right_src, name="right").key_by("key")
    joined = (
        left.interval_join(right).between(LOWER_MS, UPPER_MS, left_time="ts").select(name="join")
    )
    joined.sink(ops.MeasuringSink(stats), name="sink")
    p.checkpointing(interval_ms=INTERVAL_MS, mode=run.mode, storage=storage)
    p.restart_strategy(NoRestart())
    return p


def _run(spark: Any, tmp: Path, run: Run, skew: bool = False) -> Run:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{run.name}-", dir=tmp))
    stats = run_dir / "stats"
    stats.mkdir()
    p = _pipeline(run, str(stats), run_dir / "cp", skew)
    with EmbeddedCoordinator(storage_root=str(run_dir / "root")) as coordinator:
        client = CoordinatorClient(coordinator.address)
        try:
            started = time.monotonic()
            handle = p.run_async(spark, coordinator_address=coordinator.address)
            watcher = _Watcher(client, handle.job_id, spark.sparkContext).start()
            try:
                result = handle.result(RUN_TIMEOUT_S)
            except DeadlineExceededError:
                handle.cancel()
                with contextlib.suppress(Exception):
                    handle.result(60.0)
                raise
            finally:
                watcher.stop()
            run.job_s = time.monotonic() - started
        finally:
            client.close()
    if result.state is not JobStatus.FINISHED:
        raise RuntimeError(f"{run.name}: the job ended {result.state.value}")
    meters = []
    for path in sorted(glob.glob(os.path.join(stats, "sink-*.json"))):
        with open(path) as f:
            meters.append(json.load(f))
    seen = [m for m in meters if m["rows"]]
    run.pairs = sum(m["rows"] for m in meters)
    run.measured_s = max(m["last"] for m in seen) - min(m["first"] for m in seen) if seen else 0.0
    events = run.left_rows + run.right_rows
    run.events_per_s = events / run.measured_s if run.measured_s > 0 else float("nan")
    if not skew:
        run.exactly_once = run.pairs == 2 * run.left_rows
    last_id = max(watcher.completed, default=0)
    cps = [c for i, c in sorted(watcher.completed.items()) if i != last_id]
    run.durations_ms = [float(c.duration_ms) for c in cps]
    run.phases_ms = [
        {
            "id": c.checkpoint_id,
            "total": c.duration_ms,
            "start_delay": c.start_delay_ms,
            "alignment": c.alignment_ms,
            "sync": c.sync_ms,
            "async": c.async_ms,
            "completion": round(c.completion_ms, 1),
        }
        for c in cps
    ]
    run.failed_checkpoints = len(watcher.failed)
    return run


def main() -> int:
    console = Console(width=150)
    configure_logging("warning")
    cloudpickle.register_pickle_by_value(ops)  # Spark's workers need not import bench/
    began = time.monotonic()
    load_before = os.getloadavg()
    runs: list[Run] = []
    errors: list[str] = []
    skew_left = int(SKEW_RATE * SKEW_S)
    plan = [
        (Run("aligned", "aligned", RECORDS, RECORDS), False),
        (Run("unaligned", "unaligned", RECORDS, RECORDS), False),
        (Run("skew", "unaligned", skew_left, skew_left // 10), True),
    ]
    with tempfile.TemporaryDirectory(prefix="snapflow-join-") as tmp_name, _spark() as spark:
        tmp = Path(tmp_name)
        _run(spark, tmp, Run("warmup", "aligned", WARMUP_RECORDS, WARMUP_RECORDS))
        for run, skew in plan:
            try:
                runs.append(_run(spark, tmp, run, skew))
            except Exception as e:  # reported, the other runs go on
                errors.append(f"{run.name}: {type(e).__name__}: {e}"[:500])
                console.print(f"[red]{errors[-1]}[/red]")
                continue
            console.print(
                f"{run.name}: {run.events_per_s:,.0f} events/s over {run.measured_s:.1f} s "
                f"(job {run.job_s:.1f} s), {run.pairs:,} pairs, checkpoints "
                f"{len(run.durations_ms)} p50 {run.q(50):.0f} p99 {run.q(99):.0f} ms, "
                f"failed {run.failed_checkpoints}, exactly once {run.exactly_once}"
            )
    by = {r.name: r for r in runs}
    metrics: dict[str, float] = {}
    for name in ("aligned", "unaligned"):
        if name in by:
            r = by[name]
            metrics[f"join_{name}_events_per_s"] = round(r.events_per_s)
            metrics[f"join_{name}_checkpoint_p50_ms"] = round(r.q(50), 1)
            metrics[f"join_{name}_checkpoint_p99_ms"] = round(r.q(99), 1)
            metrics[f"join_{name}_checkpoints"] = float(len(r.durations_ms))
    if "aligned" in by:
        metrics["join_events_per_s"] = metrics["join_aligned_events_per_s"]
        metrics["join_checkpoint_p50_ms"] = metrics["join_aligned_checkpoint_p50_ms"]
        metrics["join_checkpoint_p99_ms"] = metrics["join_aligned_checkpoint_p99_ms"]
    if "skew" in by:
        metrics["join_skew_unaligned_p50_ms"] = round(by["skew"].q(50), 1)
        metrics["join_skew_unaligned_p99_ms"] = round(by["skew"].q(99), 1)
        metrics["join_skew_checkpoints"] = float(len(by["skew"].durations_ms))
        if "unaligned" in by and by["unaligned"].q(99) > 0:
            metrics["join_skew_unaligned_p99_ratio"] = round(
                by["skew"].q(99) / by["unaligned"].q(99), 2
            )
    targets = {
        "join_events_per_s": f">= {TARGET_EVENTS_PER_S:,}",
        "join_aligned_checkpoint_p99_ms": f"<= {TARGET_P99_MS:g}",
        "join_unaligned_checkpoint_p99_ms": f"<= {TARGET_P99_MS:g}",
        "join_skew_unaligned_p99_ratio": f"<= {TARGET_SKEW_RATIO:g} (skew p99 / unaligned p99)",
    }
    for key, target in targets.items():
        console.print(f"{key}: {metrics.get(key, float('nan'))} (target {target})")
    path = write_results(
        RESULTS,
        metrics,
        targets=targets,
        setup={
            "master": "local[4]",
            "parallelism": PARALLELISM,
            "checkpoint_interval_ms": INTERVAL_MS,
            "num_keys": ops.NUM_KEYS,
            "bounds_ms": [LOWER_MS, UPPER_MS],
            "records_per_source": RECORDS,
            "skew_rates_per_s": [SKEW_RATE, SKEW_RATE / 10],
            "source_batch_size": BATCH_SIZE,
            "total_s": round(time.monotonic() - began, 1),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        runs={
            r.name: {
                "mode": r.mode,
                "left_rows": r.left_rows,
                "right_rows": r.right_rows,
                "events_per_s": r.events_per_s,
                "measured_s": r.measured_s,
                "job_s": r.job_s,
                "pairs": r.pairs,
                "exactly_once": r.exactly_once,
                "failed_checkpoints": r.failed_checkpoints,
                "checkpoint_durations_ms": r.durations_ms,
                "checkpoint_phases_ms": r.phases_ms,
            }
            for r in runs
        },
        errors=errors,
    )
    console.print(f"written to {path}")
    return 1 if errors or any(r.exactly_once is False for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())

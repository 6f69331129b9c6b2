"""Nexmark benchmark: each query of ``examples/nexmark`` as a Snapflow job on local Spark,
measured and checked against the same query in batch Spark SQL.

Per query (``QUERIES=q0,q5`` selects; default: every query of examples/nexmark; keyed state
in RocksDB with incremental checkpoints, as Flink's Nexmark setup keeps it, unless
``BACKEND=heap`` sets the heap backend for every query of the run):

1. a calibration run (``CALIBRATION_EVENTS`` events) giving the events/s that size the next;
2. the measured run, sized to last about ``TARGET_RUN_S`` (at least ``MIN_CHECKPOINTS``
   checkpoints at ``INTERVAL_MS``; re-sized by the marginal rate of the runs so far and by
   their events per checkpoint, up to ``RESIZES`` times, while it completes fewer; at most ``MAX_OUTPUT_BYTES`` of output files
   (zstd-compressed Arrow), as the calibration's predicts, since the output waits on disk for its check,
   so a pass-through query may end with fewer checkpoints, as the table then says): bounded ``NexmarkSource``s of the query's kinds ->
   the query -> ``TransactionalFileSink``, parallelism 2 on ``local[4]``, aligned exactly-once
   checkpoints every second, an embedded coordinator read for the checkpoint statistics.

Reported, per query: ``nexmark_qN_events_per_s`` = Nexmark events (all kinds, as Nexmark's
``events.num`` counts them; the sources generate only their kinds' rows) / ``JobResult.duration_s``
(submission to the end: stage launch, start-up and the final checkpoint included, so a lower
bound of the steady rate); ``..._per_core`` = that / the cores the job had (``min(cpus,
parallelism)``; the driver, the coordinator and Spark share them); ``..._checkpoint_p99_ms`` =
the coordinator's p99 of ``end_to_end_duration_ms`` over the run's completed checkpoints;
``..._checkpoints`` = how many completed; ``..._matches_batch`` = 1 when the committed output
(its final rows, for an updating result) and the Spark SQL result over the same events have the
same checksum: the row count and per column the sum, minimum and maximum (of the lengths, for
strings), computed file by file on one side and by Spark on the other (tens of millions of rows
compared row by row would not fit the machine; tests/nexmark compares rows exactly on fewer
events).
Also ``nexmark_generator_events_per_s``: the generator alone on one core (bids, batches of
65,536 rows, events counted as the source counts them). Each query's run record also
has its backend, the load average around it, the checkpoints' median state and incremental
sizes, and where the time of the slowest recent checkpoint went (``slowest_checkpoint``: the
longest start delay, alignment, synchronous and asynchronous part over its subtasks). Written
to ``bench/results/nexmark.json``, keeping the figures of the queries this run did not measure
(``sittings`` says which run measured which queries, under what load); a table is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kit.nexmark import (
    compare_fingerprints,
    fingerprint_batch,
    fingerprint_output,
    load_query,
    query_names,
    run_streaming,
)
from rich.console import Console
from rich.table import Table

from bench.common import RESULTS_DIR, write_results
from snapflow import JobStatus, NexmarkConfig
from snapflow.coordinator.embedded import EmbeddedCoordinator
from snapflow.logging import configure_logging
from snapflow.spark_bridge.coordinator_client import CoordinatorClient
from snapflow.spark_bridge.session import local_session
from snapflow.state_backend_options import ROCKSDB, parse_state_backend
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.connectors.nexmark_model import generate, split_count, split_ordinals

PARALLELISM = 2
MASTER = "local[4]"
INTERVAL_MS = 1000
CALIBRATION_EVENTS = 2_000_000
TARGET_RUN_S = 25.0
MIN_CHECKPOINTS = 20
RESIZES = 2  # measured runs re-sized at most this often to reach MIN_CHECKPOINTS
MIN_EVENTS, MAX_EVENTS = 2_000_000, 600_000_000
MAX_OUTPUT_BYTES = 6 << 30  # the committed output waits on the shared local disk for its check
COMPRESSION = "zstd"  # of the output files: q0's bids take 2.8 times less disk
RUN_TIMEOUT_S = 300.0
CONFIG = NexmarkConfig()  # Nexmark's benchmark defaults: 10 M events per second of event time


def _backend(name: str) -> str:
    """The run's keyed state backend: ``BACKEND`` from the environment, else rocksdb."""
    return parse_state_backend(os.environ.get("BACKEND") or ROCKSDB)


def _run(spark: Any, tmp: Path, name: str, num_events: int, keep: bool = False) -> dict[str, Any]:
    """One run; its files (gigabytes at full size) are removed unless ``keep``."""
    query = load_query(name)
    backend = _backend(name)
    base = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    with EmbeddedCoordinator(storage_root=str(base / "root")) as coordinator:
        run = run_streaming(
            spark,
            query,
            num_events,
            base,
            CONFIG,
            parallelism=PARALLELISM,
            interval_ms=INTERVAL_MS,
            timeout_s=RUN_TIMEOUT_S,
            coordinator_address=coordinator.address,
            state_backend=backend,
            compression=COMPRESSION,
        )
        client = CoordinatorClient(coordinator.address)
        try:
            stats = client.call(
                "GetCheckpointStats", cpb.GetCheckpointStatsRequest(job_id=run.result.job_id)
            )
            slowest = _slowest_checkpoint(client, run.result.job_id, stats)
        finally:
            client.close()
    rows = run.output.num_rows if not keep else -1  # a calibration's output is small
    output_bytes = sum(
        p.stat().st_size for p in run.directory.iterdir() if p.name.startswith("part-")
    )
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    if run.result.state is not JobStatus.FINISHED:
        raise RuntimeError(f"{name}: the job ended {run.result.state.value}")
    return {
        "state_backend": backend,
        "events": num_events,
        "duration_s": run.result.duration_s,
        "events_per_s": num_events / run.result.duration_s,
        "checkpoints": int(stats.counts.completed),
        "checkpoints_failed": int(stats.counts.failed),
        "checkpoint_p99_ms": float(stats.end_to_end_duration_ms.p99),
        "checkpoint_p50_ms": float(stats.end_to_end_duration_ms.p50),
        "checkpoint_p90_ms": float(stats.end_to_end_duration_ms.p90),
        "recent_checkpoints_ms": {  # id -> end to end, the newest ten (the last: end of input)
            int(c.checkpoint_id): int(c.end_to_end_duration_ms)
            for c in stats.history
            if c.status == pb.CHECKPOINT_STATUS_COMPLETED
        },
        "checkpoint_state_bytes_p50": int(stats.state_size_bytes.p50),
        "checkpoint_incremental_bytes_p50": int(stats.incremental_size_bytes.p50),
        "slowest_checkpoint": slowest,
        "run": run,
        "rows": rows,
        "output_bytes": output_bytes,
    }


def _slowest_checkpoint(
    client: CoordinatorClient, job_id: str, stats: cpb.CheckpointStats
) -> dict[str, Any]:
    """Where the time of the slowest completed checkpoint among the coordinator's recent
    history (its newest ten by default: the largest state of a growing one) went: its sizes
    and, over its subtasks, the longest start delay, alignment, synchronous and asynchronous
    parts."""
    done = [c for c in stats.history if c.status == pb.CHECKPOINT_STATUS_COMPLETED]
    if not done:
        return {}
    worst = max(done, key=lambda c: c.end_to_end_duration_ms)
    details = client.call(
        "GetCheckpointDetails",
        cpb.GetCheckpointDetailsRequest(job_id=job_id, checkpoint_id=worst.checkpoint_id),
    )
    metrics = [t.metrics for t in details.subtasks if t.acknowledged]
    return {
        "checkpoint_id": int(worst.checkpoint_id),
        "end_to_end_ms": int(worst.end_to_end_duration_ms),
        "state_size_bytes": int(worst.state_size_bytes),
        "incremental_size_bytes": int(worst.incremental_size_bytes),
        "completion_latency_ms": round(worst.completion_latency_ms, 1),
        **{
            f"max_{phase}_ms": max((int(getattr(m, f"{phase}_ms")) for m in metrics), default=0)
            for phase in ("start_delay", "alignment_duration", "sync_duration", "async_duration")
        },
    }


def generator_events_per_s(kind: str = "bid", events: int = 20_000_000) -> float:
    """The generator alone on one core: events (all kinds, as counted by the source) per
    second for which it produced the ``kind`` rows, in batches of 65,536 rows of one split of
    two (the source's defaults)."""
    count = split_count(CONFIG, kind, events, 0, 2, 1024)
    step = 65_536
    generate(CONFIG, kind, split_ordinals(CONFIG, kind, 0, step, 0, 2, 1024))  # warm caches
    started = time.perf_counter()
    for lo in range(0, count, step):
        generate(CONFIG, kind, split_ordinals(CONFIG, kind, lo, min(step, count - lo), 0, 2, 1024))
    return events / 2 / (time.perf_counter() - started)


def _measure(spark: Any, tmp: Path, name: str, console: Console) -> dict[str, Any]:
    """Calibrate, run sized to ``TARGET_RUN_S``, check against Spark SQL."""
    calibration = _run(spark, tmp, name, CALIBRATION_EVENTS)
    rate = calibration["events_per_s"]
    # The committed output lands on the local disk until checked: bound it.
    most = MAX_EVENTS
    if calibration["output_bytes"] > 0:
        most = min(most, int(MAX_OUTPUT_BYTES * CALIBRATION_EVENTS / calibration["output_bytes"]))
    events = int(rate * TARGET_RUN_S) // 1_000_000 * 1_000_000
    events = max(MIN_EVENTS, min(most, events))
    console.print(
        f"[dim]{name}: calibration {rate:,.0f} events/s; measured run {events:,} events[/dim]"
    )
    measured = _run(spark, tmp, name, events, keep=True)
    previous = calibration
    for _ in range(RESIZES):
        if measured["checkpoints"] >= MIN_CHECKPOINTS or events >= most:
            break
        # Too short (start-up dominated the calibration): size by the marginal rate of the
        # two runs so far, which leaves the fixed start-up cost out.
        shutil.rmtree(measured["run"].directory.parent, ignore_errors=True)
        added = measured["events"] - previous["events"]
        took = max(0.1, measured["duration_s"] - previous["duration_s"])
        rate = max(added / took, measured["events_per_s"])
        wanted = measured["events"] + rate * (TARGET_RUN_S - measured["duration_s"])
        # A query whose end of input takes long (a window that fires only then: q8) has no
        # checkpoints in that time: size also by the events per checkpoint seen so far.
        per_checkpoint = measured["events"] / max(1, measured["checkpoints"])
        wanted = max(wanted, per_checkpoint * (MIN_CHECKPOINTS + 2))
        previous = measured
        events = min(most, max(events + 1_000_000, int(wanted) // 1_000_000 * 1_000_000))
        console.print(
            f"[dim]{name}: {measured['checkpoints']} checkpoints; again with {events:,} events[/dim]"
        )
        measured = _run(spark, tmp, name, events, keep=True)
    run = measured.pop("run")
    started = time.monotonic()
    query = load_query(name)
    check = compare_fingerprints(
        query, fingerprint_output(query, run), fingerprint_batch(spark, query, events, CONFIG)
    )
    shutil.rmtree(run.directory.parent, ignore_errors=True)
    measured["output_rows"] = check.streaming_rows
    measured["check_s"] = round(time.monotonic() - started, 1)
    measured["check"] = check.detail or "equal"
    measured["matches"] = check.matches
    return measured


def _keep_other_queries(
    metrics: dict[str, float], runs: dict[str, Any], sitting: dict[str, Any]
) -> list[dict[str, Any]]:
    """Add the figures of the queries this run did not measure from the results file, so that
    a run of a few queries (``QUERIES=``) replaces only theirs; return the sittings (each
    run's queries and load averages) with this one last and the queries it measured again
    taken out of the earlier ones."""
    path = RESULTS_DIR / "nexmark.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    measured = set(sitting["queries"])
    for key, value in previous.get("metrics", {}).items():
        if key.startswith("nexmark_q") and key.split("_")[1] not in measured:
            metrics.setdefault(key, value)
    for name, run in previous.get("runs", {}).items():
        if name not in measured:
            runs.setdefault(name, run)
    sittings = []
    for old in previous.get("sittings", []):
        kept = [q for q in old["queries"] if q not in measured]
        if kept:
            sittings.append({**old, "queries": kept})
    return [*sittings, sitting]


def main() -> int:
    console = Console(width=150)
    configure_logging("warning")
    names = [q for q in os.environ.get("QUERIES", "").split(",") if q] or query_names()
    unknown = sorted(set(names) - set(query_names()))
    if unknown:
        console.print(f"[red]unknown queries: {', '.join(unknown)}[/red]")
        return 2
    cores = min(os.cpu_count() or 1, PARALLELISM)
    load_before = os.getloadavg()  # the machine may be shared: recorded beside the figures
    metrics: dict[str, float] = {
        "nexmark_generator_events_per_s": round(generator_events_per_s()),
    }
    console.print(
        f"[dim]generator (bids, one core): {metrics['nexmark_generator_events_per_s']:,} events/s[/dim]"
    )
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="snapflow-nexmark-bench-") as tmp_name:
        tmp = Path(tmp_name)
        spark = local_session(MASTER, "snapflow-nexmark-bench")
        try:
            _run(spark, tmp, names[0], 200_000)  # warm-up: Python workers, imports, the JVM
            for name in names:
                try:
                    load = os.getloadavg()
                    runs[name] = _measure(spark, tmp, name, console)
                    runs[name]["load_average_before"] = load
                    runs[name]["load_average_after"] = os.getloadavg()
                except Exception as e:  # one query's failure is its result, not the run's end
                    console.print(f"[red]{name}: {type(e).__name__}: {e}[/red]"[:1000])
                    metrics[f"nexmark_{name}_matches_batch"] = 0
                    continue
                measured = runs[name]
                metrics[f"nexmark_{name}_events_per_s"] = round(measured["events_per_s"])
                metrics[f"nexmark_{name}_events_per_s_per_core"] = round(
                    measured["events_per_s"] / cores
                )
                metrics[f"nexmark_{name}_checkpoint_p99_ms"] = measured["checkpoint_p99_ms"]
                metrics[f"nexmark_{name}_checkpoints"] = measured["checkpoints"]
                metrics[f"nexmark_{name}_matches_batch"] = 1 if measured["matches"] else 0
        finally:
            spark.stop()

    table = Table(
        title=(
            f"Nexmark on Snapflow: {MASTER}, parallelism {PARALLELISM} ({cores} cores), aligned "
            f"exactly-once checkpoints every {INTERVAL_MS} ms"
        )
    )
    for column in ("query", "backend", "events", "duration s", "events/s", "events/s/core",
                   "ckpts", "ckpt p99 ms", "matches batch"):  # fmt: skip
        table.add_column(column, justify="left" if column == "query" else "right")
    for name, r in runs.items():
        table.add_row(
            name,
            r["state_backend"],
            f"{r['events']:,}",
            f"{r['duration_s']:.1f}",
            f"{r['events_per_s']:,.0f}",
            f"{r['events_per_s'] / cores:,.0f}",
            f"{r['checkpoints']}" + ("" if r["checkpoints"] >= MIN_CHECKPOINTS else " (< 20)"),
            f"{r['checkpoint_p99_ms']:.0f}",
            "yes" if metrics[f"nexmark_{name}_matches_batch"] else f"NO: {r['check']}",
        )
    console.print(table)
    sitting = {
        "queries": names,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = write_results(
        "nexmark",
        metrics,
        runs=runs,
        sittings=_keep_other_queries(metrics, runs, sitting),
        settings={
            "master": MASTER,
            "parallelism": PARALLELISM,
            "cores": cores,
            "checkpoint_interval_ms": INTERVAL_MS,
            "first_event_rate": CONFIG.first_event_rate,
            "target_run_s": TARGET_RUN_S,
        },
    )
    console.print(f"[dim]wrote {path}[/dim]")
    return 0 if all(metrics[f"nexmark_{n}_matches_batch"] for n in names) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Data-plane benchmark: records/s with and without checkpoints, checkpoint durations unloaded
and under backpressure, peak memory of an agent.

Pipeline (parallelism 2 per vertex, max parallelism 128, 1000 keys)::

    source (GeneratorSource, bounded) --hash(key)--> [KeyedCount("key") -> sink]

The coordinator runs in its own process (``snapflow coordinator``, a real ``redis-server``) and
each job runs on two agents, each its own process (``snapflow worker --slot S --slots 2``), so
both cores are used. Every run submits a new job; this process only watches it (WatchJob
events) and reads its stats.

records/s
    total source records / (job RUNNING -> FINISHED), both timestamps from the coordinator's
    WatchJob events. A bounded source only ends after a checkpoint that covers its last
    records (with checkpoints off, its agent asks the coordinator for that final checkpoint),
    and in *every* run the benchmark triggers one checkpoint as soon as both sources wrote
    their end marker (``bench.dataplane_ops.MarkedGeneratorSource``): every run pays one final
    checkpoint, and the 1 s run does not wait up to a second for its next periodic one. The time from
    RUNNING to the last batch a sink saw is recorded too (``*_data``). Throughput runs are
    repeated interleaved (``SNAPFLOW_BENCH_REPEATS``, default 3) and the best of each kind is
    reported: on a shared machine noise only ever slows a run down.
sink
    throughput runs end in ``DiscardingSink`` (counts rows, keeps the newest count per key,
    discards), so the numbers are the data plane's, not a file system's. The newest counts of
    both sinks must sum to the source records; every run checks it (column ``ok``).
record API
    ``Map(lambda r: r)`` chained right after the source (rows to dicts and back to Arrow),
    checkpoints off.
checkpoint durations
    ``end_to_end_duration_ms`` (trigger to completion, as the coordinator measures it) of the
    checkpoints triggered while every source ran, from the job's checkpoint events: not those
    triggered after a source ended (its barriers are aligned in every mode and wait for the
    whole backlog), nor, in the runs with details (backpressure), one whose barrier a source
    injected after its last record (its snapshot counts all of the source's records;
    GetCheckpointStats' quantiles over every checkpoint are kept as
    ``coordinator_end_to_end_ms`` in each run's row); per-subtask start delay and alignment
    from GetCheckpointDetails.
phases
    per checkpoint of the running job (as above), so that a regression names its phase:
    ``start_delay``, ``alignment``, ``sync`` and ``async`` (the snapshot's synchronous and
    asynchronous parts), each the maximum over the subtasks (GetCheckpointDetails, fetched for
    every checkpoint of the runs with checkpoints once the job ended, from a coordinator whose
    history holds them all: fetched while the job runs, each would be one more call the
    coordinator serves and this process makes, on the cores the measured job runs on), and
    ``commit`` (the coordinator's completion latency: the last ack to the durable commit);
    metrics
    ``<phase>_p50_ms_<run>``/``<phase>_p99_ms_<run>`` for the unloaded run, the best runs at
    1 s and 100 ms (``1s``, ``full_load_100ms``), and ``backpressure_<phase>_p99_ms_<key>``.
    "Unloaded": dedicated runs, sources limited to ``UNLOADED_RATE`` records/s in batches of
    10 ms worth of records, interval 100 ms, aligned; the run with the lowest p99 is reported.
backpressure
    a sink that sleeps per batch (``ThrottledSink``), far below the source rate. In the main
    runs only sink subtask 0 sleeps (one slow sink instance, as with a skewed key or a slow
    node): agent 1's source runs at full speed and fills its channel to the slow subtask, so
    the backlog in the channels is real. The sleep blocks the thread it runs on: by default
    every subtask runs its operators on a task thread of its own (docs/worker.md, "Where user
    code runs"), so agent 0's loop stays free; ``*_adaptive`` runs start operators on the
    agent's loop (``--no-task-thread``), and the sink's subtask moves to a task thread once its
    calls are seen to block; ``unaligned_loop`` keeps the sink on agent 0's event loop
    (``--no-task-thread --no-adaptive-task-thread``), where its source and its gRPC servicing
    stall with it. Modes ALIGNED, UNALIGNED and ALIGNED with
    aligned_checkpoint_timeout_ms = 50, interval 100 ms; ALIGNED and UNALIGNED again with twice
    the sleep (debloating bounds the queued data by time, so aligned checkpoints take about as
    long); and both modes with both sink subtasks sleeping (``all_slow``).
CPU per checkpoint
    ``coordinator_cpu_ms_per_checkpoint_100ms`` and ``agents_cpu_ms_per_checkpoint_100ms``: the
    CPU the 100 ms runs spent beyond the runs without checkpoints, per completed checkpoint,
    split by process (means over the runs; the coordinator's idle cost is subtracted by rate,
    the agents' by total, as every throughput run moves the same records). On two cores the
    data plane saturates, this is what the throughput overhead is made of; the split says
    which side a regression is on. ``cpu_s_per_m_records_<run>`` and ``overhead_<run>_pct_cpu``
    are the same CPU per million records.
memory
    peak RSS of each agent process as the kernel counts it: ``ru_maxrss`` from ``os.wait4`` on
    the worker process (whole lifetime); the max over both agents and every run. CPU seconds
    of the agents come from the same call, the coordinator's from ``/proc/<pid>/stat``.

Set ``SNAPFLOW_BENCH_KEEP=1`` to keep the run directories (worker logs, sink counters, py-spy
stacks of the workers of a run that timed out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from bench.common import free_port, op_spec, start_coordinator, stop_process, write_results
from bench.dataplane_ops import DiscardingSink, MarkedGeneratorSource, ThrottledSink
from snapflow import wire
from snapflow.checkpointing import CheckpointMode
from snapflow.coordinator.checkpoint_stats import percentile
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.api.operators import Map
from snapflow.worker.runtime.debloat import DEFAULT_TARGET_MS

ROOT = Path(__file__).resolve().parent.parent

PARALLELISM = 2
MAX_PARALLELISM = 128
NUM_KEYS = 1000
BATCH = 65_536  # the agent's default source batch (``snapflow worker`` has no flag for it)
TARGET_RUN_S = 5.0
CALIBRATION_RECORDS = 16_000_000
RECORD_API_CALIBRATION_RECORDS = 2_000_000
UNLOADED_RATE = 500_000  # records/s over both source subtasks
UNLOADED_RUN_S = 6.0
UNLOADED_MIN_BATCH_MS = 10.0
UNLOADED_REPEATS = 2  # the run with the lowest p99 is reported (noise only adds latency)
BP_BATCH = 8_192
BP_SLEEP_S = 0.010
BP_RUN_S = 7.0
DETAILS_HISTORY = 2_000
"""The coordinator's stats history (``history_size``): every checkpoint of a run stays in it,
so that the details are fetched once the run ended."""
BP_TIMEOUT_MS = 50
WORKER_EXIT_TIMEOUT_S = 15.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

TARGET_RECORDS_PER_S = 3_000_000
TARGET_RECORD_API_PER_S = 200_000
TARGET_OVERHEAD_1S_PCT = 5.0
TARGET_OVERHEAD_100MS_PCT = 10.0  # issue 24 (was 15 %)
TARGET_CHECKPOINT_P99_MS = 250.0
TARGET_UNALIGNED_FACTOR = 3.0
#: A checkpoint's phases, in order: the per-phase percentiles of the results.
PHASES = ("start_delay", "alignment", "sync", "async", "commit")

SLOW = (0,)  # the sink subtasks that sleep in the main backpressure runs: one of the two
BP_RUNS = (  # key, mode, aligned timeout ms, sink sleep per batch, sleeping sink subtasks,
    # where operators run: "thread" (the default: every subtask on a task thread), "adaptive"
    # (``snapflow worker --no-task-thread``: on the agent's loop, and a subtask whose calls
    # block moves to a task thread; the sleeping sink does), "loop" (``--no-task-thread
    # --no-adaptive-task-thread``: the sleeping sink blocks its agent's loop)
    ("aligned", "aligned", 0, BP_SLEEP_S, SLOW, "thread"),
    ("unaligned", "unaligned", 0, BP_SLEEP_S, SLOW, "thread"),
    ("aligned_timeout", "aligned", BP_TIMEOUT_MS, BP_SLEEP_S, SLOW, "thread"),
    ("aligned_2x", "aligned", 0, 2 * BP_SLEEP_S, SLOW, "thread"),
    ("unaligned_2x", "unaligned", 0, 2 * BP_SLEEP_S, SLOW, "thread"),
    ("aligned_all_slow", "aligned", 0, BP_SLEEP_S, None, "thread"),
    ("unaligned_all_slow", "unaligned", 0, BP_SLEEP_S, None, "thread"),
    ("aligned_adaptive", "aligned", 0, BP_SLEEP_S, SLOW, "adaptive"),
    ("unaligned_adaptive", "unaligned", 0, BP_SLEEP_S, SLOW, "adaptive"),
    ("aligned_timeout_adaptive", "aligned", BP_TIMEOUT_MS, BP_SLEEP_S, SLOW, "adaptive"),
    ("unaligned_loop", "unaligned", 0, BP_SLEEP_S, SLOW, "loop"),
)
PLACEMENT_FLAGS = {
    "thread": [],
    "threads": ["--no-builtins-on-loop"],
    "adaptive": ["--no-task-thread"],
    "loop": ["--no-task-thread", "--no-adaptive-task-thread"],
}


@dataclass
class RunSpec:
    name: str
    total_records: int
    interval_ms: int = 0
    mode: str = "aligned"
    aligned_checkpoint_timeout_ms: int = 0
    rate_per_s: float | None = None
    min_batch_ms: float = 0.0
    batch_size: int = BATCH
    record_api: bool = False
    sink_sleep_s: float = 0.0
    sleeping_subtasks: tuple[int, ...] | None = None  # None: every sink subtask sleeps
    details: bool = False  # fetch every checkpoint's per-subtask details
    placement: str = "thread"  # where operators run (PLACEMENT_FLAGS)
    timeout_s: float = 60.0


@dataclass
class RunResult:
    spec: RunSpec
    error: str = ""
    elapsed_s: float = 0.0
    data_elapsed_s: float = 0.0
    records_per_s: float = 0.0
    records_per_s_data: float = 0.0
    verified: bool | None = None
    sink_rows: int = 0
    completed: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    quantiles: dict[str, float] = field(default_factory=dict)
    details: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    peak_rss_mb: list[float] = field(default_factory=list)
    worker_cpu_s: float = 0.0
    coordinator_cpu_s: float = 0.0
    foreign_cpu_pct: float | None = None
    """CPU the machine spent on other processes during the run, % of all cores."""
    steal_pct: float | None = None
    final_checkpoint_id: int = 0
    final_trigger_error: str = ""
    sources_ended_ms: float = 0.0
    """When the first source split was exhausted (its marker seen); 0: not seen."""
    coordinator_quantiles: dict[str, float] = field(default_factory=dict)
    """GetCheckpointStats' quantiles: every completed checkpoint, the ones after the end too."""
    running_ids: set[int] = field(default_factory=set)
    """The checkpoints of the running job: those ``quantiles`` are over."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def completed_count(self) -> int:
        return int(self.quantiles.get("completed", 0))

    def _per_checkpoint(self, metric: str) -> list[float]:
        """The max over the subtasks of ``metric``, one value per detailed checkpoint."""
        return sorted(
            float(max(s[metric] for s in subtasks.values()))
            for subtasks in self.details.values()
            if subtasks
        )

    def alignment_p99(self) -> float | None:
        values = self._per_checkpoint("alignment")
        return percentile(values, 99) if values else None

    def start_delay_p99(self) -> float | None:
        values = self._per_checkpoint("start_delay")
        return percentile(values, 99) if values else None

    def phase(self, name: str) -> list[float]:
        """One phase's durations (``PHASES``) over the checkpoints of the running job: the
        maximum over the subtasks (needs the details), or the coordinator's commit."""
        if name == "commit":
            return sorted(
                float(c["completion_latency_ms"])
                for c in self.completed
                if c["checkpoint_id"] in self.running_ids
            )
        return sorted(
            float(max(s[name] for s in subtasks.values()))
            for cid, subtasks in self.details.items()
            if subtasks and cid in self.running_ids
        )

    def phase_quantiles(self) -> dict[str, float]:
        """``<phase>_p50_ms``/``<phase>_p99_ms`` of every phase with values."""
        out: dict[str, float] = {}
        for name in PHASES:
            values = self.phase(name)
            if values:
                out[f"{name}_p50_ms"] = round(percentile(values, 50), 3)
                out[f"{name}_p99_ms"] = round(percentile(values, 99), 3)
        return out

    def unaligned_count(self) -> int:
        return sum(1 for c in self.completed if c["unaligned"])

    def in_flight_max(self) -> int:
        return max((c["persisted_in_flight_bytes"] for c in self.completed), default=0)

    def row(self) -> dict[str, Any]:
        s = self.spec
        return {
            "name": s.name,
            "total_records": s.total_records,
            "interval_ms": s.interval_ms,
            "mode": s.mode,
            # the recorded results' key, kept so older result files stay comparable
            "aligned_timeout_ms": s.aligned_checkpoint_timeout_ms,
            "rate_per_s": s.rate_per_s,
            "batch_size": s.batch_size,
            "record_api": s.record_api,
            "sink_sleep_s": s.sink_sleep_s,
            "sleeping_subtasks": s.sleeping_subtasks,
            "error": self.error,
            "elapsed_s": self.elapsed_s,
            "data_elapsed_s": self.data_elapsed_s,
            "records_per_s": self.records_per_s,
            "records_per_s_data": self.records_per_s_data,
            "verified": self.verified,
            "sink_rows": self.sink_rows,
            "end_to_end_ms": self.quantiles,
            "coordinator_end_to_end_ms": self.coordinator_quantiles,
            "checkpoints_failed_reasons": sorted({c["failure_reason"] for c in self.failed}),
            "alignment_p99_ms": self.alignment_p99(),
            "start_delay_p99_ms": self.start_delay_p99(),
            "phases_ms": self.phase_quantiles(),
            "unaligned_checkpoints": self.unaligned_count(),
            "persisted_in_flight_bytes_max": self.in_flight_max(),
            "processed_during_alignment_bytes_max": max(
                (c["processed_during_alignment_bytes"] for c in self.completed), default=0
            ),
            "final_checkpoint_id": self.final_checkpoint_id,
            "final_trigger_error": self.final_trigger_error,
            "peak_rss_mb": self.peak_rss_mb,
            "worker_cpu_s": self.worker_cpu_s,
            "coordinator_cpu_s": self.coordinator_cpu_s,
            "foreign_cpu_pct": self.foreign_cpu_pct,
            "steal_pct": self.steal_pct,
        }


# --- job graph -------------------------------------------------------------------------------


def _graph(spec: RunSpec, marker_dir: str, stats_dir: str) -> pb.JobGraph:
    source = MarkedGeneratorSource(
        total_records=spec.total_records,
        rate_per_s=spec.rate_per_s,
        num_keys=NUM_KEYS,
        batch_size=spec.batch_size,
        seed=11,
        marker_dir=marker_dir,
        min_batch_ms=spec.min_batch_ms,
    )
    source_chain = [op_spec("source", source)]
    if spec.record_api:
        source_chain.append(op_spec("identity", Map(lambda r: r)))
    sink: DiscardingSink = (
        ThrottledSink(stats_dir, spec.sink_sleep_s, spec.sleeping_subtasks)
        if spec.sink_sleep_s
        else DiscardingSink(stats_dir)
    )
    return pb.JobGraph(
        name=f"dataplane-{spec.name}",
        vertices=[
            pb.JobVertex(
                vertex_id="source",
                name="source",
                parallelism=PARALLELISM,
                max_parallelism=MAX_PARALLELISM,
                is_source=True,
                operators=source_chain,
            ),
            pb.JobVertex(
                vertex_id="count",
                name="count",
                parallelism=PARALLELISM,
                max_parallelism=MAX_PARALLELISM,
                operators=[op_spec("count", KeyedCount("key")), op_spec("sink", sink)],
            ),
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id="source",
                target_vertex_id="count",
                partitioner=pb.PARTITIONER_KIND_HASH,
                key_field="key",
            )
        ],
    )


def _config(spec: RunSpec) -> pb.CheckpointConfig:
    return pb.CheckpointConfig(
        interval_ms=spec.interval_ms,
        mode=wire.CHECKPOINT_MODE.to_pb(CheckpointMode(spec.mode)),
        aligned_checkpoint_timeout_ms=spec.aligned_checkpoint_timeout_ms,
        timeout_ms=30_000,
        # A failed checkpoint is counted and reported; it must not end the measurement.
        tolerable_failures_unlimited=True,
    )


# --- processes -------------------------------------------------------------------------------


def _start_worker(
    address: str, job_id: str, slot: int, log_path: Path, placement: str = "thread"
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "GRPC_VERBOSITY": "ERROR",
        # the operators of bench.dataplane_ops are pickled by reference
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "snapflow.cli", "worker", "--coordinator", address,
                "--job", job_id, "--slot", str(slot), "--slots", str(PARALLELISM),
                "--log-level", "warning", *PLACEMENT_FLAGS[placement],
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _reap(process: subprocess.Popen[bytes]) -> tuple[float, float] | None:
    """Reap an exited worker with wait4: (peak RSS MiB, CPU s); None while it runs."""
    if process.returncode is not None:
        return None
    try:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if pid == 0:
        return None
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime  # ru_maxrss: KiB (Linux)


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def _machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0, 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _dump_stacks(process: subprocess.Popen[bytes], path: Path) -> None:
    """A stuck run: save the worker's Python stacks (py-spy, when installed) for a post-mortem."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if process.returncode is not None or not os.path.exists(py_spy):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            [py_spy, "dump", "--pid", str(process.pid)], capture_output=True, timeout=20
        )
        path.write_bytes(done.stdout + done.stderr)


def _tail(path: Path, lines: int = 4) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line[:300] for line in text[-lines:])


def _summary(s: cpb.CheckpointSummary) -> dict[str, Any]:
    return {
        "checkpoint_id": s.checkpoint_id,
        "trigger_timestamp_ms": s.trigger_timestamp_ms,
        "end_to_end_duration_ms": s.end_to_end_duration_ms,
        "processed_during_alignment_bytes": s.processed_during_alignment_bytes,
        "persisted_in_flight_bytes": s.persisted_in_flight_bytes,
        "unaligned": s.unaligned,
        "completion_latency_ms": s.completion_latency_ms,
        "failure_reason": s.failure_reason,
    }


# --- one run ---------------------------------------------------------------------------------


async def run_job(
    stub: cgrpc.CoordinatorServiceAsyncStub,
    address: str,
    spec: RunSpec,
    workdir: Path,
    coordinator_pid: int | None = None,
    other_pids: Sequence[int] = (),
) -> RunResult:
    """Submit one job, run it on two worker processes, watch it to the end; never raises for a
    failed run (the error is in the result)."""
    result = RunResult(spec)
    rundir = workdir / spec.name
    marker_dir, stats_dir = rundir / "markers", rundir / "stats"
    marker_dir.mkdir(parents=True)
    stats_dir.mkdir()
    logs = [rundir / f"worker-{slot}.log" for slot in range(PARALLELISM)]
    states: dict[int, int] = {}  # job state -> coordinator timestamp (ms) when first seen
    reasons: dict[int, str] = {}
    terminal = asyncio.Event()
    background: set[asyncio.Task[Any]] = set()
    workers: list[subprocess.Popen[bytes]] = []
    coordinator_cpu_start = _cpu_seconds(coordinator_pid)
    others_cpu_start = sum(_cpu_seconds(p) for p in other_pids) + _own_cpu()
    machine_start, steal_start = _machine_cpu()
    window_start = time.monotonic()
    try:
        job_id = (
            await stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=_graph(spec, str(marker_dir), str(stats_dir)),
                    checkpoint_config=_config(spec),
                ),
                timeout=30,
            )
        ).job.job_id
    except grpc.aio.AioRpcError as e:
        result.error = f"SubmitJob: {e.code().name}: {e.details()}"
        return result
    watch = stub.WatchJob(cpb.WatchJobRequest(job_id=job_id))

    def spawn(coro: Any) -> None:
        task = asyncio.create_task(coro)
        background.add(task)
        task.add_done_callback(background.discard)

    def on_state(state: int, timestamp_ms: int, reason: str) -> None:
        states.setdefault(state, timestamp_ms)
        reasons.setdefault(state, reason)
        if state in (pb.JOB_STATE_FINISHED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELED):
            terminal.set()

    async def fetch_details(checkpoint_id: int) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            details = await stub.GetCheckpointDetails(
                cpb.GetCheckpointDetailsRequest(job_id=job_id, checkpoint_id=checkpoint_id),
                timeout=10,
            )
            result.details[checkpoint_id] = {
                f"{s.attempt.vertex_id}#{s.attempt.subtask_index}": {
                    "e2e": s.end_to_end_duration_ms,
                    "start_delay": s.metrics.start_delay_ms,
                    "alignment": s.metrics.alignment_duration_ms,
                    "sync": s.metrics.sync_duration_ms,
                    "async": s.metrics.async_duration_ms,
                    "in_flight": s.metrics.persisted_in_flight_bytes,
                    "unaligned": s.metrics.unaligned,
                    "records_in": s.metrics.records_in,
                }
                for s in details.subtasks
            }

    async def collect() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for event in watch:
                if event.HasField("job_state_changed"):
                    changed = event.job_state_changed
                    on_state(changed.state, event.timestamp_ms, changed.reason)
                elif event.HasField("checkpoint_completed"):
                    result.completed.append(_summary(event.checkpoint_completed))
                elif event.HasField("checkpoint_failed"):
                    result.failed.append(_summary(event.checkpoint_failed))
                if terminal.is_set():
                    return
        # The stream ended early (a slow watcher is cut off): poll the job state instead.
        while not terminal.is_set():
            with contextlib.suppress(grpc.aio.AioRpcError):
                info = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                on_state(info.state, int(time.time() * 1000), info.failure)
            await asyncio.sleep(0.05)

    async def final_checkpoint() -> None:
        """Trigger a checkpoint once every source split is exhausted (see the module doc)."""
        markers = [marker_dir / f"source-{i}" for i in range(PARALLELISM)]
        while not all(m.exists() for m in markers):
            if terminal.is_set():
                return
            if not result.sources_ended_ms and any(m.exists() for m in markers):
                result.sources_ended_ms = time.time() * 1000
            await asyncio.sleep(0.005)
        if not result.sources_ended_ms:
            result.sources_ended_ms = time.time() * 1000
        try:
            summary = await stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job_id), timeout=60
            )
            result.final_checkpoint_id = summary.checkpoint_id
        except grpc.aio.AioRpcError as e:
            # e.g. refused because a periodic checkpoint already ended the job; whether the
            # job finishes (or the run times out) decides the outcome, not this trigger
            result.final_trigger_error = f"{e.code().name}: {e.details()}"[:300]

    def reap_all() -> None:
        # wait4 (not Popen.poll) so that the kernel's rusage of each worker is kept
        for w in workers:
            reaped = _reap(w)
            if reaped is not None:
                result.peak_rss_mb.append(round(reaped[0], 1))
                result.worker_cpu_s += reaped[1]

    collector = asyncio.create_task(collect())
    try:
        for slot in range(PARALLELISM):
            workers.append(_start_worker(address, job_id, slot, logs[slot], spec.placement))
        spawn(final_checkpoint())
        deadline = time.monotonic() + spec.timeout_s
        while not terminal.is_set():
            reap_all()
            for slot, w in enumerate(workers):
                if w.returncode is not None and w.returncode != 0:
                    await asyncio.sleep(0.5)  # let the coordinator see the failure first
                    if not terminal.is_set():
                        raise RuntimeError(
                            f"worker {slot} exited with {w.returncode}: {_tail(logs[slot])}"
                        )
            if time.monotonic() > deadline:
                for slot, w in enumerate(workers):
                    _dump_stacks(w, rundir / f"worker-{slot}.stacks")
                raise TimeoutError(f"job not finished within {spec.timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(terminal.wait(), 0.2)
        if pb.JOB_STATE_FINISHED not in states:
            state = next((s for s in states if s not in (pb.JOB_STATE_RUNNING,)), 0)
            raise RuntimeError(
                f"job {pb.JobState.Name(state)}: {reasons.get(state, '')} "
                f"[{_tail(logs[0], 2)}] [{_tail(logs[1], 2)}]"
            )
        if pb.JOB_STATE_RUNNING not in states:
            raise RuntimeError("no RUNNING event seen")
        running_ms, finished_ms = states[pb.JOB_STATE_RUNNING], states[pb.JOB_STATE_FINISHED]
        result.elapsed_s = max(1e-3, (finished_ms - running_ms) / 1000.0)
        result.records_per_s = spec.total_records / result.elapsed_s
        # the workers exit once their subtasks finished: reap them for peak RSS and CPU time
        exit_deadline = time.monotonic() + WORKER_EXIT_TIMEOUT_S
        while any(w.returncode is None for w in workers) and time.monotonic() < exit_deadline:
            reap_all()
            await asyncio.sleep(0.02)
        result.coordinator_cpu_s = _cpu_seconds(coordinator_pid) - coordinator_cpu_start
        if all(w.returncode is not None for w in workers):
            machine, steal = _machine_cpu()
            capacity = (time.monotonic() - window_start) * (os.cpu_count() or 1) / 100.0
            ours = (
                result.worker_cpu_s
                + result.coordinator_cpu_s
                + sum(_cpu_seconds(p) for p in other_pids)
                + _own_cpu()
                - others_cpu_start
            )
            result.foreign_cpu_pct = max(0.0, (machine - machine_start - ours) / capacity)
            result.steal_pct = (steal - steal_start) / capacity
        if spec.details:  # fetched once the job ended: a watcher must not load what it measures
            for completed in result.completed:
                await fetch_details(completed["checkpoint_id"])
            missing = [
                c["checkpoint_id"]
                for c in result.completed
                if c["checkpoint_id"] not in result.details
            ]
            if missing:
                raise RuntimeError(
                    f"no details of checkpoints {missing[:5]} (of {len(missing)}): the "
                    f"coordinator's history ({DETAILS_HISTORY}) is too small for this run"
                )
        stats = await stub.GetCheckpointStats(
            cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=10
        )
        q = stats.end_to_end_duration_ms
        result.coordinator_quantiles = {
            "p50": q.p50,
            "p90": q.p90,
            "p99": q.p99,
            "max": q.max,
            "completed": stats.counts.completed,
            "failed": stats.counts.failed,
        }
        # The checkpoints of the running job: not those triggered once a source ended (the
        # benchmark's final one, and periodic ones in between): an ended source injects
        # aligned barriers whatever the mode (the final checkpoint carries no in-flight data),
        # which wait for the whole backlog behind them. Nor one triggered just before a source
        # ended whose barrier that source injected after its last record: seen in the details,
        # its snapshot counts every record the source emits in the run.
        # every source's total: what it had emitted at the benchmark's own final checkpoint,
        # triggered once both had ended (no totals without its details: nothing left out)
        final = result.details.get(result.final_checkpoint_id, {})
        source_totals = {
            name: sub["records_in"] for name, sub in final.items() if name.startswith("source#")
        }

        def after_a_source_ended(checkpoint_id: int) -> bool:
            subtasks = result.details.get(checkpoint_id, {})
            return any(
                sub["records_in"] >= source_totals[name] > 0
                for name, sub in subtasks.items()
                if name in source_totals
            )

        result.running_ids = {
            c["checkpoint_id"]
            for c in result.completed
            if (not result.sources_ended_ms or c["trigger_timestamp_ms"] < result.sources_ended_ms)
            and not after_a_source_ended(c["checkpoint_id"])
        }
        running = sorted(
            float(c["end_to_end_duration_ms"])
            for c in result.completed
            if c["checkpoint_id"] in result.running_ids
        )
        result.quantiles = (
            {
                **{name: percentile(running, p) for name, p in (("p50", 50), ("p90", 90), ("p99", 99))},
                "max": running[-1],
                "completed": len(running),
                "failed": stats.counts.failed,
            }
            if running
            else dict(result.coordinator_quantiles)  # no events seen (the watch was cut)
        )  # fmt: skip
        sinks = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("sink-*.json"))]
        if len(sinks) == PARALLELISM:
            counted = sum(s["counted"] for s in sinks)
            result.sink_rows = sum(s["rows"] for s in sinks)
            result.verified = counted == spec.total_records
            if not result.verified:
                result.error = (
                    f"the sinks counted {counted:,} records, the sources made "
                    f"{spec.total_records:,}"
                )
            last = max(s["last_batch_at"] for s in sinks)
            result.data_elapsed_s = max(1e-3, last - running_ms / 1000.0)
            result.records_per_s_data = spec.total_records / result.data_elapsed_s
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"[:600]
    finally:
        for w in workers:
            _kill(w)
        for task in list(background):
            task.cancel()
        watch.cancel()
        collector.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await collector
        if not terminal.is_set():
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=10)
    return result


# --- the sequence of runs --------------------------------------------------------------------


class Runner:
    def __init__(
        self,
        console: Console,
        address: str,
        workdir: Path,
        coordinator_pid: int,
        other_pids: Sequence[int] = (),
    ) -> None:
        self.console = console
        self.address = address
        self.workdir = workdir
        self.coordinator_pid = coordinator_pid
        self.other_pids = other_pids
        self.results: list[RunResult] = []

    async def run(self, stub: cgrpc.CoordinatorServiceAsyncStub, spec: RunSpec) -> RunResult:
        spec.name = f"{len(self.results) + 1:02d}-{spec.name}"
        started = time.perf_counter()
        result = await run_job(
            stub, self.address, spec, self.workdir, self.coordinator_pid, self.other_pids
        )
        self.results.append(result)
        if result.error:
            status = f"[red]ERROR {result.error}[/red]"
        else:
            status = (
                f"{result.records_per_s:,.0f} records/s, "
                f"{result.completed_count} checkpoints (e2e p99 {result.quantiles['p99']:.0f} ms)"
            )
        self.console.print(
            f"  {spec.name}: {spec.total_records:,} records, "
            f"{time.perf_counter() - started:.1f} s: {status}",
            highlight=False,
        )
        return result


def _size(rate: float, seconds: float, low: int, high: int) -> int:
    return int(min(high, max(low, rate * seconds)))


def _timeout(records: int, rate: float) -> float:
    return min(90.0, 25.0 + 4.0 * records / max(rate, 1.0))


async def _run_all(runner: Runner, repeats: int) -> dict[str, Any]:
    channel = grpc.aio.insecure_channel(runner.address)
    stub = cgrpc.CoordinatorServiceStub(channel)
    out: dict[str, Any] = {
        "throughput": {"off": [], "1s": [], "100ms": []},
        "unloaded": [],
        "bp": {},
    }
    try:
        # Calibration: sizes the throughput runs (and warms caches and code paths).
        calib = await runner.run(stub, RunSpec("calibrate", CALIBRATION_RECORDS, timeout_s=60))
        rate = calib.records_per_s if calib.ok else float(TARGET_RECORDS_PER_S)
        n = _size(rate, TARGET_RUN_S, 5_000_000, 200_000_000)
        kinds = [("off", 0), ("1s", 1000), ("100ms", 100)]
        for i in range(repeats):  # interleaved and rotated: slow phases of the machine and
            for key, interval in kinds[i % 3 :] + kinds[: i % 3]:  # order effects hit all
                out["throughput"][key].append(
                    await runner.run(
                        stub,
                        RunSpec(
                            f"batch-{key}",
                            n,
                            interval,
                            details=bool(interval),
                            timeout_s=_timeout(n, rate),
                        ),
                    )
                )
        rcal = await runner.run(
            stub,
            RunSpec(
                "record-api-calibrate", RECORD_API_CALIBRATION_RECORDS, record_api=True,
                timeout_s=60,
            ),
        )  # fmt: skip
        rrate = rcal.records_per_s if rcal.ok else float(TARGET_RECORD_API_PER_S)
        rn = _size(rrate, TARGET_RUN_S, 500_000, 40_000_000)
        out["record_api"] = await runner.run(
            stub, RunSpec("record-api-off", rn, record_api=True, timeout_s=_timeout(rn, rrate))
        )
        un = int(UNLOADED_RATE * UNLOADED_RUN_S)
        for _ in range(UNLOADED_REPEATS):
            spec = RunSpec(
                "unloaded-100ms", un, 100, rate_per_s=UNLOADED_RATE,
                min_batch_ms=UNLOADED_MIN_BATCH_MS, details=True,
                timeout_s=_timeout(un, UNLOADED_RATE),
            )  # fmt: skip
            out["unloaded"].append(await runner.run(stub, spec))
        for key, mode, timeout_ms, sleep_s, slow, placement in BP_RUNS:
            # a slow sink subtask takes about half a source batch per sleep, and holds back
            # the sources (they feed both count subtasks): about a source batch per sleep
            drain_rate = BP_BATCH / sleep_s * 0.6
            total = int(BP_RUN_S * drain_rate)
            out["bp"][key] = await runner.run(
                stub,
                RunSpec(
                    f"bp-{key.replace('_', '-')}", total, 100, mode=mode,
                    aligned_checkpoint_timeout_ms=timeout_ms, batch_size=BP_BATCH, sink_sleep_s=sleep_s,
                    sleeping_subtasks=slow, details=True, placement=placement,
                    timeout_s=_timeout(total, drain_rate * 0.5),
                ),
            )  # fmt: skip
    finally:
        await channel.close(grace=None)
    return out


# --- metrics, tables -------------------------------------------------------------------------


def _best(results: list[RunResult]) -> RunResult | None:
    ok = [r for r in results if r.ok]
    return max(ok, key=lambda r: r.records_per_s) if ok else None


def _errors_of(results: Sequence[RunResult | None]) -> str:
    return "; ".join(r.error for r in results if r is not None and r.error) or "no successful run"


def _cpu_per_m_records(results: list[RunResult]) -> float | None:
    """CPU seconds (both agents + coordinator) per million records: the lowest of the runs.
    Less sensitive than wall time to other processes on the machine (not immune: they still
    share caches and cores)."""
    values = [
        (r.worker_cpu_s + r.coordinator_cpu_s) / r.spec.total_records * 1e6
        for r in results
        if r.ok and r.worker_cpu_s > 0
    ]
    return min(values) if values else None


def _cpu_ms_per_checkpoint(
    runs: list[RunResult], off: list[RunResult]
) -> tuple[float, float] | None:
    """CPU milliseconds per checkpoint of the coordinator and of both agents together: what
    ``runs`` cost more than the runs without checkpoints (``off``), per completed checkpoint
    (means over the successful runs). The coordinator's idle cost is taken off by rate (its
    CPU s per second of the off runs x a run's length); the agents' by total, as every
    throughput run moves the same records. None without both kinds of run."""
    runs = [r for r in runs if r.ok and r.completed_count > 1 and r.worker_cpu_s > 0]
    off = [r for r in off if r.ok and r.worker_cpu_s > 0 and r.elapsed_s > 0]
    if not runs or not off:
        return None
    idle_rate = sum(r.coordinator_cpu_s / r.elapsed_s for r in off) / len(off)
    checkpoints = sum(r.completed_count for r in runs) / len(runs)
    coordinator = sum(r.coordinator_cpu_s - idle_rate * r.elapsed_s for r in runs) / len(runs)
    agents_off = sum(r.worker_cpu_s for r in off) / len(off)
    agents = sum(r.worker_cpu_s for r in runs) / len(runs) - agents_off
    return coordinator / checkpoints * 1000.0, agents / checkpoints * 1000.0


def _metrics(out: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    metrics: dict[str, float] = {}
    errors: dict[str, str] = {}

    def put(name: str, value: float | None, error: str = "") -> None:
        if value is None:
            errors[name] = error or "no value"
        else:
            metrics[name] = round(float(value), 3)

    tp: dict[str, list[RunResult]] = out.get("throughput", {})
    best = {key: _best(runs) for key, runs in tp.items()}
    for key in ("off", "1s", "100ms"):
        b = best.get(key)
        put(f"records_per_s_{key}", b.records_per_s if b else None, _errors_of(tp.get(key, [])))
        if b:
            metrics[f"records_per_s_{key}_data"] = round(b.records_per_s_data, 3)
        cpu = _cpu_per_m_records(tp.get(key, []))
        if cpu is not None:
            metrics[f"cpu_s_per_m_records_{key}"] = round(cpu, 4)
    off = best.get("off")
    for key in ("1s", "100ms"):
        b = best.get(key)
        name = f"overhead_{key}_pct"
        if off and b:
            put(name, (1.0 - b.records_per_s / off.records_per_s) * 100.0)
            if off.records_per_s_data and b.records_per_s_data:
                metrics[f"{name}_data"] = round(
                    (1.0 - b.records_per_s_data / off.records_per_s_data) * 100.0, 3
                )
            cpu_off, cpu = (
                metrics.get("cpu_s_per_m_records_off"),
                metrics.get(f"cpu_s_per_m_records_{key}"),
            )
            if cpu_off and cpu:
                metrics[f"{name}_cpu"] = round((cpu / cpu_off - 1.0) * 100.0, 3)
        else:
            put(name, None, "needs a successful off run and one with checkpoints")
    # At 1 s the few checkpoints of a run drown in the runs' spread: 100 ms only.
    per_checkpoint = _cpu_ms_per_checkpoint(tp.get("100ms", []), tp.get("off", []))
    if per_checkpoint is not None:
        metrics["coordinator_cpu_ms_per_checkpoint_100ms"] = round(per_checkpoint[0], 2)
        metrics["agents_cpu_ms_per_checkpoint_100ms"] = round(per_checkpoint[1], 2)
    rec: RunResult | None = out.get("record_api")
    put(
        "records_per_s_off_record_api",
        rec.records_per_s if rec is not None and rec.ok else None,
        _errors_of([rec]) if rec is not None else "not run",
    )
    unloaded: list[RunResult] = out.get("unloaded", [])
    good_unloaded = [r for r in unloaded if r.ok and r.completed_count]
    un: RunResult | None = (
        min(good_unloaded, key=lambda r: r.quantiles["p99"])
        if good_unloaded
        else (unloaded[0] if unloaded else None)
    )
    if un is not None and un.ok and un.completed_count:
        put("checkpoint_p50_ms", un.quantiles["p50"])
        put("checkpoint_p99_ms", un.quantiles["p99"])
        metrics["checkpoint_count_unloaded"] = un.completed_count
        metrics.update({f"{k}_unloaded": v for k, v in un.phase_quantiles().items()})
        if un.start_delay_p99() is not None:
            metrics["checkpoint_start_delay_p99_ms_unloaded"] = un.start_delay_p99()  # type: ignore[assignment]
    else:
        msg = (_errors_of([un]) if un is not None and un.error else "") or "no completed checkpoint"
        put("checkpoint_p50_ms", None, msg if un is not None else "not run")
        put("checkpoint_p99_ms", None, msg if un is not None else "not run")
    b100 = best.get("100ms")
    if b100 is not None and b100.completed_count:
        metrics["checkpoint_p50_ms_full_load_100ms"] = b100.quantiles["p50"]
        metrics["checkpoint_p99_ms_full_load_100ms"] = b100.quantiles["p99"]
        metrics.update({f"{k}_full_load_100ms": v for k, v in b100.phase_quantiles().items()})
    b1s = best.get("1s")
    if b1s is not None and b1s.completed_count:
        metrics.update({f"{k}_1s": v for k, v in b1s.phase_quantiles().items()})
    bp: dict[str, RunResult] = out.get("bp", {})
    for key, *_ in BP_RUNS:
        r = bp.get(key)
        good = r is not None and r.ok and r.completed_count > 0
        err = "not run" if r is None else (r.error or "no completed checkpoint")
        put(f"backpressure_p50_ms_{key}", r.quantiles["p50"] if good else None, err)  # type: ignore[union-attr]
        put(f"backpressure_p99_ms_{key}", r.quantiles["p99"] if good else None, err)  # type: ignore[union-attr]
        if good:
            assert r is not None
            for metric, value in (
                ("alignment_p99_ms", r.alignment_p99()),
                ("start_delay_p99_ms", r.start_delay_p99()),
            ):
                if value is not None:
                    metrics[f"backpressure_{metric}_{key}"] = round(value, 3)
            for name in ("sync", "async", "commit"):
                values = r.phase(name)
                if values:
                    metrics[f"backpressure_{name}_p99_ms_{key}"] = round(percentile(values, 99), 3)
            metrics[f"backpressure_unaligned_checkpoints_{key}"] = r.unaligned_count()
            metrics[f"backpressure_records_per_s_{key}"] = round(r.records_per_s, 3)
    results: list[RunResult] = out.get("all", [])
    rss = [m for r in results for m in r.peak_rss_mb]
    put("agent_peak_rss_mb", max(rss) if rss else None, "no worker process was reaped")
    off_rss = [m for r in tp.get("off", []) for m in r.peak_rss_mb]
    if off_rss:
        metrics["agent_peak_rss_mb_batch_off"] = max(off_rss)
    return metrics, errors


def _label(s: RunSpec) -> str:
    """A short description of a run: kind, interval, mode, throttles."""
    number, _, kind = s.name.partition("-")
    parts = [number]
    for word, shown in (("record-api", "rec-API"), ("calibrate", "calib"), ("unloaded", "unloaded"),
                        ("bp", "bp")):  # fmt: skip
        if word in kind:
            parts.append(shown)
    parts.append(f"{s.interval_ms}ms" if s.interval_ms else "off")
    if s.interval_ms:
        parts.append({"aligned": "al", "unaligned": "unal"}[s.mode])
        if s.aligned_checkpoint_timeout_ms:
            parts[-1] += f"+{s.aligned_checkpoint_timeout_ms}ms"
    if s.rate_per_s:
        parts.append(f"@{s.rate_per_s / 1e3:.0f}k/s")
    if s.sink_sleep_s:
        who = "all" if s.sleeping_subtasks is None else ",".join(map(str, s.sleeping_subtasks))
        parts.append(f"sink[{who}] {s.sink_sleep_s * 1000:.0f}ms/b")
    if s.placement != "thread":
        parts.append({"adaptive": "loop, adaptive", "loop": "on the loop"}[s.placement])
    return " ".join(parts)


def _runs_table(results: list[RunResult]) -> Table:
    table = Table(title="Runs: source -> hash(key) -> [KeyedCount -> sink], 2 agent processes")
    columns = (
        ("run", "left"), ("records", "right"), ("s", "right"), ("rec/s", "right"),
        ("ckpts", "right"), ("p50", "right"), ("p99", "right"), ("align", "right"),
        ("start", "right"), ("unal", "right"), ("inflt", "right"), ("CPU", "right"),
        ("RSS", "right"), ("other", "right"), ("ok", "left"),
    )  # fmt: skip
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]

    def num(v: float | None, fmt: str = ".0f") -> str:
        return "-" if v is None else format(v, fmt)

    for r in results:
        s = r.spec
        rss = num(max(r.peak_rss_mb, default=None))
        records = f"{s.total_records / 1e6:.1f}M"
        if r.error:
            table.add_row(_label(s), records, "-", "[red]ERROR[/red]", *["-"] * 8, rss, "-",
                          "[red]ERR[/red]")  # fmt: skip
            continue
        table.add_row(
            _label(s),
            records,
            f"{r.elapsed_s:.2f}",
            f"{r.records_per_s / 1e6:.2f}M",
            f"{r.completed_count}/{int(r.quantiles.get('failed', 0))}",
            num(r.quantiles.get("p50")),
            num(r.quantiles.get("p99")),
            num(r.alignment_p99()),
            num(r.start_delay_p99()),
            str(r.unaligned_count()),
            num(r.in_flight_max() / 1e6, ".1f"),
            f"{r.worker_cpu_s:.1f}/{r.coordinator_cpu_s:.1f}",
            rss,
            "-" if r.foreign_cpu_pct is None else f"{r.foreign_cpu_pct + (r.steal_pct or 0):.0f}%",
            "ok" if r.verified else ("[red]WRONG[/red]" if r.verified is False else "?"),
        )
    return table


def _targets_table(metrics: dict[str, float], errors: dict[str, str]) -> Table:
    table = Table(title="Targets")
    for name, justify in (("metric", "left"), ("value", "right"), ("target", "left"),
                          ("", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def status(ok: bool | None) -> str:
        return "" if ok is None else ("[green]met[/green]" if ok else "[red]MISSED[/red]")

    def shown(name: str, fmt: str) -> str:
        v = metrics.get(name)
        return format(v, fmt) if v is not None else f"[red]{errors.get(name, '-')[:50]}[/red]"

    def row(name: str, fmt: str, target: str, ok: bool | None) -> None:
        table.add_row(name, shown(name, fmt), target, status(ok if name in metrics else False))

    m = metrics.get
    row("records_per_s_off", ",.0f", f">= {TARGET_RECORDS_PER_S:,} (batch API)",
        (m("records_per_s_off") or 0) >= TARGET_RECORDS_PER_S)  # fmt: skip
    row("records_per_s_off_record_api", ",.0f", f">= {TARGET_RECORD_API_PER_S:,}",
        (m("records_per_s_off_record_api") or 0) >= TARGET_RECORD_API_PER_S)  # fmt: skip
    row("records_per_s_1s", ",.0f", "", None)
    row("records_per_s_100ms", ",.0f", "", None)
    for key, limit_pct in (("1s", TARGET_OVERHEAD_1S_PCT), ("100ms", TARGET_OVERHEAD_100MS_PCT)):
        name = f"overhead_{key}_pct"
        v = m(name)
        row(name, ".1f", f"< {limit_pct:g} % (sink side {m(f'{name}_data') or 0:.1f} %, "
            f"CPU/record {m(f'{name}_cpu') or 0:+.1f} %)", v is not None and v < limit_pct)  # fmt: skip
    row("checkpoint_p50_ms", ".0f", "unloaded", None)
    p99 = m("checkpoint_p99_ms")
    row("checkpoint_p99_ms", ".0f", f"< {TARGET_CHECKPOINT_P99_MS:g} ms, unloaded",
        p99 is not None and p99 < TARGET_CHECKPOINT_P99_MS)  # fmt: skip
    full = m("checkpoint_p99_ms_full_load_100ms")
    row("checkpoint_p99_ms_full_load_100ms", ".0f", f"<= {TARGET_CHECKPOINT_P99_MS:g} ms",
        full is not None and full <= TARGET_CHECKPOINT_P99_MS)  # fmt: skip
    limit = None if p99 is None else TARGET_UNALIGNED_FACTOR * p99
    un50 = m("backpressure_p50_ms_unaligned")
    al2 = m("backpressure_p99_ms_aligned_2x")
    for key, *_ in BP_RUNS:
        name = f"backpressure_p99_ms_{key}"
        v = m(name)
        p50 = m(f"backpressure_p50_ms_{key}")
        value = (
            f"p50 {p50:.0f} / p99 {v:.0f}"
            if v is not None and p50 is not None
            else shown(name, ".0f")
        )
        ok: bool | None = None
        target = ""
        if key in ("unaligned", "unaligned_adaptive"):
            target = f"p99 < {TARGET_UNALIGNED_FACTOR:g} x unloaded p99 = {limit or 0:.0f} ms"
            ok = None if v is None or limit is None else v < limit
        elif key in ("aligned_timeout", "aligned_timeout_adaptive"):
            unal = m(f"backpressure_p99_ms_{key.replace('aligned_timeout', 'unaligned')}")
            target = f"p99 <= timeout {BP_TIMEOUT_MS} ms + unaligned p99 = {BP_TIMEOUT_MS + (unal or 0):.0f}"
            ok = None if v is None or unal is None else v <= BP_TIMEOUT_MS + unal
        elif key == "aligned":
            target = "grows with the backlog: p50 > unaligned p50"
            ok = None if p50 is None or un50 is None else p50 > un50
        elif key == "aligned_2x":
            # debloating bounds the data ahead of a barrier by time, not by count: twice as slow
            # a sink holds half the rows, and aligned checkpoints take about as long
            un2 = m("backpressure_p50_ms_unaligned_2x")
            bound = DEFAULT_TARGET_MS + (un2 or 0)
            target = f"bounded by time: p50 <= debloat target {DEFAULT_TARGET_MS} + unaligned 2x p50 = {bound:.0f}"
            ok = None if p50 is None or un2 is None else p50 <= bound
        elif key == "unaligned_2x":
            target = f"(vs aligned 2x p99: {al2 or 0:.0f})"
        elif key.endswith("all_slow"):
            target = "(both sinks sleep)"
        table.add_row(
            f"backpressure ms, {key}", value, target, status(ok if v is not None else False)
        )
    row("agent_peak_rss_mb", ".0f", "ru_maxrss of the agent processes (wait4)", None)
    return table


def main() -> int:
    console = Console(width=150)
    repeats = max(1, int(os.environ.get("SNAPFLOW_BENCH_REPEATS", "3")))
    keep = bool(os.environ.get("SNAPFLOW_BENCH_KEEP"))
    console.print(
        "[bold]Data plane[/bold]: source -> hash(key) -> [KeyedCount -> sink], parallelism 2, "
        "coordinator + 2 agents as processes"
    )
    out: dict[str, Any] = {}
    with (
        contextlib.nullcontext(tempfile.mkdtemp(prefix="snapflow-dataplane-"))
        if keep
        else tempfile.TemporaryDirectory(prefix="snapflow-dataplane-") as tmp,
        RedisServer() as redis_server,
    ):
        if keep:
            console.print(f"keeping the run directories in {tmp}")
        port = free_port()
        process = start_coordinator(
            redis_server.url,
            f"{tmp}/checkpoints",
            port,
            settings={"SNAPFLOW_HISTORY_SIZE": str(DETAILS_HISTORY)},
        )
        redis_process = getattr(redis_server, "_process", None)
        runner = Runner(
            console,
            f"127.0.0.1:{port}",
            Path(tmp),
            process.pid,
            [redis_process.pid] if redis_process is not None else [],
        )
        try:
            out = asyncio.run(_run_all(runner, repeats))
        except Exception as e:  # keep what was measured
            console.print(f"[red]benchmark aborted: {type(e).__name__}: {e}[/red]")
        finally:
            stop_process(process)
        out["all"] = runner.results

    metrics, errors = _metrics(out)
    console.print(_runs_table(runner.results))
    console.print(
        "s: RUNNING -> FINISHED; p50, p99: end-to-end ms of the checkpoints taken while every source ran; "
        "align, "
        "start: p99 over checkpoints of the max over subtasks of alignment and start delay ms; "
        "unal: checkpoints completed unaligned; inflt: max persisted in-flight MB; CPU: agents / "
        "coordinator CPU s; RSS: peak MB per agent; other: CPU used by other processes (and "
        "stolen by the host) during the run, % of all cores: noise; ok: the sinks' counts add "
        "up; n ms/b: sink sleep per batch. Errors: in the lines above and in the JSON.",
        highlight=False,
    )
    console.print(_targets_table(metrics, errors))
    path = write_results(
        "dataplane",
        metrics,
        errors=errors,
        targets={
            "records_per_s_off": f">= {TARGET_RECORDS_PER_S} (batch API, KeyedCount, checkpoints off)",
            "records_per_s_off_record_api": f">= {TARGET_RECORD_API_PER_S} (Map(lambda r: r) after the source)",
            "overhead_1s_pct": f"< {TARGET_OVERHEAD_1S_PCT}",
            "overhead_100ms_pct": f"< {TARGET_OVERHEAD_100MS_PCT}",
            "checkpoint_p99_ms": f"< {TARGET_CHECKPOINT_P99_MS} (unloaded)",
            "checkpoint_p99_ms_full_load_100ms": f"<= {TARGET_CHECKPOINT_P99_MS}",
            "backpressure_p99_ms_unaligned": f"< {TARGET_UNALIGNED_FACTOR} x checkpoint_p99_ms",
            "backpressure_p99_ms_unaligned_adaptive": f"< {TARGET_UNALIGNED_FACTOR} x checkpoint_p99_ms",
            "backpressure_p99_ms_aligned_timeout": f"<= {BP_TIMEOUT_MS} + backpressure_p99_ms_unaligned",
            "backpressure_p99_ms_aligned_timeout_adaptive": f"<= {BP_TIMEOUT_MS} + backpressure_p99_ms_unaligned_adaptive",
            "backpressure_p99_ms_aligned": "waits for the data ahead (p50 > unaligned p50)",
            "backpressure_p99_ms_aligned_2x": f"bounded by time: p50 <= {DEFAULT_TARGET_MS} "
            "(the debloat target) + unaligned 2x p50",
        },
        method={
            "records_per_s": "source records / (RUNNING -> FINISHED, coordinator event times); "
            "every run ends with one checkpoint the benchmark triggers once both sources "
            f"ended; best of {repeats} interleaved runs",
            "records_per_s_*_data": "source records / (RUNNING -> the last batch at a sink)",
            "sink": "DiscardingSink: counts, keeps the newest count per key, discards",
            "record_api": "Map(lambda r: r) chained after the source, checkpoints off",
            "checkpoint_ms": "end_to_end_duration_ms quantiles of the checkpoints triggered "
            "before a source ended (job events); "
            f"unloaded: sources at {UNLOADED_RATE} records/s in {UNLOADED_MIN_BATCH_MS:g} ms "
            f"batches, interval 100 ms, aligned; lowest p99 of {UNLOADED_REPEATS} runs",
            "backpressure": f"ThrottledSink: sink subtask 0 (both for *_all_slow) sleeps "
            f"{BP_SLEEP_S * 1000:g} ms per batch (2x: {2 * BP_SLEEP_S * 1000:g} ms); every "
            "subtask on a task thread (the default; *_adaptive: on the agent's loop, and the "
            "sink's subtask moves to a task thread once its calls are seen to block, "
            "--no-task-thread; *_loop: on the agent's event loop, which it blocks, "
            f"--no-task-thread --no-adaptive-task-thread); source batches of {BP_BATCH}; interval 100 ms; aligned "
            f"timeout {BP_TIMEOUT_MS} ms",
            "agent_peak_rss_mb": "max over agents and runs of ru_maxrss (os.wait4 on the "
            "worker process)",
        },
        rows=[r.row() for r in runner.results],
        checkpoints={
            r.spec.name: [
                {
                    **{k: c[k] for k in ("checkpoint_id", "end_to_end_duration_ms", "unaligned")},
                    "subtasks": r.details.get(c["checkpoint_id"], {}),
                }
                for c in r.completed
            ]
            for r in runner.results
            if r.spec.details
        },
    )
    console.print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

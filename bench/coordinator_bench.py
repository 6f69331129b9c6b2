"""Coordinator benchmark: N simulated subtasks acknowledging over real gRPC, real Redis.

The coordinator runs as its own process (``snapflow coordinator``) on a redis-server started
here; this process hosts the simulated worker agents (the test kit's ``kit.simulated_agent.SimulatedAgent``) and
triggers checkpoints one after another. For each N it reports:

* acks/s: N x checkpoints / the time from the first trigger to the last completion (the
  agents coalesce their acks per call, ``snapflow.worker.runtime.ack_batcher.AckBatcher``; the unary
  rows send one RPC per subtask ack for comparison);
* completion latency (the target): from the arrival of a checkpoint's last ack at the
  coordinator to its durable commit (``_metadata`` written with fsync, then the fenced Redis
  commit), as the coordinator measures it (``CheckpointSummary.completion_latency_ms``);
* observed latency: from the moment the last ack was *sent* here to the moment the
  ``checkpoint_completed`` event arrived back on a WatchJob stream. It adds the ack batching
  linger, both event loops and the network hops, on the same 2 cores.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time

import grpc
from kit.simulated_agent import SimulatedAgent
from rich.console import Console
from rich.table import Table

from bench.common import free_port, start_coordinator, stop_process, write_results
from snapflow.coordinator.checkpoint_stats import percentile
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

TASK_COUNTS = (64, 256, 1024)
AGENTS = 4
TARGET_ACKS_PER_S = 5000
TARGET_COMPLETION_P99_MS = 20.0


def _rounds(tasks: int) -> int:
    return max(30, min(200, 16_000 // tasks))


async def _run_one(address: str, tasks: int, batch: bool) -> dict[str, float]:
    channel = grpc.aio.insecure_channel(address)
    stub = cgrpc.CoordinatorServiceStub(channel)
    sources = AGENTS
    graph = pb.JobGraph(
        name=f"bench-{tasks}",
        vertices=[
            pb.JobVertex(
                vertex_id="src",
                parallelism=sources,
                is_source=True,
                operators=[pb.OperatorSpec(operator_id="src-op", kind="source")],
            ),
            pb.JobVertex(
                vertex_id="op",
                parallelism=tasks - sources,
                max_parallelism=max(128, tasks),
                operators=[pb.OperatorSpec(operator_id="op-op", kind="process")],
            ),
        ],
        edges=[
            pb.JobEdge(
                source_vertex_id="src", target_vertex_id="op", partitioner=pb.PARTITIONER_KIND_HASH
            )
        ],
    )
    job = (
        await stub.SubmitJob(
            cpb.SubmitJobRequest(graph=graph, checkpoint_config=pb.CheckpointConfig(retained=1)),
            timeout=30,
        )
    ).job
    all_tasks = [("src", i) for i in range(sources)] + [("op", i) for i in range(tasks - sources)]
    agents = [
        SimulatedAgent(
            address,
            job.job_id,
            [t for j, t in enumerate(all_tasks) if j % AGENTS == a],
            write_state=False,
            batch_acks=batch,
        )
        for a in range(AGENTS)
    ]
    completed_at: dict[int, float] = {}
    server_latency: dict[int, float] = {}
    try:
        for agent in agents:
            await agent.start()
        for agent in agents:
            await agent.register_all()
        watch = stub.WatchJob(cpb.WatchJobRequest(job_id=job.job_id))

        async def collect() -> None:
            async for event in watch:
                if event.HasField("checkpoint_completed"):
                    done = event.checkpoint_completed
                    completed_at[done.checkpoint_id] = time.perf_counter()
                    server_latency[done.checkpoint_id] = done.completion_latency_ms

        collector = asyncio.create_task(collect())
        # warm-up: connections, code paths
        for _ in range(3):
            await stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job.job_id), timeout=60
            )
        rounds = _rounds(tasks)
        ids: list[int] = []
        started = time.perf_counter()
        for _ in range(rounds):
            summary = await stub.TriggerCheckpoint(
                cpb.TriggerCheckpointRequest(job_id=job.job_id), timeout=60
            )
            ids.append(summary.checkpoint_id)
        elapsed = time.perf_counter() - started
        deadline = time.monotonic() + 10
        while any(i not in completed_at for i in ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        observed = sorted(
            (completed_at[i] - max(a.last_ack_sent[i] for a in agents)) * 1000.0
            for i in ids
            if i in completed_at
        )
        latencies = sorted(server_latency[i] for i in ids if i in server_latency)
        watch.cancel()
        collector.cancel()
        await stub.CancelJob(cpb.CancelJobRequest(job_id=job.job_id), timeout=30)
        return {
            "batched": batch,
            "tasks": tasks,
            "rounds": rounds,
            "acks_per_s": tasks * rounds / elapsed,
            "checkpoints_per_s": rounds / elapsed,
            "completion_p50_ms": percentile(latencies, 50),
            "completion_p99_ms": percentile(latencies, 99),
            "completion_mean_ms": statistics.fmean(latencies) if latencies else 0.0,
            "observed_p50_ms": percentile(observed, 50),
            "observed_p99_ms": percentile(observed, 99),
        }
    finally:
        for agent in agents:
            await agent.stop()
        await channel.close()


async def _run_all(address: str) -> list[dict[str, float]]:
    return [await _run_one(address, n, batch) for batch in (True, False) for n in TASK_COUNTS]


def main() -> int:
    console = Console(width=150)
    with (
        tempfile.TemporaryDirectory(prefix="snapflow-bench-") as tmp,
        RedisServer() as redis_server,
    ):
        port = free_port()
        process = start_coordinator(redis_server.url, f"{tmp}/checkpoints", port)
        try:
            rows = asyncio.run(_run_all(f"127.0.0.1:{port}"))
        finally:
            stop_process(process)
    table = Table(title="Coordinator: simulated subtasks acknowledging over gRPC (real Redis)")
    for column in (
        "acks",
        "tasks",
        "ckpts",
        "acks/s",
        "ckpts/s",
        "commit p50 ms",
        "commit p99 ms",
        "observed p50",
        "observed p99",
    ):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            "per agent" if r["batched"] else "unary",
            str(int(r["tasks"])),
            str(int(r["rounds"])),
            f"{r['acks_per_s']:,.0f}",
            f"{r['checkpoints_per_s']:.1f}",
            f"{r['completion_p50_ms']:.2f}",
            f"{r['completion_p99_ms']:.2f}",
            f"{r['observed_p50_ms']:.2f}",
            f"{r['observed_p99_ms']:.2f}",
        )
    console.print(table)
    by_tasks = {int(r["tasks"]): r for r in rows if r["batched"]}
    unary = {int(r["tasks"]): r for r in rows if not r["batched"]}
    metrics = {
        "acks_per_s": max(r["acks_per_s"] for r in by_tasks.values()),
        "completion_p50_ms": by_tasks[64]["completion_p50_ms"],
        "completion_p99_ms": by_tasks[64]["completion_p99_ms"],
        "acks_per_s_unary": max(r["acks_per_s"] for r in unary.values()),
        "completion_p99_ms_unary": unary[64]["completion_p99_ms"],
        "observed_completion_p50_ms": by_tasks[64]["observed_p50_ms"],
        "observed_completion_p99_ms": by_tasks[64]["observed_p99_ms"],
    }
    for n, r in by_tasks.items():
        metrics[f"acks_per_s_{n}_tasks"] = r["acks_per_s"]
        metrics[f"completion_p99_ms_{n}_tasks"] = r["completion_p99_ms"]
    for n, r in unary.items():
        metrics[f"acks_per_s_{n}_tasks_unary"] = r["acks_per_s"]
    path = write_results(
        "coordinator",
        metrics,
        targets={
            "acks_per_s": f">= {TARGET_ACKS_PER_S}",
            "completion_p99_ms": f"< {TARGET_COMPLETION_P99_MS} (64 tasks)",
        },
        rows=rows,
    )
    ok_acks = metrics["acks_per_s"] >= TARGET_ACKS_PER_S
    ok_p99 = metrics["completion_p99_ms"] < TARGET_COMPLETION_P99_MS
    console.print(
        f"acks/s {metrics['acks_per_s']:,.0f} (target >= {TARGET_ACKS_PER_S}: {'met' if ok_acks else 'MISSED'}); "
        f"completion p99 at 64 tasks {metrics['completion_p99_ms']:.2f} ms (target < {TARGET_COMPLETION_P99_MS}: "
        f"{'met' if ok_p99 else 'MISSED'}); written to {path}"
    )
    return 0

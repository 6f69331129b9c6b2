"""``snapflow demo`` (what ``make run`` runs): the coordinator on the embedded default.

It starts a real ``redis-server`` from the Python environment, a coordinator on it, and worker
agents that host a job's subtasks, then lets periodic checkpoints run, fails one task mid-run,
redeploys the job from the latest completed checkpoint and prints what happened.

The agents are the simulated ones from ``snapflow.testing`` (real gRPC, real state files, no
operators): the worker runtime and the Spark bridge replace them as they land.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import grpc
from rich.console import Console
from rich.table import Table

from coordinator.config import load_settings
from coordinator.server import Coordinator
from snapflow.logging import configure_logging
from snapflow.redis_server import RedisServer
from snapflow.testing import SimulatedAgent
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=12.0, help="how long the job runs (default 12)"
    )
    parser.add_argument("--tasks", type=int, default=8, help="subtasks in the job (default 8)")
    parser.add_argument(
        "--interval-ms", type=int, default=1000, help="checkpoint interval (default 1000)"
    )
    parser.add_argument(
        "--fail-at-s", type=float, default=5.0, help="when a task fails (default 5; <0: never)"
    )
    parser.add_argument(
        "--storage-root", default="./data/demo", help="checkpoint storage (default ./data/demo)"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="coordinator gRPC port (default: a free one)"
    )


def run_demo(args: argparse.Namespace) -> int:
    configure_logging("warning" if not getattr(args, "verbose", False) else "info", "auto")
    return asyncio.run(_demo(args))


async def _demo(args: argparse.Namespace) -> int:
    console = Console()
    if args.tasks < 2:
        console.print("[red]--tasks must be at least 2[/red]")
        return 2
    storage_root = os.path.abspath(args.storage_root)
    redis_server = await asyncio.to_thread(
        RedisServer(data_dir=os.path.join(storage_root, "redis")).start
    )
    settings = load_settings(
        overrides={
            "host": "127.0.0.1",
            "port": args.port,
            "metrics_port": -1,
            "redis_url": redis_server.url,
            "storage_root": os.path.join(storage_root, "checkpoints"),
        },
        environ={},
    )
    coordinator = Coordinator(settings)
    agents: list[SimulatedAgent] = []
    try:
        await coordinator.start()
        address = f"127.0.0.1:{coordinator.port}"
        console.print(
            f"[bold]Snapflow demo[/bold]: redis-server pid {redis_server.pid} at {redis_server.url}, "
            f"coordinator at {address}, storage {settings.storage_root}"
        )
        sources = max(1, args.tasks // 4)
        maps = args.tasks - sources
        graph = pb.JobGraph(
            name="demo-bids-per-key",
            vertices=[
                pb.JobVertex(
                    vertex_id="bids", name="bid source", parallelism=sources, is_source=True
                ),
                pb.JobVertex(
                    vertex_id="count", name="count per key", parallelism=maps, max_parallelism=128
                ),
            ],
            edges=[
                pb.JobEdge(
                    source_vertex_id="bids",
                    target_vertex_id="count",
                    partitioner=pb.PARTITIONER_KIND_HASH,
                )
            ],
        )
        channel = grpc.aio.insecure_channel(address)
        stub = cgrpc.CoordinatorServiceStub(channel)
        job = (
            await stub.SubmitJob(
                cpb.SubmitJobRequest(
                    graph=graph, checkpoint_config=pb.CheckpointConfig(interval_ms=args.interval_ms)
                ),
                timeout=10,
            )
        ).job
        console.print(
            f"job {job.job_id}: {sources} source + {maps} count subtasks, checkpoint every {args.interval_ms} ms"
        )
        all_tasks = [("bids", i) for i in range(sources)] + [("count", i) for i in range(maps)]
        n_agents = min(2, sources) if sources > 1 else 1
        for i in range(n_agents):
            hosted = [t for j, t in enumerate(all_tasks) if j % n_agents == i]
            agent = SimulatedAgent(address, job.job_id, hosted, state_bytes=4096)
            await agent.start()
            agents.append(agent)
        for agent in agents:
            await agent.register_all()
        started = time.monotonic()
        failed_at: float | None = None
        completed_before = 0
        recovered_at: float | None = None
        restored_from = 0
        while time.monotonic() - started < args.seconds:
            await asyncio.sleep(0.05)
            elapsed = time.monotonic() - started
            if failed_at is None and 0 <= args.fail_at_s <= elapsed:
                victim = agents[-1]
                key = victim.tasks[-1]
                console.print(f"[yellow]t={elapsed:4.1f}s: task {key[0]}#{key[1]} fails[/yellow]")
                await victim.set_state(pb.TASK_STATE_FAILED, "injected failure", only=key)
                failed_at = time.monotonic()
                completed_before = len(agents[0].completed)
                for agent in agents:  # the driver redeploys the whole graph
                    await agent.register_all()
                restored_from = agents[0].restores[agents[0].tasks[0]].checkpoint_id
                console.print(
                    f"[green]t={time.monotonic() - started:4.1f}s: redeployed, restored from checkpoint {restored_from}[/green]"
                )
            if (
                failed_at is not None
                and recovered_at is None
                and len(agents[0].completed) > completed_before
            ):
                recovered_at = time.monotonic()
        stats = await stub.GetCheckpointStats(
            cpb.GetCheckpointStatsRequest(job_id=job.job_id, history_size=10), timeout=10
        )
        await stub.CancelJob(cpb.CancelJobRequest(job_id=job.job_id), timeout=10)
        await channel.close(grace=None)
        _print_summary(console, stats, failed_at, recovered_at, restored_from)
        return 0
    finally:
        for agent in agents:
            await agent.stop()
        await coordinator.stop()
        await asyncio.to_thread(redis_server.stop)


def _print_summary(
    console: Console,
    stats: cpb.CheckpointStats,
    failed_at: float | None,
    recovered_at: float | None,
    restored_from: int,
) -> None:
    table = Table(title="Recent checkpoints", show_lines=False)
    for column in ("id", "status", "duration ms", "size", "acked", "reason"):
        table.add_column(column)
    status = {
        pb.CHECKPOINT_STATUS_COMPLETED: "completed",
        pb.CHECKPOINT_STATUS_FAILED: "failed",
        pb.CHECKPOINT_STATUS_IN_PROGRESS: "in progress",
    }
    for h in stats.history:
        table.add_row(
            str(h.checkpoint_id),
            status.get(h.status, "?"),
            str(h.end_to_end_duration_ms),
            f"{h.state_size_bytes / 1024:.1f} KiB",
            f"{h.num_acknowledged}/{h.num_tasks}",
            h.failure_reason,
        )
    console.print(table)
    c, d = stats.counts, stats.end_to_end_duration_ms
    console.print(
        f"checkpoints: {c.completed} completed, {c.failed} failed, {c.restored} restore(s); "
        f"duration p50 {d.p50:.0f} ms, p99 {d.p99:.0f} ms"
    )
    if failed_at is not None:
        recovery = f"{recovered_at - failed_at:.2f} s" if recovered_at else "not within the run"
        console.print(
            f"task failure -> restored from checkpoint {restored_from}; first checkpoint after it in {recovery}"
        )

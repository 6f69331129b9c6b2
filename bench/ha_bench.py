"""Leader takeover time of highly available coordinators (``make bench BENCH=ha``).

Per round: a real ``redis-server``, two ``snapflow coordinator`` processes with
``high_availability = "redis"`` on it, a keyed-count job run by two ``snapflow worker``
processes given both addresses, checkpoints every 200 ms. Once a checkpoint completed, the
leader is SIGKILLed; measured from the kill:

- ``serving``: until the standby answers health SERVING (lease lapse + its next attempt +
  recovery of the jobs);
- ``checkpoint``: until a checkpoint with an id above every id the killed leader handed out
  completes (the agents noticed the new leader, registered again, restored, and the first
  checkpoint of the new deployment went through).

Two profiles: the default settings (lease 5 s / renew 1 s, heartbeats 2 s / 10 s) and the
short ones of the tests (lease 2 s / 0.5 s, heartbeats 0.2 s / 1.5 s). Results:
bench/results/ha.json; discussed in docs/coordinator.md, "High availability".
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import free_port, op_spec, write_results
from snapflow.leader_channel import sync_leader_channel
from snapflow.redis_server import RedisServer
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink
from snapflow.worker.connectors.split_sources import GeneratorSource

ROUNDS = int(os.environ.get("SNAPFLOW_BENCH_HA_ROUNDS", "3"))
PROFILES: dict[str, dict[str, str]] = {
    "default": {},
    "short": {
        "lease_ttl_s": "2",
        "lease_renew_interval_s": "0.5",
        "heartbeat_interval_s": "0.2",
        "heartbeat_timeout_s": "1.5",
    },
}


def _graph(out: Path) -> pb.JobGraph:
    source = GeneratorSource(
        total_records=3_000_000, rate_per_s=50_000, num_keys=300, batch_size=2048, seed=1
    )
    return pb.JobGraph(
        name="ha-bench",
        vertices=[
            pb.JobVertex(
                vertex_id="source",
                name="source",
                parallelism=2,
                max_parallelism=128,
                is_source=True,
                operators=[op_spec("source", source)],
            ),
            pb.JobVertex(
                vertex_id="count",
                name="count",
                parallelism=2,
                max_parallelism=128,
                operators=[
                    op_spec("count", KeyedCount("key")),
                    op_spec("sink", TransactionalFileSink(str(out))),
                ],
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


def _env(settings: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPFLOW_")}
    env.update({f"SNAPFLOW_{k.upper()}": v for k, v in settings.items()})
    env["GRPC_VERBOSITY"] = "ERROR"
    return env


def _health(address: str) -> int | None:
    with grpc.insecure_channel(address) as channel:
        try:
            return int(
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(), timeout=1)
                .status
            )
        except grpc.RpcError:
            return None


def _wait(check: Any, what: str, timeout_s: float, interval_s: float = 0.02) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(interval_s)


def _latest(stub: Any, job_id: str) -> int:
    try:
        stats = stub.GetCheckpointStats(cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=2)
    except grpc.RpcError:
        return 0
    return int(stats.latest_completed.checkpoint_id)


def one_round(redis_url: str, work: Path, settings: dict[str, str]) -> dict[str, float]:
    namespace = f"ha-bench-{uuid.uuid4().hex[:8]}"
    env = _env({"high_availability": "redis", "shutdown_grace_s": "1", **settings})
    procs: list[subprocess.Popen[bytes]] = []
    logs = contextlib.ExitStack()
    try:
        ports = []
        for i in range(2):
            port = free_port()
            ports.append(port)
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "snapflow.cli", "coordinator",
                        "--host", "127.0.0.1", "--port", str(port), "--redis-url", redis_url,
                        "--redis-namespace", namespace, "--storage-root", str(work / "cp"),
                        "--metrics-port", "-1", "--log-level", "warning",
                    ],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=logs.enter_context(open(work / f"coordinator-{i}.log", "ab")),  # noqa: SIM115
                )
            )  # fmt: skip
            want = health_pb2.HealthCheckResponse.SERVING if i == 0 else None
            _wait(
                lambda p=port, w=want: (
                    (s := _health(f"127.0.0.1:{p}")) is not None and (w is None or s == w)
                ),
                f"coordinator {i}",
                30,
            )
        addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
        with sync_leader_channel(addresses) as channel:
            stub = cgrpc.CoordinatorServiceStub(channel)
            request = cpb.SubmitJobRequest(
                graph=_graph(work / "out"),
                checkpoint_config=pb.CheckpointConfig(interval_ms=200, tolerable_failures=100),
            )
            job_id = stub.SubmitJob(request, timeout=10).job.job_id
            for slot in range(2):
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable, "-m", "snapflow.cli", "worker", "--coordinator",
                            addresses, "--job", job_id, "--slot", str(slot), "--slots", "2",
                            "--log-level", "warning",
                        ],
                        env=_env({}),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=logs.enter_context(open(work / f"worker-{slot}.log", "ab")),  # noqa: SIM115
                    )
                )  # fmt: skip
            _wait(lambda: _latest(stub, job_id) >= 2, "checkpoints before the kill", 60)
            procs[0].kill()
            killed = time.monotonic()
            procs[0].wait(10)
            with redis.Redis.from_url(redis_url) as client:
                last_old = int(client.get(f"{namespace}:job:{job_id}:checkpoint-id") or 0)
            serving = _wait(
                lambda: _health(f"127.0.0.1:{ports[1]}") == health_pb2.HealthCheckResponse.SERVING,
                "the standby serving",
                60,
            )
            checkpoint = _wait(lambda: _latest(stub, job_id) > last_old, "a new checkpoint", 120)
            stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=10)
        return {"serving": serving - killed, "checkpoint": checkpoint - killed}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        logs.close()


def main() -> int:
    metrics: dict[str, float] = {}
    rounds: dict[str, list[dict[str, float]]] = {}
    with RedisServer() as server:
        for name, settings in PROFILES.items():
            rounds[name] = []
            for i in range(ROUNDS):
                with tempfile.TemporaryDirectory(prefix="snapflow-ha-bench-") as tmp:
                    server.flushall()
                    result = one_round(server.url, Path(tmp), settings)
                rounds[name].append(result)
                print(f"{name} round {i}: {result}", flush=True)
            for key in ("serving", "checkpoint"):
                values = [r[key] for r in rounds[name]]
                metrics[f"{name}_{key}_s_median"] = round(statistics.median(values), 3)
                metrics[f"{name}_{key}_s_max"] = round(max(values), 3)
    path = write_results("ha", metrics, rounds=rounds, profiles=PROFILES)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

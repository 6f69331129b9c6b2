"""Storage benchmark: the data-plane job with checkpoints on a local directory and on S3.

Pipeline and processes are the data-plane benchmark's (``bench.dataplane_bench``): a keyed
running count, parallelism 2, the coordinator and two agents as their own processes, sources
rate-limited so that every run sees the same load, aligned checkpoints every 100 ms. The only
difference between the two runs is the coordinator's ``storage_root``: a local directory, or
``s3://<bucket>/checkpoints`` on moto's S3 server, which this benchmark starts on 127.0.0.1
(in memory, over HTTP: it measures the request pattern and the client's overhead, not AWS's
latency).

Requests are counted by the server, not by the clients: moto's request recorder writes one
line per request it serves, so the counts include every request of every process (coordinator
and agents) and nothing a client might forget to count. A request is classified as S3 bills
it: PUT (PutObject, multipart create/part/complete), GET, HEAD, LIST (ListObjects*), DELETE
(DeleteObject(s), AbortMultipartUpload). Requests on ``.../_metadata`` are the coordinator's;
the rest during a run are the tasks' state files.

Metrics (``bench/results/storage.json``): ``s3_checkpoint_p50_ms``, ``s3_checkpoint_p99_ms``,
``local_checkpoint_p50_ms``, ``local_checkpoint_p99_ms`` (end-to-end durations from
GetCheckpointStats), ``s3_puts_per_subtask_checkpoint`` (task PUTs / (subtasks x completed
checkpoints); target <= 3), ``s3_gets_per_subtask_checkpoint``,
``s3_lists_per_checkpoint`` (LISTs during the run / completed checkpoints; target 0) and
``s3_metadata_puts_per_checkpoint``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import grpc
from rich.console import Console
from rich.table import Table

from bench.common import free_port, start_coordinator, stop_process, write_results
from bench.dataplane_bench import PARALLELISM, Runner, RunResult, RunSpec
from snapflow.redis_server import RedisServer
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

RATE = 200_000  # records/s over both sources: a steady load both runs can carry
SECONDS = 8.0
INTERVAL_MS = 100
SUBTASKS = 2 * PARALLELISM  # source vertex + keyed vertex, each at parallelism 2
BUCKET = "snapflow-bench"
TARGET_PUTS = 3


def _start_s3(recording: Path) -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server on a free 127.0.0.1 port, recording every request to ``recording``."""
    port = free_port()
    env = {
        **os.environ,
        "MOTO_ENABLE_RECORDING": "true",
        "MOTO_RECORDER_FILEPATH": str(recording),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                return process, url
        except OSError:
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                raise RuntimeError("moto server did not answer within 30 s") from None
            time.sleep(0.1)


def _stop_s3(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def classify(method: str, url: str) -> str:
    """The billing class of one recorded S3 request (path-style URLs)."""
    parts = urlsplit(url)
    query = parts.query
    key = parts.path.lstrip("/").partition("/")[2]
    if method == "HEAD":
        return "head"
    if method == "DELETE" or (method == "POST" and "delete" in query.split("&")):
        return "delete"
    if method in ("PUT", "POST"):
        return "put"
    if method == "GET" and (not key or "list-type" in query or "prefix=" in query):
        return "list"
    return "get"


# moto appends one JSON object per request, from several server threads; an entry with a large
# body is written in several system calls, so entries can interleave inside their bodies. The
# method and URL are adjacent, short fields written together: count those, not whole lines.
_ENTRY = re.compile(r'"method": "([A-Z]+)", "url": "([^"]*)"')


def count_requests(recording: Path) -> dict[str, Counter[str]]:
    """Counts by class, split into the coordinator's (``_metadata``) and the tasks'."""
    out: dict[str, Counter[str]] = {
        "coordinator": Counter(),
        "tasks": Counter(),
        "list_requests": Counter(),  # which LISTs, to find where they come from
    }
    if not recording.exists():
        return out
    for method, url in _ENTRY.findall(recording.read_text(errors="replace")):
        who = "coordinator" if urlsplit(url).path.endswith("/_metadata") else "tasks"
        kind = classify(method, url)
        out[who][kind] += 1
        if kind == "list":
            out["list_requests"][f"{method} {urlsplit(url).path}?{urlsplit(url).query}"] += 1
    return out


def _spec(name: str) -> RunSpec:
    return RunSpec(
        name=name,
        total_records=int(RATE * SECONDS),
        interval_ms=INTERVAL_MS,
        rate_per_s=RATE,
        min_batch_ms=10.0,
        timeout_s=SECONDS * 6 + 30,
    )


def _one_run(console: Console, storage_root: str, workdir: Path, name: str) -> RunResult:
    # A Redis of its own: a coordinator recovers every job in its Redis at start, and a job of
    # the other run would be recovered against this run's storage root.
    with RedisServer() as redis:
        return asyncio.run(_run_on(console, storage_root, workdir, redis.url, name))


async def _run_on(
    console: Console, storage_root: str, workdir: Path, redis_url: str, name: str
) -> RunResult:
    port = free_port()
    process = start_coordinator(redis_url, storage_root, port)
    try:
        runner = Runner(console, f"127.0.0.1:{port}", workdir, process.pid)
        async with grpc.aio.insecure_channel(runner.address) as channel:
            stub: cgrpc.CoordinatorServiceAsyncStub = cgrpc.CoordinatorServiceStub(channel)
            return await runner.run(stub, _spec(name))
    finally:
        stop_process(process)


def main() -> int:
    console = Console(width=150)
    console.print(
        "[bold]Storage[/bold]: the data-plane keyed count job, checkpoints every "
        f"{INTERVAL_MS} ms, local directory vs S3 (moto server on 127.0.0.1)"
    )
    metrics: dict[str, float] = {}
    errors: dict[str, str] = {}
    requests: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="snapflow-storage-") as tmp:
        work = Path(tmp)
        recording = work / "s3-requests.jsonl"
        s3, endpoint = _start_s3(recording)
        saved = {k: os.environ.get(k) for k in _aws_env(endpoint)}
        os.environ.update(_aws_env(endpoint))
        try:
            import boto3

            boto3.client("s3").create_bucket(Bucket=BUCKET)
            recording.write_text("")  # count the job's requests only
            local = _one_run(console, str(work / "checkpoints"), work, "local")
            s3_run = _one_run(console, f"s3://{BUCKET}/checkpoints", work, "s3")
            counts = count_requests(recording)
        finally:
            _stop_s3(s3)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    for label, result in (("local", local), ("s3", s3_run)):
        if result.error:
            errors[label] = result.error
            continue
        metrics[f"{label}_checkpoint_p50_ms"] = result.quantiles["p50"]
        metrics[f"{label}_checkpoint_p99_ms"] = result.quantiles["p99"]
        metrics[f"{label}_checkpoints_completed"] = float(result.completed_count)
    completed = s3_run.completed_count if not s3_run.error else 0
    if completed:
        tasks, coordinator = counts["tasks"], counts["coordinator"]
        per = SUBTASKS * completed
        metrics["s3_puts_per_subtask_checkpoint"] = round(tasks["put"] / per, 3)
        metrics["s3_gets_per_subtask_checkpoint"] = round(tasks["get"] / per, 3)
        metrics["s3_heads_per_subtask_checkpoint"] = round(tasks["head"] / per, 3)
        metrics["s3_lists_per_checkpoint"] = round(
            (tasks["list"] + coordinator["list"]) / completed, 3
        )
        metrics["s3_metadata_puts_per_checkpoint"] = round(coordinator["put"] / completed, 3)
        requests = {who: dict(c) for who, c in counts.items()}

    table = Table(title="storage", show_lines=False)
    for col in ("metric", "value", "target"):
        table.add_column(col)
    targets = {
        "s3_puts_per_subtask_checkpoint": f"<= {TARGET_PUTS}",
        "s3_lists_per_checkpoint": "0",
    }
    for name, value in sorted(metrics.items()):
        table.add_row(name, f"{value:g}", targets.get(name, ""))
    for label, error in errors.items():
        table.add_row(label, f"[red]{error}[/red]", "")
    console.print(table)
    path = write_results(
        "storage",
        metrics,
        errors=errors,
        requests=requests,
        targets=targets,
        method={
            "job": f"bench.dataplane_bench's keyed count, {RATE} records/s for {SECONDS:g} s, "
            f"aligned checkpoints every {INTERVAL_MS} ms, coordinator and agents as processes",
            "requests": "counted by moto's S3 server (its request recorder), every process's "
            "requests; _metadata requests are the coordinator's, the rest the tasks'",
            "checkpoint_ms": "end_to_end_duration_ms quantiles from GetCheckpointStats",
        },
        rows=[local.row(), s3_run.row()],
    )
    console.print(f"written to {path}")
    return 0 if not errors else 1


def _aws_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "snapflow-bench",
        "AWS_SECRET_ACCESS_KEY": "snapflow-bench-secret",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


if __name__ == "__main__":
    raise SystemExit(main())

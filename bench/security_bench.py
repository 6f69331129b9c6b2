"""Security benchmark: the data-plane job in plaintext and with mutual TLS and tokens on every hop.

Pipeline and processes are the data-plane benchmark's (``bench.dataplane_bench``): a keyed
running count, source -> hash(key) -> [KeyedCount -> sink], parallelism 2, the coordinator and
two agents as their own processes, sources at full speed (no rate limit), aligned checkpoints
every second. The two kinds of run differ only in their environment:

plain
    no security setting: every connection is plaintext, nothing is checked.
tls
    the ``SNAPFLOW_*`` variables of ``bench.pki.BenchPki.service_env`` for the coordinator and
    both agents: each serves TLS with the service certificate and requires a client
    certificate from the CA (mutual TLS), checks a bearer token on every call against its
    tokens file, and sends the service token on each call it makes (coordinator -> agents,
    agents -> coordinator, agent -> agent data exchange). This process connects with its own
    certificate and the operator token. The certificates are generated at start (P-256,
    ``bench/pki.py``) in a temporary directory; the variables are set for the TLS runs only
    and restored afterwards.

Every run has its own Redis and coordinator (a coordinator recovers every job in its Redis at
start, and a job of the other kind would be recovered with the wrong settings). A plaintext
calibration run sizes the runs to about ``TARGET_RUN_S`` seconds; then the two kinds run
interleaved, ``SNAPFLOW_BENCH_REPEATS`` times each (default 5, the order alternating), and the
best run of each kind is reported (noise on a shared machine only slows a run down).

Metrics (``bench/results/security.json``): ``plain_records_per_s``, ``tls_records_per_s``
(source records / RUNNING -> FINISHED, coordinator event times), ``tls_throughput_ratio``
(best TLS / best plaintext; target >= 0.9; ``tls_throughput_ratio_median``: median runs;
``tls_throughput_ratio_paired_median``/``_min``/``_max``: the ratios of the i-th run of each
kind, neighbours in time, which show how much of a gap is noise),
``*_checkpoint_p50_ms`` and
``*_checkpoint_p99_ms`` (end-to-end durations of every checkpoint completed in the runs of a
kind, from the WatchJob events: at one per second a single run has only a few), and
``*_cpu_s_per_m_records`` (CPU of both agents and the coordinator per million records, the
lowest run; ``tls_cpu_ratio`` is their ratio, less sensitive to other load than wall time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import free_port, start_coordinator, stop_process, write_results
from bench.dataplane_bench import PARALLELISM, Runner, RunResult, RunSpec
from bench.pki import BenchPki, make_pki
from snapflow.coordinator.checkpoint_stats import percentile
from snapflow.redis_server import RedisServer
from snapflow.security import ENV_PREFIX, PLAINTEXT, SECURITY_FIELDS, TOKEN_ENV, SecuritySettings
from snapflow.tls import aio_channel
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

INTERVAL_MS = 1000
TARGET_RUN_S = 4.0
CALIBRATION_RECORDS = 12_000_000
MIN_RECORDS, MAX_RECORDS = 4_000_000, 120_000_000
FALLBACK_RATE = 10_000_000.0  # records/s when the calibration run failed
TARGET_RATIO = 0.9
KINDS = ("plain", "tls")
REPEATS = 5  # runs per kind (SNAPFLOW_BENCH_REPEATS overrides)


@contextlib.contextmanager
def _environment(changes: Mapping[str, str]) -> Iterator[None]:
    """``changes`` in ``os.environ`` (inherited by the coordinator and the agents) for the
    block, and every other ``SNAPFLOW_*`` security variable unset; restored afterwards."""
    security_vars = {ENV_PREFIX + name.upper() for name in SECURITY_FIELDS} | {TOKEN_ENV}
    saved = {k: os.environ.get(k) for k in security_vars | set(changes)}
    for k in security_vars:
        os.environ.pop(k, None)
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spec(name: str, records: int, rate: float) -> RunSpec:
    return RunSpec(
        name=name,
        total_records=records,
        interval_ms=INTERVAL_MS,
        timeout_s=min(120.0, 30.0 + 5.0 * records / max(rate, 1.0)),
    )


def _one_run(runner: Runner, pki: BenchPki, kind: str, spec: RunSpec) -> RunResult:
    env = pki.service_env() if kind == "tls" else {}
    client = pki.operator_settings() if kind == "tls" else PLAINTEXT
    with _environment(env), RedisServer() as redis:
        return asyncio.run(_run_on(runner, redis, client, spec))


async def _run_on(
    runner: Runner, redis: RedisServer, client: SecuritySettings, spec: RunSpec
) -> RunResult:
    port = free_port()
    workdir = runner.workdir
    process = start_coordinator(redis.url, str(workdir / f"checkpoints-{port}"), port, client)
    try:
        runner.address = f"127.0.0.1:{port}"
        runner.coordinator_pid = process.pid
        runner.other_pids = [redis.pid] if redis.pid is not None else []
        async with aio_channel(runner.address, client) as channel:
            stub: cgrpc.CoordinatorServiceAsyncStub = cgrpc.CoordinatorServiceStub(channel)
            return await runner.run(stub, spec)
    finally:
        stop_process(process)


def _best(results: list[RunResult]) -> RunResult | None:
    ok = [r for r in results if r.ok]
    return max(ok, key=lambda r: r.records_per_s) if ok else None


def _errors(results: list[RunResult]) -> str:
    return "; ".join(r.error for r in results if r.error)[:600] or "no successful run"


def _metrics(runs: dict[str, list[RunResult]]) -> tuple[dict[str, float], dict[str, str]]:
    metrics: dict[str, float] = {}
    errors: dict[str, str] = {}
    for kind in KINDS:
        best = _best(runs[kind])
        if best is None:
            errors[f"{kind}_records_per_s"] = _errors(runs[kind])
            continue
        metrics[f"{kind}_records_per_s"] = round(best.records_per_s, 1)
        metrics[f"{kind}_records_per_s_data"] = round(best.records_per_s_data, 1)
        durations = sorted(
            float(c["end_to_end_duration_ms"]) for r in runs[kind] if r.ok for c in r.completed
        )
        if durations:
            metrics[f"{kind}_checkpoint_p50_ms"] = round(percentile(durations, 50), 1)
            metrics[f"{kind}_checkpoint_p99_ms"] = round(percentile(durations, 99), 1)
            metrics[f"{kind}_checkpoints_completed"] = float(len(durations))
        else:
            errors[f"{kind}_checkpoint_p99_ms"] = "no completed checkpoint"
        failed = sum(len(r.failed) for r in runs[kind] if r.ok)
        metrics[f"{kind}_checkpoints_failed"] = float(failed)
        cpu = [
            (r.worker_cpu_s + r.coordinator_cpu_s) / r.spec.total_records * 1e6
            for r in runs[kind]
            if r.ok and r.worker_cpu_s > 0
        ]
        if cpu:
            metrics[f"{kind}_cpu_s_per_m_records"] = round(min(cpu), 4)
    if "plain_records_per_s" in metrics and "tls_records_per_s" in metrics:
        metrics["tls_throughput_ratio"] = round(
            metrics["tls_records_per_s"] / metrics["plain_records_per_s"], 4
        )
    else:
        errors["tls_throughput_ratio"] = "needs a successful run of each kind"
    medians = {
        kind: statistics.median(r.records_per_s for r in runs[kind] if r.ok)
        for kind in KINDS
        if any(r.ok for r in runs[kind])
    }
    if len(medians) == len(KINDS):
        metrics["tls_throughput_ratio_median"] = round(medians["tls"] / medians["plain"], 4)
    # Runs i of both kinds are neighbours in time: their ratio cancels slow changes of the
    # other load on the machine, and the spread of the ratios shows how noisy the run was.
    paired = sorted(
        t.records_per_s / p.records_per_s
        for p, t in zip(runs["plain"], runs["tls"], strict=False)
        if p.ok and t.ok and p.records_per_s > 0
    )
    if paired:
        metrics["tls_throughput_ratio_paired_median"] = round(statistics.median(paired), 4)
        metrics["tls_throughput_ratio_paired_min"] = round(paired[0], 4)
        metrics["tls_throughput_ratio_paired_max"] = round(paired[-1], 4)
    if "plain_cpu_s_per_m_records" in metrics and "tls_cpu_s_per_m_records" in metrics:
        metrics["tls_cpu_ratio"] = round(
            metrics["tls_cpu_s_per_m_records"] / metrics["plain_cpu_s_per_m_records"], 4
        )
    return metrics, errors


def _runs_table(results: list[RunResult]) -> Table:
    table = Table(title="Runs: source -> hash(key) -> [KeyedCount -> sink], 2 agent processes")
    for name in ("run", "records", "s", "rec/s", "ckpts", "p50", "p99", "CPU", "other", "ok"):
        table.add_column(name, justify="left" if name in ("run", "ok") else "right")
    for r in results:
        if r.error:
            table.add_row(r.spec.name, f"{r.spec.total_records / 1e6:.1f}M", "-",
                          "[red]ERROR[/red]", *["-"] * 5, "[red]ERR[/red]")  # fmt: skip
            continue
        other = r.foreign_cpu_pct
        table.add_row(
            r.spec.name,
            f"{r.spec.total_records / 1e6:.1f}M",
            f"{r.elapsed_s:.2f}",
            f"{r.records_per_s / 1e6:.2f}M",
            f"{r.completed_count}/{int(r.quantiles.get('failed', 0))}",
            f"{r.quantiles.get('p50', 0):.0f}",
            f"{r.quantiles.get('p99', 0):.0f}",
            f"{r.worker_cpu_s:.1f}/{r.coordinator_cpu_s:.1f}",
            "-" if other is None else f"{other + (r.steal_pct or 0):.0f}%",
            "ok" if r.verified else ("[red]WRONG[/red]" if r.verified is False else "?"),
        )
    return table


def _targets_table(metrics: dict[str, float], errors: dict[str, str]) -> Table:
    table = Table(title="security")
    for name, justify in (("metric", "left"), ("value", "right"), ("target", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    ratio = metrics.get("tls_throughput_ratio")
    for name in sorted(set(metrics) | set(errors)):
        value = metrics.get(name)
        if value is None:
            shown = f"[red]{errors[name][:60]}[/red]"
        else:
            shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        target = ""
        if name == "tls_throughput_ratio":
            met = ratio is not None and ratio >= TARGET_RATIO
            target = f">= {TARGET_RATIO:g} " + (
                "[green]met[/green]" if met else "[red]MISSED[/red]"
            )
        table.add_row(name, shown, target)
    return table


def main() -> int:
    console = Console(width=150)
    repeats = max(1, int(os.environ.get("SNAPFLOW_BENCH_REPEATS", str(REPEATS))))
    console.print(
        "[bold]Security[/bold]: the data-plane keyed count job at full speed, aligned "
        f"checkpoints every {INTERVAL_MS} ms, plaintext vs mutual TLS + service tokens on every "
        "hop; coordinator + 2 agents as processes, a Redis and coordinator per run"
    )
    runs: dict[str, list[RunResult]] = {kind: [] for kind in KINDS}
    records = 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="snapflow-security-") as tmp:
        work = Path(tmp)
        pki = make_pki(work / "pki")
        runner = Runner(console, "", work, 0)
        try:
            calib = _one_run(
                runner, pki, "plain", _spec("calibrate", CALIBRATION_RECORDS, FALLBACK_RATE)
            )
            rate = calib.records_per_s if calib.ok else FALLBACK_RATE
            records = int(min(MAX_RECORDS, max(MIN_RECORDS, rate * TARGET_RUN_S)))
            for i in range(repeats):  # interleaved, the order alternating
                for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                    runs[kind].append(_one_run(runner, pki, kind, _spec(kind, records, rate)))
        except Exception as e:  # keep what was measured
            console.print(f"[red]benchmark aborted: {type(e).__name__}: {e}[/red]")

    metrics, errors = _metrics(runs)
    console.print(_runs_table(runner.results))
    console.print(
        "s: RUNNING -> FINISHED; p50, p99: end-to-end checkpoint ms of the run "
        "(GetCheckpointStats); CPU: agents / coordinator CPU s; other: CPU used by other "
        "processes (and stolen by the host) during the run, % of all cores; ok: the sinks' "
        f"counts add up. {time.perf_counter() - started:.0f} s in all.",
        highlight=False,
    )
    console.print(_targets_table(metrics, errors))
    method: dict[str, Any] = {
        "job": "bench.dataplane_bench's keyed count (source -> hash -> KeyedCount -> "
        f"DiscardingSink), parallelism {PARALLELISM}, {records} records per run, no rate "
        f"limit, aligned checkpoints every {INTERVAL_MS} ms, coordinator and 2 agents as "
        "processes, a Redis and a coordinator per run",
        "tls": "coordinator and agents: mutual TLS (P-256 certificates from one CA, generated "
        "at start), auth_tokens_file and auth_identities set, the service token sent on "
        "every call (coordinator <-> agents, agent <-> agent data exchange); the benchmark "
        "client: its own certificate and the operator token",
        "records_per_s": "source records / (RUNNING -> FINISHED, coordinator event times); "
        f"best of {repeats} interleaved runs per kind (order alternating)",
        "tls_throughput_ratio": "tls_records_per_s / plain_records_per_s (best runs); "
        "tls_throughput_ratio_median: the same with the median run of each kind; "
        "tls_throughput_ratio_paired_*: median, min and max of tls/plain over the i-th runs "
        "of each kind (neighbours in time)",
        "checkpoint_ms": "end_to_end_duration_ms of every checkpoint completed in the runs of "
        "a kind (WatchJob events), p50 and p99 pooled over the runs",
        "cpu_s_per_m_records": "CPU s of both agents (wait4) and the coordinator (/proc) per "
        "million records, lowest run",
    }
    path = write_results(
        "security",
        metrics,
        errors=errors,
        targets={"tls_throughput_ratio": f">= {TARGET_RATIO}"},
        method=method,
        rows=[r.row() for r in runner.results],
    )
    console.print(f"written to {path}")
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())

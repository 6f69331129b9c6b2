"""The chaos run: seeded fault injection against real processes, exact verification, figures.

One seeded ``random.Random`` decides everything the run does on purpose (job modes and sizes,
which worker dies and when, when the leader, Redis or a stale leader is hit, every hostile
message), so ``--seed n`` replays the same plan; the machine's timing still varies.

Scenarios, all at once on one cluster (``Cluster``: Redis with ``appendfsync always``, two
coordinators in ``high_availability = "redis"`` when this build has leader election, else one):

* **worker kills**: each job's driver (playing Spark's role) SIGKILLs one of its worker
  processes at a seeded point after a checkpoint completed and starts the missing workers
  again, in every checkpoint mode (aligned, unaligned, aligned with a timeout);
* **leader kills** (with a standby): SIGKILL of the serving coordinator, restarted at once as
  the new standby; the standby takes over when the lease lapses, the agents register again;
* **Redis kills**: SIGKILL of ``redis-server`` and a restart on the same port and AOF;
* **split brain**: the leader is frozen (SIGSTOP) until a standby took over and a checkpoint
  completed, then thawed and sent acknowledgements naming the live files of the new leader's
  latest checkpoint; the agents get its stale commands (epoch 1). Files it deleted are counted;
* **hostile messages** to every unary RPC of the coordinators and agents, and hostile
  ``Exchange`` data streams to the agents (``chaos.hostile``);
* **Sentinel failover**: jobs on a second setup (master, replica, three sentinels and a
  coordinator with a ``redis+sentinel://`` URL), one at a time; each has its master SIGKILLed
  at a seeded point after its first checkpoint and finishes on the promoted replica.

Verified exactly at the end: every job FINISHED and its committed output exact (``lost`` and
``duplicated`` records, ``JobSpec.verify``). Recovery is the time from a worker kill to
the next completed checkpoint of its job; takeover the time from a leader kill to the first
completed checkpoint of any job after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from chaos.cluster import HOST, Cluster, Tracked
from chaos.hostile import (
    CONTROL_COMMANDS,
    COORDINATOR_METHODS,
    EXCHANGE_KINDS,
    HostileStats,
    hostile_control_command,
    hostile_coordinator_request,
    hostile_exchange_stream,
    send,
    send_control,
    send_stream,
)
from chaos.workload import MODES, JobSpec
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc


@dataclass(frozen=True)
class Plan:
    """How big a run is (``full`` for ``make chaos``, ``quick`` for the test suite)."""

    jobs: int
    concurrent_jobs: int
    kills_per_job: int
    records_per_kill: int
    rate_per_s: int
    leader_kills: int
    redis_kills: int
    split_brains: int
    hostile_messages: int
    sentinel_jobs: int
    """Jobs on the Sentinel cluster, one at a time; each sees one master failover."""
    extra_jobs: int = 0
    """Jobs the run may add, ``concurrent_jobs`` at a time, when the planned ones finished
    before ``jobs * kills_per_job`` worker kills or ``leader_kills`` leader kills happened (a
    fast machine replays little after each kill, so a job's input can end before its kills)."""
    interval_ms: int = 200
    heartbeat_timeout_s: float = 2.0
    lease_ttl_s: float = 1.5
    lease_renew_interval_s: float = 0.3
    deadline_s: float = 1500.0

    @classmethod
    def full(cls) -> Plan:
        return cls(
            jobs=28,  # 8 kills each: 224, margin over the 200 target
            concurrent_jobs=3,
            kills_per_job=8,
            # Long enough that a job on a quiet machine still sees all its kills (each waits
            # for a checkpoint after the previous recovery) and leader kills find jobs running.
            records_per_kill=10_000,
            rate_per_s=12_000,
            leader_kills=60,  # a kill is skipped while no job runs: margin over 50
            redis_kills=6,
            split_brains=4,
            hostile_messages=2_400,
            sentinel_jobs=3,
            extra_jobs=12,
        )

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            jobs=3,
            concurrent_jobs=3,
            kills_per_job=2,
            # 4,000 left jobs of about a second: on a slow machine (a leader takeover of 12 s,
            # workers slow to start) they ended before any kill landed (2 of 3 runs failed).
            records_per_kill=10_000,
            rate_per_s=10_000,
            leader_kills=1,
            redis_kills=1,
            split_brains=1,
            hostile_messages=200,
            sentinel_jobs=1,
            # On a slow machine the leader takeover and the Redis kill leave no coordinator
            # answering for much of the first jobs' life, and kills land only on a running
            # job: one more round of three when fewer than six worker kills landed.
            extra_jobs=3,
            deadline_s=150.0,
        )


@dataclass
class Figures:
    worker_kills: int = 0
    leader_kills: int = 0
    redis_kills: int = 0
    split_brains: int = 0
    sentinel_failovers: int = 0
    stale_acks: int = 0
    stale_deleted_files: int = 0
    stale_agent_commands: int = 0
    jobs_total: int = 0
    jobs_finished: int = 0
    join_jobs: int = 0
    join_worker_kills: int = 0
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    recoveries_s: list[float] = field(default_factory=list)
    takeovers_s: list[float] = field(default_factory=list)
    promotions_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 3)


def ha_available() -> bool:
    """This build has leader election (the standby scenarios need it)."""
    return importlib.util.find_spec("snapflow.coordinator.leadership") is not None


class Client:
    """Calls to whichever coordinator serves (a standby or a dead one is skipped)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._channels: dict[int, grpc.aio.Channel] = {}

    def stub(self, port: int) -> cgrpc.CoordinatorServiceAsyncStub:
        if port not in self._channels:
            self._channels[port] = grpc.aio.insecure_channel(f"{HOST}:{port}")
        return cgrpc.CoordinatorServiceStub(self._channels[port])

    def channel(self, port: int) -> grpc.aio.Channel:
        self.stub(port)
        return self._channels[port]

    async def call(
        self, method: str, request: Any, timeout_s: float = 5.0, wait_s: float = 0.0
    ) -> Any:
        """Try every coordinator; with ``wait_s``, keep trying that long (a takeover or a
        Redis restart leaves no coordinator serving for a few seconds)."""
        deadline = time.monotonic() + wait_s
        while True:
            last: grpc.aio.AioRpcError | None = None
            for port in sorted(self.cluster.coordinators):
                try:
                    return await getattr(self.stub(port), method)(request, timeout=timeout_s)
                except grpc.aio.AioRpcError as e:
                    last = e
                    if e.code() not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.FAILED_PRECONDITION,
                    ):
                        raise
            assert last is not None
            if time.monotonic() >= deadline:
                raise last
            await asyncio.sleep(0.2)

    async def latest_completed(self, job_id: str) -> int:
        with contextlib.suppress(grpc.aio.AioRpcError):
            stats = await self.call(
                "GetCheckpointStats", cpb.GetCheckpointStatsRequest(job_id=job_id), 2.0
            )
            return int(stats.latest_completed.checkpoint_id)
        return -1

    async def state(self, job_id: str) -> int:
        with contextlib.suppress(grpc.aio.AioRpcError):
            info = await self.call("GetJob", cpb.GetJobRequest(job_id=job_id), 2.0)
            return int(info.state)
        return -1

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


class Run:
    """One seeded chaos run."""

    def __init__(self, seed: int, plan: Plan, work_dir: Path, log: Any = print) -> None:
        self.seed = seed
        self.plan = plan
        self.rng = random.Random(seed)
        self.work_dir = work_dir
        self.cluster = Cluster(work_dir, namespace=f"chaos-{seed}")
        self.client = Client(self.cluster)
        # The Sentinel scenario's own Redis (master, replica, sentinels) and coordinator.
        self.sentinel_cluster = Cluster(
            work_dir / "sentinel", namespace=f"chaos-sentinel-{seed}", sentinel=True
        )
        self.sentinel_client = Client(self.sentinel_cluster)
        self.figures = Figures()
        self.log = log
        self.ha = ha_available()
        self.running_jobs: dict[str, JobSpec] = {}
        self.workers: dict[str, dict[int, Tracked]] = {}
        self.hostile = HostileStats()
        self.finished: set[str] = set()
        self._sentinel_done: list[JobSpec] = []
        """Sentinel jobs that were started (verified at the end)."""
        self._jobs_done = asyncio.Event()
        self._started = time.monotonic()

    # --- the whole run -----------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        settings = {
            "heartbeat_interval_s": str(plan.heartbeat_timeout_s / 5),
            "heartbeat_timeout_s": str(plan.heartbeat_timeout_s),
            "shutdown_grace_s": "1",
            "orphan_sweep_interval_s": "5",
            "log_level": "warning",
        }
        if self.ha:
            settings["lease_ttl_s"] = str(plan.lease_ttl_s)
            settings["lease_renew_interval_s"] = str(plan.lease_renew_interval_s)
        await asyncio.to_thread(self.cluster.start_redis)
        self.cluster.configure_coordinators(2 if self.ha else 1, self.ha, **settings)
        self.cluster.start_coordinators()
        specs: list[JobSpec] = []
        try:
            await asyncio.to_thread(self.cluster.leader, 60.0)
            specs = self._job_specs()
            sentinel_specs = self._sentinel_specs() if plan.sentinel_jobs else []
            if sentinel_specs:
                await asyncio.to_thread(self.sentinel_cluster.start_redis)
                sentinel_settings = {
                    k: v for k, v in settings.items() if not k.startswith("lease_")
                }
                self.sentinel_cluster.configure_coordinators(1, False, **sentinel_settings)
                self.sentinel_cluster.start_coordinators()
            self.figures.jobs_total = len(specs) + len(sentinel_specs)
            async with asyncio.timeout(plan.deadline_s):
                chaos = [asyncio.create_task(self._redis_kills())]
                if sentinel_specs:
                    chaos.append(asyncio.create_task(self._sentinel_jobs(sentinel_specs)))
                if self.ha:
                    chaos.append(asyncio.create_task(self._leader_kills()))
                    chaos.append(asyncio.create_task(self._split_brains()))
                chaos.append(asyncio.create_task(self._hostile()))
                await self._run_jobs(specs)
                await self._run_extra_jobs(specs)
                self._jobs_done.set()
                for task in chaos:
                    await task
        except TimeoutError:
            self.figures.failures.append(f"the run exceeded its deadline of {plan.deadline_s} s")
        finally:
            self._jobs_done.set()
            await self.client.close()
            await self.sentinel_client.close()
            await asyncio.to_thread(self.kill_all)
        for spec in [*specs, *self._sentinel_done]:
            verdict = spec.verify(self.work_dir / "out" / spec.name)
            self.figures.join_jobs += spec.kind == "join"
            finished = spec.name in self.finished
            self.figures.records += verdict.records
            # A job that did not finish has not committed everything yet: only duplicates count.
            self.figures.lost += verdict.lost if finished else 0
            self.figures.duplicated += verdict.duplicated
            if not finished:
                self.figures.failures.append(f"{spec.name} ({spec.mode}) did not finish")
            if verdict.duplicated or (finished and verdict.lost):
                self.figures.failures.append(
                    f"{spec.name} ({spec.mode}): lost {verdict.lost}, duplicated "
                    f"{verdict.duplicated}"
                )
        return self.result()

    def result(self) -> dict[str, Any]:
        f = self.figures
        metrics = {
            "seed": self.seed,
            "worker_kills": f.worker_kills,
            "leader_kills": f.leader_kills,
            "redis_kills": f.redis_kills,
            "split_brains": f.split_brains,
            "sentinel_failovers": f.sentinel_failovers,
            "sentinel_promotion_max_s": round(max(f.promotions_s, default=0.0), 3),
            "stale_acks": f.stale_acks,
            "stale_agent_commands": f.stale_agent_commands,
            "stale_deleted_files": f.stale_deleted_files,
            "hostile_messages": self.hostile.sent,
            "hostile_unexpected_status": self.hostile.unexpected,
            "hostile_exchange_streams": self.hostile.exchange_streams,
            "jobs_total": f.jobs_total,
            "jobs_finished": f.jobs_finished,
            "join_jobs": f.join_jobs,
            "join_worker_kills": f.join_worker_kills,
            "records": f.records,
            "lost": f.lost,
            "duplicated": f.duplicated,
            "recovery_p50_s": _percentile(f.recoveries_s, 0.5),
            "recovery_p99_s": _percentile(f.recoveries_s, 0.99),
            "takeover_p50_s": _percentile(f.takeovers_s, 0.5),
            "takeover_p99_s": _percentile(f.takeovers_s, 0.99),
            "lease_ttl_s": self.plan.lease_ttl_s if self.ha else 0.0,
            "heartbeat_timeout_s": self.plan.heartbeat_timeout_s,
            "high_availability": self.ha,
            "duration_s": round(time.monotonic() - self._started, 1),
        }
        return {
            "metrics": metrics,
            "hostile_statuses": dict(self.hostile.statuses),
            "hostile_streams": dict(self.hostile.streams),
            "hostile_stream_details": self.hostile.stream_details,
            "failures": f.failures + self.hostile.bad,
        }

    def kill_all(self) -> None:
        """SIGKILL every process of the run (both clusters) by PID and reap it."""
        self.cluster.kill_all()
        self.sentinel_cluster.kill_all()

    @staticmethod
    def ok(result: dict[str, Any]) -> bool:
        m = result["metrics"]
        return (
            not result["failures"]
            and m["lost"] == 0
            and m["duplicated"] == 0
            and m["jobs_finished"] == m["jobs_total"]
            and m["stale_deleted_files"] == 0
            and m["hostile_unexpected_status"] == 0
        )

    # --- jobs --------------------------------------------------------------------------------

    def _job_specs(self, first: int = 0, count: int | None = None) -> list[JobSpec]:
        plan, modes = self.plan, list(MODES)
        specs = []
        for i in range(first, first + (plan.jobs if count is None else count)):
            parallelism = self.rng.choice([1, 1, 2])
            specs.append(
                JobSpec(
                    name=f"job-{i:03d}",
                    mode=modes[i % len(modes)],
                    records=plan.records_per_kill * (plan.kills_per_job + 2),
                    rate_per_s=plan.rate_per_s,
                    keys=self.rng.choice([50, 200, 1000]),
                    parallelism=parallelism,
                    seed=self.rng.getrandbits(31),
                    # Every fourth a join (two sources, a keyed two-input task): over the
                    # rotation of modes, each mode gets joins too.
                    kind="join" if i % 4 == 2 else "count",
                )
            )
        return specs

    def _short_of_targets(self) -> bool:
        """The planned jobs saw fewer kills than the plan promises."""
        plan, f = self.plan, self.figures
        return f.worker_kills < plan.jobs * plan.kills_per_job or (
            self.ha and f.leader_kills < plan.leader_kills
        )

    async def _run_extra_jobs(self, specs: list[JobSpec]) -> None:
        """Add jobs, a round of ``concurrent_jobs`` at a time, while the run is short of its
        kill targets (at most ``extra_jobs``); they join ``specs`` and are verified alike."""
        plan = self.plan
        while self._short_of_targets() and len(specs) < plan.jobs + plan.extra_jobs:
            count = min(plan.concurrent_jobs, plan.jobs + plan.extra_jobs - len(specs))
            extra = self._job_specs(first=len(specs), count=count)
            specs.extend(extra)
            self.figures.jobs_total += len(extra)
            self.log(f"chaos: short of the kill targets, {len(extra)} more jobs")
            await self._run_jobs(extra)

    async def _run_jobs(self, specs: list[JobSpec]) -> None:
        gate = asyncio.Semaphore(self.plan.concurrent_jobs)

        async def one(spec: JobSpec, rng: random.Random) -> None:
            async with gate:
                try:
                    await self._drive(spec, rng)
                except Exception as e:  # reported; the other jobs go on
                    self.figures.failures.append(f"{spec.name}: {type(e).__name__}: {e}")

        await asyncio.gather(*(one(s, random.Random(self.rng.getrandbits(64))) for s in specs))

    async def _drive(
        self,
        spec: JobSpec,
        rng: random.Random,
        *,
        job_id: str | None = None,
        sentinel: bool = False,
    ) -> None:
        """Play the driver of one job: run its workers, kill one at seeded points, restart
        the missing ones, until the job finished. ``sentinel``: on the Sentinel cluster,
        with no worker kills (the master failover is that job's fault)."""
        cluster, client = self.cluster, self.client
        kills_per_job = self.plan.kills_per_job
        if sentinel:
            cluster, client, kills_per_job = self.sentinel_cluster, self.sentinel_client, 0
        out = self.work_dir / "out" / spec.name
        job_id = job_id or f"{rng.getrandbits(128):032x}"
        request = cpb.SubmitJobRequest(
            job_id=job_id,
            graph=spec.graph(out),
            checkpoint_config=spec.checkpoint_config(self.plan.interval_ms),
        )
        # The job id is ours, so a retry after a lost answer finds the job already there.
        try:
            await client.call("SubmitJob", request, 20.0, wait_s=120.0)
        except grpc.aio.AioRpcError as e:
            if e.code() is not grpc.StatusCode.ALREADY_EXISTS:
                raise
        if not sentinel:  # the main cluster's faults aim at its running jobs only
            self.running_jobs[job_id] = spec
        slots = spec.parallelism
        workers = self.workers[job_id] = {}
        kills = 0
        kill_at: tuple[int, float] | None = None  # (checkpoint id at the kill, time)
        next_kill_after = -1
        try:
            for slot in range(slots):
                workers[slot] = cluster.start_worker(job_id, slot, slots)
            while True:
                await asyncio.sleep(0.05)
                state = await client.state(job_id)
                if state == pb.JOB_STATE_FINISHED:
                    self.figures.jobs_finished += 1
                    self.finished.add(spec.name)
                    return
                if state in (pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELED):
                    raise RuntimeError(f"job ended {pb.JobState.Name(state)}")
                latest = await client.latest_completed(job_id)
                if kill_at is not None and latest > kill_at[0]:
                    self.figures.recoveries_s.append(time.monotonic() - kill_at[1])
                    kill_at = None
                for slot, tracked in list(workers.items()):
                    if not tracked.alive() and tracked.proc.returncode != 0:
                        workers[slot] = cluster.start_worker(job_id, slot, slots)
                if (
                    kills < kills_per_job
                    and kill_at is None
                    and state == pb.JOB_STATE_RUNNING
                    and latest > next_kill_after
                ):
                    await asyncio.sleep(rng.uniform(0.0, 0.6))  # a seeded point
                    victim = workers[rng.randrange(slots)]
                    if victim.alive():
                        # Recovery: from the kill to a checkpoint newer than any before it.
                        latest = max(latest, await client.latest_completed(job_id))
                        kill_at = (latest, time.monotonic())
                        await asyncio.to_thread(victim.kill)
                        kills += 1
                        self.figures.worker_kills += 1
                        self.figures.join_worker_kills += spec.kind == "join"
                        next_kill_after = latest
        finally:
            self.running_jobs.pop(job_id, None)
            for tracked in workers.values():
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(tracked.proc.wait, 15)
                await asyncio.to_thread(tracked.kill)

    # --- leader, Redis and split brain --------------------------------------------------------

    async def _wait_any_checkpoint(self, after: dict[str, int], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._jobs_done.is_set():
            for job_id, before in list(after.items()):
                if await self.client.latest_completed(job_id) > before:
                    return True
            await asyncio.sleep(0.05)
        return False

    async def _snapshot_latest(self) -> dict[str, int]:
        return {j: await self.client.latest_completed(j) for j in list(self.running_jobs)}

    async def _leader_kills(self) -> None:
        rng = random.Random(self.rng.getrandbits(64))
        # A kill is due only while a job runs; a skipped turn does not count as one.
        while self.figures.leader_kills < self.plan.leader_kills:
            await asyncio.sleep(rng.uniform(1.5, 3.0))
            if self._jobs_done.is_set():
                break
            if not self.running_jobs:
                continue
            port = await asyncio.to_thread(self.cluster.leader, 30.0)
            before = await self._snapshot_latest()
            killed_at = time.monotonic()
            await asyncio.to_thread(self.cluster.coordinators[port].kill)
            self.figures.leader_kills += 1
            self.cluster.start_coordinator(port)  # back at once, as the new standby
            if await self._wait_any_checkpoint(before, 60.0):
                self.figures.takeovers_s.append(time.monotonic() - killed_at)

    def _sentinel_specs(self) -> list[JobSpec]:
        plan = self.plan
        return [
            JobSpec(
                name=f"sentinel-{i:03d}",
                mode=list(MODES)[i % len(MODES)],
                records=plan.records_per_kill * 4,
                # Slower than the others: the job must still run when its failover comes,
                # also on a loaded machine.
                rate_per_s=max(1, plan.rate_per_s // 5),
                keys=self.rng.choice([50, 200, 1000]),
                parallelism=self.rng.choice([1, 2]),
                seed=self.rng.getrandbits(31),
            )
            for i in range(plan.sentinel_jobs)
        ]

    async def _sentinel_jobs(self, specs: list[JobSpec]) -> None:
        """One job at a time on the Sentinel cluster; each has its master SIGKILLed at a
        seeded point (0-0.6 s after its first completed checkpoint) and must finish exactly
        once on the promoted replica."""
        rng = random.Random(self.rng.getrandbits(64))
        for spec in specs:
            job_rng = random.Random(rng.getrandbits(64))
            job_id = f"{job_rng.getrandbits(128):032x}"
            self._sentinel_done.append(spec)
            driver = asyncio.create_task(self._drive(spec, job_rng, job_id=job_id, sentinel=True))
            try:
                while not driver.done():
                    if await self.sentinel_client.latest_completed(job_id) > 0:
                        await asyncio.sleep(rng.uniform(0.0, 0.6))  # a seeded point
                        promoted = await asyncio.to_thread(self.sentinel_cluster.fail_over)
                        self.figures.sentinel_failovers += 1
                        self.figures.promotions_s.append(promoted)
                        break
                    await asyncio.sleep(0.05)
                await driver
            except Exception as e:  # reported; the run goes on
                self.figures.failures.append(f"{spec.name}: {type(e).__name__}: {e}")
            finally:
                if not driver.done():
                    driver.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await driver

    async def _redis_kills(self) -> None:
        rng = random.Random(self.rng.getrandbits(64))
        for _ in range(self.plan.redis_kills):
            await asyncio.sleep(rng.uniform(4.0, 12.0))
            if self._jobs_done.is_set():
                break
            redis = self.cluster.redis
            assert redis is not None
            await asyncio.to_thread(redis.kill)
            self.figures.redis_kills += 1
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            await asyncio.to_thread(self.cluster.start_redis)

    async def _split_brains(self) -> None:
        rng = random.Random(self.rng.getrandbits(64))
        for _ in range(self.plan.split_brains):
            await asyncio.sleep(rng.uniform(3.0, 8.0))
            if self._jobs_done.is_set():
                break
            if self.running_jobs:
                await self._split_brain(rng)

    async def _split_brain(self, rng: random.Random) -> None:
        stale_port = await asyncio.to_thread(self.cluster.leader, 30.0)
        stale = self.cluster.coordinators[stale_port]
        before = await self._snapshot_latest()
        stale.signal(signal.SIGSTOP)
        try:
            await self._wait_any_checkpoint(before, 30.0)  # a standby took over and completed
            targets = []
            for job_id in list(self.running_jobs):
                with contextlib.suppress(grpc.aio.AioRpcError):
                    stats = await self.client.call(
                        "GetCheckpointStats", cpb.GetCheckpointStatsRequest(job_id=job_id)
                    )
                    details = await self.client.call(
                        "GetCheckpointDetails",
                        cpb.GetCheckpointDetailsRequest(
                            job_id=job_id, checkpoint_id=stats.latest_completed.checkpoint_id
                        ),
                    )
                    tasks = await self.client.call("ListTasks", cpb.ListTasksRequest(job_id=job_id))
                    directory = stats.latest_completed.external_path
                    files = [str(p) for p in Path(directory).glob("*")] if directory else []
                    targets.append((job_id, stats, details, tasks, files))
        finally:
            stale.signal(signal.SIGCONT)
        self.figures.split_brains += 1
        stub = self.client.stub(stale_port)
        for job_id, stats, details, tasks, files in targets:
            latest = stats.latest_completed.checkpoint_id
            for sub in details.subtasks or [None]:
                attempt = sub.attempt if sub is not None else pb.TaskAttempt()
                for checkpoint_id in (latest + 1000, latest, max(1, latest - 1)):
                    ack = cpb.AcknowledgeCheckpointRequest(
                        job_id=job_id,
                        attempt=attempt,
                        checkpoint_id=checkpoint_id,
                        operator_states=[
                            pb.OperatorSubtaskState(
                                operator_id="count",
                                handles=[pb.StateHandle(path=f, size_bytes=1) for f in files],
                            )
                        ],
                    )
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await stub.AcknowledgeCheckpoint(ack, timeout=3)
                    self.figures.stale_acks += 1
            # Stale commands to the live agents: an epoch long superseded.
            for address in {t.address for t in tasks.tasks if t.address}:
                attempts = [t.attempt for t in tasks.tasks]
                commands = [
                    wpb.ControlCommand(sequence=1, cancel=wpb.CancelTaskRequest(
                        job_id=job_id, coordinator_epoch=1, tasks=attempts)),
                    wpb.ControlCommand(sequence=2, complete=wpb.NotifyCheckpointRequest(
                        job_id=job_id, coordinator_epoch=1, checkpoint_id=latest + 1000,
                        tasks=attempts)),
                ]  # fmt: skip
                async with grpc.aio.insecure_channel(address) as channel:
                    control = wgrpc.WorkerControlServiceStub(channel).Control(
                        iter(commands), timeout=3
                    )
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        async for _ in control:  # the refusals
                            pass
                self.figures.stale_agent_commands += len(commands)
            await asyncio.sleep(0.2)  # the stale coordinator's I/O queue would run by now
            directory = stats.latest_completed.external_path
            metadata_still_there = directory and os.path.exists(
                os.path.join(directory, "_metadata")
            )
            if metadata_still_there:  # not retired by the live leader meanwhile
                missing = [f for f in files if not os.path.exists(f)]
                self.figures.stale_deleted_files += len(missing)
                if missing:
                    self.figures.failures.append(f"split brain: {len(missing)} live files deleted")

    # --- hostile messages --------------------------------------------------------------------

    async def _hostile(self) -> None:
        rng = random.Random(self.rng.getrandbits(64))
        total = self.plan.hostile_messages
        batches = 10
        every_kind_sent = False
        loop = asyncio.get_running_loop()
        for batch in range(batches):
            n = total // batches + (1 if batch < total % batches else 0)
            wait_until = loop.time() + rng.uniform(0.5, 2.0)
            while not every_kind_sent and loop.time() < wait_until:
                # Every kind of hostile stream once (of this batch's share), whatever the
                # draws, to an agent that is up, as soon as one is: the jobs of a quick run
                # may all end before a later batch.
                live = await self._agents()
                if live:
                    every_kind_sent = True
                    for kind in EXCHANGE_KINDS[:n]:
                        await self._hostile_stream(rng, live, kind)
                    n -= min(n, len(EXCHANGE_KINDS))
                else:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(max(0.0, wait_until - loop.time()))
            agents = await self._agents()
            # Mostly to the serving leader: a standby refuses every call without decoding it
            # (UNAVAILABLE), so only the leader's request parsing and checks are exercised.
            try:
                leader: int | None = await asyncio.to_thread(self.cluster.leader, 10.0)
            except TimeoutError:
                leader = None
            for _ in range(n):
                await self._one_hostile(rng, agents, leader)

    async def _agents(self) -> dict[str, set[str]]:
        """The live agents of the running jobs: address -> the jobs it hosts. From the run's
        own worker processes, not ``ListTasks``: during a leader takeover or a Redis kill no
        coordinator answers, and on a slow machine that can be a quick job's whole life."""
        agents: dict[str, set[str]] = {}
        for job_id in list(self.running_jobs):
            for tracked in list(self.workers.get(job_id, {}).values()):
                if tracked.address and tracked.alive() and await _reachable(tracked.address):
                    agents.setdefault(tracked.address, set()).add(job_id)
        return agents

    async def _hostile_stream(
        self, rng: random.Random, agents: dict[str, set[str]], kind: str
    ) -> None:
        """A hostile data stream (chaos.hostile.hostile_exchange_stream)."""
        address = rng.choice(sorted(agents))
        payloads = hostile_exchange_stream(kind, rng, sorted(agents[address]))
        async with grpc.aio.insecure_channel(address) as channel:
            await send_stream(channel, kind, payloads, self.hostile)

    async def _one_hostile(
        self, rng: random.Random, agents: dict[str, set[str]], leader: int | None = None
    ) -> None:
        garbage = rng.random() < 0.5
        to_agent = bool(agents) and rng.random() < 0.3
        if to_agent and rng.random() < 0.4:
            await self._hostile_stream(rng, agents, rng.choice(EXCHANGE_KINDS))
            return
        if to_agent:
            address = rng.choice(sorted(agents))
            kind = "garbage" if garbage else rng.choice(CONTROL_COMMANDS)
            payload = (
                rng.randbytes(rng.randrange(1, 200))
                if garbage
                else hostile_control_command(kind, rng).SerializeToString()
            )
            async with grpc.aio.insecure_channel(address) as channel:
                await send_control(channel, kind, payload, self.hostile)
            return
        port = rng.choice(sorted(self.cluster.coordinators))
        if leader is not None and rng.random() < 0.8:
            port = leader
        method = rng.choice(sorted(COORDINATOR_METHODS))
        payload = (
            rng.randbytes(rng.randrange(1, 200))
            if garbage
            else hostile_coordinator_request(
                method, rng, list(self.running_jobs), str(self.cluster.storage)
            ).SerializeToString()
        )
        await send(
            self.client.channel(port), "CoordinatorService", method, payload, self.hostile,
            "coordinator",
        )  # fmt: skip


async def _reachable(address: str) -> bool:
    """Something accepts TCP connections on ``host:port`` right now."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(0.5):
            _, writer = await asyncio.open_connection(host, int(port))
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def write_result(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def summary(result: dict[str, Any]) -> str:
    m = result["metrics"]
    lines = [f"{k}: {m[k]}" for k in sorted(m)]
    if result["failures"]:
        lines.append("failures:")
        lines += [f"  - {f}" for f in result["failures"]]
    return "\n".join(lines)


__all__ = ["Plan", "Run", "summary", "write_result"]

"""``snapflow worker``: a worker agent hosting one slot of a job, and when it exits. It waits
(with back-off) for a coordinator that is not reachable yet; once its tasks finish it waits for
the job to end, because a failover needs every slot's worker again (docs/worker.md). The agent
and its state backends are imported when the command runs."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import grpc
import grpc.aio

from snapflow import wire
from snapflow.cli.client import ADDRESS_ENV, DEFAULT_ADDRESS, security_settings
from snapflow.cli.formatting import job_state
from snapflow.errors import ConfigError
from snapflow.jobgraph import JobState
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc

WORKER_WAIT_S = 300.0
WORKER_BACKOFF_S = (0.2, 5.0)  # first and largest delay between attempts to reach the coordinator


def _rpc_text(error: grpc.RpcError) -> str:
    """``CODE: details`` of a gRPC error, without its debug string (addresses, file names and
    timestamps of the C core, which say nothing to fix)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    return f"{name}: {details or 'no details'}"


async def _wait_for_coordinator(
    stub: cgrpc.CoordinatorServiceAsyncStub, job_id: str, address: str, wait_s: float, log: Any
) -> cpb.JobInfo:
    """The job, once the coordinator answers: retried with exponential back-off (capped at
    ``WORKER_BACKOFF_S[1]``) while it is UNAVAILABLE or does not answer, for ``wait_s``."""

    deadline = time.monotonic() + wait_s
    delay, attempt = WORKER_BACKOFF_S[0], 1
    while True:
        try:
            return await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5.0)
        except grpc.aio.AioRpcError as e:
            retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            left = deadline - time.monotonic()
            if not retry or left <= 0:
                raise
            log.info(
                "worker.waiting_for_coordinator",
                address=address,
                attempt=attempt,
                retry_in_s=round(min(delay, left), 3),
                error=_rpc_text(e),
            )
        await asyncio.sleep(min(delay, max(0.0, left)))
        delay, attempt = min(delay * 2, WORKER_BACKOFF_S[1]), attempt + 1


def cmd_worker(args: argparse.Namespace) -> int:
    from snapflow.logging import configure_logging, get_logger, route_native_stderr
    from snapflow.malloc_tuning import tune_malloc
    from snapflow.worker.runtime.agent import Agent
    from snapflow.worker.runtime.dataplane_settings import DataplaneSettings

    configure_logging(args.log_level, "auto")
    route_native_stderr()
    log = get_logger("snapflow.cli")
    tuned = tune_malloc()
    log.debug("worker.malloc_tuning", applied=tuned.applied, why=tuned.why)
    address = args.coordinator or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
    if not 0 <= args.slot < args.slots:
        print(f"snapflow worker: --slot must be in 0..{args.slots - 1}", file=sys.stderr)
        return 2
    try:
        security = security_settings(args)
    except ConfigError as e:
        print(f"snapflow worker: configuration error: {e}", file=sys.stderr)
        return 2

    target = args.debloat_target_ms
    dataplane = DataplaneSettings(
        task_thread=args.task_thread,
        builtins_on_loop=args.builtins_on_loop,
        adaptive_task_thread=args.adaptive_task_thread,
        **({} if target is None else {"debloat_target_ms": target}),
    )

    async def run() -> int:
        agent = Agent(
            address,
            args.job,
            slot=args.slot,
            num_slots=args.slots,
            host=args.host,
            port=args.port,
            security=security,
            dataplane=dataplane,
        )
        await agent.start()
        try:
            await _wait_for_coordinator(
                agent.stub, args.job, address, args.wait_for_coordinator, log
            )
            await agent.run()
            return await after_tasks_finished(agent.stub, args.job)
        except asyncio.CancelledError:  # CancelTask: the job was canceled or failed over
            return await _after_cancel(agent, args.job)
        except grpc.aio.AioRpcError as e:
            print(f"snapflow worker: {_rpc_text(e)}", file=sys.stderr)
            if e.code() is grpc.StatusCode.UNAVAILABLE:
                print(f"hint: is the coordinator running at {address}?", file=sys.stderr)
            return 1
        except Exception as e:
            print(f"snapflow worker: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            await agent.stop()

    return asyncio.run(run())


FINISHED_POLL_S = 0.2
FINISHED_UNREACHABLE_S = 60.0


async def after_tasks_finished(
    stub: Any,
    job_id: str,
    poll_s: float = FINISHED_POLL_S,
    unreachable_s: float = FINISHED_UNREACHABLE_S,
) -> int:
    """Exit code once this worker's tasks finished. The job may still fail over (a task of
    another worker fails before the job ends), and a restarted job needs every slot's worker
    again, this one too: so wait for the job to end. 0 when it finished or was canceled; 1 when
    it failed, or waits for its workers (``RESTARTING`` or ``CREATED``: start the workers
    again), or the coordinator stayed unreachable for ``unreachable_s``."""
    unreachable_since: float | None = None
    while True:
        try:
            job = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5.0)
        except grpc.aio.AioRpcError as e:
            retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            now = time.monotonic()
            unreachable_since = unreachable_since if unreachable_since is not None else now
            if not retry or now - unreachable_since >= unreachable_s:
                print(
                    f"snapflow worker: this worker's tasks finished; the job's state is unknown "
                    f"({_rpc_text(e)})",
                    file=sys.stderr,
                )
                return 1
            await asyncio.sleep(poll_s)
            continue
        unreachable_since = None
        state = wire.JOB_STATE.from_pb_or(job.state, None)
        if state in (JobState.FINISHED, JobState.CANCELED):
            return 0
        if state in (JobState.RESTARTING, JobState.CREATED, JobState.FAILED):
            print(
                f"snapflow worker: this worker's tasks finished, then job {job_id} became "
                f"{job_state(job.state)}"
                + ("" if state is JobState.FAILED else " (a failover: start the workers again)"),
                file=sys.stderr,
            )
            return 1
        await asyncio.sleep(poll_s)


async def _after_cancel(agent: Any, job_id: str) -> int:
    """Exit code after the coordinator canceled this worker's tasks: 0 when the job was
    canceled (or has ended), 1 when they were canceled for a failover (the job restarts and
    needs its workers again)."""
    try:
        job = await agent.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5.0)
    except grpc.aio.AioRpcError as e:
        print(
            f"snapflow worker: the tasks were canceled; the job's state is unknown "
            f"({_rpc_text(e)})",
            file=sys.stderr,
        )
        return 1
    state = job_state(job.state)
    if wire.JOB_STATE.from_pb_or(job.state, None) in (JobState.CANCELED, JobState.FINISHED):
        print(f"snapflow worker: job {job_id} is {state}; its tasks here stopped")
        return 0
    print(
        f"snapflow worker: the coordinator canceled the tasks; job {job_id} is {state}"
        + (" (a failover: start the workers again)" if state == "RESTARTING" else ""),
        file=sys.stderr,
    )
    return 1

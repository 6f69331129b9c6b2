"""Liveness and fencing of worker agents: heartbeats, re-registration, epoch checks, parsing.

* garbage bytes to every worker RPC are INVALID_ARGUMENT;
* a forged NotifyCheckpointAborted with epoch 2^62 changes nothing: the job still checkpoints;
* a killed sole `snapflow worker` fails its deployment by heartbeat timeout; a new worker
  finishes the job exactly once;
* after the coordinator is killed (SIGKILL) and restarted on the same Redis and port, the old
  worker processes register again and the job finishes exactly once, no worker restarted.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from kit.coordinator import running_coordinator, wait_checkpoints_completed, wait_job_state
from kit.polling import wait_until_async
from kit.processes import CoordinatorProcess, Processes, start_worker
from kit.workers import check_exactly_once, count_graph, expected_counts, submit_graph

from snapflow.redis_server import RedisServer
from snapflow.security import PLAINTEXT
from snapflow.tls import aio_channel
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.agent import Agent

GARBAGE = b"\xff\xff\xff\xff"  # a truncated varint: no message type decodes it
FAST_HEARTBEATS: dict[str, Any] = {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.5}


def _source(records: int = 300_000, rate: int = 100_000) -> GeneratorSource:
    return GeneratorSource(
        total_records=records, rate_per_s=rate, num_keys=300, batch_size=2048, seed=11
    )


# --- request parsing and epochs ----------------------------------------------------------------


async def control(address: str, commands: list[wpb.ControlCommand]) -> list[wpb.ControlReply]:
    """Send ``commands`` on one ``Control`` stream, close it, and return the agent's replies."""
    async with aio_channel(address, PLAINTEXT) as channel:
        call = wgrpc.WorkerControlServiceStub(channel).Control(iter(commands), timeout=5)
        return [reply async for reply in call]


def test_garbage_bytes_to_every_worker_rpc_are_invalid_argument() -> None:
    async def main() -> None:
        agent = Agent("127.0.0.1:1", "0" * 32)  # never deploys: no coordinator needed
        await agent.start()
        try:
            async with aio_channel(agent.address, PLAINTEXT) as channel:
                for name in ("WorkerControlService", "DataExchangeService"):
                    service = wpb.DESCRIPTOR.services_by_name[name]
                    for method in service.methods:
                        path = f"/{service.full_name}/{method.name}"
                        try:
                            if method.client_streaming:
                                call: Any = channel.stream_stream(path)(
                                    iter([GARBAGE]),  # type: ignore[arg-type]
                                    timeout=5,
                                )
                                async for _ in call:
                                    pass
                            else:
                                await channel.unary_unary(path)(GARBAGE, timeout=5)  # type: ignore[arg-type]
                        except grpc.aio.AioRpcError as e:
                            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT, (path, e)
                            assert "malformed request" in (e.details() or ""), path
                        else:
                            raise AssertionError(f"{path} accepted garbage")
            assert agent.epoch == 0
        finally:
            await agent.stop()

    asyncio.run(main())


def test_forged_notice_with_a_huge_epoch_changes_nothing(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    source = _source(200_000, 50_000)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(out)))
            job_id = await submit_graph(c.stub, graph, pb.CheckpointConfig(interval_ms=100))
            agents = [Agent(c.address, job_id, slot=s, num_slots=2) for s in range(2)]
            for agent in agents:
                await agent.start()
            run = asyncio.gather(*(a.run() for a in agents))
            try:
                seen = await wait_checkpoints_completed(c.stub, job_id, 1)
                epochs = [a.epoch for a in agents]
                assert all(epochs)
                real = next(iter(agents[0].hosted.values())).attempt
                forged = [
                    # another job, no tasks
                    wpb.NotifyCheckpointRequest(
                        job_id="f" * 32, coordinator_epoch=2**62, checkpoint_id=1
                    ),
                    # this job, a task attempt the agent does not run
                    wpb.NotifyCheckpointRequest(
                        job_id=job_id,
                        coordinator_epoch=2**62,
                        checkpoint_id=1,
                        tasks=[pb.TaskAttempt(vertex_id=real.vertex_id, attempt=99)],
                    ),
                ]
                commands = [wpb.ControlCommand(sequence=5)]  # no command at all
                commands += [
                    wpb.ControlCommand(sequence=6 + i, abort=r) for i, r in enumerate(forged)
                ]
                for agent in agents:
                    # One stream: a refused command is answered and the stream stays open.
                    replies = await control(agent.address, commands)
                    assert [(r.sequence, r.code) for r in replies] == [
                        (5, grpc.StatusCode.INVALID_ARGUMENT.value[0]),
                        (6, grpc.StatusCode.FAILED_PRECONDITION.value[0]),
                        (7, grpc.StatusCode.FAILED_PRECONDITION.value[0]),
                    ]
                    assert "needs one of trigger" in replies[0].message
                    assert "is not hosted by this agent" in replies[1].message
                    assert "names tasks this agent does not run" in replies[2].message
                assert [a.epoch for a in agents] == epochs
                # The real coordinator's triggers and notices are still obeyed.
                await wait_checkpoints_completed(c.stub, job_id, seen + 2)
                async with asyncio.timeout(60):
                    await run
            finally:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                for agent in agents:
                    await agent.stop()

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))


def test_a_trigger_naming_a_task_that_is_not_a_source_is_invalid_argument(
    redis_url: str, tmp_path: Path
) -> None:
    """Barriers reach the other tasks on their inputs: a trigger for one is refused, names the
    task, and changes nothing (the job still checkpoints and finishes exactly once)."""
    out = tmp_path / "out"
    source = _source(200_000, 50_000)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(out)))
            job_id = await submit_graph(c.stub, graph, pb.CheckpointConfig(interval_ms=100))
            agent = Agent(c.address, job_id)
            await agent.start()
            run = asyncio.ensure_future(agent.run())
            try:
                seen = await wait_checkpoints_completed(c.stub, job_id, 1)
                count = next(
                    h.attempt for h in agent.hosted.values() if h.attempt.vertex_id == "count"
                )
                request = wpb.TriggerTaskCheckpointRequest(
                    job_id=job_id,
                    coordinator_epoch=agent.epoch,
                    tasks=[count],
                    checkpoint_id=10_000,
                    timestamp_ms=1,
                    options=pb.CheckpointOptions(target_location=str(tmp_path / "forged")),
                )
                [reply] = await control(
                    agent.address, [wpb.ControlCommand(sequence=1, trigger=request)]
                )
                assert reply.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
                assert "source tasks only; not sources: count#" in reply.message
                await wait_checkpoints_completed(c.stub, job_id, seen + 2)
                async with asyncio.timeout(60):
                    await run
            finally:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                await agent.stop()

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))


# --- heartbeats and re-registration (processes) ----------------------------------------------


@pytest.mark.slow
def test_killed_sole_worker_fails_by_heartbeat_timeout_and_a_new_one_finishes(
    redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    source = _source()

    async def main() -> None:
        async with running_coordinator(
            redis_url, str(tmp_path / "cp"), PLAINTEXT, **FAST_HEARTBEATS
        ) as c:
            graph = count_graph(
                source, KeyedCount("key"), TransactionalFileSink(str(out)), parallelism=2
            )
            config = pb.CheckpointConfig(interval_ms=150, tolerable_failures=5)
            job_id = await submit_graph(c.stub, graph, config)
            with Processes() as procs:
                first = procs.add(start_worker(c.address, job_id, 0, 1, tmp_path / "w1.log"))
                await wait_job_state(c.stub, job_id, {pb.JOB_STATE_RUNNING}, procs=[first])
                await wait_checkpoints_completed(c.stub, job_id, 1)
                first.send_signal(signal.SIGKILL)
                assert await asyncio.to_thread(first.wait, 10) == -signal.SIGKILL
                # Nothing else reports: only the missed heartbeats can end the deployment.
                await wait_job_state(c.stub, job_id, {pb.JOB_STATE_RESTARTING}, timeout_s=30)
                tasks = (
                    await c.stub.ListTasks(cpb.ListTasksRequest(job_id=job_id), timeout=5)
                ).tasks
                failures = [t.failure for t in tasks if t.state == pb.TASK_STATE_FAILED]
                assert failures and all(
                    f.startswith("heartbeat timeout of agent 127.0.0.1:") for f in failures
                ), failures
                second = procs.add(start_worker(c.address, job_id, 0, 1, tmp_path / "w2.log"))
                await wait_job_state(c.stub, job_id, {pb.JOB_STATE_FINISHED}, timeout_s=90)
                assert await asyncio.to_thread(second.wait, 30) == 0
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.restarts == 1

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))


@pytest.mark.slow
@pytest.mark.parametrize(
    "down_until",
    [
        # restarted at once: the workers see the new epoch in a heartbeat answer
        pytest.param("", id="new-epoch"),
        # restarted after the workers noticed the loss (heartbeats failed past the timeout)
        pytest.param("coordinator lost", id="coordinator-lost"),
    ],
)
def test_live_workers_register_again_after_a_coordinator_restart(
    redis_server: RedisServer, tmp_path: Path, down_until: str
) -> None:
    out = tmp_path / "out"
    source = _source(300_000, 60_000)
    namespace = f"restart-{uuid.uuid4().hex[:8]}"
    settings = {k: str(v) for k, v in FAST_HEARTBEATS.items()}

    def coordinator(tag: str, port: int = 0) -> CoordinatorProcess:
        return CoordinatorProcess.start(
            redis_server.url,
            namespace,
            tmp_path / "cp",
            tmp_path / f"coordinator-{tag}.log",
            port=port,
            **settings,
        )

    async def main() -> None:
        first = coordinator("first")
        second: CoordinatorProcess | None = None
        try:
            channel = aio_channel(first.address, PLAINTEXT)
            stub = cgrpc.CoordinatorServiceStub(channel)
            try:
                with Processes() as procs:
                    job_id = await _submit_when_up(stub, source, out)
                    workers = [
                        procs.add(start_worker(first.address, job_id, s, 2, tmp_path / f"w{s}.log"))
                        for s in range(2)
                    ]
                    await wait_job_state(stub, job_id, {pb.JOB_STATE_RUNNING}, procs=workers)
                    await wait_checkpoints_completed(stub, job_id, 1)
                    first.kill()
                    if down_until:

                        def noticed() -> bool:
                            logs = [(tmp_path / f"w{s}.log").read_text() for s in range(2)]
                            return all(down_until in log for log in logs)

                        await wait_until_async(
                            noticed, down_until, timeout_s=30, interval_s=0.1, procs=workers
                        )
                    second = coordinator("second", first.port)
                    await wait_job_state(
                        stub, job_id, {pb.JOB_STATE_FINISHED}, timeout_s=120, procs=workers
                    )
                    codes = [await asyncio.to_thread(w.wait, 30) for w in workers]
                    assert codes == [0, 0]
                info = await stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
                assert info.restarts >= 1
                logs = "".join((tmp_path / f"w{s}.log").read_text() for s in range(2))
                assert "agent.reregistering" in logs
            finally:
                await channel.close()
        finally:
            first.kill()
            if second is not None:
                assert second.stop() == 0

    asyncio.run(main())
    check_exactly_once(read_committed(out), expected_counts(source, 2))


async def _submit_when_up(
    stub: cgrpc.CoordinatorServiceAsyncStub, source: GeneratorSource, out: Path
) -> str:
    graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(out)))
    config = pb.CheckpointConfig(interval_ms=150, tolerable_failures=5)

    async def submitted() -> str | None:
        try:
            return await submit_graph(stub, graph, config)
        except grpc.aio.AioRpcError as e:
            if e.code() is grpc.StatusCode.UNAVAILABLE:
                return None  # not serving yet
            raise

    return str(await wait_until_async(submitted, "the job submitted", timeout_s=30, interval_s=0.1))

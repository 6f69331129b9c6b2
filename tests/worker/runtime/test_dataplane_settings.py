"""The data-plane settings (buffer-debloat target, task thread) reach every subtask and output
channel an agent deploys, from the Agent, from ``snapflow worker`` flags and from the Spark
bridge's run options; bad values are refused with a message saying what to fix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kit.coordinator import running_coordinator
from kit.polling import wait_until_async
from kit.workers import check_exactly_once, count_graph, expected_counts, submit_graph

from snapflow.cli.parser import build_parser
from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge.executor import SlotConfig, _agent
from snapflow.spark_bridge.run_options import RunOptions
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.agent import Agent
from snapflow.worker.runtime.dataplane_settings import DataplaneSettings
from snapflow.worker.runtime.debloat import DEFAULT_TARGET_MS, DebloatSettings
from snapflow.worker.runtime.remote_output_channel import RemoteOutputChannel

RECORDS = 100_000


def _source() -> GeneratorSource:
    return GeneratorSource(
        total_records=RECORDS, rate_per_s=200_000, num_keys=200, batch_size=2048, seed=5
    )


@pytest.mark.parametrize(
    "settings",
    [
        DataplaneSettings(debloat_target_ms=40),
        DataplaneSettings(builtins_on_loop=False),
        DataplaneSettings(task_thread=False),
        DataplaneSettings(task_thread=False, adaptive_task_thread=False),
    ],
)
def test_settings_reach_every_subtask_and_output_channel(
    redis_url: str, tmp_path: Path, settings: DataplaneSettings
) -> None:
    """Two agents (one local and one gRPC channel per source subtask): every subtask runs its
    operators where the settings say, every output channel debloats with their target, and the
    job is exactly once."""
    out = tmp_path / "out"
    seen: dict[str, tuple[tuple[bool, bool], list[tuple[str, int]]]] = {}

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            graph = count_graph(_source(), KeyedCount("key"), TransactionalFileSink(str(out)))
            job_id = await submit_graph(c.stub, graph, pb.CheckpointConfig(interval_ms=100))
            agents = [
                Agent(c.address, job_id, slot=s, num_slots=2, dataplane=settings) for s in range(2)
            ]
            for a in agents:
                await a.start()
            try:
                runs = [asyncio.create_task(a.run()) for a in agents]
                await wait_until_async(
                    lambda: all(
                        len(a.hosted) == 2 and all(h.task for h in a.hosted.values())
                        for a in agents
                    ),
                    "every subtask deployed",
                    timeout_s=30,
                )
                for a in agents:
                    for hosted in a.hosted.values():
                        task = hosted.task
                        assert task is not None
                        seen[task.name] = (
                            (task.task_thread, task.adaptive),
                            [
                                (type(ch).__name__, ch.debloater.settings.target_ms)
                                for edge in task.outputs
                                for ch in edge.channels
                            ],
                        )
                async with asyncio.timeout(60):
                    await asyncio.gather(*runs)
            finally:
                for a in agents:
                    await a.stop()
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED

    asyncio.run(main())
    assert len(seen) == 4
    # where each subtask starts (read right after deployment): on a thread with task_thread,
    # unless all its operators are built-ins that run on the loop (the generator source; the
    # count's chain ends in the file sink, which does I/O); on the loop, adaptive unless
    # turned off
    for name, (where, _) in seen.items():
        builtins = name.startswith("source")
        on_thread = settings.task_thread and not (settings.builtins_on_loop and builtins)
        assert where == (on_thread, settings.adaptive_task_thread and not on_thread), name
    outputs = [ch for name, (_, chs) in seen.items() if name.startswith("source") for ch in chs]
    # each source subtask feeds the count subtask in its own agent and the one in the other
    assert sorted(kind for kind, _ in outputs) == sorted(
        ["LocalOutputChannel", RemoteOutputChannel.__name__] * 2
    )
    assert {target for _, target in outputs} == {settings.debloat_target_ms}
    check_exactly_once(read_committed(out), expected_counts(_source(), 2))


def test_defaults_and_bad_values() -> None:
    assert DataplaneSettings().debloat == DebloatSettings()
    assert DataplaneSettings().debloat_target_ms == DEFAULT_TARGET_MS
    assert DataplaneSettings().task_thread  # Flink's model: user code on the task thread
    assert DataplaneSettings(debloat_target_ms=0).debloat.enabled is False
    for bad in (-1, 1.5, True, "100"):
        with pytest.raises(InvalidArgumentError, match="debloat_target_ms must be an integer"):
            DataplaneSettings(debloat_target_ms=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="task_thread must be a bool"):
        DataplaneSettings(task_thread=1)  # type: ignore[arg-type]
    assert DataplaneSettings().builtins_on_loop
    with pytest.raises(InvalidArgumentError, match="builtins_on_loop must be a bool"):
        DataplaneSettings(builtins_on_loop=0)  # type: ignore[arg-type]
    assert DataplaneSettings().adaptive_task_thread
    with pytest.raises(InvalidArgumentError, match="adaptive_task_thread must be a bool"):
        DataplaneSettings(adaptive_task_thread="no")  # type: ignore[arg-type]


def test_worker_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["worker", "--job", "j"])
    assert args.debloat_target_ms is None and args.task_thread is True
    assert args.task_thread is DataplaneSettings().task_thread  # the flag's default is the agent's
    args = parser.parse_args(["worker", "--job", "j", "--debloat-target-ms", "0", "--task-thread"])
    assert args.debloat_target_ms == 0 and args.task_thread is True
    assert args.adaptive_task_thread is True
    assert args.builtins_on_loop is DataplaneSettings().builtins_on_loop is True
    args = parser.parse_args(["worker", "--job", "j", "--no-task-thread"])
    assert args.task_thread is False
    args = parser.parse_args(["worker", "--job", "j", "--no-builtins-on-loop"])
    assert args.builtins_on_loop is False
    args = parser.parse_args(["worker", "--job", "j", "--no-adaptive-task-thread"])
    assert args.adaptive_task_thread is False
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--job", "j", "--debloat-target-ms", "-5"])


def test_spark_run_options_reach_the_slot_agents() -> None:
    """RunOptions -> SlotConfig (what the driver pickles for the executors) -> Agent."""
    config = SlotConfig(
        coordinator_address="127.0.0.1:1",
        job_id="0" * 32,
        num_slots=2,
        agent_host=None,
        source_batch_records=1024,
        log_level="warning",
        startup_barrier=False,
        debloat_target_ms=25,
        task_thread=False,
        builtins_on_loop=False,
        adaptive_task_thread=False,
    )
    agent = _agent(config, 1, "127.0.0.1")
    assert agent.dataplane == DataplaneSettings(
        debloat_target_ms=25, task_thread=False, builtins_on_loop=False, adaptive_task_thread=False
    )
    default = _agent(SlotConfig("127.0.0.1:1", "0" * 32, 2, None, 1024, "warning", False), 0, "h")
    assert default.dataplane == DataplaneSettings()
    assert RunOptions().debloat_target_ms is None and RunOptions().task_thread is True
    with pytest.raises(InvalidArgumentError, match="debloat_target_ms"):
        RunOptions(debloat_target_ms=-1)
    with pytest.raises(InvalidArgumentError, match="task_thread"):
        RunOptions(task_thread="yes")  # type: ignore[arg-type]
    assert RunOptions().builtins_on_loop is True
    with pytest.raises(InvalidArgumentError, match="builtins_on_loop"):
        RunOptions(builtins_on_loop=1)  # type: ignore[arg-type]
    assert RunOptions().adaptive_task_thread is True
    with pytest.raises(InvalidArgumentError, match="adaptive_task_thread"):
        RunOptions(adaptive_task_thread=None)  # type: ignore[arg-type]

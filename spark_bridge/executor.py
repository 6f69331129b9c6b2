"""What runs on the Spark executors: one barrier-stage task hosts one slot's worker agent.

:func:`run_slot` is the partition function of the job's barrier stage. Slot ``i`` runs an
:class:`snapflow.worker.runtime.agent.Agent` that hosts subtask ``j`` of every vertex where
``j % num_slots == i`` (slot sharing). Address exchange and checkpoints go through the
coordinator; ``BarrierTaskContext.barrier()`` is called at most once, at start-up, and only with
``startup_barrier=True`` (it polls about once a second). Nothing here imports the driver side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from snapflow.security import PLAINTEXT, SecuritySettings

if TYPE_CHECKING:
    from snapflow.worker.runtime.agent import Agent


@dataclass(frozen=True)
class SlotConfig:
    """What a Spark task needs to run its slot's agent: plain data, pickled into the closure."""

    coordinator_address: str
    job_id: str
    num_slots: int
    agent_host: str | None
    source_batch_records: int
    log_level: str
    startup_barrier: bool
    security: SecuritySettings = PLAINTEXT
    debloat_target_ms: int | None = None
    """The agents' buffer-debloat target (``DataplaneSettings``); None: the agent's default."""
    task_thread: bool = True
    """Operators on a task thread of their own (``DataplaneSettings.task_thread``)."""
    builtins_on_loop: bool = True
    """Subtasks of built-in operators only stay on the loop (``DataplaneSettings``)."""
    adaptive_task_thread: bool = True
    """Operators that block move to a task thread (``DataplaneSettings.adaptive_task_thread``)."""
    launch: int = 0
    """The driver's stage submission number (1, 2, ...): the coordinator refuses the agents of
    a submission older than the deployment's (``Agent(launch=...)``)."""


def _host_of(address: str) -> str:
    """``host:port`` or ``[v6]:port`` -> host."""
    if address.startswith("["):
        return address[1 : address.index("]")]
    return address.rsplit(":", 1)[0] if ":" in address else address


def _agent(config: SlotConfig, slot: int, host: str) -> Agent:
    """The slot's agent, with the run's settings."""
    from snapflow.worker.runtime.agent import Agent
    from snapflow.worker.runtime.dataplane_settings import DataplaneSettings

    dataplane = DataplaneSettings(
        task_thread=config.task_thread,
        builtins_on_loop=config.builtins_on_loop,
        adaptive_task_thread=config.adaptive_task_thread,
    )
    if config.debloat_target_ms is not None:
        dataplane = dataclasses.replace(dataplane, debloat_target_ms=config.debloat_target_ms)
    return Agent(
        config.coordinator_address,
        config.job_id,
        slot=slot,
        num_slots=config.num_slots,
        host=host,
        source_batch_records=config.source_batch_records,
        security=config.security,
        dataplane=dataplane,
        launch=config.launch,
    )


async def _run_agent(config: SlotConfig, slot: int, host: str) -> str:
    agent = _agent(config, slot, host)
    await agent.start()
    try:
        await agent.run()
        return "finished"
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this coroutine itself was cancelled, not the subtasks
        # The coordinator cancelled this slot's subtasks: the job was cancelled, or another
        # slot failed (the driver learns which from the coordinator).
        return "canceled"
    finally:
        await agent.stop()


def run_slot(config: SlotConfig, partition: Iterable[int]) -> Iterator[dict[str, Any]]:
    """The barrier stage's partition function: run slot ``partitionId()``'s agent until its
    subtasks end; yield one small summary. Raises if a subtask failed (which fails the stage)."""
    from pyspark import BarrierTaskContext

    from snapflow.logging import configure_logging
    from snapflow.malloc_tuning import tune_malloc

    for _ in partition:  # one element per partition; consuming it keeps Spark's contract
        pass
    ctx = BarrierTaskContext.get()
    slot = ctx.partitionId()
    if config.startup_barrier:
        ctx.barrier()  # once: every slot is launched before any registers
    host = config.agent_host or _host_of(ctx.getTaskInfos()[slot].address)
    configure_logging(config.log_level, "json")
    tune_malloc()  # this Python worker process now hosts an agent (snapflow/malloc_tuning.py)
    started = time.monotonic()
    status = asyncio.run(_run_agent(config, slot, host))
    yield {
        "slot": slot,
        "status": status,
        "host": host,
        "pid": os.getpid(),
        "stage_id": ctx.stageId(),
        "duration_s": round(time.monotonic() - started, 3),
    }

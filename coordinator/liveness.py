"""Liveness of the agents hosting one job's tasks: heartbeats in, a silent agent's tasks failed.

Each agent of the live deployment is watched from the registration of its first task (a new
deployment forgets the agents of the last one). A heartbeat counts only if every attempt it names
is current here, on that agent, and not failed or canceled. An agent silent for longer than
``heartbeat_timeout_s`` fails its unfinished tasks, and the deployment fails over as for a
reported failure (as Flink's JobMaster fails the tasks of a TaskExecutor whose heartbeat timed
out). A deployment that already failed, and an ended job, are not watched.

Time is injected (``monotonic``); :meth:`LivenessMonitor.check` is one pass of the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from snapflow.coordinator.config import CoordinatorSettings
from snapflow.coordinator.execution import JobExecution
from snapflow.coordinator.model import ExecutionAttempt
from snapflow.errors import SnapflowError
from snapflow.jobgraph import TaskState

#: Reports a task's new state to the job (``JobRunner.update_task_state``).
UpdateTaskState = Callable[[ExecutionAttempt, TaskState, str], Awaitable[None]]


class LivenessMonitor:
    """Last heartbeat of each agent of the live deployment, and the loop that fails silent ones."""

    def __init__(
        self,
        execution: JobExecution,
        settings: CoordinatorSettings,
        update_task_state: UpdateTaskState,
        log: Any,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._execution = execution
        self._settings = settings
        self._update_task_state = update_task_state
        self._log = log
        self._monotonic = monotonic
        self._last_heard: dict[str, float] = {}
        """Agent address -> monotonic time of its registration or last heartbeat."""

    def deployment_started(self) -> None:
        self._last_heard.clear()  # only the agents of this deployment are watched

    def task_registered(self, address: str) -> None:
        self._last_heard[address] = self._monotonic()  # monitored from its registration

    def heartbeat(self, address: str, attempts: list[ExecutionAttempt]) -> bool:
        """An agent's heartbeat; whether every attempt it names is current and live here."""
        current = all(self._is_live(a, address) for a in attempts)
        if current and attempts:
            self._last_heard[address] = self._monotonic()
        return current

    def _is_live(self, attempt: ExecutionAttempt, address: str) -> bool:
        record = self._execution.tasks.get(attempt.key)
        # FINISHED counts: its report may overtake the heartbeat that still names it.
        return (
            record is not None
            and record.attempt == attempt
            and record.address == address
            and record.state not in (TaskState.FAILED, TaskState.CANCELED)
        )

    def silent_agents(self, now: float) -> dict[str, list[ExecutionAttempt]]:
        """Agents of the live deployment silent for longer than the heartbeat timeout, with
        their unfinished attempts. A deployment that already failed is not watched."""
        tasks = self._execution.tasks.values()
        if self._execution.state.is_terminal or any(
            t.state in (TaskState.FAILED, TaskState.CANCELED) for t in tasks
        ):
            return {}
        timeout = self._settings.heartbeat_timeout_s
        silent: dict[str, list[ExecutionAttempt]] = {}
        for t in tasks:
            if t.state is TaskState.FINISHED:
                continue
            last = self._last_heard.setdefault(t.address, now)
            if now - last > timeout:
                silent.setdefault(t.address, []).append(t.attempt)
        return silent

    async def check(self) -> None:
        """One pass: the tasks of every silent agent fail (the first fails the deployment)."""
        now = self._monotonic()
        for address, attempts in self.silent_agents(now).items():
            silent_s = now - self._last_heard.get(address, now)
            reason = (
                f"heartbeat timeout of agent {address}: no heartbeat for {silent_s:.1f} s "
                f"(heartbeat_timeout_s {self._settings.heartbeat_timeout_s:g})"
            )
            self._last_heard.pop(address, None)
            for attempt in sorted(attempts):
                try:
                    await self._update_task_state(attempt, TaskState.FAILED, reason)
                except SnapflowError as e:
                    self._log.warning(
                        "task.heartbeat_failure_not_recorded",
                        task=str(attempt),
                        error=str(e)[:300],
                    )

    async def run(self, stopped: Callable[[], bool]) -> None:
        """Check every ``min(heartbeat_interval_s, heartbeat_timeout_s / 4)`` until ``stopped``."""
        settings = self._settings
        period = min(settings.heartbeat_interval_s, settings.heartbeat_timeout_s / 4)
        while not stopped():
            await asyncio.sleep(period)
            await self.check()

"""The shell around a subtask's lifecycle: it feeds ``TaskLifecycle`` its events and executes
the actions that come back (``snapflow.worker.runtime.task_lifecycle``), and holds what the
task's loops share: where operators run, the chain, the state, the output, the checkpoints.

``changed`` is set after every event, so a loop that waits for the lifecycle to move on (a
completed checkpoint, a settled snapshot) clears it, checks, and waits on it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from snapflow.event_time import MAX_WATERMARK, MIN_WATERMARK
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.frames import EndOfDataFrame, WatermarkFrame, WatermarkStatusFrame
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.operator_runner import OperatorRunner
from snapflow.worker.runtime.subtask_checkpoints import (
    AckFn,
    DeclineFn,
    SubtaskCheckpoints,
    now_ms,
)
from snapflow.worker.runtime.task_lifecycle import (
    Action,
    CloseOperators,
    DataEnded,
    DeclineTrigger,
    EndData,
    EndInput,
    Event,
    NotifyAborted,
    NotifyComplete,
    OperatorsClosed,
    RequestFinalCheckpoint,
    TakeSnapshot,
    TaskLifecycle,
)
from snapflow.worker.runtime.task_output import TaskOutput
from snapflow.worker.runtime.task_state import TaskState, close_and_dispose

SOURCE_REPORT_WAIT_S = 1.0
"""How long an ended source waits for its end-of-data report to reach the coordinator before
it emits the maximum watermark anyway."""


class TaskShell:
    """Executes one subtask's lifecycle actions."""

    def __init__(
        self,
        *,
        name: str,
        snapshot_dir: str,
        log: structlog.stdlib.BoundLogger,
        lifecycle: TaskLifecycle,
        runner: OperatorRunner,
        state: TaskState,
        operators: Sequence[Operator],
        chain: Chain,
        output: TaskOutput,
        ack: AckFn,
        decline: DeclineFn,
        request_final_checkpoint: Callable[[], Awaitable[None]] | None,
        report_data_ended: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self.lifecycle = lifecycle
        self.runner = runner
        self.state = state
        self.operators = list(operators)
        self.chain = chain
        self.output = output
        self.checkpoints = SubtaskCheckpoints(
            name=name,
            snapshot_dir=snapshot_dir,
            log=log,
            output=output,
            runner=runner,
            state=state,
            operators=operators,
            has_inputs=not lifecycle.is_source,
            ack=ack,
            decline=decline,
            lifecycle=self.feed,
        )
        self._request_final_checkpoint = request_final_checkpoint
        self._requester: asyncio.Future[None] | None = None
        self._report_data_ended = report_data_ended
        self._data_ended_report: asyncio.Future[None] | None = None
        self.changed = asyncio.Event()
        self.records_in = 0
        self.watermark = MIN_WATERMARK
        """The event time this task emitted last."""
        self.idle = False
        """The watermark status this task announced last (Flink's ``WatermarkStatus``)."""

    def feed(self, event: Event) -> None:
        """An event from outside the task's loops (a notice, a settled snapshot): only actions
        that run at once may come back."""
        actions = self.lifecycle.handle(event)
        self.changed.set()
        for action in actions:
            if not self._execute_now(action):
                raise AssertionError(f"{action!r} cannot run outside the task's loop")

    async def handle(self, event: Event) -> None:
        """An event of the task's loops: its actions run in order."""
        actions = self.lifecycle.handle(event)
        self.changed.set()
        await self.execute(actions)

    async def execute(self, actions: list[Action]) -> None:
        for action in actions:
            if self._execute_now(action):
                continue
            match action:
                case EndInput(input_index=index):
                    await self.output.emit(await self.runner.call(self.chain.end_of_input, index))
                case EndData(run_end_input=run_end_input):
                    await self._end_data(run_end_input)
                case TakeSnapshot():
                    await self.checkpoints.take_snapshot(action, self.records_in)
                case DeclineTrigger(checkpoint_id=cid, message=message):
                    await self.checkpoints.decline_trigger(cid, message)
                case RequestFinalCheckpoint():
                    if self._request_final_checkpoint is not None:
                        self._requester = asyncio.ensure_future(self._request_final_checkpoint())
                case CloseOperators():
                    backends = list(self.state.keyed.values())
                    await self.runner.close(
                        functools.partial(close_and_dispose, self.operators, backends)
                    )
                    await self.handle(OperatorsClosed())
                case _:
                    raise TypeError(f"unknown lifecycle action: {action!r}")

    def _execute_now(self, action: Action) -> bool:
        """Notices: posted to the operators (they run between two calls)."""
        match action:
            case NotifyComplete(checkpoint_id=cid):
                self.runner.post(_notify_complete, self.operators, cid)
                for backend in self.state.keyed.values():
                    # incremental backends reuse the completed checkpoint's files from now on
                    self.runner.post(backend.notify_checkpoint_complete, cid)
                return True
            case NotifyAborted(checkpoint_id=cid):
                self.runner.post(_notify_aborted, self.operators, cid)
                return True
        return False

    def stop_requesting(self) -> None:
        """The final checkpoint came (or the task ends): stop asking for it, and stop
        reporting the end of data."""
        if self._requester is not None:
            self._requester.cancel()
        if self._data_ended_report is not None:
            self._data_ended_report.cancel()

    async def wait_changed(self, *also: asyncio.Future[Any]) -> None:
        """Wait until the next event (``changed`` must have been cleared before the caller
        checked what it waits for), or until one of ``also`` is done."""
        changed = asyncio.ensure_future(self.changed.wait())
        waits: list[asyncio.Future[Any]] = [changed, *also]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()

    async def advance_watermark(self, watermark: int) -> None:
        """The task's event time moves to ``watermark``: timers fire, and the watermark goes
        downstream behind their output."""
        await self.mark_idle(False)  # a watermark is never sent while idle (Flink's order)
        self.watermark = watermark
        await self.output.emit(await self.runner.call(self.chain.process_watermark, watermark))
        await self.output.broadcast(WatermarkFrame(watermark))

    async def mark_idle(self, idle: bool) -> None:
        """Announce the task idle (or active again) downstream, if that changes its status."""
        if idle != self.idle:
            self.idle = idle
            await self.output.broadcast(WatermarkStatusFrame(idle))

    async def fire_processing_time(self, now_ms: int) -> None:
        """Processing time reached ``now_ms``: the operators' due processing-time timers fire,
        their output goes downstream."""
        await self.output.emit(await self.runner.call(self.chain.process_processing_time, now_ms))

    async def _end_data(self, run_end_input: bool) -> None:
        """The input ended: flush the chain (``end_input``, unless it ran before the restored
        snapshot), a source emits the maximum watermark, then end of data goes on every output
        channel, ahead of the final checkpoint's barrier."""
        if run_end_input:
            await self.output.emit(await self.runner.call(self.chain.end_input))
        if self.lifecycle.is_source and self.watermark < MAX_WATERMARK:
            # A source reports before the maximum watermark leaves: the timers it makes due
            # downstream may take seconds, and a checkpoint the coordinator triggers before it
            # knows would wait behind them. The report is short; it is not waited for long.
            report = self._start_data_ended_report()
            if report is not None:
                await asyncio.wait({report}, timeout=SOURCE_REPORT_WAIT_S)
            await self.advance_watermark(MAX_WATERMARK)
        await self.runner.call(self.state.record_end_of_data)
        await self.output.broadcast(EndOfDataFrame())
        await self.handle(DataEnded(now_ms()))
        self._start_data_ended_report()

    def _start_data_ended_report(self) -> asyncio.Future[None] | None:
        """Tell the coordinator that this task's data ended, once (not awaited by the task: a
        lost report only makes the coordinator trigger as if it had not been sent)."""
        if self._report_data_ended is not None and self._data_ended_report is None:
            self._data_ended_report = asyncio.ensure_future(self._report_data_ended())
        return self._data_ended_report


def _notify_complete(operators: list[Operator], checkpoint_id: int) -> None:
    for op in operators:
        op.notify_checkpoint_complete(checkpoint_id)


def _notify_aborted(operators: list[Operator], checkpoint_id: int) -> None:
    for op in operators:
        op.notify_checkpoint_aborted(checkpoint_id)

"""The loop of a task with inputs (Flink's ``StreamInputProcessor`` over a
``CheckpointedInputGate``): take frames from the input gate, feed barriers, cancel markers and
ends of partition into the one barrier handler over every channel of every input, execute its
actions, run data through the chain, combine watermarks and watermark statuses (forwarding the
task's own), and tell the lifecycle when an input's data ended.

Channels are the gate's, numbered across all logical inputs; ``gate.input_of`` says which input
each belongs to. An input's data ended once every one of its channels delivered end of data
(``InputEnded``); the partitions ended once every channel delivered end of partition.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Never, NoReturn

import pyarrow as pa

from snapflow.worker.runtime import barriers as b
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfDataFrame,
    EndOfPartitionFrame,
    Frame,
    LatencyMarkerFrame,
    WatermarkFrame,
    WatermarkStatusFrame,
)
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.subtask_checkpoints import now_ms
from snapflow.worker.runtime.task_lifecycle import BarrierSnapshot, InputEnded
from snapflow.worker.runtime.task_shell import TaskShell
from snapflow.worker.runtime.watermark_valve import WatermarkValve


def barrier_from_frame(frame: BarrierFrame) -> b.Barrier:
    """The barrier handler's view of a barrier taken from an input channel."""
    return b.Barrier(frame.checkpoint_id, frame.timestamp_ms, frame.options)


class InputLoop:
    """Drives one task with inputs until every input channel ended."""

    def __init__(self, shell: TaskShell, gate: InputGate, handler: b.BarrierHandler) -> None:
        self._shell = shell
        self.gate = gate
        self.handler = handler
        self.valve = WatermarkValve(gate.input_of)
        self._data_ended = [False] * gate.num_channels
        # at least once never blocks a channel: no barrier has to overtake anything
        self._exactly_once = isinstance(handler, b.SingleCheckpointBarrierHandler)
        shell.output.serve_mailbox = self.serve_priority

    async def run(self) -> None:
        gate, handler = self.gate, self.handler
        while True:
            deadline = handler.next_deadline_ms()
            if deadline is not None and now_ms() >= deadline:
                # Checked before every frame, so a gate that always has data to deliver cannot
                # delay the switch to unaligned past the aligned-checkpoint timeout.
                await self.execute(handler.on_timer(now_ms()))
                continue
            # The operators' processing-time timers: due ones fire between two frames, and the
            # wait for the next frame ends at the earliest (an idle input still fires them).
            timer = self._shell.chain.next_processing_time_ms()
            if timer is not None:
                if now_ms() >= timer:
                    await self._shell.fire_processing_time(now_ms())
                    continue
                if deadline is None or timer < deadline:
                    deadline = timer
            # An aligned barrier that timed out while queued behind data in an input channel
            # overtakes it (Flink's announced barriers); the gate returns it next.
            queued = gate.barrier_deadline_ms() if self._exactly_once else None
            if queued is not None:
                now = now_ms()
                if now >= queued:
                    gate.convert_timed_out_barriers(now)
                elif deadline is None or queued < deadline:
                    deadline = queued
            if deadline is None:
                item = await gate.next()
            else:
                item = gate.poll()
                if item is None and not gate.all_ended:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, (deadline - now_ms()) / 1000.0)):
                            item = await gate.next()
                    if item is None:
                        continue  # the deadline passed: the top of the loop acts on it
            if item is None:
                return
            await self._on_frame(*item)

    async def _on_frame(self, channel: int, frame: Frame) -> None:
        shell = self._shell
        if isinstance(frame, DataFrame):
            batch = frame.batch
            shell.checkpoints.on_input(channel, batch, aligning=self.gate.aligning)
            shell.records_in += batch.num_rows
            await self.process_input(self.gate.input_of[channel], batch)
        elif isinstance(frame, BarrierFrame):
            await self.execute(
                self.handler.on_barrier(channel, barrier_from_frame(frame), now_ms())
            )
        elif isinstance(frame, CancelMarkerFrame):
            await self.execute(
                self.handler.on_cancel_marker(channel, frame.checkpoint_id, now_ms())
            )
        elif isinstance(frame, EndOfDataFrame):
            self._data_ended[channel] = True
            index = self.gate.input_of[channel]
            if index not in shell.lifecycle.ended_inputs and all(
                self._data_ended[c] for c in self.gate.channels_of(index)
            ):
                await shell.handle(InputEnded(index))
        elif isinstance(frame, EndOfPartitionFrame):
            await self.execute(self.handler.on_end_of_partition(channel, now_ms()))
            await self._advance(self.valve.on_channel_ended(channel))
        elif isinstance(frame, WatermarkFrame):
            await self._advance(self.valve.on_watermark(channel, frame.timestamp_ms))
        elif isinstance(frame, WatermarkStatusFrame):
            await self._advance(self.valve.on_status(channel, frame.idle))
        elif isinstance(frame, LatencyMarkerFrame):
            await shell.output.broadcast(frame)
        else:
            _unknown("frame", frame)

    async def process_input(self, input_index: int, batch: pa.RecordBatch) -> None:
        """``batch`` through the chain as data of logical input ``input_index``, and its output
        downstream: live data, and input channel state replayed on restore (to the input of the
        channel it was captured on)."""
        shell = self._shell
        await shell.output.emit(await shell.runner.process(shell.chain, batch, input_index))

    async def _advance(self, watermark: int | None) -> None:
        """The valve's outputs downstream: active again before the watermark, idle after it."""
        shell, idle = self._shell, self.valve.idle
        if not idle:
            await shell.mark_idle(False)
        if watermark is not None:
            await shell.advance_watermark(watermark)
        if idle:
            await shell.mark_idle(True)

    async def execute(self, actions: list[b.Action]) -> None:
        """Execute the barrier handler's actions, in order."""
        gate, checkpoints = self.gate, self._shell.checkpoints
        for action in actions:
            if isinstance(action, b.BlockChannel):
                gate.block(action.channel)
            elif isinstance(action, b.UnblockChannels):
                for channel in action.channels:
                    gate.unblock(channel)
            elif isinstance(action, b.TriggerSnapshot):
                await self._shell.handle(BarrierSnapshot(action))
            elif isinstance(action, b.StartPersistingChannel):
                checkpoints.start_persisting(action.channel, action.checkpoint_id)
            elif isinstance(action, b.PersistOvertakenData):
                checkpoints.persist_overtaken(
                    action.checkpoint_id,
                    action.channel,
                    [data.batch for data in gate.persist_queued(action.channel)],
                )
            elif isinstance(action, b.StopPersistingChannel):
                checkpoints.stop_persisting(action.channel)
            elif isinstance(action, b.SwitchToUnaligned):
                self._shell.log.info(
                    "checkpoint.switched_to_unaligned", checkpoint_id=action.checkpoint_id
                )
            elif isinstance(action, b.AbortCheckpoint):
                await checkpoints.abort(action.checkpoint_id, action.reason)
            elif isinstance(action, b.CheckpointCompleteOnInput):
                checkpoints.input_complete(action.checkpoint_id)
            else:
                _unknown("barrier action", action)

    async def serve_priority(self) -> None:
        """While the output is backpressured: what may not wait for it, priority frames
        (unaligned barriers, cancel markers), and aligned barriers that timed out queued."""
        gate = self.gate
        queued = gate.barrier_deadline_ms() if self._exactly_once else None
        if queued is not None and now_ms() >= queued:
            gate.convert_timed_out_barriers(now_ms())
        if any(c.priority_pending for c in gate.channels):
            item = gate.poll()
            if item is not None:
                await self._on_priority(*item)

    async def _on_priority(self, channel: int, frame: Frame) -> None:
        if isinstance(frame, BarrierFrame):
            await self.execute(
                self.handler.on_barrier(channel, barrier_from_frame(frame), now_ms())
            )
        elif isinstance(frame, CancelMarkerFrame):
            await self.execute(
                self.handler.on_cancel_marker(channel, frame.checkpoint_id, now_ms())
            )
        else:
            # Only unaligned barriers and cancel markers overtake data (frames.is_priority).
            raise TypeError(f"{type(frame).__name__} is not a priority frame")


def _unknown(what: str, value: Never) -> NoReturn:
    # mypy proves every dispatch exhaustive (``value`` is narrowed to Never); at run time a
    # new type that was not handled fails the task instead of being dropped silently.
    raise TypeError(f"unknown {what}: {value!r}")

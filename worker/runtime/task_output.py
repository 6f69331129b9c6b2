"""A subtask's output: its edges' partitioners over the output channels, and how batches,
events and the end of the partitions go out (the task's side of Flink's ``RecordWriter``).

Output channels are numbered across all edges, in edge order; output channel state and its
replay use the same numbering.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapflow.worker.runtime.busy_time import BusyTimeMeter
from snapflow.worker.runtime.frames import DataFrame, Frame
from snapflow.worker.runtime.output_channel import OutputChannel
from snapflow.worker.runtime.partitioners import BroadcastPartitioner, Partitioner

BACKPRESSURE_POLL_S = 0.005
"""How often a task blocked on output looks for priority events (its mailbox)."""


@dataclass
class OutputEdge:
    """One output edge of the task: a partitioner over the channels to the target subtasks."""

    partitioner: Partitioner
    channels: list[OutputChannel]
    tag: str = ""
    """The output it carries: "" the main one, else the side output of that name."""


async def _nothing_to_serve() -> None:
    return None


class TaskOutput:
    """Sends what the operator chain produced, partitioned, onto the output channels."""

    def __init__(
        self,
        edges: list[OutputEdge],
        meter: BusyTimeMeter | None = None,
        side_outputs: list[tuple[str, pa.RecordBatch]] | None = None,
    ) -> None:
        """``side_outputs``: where the operators put side-output batches
        (``OperatorContext.side_outputs``); every ``emit`` sends and clears them."""
        self.edges = edges
        self.meter = meter or BusyTimeMeter()
        """Counts the waits for credit as backpressured (the task's ``BusyTimeMeter``)."""
        self.channels: list[OutputChannel] = [c for edge in edges for c in edge.channels]
        self.side_outputs: list[tuple[str, pa.RecordBatch]] = (
            side_outputs if side_outputs is not None else []
        )
        self._main = [e for e in edges if not e.tag]
        self.records_out = 0
        self.serve_mailbox: Callable[[], Awaitable[None]] = _nothing_to_serve
        """What may not wait while the output is backpressured (set by the task's loop)."""

    async def emit(self, batches: list[pa.RecordBatch]) -> None:
        """Partition and send ``batches``.

        Everything one input produced is enqueued before the task waits for credit: a barrier
        taken while it waits (a trigger at a source, an unaligned barrier elsewhere) must find
        all of it before the barrier (in the channels, or in the output channel state), since
        the input that produced it is already behind the snapshot. Flink's overdraft buffers
        (FLIP-227) serve the same purpose. Memory stays bounded by one input batch's output."""
        sends: list[Coroutine[Any, Any, None]] = []
        for batch in batches:
            if batch.num_rows == 0:
                continue
            self.records_out += batch.num_rows
            sends.extend(
                edge.channels[index].send(DataFrame(part))
                for edge in self._main
                for index, part in edge.partitioner.partition(batch)
            )
        if self.side_outputs:
            side, self.side_outputs[:] = list(self.side_outputs), []
            for tag, batch in side:
                sends.extend(
                    edge.channels[index].send(DataFrame(part))
                    for edge in self.edges
                    if edge.tag == tag
                    for index, part in edge.partitioner.partition(batch)
                )
        if not sends:
            return
        if len(sends) == 1 and not self.backpressured():
            await sends[0]
        else:
            await self._await_sends(await _start_sends(sends))

    async def broadcast(self, frame: Frame) -> None:
        """``frame`` (a watermark, end of data, a latency marker) on every output channel."""
        for channel in self.channels:
            await channel.send(frame)

    async def close(self) -> None:
        """End the partitions: end of partition on every output channel, once delivered."""
        for channel in self.channels:
            await channel.close()

    def backpressured(self) -> bool:
        return any(c.queued_data > 0 for c in self.channels)

    def first_blocked(self) -> OutputChannel | None:
        """A channel that would not hand its next frame over at once (``has_room``)."""
        return next((c for c in self.channels if not c.has_room()), None)

    def all_have_room(self) -> bool:
        return all(c.has_room() for c in self.channels)

    def poll_records(self, batch_records: int) -> int:
        """What one source poll may take: at most ``batch_records``, and no more than the
        debloated poll size per output channel (``snapflow.worker.runtime.debloat``), so that
        a barrier injected after the poll waits behind a bounded time of each consumer's work,
        not a whole source batch."""
        n = batch_records
        for edge in self.edges:
            caps = [c.max_poll_rows for c in edge.channels]
            if not caps or any(cap is None for cap in caps):
                continue
            fan_out = 1 if isinstance(edge.partitioner, BroadcastPartitioner) else len(caps)
            n = min(n, min(cap for cap in caps if cap is not None) * fan_out)
        return max(1, n)

    async def _await_sends(self, tasks: list[asyncio.Future[None]]) -> None:
        """Await started sends while still taking what must not wait behind backpressure (the
        mailbox): a checkpoint trigger at a source, an unaligned barrier or a cancel marker at
        other tasks. Every part is enqueued already, so a snapshot taken meanwhile has the
        whole batch before its barrier: aligned barriers queue behind it, unaligned ones
        overtake it and it becomes output channel state."""
        while not all(task.done() for task in tasks):
            await self.serve_mailbox()
            if all(task.done() for task in tasks):
                break
            with self.meter.backpressured:
                await asyncio.wait(tasks, timeout=BACKPRESSURE_POLL_S)
        for task in tasks:
            task.result()  # a failed channel fails the task


async def _start_sends(sends: list[Coroutine[Any, Any, None]]) -> list[asyncio.Future[None]]:
    """Start the sends; once this returns every one has enqueued its frame (``send`` enqueues
    before it waits for credit)."""
    tasks: list[asyncio.Future[None]] = [asyncio.ensure_future(send) for send in sends]
    await asyncio.sleep(0)
    return tasks

"""A source subtask's loop: poll the source when the output has room, inject barriers on the
coordinator's triggers between two polls, and once its input ended wait for the job's final
checkpoint (docs/worker.md, "End of input").

What the loop does next is the lifecycle's call (``TaskLifecycle.source_step``); triggers are
taken between two polls and while the output is backpressured, never while end of data is
going out (a barrier must not split ``end_input``'s output from its end of data).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pyarrow as pa

from snapflow.checkpointing import BarrierOptions
from snapflow.errors import InvalidArgumentError
from snapflow.worker.runtime.operator import SourceOperator
from snapflow.worker.runtime.source_idleness import SourceIdleness
from snapflow.worker.runtime.subtask_checkpoints import now_ms
from snapflow.worker.runtime.task_lifecycle import (
    Phase,
    SourceExhausted,
    SourceStep,
    TaskFailedError,
    TriggerAtSource,
)
from snapflow.worker.runtime.task_output import BACKPRESSURE_POLL_S
from snapflow.worker.runtime.task_shell import TaskShell

SOURCE_BATCH_RECORDS = 65_536
IDLE_POLL_S = 0.005
"""A source that polled nothing waits this long for a trigger before it polls again."""

Polled = tuple[int, list[pa.RecordBatch], int | None]


class SourceLoop:
    """Drives one source subtask."""

    def __init__(
        self, shell: TaskShell, source: SourceOperator, batch_records: int = SOURCE_BATCH_RECORDS
    ) -> None:
        self._shell = shell
        self._source = source
        self._batch_records = batch_records
        self._idleness = SourceIdleness(source.idle_timeout_ms)
        self._schema_checked = False
        self._triggers: asyncio.Queue[tuple[int, int, BarrierOptions, bool]] = asyncio.Queue()
        self._trigger_queued = asyncio.Event()
        """Set while a trigger is queued: waiting on it leaves the queue's order alone."""
        shell.output.serve_mailbox = self.serve_triggers

    def trigger(self, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions) -> None:
        """A checkpoint trigger from the coordinator: taken at the next chance."""
        ending = self._shell.lifecycle.defers_triggers
        self._triggers.put_nowait((checkpoint_id, timestamp_ms, options, ending))
        self._trigger_queued.set()

    async def serve_triggers(self) -> None:
        """Take the queued triggers (not while end of data is going out)."""
        lifecycle = self._shell.lifecycle
        while not lifecycle.defers_triggers and not self._triggers.empty():
            checkpoint_id, timestamp_ms, options, ending = self._triggers.get_nowait()
            await self._shell.handle(
                TriggerAtSource(checkpoint_id, timestamp_ms, options, now_ms(), ending)
            )
        if self._triggers.empty():
            self._trigger_queued.clear()

    async def run(self) -> None:
        """Until the source emits nothing more: its input is exhausted (end of data sent), it
        ended before its restored snapshot, or its stop-with-savepoint completed."""
        shell, lifecycle = self._shell, self._shell.lifecycle
        if lifecycle.source_step() is SourceStep.END:
            return  # it ended before the snapshot it restored (end of input or a drain)
        while True:
            await self.serve_triggers()
            shell.changed.clear()
            step = lifecycle.source_step()
            if step is SourceStep.FAIL:
                # A stop-with-savepoint with drain failed after end of data went downstream:
                # the tasks there ran end_input, so the job cannot go on; restart it from its
                # latest completed checkpoint (Flink fails the task too).
                raise TaskFailedError("stop-with-savepoint with drain failed after end of data")
            if step is SourceStep.END:
                return
            if step is SourceStep.WAIT:
                # Stop-with-savepoint: emit nothing more; end once it completed, resume if it
                # was aborted.
                await shell.wait_changed()
                continue
            if not await self._output_has_room():
                continue  # a trigger came first (or a while passed): the top takes it
            polled = await self._poll()
            if polled is None:
                await shell.handle(SourceExhausted())
                return
            rows, out, watermark = polled
            await shell.mark_idle(self._idleness.idle)  # active again before its data
            if rows == 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_POLL_S):
                        await self._wait_trigger()
                continue
            shell.records_in += rows
            await shell.output.emit(out)
            if watermark is not None and watermark > shell.watermark:
                await shell.advance_watermark(watermark)
            await asyncio.sleep(0)

    async def finish(self) -> None:
        """After ``run``: end the data if that has not happened (a source restored as ended),
        then keep taking checkpoints (with the final position) until the lifecycle finishes:
        once a checkpoint completes that the coordinator marks final, i.e. every source of the
        job had ended before it. An earlier end of the partitions would stop the checkpoints of
        the sources that are still running (FLIP-147's end of input, slimmed)."""
        shell, lifecycle = self._shell, self._shell.lifecycle
        if lifecycle.phase is Phase.RUNNING:
            await shell.handle(SourceExhausted())
        try:
            while lifecycle.phase is Phase.DATA_ENDED:
                await self.serve_triggers()
                shell.changed.clear()
                if lifecycle.phase is not Phase.DATA_ENDED:
                    break
                trigger = asyncio.ensure_future(self._wait_trigger())
                try:
                    await shell.wait_changed(trigger)
                finally:
                    trigger.cancel()
        finally:
            shell.stop_requesting()

    async def _poll(self) -> Polled | None:
        runner, max_records = (
            self._shell.runner,
            self._shell.output.poll_records(self._batch_records),
        )
        with runner.meter.busy:
            if runner.thread is None:
                return runner.call_measured(self._poll_source, max_records)
            return await runner.thread.call(self._poll_source, max_records)

    def _poll_source(self, max_records: int) -> Polled | None:
        """Where operators run: one poll of the source and the chain's output for it, with the
        source's watermark after it. None when the source is finished."""
        batch = self._source.poll_batch(max_records)
        if batch is None:
            return None
        rows = batch.num_rows
        self._idleness.on_poll(
            rows, time.monotonic_ns() // 1_000_000, not rows and self._source.idle_at_once()
        )
        if rows == 0:
            return 0, [], None
        if not self._schema_checked:
            check_declared_schema(self._source, batch)
            self._schema_checked = True
        out = self._shell.chain.process_batch(batch)
        watermark = self._source.current_watermark()
        return batch.num_rows, out, watermark

    async def _output_has_room(self) -> bool:
        """Poll the source only when every output channel would hand its next frame over at
        once (``OutputChannel.has_room``): a batch polled into full channels would wait at the
        producer, and a barrier injected meanwhile would queue behind it as well as behind the
        frames the consumers hold (Flink's sources likewise emit only while their output is
        available). True: poll; False: a trigger is pending or ``BACKPRESSURE_POLL_S`` passed."""
        output = self._shell.output
        blocked = output.first_blocked()
        if blocked is None:
            return True
        if not self._triggers.empty():
            return False
        room = asyncio.ensure_future(blocked.wait_for_room())
        trigger = asyncio.ensure_future(self._wait_trigger())
        try:
            with output.meter.backpressured:
                await asyncio.wait(
                    [room, trigger],
                    timeout=BACKPRESSURE_POLL_S,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            for waiter in (room, trigger):
                waiter.cancel()
            await asyncio.gather(room, trigger, return_exceptions=True)
        return output.all_have_room() and self._triggers.empty()

    async def _wait_trigger(self) -> None:
        await self._trigger_queued.wait()


def check_declared_schema(source: SourceOperator, batch: pa.RecordBatch) -> None:
    """A source that declares ``output_schema`` must emit it: the pipeline checked unions and
    join keys against the declaration, so a batch of another schema would break them later,
    far from the cause."""
    declared = source.output_schema
    if declared is not None and not batch.schema.equals(declared):
        raise InvalidArgumentError(
            f"{source.name} declares output_schema ({', '.join(declared.names)}) but emitted "
            f"a batch of ({', '.join(batch.schema.names)}); set output_schema to what it "
            f"emits, or to None when it is not fixed"
        )

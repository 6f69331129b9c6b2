"""A subtask's checkpoints: barrier out, synchronous part, asynchronous part, ack or decline
(the subtask side of Flink's ``SubtaskCheckpointCoordinator``).

1. The barrier goes downstream first (Flink's order): behind the data for aligned checkpoints
   (enqueued at once on every output, without waiting for credit); ahead of the queued output
   for unaligned ones, the overtaken output becoming *output channel state*. Aligned with a
   timeout: a barrier still queued in an output when the timeout passes is converted to
   unaligned there (``OutputChannel.convert_to_unaligned``), its overtaken data becoming
   output channel state too.
2. Synchronous part: every operator's ``snapshot_state``, then the backends' ``snapshot``
   (copy-on-write views, cheap); nothing is processed between 1 and 2. If it fails, a cancel
   marker chases the barrier and the task declines.
3. Asynchronous part, in a thread while processing continues: the files are written
   (``snapshot_writer``) under ``<target_location>/<vertex>-<subtask>-<attempt>/``; for
   unaligned checkpoints the input channel state (data that arrived on a channel before its
   barrier) is written once every input delivered its barrier; then the ack (handles and
   metrics) goes to the coordinator.

An abort on the input forwards a cancel marker and declines. The lifecycle hears of every
snapshot whose synchronous part failed (``SnapshotFailed``) and of every asynchronous part
that ended, acked, declined or aborted (``SnapshotSettled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import structlog

from snapflow.checkpointing import DeclineReason, StateHandle
from snapflow.worker.runtime.barriers import BarrierAbortReason
from snapflow.worker.runtime.channel_errors import ChannelError
from snapflow.worker.runtime.frames import BarrierFrame, CancelMarkerFrame
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.operator_runner import OperatorRunner
from snapflow.worker.runtime.output_channel import OutputChannel
from snapflow.worker.runtime.slow_snapshot_probe import AsyncPhases, SlowSnapshotProbe
from snapflow.worker.runtime.snapshot_writer import encode_snapshot, join_location
from snapflow.worker.runtime.task_lifecycle import (
    Event,
    SnapshotFailed,
    SnapshotSettled,
    TakeSnapshot,
)
from snapflow.worker.runtime.task_output import TaskOutput
from snapflow.worker.runtime.task_state import TaskState
from snapflow.worker.state import write_clock
from snapflow.worker.state.snapshots import SnapshotInProgress


def now_ms() -> int:
    """Wall-clock epoch milliseconds, comparable to a barrier's ``timestamp_ms``."""
    return time.time_ns() // 1_000_000


@dataclass
class SnapshotReport:
    """What the task reports to the coordinator for one checkpoint."""

    checkpoint_id: int
    operator_states: list[tuple[str, list[StateHandle]]]  # (operator_id, handles)
    sync_duration_ms: int
    async_duration_ms: int
    alignment_duration_ms: int
    start_delay_ms: int
    state_size_bytes: int
    processed_during_alignment_bytes: int
    persisted_in_flight_bytes: int
    unaligned: bool
    input_ended: bool = False
    records_in: int = 0


AckFn = Callable[[SnapshotReport], Awaitable[None]]
DeclineFn = Callable[[int, DeclineReason, str], Awaitable[None]]  # checkpoint id, reason, message


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


@dataclass
class PendingSnapshot:
    """A snapshot whose asynchronous part has not ended."""

    take: TakeSnapshot
    started: float
    records_in: int
    unaligned: bool
    """Unaligned from the start, or since its output-side alignment timed out."""
    snapshots: list[tuple[str, SnapshotInProgress]] = field(default_factory=list)
    output_state: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    input_state: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    input_complete: asyncio.Event = field(default_factory=asyncio.Event)
    output_complete: asyncio.Event = field(default_factory=_set_event)
    """Cleared while an aligned barrier with a timeout may still be converted to unaligned in
    an output queue (its overtaken data would be output channel state)."""
    sync_duration_ms: int = 0


class SubtaskCheckpoints:
    """Takes one subtask's snapshots and reports them."""

    def __init__(
        self,
        *,
        name: str,
        snapshot_dir: str,
        log: structlog.stdlib.BoundLogger,
        output: TaskOutput,
        runner: OperatorRunner,
        state: TaskState,
        operators: Sequence[Operator],
        has_inputs: bool,
        ack: AckFn,
        decline: DeclineFn,
        lifecycle: Callable[[Event], object],
    ) -> None:
        self.name = name
        self._snapshot_dir = snapshot_dir
        """``<vertex>-<subtask>-<attempt>``: the subtask's folder under a checkpoint's target."""
        self._log = log
        self._output = output
        self._runner = runner
        self._state = state
        self._operators = list(operators)
        self._has_inputs = has_inputs
        self._ack = ack
        self._decline = decline
        self._lifecycle = lifecycle
        self.pending: dict[int, PendingSnapshot] = {}
        self.persisting: dict[int, int] = {}
        """Input channel -> the unaligned checkpoint whose channel state it feeds."""
        self.alignment_bytes: dict[int, int] = {}
        self.async_parts: set[asyncio.Task[None]] = set()
        self._probe = SlowSnapshotProbe.from_env()
        """Off unless asked for (``SNAPFLOW_DEBUG_SLOW_ASYNC_MS``): a debugging aid."""

    # --- input side (from the barrier handler's actions) ------------------------------------

    def on_input(self, channel: int, batch: pa.RecordBatch, aligning: bool) -> None:
        """A batch taken from input ``channel``: channel state of an unaligned checkpoint if
        the channel is persisting; counted as processed during alignment if ``aligning``."""
        persisting = self.persisting.get(channel)
        if persisting is not None and persisting in self.pending:
            self.pending[persisting].input_state.append((channel, batch))
        if aligning:
            for cid in self.pending:
                self.alignment_bytes[cid] = self.alignment_bytes.get(cid, 0) + batch.nbytes

    def start_persisting(self, channel: int, checkpoint_id: int) -> None:
        self.persisting[channel] = checkpoint_id

    def stop_persisting(self, channel: int) -> None:
        self.persisting.pop(channel, None)

    def persist_overtaken(
        self, checkpoint_id: int, channel: int, batches: Sequence[pa.RecordBatch]
    ) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is not None:
            pending.input_state.extend((channel, batch) for batch in batches)

    def input_complete(self, checkpoint_id: int) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is not None:
            pending.input_complete.set()

    async def abort(self, checkpoint_id: int, reason: BarrierAbortReason) -> None:
        """The input aborted ``checkpoint_id``: forward a cancel marker and decline."""
        self._drop(checkpoint_id)
        self.persisting = {c: n for c, n in self.persisting.items() if n != checkpoint_id}
        marker = CancelMarkerFrame(checkpoint_id)
        for channel in self._output.channels:
            channel.send_priority(marker)
        await self._decline(checkpoint_id, reason.decline_reason, f"{self.name}: {reason.value}")

    async def decline_trigger(self, checkpoint_id: int, message: str) -> None:
        """A source declines a trigger it takes no snapshot for (``TASK_NOT_READY``), and tells
        downstream not to wait for its barrier: a cancel marker on every output channel, as
        Flink's ``StreamTask.performCheckpoint`` broadcasts a ``CancelCheckpointMarker`` when
        it cannot take a checkpoint. Without it a task downstream that got the barrier from
        the other sources stays blocked aligning it, and cannot even end its input."""
        self._cancel_downstream(checkpoint_id)
        await self._decline(checkpoint_id, DeclineReason.TASK_NOT_READY, f"{self.name}: {message}")

    def _cancel_downstream(self, checkpoint_id: int) -> None:
        """A cancel marker ahead of the data on every output channel that still works."""
        marker = CancelMarkerFrame(checkpoint_id)
        for channel in self._output.channels:
            with contextlib.suppress(ChannelError):
                channel.send_priority(marker)

    # --- taking a snapshot -------------------------------------------------------------------

    async def take_snapshot(self, take: TakeSnapshot, records_in: int) -> None:
        """``take``, ``records_in`` the records the task had taken in before it."""
        started = time.perf_counter()
        trigger = take.trigger
        checkpoint_id, timestamp_ms, options = (
            trigger.checkpoint_id,
            trigger.timestamp_ms,
            trigger.options,
        )
        unaligned = trigger.unaligned
        pending = PendingSnapshot(take, started, records_in, unaligned)
        if not self._has_inputs:
            pending.input_complete.set()  # a source has no input channels
        self.pending[checkpoint_id] = pending
        # The barrier goes downstream first, then the state is taken (Flink's order: nothing
        # is processed in between, and downstream can align meanwhile).
        barrier = BarrierFrame(checkpoint_id, timestamp_ms, options)
        channels = self._output.channels
        if unaligned:
            for index, channel in enumerate(channels):
                for data in channel.send_priority(barrier):
                    pending.output_state.append((index, data.batch))
        else:
            # Behind the data, on every channel at once, without waiting for credit: a barrier
            # needs none, and the task's next output waits for it anyway.
            for channel in channels:
                channel.send_event(barrier)
            if options.is_timeoutable and channels:
                pending.output_complete.clear()
                self._spawn(self._output_alignment_timeout(pending, channels))
        try:
            pending.snapshots = await self._runner.call(
                self._state.sync_snapshot, self._operators, checkpoint_id, options
            )
        except Exception as e:
            self._drop(checkpoint_id)
            self._lifecycle(SnapshotFailed(checkpoint_id))
            self._log.warning(
                "checkpoint.snapshot_failed", checkpoint_id=checkpoint_id, error=str(e)
            )
            # Downstream has the barrier already: tell it not to wait for this checkpoint.
            self._cancel_downstream(checkpoint_id)
            await self._decline(checkpoint_id, DeclineReason.SNAPSHOT_FAILED, f"{self.name}: {e}")
        else:
            pending.sync_duration_ms = int((time.perf_counter() - started) * 1000)
            self._spawn(self._complete_snapshot(pending))

    def _drop(self, checkpoint_id: int) -> None:
        """Forget ``checkpoint_id``: its asynchronous part, if waiting for the rest of the
        input's or output's channel state, wakes up, sees it gone and settles."""
        pending = self.pending.pop(checkpoint_id, None)
        self.alignment_bytes.pop(checkpoint_id, None)
        if pending is not None:
            pending.input_complete.set()
            pending.output_complete.set()

    def cancel(self) -> None:
        """The task ends: stop every asynchronous part."""
        for task in list(self.async_parts):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self.async_parts.add(task)
        task.add_done_callback(self.async_parts.discard)

    async def _output_alignment_timeout(
        self, pending: PendingSnapshot, channels: list[OutputChannel]
    ) -> None:
        """Aligned with a timeout, output side: a barrier still queued in an output channel
        when the timeout passes (measured from the checkpoint's trigger, as on the input side)
        becomes unaligned and overtakes the data queued ahead of it, which becomes output
        channel state (Flink converts it in the output subpartition too)."""
        trigger = pending.take.trigger
        checkpoint_id = trigger.checkpoint_id
        try:
            waits = [channel.barrier_sent(checkpoint_id) for channel in channels]
            deadline_ms = trigger.timestamp_ms + trigger.options.aligned_checkpoint_timeout_ms
            remaining_s = (deadline_ms - now_ms()) / 1000.0
            if remaining_s > 0:
                await asyncio.wait(waits, timeout=remaining_s)
            if checkpoint_id not in self.pending:
                return  # aborted or already done
            converted = 0
            for index, (channel, sent) in enumerate(zip(channels, waits, strict=True)):
                if sent.done():
                    continue
                try:
                    overtaken = channel.convert_to_unaligned(checkpoint_id)
                except ChannelError:
                    continue  # the channel failed: so does the task, elsewhere
                if overtaken is None:
                    continue
                converted += 1
                pending.output_state.extend((index, data.batch) for data in overtaken)
            if converted:
                pending.unaligned = True
                self._log.info(
                    "checkpoint.output_switched_to_unaligned",
                    checkpoint_id=checkpoint_id,
                    channels=converted,
                )
        finally:
            pending.output_complete.set()

    async def _complete_snapshot(self, pending: PendingSnapshot) -> None:
        try:
            await self._write_and_ack(pending)
        finally:
            # Only now, the ack sent: a finishing task waits for this before it ends.
            self._lifecycle(SnapshotSettled(pending.take.checkpoint_id))

    async def _write_and_ack(self, pending: PendingSnapshot) -> None:
        trigger = pending.take.trigger
        checkpoint_id = trigger.checkpoint_id
        try:
            await pending.input_complete.wait()
            await pending.output_complete.wait()
            if checkpoint_id not in self.pending:
                return  # aborted meanwhile
            directory = join_location(trigger.options.target_location, self._snapshot_dir)
            phases = AsyncPhases(self.name, checkpoint_id)
            started = time.perf_counter()
            watching = self._probe.watch(self.name, checkpoint_id) if self._probe else None
            threshold = trigger.options.inline_state_threshold_bytes
            try:
                if _encodes_on_loop(pending, threshold):
                    (handles_by_op, size, in_flight), ended = await _encode_on_loop(
                        phases,
                        started,
                        directory,
                        checkpoint_id,
                        pending.snapshots,
                        self._state.channel_state_owner,
                        threshold,
                    )
                else:
                    (handles_by_op, size, in_flight), ended = await asyncio.to_thread(
                        _timed_write,
                        phases,
                        started,
                        directory,
                        checkpoint_id,
                        pending.snapshots,
                        pending.input_state,
                        pending.output_state,
                        self._state.channel_state_owner,
                        threshold,
                    )
            finally:
                if watching is not None:
                    watching.set()
            resumed = time.perf_counter()
            async_ms = int((resumed - started) * 1000)
            if self._probe is not None:
                phases.resumed_ms = (resumed - ended) * 1000
                phases.total_ms = async_ms
                self._probe.record(phases)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._drop(checkpoint_id)
            self._log.warning(
                "checkpoint.snapshot_failed", checkpoint_id=checkpoint_id, error=str(e)
            )
            await self._decline(checkpoint_id, DeclineReason.SNAPSHOT_FAILED, f"{self.name}: {e}")
            return
        finally:
            # on the thread the snapshot was taken on, between two calls: the backend's
            # copy-on-write bookkeeping is the task thread's (SnapshotInProgress.release)
            for _, snap in pending.snapshots:
                self._runner.post(_release, snap)
        if self.pending.pop(checkpoint_id, None) is None:
            return
        report = SnapshotReport(
            checkpoint_id=checkpoint_id,
            operator_states=sorted(handles_by_op.items()),
            sync_duration_ms=pending.sync_duration_ms,
            async_duration_ms=async_ms,
            alignment_duration_ms=trigger.alignment_duration_ms,
            start_delay_ms=trigger.start_delay_ms,
            state_size_bytes=size,
            processed_during_alignment_bytes=self.alignment_bytes.pop(checkpoint_id, 0),
            persisted_in_flight_bytes=in_flight,
            unaligned=pending.unaligned,
            input_ended=pending.take.input_ended,
            records_in=pending.records_in,
        )
        await self._ack(report)


def _timed_write(
    phases: AsyncPhases,
    submitted: float,
    directory: str,
    checkpoint_id: int,
    snapshots: Sequence[tuple[str, SnapshotInProgress]],
    input_state: Sequence[tuple[int, pa.RecordBatch]],
    output_state: Sequence[tuple[int, pa.RecordBatch]],
    channel_state_owner: str,
    inline_threshold_bytes: int,
) -> tuple[tuple[dict[str, list[StateHandle]], int, int], float]:
    """Encode and store the snapshot on the writing thread, its steps timed into ``phases``;
    returns the stored snapshot and when it ended."""
    began = time.perf_counter()
    phases.queued_ms = (began - submitted) * 1000
    with write_clock.started(write_clock.WriteClock()) as clock:
        encoded = encode_snapshot(
            directory, checkpoint_id, snapshots, input_state, output_state, channel_state_owner
        )
        result = encoded.store(inline_threshold_bytes)
    ended = time.perf_counter()
    phases.thread_ms = (ended - began) * 1000
    phases.serialise_ms = clock.serialise_s * 1000
    phases.durable_ms = clock.durable_s * 1000
    return result, ended


LOOP_ENCODE_MAX_ENTRIES = 1024
"""A snapshot of at most this many entries, with inline state on, is encoded on the agent's
loop (well under a millisecond); if it then fits inline nothing is left to write, and the
asynchronous part costs no thread hand-off (about as much CPU as the encoding, and two waits
for the GIL, at ten checkpoints a second). Larger or unknown ones go to a thread whole."""


def _encodes_on_loop(pending: PendingSnapshot, inline_threshold_bytes: int) -> bool:
    if inline_threshold_bytes <= 0 or pending.input_state or pending.output_state:
        return False
    total = 0
    for _, snap in pending.snapshots:
        if snap.entries is None:
            return False
        total += snap.entries
    return total <= LOOP_ENCODE_MAX_ENTRIES


async def _encode_on_loop(
    phases: AsyncPhases,
    started: float,
    directory: str,
    checkpoint_id: int,
    snapshots: Sequence[tuple[str, SnapshotInProgress]],
    channel_state_owner: str,
    inline_threshold_bytes: int,
) -> tuple[tuple[dict[str, list[StateHandle]], int, int], float]:
    """Encode on the loop; store inline there, or hand the writing alone to a thread."""
    with write_clock.started(write_clock.WriteClock()) as clock:
        encoded = encode_snapshot(directory, checkpoint_id, snapshots, (), (), channel_state_owner)
    phases.serialise_ms = clock.serialise_s * 1000
    if encoded.fits_inline(inline_threshold_bytes):
        result = encoded.store(inline_threshold_bytes)
    else:
        result = await asyncio.to_thread(encoded.store, inline_threshold_bytes)
    ended = time.perf_counter()
    phases.thread_ms = (ended - started) * 1000
    return result, ended


def _release(snapshot: SnapshotInProgress) -> None:
    # A snapshot whose write was cut short (a cancelled task) is still "writing": the backend
    # reaps it at its next snapshot.
    with contextlib.suppress(Exception):
        snapshot.release()

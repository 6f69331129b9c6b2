"""A subtask: one parallel instance of a vertex's operator chain (Flink's StreamTask).

The task is the thin shell around the pure pieces: it takes frames from its ``InputGate``,
feeds barrier events into the barrier handler (``snapflow.worker.runtime.barriers``) and executes the actions
it returns, runs data through the operator chain, partitions the output onto its output
channels, and takes snapshots.

Snapshot (``TriggerSnapshot`` on an input, or a trigger from the coordinator at a source):

1. the barrier goes downstream first (Flink's order): behind the data for aligned checkpoints
   (enqueued at once on every output, without waiting for credit); ahead of the queued output
   for unaligned ones, the overtaken output becoming *output channel state*. Aligned with a
   timeout: a barrier still queued in an output when the timeout passes is converted to
   unaligned there (``OutputChannel.convert_to_unaligned``), its overtaken data becoming
   output channel state too;
2. synchronous part: every operator's ``snapshot_state``, then the backends' ``snapshot``
   (copy-on-write views, cheap); nothing is processed between 1 and 2. If it fails, a cancel
   marker chases the barrier and the task declines;
3. asynchronous part, in a thread while processing continues: state files are written under
   ``<target_location>/<vertex>-<subtask>-<attempt>/``; for unaligned checkpoints the input
   channel state (data that arrived on a channel before its barrier) is written once every
   input delivered its barrier; then the ack (handles + metrics) goes to the coordinator.
   When the target is an object store (``s3://``) the subtask's files of the checkpoint (state
   files and Arrow IPC channel state) are merged into one object, ``chk<id>-<uuid>.merged``,
   written with one PUT (none when there is no state); each handle names its byte range.

A snapshot that fails declines the checkpoint; an abort on the input forwards a cancel marker
and declines.

End of input (FLIP-147's order, docs/worker.md): a source whose input ended runs its chain's
``end_input``, emits the maximum watermark and *end of data*; a task that received end of data
on every input channel runs ``end_input`` and emits end of data itself. Only then come the
final checkpoint's barriers (behind that output on every channel) and, once it completed, end
of partition. A snapshot taken after ``end_input`` records it (``END_OF_DATA_STATE``), so that a
restore from it does not run ``end_input`` again.

Restore: operator states are restored from every old subtask's handles (keyed state by key
group, list state split, union state broadcast); channel state of an unaligned checkpoint is
replayed before any new input (output channel state is sent first downstream, input channel
state is processed first), which needs an unchanged parallelism.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Never, NoReturn, TypeVar

import pyarrow as pa
import structlog

from snapflow.checkpointing import (
    CHANNEL_INPUT,
    CHANNEL_OUTPUT,
    OPERATOR,
    UNION,
    BarrierOptions,
    CheckpointKind,
    CheckpointMode,
    DeclineReason,
    StateHandle,
)
from snapflow.event_time import MAX_WATERMARK
from snapflow.filestore import is_object_store_uri, store_for
from snapflow.worker.runtime import barriers as b
from snapflow.worker.runtime.channels import ChannelError, InputGate, OutputChannel
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfDataFrame,
    EndOfPartitionFrame,
    Frame,
    LatencyMarkerFrame,
    WatermarkFrame,
)
from snapflow.worker.runtime.mailbox import TaskThread
from snapflow.worker.runtime.operator import Chain, Operator, OperatorContext, SourceOperator
from snapflow.worker.runtime.partitioners import BroadcastPartitioner, Partitioner
from snapflow.worker.runtime.placement import Placement, PlacementSettings
from snapflow.worker.state.backend import (
    KeyedStateBackend,
    MergedStateObject,
    OperatorStateBackend,
    SnapshotInProgress,
)
from snapflow.worker.state.factory import StateBackendConfig, create_keyed_backend

log = structlog.get_logger("snapflow.worker")

T = TypeVar("T")

SOURCE_BATCH_RECORDS = 65_536
BACKPRESSURE_POLL_S = 0.005  # how often a task blocked on output looks for priority events
LOOP_SLICE_S = 0.005
"""Operators on the loop: the longest a batch runs before the task gives the loop a turn, at
the operator's next step (``Operator.process_batch_steps``). The interpreter's switch interval,
the longest a task thread would hold the loop off with Python code too."""
CLOSE_TIMEOUT_S = 10.0
"""How long a finishing or cancelled task waits for its task thread to close the operators (a
user function stuck forever must not keep the agent from going on)."""
END_OF_DATA_STATE = "snapflow/end-of-data"
"""Union list state (of the chain's first operator) holding the index of a subtask that had
run ``end_input`` and sent end of data when it snapshotted."""


def barrier_from_frame(frame: BarrierFrame) -> b.Barrier:
    """The barrier handler's view of a barrier taken from an input channel."""
    return b.Barrier(frame.checkpoint_id, frame.timestamp_ms, frame.options)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


@dataclass
class OutputEdge:
    """One output edge of the task: a partitioner over the channels to the target subtasks."""

    partitioner: Partitioner
    channels: list[OutputChannel]


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


@dataclass
class RestoreData:
    """What this subtask restores from (built from the coordinator's ``TaskRestore``)."""

    checkpoint_id: int = 0
    previous_parallelism: int = 0
    # operator_id -> old subtask index -> handles
    handles: dict[str, dict[int, list[StateHandle]]] = field(default_factory=dict)


@dataclass
class _PendingSnapshot:
    checkpoint_id: int
    timestamp_ms: int
    options: BarrierOptions
    unaligned: bool
    alignment_duration_ms: int
    start_delay_ms: int
    started: float
    snapshots: list[tuple[str, SnapshotInProgress]]
    output_state: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    input_state: list[tuple[int, pa.RecordBatch]] = field(default_factory=list)
    input_complete: asyncio.Event = field(default_factory=asyncio.Event)
    output_complete: asyncio.Event = field(default_factory=_set_event)
    """Cleared while an aligned barrier with a timeout may still be converted to unaligned in
    an output queue (its overtaken data would be output channel state)."""
    sync_duration_ms: int = 0
    input_ended: bool = False
    records_in: int = 0


class TaskFailedError(Exception):
    pass


class Subtask:
    """Runs one subtask until its input ends (and its last checkpoint completes), it is
    cancelled, or it fails."""

    def __init__(
        self,
        *,
        job_id: str,
        vertex_id: str,
        subtask_index: int,
        parallelism: int,
        max_parallelism: int,
        attempt: int,
        operators: Sequence[Operator],
        key_field: str | None,
        gate: InputGate | None,
        outputs: list[OutputEdge],
        mode: CheckpointMode,
        restore: RestoreData,
        ack: AckFn,
        decline: DeclineFn,
        source_batch_records: int = SOURCE_BATCH_RECORDS,
        periodic_checkpoints: bool = True,
        request_final_checkpoint: Callable[[], Awaitable[None]] | None = None,
        task_thread: bool = False,
        placement: PlacementSettings | None = None,
        state_backend: StateBackendConfig | str | None = None,
    ) -> None:
        self.job_id = job_id
        self.vertex_id = vertex_id
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.attempt = attempt
        self.operators = list(operators)
        self.key_field = key_field
        self.gate = gate
        self.outputs = outputs
        self.mode = mode
        self.restore_data = restore
        self.ack = ack
        self.decline = decline
        self.source_batch_records = source_batch_records
        self.periodic_checkpoints = periodic_checkpoints
        self.state_backend = StateBackendConfig.parse(state_backend)
        """The keyed state backend (heap or rocksdb, ``snapflow.worker.state.factory``)."""
        """False: the job has no periodic checkpoints, so a source whose input ended does not
        wait for a final checkpoint (nothing would trigger it); its sinks commit nothing more,
        unless ``request_final_checkpoint`` is given."""
        self.request_final_checkpoint = request_final_checkpoint
        """Without periodic checkpoints: a source whose input ended calls it (it asks the
        coordinator for a checkpoint) and then waits for the final checkpoint as with them."""
        self.name = f"{vertex_id}#{subtask_index}@{attempt}"
        self._log = log.bind(job_id=job_id, task=self.name)
        self._thread: TaskThread | None = TaskThread(self.name) if task_thread else None
        """Where operators run (``snapflow.worker.runtime.mailbox``); None: on the loop. A bare
        ``Subtask`` runs them on the loop; agents pass ``DataplaneSettings.task_thread``, which
        is on by default (docs/worker.md, "Where user code runs")."""
        self._placement: Placement | None = (
            Placement(placement) if placement is not None and not task_thread else None
        )
        """Operators on the loop move to a task thread once their calls block
        (``worker/runtime/placement.py``); None: they stay where ``task_thread`` put them."""
        self.source: SourceOperator | None = (
            self.operators[0]
            if self.operators and isinstance(self.operators[0], SourceOperator)
            else None
        )
        self.chain = Chain(self.operators[1:] if self.source is not None else self.operators)
        self.keyed: dict[str, KeyedStateBackend] = {}
        self.operator_state: dict[str, OperatorStateBackend] = {}
        self.handler: b.BarrierHandler | None = (
            b.create_barrier_handler(mode, gate.num_channels)
            if gate is not None and gate.num_channels
            else None
        )
        self._triggers: asyncio.Queue[tuple[int, int, BarrierOptions]] = asyncio.Queue()
        self._deferred: list[tuple[Callable[..., Any], tuple[Any, ...]]] | None = None
        """Notices posted while a batch is between two steps on the loop (``_post``)."""
        self._pending: dict[int, _PendingSnapshot] = {}
        self._persisting: dict[int, int] = {}  # input channel -> checkpoint id
        self._async_parts: set[asyncio.Task[None]] = set()
        self._channel_watermarks: list[int] = [-(2**63)] * (gate.num_channels if gate else 0)
        self._watermark = -(2**63)
        self._last_snapshot_id = 0
        self._last_completed_id = 0
        self._completed = asyncio.Event()
        self._end_of_input = False
        self._ended_data = False  # end_input ran (or was restored as run), end of data sent
        self._ending_data = False  # _end_data is flushing: a source defers its triggers
        self._restored_ended = False  # restored from a snapshot taken after end_input
        self._data_ended = [False] * (gate.num_channels if gate else 0)  # end of data per input
        self._stopping_at = 0  # id of a stop-with-savepoint this source took; 0 = none
        self._stopped_with_savepoint = False
        self._final_completed = False  # the coordinator said: every source ended, all committed
        self.records_in = 0
        self.records_out = 0
        self._alignment_bytes: dict[int, int] = {}
        self._ran = False  # run() started: it closes and disposes when it ends
        self._discarded = False
        self._closing = False  # operators closed or closing: posted notices are dropped

    @property
    def task_thread(self) -> bool:
        """Whether operators run on the subtask's task thread (else on the agent's loop)."""
        return self._thread is not None

    @property
    def adaptive(self) -> bool:
        """Whether operators on the loop move to a task thread once their calls block."""
        return self._placement is not None

    # --- lifecycle -------------------------------------------------------------------------

    async def open_where_it_runs(self) -> None:
        """:meth:`open` on the task thread when the subtask has one (so ``open`` runs on the
        thread of every later call, as Flink opens operators on the task thread, and a large
        restore does not hold up the loop), else here. If ``open`` fails, or the caller is
        cancelled meanwhile, what was opened is closed and the thread ends (:meth:`discard`);
        a cancelled caller first waits for ``open`` to end on the thread (at most
        ``CLOSE_TIMEOUT_S``), so that no ``open`` runs on after its deployment was given up."""
        if self._thread is None:
            try:
                self.open()
            except BaseException:
                await self.discard()
                raise
            return
        opening = asyncio.ensure_future(self._thread.call(self.open))
        try:
            await asyncio.shield(opening)
        except BaseException:
            if not opening.done():
                with contextlib.suppress(BaseException):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(opening)
            await self.discard()
            raise

    async def discard(self) -> None:
        """Clean up a subtask that was opened (or tried to) but whose :meth:`run` never
        started, e.g. its deployment failed or was cancelled: close its operators, dispose its
        state, end its thread. Nothing once :meth:`run` started (run ends with the same) or
        after the first call."""
        if self._ran or self._discarded:
            return
        self._discarded = True
        await self._close_operators()

    def open(self) -> None:
        """Open operators with their (restored) state. Runs before the task reports RUNNING.

        A keyed subtask (its input edge hashes by ``key_field``) has one keyed backend shared by
        the operators of its chain (their state names carry the operator id); it is stored under
        the id ``<vertex>/keyed``. Each operator has its own operator-state backend."""
        restored_id = self.restore_data.checkpoint_id
        keyed = None
        if self.key_field is not None:
            keyed_id = f"{self.vertex_id}/keyed"
            keyed = create_keyed_backend(
                self.state_backend,
                self.max_parallelism,
                self.parallelism,
                self.subtask_index,
                name=keyed_id,
                job_id=self.job_id,
            )
            handles = self.restore_data.handles.get(keyed_id, {})
            if handles:
                keyed.restore([h for hs in handles.values() for h in hs])
            self.keyed[keyed_id] = keyed
        for index, op in enumerate(self.operators):
            op_id = getattr(op, "operator_id", "") or f"{self.vertex_id}-op{index}"
            op_state = OperatorStateBackend(name=op_id)
            self.operator_state[op_id] = op_state
            handles = self.restore_data.handles.get(op_id, {})
            if any(h.kind in (OPERATOR, UNION) for hs in handles.values() for h in hs):
                op_state.restore(
                    handles,
                    self.subtask_index,
                    self.parallelism,
                    old_parallelism=self.restore_data.previous_parallelism or None,
                )
            ctx = OperatorContext(
                vertex_id=self.vertex_id,
                operator_id=op_id,
                subtask_index=self.subtask_index,
                parallelism=self.parallelism,
                max_parallelism=self.max_parallelism,
                attempt=self.attempt,
                keyed_state=keyed,
                operator_state=op_state,
                key_field=self.key_field,
                restored_checkpoint_id=restored_id,
            )
            op.open(ctx)
        self._restore_end_of_data()

    def _restore_end_of_data(self) -> None:
        backend = self.operator_state.get(self._channel_state_owner())
        if backend is None or END_OF_DATA_STATE not in backend.state_names():
            return
        state = backend.get_union_list_state(END_OF_DATA_STATE)
        ended = set(state.get())
        old_parallelism = self.restore_data.previous_parallelism or self.parallelism
        if old_parallelism == self.parallelism:
            self._restored_ended = self.subtask_index in ended
        elif ended:
            # A rescaled subtask takes key groups of several old ones: it may skip end_input
            # only if all of them had run it.
            if ended != set(range(old_parallelism)):
                raise TaskFailedError(
                    "cannot rescale a vertex whose subtasks had partly ended their input "
                    f"(ended: {sorted(ended)} of {old_parallelism})"
                )
            self._restored_ended = True
        state.update([self.subtask_index] if self._restored_ended else [])

    def operator_ids(self) -> list[str]:
        return list(self.operator_state)

    def trigger(self, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions) -> None:
        """A checkpoint trigger from the coordinator (sources only)."""
        self._triggers.put_nowait((checkpoint_id, timestamp_ms, options))

    def notify_complete(self, checkpoint_id: int, final: bool = False) -> None:
        """The coordinator completed ``checkpoint_id``: the operators hear of it on the task
        thread, between two calls (a mail, as in Flink); the task's own bookkeeping at once."""
        self._last_completed_id = max(self._last_completed_id, checkpoint_id)
        if final:
            self._final_completed = True
        self._post(_notify_complete, self.operators, checkpoint_id)
        for backend in self.keyed.values():  # incremental backends reuse its files from now on
            self._post(backend.notify_checkpoint_complete, checkpoint_id)
        self._completed.set()

    def notify_aborted(self, checkpoint_id: int) -> None:
        self._post(_notify_aborted, self.operators, checkpoint_id)
        if self._stopping_at == checkpoint_id:
            self._stopping_at = 0  # a failed stop-with-savepoint: the job goes on (or fails
            self._completed.set()  # over after a drain, see _run_source)

    async def run(self) -> None:
        self._ran = True
        try:
            await self._replay_channel_state()
            if self.source is not None:
                await self._run_source()
            else:
                await self._run_input()
            await self._finish()
        finally:
            for task in list(self._async_parts):
                task.cancel()
            await self._close_operators()

    # --- the task thread -------------------------------------------------------------------

    async def _user(self, fn: Callable[..., T], *args: Any) -> T:
        """Run operator code on the task thread (in order, after posted notices) and wait for
        it; the agent's loop stays free meanwhile."""
        if self._thread is None:
            return fn(*args)
        return await self._thread.call(fn, *args)

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._closing:
            return  # closed and disposed, or about to be: nothing more reaches the operators
        if self._thread is not None:
            self._thread.post(fn, *args)
        elif self._deferred is not None:
            self._deferred.append((fn, args))  # a batch is between two steps: after it
        else:
            self._run_posted(fn, args)

    def _run_posted(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """A notice on the loop: a failure is logged, as the task thread logs it
        (``TaskThread.post``); it neither fails the task nor stops the notices after it."""
        try:
            fn(*args)
        except Exception as e:
            self._log.warning("task.posted_call_failed", error=repr(e))

    async def _process_in_steps(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """Operators on the loop: run ``batch`` through the chain, giving the loop a turn at
        the first step after every ``LOOP_SLICE_S``. Meanwhile only other coroutines run; this
        task's mailbox waits, so no snapshot splits the batch, and notices posted meanwhile
        run after it (as on the task thread, between two calls)."""
        steps = self.chain.process_batch_steps(batch)
        deferred: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._deferred = deferred
        wall_ns = cpu_ns = 0
        slice_ns = int(LOOP_SLICE_S * 1e9)
        try:
            turn_at = time.perf_counter_ns() + slice_ns
            while True:
                started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
                try:
                    next(steps)
                except StopIteration as done:
                    out: list[pa.RecordBatch] = done.value
                    return out
                finally:
                    now = time.perf_counter_ns()
                    wall_ns += now - started
                    cpu_ns += time.thread_time_ns() - cpu_started
                if now >= turn_at:
                    await asyncio.sleep(0)
                    turn_at = time.perf_counter_ns() + slice_ns
        finally:
            steps.close()  # a batch cut short (an error, a cancellation) ends its generator now
            self._deferred = None
            for fn, args in deferred:
                self._run_posted(fn, args)
            self._measured(wall_ns, cpu_ns)

    def _measured(self, wall_ns: int, cpu_ns: int) -> None:
        """A call of operators on the loop took this long: move them to a task thread when
        their calls block (``Placement``)."""
        if self._placement is None or self._thread is not None:
            return
        move = self._placement.on_call(wall_ns, cpu_ns)
        if move is not None:
            self._thread = TaskThread(self.name)
            self._log.info(
                "task.moved_to_thread",
                calls=move.calls,
                wall_ms=round(move.wall_ms, 1),
                blocked_ms=round(move.blocked_ms, 1),
            )

    def _poll_on_loop(
        self, max_records: int
    ) -> tuple[int, list[pa.RecordBatch], int | None] | None:
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return self._poll_source(max_records)
        finally:
            self._measured(time.perf_counter_ns() - started, time.thread_time_ns() - cpu_started)

    async def _close_operators(self) -> None:
        """Close the operators, then dispose the keyed backends (the disk backend's local
        files), on the thread the operators run on: a notice posted before cannot run
        concurrently with the disposal, and none posted after runs at all. If user code does not
        return within ``CLOSE_TIMEOUT_S``, the state is left undisposed under it (logged)."""
        self._closing = True
        backends = list(self.keyed.values())
        thread = self._thread
        if thread is None:
            _close_and_dispose(self.operators, backends)
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await thread.call(_close_and_dispose, self.operators, backends)
        except TimeoutError:
            self._log.warning("task.close_timed_out", timeout_s=CLOSE_TIMEOUT_S)
        finally:
            thread.close()

    async def _finish(self) -> None:
        """Input ended: flush, wait until everything emitted is covered by a completed
        checkpoint (two-phase-commit sinks commit on that notification), then end the
        partitions downstream."""
        if self._stopped_with_savepoint:
            pass  # the savepoint covers everything; nothing more is emitted or committed
        elif self.source is not None:
            await self._end_data()
            # Only now may a snapshot say input_ended (be final): its barrier follows end of data.
            self._end_of_input = True
            if self.periodic_checkpoints:
                # A final checkpoint must cover the last records before the sources end.
                await self._serve_triggers_until_covered()
            elif self.request_final_checkpoint is not None:
                requester = asyncio.ensure_future(self.request_final_checkpoint())
                try:
                    await self._serve_triggers_until_covered()
                finally:
                    requester.cancel()
        else:
            # end_input ran at end of data (_end_data); end of partition without end of data on
            # every input (a stop-with-savepoint without drain) does not run it, as in Flink.
            while self._last_snapshot_id > self._last_completed_id or self._async_parts:
                self._completed.clear()
                if self._async_parts:
                    await asyncio.wait(list(self._async_parts))
                    continue
                await self._completed.wait()
        for edge in self.outputs:
            for channel in edge.channels:
                await channel.close()

    async def _end_data(self) -> None:
        """The input ended: flush the chain (``end_input``; not again after a restore from a
        snapshot taken after it), a source emits the maximum watermark, then end of data goes on
        every output channel, ahead of the final checkpoint's barrier."""
        if self._ended_data:
            return
        self._ending_data = True
        if not self._restored_ended:
            await self._emit(await self._user(self.chain.end_input))
        if self.source is not None and self._watermark < MAX_WATERMARK:
            await self._advance_watermark(MAX_WATERMARK)
        self._ended_data = True
        await self._user(self._record_end_of_data)
        frame = EndOfDataFrame()
        for edge in self.outputs:
            for channel in edge.channels:
                await channel.send(frame)
        self._ending_data = False

    def _record_end_of_data(self) -> None:
        owner = self._channel_state_owner()
        backend = self.operator_state.setdefault(owner, OperatorStateBackend(name=owner))
        backend.get_union_list_state(END_OF_DATA_STATE).update([self.subtask_index])

    # --- sources -----------------------------------------------------------------------------

    def _poll_source(self, max_records: int) -> tuple[int, list[pa.RecordBatch], int | None] | None:
        """On the task thread: one poll of the source and the chain's output for it, with the
        source's watermark after it. None when the source is finished."""
        assert self.source is not None
        batch = self.source.poll_batch(max_records)
        if batch is None:
            return None
        if batch.num_rows == 0:
            return 0, [], None
        out = self.chain.process_batch(batch)
        watermark = getattr(self.source, "current_watermark", lambda: None)()
        return batch.num_rows, out, watermark

    def _source_poll_records(self) -> int:
        """What one poll may take: at most the configured batch, and no more than one frame of
        the debloated size per output channel (``snapflow.worker.runtime.debloat``), so that a
        barrier injected after the poll waits behind one such frame per channel, not a whole
        source batch."""
        n = self.source_batch_records
        for edge in self.outputs:
            caps = [c.max_frame_rows for c in edge.channels]
            if not caps or any(cap is None for cap in caps):
                continue
            fan_out = 1 if isinstance(edge.partitioner, BroadcastPartitioner) else len(caps)
            n = min(n, min(cap for cap in caps if cap is not None) * fan_out)
        return max(1, n)

    async def _run_source(self) -> None:
        assert self.source is not None
        if self._restored_ended:
            return  # it ended before the snapshot it restored (end of input or a drain)
        while True:
            while not self._triggers.empty():
                await self._snapshot_at_source(*self._triggers.get_nowait())
            if self._ended_data and not self._stopping_at:
                # A stop-with-savepoint with drain failed after end of data went downstream:
                # the tasks there ran end_input, so the job cannot go on; restart it from its
                # latest completed checkpoint (Flink fails the task too).
                raise TaskFailedError("stop-with-savepoint with drain failed after end of data")
            if self._stopping_at:
                # Stop-with-savepoint: emit nothing more; end once it completed, resume if it
                # was aborted.
                self._completed.clear()
                if self._last_completed_id >= self._stopping_at:
                    self._stopped_with_savepoint = True
                    return
                await self._completed.wait()
                continue
            if not await self._output_has_room():
                continue  # a trigger came first (or a while passed): the top takes it
            if self._thread is None:
                polled = self._poll_on_loop(self._source_poll_records())
            else:
                polled = await self._thread.call(self._poll_source, self._source_poll_records())
            if polled is None:
                return
            rows, out, watermark = polled
            if rows == 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.005):
                        await self._wait_trigger()
                continue
            self.records_in += rows
            await self._emit(out)
            if watermark is not None and watermark > self._watermark:
                await self._advance_watermark(watermark)
            await asyncio.sleep(0)

    async def _output_has_room(self) -> bool:
        """Poll the source only when every output channel would hand its next frame over at
        once (``OutputChannel.has_room``): a batch polled into full channels would wait at the
        producer, and a barrier injected meanwhile would queue behind it as well as behind the
        frames the consumers hold (Flink's sources likewise emit only while their output is
        available). True: poll; False: a trigger is pending or ``BACKPRESSURE_POLL_S`` passed."""
        channels = [c for edge in self.outputs for c in edge.channels]
        blocked = next((c for c in channels if not c.has_room()), None)
        if blocked is None:
            return True
        if not self._triggers.empty():
            return False
        room = asyncio.ensure_future(blocked.wait_for_room())
        trigger = asyncio.ensure_future(self._wait_trigger())
        try:
            await asyncio.wait(
                [room, trigger], timeout=BACKPRESSURE_POLL_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in (room, trigger):
                waiter.cancel()
            await asyncio.gather(room, trigger, return_exceptions=True)
        return all(c.has_room() for c in channels) and self._triggers.empty()

    async def _wait_trigger(self) -> None:
        item = await self._triggers.get()
        self._triggers.put_nowait(item)

    async def _serve_triggers_until_covered(self) -> None:
        """The source's input ended: keep taking checkpoints (with the final position) until one
        completes that the coordinator marks final, i.e. every source of the job had ended
        before it. Only then do the partitions end: an earlier end would stop the checkpoints
        of the sources that are still running (FLIP-147's end of input, slimmed)."""
        while not self._final_completed:
            while not self._triggers.empty():
                await self._snapshot_at_source(*self._triggers.get_nowait())
            if self._final_completed:
                return
            self._completed.clear()
            waiter = asyncio.ensure_future(self._wait_trigger())
            done = asyncio.ensure_future(self._completed.wait())
            await asyncio.wait([waiter, done], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            done.cancel()

    async def _snapshot_at_source(
        self, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions
    ) -> None:
        if checkpoint_id <= self._last_snapshot_id:
            return
        if options.kind is CheckpointKind.SAVEPOINT_TERMINATE:
            # Drain, as Flink's: the maximum watermark (fire every event-time timer), end_input
            # and end of data go ahead of the savepoint's barrier, so it covers their output.
            await self._end_data()
        if options.kind.is_synchronous:  # stop-with-savepoint
            self._stopping_at = checkpoint_id
        if self._end_of_input and options.mode is not CheckpointMode.AT_LEAST_ONCE:
            # A checkpoint may be the job's final one only if every source had ended, and the
            # final one must carry no in-flight data: nothing checkpoints after it, so data in
            # channel state would never reach a committed transaction. Ended sources therefore
            # inject aligned barriers that do not time out.
            options = dataclasses.replace(
                options, mode=CheckpointMode.ALIGNED, aligned_checkpoint_timeout_ms=0
            )
        unaligned = options.mode is CheckpointMode.UNALIGNED
        await self._take_snapshot(
            checkpoint_id, timestamp_ms, options, unaligned, 0, max(0, now_ms() - timestamp_ms)
        )

    # --- input-driven tasks ------------------------------------------------------------------

    async def _run_input(self) -> None:
        assert self.gate is not None and self.handler is not None
        gate, handler = self.gate, self.handler
        # at least once never blocks a channel: no barrier has to overtake anything
        exactly_once = isinstance(handler, b.SingleCheckpointBarrierHandler)
        while True:
            deadline = handler.next_deadline_ms()
            if deadline is not None and now_ms() >= deadline:
                # Checked before every frame, so a gate that always has data to deliver cannot
                # delay the switch to unaligned past the aligned-checkpoint timeout.
                await self._execute(handler.on_timer(now_ms()))
                continue
            # An aligned barrier that timed out while queued behind data in an input channel
            # overtakes it (Flink's announced barriers); the gate returns it next.
            queued = gate.barrier_deadline_ms() if exactly_once else None
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
            channel, frame = item
            if isinstance(frame, DataFrame):
                batch = frame.batch
                persisting = self._persisting.get(channel)
                if persisting is not None and persisting in self._pending:
                    self._pending[persisting].input_state.append((channel, batch))
                if gate.blocked:
                    for cid in self._pending:
                        self._alignment_bytes[cid] = (
                            self._alignment_bytes.get(cid, 0) + batch.nbytes
                        )
                self.records_in += batch.num_rows
                if self._thread is None:
                    await self._emit(await self._process_in_steps(batch))
                    # Operators ran on the loop: give it a turn after every batch, as a source
                    # does after every poll. The gate returns buffered frames without waiting,
                    # so without this a backlogged task would process all of them in one turn
                    # of the loop, and triggers, credits, acks and heartbeats would wait.
                    await asyncio.sleep(0)
                else:
                    await self._emit(await self._thread.call(self.chain.process_batch, batch))
            elif isinstance(frame, BarrierFrame):
                await self._execute(
                    handler.on_barrier(channel, barrier_from_frame(frame), now_ms())
                )
            elif isinstance(frame, CancelMarkerFrame):
                await self._execute(
                    handler.on_cancel_marker(channel, frame.checkpoint_id, now_ms())
                )
            elif isinstance(frame, EndOfDataFrame):
                self._data_ended[channel] = True
                if all(self._data_ended):
                    await self._end_data()
            elif isinstance(frame, EndOfPartitionFrame):
                await self._execute(handler.on_end_of_partition(channel, now_ms()))
                self._channel_watermarks[channel] = MAX_WATERMARK
                await self._maybe_advance_watermark()
            elif isinstance(frame, WatermarkFrame):
                self._channel_watermarks[channel] = max(
                    self._channel_watermarks[channel], frame.timestamp_ms
                )
                await self._maybe_advance_watermark()
            elif isinstance(frame, LatencyMarkerFrame):
                for edge in self.outputs:
                    for out in edge.channels:
                        await out.send(frame)
            else:
                _unknown("frame", frame)

    async def _maybe_advance_watermark(self) -> None:
        assert self.gate is not None
        candidates = [
            w
            for i, w in enumerate(self._channel_watermarks)
            if not self.gate.is_ended(i) or w == MAX_WATERMARK
        ]
        if not candidates:
            return
        combined = min(candidates)
        if combined > self._watermark:
            await self._advance_watermark(combined)

    async def _advance_watermark(self, watermark: int) -> None:
        self._watermark = watermark
        await self._emit(await self._user(self.chain.process_watermark, watermark))
        frame = WatermarkFrame(watermark)
        for edge in self.outputs:
            for channel in edge.channels:
                await channel.send(frame)

    async def _execute(self, actions: list[b.Action]) -> None:
        assert self.gate is not None
        for action in actions:
            if isinstance(action, b.BlockChannel):
                self.gate.block(action.channel)
            elif isinstance(action, b.UnblockChannels):
                for channel in action.channels:
                    self.gate.unblock(channel)
            elif isinstance(action, b.TriggerSnapshot):
                await self._take_snapshot(
                    action.checkpoint_id,
                    action.timestamp_ms,
                    action.options,
                    action.unaligned,
                    action.alignment_duration_ms,
                    action.start_delay_ms,
                )
            elif isinstance(action, b.StartPersistingChannel):
                self._persisting[action.channel] = action.checkpoint_id
            elif isinstance(action, b.PersistOvertakenData):
                pending = self._pending.get(action.checkpoint_id)
                if pending is not None:
                    for data in self.gate.persist_queued(action.channel):
                        pending.input_state.append((action.channel, data.batch))
            elif isinstance(action, b.StopPersistingChannel):
                self._persisting.pop(action.channel, None)
            elif isinstance(action, b.SwitchToUnaligned):
                self._log.info(
                    "checkpoint.switched_to_unaligned", checkpoint_id=action.checkpoint_id
                )
            elif isinstance(action, b.AbortCheckpoint):
                await self._abort(action.checkpoint_id, action.reason)
            elif isinstance(action, b.CheckpointCompleteOnInput):
                pending = self._pending.get(action.checkpoint_id)
                if pending is not None:
                    pending.input_complete.set()
            else:
                _unknown("barrier action", action)

    async def _abort(self, checkpoint_id: int, reason: b.BarrierAbortReason) -> None:
        self._pending.pop(checkpoint_id, None)
        self._persisting = {c: n for c, n in self._persisting.items() if n != checkpoint_id}
        marker = CancelMarkerFrame(checkpoint_id)
        for edge in self.outputs:
            for channel in edge.channels:
                channel.send_priority(marker)
        await self.decline(checkpoint_id, reason.decline_reason, f"{self.name}: {reason.value}")

    # --- snapshots ---------------------------------------------------------------------------

    async def _take_snapshot(
        self,
        checkpoint_id: int,
        timestamp_ms: int,
        options: BarrierOptions,
        unaligned: bool,
        alignment_duration_ms: int,
        start_delay_ms: int,
    ) -> None:
        started = time.perf_counter()
        pending = _PendingSnapshot(
            checkpoint_id,
            timestamp_ms,
            options,
            unaligned,
            alignment_duration_ms,
            start_delay_ms,
            started,
            [],
        )
        pending.input_ended = self.source is not None and self._end_of_input
        pending.records_in = self.records_in
        if self.gate is None:
            pending.input_complete.set()  # a source has no input channels
        self._pending[checkpoint_id] = pending
        previous_snapshot_id = self._last_snapshot_id
        self._last_snapshot_id = max(self._last_snapshot_id, checkpoint_id)
        # The barrier goes downstream first, then the state is taken (Flink's order: nothing
        # is processed in between, and downstream can align meanwhile).
        barrier = BarrierFrame(checkpoint_id, timestamp_ms, options)
        # Output channels are numbered across all edges, in order (the replay uses the same).
        channels = [c for edge in self.outputs for c in edge.channels]
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
            pending.snapshots = await self._user(self._sync_snapshot, checkpoint_id, options)
        except Exception as e:
            self._pending.pop(checkpoint_id, None)
            self._last_snapshot_id = previous_snapshot_id
            self._log.warning(
                "checkpoint.snapshot_failed", checkpoint_id=checkpoint_id, error=str(e)
            )
            # Downstream has the barrier already: tell it not to wait for this checkpoint.
            marker = CancelMarkerFrame(checkpoint_id)
            for channel in channels:
                with contextlib.suppress(ChannelError):
                    channel.send_priority(marker)
            await self.decline(checkpoint_id, DeclineReason.SNAPSHOT_FAILED, f"{self.name}: {e}")
        else:
            pending.sync_duration_ms = int((time.perf_counter() - started) * 1000)
            self._spawn(self._complete_snapshot(pending))

    def _sync_snapshot(
        self, checkpoint_id: int, options: BarrierOptions | None = None
    ) -> list[tuple[str, SnapshotInProgress]]:
        """On the task thread: the synchronous part of a snapshot."""
        for op in self.operators:
            op.snapshot_state(checkpoint_id)
        snapshots: list[tuple[str, SnapshotInProgress]] = []
        for op_id, backend in self.keyed.items():
            snapshots.append((op_id, backend.snapshot(checkpoint_id, options)))
        for op_id, op_backend in self.operator_state.items():
            snapshots.append((op_id, op_backend.snapshot(checkpoint_id)))
        return snapshots

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._async_parts.add(task)
        task.add_done_callback(self._async_parts.discard)

    async def _output_alignment_timeout(
        self, pending: _PendingSnapshot, channels: list[OutputChannel]
    ) -> None:
        """Aligned with a timeout, output side: a barrier still queued in an output channel
        when the timeout passes (measured from the checkpoint's trigger, as on the input side)
        becomes unaligned and overtakes the data queued ahead of it, which becomes output
        channel state (Flink converts it in the output subpartition too)."""
        checkpoint_id = pending.checkpoint_id
        try:
            waits = [channel.barrier_sent(checkpoint_id) for channel in channels]
            deadline_ms = pending.timestamp_ms + pending.options.aligned_checkpoint_timeout_ms
            remaining_s = (deadline_ms - now_ms()) / 1000.0
            if remaining_s > 0:
                await asyncio.wait(waits, timeout=remaining_s)
            if checkpoint_id not in self._pending:
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

    def _snapshot_dir(self, options: BarrierOptions) -> str:
        return _join(
            options.target_location, f"{self.vertex_id}-{self.subtask_index}-{self.attempt}"
        )

    async def _complete_snapshot(self, pending: _PendingSnapshot) -> None:
        checkpoint_id = pending.checkpoint_id
        try:
            await pending.input_complete.wait()
            await pending.output_complete.wait()
            if checkpoint_id not in self._pending:
                return  # aborted meanwhile
            directory = self._snapshot_dir(pending.options)
            started = time.perf_counter()
            handles_by_op, size, in_flight = await asyncio.to_thread(
                self._write_snapshot, directory, pending
            )
            async_ms = int((time.perf_counter() - started) * 1000)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._pending.pop(checkpoint_id, None)
            self._log.warning(
                "checkpoint.snapshot_failed", checkpoint_id=checkpoint_id, error=str(e)
            )
            await self.decline(checkpoint_id, DeclineReason.SNAPSHOT_FAILED, f"{self.name}: {e}")
            return
        finally:
            # on the thread the snapshot was taken on, between two calls: the backend's
            # copy-on-write bookkeeping is the task thread's (SnapshotInProgress.release)
            for _, snap in pending.snapshots:
                self._post(_release, snap)
        if self._pending.pop(checkpoint_id, None) is None:
            return
        report = SnapshotReport(
            checkpoint_id=checkpoint_id,
            operator_states=sorted(handles_by_op.items()),
            sync_duration_ms=pending.sync_duration_ms,
            async_duration_ms=async_ms,
            alignment_duration_ms=pending.alignment_duration_ms,
            start_delay_ms=pending.start_delay_ms,
            state_size_bytes=size,
            processed_during_alignment_bytes=self._alignment_bytes.pop(checkpoint_id, 0),
            persisted_in_flight_bytes=in_flight,
            unaligned=pending.unaligned,
            input_ended=pending.input_ended,
            records_in=pending.records_in,
        )
        await self.ack(report)

    def _write_snapshot(
        self, directory: str, pending: _PendingSnapshot
    ) -> tuple[dict[str, list[StateHandle]], int, int]:
        """Write the snapshot's files. Locally one file per state and channel, as written. On
        an object store all of them go into one object (one PUT per subtask and checkpoint,
        none for empty state), each handle naming its byte range in it."""
        merged = (
            MergedStateObject(
                _join(directory, f"chk{pending.checkpoint_id}-{uuid.uuid4().hex[:12]}.merged")
            )
            if is_object_store_uri(directory)
            else None
        )
        handles: dict[str, list[StateHandle]] = {}
        size = 0
        for op_id, snap in pending.snapshots:
            written = snap.write(_join(directory, op_id), into=merged)
            handles.setdefault(op_id, []).extend(written)
            size += sum(h.size_bytes for h in written)
        in_flight = 0
        channel_handles = []
        for kind, data in (
            (CHANNEL_INPUT, pending.input_state),
            (CHANNEL_OUTPUT, pending.output_state),
        ):
            by_channel: dict[int, list[pa.RecordBatch]] = {}
            for channel, batch in data:
                if batch.num_rows:  # an empty batch replays as nothing: no file for it
                    by_channel.setdefault(channel, []).append(batch)
            for channel, batches in sorted(by_channel.items()):
                offset = 0
                if merged is None:
                    path = os.path.join(directory, f"{kind}-{channel}.arrow")
                    written_bytes = _write_batches(path, batches)
                else:
                    buffer = _batches_to_buffer(batches)
                    path, offset = merged.path, merged.add([memoryview(buffer)])
                    written_bytes = buffer.size
                in_flight += written_bytes
                # key_group_start carries the channel index for channel state handles
                channel_handles.append(
                    StateHandle(path, written_bytes, kind, channel, channel, offset)
                )
        if channel_handles:
            handles.setdefault(self._channel_state_owner(), []).extend(channel_handles)
            size += in_flight
        if merged is not None:
            merged.write()
        return handles, size, in_flight

    def _channel_state_owner(self) -> str:
        return next(iter(self.operator_state), f"{self.vertex_id}-op0")

    async def _replay_channel_state(self) -> None:
        """Unaligned restore: in-flight data first, output state downstream, input state through
        the chain, before any new input."""
        own = self.restore_data.handles.get(self._channel_state_owner(), {}).get(
            self.subtask_index, []
        )
        channel_handles = [h for h in own if h.kind in (CHANNEL_INPUT, CHANNEL_OUTPUT)]
        if not channel_handles:
            return
        if self.restore_data.previous_parallelism not in (0, self.parallelism):
            raise TaskFailedError(
                "restoring in-flight data of an unaligned checkpoint needs the same parallelism; "
                "take a savepoint (always aligned) to change parallelism"
            )
        for h in sorted(
            channel_handles, key=lambda h: (h.kind != CHANNEL_OUTPUT, h.key_group_start)
        ):
            batches = await asyncio.to_thread(_read_batches, h.path, h.offset, h.size_bytes)
            if h.kind == CHANNEL_OUTPUT:
                channels = [c for edge in self.outputs for c in edge.channels]
                target = channels[h.key_group_start] if h.key_group_start < len(channels) else None
                for batch in batches:
                    if target is not None:
                        await target.send(DataFrame(batch))
            else:
                for batch in batches:
                    await self._emit(await self._user(self.chain.process_batch, batch))

    # --- output ------------------------------------------------------------------------------

    async def _emit(self, batches: list[pa.RecordBatch]) -> None:
        # Everything one input produced is enqueued before the task waits for credit: a barrier
        # taken while it waits (a trigger at a source, an unaligned barrier elsewhere) must find
        # all of it before the barrier (in the channels, or in the output channel state), since
        # the input that produced it is already behind the snapshot. Flink's overdraft buffers
        # (FLIP-227) serve the same purpose. Memory stays bounded by one input batch's output.
        sends: list[Coroutine[Any, Any, None]] = []
        for batch in batches:
            if batch.num_rows == 0:
                continue
            self.records_out += batch.num_rows
            sends.extend(
                edge.channels[index].send(DataFrame(part))
                for edge in self.outputs
                for index, part in edge.partitioner.partition(batch)
            )
        if not sends:
            return
        if len(sends) == 1 and not self._backpressured():
            await sends[0]
        else:
            await self._await_sends(await self._start_sends(sends))

    def _backpressured(self) -> bool:
        return any(c.queued_data > 0 for edge in self.outputs for c in edge.channels)

    async def _start_sends(
        self, sends: list[Coroutine[Any, Any, None]]
    ) -> list[asyncio.Future[None]]:
        """Start the sends; once this returns every one has enqueued its frame (``send``
        enqueues before it waits for credit)."""
        tasks: list[asyncio.Future[None]] = [asyncio.ensure_future(send) for send in sends]
        await asyncio.sleep(0)
        return tasks

    async def _await_sends(self, tasks: list[asyncio.Future[None]]) -> None:
        """Await started sends while still taking what must not wait behind backpressure
        (the mailbox): a checkpoint trigger at a source, an unaligned barrier or a cancel
        marker at other tasks. Every part is enqueued already, so a snapshot taken meanwhile
        has the whole batch before its barrier: aligned barriers queue behind it, unaligned
        ones overtake it and it becomes output channel state."""
        while not all(task.done() for task in tasks):
            await self._serve_mailbox()
            if all(task.done() for task in tasks):
                break
            await asyncio.wait(tasks, timeout=BACKPRESSURE_POLL_S)
        for task in tasks:
            task.result()  # a failed channel fails the task

    async def _serve_mailbox(self) -> None:
        """What may not wait for the output: checkpoint triggers at a source, priority frames
        (unaligned barriers, cancel markers) elsewhere."""
        if self.source is not None:
            # Not while flushing at end of input: a barrier must not split end_input's output
            # from its end of data.
            while not self._ending_data and not self._triggers.empty():
                await self._snapshot_at_source(*self._triggers.get_nowait())
        elif self.gate is not None and self.handler is not None:
            queued = (
                self.gate.barrier_deadline_ms()
                if isinstance(self.handler, b.SingleCheckpointBarrierHandler)
                else None
            )
            if queued is not None and now_ms() >= queued:
                self.gate.convert_timed_out_barriers(now_ms())
            if any(c.priority_pending for c in self.gate.channels):
                item = self.gate.poll()
                if item is not None:
                    await self._handle_priority(*item)

    async def _handle_priority(self, channel: int, frame: Frame) -> None:
        assert self.handler is not None
        if isinstance(frame, BarrierFrame):
            await self._execute(
                self.handler.on_barrier(channel, barrier_from_frame(frame), now_ms())
            )
        elif isinstance(frame, CancelMarkerFrame):
            await self._execute(
                self.handler.on_cancel_marker(channel, frame.checkpoint_id, now_ms())
            )
        else:
            # Only unaligned barriers and cancel markers overtake data (frames.is_priority).
            raise TypeError(f"{type(frame).__name__} is not a priority frame")


def _notify_complete(operators: list[Operator], checkpoint_id: int) -> None:
    for op in operators:
        op.notify_checkpoint_complete(checkpoint_id)


def _notify_aborted(operators: list[Operator], checkpoint_id: int) -> None:
    for op in operators:
        op.notify_checkpoint_aborted(checkpoint_id)


def _close_and_dispose(operators: list[Operator], backends: list[KeyedStateBackend]) -> None:
    for op in operators:
        with contextlib.suppress(Exception):
            op.close()
    for backend in backends:
        with contextlib.suppress(Exception):
            backend.dispose()


def _release(snapshot: SnapshotInProgress) -> None:
    # A snapshot whose write was cut short (a cancelled task) is still "writing": the backend
    # reaps it at its next snapshot.
    with contextlib.suppress(Exception):
        snapshot.release()


def _unknown(what: str, value: Never) -> NoReturn:
    # mypy proves every dispatch exhaustive (``value`` is narrowed to Never); at run time a
    # new type that was not handled fails the task instead of being dropped silently.
    raise TypeError(f"unknown {what}: {value!r}")


def _join(location: str, name: str) -> str:
    """``name`` under a local directory or an ``s3://`` prefix (object keys join with '/')."""
    if is_object_store_uri(location):
        return store_for(location).join(location, name)
    return os.path.join(location, name)


def _batches_to_buffer(batches: list[pa.RecordBatch]) -> pa.Buffer:
    """Channel state as an Arrow IPC file in memory (to be written whole to an object store)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def _write_batches(path: str, batches: list[pa.RecordBatch]) -> int:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    os.replace(tmp, path)
    return os.path.getsize(path)


def _read_batches(path: str, offset: int = 0, size: int = 0) -> list[pa.RecordBatch]:
    """Channel state written by :meth:`Subtask._write_snapshot`: a whole local file (memory
    mapped), or ``size`` bytes at ``offset`` of a file or object (one ranged GET)."""
    if not offset and not is_object_store_uri(path):
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]
    store = store_for(path)
    data = store.read_range(path, offset, size) if size else store.read(path)
    reader = pa.ipc.open_file(pa.py_buffer(data))
    return [reader.get_batch(i) for i in range(reader.num_record_batches)]

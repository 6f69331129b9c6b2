"""A subtask: one parallel instance of a vertex's operator chain (Flink's StreamTask), as the
agent sees it: built, opened, run, told of checkpoints, discarded.

The pieces, one module each:

* ``task_lifecycle``: the pure lifecycle (phases, end of input, final checkpoint,
  stop-with-savepoint); every decision about what the task does next is its;
* ``task_shell``: feeds it events and executes its actions;
* ``source_loop`` / ``input_loop``: the two ways a task is driven (a source polled between
  triggers; inputs read through the barrier handler, ``barriers``);
* ``subtask_checkpoints`` and ``snapshot_writer``: taking a snapshot and writing its files;
* ``task_state``: the state backends, restore and the synchronous part;
* ``task_output``: partitioning onto the output channels, backpressure;
* ``operator_runner``: where user code runs (task thread, or the loop in steps);
* ``busy_time``: busy and backpressured time, reported with the watermark (``metrics``).

Restore: channel state of an unaligned checkpoint is replayed before any new input (output
channel state is sent first downstream, input channel state is processed first, as data of the
input whose channel it was captured on), which needs an unchanged parallelism.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from snapflow.checkpointing import CHANNEL_OUTPUT, BarrierOptions, CheckpointMode
from snapflow.event_time import MIN_WATERMARK
from snapflow.state_backend_options import HEAP
from snapflow.task_metrics import TaskMetrics
from snapflow.worker.runtime import barriers as b
from snapflow.worker.runtime.busy_time import BusyTimeMeter
from snapflow.worker.runtime.chain import Chain
from snapflow.worker.runtime.frames import DataFrame
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.input_loop import InputLoop
from snapflow.worker.runtime.operator import Operator, SourceOperator
from snapflow.worker.runtime.operator_runner import OperatorRunner
from snapflow.worker.runtime.placement import PlacementSettings, builtins_only
from snapflow.worker.runtime.snapshot_writer import read_channel_state
from snapflow.worker.runtime.source_loop import SOURCE_BATCH_RECORDS, SourceLoop
from snapflow.worker.runtime.subtask_checkpoints import AckFn, DeclineFn
from snapflow.worker.runtime.task_lifecycle import (
    AllPartitionsEnded,
    CheckpointAborted,
    CheckpointCompleted,
    Discard,
    FinalCheckpoint,
    Opened,
    Phase,
    RunEnded,
    RunStarted,
    TaskLifecycle,
)
from snapflow.worker.runtime.task_output import OutputEdge, TaskOutput
from snapflow.worker.runtime.task_shell import TaskShell
from snapflow.worker.runtime.task_state import RestoreData, SubtaskIdentity, TaskState
from snapflow.worker.state.factory import StateBackendConfig

log = structlog.get_logger("snapflow.worker")


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
        key_fields: Sequence[str | None],
        gate: InputGate | None,
        outputs: list[OutputEdge],
        mode: CheckpointMode,
        restore: RestoreData,
        ack: AckFn,
        decline: DeclineFn,
        source_batch_records: int = SOURCE_BATCH_RECORDS,
        periodic_checkpoints: bool = True,
        request_final_checkpoint: Callable[[], Awaitable[None]] | None = None,
        report_data_ended: Callable[[], Awaitable[None]] | None = None,
        task_thread: bool = False,
        placement: PlacementSettings | None = None,
        state_backend: StateBackendConfig | str | None = None,
        builtins_on_loop: bool = False,
    ) -> None:
        """``periodic_checkpoints`` false: the job has no periodic checkpoints, so a source
        whose input ended does not wait for a final checkpoint (nothing would trigger it) and
        its sinks commit nothing more, unless ``request_final_checkpoint`` is given: then it
        asks the coordinator for one and waits for it as with them. ``report_data_ended``: tells
        the coordinator that this subtask's end of data went downstream (so that it triggers
        no checkpoint whose barrier would wait behind the end of input). ``task_thread``: operators
        run on a task thread of their own (agents pass ``DataplaneSettings.task_thread``, on by
        default); else on the loop, moving to a thread once their calls block when
        ``placement`` is given. ``state_backend``: the keyed state backend (heap or rocksdb,
        ``snapflow.worker.state.factory``). ``builtins_on_loop``: with ``task_thread``, operators
        that all run on the loop (``placement.builtins_only``) stay on the loop (agents pass
        ``DataplaneSettings.builtins_on_loop``, on by default)."""
        self.job_id = job_id
        self.vertex_id = vertex_id
        self.subtask_index = subtask_index
        self.attempt = attempt
        self.operators = list(operators)
        self.outputs = outputs
        self.name = f"{vertex_id}#{subtask_index}@{attempt}"
        self._log = log.bind(job_id=job_id, task=self.name)
        source = (
            self.operators[0]
            if self.operators and isinstance(self.operators[0], SourceOperator)
            else None
        )
        if periodic_checkpoints:
            final = FinalCheckpoint.WAIT
        elif request_final_checkpoint is not None:
            final = FinalCheckpoint.REQUEST
        else:
            final = FinalCheckpoint.NONE
        has_inputs = gate is not None and gate.num_channels > 0
        if source is None and not has_inputs:
            raise ValueError(f"{self.name}: a task without a source needs input channels")
        self.lifecycle = TaskLifecycle(
            is_source=source is not None,
            num_inputs=gate.num_inputs if source is None and gate is not None else 0,
            final_checkpoint=final,
            declines_ending_triggers=report_data_ended is not None,
        )
        self.state = TaskState(
            SubtaskIdentity(
                job_id, vertex_id, subtask_index, parallelism, max_parallelism, attempt
            ),
            key_fields=key_fields,
            backend=StateBackendConfig.parse(state_backend),
            restore=restore,
        )
        self.meter = BusyTimeMeter()
        """Busy and backpressured time, sampled by the agent's heartbeats (``metrics``)."""
        if task_thread and builtins_on_loop:
            keyed = any(k is not None for k in key_fields)
            task_thread = not builtins_only(
                self.operators,
                keyed_state_on_disk=keyed and self.state.backend.kind != HEAP,
            )
        self.runner = OperatorRunner(
            self.name,
            self._log,
            task_thread=task_thread,
            placement=placement,
            accepts_notices=lambda: self.lifecycle.accepts_notices,
            meter=self.meter,
        )
        self._output = TaskOutput(outputs, self.meter, self.state.side_outputs)
        self._shell = TaskShell(
            name=self.name,
            snapshot_dir=f"{vertex_id}-{subtask_index}-{attempt}",
            log=self._log,
            lifecycle=self.lifecycle,
            runner=self.runner,
            state=self.state,
            operators=self.operators,
            chain=Chain(self.operators[1:] if source is not None else self.operators),
            output=self._output,
            ack=ack,
            decline=decline,
            request_final_checkpoint=request_final_checkpoint,
            report_data_ended=report_data_ended,
        )
        self.source_loop: SourceLoop | None = None
        self.input_loop: InputLoop | None = None
        if source is not None:
            self.source_loop = SourceLoop(self._shell, source, source_batch_records)
        else:
            assert gate is not None
            self.input_loop = InputLoop(
                self._shell, gate, b.create_barrier_handler(mode, gate.num_channels)
            )

    @property
    def task_thread(self) -> bool:
        """Whether operators run on the subtask's task thread (else on the agent's loop)."""
        return self.runner.thread is not None

    @property
    def adaptive(self) -> bool:
        """Whether operators on the loop move to a task thread once their calls block."""
        return self.runner.adaptive

    @property
    def is_source(self) -> bool:
        """Whether the chain starts with a source (it takes the coordinator's triggers)."""
        return self.source_loop is not None

    @property
    def records_in(self) -> int:
        return self._shell.records_in

    @property
    def records_out(self) -> int:
        return self._output.records_out

    def metrics(self) -> TaskMetrics:
        """Busy and backpressured time since the previous call, and the watermark the task
        emitted last (the agent's heartbeats carry them to the coordinator)."""
        busy, backpressured, period_ms = self.meter.sample()
        watermark = self._shell.watermark
        return TaskMetrics(
            busy_ms_per_second=busy,
            backpressured_ms_per_second=backpressured,
            watermark_ms=None if watermark == MIN_WATERMARK else watermark,
            period_ms=period_ms,
        )

    # --- lifecycle -------------------------------------------------------------------------

    async def open_where_it_runs(self) -> None:
        """:meth:`open` where the operators run (their task thread, if any). If ``open``
        fails, or the caller is cancelled meanwhile, what was opened is closed and the thread
        ends (:meth:`discard`)."""
        try:
            await self.runner.open(self.open)
        except BaseException:
            await self.discard()
            raise

    def open(self) -> None:
        """Open operators with their (restored) state. Runs before the task reports RUNNING."""
        restored_end_of_data = self.state.open(self.operators)
        # Possibly on the task thread: straight to the lifecycle (nothing waits on the shell's
        # ``changed`` yet, and an asyncio event is the loop's to set).
        self.lifecycle.handle(Opened(restored_end_of_data))

    async def discard(self) -> None:
        """Clean up a subtask that was opened (or tried to) but whose :meth:`run` never
        started, e.g. its deployment failed or was cancelled: close its operators, dispose its
        state, end its thread. Nothing once :meth:`run` started (run ends with the same) or
        after the first call."""
        await self._shell.handle(Discard())

    def operator_ids(self) -> list[str]:
        return list(self.state.operator_state)

    def trigger(self, checkpoint_id: int, timestamp_ms: int, options: BarrierOptions) -> None:
        """A checkpoint trigger from the coordinator (sources only)."""
        if self.source_loop is None:
            raise ValueError(f"{self.name} is not a source: barriers reach it on its inputs")
        self.source_loop.trigger(checkpoint_id, timestamp_ms, options)

    def notify_complete(self, checkpoint_id: int, final: bool = False) -> None:
        """The coordinator completed ``checkpoint_id``: the operators hear of it on the task
        thread, between two calls (a mail, as in Flink); the task's own lifecycle at once."""
        self._shell.feed(CheckpointCompleted(checkpoint_id, final))

    def notify_aborted(self, checkpoint_id: int) -> None:
        self._shell.feed(CheckpointAborted(checkpoint_id))

    async def run(self) -> None:
        shell = self._shell
        await shell.handle(RunStarted())
        outcome = Phase.FAILED
        try:
            await self._replay_channel_state()
            if self.source_loop is not None:
                await self.source_loop.run()
                await self.source_loop.finish()
            else:
                assert self.input_loop is not None
                await self.input_loop.run()
                await shell.handle(AllPartitionsEnded())
                # Everything emitted must be covered by a completed checkpoint before the
                # partitions end (two-phase-commit sinks commit on its notification).
                while True:
                    shell.changed.clear()
                    if not self.lifecycle.waiting_for_checkpoints():
                        break
                    await shell.wait_changed()
            await self._output.close()
            outcome = Phase.FINISHED
        except asyncio.CancelledError:
            outcome = Phase.CANCELED
            raise
        finally:
            shell.checkpoints.cancel()
            shell.stop_requesting()
            await shell.handle(RunEnded(outcome))

    async def _replay_channel_state(self) -> None:
        """Unaligned restore: in-flight data first, output state downstream, input state through
        the chain, before any new input."""
        channels = self._output.channels
        for h in self.state.channel_state_to_replay():
            batches = await asyncio.to_thread(read_channel_state, h)
            if h.kind == CHANNEL_OUTPUT:
                target = channels[h.key_group_start] if h.key_group_start < len(channels) else None
                for batch in batches:
                    if target is not None:
                        await target.send(DataFrame(batch))
            else:
                # Input channel state exists only for tasks with inputs; the handle's key is the
                # gate's channel, so the data goes back to the input it was captured on.
                assert self.input_loop is not None
                input_index = self.input_loop.gate.input_of[h.key_group_start]
                for batch in batches:
                    await self.input_loop.process_input(input_index, batch)

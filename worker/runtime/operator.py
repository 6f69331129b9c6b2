"""The operator contract the task runtime drives.

A vertex runs a chain of operators in one task (Flink's operator chaining, ``chain.py``). The
concrete, user-facing operators live in :mod:`snapflow.worker.api.operators` and the sources
and sinks in :mod:`snapflow.worker.connectors`; the runtime only knows this contract.

Life cycle (driven by the task, ``snapflow.worker.runtime.task``)::

    op = pickle.loads(payload)          # operators are shipped pickled (cloudpickle)
    op.open(ctx)                        # ctx: OperatorContext; state already restored into
                                        # ctx.keyed_state / ctx.operator_state
    op.process_batch(batch) -> [batch, ...]
    op.process_watermark(wm_ms) -> [batch, ...]     # e.g. windows fire
    op.snapshot_state(checkpoint_id)    # synchronously, right before the backends snapshot
    op.notify_checkpoint_complete(id) / op.notify_checkpoint_aborted(id)
    op.process_input(i, batch) -> [batch, ...]      # heads with several inputs (connect,
                                        # joins): a batch of logical input i (0 goes to
                                        # process_batch by default)
    op.end_of_input(i) -> [batch, ...]  # several inputs: input i ended (not the last one too)
    op.end_input() -> [batch, ...]      # bounded input ended (end of data on every input):
                                        # flush; runs before the final checkpoint's snapshot
    op.close()

Conventions
    * Outputs never contain empty batches: a batch with no rows is dropped, and an operator that
      has nothing to emit returns ``[]``.
    * State names are prefixed with the operator's ``operator_id`` (``"<operator_id>/<name>"``),
      so operators chained in one task may share the task's backends. ``operator_id`` must
      therefore be stable across restarts of a job (it is the JobGraph's id of the operator).
    * Keyed operators (``ctx.keyed_state`` set) only ever see keys of their subtask's key-group
      range: the upstream edge is hash-partitioned by :class:`snapflow.worker.runtime.partitioners.KeyGroupPartitioner`
      on the same key field and max parallelism.
    * Side outputs: ``ctx.output(tag, batch)`` sends ``batch`` to the side output ``tag``
      (:class:`OutputTag`) instead of the operator's main output. It skips the rest of the
      chain and goes to the edges that carry that tag (none: dropped, as in Flink), in the same
      emit as the main output of the call that produced it, so before any later barrier.
    * Operators are picklable before :meth:`Operator.open`; the functions they wrap must be
      picklable by cloudpickle (lambdas and closures are).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from snapflow.checkpoint_config import CheckpointConfig
from snapflow.errors import InvalidArgumentError, StateError
from snapflow.event_time import MIN_WATERMARK
from snapflow.worker.state import keygroups as kgs
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.operator_state import OperatorStateBackend


@dataclass(frozen=True)
class OutputTag:
    """The name of a side output (Flink's ``OutputTag``): an operator emits to it with
    ``ctx.output(tag, batch)``; ``Stream.side_output(tag)`` reads it in the pipeline."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidArgumentError(f"OutputTag needs a non-empty name, got {self.name!r}")


@dataclass
class OperatorContext:
    """What the task hands to :meth:`Operator.open`. Built by the task, one per operator.

    ``keyed_state`` is set for keyed operators (those after a HASH edge, ``key_field`` given);
    both backends already hold the restored state when ``open`` runs
    (``restored_checkpoint_id`` > 0), or are empty on a fresh start (0).
    """

    vertex_id: str = "vertex"
    operator_id: str = "op"
    subtask_index: int = 0
    parallelism: int = 1
    max_parallelism: int = kgs.DEFAULT_MAX_PARALLELISM
    attempt: int = 0
    keyed_state: KeyedStateBackend | None = None
    operator_state: OperatorStateBackend = field(default_factory=OperatorStateBackend)
    key_field: str | None = None
    """The key field of the first keyed input (one-input keyed operators: the key)."""
    input_key_fields: tuple[str | None, ...] = ()
    """The key field of each logical input (None: that input is not keyed, e.g. a broadcast
    side); empty for a source."""
    restored_checkpoint_id: int = 0
    side_outputs: list[tuple[str, pa.RecordBatch]] = field(default_factory=list)
    """Side-output batches not yet sent, shared by the task's operators (``output``)."""

    @property
    def is_restored(self) -> bool:
        return self.restored_checkpoint_id > 0

    def state_name(self, name: str) -> str:
        """The backend name of this operator's state ``name``: ``"<operator_id>/<name>"``."""
        return f"{self.operator_id}/{name}"

    def output(self, tag: OutputTag, batch: pa.RecordBatch) -> None:
        """Emit ``batch`` to the side output ``tag`` (Flink's ``Context.output``)."""
        if not isinstance(tag, OutputTag):
            raise InvalidArgumentError(f"output() needs an OutputTag, got {tag!r:.80}")
        if batch.num_rows:
            self.side_outputs.append((tag.name, batch))

    def require_keyed_state(self, who: str) -> KeyedStateBackend:
        if self.keyed_state is None:
            raise InvalidArgumentError(
                f"{who} is a keyed operator: it needs keyed state (a HASH edge with a key "
                f"field before vertex {self.vertex_id!r}), but the context has none"
            )
        return self.keyed_state


class Operator:
    """Base class of every operator. Subclasses override what they need; the defaults do
    nothing and emit nothing (``process_batch`` forwards its input)."""

    ctx: OperatorContext | None = None
    #: attributes that exist only while running (set in open); never pickled
    _runtime_fields: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return type(self).__name__

    def runs_on_loop(self) -> bool:
        """Whether every call of this operator is short and never blocks: vectorised work
        bounded per batch, no I/O, no user function. A subtask whose operators all say so runs
        them on its agent's loop, in steps, rather than on a task thread: the hand-offs between
        the two threads cost such operators more than they save
        (``DataplaneSettings.builtins_on_loop``; docs/worker.md, "Where user code runs").
        Built-in operators that keep the promise return True; a user's operator may too."""
        return False

    def open(self, ctx: OperatorContext) -> None:
        self.ctx = ctx

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return [batch] if batch.num_rows else []

    def process_batch_steps(
        self, batch: pa.RecordBatch
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        """``process_batch`` in steps: a generator that yields ``None`` between two steps and
        returns what ``process_batch`` would. A task running operators on its agent's loop gives
        the loop a turn at a step when a slice of time has passed, so an operator that takes
        long per batch (a record function over tens of thousands of rows) does not hold up the
        agent's triggers, credits and acks for the whole batch. Nothing else touches the
        operator between two steps: the task snapshots, and notices reach operators, only
        between two batches. The default is one step."""
        return self.process_batch(batch)
        yield  # unreachable: makes this a generator

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """A batch of logical input ``input_index``. Operators with several inputs override
        this; one-input operators take input 0 in :meth:`process_batch` and refuse others."""
        if input_index == 0:
            return self.process_batch(batch)
        raise InvalidArgumentError(
            f"{self.name} has one input but got a batch of input {input_index}: only "
            f"operators with several inputs (connect, joins) can head a vertex that has more"
        )

    def process_input_steps(
        self, input_index: int, batch: pa.RecordBatch
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        """:meth:`process_input` in steps (see :meth:`process_batch_steps`)."""
        if input_index == 0:
            return (yield from self.process_batch_steps(batch))
        return self.process_input(input_index, batch)

    def end_of_input(self, input_index: int) -> list[pa.RecordBatch]:
        """Input ``input_index`` of several ended (Flink's ``BoundedMultiInput.endInput``);
        the last one to end is followed by :meth:`end_input`. May run again after a restore
        from a checkpoint taken between two inputs' ends."""
        return []

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        return []

    def check_job(self, config: CheckpointConfig) -> None:
        """Called by the pipeline builder before the job is submitted, with the job's
        checkpoint config: raise ``InvalidArgumentError``, saying what to set, when this
        operator cannot keep its promises in such a job. The default accepts every job."""

    def next_processing_time_ms(self) -> int | None:
        """When (wall-clock ms) this operator's earliest processing-time timer is due, or None.
        A task with inputs calls :meth:`process_processing_time` once that time has come, also
        while no input arrives (Flink's processing-time service)."""
        return None

    def process_processing_time(self, now_ms: int) -> list[pa.RecordBatch]:
        """Processing time reached ``now_ms``: fire the due processing-time timers."""
        return []

    def snapshot_state(self, checkpoint_id: int) -> None:
        """Called synchronously right before the task snapshots the state backends: put
        positions, buffers and pending transactions into (operator or keyed) state now."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        pass

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        pass

    def end_input(self) -> list[pa.RecordBatch]:
        return []

    def close(self) -> None:
        pass

    def _context(self) -> OperatorContext:
        if self.ctx is None:
            raise StateError(f"operator {self.name} is not open (call open(ctx) first)")
        return self.ctx

    def __getstate__(self) -> dict[str, Any]:
        # An opened operator holds live backends; ship only the configuration.
        state = self.__dict__.copy()
        state.pop("ctx", None)
        for name in self._runtime_fields:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class SourceOperator(Operator):
    """The head of a source vertex's chain.

    ``poll_batch(max_records)`` returns the next batch (at most ``max_records`` rows), a batch
    with 0 rows when nothing is available right now, or ``None`` once a bounded source is
    finished. The position lives in operator (list) state: written in ``snapshot_state``, read
    back in ``open`` from ``ctx.operator_state``. ``current_watermark()`` is the source's event
    time watermark (``MIN_WATERMARK`` before any, ``MAX_WATERMARK`` once finished).

    Idleness (``snapflow.worker.runtime.source_idleness``): with ``idle_timeout_ms`` set, a
    subtask whose polls returned no rows for that long announces itself idle downstream, so it
    does not hold the watermark of the tasks it feeds back, and active again before its next
    data; :meth:`idle_at_once` makes it idle at its first empty poll.
    """

    idle_timeout_ms: int | None = None
    """Idle after this many milliseconds of empty polls (Flink's ``withIdleness``); None, the
    default: never by time."""

    output_schema: pa.Schema | None = None
    """The schema of every batch the source emits, when fixed (the pipeline builder checks
    unions and join keys against it at build time); None: not declared. A subclass that emits
    other rows sets its own; the task checks the first batch against it."""

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        raise NotImplementedError

    def idle_at_once(self) -> bool:
        """True while this subtask has nothing to read at all (e.g. a split source without
        splits): idle at its first empty poll, whatever ``idle_timeout_ms``."""
        return False

    def current_watermark(self) -> int:
        return MIN_WATERMARK

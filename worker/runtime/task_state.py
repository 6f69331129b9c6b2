"""A subtask's state: its keyed and operator state backends, opened from the restored
checkpoint, the synchronous part of its snapshots, and their disposal.

A keyed subtask (its input edge hashes by ``key_field``) has one keyed backend shared by the
operators of its chain (their state names carry the operator id), stored under the id
``<vertex>/keyed``. Each operator has its own operator-state backend. Operator states are
restored from every old subtask's handles (keyed state by key group, list state split, union
state broadcast, broadcast state one old subtask's copy each).

The end of a subtask's data is state too: a snapshot taken after ``end_input`` records it
(``END_OF_DATA_STATE``), so that a restore from it does not run ``end_input`` again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from snapflow.checkpointing import (
    BROADCAST,
    CHANNEL_INPUT,
    CHANNEL_OUTPUT,
    OPERATOR,
    UNION,
    BarrierOptions,
    StateHandle,
)
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.runtime.task_lifecycle import TaskFailedError
from snapflow.worker.state.factory import StateBackendConfig, create_keyed_backend
from snapflow.worker.state.keyed_backend import KeyedStateBackend
from snapflow.worker.state.operator_state import OperatorStateBackend
from snapflow.worker.state.snapshots import SnapshotInProgress

END_OF_DATA_STATE = "snapflow/end-of-data"
"""Union list state (of the chain's first operator) holding the index of a subtask that had
run ``end_input`` and sent end of data when it snapshotted."""


@dataclass
class RestoreData:
    """What this subtask restores from (built from the coordinator's ``TaskRestore``)."""

    checkpoint_id: int = 0
    previous_parallelism: int = 0
    # operator_id -> old subtask index -> handles
    handles: dict[str, dict[int, list[StateHandle]]] = field(default_factory=dict)


@dataclass(frozen=True)
class SubtaskIdentity:
    """Which subtask this is: its place in the job graph and its attempt."""

    job_id: str
    vertex_id: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt: int


class TaskState:
    """The state backends of one subtask."""

    def __init__(
        self,
        identity: SubtaskIdentity,
        *,
        key_fields: Sequence[str | None],
        backend: StateBackendConfig,
        restore: RestoreData,
    ) -> None:
        """``key_fields``: the key field of each logical input (None: not keyed); the subtask
        has keyed state when any input is keyed."""
        self.identity = identity
        self.key_fields = tuple(key_fields)
        self.key_field = next((k for k in self.key_fields if k is not None), None)
        self.side_outputs: list[tuple[str, pa.RecordBatch]] = []
        """Shared by the operators' contexts; the task's output sends them."""
        self.backend = backend
        self.restore_data = restore
        self.keyed: dict[str, KeyedStateBackend] = {}
        self.operator_state: dict[str, OperatorStateBackend] = {}

    def open(self, operators: Sequence[Operator]) -> bool:
        """Create the backends, restore them and open ``operators`` with them. True when the
        restored snapshot was taken after this subtask's ``end_input``."""
        ident = self.identity
        keyed = None
        if self.key_field is not None:
            keyed_id = f"{ident.vertex_id}/keyed"
            keyed = create_keyed_backend(
                self.backend,
                ident.max_parallelism,
                ident.parallelism,
                ident.subtask_index,
                name=keyed_id,
                job_id=ident.job_id,
            )
            handles = self.restore_data.handles.get(keyed_id, {})
            if handles:
                keyed.restore([h for hs in handles.values() for h in hs])
            self.keyed[keyed_id] = keyed
        for index, op in enumerate(operators):
            op_id = getattr(op, "operator_id", "") or f"{ident.vertex_id}-op{index}"
            op_state = OperatorStateBackend(name=op_id)
            self.operator_state[op_id] = op_state
            handles = self.restore_data.handles.get(op_id, {})
            if any(h.kind in (OPERATOR, UNION, BROADCAST) for hs in handles.values() for h in hs):
                op_state.restore(
                    handles,
                    ident.subtask_index,
                    ident.parallelism,
                    old_parallelism=self.restore_data.previous_parallelism or None,
                )
            ctx = OperatorContext(
                vertex_id=ident.vertex_id,
                operator_id=op_id,
                subtask_index=ident.subtask_index,
                parallelism=ident.parallelism,
                max_parallelism=ident.max_parallelism,
                attempt=ident.attempt,
                keyed_state=keyed,
                operator_state=op_state,
                key_field=self.key_field,
                input_key_fields=self.key_fields,
                side_outputs=self.side_outputs,
                restored_checkpoint_id=self.restore_data.checkpoint_id,
            )
            op.open(ctx)
        return self._restore_end_of_data()

    def _restore_end_of_data(self) -> bool:
        backend = self.operator_state.get(self.channel_state_owner)
        if backend is None or END_OF_DATA_STATE not in backend.state_names():
            return False
        state = backend.get_union_list_state(END_OF_DATA_STATE)
        ended = set(state.get())
        index = self.identity.subtask_index
        parallelism = self.identity.parallelism
        old_parallelism = self.restore_data.previous_parallelism or parallelism
        restored_ended = False
        if old_parallelism == parallelism:
            restored_ended = index in ended
        elif ended:
            # A rescaled subtask takes key groups of several old ones: it may skip end_input
            # only if all of them had run it.
            if ended != set(range(old_parallelism)):
                raise TaskFailedError(
                    "cannot rescale a vertex whose subtasks had partly ended their input "
                    f"(ended: {sorted(ended)} of {old_parallelism})"
                )
            restored_ended = True
        state.update([index] if restored_ended else [])
        return restored_ended

    def record_end_of_data(self) -> None:
        """On the operators' thread: the next snapshots say that ``end_input`` ran."""
        owner = self.channel_state_owner
        backend = self.operator_state.setdefault(owner, OperatorStateBackend(name=owner))
        backend.get_union_list_state(END_OF_DATA_STATE).update([self.identity.subtask_index])
        for keyed in self.keyed.values():
            keyed.end_of_data()

    def sync_snapshot(
        self, operators: Sequence[Operator], checkpoint_id: int, options: BarrierOptions | None
    ) -> list[tuple[str, SnapshotInProgress]]:
        """On the operators' thread: the synchronous part of a snapshot (the operators'
        ``snapshot_state``, then the backends' copy-on-write views)."""
        for op in operators:
            op.snapshot_state(checkpoint_id)
        snapshots: list[tuple[str, SnapshotInProgress]] = []
        for op_id, backend in self.keyed.items():
            snapshots.append((op_id, backend.snapshot(checkpoint_id, options)))
        for op_id, op_backend in self.operator_state.items():
            snapshots.append((op_id, op_backend.snapshot(checkpoint_id)))
        return snapshots

    @property
    def channel_state_owner(self) -> str:
        """The operator whose state holds the subtask's channel state (its chain's first)."""
        return next(iter(self.operator_state), f"{self.identity.vertex_id}-op0")

    def channel_state_to_replay(self) -> list[StateHandle]:
        """This subtask's channel state in the restored checkpoint, output state first (in
        channel order), then input state."""
        own = self.restore_data.handles.get(self.channel_state_owner, {}).get(
            self.identity.subtask_index, []
        )
        handles = [h for h in own if h.kind in (CHANNEL_INPUT, CHANNEL_OUTPUT)]
        if handles and self.restore_data.previous_parallelism not in (0, self.identity.parallelism):
            raise TaskFailedError(
                "restoring in-flight data of an unaligned checkpoint needs the same parallelism; "
                "take a savepoint (always aligned) to change parallelism"
            )
        return sorted(handles, key=lambda h: (h.kind != CHANNEL_OUTPUT, h.key_group_start))


def close_and_dispose(operators: Sequence[Operator], backends: Sequence[KeyedStateBackend]) -> None:
    """Close the operators, then dispose the keyed backends (the disk backend's local files)."""
    for op in operators:
        with contextlib.suppress(Exception):
            op.close()
    for backend in backends:
        with contextlib.suppress(Exception):
            backend.dispose()

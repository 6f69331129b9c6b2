"""The broadcast state pattern: BroadcastProcessFunction and KeyedBroadcastProcessFunction run
by their operators; exact outputs, read-only broadcast state on the element side, keyed state
on the broadcast side only through apply_to_keyed_state (clear errors otherwise), timers, and
snapshot/restore through the subtask's TaskState, rescaled 2 -> 3 and 3 -> 2 (each new
subtask gets old subtask i % n's copy, as Flink; keyed state follows its key groups)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from snapflow.checkpointing import StateHandle
from snapflow.errors import InvalidArgumentError, StateError
from snapflow.worker.api.broadcast_functions import (
    BroadcastContext,
    BroadcastProcessFunction,
    KeyedBroadcastContext,
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    ReadOnlyBroadcastContext,
    ReadOnlyKeyedBroadcastContext,
)
from snapflow.worker.api.broadcast_operators import BroadcastProcess, KeyedBroadcastProcess
from snapflow.worker.api.functions import KeyedContext, RuntimeContext
from snapflow.worker.runtime.operator import Operator, OperatorContext, OutputTag
from snapflow.worker.runtime.task_state import RestoreData, SubtaskIdentity, TaskState
from snapflow.worker.state.factory import StateBackendConfig
from snapflow.worker.state.keyed_backend import KeyedStateBackend

RULES = MapStateDescriptor("rules")
DROPPED = OutputTag("dropped")


def rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b.to_pylist()]


def batch(rows_: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows_)


# ---------------------------------------------------------------------------------------------
# Not keyed
# ---------------------------------------------------------------------------------------------


class Route(BroadcastProcessFunction):
    """Broadcast rows (kind, target) set where a kind goes; elements (kind, v) follow their
    rule, or go to a side output while there is none."""

    def __init__(self, write_on_element: bool = False) -> None:
        self.write_on_element = write_on_element

    def process_element(self, row: dict[str, Any], ctx: ReadOnlyBroadcastContext) -> Any:
        rules = ctx.get_broadcast_state(RULES)
        if self.write_on_element:
            rules.put(row["kind"], "x")
        target = rules.get(row["kind"])
        if target is None:
            ctx.output(DROPPED, row)
            return None
        return [{"v": row["v"], "to": target}]

    def process_broadcast_element(self, row: dict[str, Any], ctx: BroadcastContext) -> Any:
        rules = ctx.get_broadcast_state(RULES)
        if row["target"] is None:
            rules.remove(row["kind"])
        else:
            rules.put(row["kind"], row["target"])
        return [{"v": -1, "to": f"rules={len(rules)}"}]


def test_broadcast_process_reads_what_the_broadcast_side_wrote() -> None:
    op = BroadcastProcess(Route())
    ctx = OperatorContext()
    op.open(ctx)
    assert op.process_batch(batch([{"kind": "a", "v": 1}])) == []
    assert [(t, b.to_pylist()) for t, b in ctx.side_outputs] == [
        ("dropped", [{"kind": "a", "v": 1}])
    ]
    assert rows(op.process_input(1, batch([{"kind": "a", "target": "s3"}]))) == [
        {"v": -1, "to": "rules=1"}
    ]
    assert rows(op.process_batch(batch([{"kind": "a", "v": 2}, {"kind": "a", "v": 3}]))) == [
        {"v": 2, "to": "s3"},
        {"v": 3, "to": "s3"},
    ]
    assert ctx.operator_state.get_broadcast_state("rules").items() == [("a", "s3")]
    op.process_input(1, batch([{"kind": "a", "target": None}]))
    assert rows(op.process_batch(batch([{"kind": "a", "v": 4}]))) == []


def test_the_element_side_cannot_write_broadcast_state() -> None:
    op = BroadcastProcess(Route(write_on_element=True))
    op.open(OperatorContext())
    with pytest.raises(StateError, match=r"read-only.*write it in process_broadcast_element"):
        op.process_batch(batch([{"kind": "a", "v": 1}]))
    with pytest.raises(InvalidArgumentError, match="BroadcastProcessFunction"):
        BroadcastProcess(Threshold())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Keyed
# ---------------------------------------------------------------------------------------------


class Threshold(KeyedBroadcastProcessFunction):
    """Counts rows per key; alerts when a key's count reaches the broadcast "limit". A
    broadcast row sets the limit and, with reset=True, clears every key's count through
    apply_to_keyed_state. A timer 100 ms after a key's row reports its count."""

    def __init__(self, misuse: str = "") -> None:
        self.misuse = misuse

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_value_state("count", 0)

    def process_element(self, row: dict[str, Any], ctx: ReadOnlyKeyedBroadcastContext) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        ctx.register_event_time_timer(row["ts"] + 100)
        limit = ctx.get_broadcast_state(RULES).get("limit")
        if limit is not None and n >= limit:
            yield {"key": ctx.current_key, "event": f"alert {n}>={limit}"}

    def process_broadcast_element(self, row: dict[str, Any], ctx: KeyedBroadcastContext) -> Any:
        if self.misuse == "context":
            ctx.get_value_state("count")
        if self.misuse == "kept":
            self.count.update(0)  # a state object from open(): no current key here
        if self.misuse == "timer":
            ctx.register_event_time_timer(5)
        ctx.get_broadcast_state(RULES).put("limit", row["limit"])
        if row.get("reset"):
            seen: list[Any] = []

            def reset(key: Any, kctx: KeyedContext) -> None:
                seen.append(key)
                kctx.get_value_state("count", 0).update(None)

            ctx.apply_to_keyed_state("count", reset)
            yield {"key": -1, "event": f"reset {sorted(seen)}"}

    def on_timer(self, timestamp: int, ctx: ReadOnlyKeyedBroadcastContext) -> Any:
        limit = ctx.get_broadcast_state(RULES).get("limit")
        return [{"key": ctx.current_key, "event": f"at {timestamp}: {self.count.value()}/{limit}"}]


def keyed_ctx(backend: KeyedStateBackend | None = None) -> OperatorContext:
    return OperatorContext(
        operator_id="v3.0-rules",
        keyed_state=backend or KeyedStateBackend(128, (0, 127)),
        max_parallelism=128,
        key_field="key",
        input_key_fields=("key", None),
    )


def test_keyed_broadcast_state_keyed_state_and_timers() -> None:
    op = KeyedBroadcastProcess("key", Threshold())
    ctx = keyed_ctx()
    op.open(ctx)
    events = [{"key": 1, "ts": 0}, {"key": 2, "ts": 1}, {"key": 1, "ts": 2}]
    assert op.process_batch(batch(events)) == []  # no limit yet
    assert op.process_input(1, batch([{"limit": 3}])) == []
    assert rows(op.process_batch(batch([{"key": 1, "ts": 3}, {"key": 2, "ts": 4}]))) == [
        {"key": 1, "event": "alert 3>=3"}
    ]
    assert rows(op.process_watermark(101)) == [
        {"key": 1, "event": "at 100: 3/3"},
        {"key": 2, "event": "at 101: 2/3"},
    ]
    assert rows(op.process_input(1, batch([{"limit": 2, "reset": True}]))) == [
        {"key": -1, "event": "reset [1, 2]"}
    ]
    assert rows(op.process_batch(batch([{"key": 2, "ts": 5}, {"key": 2, "ts": 6}]))) == [
        {"key": 2, "event": "alert 2>=2"}
    ]
    assert rows(op.end_input()) == [
        {"key": 1, "event": "at 102: 0/2"},
        {"key": 1, "event": "at 103: 0/2"},
        {"key": 2, "event": "at 104: 2/2"},
        {"key": 2, "event": "at 105: 2/2"},
        {"key": 2, "event": "at 106: 2/2"},
    ]


@pytest.mark.parametrize("misuse", ["context", "kept", "timer"])
def test_the_broadcast_side_writing_keyed_state_is_a_clear_error(misuse: str) -> None:
    op = KeyedBroadcastProcess("key", Threshold(misuse))
    op.open(keyed_ctx())
    op.process_batch(batch([{"key": 1, "ts": 0}]))  # a current key was set
    with pytest.raises(StateError, match=r"broadcast input has no key.*apply_to_keyed_state"):
        op.process_input(1, batch([{"limit": 1}]))


def test_keyed_broadcast_process_refuses_wrong_vertices() -> None:
    with pytest.raises(InvalidArgumentError, match="KeyedBroadcastProcessFunction"):
        KeyedBroadcastProcess("key", Route())  # type: ignore[arg-type]
    op = KeyedBroadcastProcess("key", Threshold())
    with pytest.raises(InvalidArgumentError, match="broadcast input"):
        op.open(
            OperatorContext(
                keyed_state=KeyedStateBackend(128, (0, 127)), input_key_fields=("key", "k2")
            )
        )


# ---------------------------------------------------------------------------------------------
# Snapshot, restore and rescale through the subtask's state
# ---------------------------------------------------------------------------------------------


class Limits(KeyedBroadcastProcessFunction):
    """Element rows report the key's running count and the limit this subtask holds."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_value_state("count", 0)

    def process_element(self, row: dict[str, Any], ctx: ReadOnlyKeyedBroadcastContext) -> Any:
        self.count.update(self.count.value() + 1)
        limit = ctx.get_broadcast_state(RULES).get("limit")
        return [{"key": row["key"], "count": self.count.value(), "limit": limit}]

    def process_broadcast_element(self, row: dict[str, Any], ctx: KeyedBroadcastContext) -> Any:
        ctx.get_broadcast_state(RULES).put("limit", row["limit"])
        return None


OP_ID = "v3.0-rules"


def open_subtask(
    index: int, parallelism: int, restore: RestoreData
) -> tuple[TaskState, list[Operator]]:
    op = KeyedBroadcastProcess("key", Limits())
    op.operator_id = OP_ID  # type: ignore[attr-defined]
    state = TaskState(
        SubtaskIdentity("job", "v3", index, parallelism, 128, 0),
        key_fields=("key", None),
        backend=StateBackendConfig(),
        restore=restore,
    )
    state.open([op])
    return state, [op]


def checkpoint(
    subtasks: list[tuple[TaskState, list[Operator]]], tmp_path: Path
) -> dict[str, dict[int, list[StateHandle]]]:
    handles: dict[str, dict[int, list[StateHandle]]] = {}
    for index, (state, ops) in enumerate(subtasks):
        for owner, snap in state.sync_snapshot(ops, 7, None):
            written = snap.write(tmp_path / f"{owner.replace('/', '_')}-{index}")
            handles.setdefault(owner, {})[index] = written
    return handles


@pytest.mark.parametrize(("old_p", "new_p", "copies"), [(2, 3, [0, 1, 0]), (3, 2, [0, 1])])
def test_rescale_restores_one_copy_per_subtask_and_keyed_state_by_key_group(
    tmp_path: Path, old_p: int, new_p: int, copies: list[int]
) -> None:
    keys = list(range(40))
    old = [open_subtask(i, old_p, RestoreData()) for i in range(old_p)]
    for i, (state, ops) in enumerate(old):
        # copies differ on purpose (a real broadcast gives every subtask the same rows):
        # the restored limit shows whose copy a new subtask got
        ops[0].process_input(1, batch([{"limit": 100 + i}]))
        backend = state.keyed["v3/keyed"]
        mine = [k for k in keys if backend.key_group_of(k) in backend.key_group_range]
        ops[0].process_batch(batch([{"key": k} for k in mine]))
    restore = RestoreData(
        checkpoint_id=7, previous_parallelism=old_p, handles=checkpoint(old, tmp_path)
    )
    new = [open_subtask(i, new_p, restore) for i in range(new_p)]
    seen: dict[int, dict[str, Any]] = {}
    for i, (state, ops) in enumerate(new):
        backend = state.keyed["v3/keyed"]
        mine = [k for k in keys if backend.key_group_of(k) in backend.key_group_range]
        out = rows(ops[0].process_batch(batch([{"key": k} for k in mine])))
        assert {r["limit"] for r in out} == {100 + copies[i]}
        seen.update({r["key"]: r for r in out})
    # every key once, its count carried over the rescale
    assert sorted(seen) == keys
    assert {r["count"] for r in seen.values()} == {2}

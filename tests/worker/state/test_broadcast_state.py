"""Broadcast state in the operator state backend: a map per name, a read-only view whose writes
name the fix, each subtask's own copy checkpointed (kind ``broadcast``, empty maps too), and
restore as Flink's RoundRobinOperatorStateRepartitioner: own copy at the same parallelism,
old subtask ``i % n``'s copy after a rescale."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapflow.checkpointing import BROADCAST, StateHandle
from snapflow.errors import StateError
from snapflow.worker.state.errors import IncompatibleStateError
from snapflow.worker.state.operator_state import OperatorStateBackend


def test_broadcast_state_map_and_its_read_only_view() -> None:
    b = OperatorStateBackend()
    rules = b.get_broadcast_state("rules")
    rules.put("a", 1)
    rules.put_all({"b": 2, "c": 3})
    rules.remove("c")
    rules.remove("missing")
    assert b.get_broadcast_state("rules") is rules
    view = rules.read_only()
    assert (view.get("a"), view.get("z", 0), view.contains("b"), "b" in view) == (1, 0, True, True)
    assert (view.items(), view.keys(), view.values(), len(view)) == (
        [("a", 1), ("b", 2)],
        ["a", "b"],
        [1, 2],
        2,
    )
    rules.put("d", 4)
    assert view.get("d") == 4  # a view of the same map, not a copy
    for write in (
        lambda: view.put("x", 1),
        lambda: view.put_all({}),
        lambda: view.remove("a"),
        view.clear,
    ):
        with pytest.raises(
            StateError, match=r"read-only in process_element.*process_broadcast_element"
        ):
            write()
    rules.clear()
    assert view.is_empty()
    assert b.broadcast_state_names() == ["rules"] and b.state_names() == []
    with pytest.raises(StateError):
        b.get_broadcast_state("")


def snapshot(b: OperatorStateBackend, directory: Path) -> list[StateHandle]:
    return b.snapshot(1).write(directory)


def job(parallelism: int, tmp_path: Path) -> list[list[StateHandle]]:
    """Subtask i holds rules {"from": i} (copies differ on purpose: which one is restored
    shows) and an empty broadcast state "empty"."""
    handles = []
    for i in range(parallelism):
        b = OperatorStateBackend(name=f"op-{i}")
        b.get_broadcast_state("rules").put("from", i)
        b.get_broadcast_state("empty")
        handles.append(snapshot(b, tmp_path / f"s{i}"))
    return handles


def restored(handles: list[list[StateHandle]], p: int) -> list[OperatorStateBackend]:
    out = []
    for i in range(p):
        b = OperatorStateBackend()
        b.restore(dict(enumerate(handles)), i, p, old_parallelism=len(handles))
        out.append(b)
    return out


def test_each_subtask_checkpoints_its_copy_and_gets_it_back(tmp_path: Path) -> None:
    b = OperatorStateBackend()
    rules = b.get_broadcast_state("rules")
    rules.put("k", [1])
    snap = b.snapshot(1)
    rules.put("k", [2])  # after the synchronous part: not in the snapshot
    handles = snap.write(tmp_path)
    assert [h.kind for h in handles] == [BROADCAST]
    assert (handles[0].key_group_start, handles[0].key_group_end) == (0, -1)
    for i, r in enumerate(restored(job(3, tmp_path / "job"), 3)):
        assert r.get_broadcast_state("rules").items() == [("from", i)]
        assert r.broadcast_state_names() == ["empty", "rules"]
    r = OperatorStateBackend()
    r.restore([handles], 0, 1)
    assert r.get_broadcast_state("rules").items() == [("k", [1])]


@pytest.mark.parametrize(
    ("old_p", "new_p", "copies"),
    [(2, 3, [0, 1, 0]), (3, 2, [0, 1]), (3, 5, [0, 1, 2, 0, 1]), (2, 1, [0])],
)
def test_rescale_gives_new_subtask_i_the_copy_of_old_subtask_i_mod_n(
    tmp_path: Path, old_p: int, new_p: int, copies: list[int]
) -> None:
    new = restored(job(old_p, tmp_path), new_p)
    assert [r.get_broadcast_state("rules").get("from") for r in new] == copies
    assert all(r.get_broadcast_state("empty").is_empty() for r in new)


def test_broadcast_state_restore_needs_an_empty_backend(tmp_path: Path) -> None:
    handles = job(1, tmp_path)
    b = OperatorStateBackend()
    b.get_broadcast_state("rules").put("x", 1)
    with pytest.raises(IncompatibleStateError):
        b.restore(handles, 0, 1)

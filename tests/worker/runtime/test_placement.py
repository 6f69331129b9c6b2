"""The placement core: exact call sequences, invariants after every event."""

from __future__ import annotations

import asyncio
import threading
import time

import pyarrow as pa
import pytest
from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.errors import InvalidArgumentError
from snapflow.worker.runtime.frames import DataFrame
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.placement import (
    MoveToTaskThread,
    Placement,
    PlacementSettings,
    builtins_only,
)

MS = 1_000_000


def feed(p: Placement, calls: list[tuple[float, float]]) -> list[MoveToTaskThread | None]:
    out = []
    for wall_ms, cpu_ms in calls:
        out.append(p.on_call(int(wall_ms * MS), int(cpu_ms * MS)))
        p.validate_state()
    return out


def test_a_sleeping_sink_moves_after_two_blocking_windows_in_a_row() -> None:
    p = Placement(PlacementSettings(window_calls=4, window_ms=1000.0))
    actions = feed(p, [(10.0, 0.2)] * 8)
    assert actions[:7] == [None] * 7  # the first window blocked, one more is needed
    assert actions[7] == MoveToTaskThread(wall_ms=40.0, blocked_ms=39.2, calls=4)
    assert p.on_thread
    assert feed(p, [(10.0, 0.2)] * 8) == [None] * 8  # one way: nothing more to decide


def test_one_blocking_window_alone_does_not_move() -> None:
    p = Placement(PlacementSettings(window_calls=2, window_ms=1000.0, windows=2))
    # blocking, then CPU-bound (the count starts again), then blocking twice: the move
    actions = feed(p, [(10.0, 0.0)] * 2 + [(10.0, 10.0)] * 2 + [(10.0, 0.0)] * 4)
    assert actions == [None] * 7 + [MoveToTaskThread(wall_ms=20.0, blocked_ms=20.0, calls=2)]
    one = Placement(PlacementSettings(window_calls=2, window_ms=1000.0, windows=1))
    assert feed(one, [(10.0, 0.0)] * 2)[1] is not None  # windows=1: the first window moves


def test_a_window_ends_early_once_at_least_two_calls_took_window_ms() -> None:
    p = Placement(PlacementSettings(window_calls=16, window_ms=20.0))
    # one call is not a window, however long; the second ends it once 10 + 12 ms >= 20 ms
    actions = feed(p, [(10.0, 0.5), (12.0, 0.5), (10.0, 0.5), (12.0, 0.5)])
    assert actions == [None, None, None, MoveToTaskThread(wall_ms=22.0, blocked_ms=21.0, calls=2)]
    # a window that does not block ends the same way, and the count starts again
    q = Placement(PlacementSettings(window_calls=16, window_ms=20.0))
    assert feed(
        q, [(30.0, 30.0), (1.0, 1.0), (10.0, 0.0), (15.0, 0.0), (20.0, 0.0), (1.0, 0.0)]
    ) == [
        None,
        None,
        None,
        None,
        None,
        MoveToTaskThread(wall_ms=21.0, blocked_ms=21.0, calls=2),
    ]


def test_a_cpu_bound_function_stays_on_the_loop_also_on_a_loaded_machine() -> None:
    p = Placement(PlacementSettings(window_calls=4))
    # half of the wall time on the CPU (the machine loaded about two-fold): below 75 % blocked
    assert feed(p, [(60.0, 30.0)] * 40) == [None] * 40
    assert not p.on_thread


def test_short_calls_do_not_move_on_jitter() -> None:
    p = Placement(PlacementSettings(window_calls=4, min_blocked_ms=2.0))
    # 90 % blocked, but 0.9 ms per call
    assert feed(p, [(1.0, 0.1)] * 8) == [None] * 8
    assert not p.on_thread


def test_each_window_is_decided_on_its_own_sums() -> None:
    p = Placement(
        PlacementSettings(window_calls=2, blocked_share=0.75, min_blocked_ms=1.0, windows=1)
    )
    # window 1: 20 ms wall, 10 blocked (50 %): stays; window 2: 20 ms wall, 16 blocked: moves
    actions = feed(p, [(10.0, 10.0), (10.0, 0.0), (10.0, 2.0), (10.0, 2.0)])
    assert actions == [None, None, None, MoveToTaskThread(wall_ms=20.0, blocked_ms=16.0, calls=2)]


def test_cpu_time_above_wall_time_counts_as_no_blocking() -> None:
    p = Placement(PlacementSettings(window_calls=2))
    assert feed(p, [(5.0, 5.2), (5.0, 5.1)]) == [None, None]  # clocks of different resolution


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_calls": 0},
        {"window_calls": True},
        {"window_ms": -1.0},
        {"window_ms": float("nan")},
        {"windows": 0},
        {"blocked_share": 0.0},
        {"blocked_share": 1.5},
        {"min_blocked_ms": -1},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgumentError):
        PlacementSettings(**kwargs)  # type: ignore[arg-type]


def test_negative_times_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        Placement().on_call(-1, 0)


class _Where(Operator):
    """Records the thread of every call; ``sleep_s`` blocked or ``spin_s`` on the CPU."""

    def __init__(self, sleep_s: float = 0.0, spin_s: float = 0.0) -> None:
        self.sleep_s, self.spin_s = sleep_s, spin_s
        self.threads: list[str] = []

    def process_batch(self, b: pa.RecordBatch) -> list[pa.RecordBatch]:
        self.threads.append(threading.current_thread().name)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        end = time.thread_time() + self.spin_s
        while time.thread_time() < end:
            pass
        return [b]


def _run_batches(op: _Where, n: int) -> tuple[bool, list[int]]:
    where: list[bool] = []
    keys: list[int] = []

    async def main() -> None:
        h = harness([op], num_inputs=1, placement=PlacementSettings(window_calls=2))

        async def feed() -> None:
            for k in range(n):
                await h.inputs[0].output.send(DataFrame(batch(k)))
            await h.inputs[0].output.close()

        frames, _, _ = await asyncio.gather(h.outputs(), h.task.run(), feed())
        where.append(h.task.task_thread)
        keys.extend(
            k for f in frames if isinstance(f, DataFrame) for k in f.batch["key"].to_pylist()
        )

    run(main())
    return where[0], keys


def test_a_subtask_whose_calls_block_moves_to_its_task_thread_between_two_batches() -> None:
    op = _Where(sleep_s=0.004)
    on_thread, keys = _run_batches(op, 8)
    assert on_thread
    main = threading.main_thread().name
    assert op.threads[:4] == [main] * 4  # two windows of two calls on the loop, then the move
    assert op.threads[4:] == ["task v#0@1"] * 4
    assert keys == list(range(8))  # nothing lost or reordered by the move


def test_a_cpu_bound_subtask_stays_on_the_loop() -> None:
    op = _Where(spin_s=0.004)
    on_thread, keys = _run_batches(op, 6)
    assert not on_thread
    assert set(op.threads) == {threading.main_thread().name}
    assert keys == list(range(6))


class _Op(Operator):
    def __init__(self, on_loop: bool) -> None:
        self.on_loop = on_loop

    def runs_on_loop(self) -> bool:
        return self.on_loop


def test_only_a_chain_of_built_ins_with_its_keyed_state_on_the_heap_stays_on_the_loop() -> None:
    assert builtins_only([_Op(True), _Op(True)], keyed_state_on_disk=False)
    assert not builtins_only([_Op(True), _Op(False)], keyed_state_on_disk=False)  # user code
    assert not builtins_only([_Op(True)], keyed_state_on_disk=True)  # RocksDB reads: unbounded
    assert not builtins_only([], keyed_state_on_disk=False)
    assert not Operator().runs_on_loop()  # operators are user code unless they promise

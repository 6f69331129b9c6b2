"""Operators on the agent's loop run a batch in steps (``Operator.process_batch_steps``) and
give the loop a turn at a step once ``LOOP_SLICE_S`` has passed; nothing else touches the
operator meanwhile: notices posted between two steps run after the batch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import Any

import pyarrow as pa
import pytest
from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.worker.runtime import operator_runner as runner_module
from snapflow.worker.runtime.chain import Chain, run_steps
from snapflow.worker.runtime.frames import DataFrame
from snapflow.worker.runtime.operator import Operator

STEPS = 4


class Stepper(Operator):
    """``STEPS`` steps per batch. At each step it records whether the loop callback scheduled
    at the step before has run, and it logs steps, batch ends and notices in order."""

    def __init__(self) -> None:
        self.turns: list[bool] = []
        self.log: list[str] = []
        self.on_step: Any = None

    def process_batch_steps(
        self, batch: pa.RecordBatch
    ) -> Generator[None, None, list[pa.RecordBatch]]:
        for step in range(STEPS):
            ran = [False]

            def callback(ran: list[bool] = ran) -> None:
                ran[0] = True

            with contextlib.suppress(RuntimeError):  # no loop: run as a plain chain
                asyncio.get_running_loop().call_soon(callback)
            self.log.append(f"step {step}")
            if self.on_step is not None:
                self.on_step(step)
            yield
            self.turns.append(ran[0])
        self.log.append("end")
        return [batch]

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return run_steps(self.process_batch_steps(batch))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.log.append(f"complete {checkpoint_id}")
        if checkpoint_id == self.failing_notice:
            raise RuntimeError("a failing notice")

    failing_notice = -1


def _run_one_batch(op: Stepper) -> list[Any]:
    frames: list[Any] = []

    async def main() -> None:
        h = harness([op], num_inputs=1)
        await h.inputs[0].output.send(DataFrame(batch(0)))
        await h.inputs[0].output.close()
        out, _ = await asyncio.gather(h.outputs(), h.task.run())
        frames.extend(out)

    run(main())
    return frames


def test_the_loop_gets_a_turn_between_steps_once_the_slice_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner_module, "LOOP_SLICE_S", 0.0)  # every step ends a slice
    op = Stepper()
    frames = _run_one_batch(op)
    assert op.turns == [True] * STEPS
    assert [f.batch.num_rows for f in frames if isinstance(f, DataFrame)] == [1]


def test_no_turn_inside_a_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "LOOP_SLICE_S", 3600.0)
    op = Stepper()
    _run_one_batch(op)
    assert op.turns == [False] * STEPS


def test_a_notice_posted_between_two_steps_runs_after_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner_module, "LOOP_SLICE_S", 0.0)
    op = Stepper()

    async def main() -> None:
        h = harness([op], num_inputs=1)
        loop = asyncio.get_running_loop()
        # the completion notice arrives (from the loop, as an RPC would) during step 1
        op.on_step = lambda step: step == 1 and loop.call_soon(h.task.notify_complete, 7)
        await h.inputs[0].output.send(DataFrame(batch(0)))
        await h.inputs[0].output.close()
        await asyncio.gather(h.outputs(), h.task.run())

    run(main())
    assert op.log == [*(f"step {i}" for i in range(STEPS)), "end", "complete 7"]


def test_a_chain_steps_through_its_first_operator_and_runs_the_rest_at_the_end() -> None:
    class Tag(Operator):
        def __init__(self, log: list[str]) -> None:
            self.log = log

        def process_batch(self, b: pa.RecordBatch) -> list[pa.RecordBatch]:
            self.log.append("tag")
            return [b]

    first = Stepper()
    chain = Chain([first, Tag(first.log)])
    steps = chain.process_batch_steps(batch(3))
    taken = 0
    with pytest.raises(StopIteration) as done:
        while True:
            next(steps)
            taken += 1
    assert taken == STEPS
    assert [b.num_rows for b in done.value.value] == [1]
    assert first.log == [*(f"step {i}" for i in range(STEPS)), "end", "tag"]
    # an operator without steps is one step; an empty batch is no step
    assert run_steps(Chain([Operator()]).process_batch_steps(batch(1)))[0].num_rows == 1
    assert run_steps(Chain([first]).process_batch_steps(batch(1).slice(0, 0))) == []


def test_a_failing_deferred_notice_is_logged_and_the_next_ones_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner_module, "LOOP_SLICE_S", 0.0)
    op = Stepper()
    op.failing_notice = 7

    async def main() -> None:
        h = harness([op], num_inputs=1)
        loop = asyncio.get_running_loop()

        def notices(step: int) -> None:
            if step == 1:
                loop.call_soon(h.task.notify_complete, 7)
                loop.call_soon(h.task.notify_complete, 8)

        op.on_step = notices
        await h.inputs[0].output.send(DataFrame(batch(0)))
        await h.inputs[0].output.close()
        await asyncio.gather(h.outputs(), h.task.run())  # the task does not fail

    run(main())
    assert op.log == [*(f"step {i}" for i in range(STEPS)), "end", "complete 7", "complete 8"]


def test_a_batch_cut_short_closes_its_steps_and_posts_notices_directly_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner_module, "LOOP_SLICE_S", 0.0)
    closed: list[bool] = []

    class Failing(Operator):
        def process_batch_steps(
            self, batch: pa.RecordBatch
        ) -> Generator[None, None, list[pa.RecordBatch]]:
            try:
                yield
                raise ValueError("user code failed")
            finally:
                closed.append(True)

    async def main() -> None:
        h = harness([Failing()], num_inputs=1)
        await h.inputs[0].output.send(DataFrame(batch(0)))
        with pytest.raises(ValueError, match="user code failed"):
            await h.task.run()
        assert h.task.runner.deferred is None  # notices run at once again, not into a dead batch

    run(main())
    assert closed == [True]

"""Operators that run on the agent's loop (no task thread) give the loop a turn after every
batch: a callback scheduled while one batch is processed runs before the next batch, even
when the next one is already buffered (the gate returns it without waiting)."""

from __future__ import annotations

import asyncio
from typing import Any

from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.worker.runtime.frames import DataFrame
from snapflow.worker.runtime.operator import Operator


class Observer(Operator):
    """Per batch: whether the callback scheduled by the previous batch ran already."""

    def __init__(self) -> None:
        self.seen: list[bool] = []
        self._ran: list[bool] | None = None

    def process_batch(self, b: Any) -> list[Any]:
        if self._ran is not None:
            self.seen.append(self._ran[0])
        ran = [False]
        self._ran = ran

        def callback() -> None:
            ran[0] = True

        asyncio.get_running_loop().call_soon(callback)
        return [b]


def test_the_loop_gets_a_turn_between_two_buffered_batches() -> None:
    observer = Observer()

    async def main() -> None:
        h = harness([observer], num_inputs=1)
        for k in range(4):  # all buffered before the task runs
            await h.inputs[0].output.send(DataFrame(batch(k)))
        await h.inputs[0].output.close()
        await asyncio.gather(h.outputs(), h.task.run())

    run(main())
    assert observer.seen == [True, True, True]

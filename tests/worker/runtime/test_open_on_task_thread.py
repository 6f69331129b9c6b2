"""Operators open where they run: with a task thread (the agents' default), ``open`` and every
later call run on it; a subtask whose ``open`` fails, whose deployment is cancelled while it
opens, or which is discarded before it ran, closes what it opened, disposes its state and
ends its thread (``Subtask.open_where_it_runs``, ``Subtask.discard``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pyarrow as pa
import pytest
from kit.channels import run

from snapflow.checkpointing import CheckpointMode
from snapflow.worker.runtime.frames import DataFrame
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.runtime.partitioners import ForwardPartitioner
from snapflow.worker.runtime.task import Subtask
from snapflow.worker.runtime.task_output import OutputEdge
from snapflow.worker.runtime.task_state import RestoreData

WAIT_S = 4.0


class Recording(Operator):
    """Records the thread of every call; ``open`` may fail or block until released."""

    def __init__(self, fail: bool = False, release: threading.Event | None = None) -> None:
        self.fail = fail
        self.release = release
        self.entered = threading.Event()
        self.threads: dict[str, set[int]] = {}
        self.closed = 0

    def _saw(self, call: str) -> None:
        self.threads.setdefault(call, set()).add(threading.get_ident())

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._saw("open")
        self.entered.set()
        if self.release is not None and not self.release.wait(WAIT_S):
            raise TimeoutError("never released")
        if self.fail:
            raise RuntimeError("open failed on purpose")

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        self._saw("process")
        return [batch]

    def close(self) -> None:
        self._saw("close")
        self.closed += 1


def _subtask(operators: list[Operator], task_thread: bool = True) -> tuple[Subtask, Any]:
    source = LocalChannel(4, name="in")
    out = LocalChannel(16, name="out")

    async def ack(report: Any) -> None:
        pass

    async def decline(*args: Any) -> None:
        pass

    task = Subtask(
        job_id="job",
        vertex_id="v",
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=1,
        operators=operators,
        key_fields=(),
        gate=InputGate([source.input]),
        outputs=[OutputEdge(ForwardPartitioner(), [out.output])],
        mode=CheckpointMode.ALIGNED,
        restore=RestoreData(),
        ack=ack,
        decline=decline,
        task_thread=task_thread,
    )
    return task, source


def _thread_ended(task: Subtask) -> bool:
    thread = task.runner.thread
    assert thread is not None
    inner = thread._thread
    if inner is not None:
        inner.join(WAIT_S)
    return inner is None or not inner.is_alive()


def test_open_and_every_later_call_run_on_the_task_thread() -> None:
    op = Recording()

    async def main() -> None:
        task, source = _subtask([op])
        await task.open_where_it_runs()
        runner = asyncio.create_task(task.run())
        await source.output.send(DataFrame(pa.RecordBatch.from_pydict({"key": [1, 2]})))
        await source.output.close()
        await asyncio.wait_for(runner, WAIT_S)
        assert _thread_ended(task)

    run(main())
    assert set(op.threads) == {"open", "process", "close"}
    threads = set().union(*op.threads.values())
    assert len(threads) == 1  # one thread for everything, as Flink's task thread
    assert threads != {threading.get_ident()}  # and not the loop's


@pytest.mark.parametrize("task_thread", [True, False])
def test_a_failed_open_closes_the_operators_and_ends_the_thread(task_thread: bool) -> None:
    first, failing = Recording(), Recording(fail=True)

    async def main() -> None:
        task, _ = _subtask([first, failing], task_thread=task_thread)
        with pytest.raises(RuntimeError, match="open failed on purpose"):
            await task.open_where_it_runs()
        if task_thread:
            assert _thread_ended(task)
        await task.discard()  # a second cleanup is a no-op

    run(main())
    assert (first.closed, failing.closed) == (1, 1)


def test_a_deployment_cancelled_while_open_runs_waits_for_it_and_cleans_up() -> None:
    release = threading.Event()
    op = Recording(release=release)

    async def main() -> None:
        task, _ = _subtask([op])
        opening = asyncio.create_task(task.open_where_it_runs())
        assert await asyncio.to_thread(op.entered.wait, WAIT_S)
        opening.cancel()
        await asyncio.sleep(0.05)
        assert not opening.done()  # open still runs on the thread: the cleanup waits for it
        assert op.closed == 0
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert _thread_ended(task)

    run(main())
    assert op.closed == 1
    assert len(set().union(*op.threads.values())) == 1  # open and close on one thread


def test_discard_cleans_up_a_subtask_that_never_ran_and_nothing_once_it_ran() -> None:
    never, ran = Recording(), Recording()

    async def main() -> None:
        task, _ = _subtask([never])
        await task.open_where_it_runs()
        await task.discard()
        assert _thread_ended(task)
        task2, source = _subtask([ran])
        await task2.open_where_it_runs()
        runner = asyncio.create_task(task2.run())
        await asyncio.sleep(0)
        await task2.discard()  # run() started: its own cleanup closes, not this
        await source.output.close()
        await asyncio.wait_for(runner, WAIT_S)

    run(main())
    assert never.closed == 1
    assert ran.closed == 1

"""Idleness (Flink's ``WatermarkStatus``): a source announces itself idle after empty polls, a
task with inputs leaves idle channels and inputs out of its watermark and forwards idle once
everything it reads is idle. The source's rule is pure (``SourceIdleness``); the tasks run with
in-process channels."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.checkpointing import CheckpointMode
from snapflow.errors import InvalidArgumentError
from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.runtime.frames import (
    DataFrame,
    EndOfDataFrame,
    EndOfPartitionFrame,
    Frame,
    WatermarkFrame,
    WatermarkStatusFrame,
)
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.operator import Operator, SourceOperator
from snapflow.worker.runtime.partitioners import ForwardPartitioner
from snapflow.worker.runtime.source_idleness import SourceIdleness
from snapflow.worker.runtime.task import Subtask
from snapflow.worker.runtime.task_output import OutputEdge
from snapflow.worker.runtime.task_state import RestoreData

IDLE, ACTIVE = WatermarkStatusFrame(idle=True), WatermarkStatusFrame(idle=False)

# --- the source's rule -----------------------------------------------------------------------


def test_a_source_is_idle_after_empty_polls_for_the_timeout_and_active_at_its_next_rows() -> None:
    s = SourceIdleness(100)
    assert s.on_poll(5, now_ms=0) is False
    assert s.on_poll(0, now_ms=10) is False  # the first empty poll starts the clock
    assert s.on_poll(0, now_ms=109) is False
    assert s.on_poll(0, now_ms=110) is True
    assert s.on_poll(0, now_ms=5_000) is True
    assert s.on_poll(1, now_ms=5_001) is False
    assert s.on_poll(0, now_ms=5_002) is False  # a new empty stretch: the clock restarts
    assert s.on_poll(0, now_ms=5_102) is True


def test_without_a_timeout_a_source_is_idle_only_when_it_has_nothing_to_read() -> None:
    s = SourceIdleness(None)
    assert s.on_poll(0, now_ms=0) is False
    assert s.on_poll(0, now_ms=10**9) is False
    assert s.on_poll(0, now_ms=10**9 + 1, nothing_to_read=True) is True
    assert SourceIdleness(100).on_poll(0, now_ms=0, nothing_to_read=True) is True


@pytest.mark.parametrize("timeout", [0, -1, 1.5])
def test_the_idle_timeout_must_be_a_positive_integer(timeout: object) -> None:
    with pytest.raises(InvalidArgumentError, match="idle_timeout_ms"):
        SourceIdleness(timeout)  # type: ignore[arg-type]


# --- a source task ---------------------------------------------------------------------------


class Scripted(SourceOperator):
    """Empty polls until ``idle_polls`` were made, then one batch with event time 500, then
    the end; its watermark is the last event time seen."""

    def __init__(self, idle_polls: int) -> None:
        self.idle_polls = idle_polls
        self.idle_timeout_ms = 1
        self.sent = False
        self.watermark = -(2**63)

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        if self.idle_polls > 0:
            self.idle_polls -= 1
            return pa.RecordBatch.from_pydict({"key": pa.array([], pa.int64())})
        if self.sent:
            return None
        self.sent = True
        self.watermark = 500
        return batch(1)

    def current_watermark(self) -> int:
        return self.watermark


def test_an_idle_source_announces_idle_then_active_before_its_next_data() -> None:
    async def main() -> None:
        output = LocalChannel(16, output_queue=64, name="out")

        async def ack(report: object) -> None:
            raise AssertionError("no checkpoint in this test")

        async def decline(*args: object) -> None:
            raise AssertionError("no checkpoint in this test")

        task = Subtask(
            job_id="job",
            vertex_id="s",
            subtask_index=0,
            parallelism=1,
            max_parallelism=128,
            attempt=1,
            operators=[Scripted(idle_polls=5)],  # 5 ms between empty polls: idle by the 2nd
            key_fields=(),
            gate=None,
            outputs=[OutputEdge(ForwardPartitioner(), [output.output])],
            mode=CheckpointMode.ALIGNED,
            restore=RestoreData(),
            ack=ack,
            decline=decline,
            periodic_checkpoints=False,
        )
        task.open()
        frames: list[Frame] = []

        async def read() -> None:
            gate = InputGate([output.input])
            while (item := await gate.next()) is not None:
                frames.append(item[1])

        async with asyncio.timeout(10):
            await asyncio.gather(task.run(), read())
        assert frames == [
            IDLE,
            ACTIVE,
            DataFrame(batch(1)),
            WatermarkFrame(500),
            WatermarkFrame(MAX_WATERMARK),
            EndOfDataFrame(),
            EndOfPartitionFrame(),
        ]

    run(main())


# --- a task with two inputs ------------------------------------------------------------------


class FireAt(Operator):
    """Forwards its input; an event-time timer at ``at`` emits one row ``at`` when the
    watermark passes it."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.fired = False

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return [batch]  # either input, forwarded

    def process_watermark(self, watermark_ms: int) -> list[pa.RecordBatch]:
        if self.fired or watermark_ms < self.at:
            return []
        self.fired = True
        return [batch(self.at)]


def test_an_idle_input_does_not_hold_back_the_timer_the_other_input_fires() -> None:
    """Input 0 is idle, input 1's watermark passes the timer: it fires, the watermark goes
    downstream; once input 1 is idle too the task forwards idle; input 0 ending makes it active
    again at the maximum watermark."""

    async def main() -> None:
        h = harness([FireAt(100)], num_inputs=2, input_of=[0, 1])
        running = asyncio.create_task(h.task.run())
        gate = InputGate([h.output.input])

        async def take(n: int) -> list[Frame]:
            got: list[Frame] = []
            async with asyncio.timeout(10):
                while len(got) < n:
                    item = await gate.next()
                    assert item is not None
                    got.append(item[1])
            return got

        await h.inputs[0].output.send(IDLE)
        await h.inputs[1].output.send(DataFrame(batch(1)))
        await h.inputs[1].output.send(WatermarkFrame(150))
        # input 0 is still open: only its idleness lets the watermark through
        assert await take(3) == [DataFrame(batch(1)), DataFrame(batch(100)), WatermarkFrame(150)]
        await h.inputs[1].output.send(IDLE)
        assert await take(1) == [IDLE]
        await h.inputs[1].output.send(WatermarkFrame(300))  # idle: ignored
        await h.inputs[0].output.close()
        assert await take(2) == [ACTIVE, WatermarkFrame(MAX_WATERMARK)]
        await h.inputs[1].output.close()
        assert await take(1) == [EndOfPartitionFrame()]
        async with asyncio.timeout(10):
            await running

    run(main())


def test_without_idleness_the_silent_input_holds_the_watermark_back() -> None:
    async def main() -> None:
        h = harness([FireAt(100)], num_inputs=2, input_of=[0, 1])
        running = asyncio.create_task(h.task.run())
        gate = InputGate([h.output.input])
        await h.inputs[1].output.send(WatermarkFrame(150))
        await h.inputs[1].output.send(DataFrame(batch(1)))  # taken after the watermark
        async with asyncio.timeout(10):
            first = await gate.next()
        assert first == (0, DataFrame(batch(1)))  # nothing fired at 150: input 0 holds it
        await h.inputs[0].output.close()
        async with asyncio.timeout(10):
            fired = [(await gate.next()) for _ in range(2)]
        # the timer fires only once input 0 ended
        assert fired == [(0, DataFrame(batch(100))), (0, WatermarkFrame(150))]
        await h.inputs[1].output.close()
        rest: list[Frame] = []
        async with asyncio.timeout(10):
            while (item := await gate.next()) is not None:
                rest.append(item[1])
            await running
        assert rest == [WatermarkFrame(MAX_WATERMARK), EndOfPartitionFrame()]

    run(main())

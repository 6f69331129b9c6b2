"""Busy and backpressured time of a subtask (``worker/runtime/busy_time.py``): milliseconds per
second of the period between two samples, each moment counted once (busy wins when the phases
nest), and what a running subtask reports with its watermark."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
import pytest
from kit.subtasks import batch, harness

from snapflow.event_time import MAX_WATERMARK
from snapflow.worker.runtime.busy_time import BusyTimeMeter
from snapflow.worker.runtime.frames import DataFrame, WatermarkFrame
from snapflow.worker.runtime.operator import Operator

MS = 1_000_000  # ns


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms * MS


def test_busy_and_backpressured_time_per_second_of_the_period() -> None:
    clock = FakeClock()
    meter = BusyTimeMeter(clock)
    with meter.busy:
        clock.advance(300)
    clock.advance(100)  # idle
    with meter.backpressured:
        clock.advance(500)
    clock.advance(100)
    assert meter.sample() == (300.0, 500.0, 1000)
    # A new period: half of 2 s busy, a phase still open counts up to the sample.
    with meter.busy:
        clock.advance(1000)
        clock.advance(0)
        assert meter.sample() == (1000.0, 0.0, 1000)
        clock.advance(500)
    clock.advance(500)
    assert meter.sample() == (500.0, 0.0, 1000)
    assert meter.sample() == (0.0, 0.0, 0)  # an empty period


def test_nested_phases_count_each_moment_once_busy_first() -> None:
    clock = FakeClock()
    meter = BusyTimeMeter(clock)
    with meter.backpressured:
        clock.advance(200)
        with meter.busy:  # a snapshot taken while waiting for credit
            clock.advance(300)
            with meter.busy:
                clock.advance(100)
        clock.advance(400)
    assert meter.sample() == (400.0, 600.0, 1000)


def test_an_exception_closes_the_phase() -> None:
    clock = FakeClock()
    meter = BusyTimeMeter(clock)
    with pytest.raises(ValueError), meter.busy:
        clock.advance(100)
        raise ValueError("user code")
    clock.advance(900)
    assert meter.sample() == (100.0, 0.0, 1000)


class SlowMap(Operator):
    """50 ms of work per batch (time.sleep: the loop is held, as by CPU-bound user code)."""

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        time.sleep(0.05)
        return [batch]


def test_a_subtask_reports_busy_and_backpressured_time_and_its_watermark() -> None:
    async def main() -> None:
        # One credit and a queue of one: the third batch waits until the output is read.
        h = harness([SlowMap()], num_inputs=1, output_credits=1, output_queue=1)
        assert h.task.metrics().watermark_ms is None  # none yet
        await h.inputs[0].output.send(WatermarkFrame(1234))
        for i in range(4):
            await h.inputs[0].output.send(DataFrame(batch(i)))
        await h.inputs[0].output.close()
        run = asyncio.create_task(h.task.run())
        await asyncio.sleep(0.4)  # nobody reads the output meanwhile
        m = h.task.metrics()
        assert m.watermark_ms == 1234
        assert 300 <= m.period_ms <= 2000
        # 3 batches of 50 ms ran (the fourth waits behind the third's send), the rest waited.
        assert m.busy_ms_per_second * m.period_ms / 1000 >= 140, m
        assert m.backpressured_ms_per_second * m.period_ms / 1000 >= 100, m
        assert m.busy_ms_per_second + m.backpressured_ms_per_second <= 1000.0 + 1e-6
        await h.outputs()
        await run
        assert h.task.metrics().watermark_ms == MAX_WATERMARK  # the input ended

    asyncio.run(main())

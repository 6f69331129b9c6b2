"""Buffer debloating (``snapflow.worker.runtime.debloat``): the pure core as exact event
sequences with injected time, invariants after every step; then the channel that applies it."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pytest
from kit.channels import run

from snapflow.worker.runtime.channel_errors import ChannelFailedError
from snapflow.worker.runtime.debloat import (
    POLL_BUDGETS,
    UNBOUNDED,
    Budget,
    ChannelDebloater,
    DebloatSettings,
)
from snapflow.worker.runtime.frames import DataFrame
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.partitioners import ForwardPartitioner, KeyGroupPartitioner
from snapflow.worker.runtime.task_output import OutputEdge, TaskOutput

MS = 1_000_000  # ns


def _debloater(**kw: Any) -> ChannelDebloater:
    settings: dict[str, Any] = {
        "target_ms": 100,
        "period_ms": 50,
        "samples": 1,
        "min_frame_rows": 10,
        "split_frames": True,
        **kw,
    }
    return ChannelDebloater(DebloatSettings(**settings))


def _step(d: ChannelDebloater, result: object = None) -> object:
    d.check_invariants()
    return result


def test_the_smallest_budget_until_the_first_sample_then_throughput_times_target() -> None:
    d = _debloater()
    # two minimum frames; one frame of any size still goes while the channel holds nothing
    assert d.budget() == Budget(20, 10, 10) and d.may_hand_over(10**9)
    for _ in range(4):
        d.on_handed_over(1000, 0)
        _step(d)
    assert d.outstanding_rows == 4000
    assert _step(d, d.on_credit(2, 20 * MS)) is None  # within the first period: no sample
    assert d.outstanding_rows == 2000
    # 2000 rows taken in 50 ms: 40,000 rows/s; 100 ms of it is 4000 rows, frames of 1000
    assert _step(d, d.on_credit(0, 50 * MS)) == Budget(4000, 1000, 1000)
    assert d.rate == pytest.approx(40_000)
    assert d.budget() == Budget(4000, 1000, 1000)


def test_the_initial_credit_is_not_consumption() -> None:
    d = _debloater()
    d.on_credit(4, 0)  # credits for buffers that never held a frame
    _step(d)
    d.on_handed_over(500, 1 * MS)
    d.on_credit(1, 60 * MS)
    _step(d)
    assert d.rate == pytest.approx(500 / 0.060)


def test_a_frame_goes_when_the_channel_is_empty_or_fits_the_budget() -> None:
    d = _debloater()
    d.on_handed_over(2000, 0)
    d.on_credit(1, 50 * MS)  # 40,000 rows/s -> budget 4000
    assert d.budget().max_rows == 4000
    assert d.may_hand_over(10_000)  # nothing outstanding: one frame always goes
    d.on_handed_over(3000, 51 * MS)
    assert d.may_hand_over(1000) and not d.may_hand_over(1001)
    _step(d)


def test_periods_without_consumption_keep_the_budget() -> None:
    """Idle, blocked for alignment or stuck in user code: no information, no change."""
    d = _debloater()
    d.on_handed_over(2000, 0)
    d.on_credit(1, 50 * MS)
    before = d.budget()
    d.on_handed_over(1000, 60 * MS)
    for t in (120, 200, 900, 5000):  # long stall, the frame still outstanding
        assert _step(d, d.on_tick(t * MS)) is None
    assert d.budget() == before
    assert d.rate == pytest.approx(40_000)


def test_the_rate_is_a_moving_average_and_the_budget_follows_it() -> None:
    d = _debloater(samples=3)  # alpha 0.5
    d.on_handed_over(5000, 0)
    d.on_credit(1, 50 * MS)  # sample 100,000 rows/s
    assert d.budget() == Budget(10_000, 2500, 2500)
    d.on_handed_over(1000, 50 * MS)
    assert _step(d, d.on_credit(1, 100 * MS)) == Budget(6000, 1500, 1500)  # (100k + 20k) / 2
    assert d.rate == pytest.approx(60_000)


def test_a_slow_consumer_is_bounded_below_by_two_minimum_frames() -> None:
    d = _debloater(min_frame_rows=256)
    d.on_handed_over(10, 0)
    d.on_credit(1, 1000 * MS)  # 10 rows/s
    assert _step(d, d.budget()) == Budget(512, 256, 256)


def test_off_measures_but_never_bounds() -> None:
    d = ChannelDebloater(DebloatSettings(target_ms=0, period_ms=50, min_frame_rows=10))
    d.on_handed_over(2000, 0)
    assert d.on_credit(1, 50 * MS) is None
    assert d.rate == pytest.approx(40_000)
    assert _step(d, d.budget()) == UNBOUNDED


def test_without_splitting_the_rows_in_flight_and_source_polls_are_bounded() -> None:
    """No frame is split; a source polls at most two budgets per channel (200 ms of the
    consumer's work each), so one poll is never seconds of a slow consumer's work."""
    d = _debloater(split_frames=False)
    assert d.budget() == Budget(20, None, 40)
    d.on_handed_over(2000, 0)
    assert _step(d, d.on_credit(1, 50 * MS)) == Budget(4000, None, 8000)


@pytest.mark.parametrize(
    "bad",
    [{"target_ms": -1}, {"period_ms": 0}, {"samples": 0}, {"min_frame_rows": 0}],
)
def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DebloatSettings(**bad)


def test_negative_events_are_refused() -> None:
    d = _debloater()
    with pytest.raises(ValueError):
        d.on_handed_over(-1, 0)
    with pytest.raises(ValueError):
        d.on_credit(-1, 0)


# --- the channel applying it ---------------------------------------------------------------


def _rows(start: int, n: int) -> DataFrame:
    return DataFrame(pa.record_batch({"key": pa.array(range(start, start + n), pa.int64())}))


def test_a_debloated_channel_splits_batches_and_bounds_what_it_holds() -> None:
    """A consumer that costs per row: the producer's batches are split to the debloated frame
    size, the rows the channel holds (queued + outstanding) stay within the budget plus the
    one batch the producer enqueued last, and every row arrives once, in order."""
    settings = DebloatSettings(
        target_ms=20, period_ms=5, samples=1, min_frame_rows=16, split_frames=True
    )

    async def main() -> None:
        ch = LocalChannel(4, output_queue=2, name="c", debloat=settings)
        gate = InputGate([ch.input])
        got: list[int] = []
        frames: list[int] = []

        async def consume() -> None:
            while (item := await gate.next()) is not None:
                _, frame = item
                if isinstance(frame, DataFrame):
                    frames.append(frame.batch.num_rows)
                    got.extend(frame.batch.column(0).to_pylist())
                    await asyncio.sleep(frame.batch.num_rows / 50_000)  # 50,000 rows/s

        consumer = asyncio.create_task(consume())
        out = ch.output
        sent = 0
        for i in range(30):
            rows = 512
            await out.send(_rows(sent, rows))
            sent += rows
            budget = out.budget
            if budget.max_rows is not None:
                held = out.queued_rows + out.debloater.outstanding_rows
                assert held <= budget.max_rows + rows, (i, held, budget)
            out.debloater.check_invariants()
        await out.close()
        await consumer
        assert got == list(range(sent))
        assert out.budget.max_frame_rows is not None, "the throughput was never sampled"
        assert min(frames) < 512, "no batch was split"
        # per-row cost: the frames settle near a quarter of 20 ms worth, they do not collapse
        assert min(frames[-10:]) >= 64, frames

    run(main())


def test_a_producer_that_waits_for_room_never_queues_behind_the_consumer() -> None:
    """``has_room``/``wait_for_room`` (what a source checks before it polls): once the budget
    binds, a frame sent when the channel has room is handed over at once, so nothing waits at
    the producer ahead of a later barrier; a failed channel has room (the send raises)."""
    settings = DebloatSettings(target_ms=20, period_ms=5, samples=1, min_frame_rows=16)

    async def main() -> None:
        ch = LocalChannel(4, output_queue=2, name="c", debloat=settings)
        gate = InputGate([ch.input])

        async def consume() -> None:
            while (item := await gate.next()) is not None:
                _, frame = item
                if isinstance(frame, DataFrame):
                    await asyncio.sleep(frame.batch.num_rows / 50_000)  # 50,000 rows/s

        consumer = asyncio.create_task(consume())
        out = ch.output
        sent = bound = 0
        for _ in range(40):
            await out.wait_for_room()
            assert out.has_room()
            await out.send(_rows(sent, 512))
            sent += 512
            if out.budget.max_rows is not None:
                bound += 1
                assert out.queued_data == 0, "a frame sent with room waited at the producer"
        assert bound > 10, "the budget never bound"
        await out.close()
        await consumer

        failed = LocalChannel(1, output_queue=0, name="f", debloat=settings)
        await failed.output.send(_rows(0, 512))  # takes the only credit
        blocked = asyncio.create_task(failed.output.send(_rows(512, 512)))  # no credit
        await asyncio.sleep(0)
        assert not blocked.done() and not failed.output.has_room()
        waiter = asyncio.create_task(failed.output.wait_for_room())
        failed.output.abort("test")
        await asyncio.wait_for(waiter, 5)  # returns: the next send raises instead
        assert failed.output.has_room()
        with pytest.raises(ChannelFailedError):
            await blocked

    run(main())


def test_a_source_polls_two_budgets_per_channel_of_its_slowest_consumer() -> None:
    """``TaskOutput.poll_records``: frames unsplit, a poll is at most ``POLL_BUDGETS`` budgets
    per channel of each edge (times the channels a partitioned batch spreads over), so a slow
    consumer is never sent seconds of work in one frame; a fast one keeps whole batches."""
    settings = DebloatSettings(target_ms=100, period_ms=50, samples=1, min_frame_rows=16)

    def channel(rows_per_s: int) -> LocalChannel:
        ch = LocalChannel(4, name=f"c{rows_per_s}", debloat=settings)
        ch.output.debloater.on_handed_over(rows_per_s // 20, 0)
        ch.output.debloater.on_credit(1, 50 * MS)  # the consumer took 50 ms worth
        return ch

    slow = [channel(20_000), channel(30_000)]  # budgets 2,000 and 3,000 rows
    fast = [channel(2_000_000)]
    hashed = OutputEdge(KeyGroupPartitioner("k", 128, 2), [c.output for c in slow])
    assert TaskOutput([hashed]).poll_records(65_536) == POLL_BUDGETS * 2_000 * 2
    assert (
        TaskOutput([OutputEdge(ForwardPartitioner(), [fast[0].output])]).poll_records(65_536)
        == 65_536
    )
    # before any sample: two minimum frames per budget
    fresh = LocalChannel(4, name="fresh", debloat=settings)
    forward = OutputEdge(ForwardPartitioner(), [fresh.output])
    assert TaskOutput([forward]).poll_records(65_536) == POLL_BUDGETS * 2 * 16

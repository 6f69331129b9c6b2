"""In-process data channels: order, credits and backpressure, priority frames, input gates."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from kit.channels import UNALIGNED, data, ident, run

from snapflow.checkpointing import BarrierOptions
from snapflow.worker.runtime.channel_errors import (
    ChannelClosedError,
    ChannelFailedError,
    CreditViolationError,
)
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfPartitionFrame,
    Frame,
    LatencyMarkerFrame,
    WatermarkFrame,
)
from snapflow.worker.runtime.input_channel import InputChannel
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel


async def drain(gate: InputGate) -> list[tuple[int, object]]:
    out = []
    while (item := await gate.next()) is not None:
        out.append((item[0], ident(item[1])))
    return out


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_data_and_events_keep_their_order() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=2)
        gate = InputGate([ch.input])
        barrier = BarrierFrame(1, 123, BarrierOptions())
        stream: list[Frame] = [
            data(0),
            WatermarkFrame(5),
            data(1),
            barrier,
            data(2),
            LatencyMarkerFrame(7, "src", 0),
            data(3),
            data(4),
            WatermarkFrame(9),
        ]

        async def produce() -> None:
            for f in stream:
                await ch.output.send(f)
            await ch.output.close()

        producer = asyncio.create_task(produce())
        got = await drain(gate)
        await producer
        assert got == [(0, ident(f)) for f in [*stream, EndOfPartitionFrame()]]
        # the very batch objects crossed the channel (no serialization in-process)
        assert ch.input.max_buffered <= 2
        assert gate.all_ended and gate.is_ended(0)
        assert await gate.next() is None
        with pytest.raises(ChannelClosedError):
            await ch.output.send(data(9))

    run(main())


def test_local_channel_hands_over_the_same_batch_objects() -> None:
    async def main() -> None:
        ch = LocalChannel()
        gate = InputGate([ch.input])
        frame = data(1)
        await ch.output.send(frame)
        item = await gate.next()
        assert item is not None and item[1] is frame

    run(main())


def test_backpressure_blocks_the_producer_and_bounds_in_flight_batches() -> None:
    async def main() -> None:
        buffers = 4
        ch = LocalChannel(buffers_per_channel=buffers, output_queue=0)
        gate = InputGate([ch.input])
        sent = 0

        async def produce() -> None:
            nonlocal sent
            for i in range(20):
                await ch.output.send(data(i))
                sent += 1
            await ch.output.close()

        producer = asyncio.create_task(produce())
        await settle()
        # credits exhausted: exactly `buffers` batches went out, the next send waits
        assert sent == buffers
        assert ch.output.credits == 0 and ch.output.queued_data == 1
        assert ch.input.buffered == buffers
        assert not producer.done()
        await settle()
        assert sent == buffers  # still blocked, no consumer progress

        taken = 0
        order = []
        while (item := await gate.next()) is not None:
            if isinstance(item[1], DataFrame):
                taken += 1
                order.append(ident(item[1]))
            # handed over and not yet taken by the consumer
            assert ch.output.sent_batches - taken <= buffers
            assert ch.input.buffered <= buffers
            # one batch consumed -> one credit back -> the producer resumes
            await settle()
            assert ch.output.sent_batches - taken <= buffers
        await producer
        assert order == list(range(20))
        assert ch.input.max_buffered == buffers

    run(main())


def test_output_queue_lets_the_producer_run_ahead_by_that_many_batches() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=2, output_queue=3)
        sent = 0

        async def produce() -> None:
            nonlocal sent
            for i in range(10):
                await ch.output.send(data(i))
                sent += 1

        producer = asyncio.create_task(produce())
        await settle()
        # 2 in the consumer's buffers, 3 queued, the 6th send waits with its frame queued
        assert ch.input.buffered == 2
        assert ch.output.queued_data == 4
        assert sent == 5
        producer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await producer

    run(main())


def test_events_are_not_credit_gated_but_stay_behind_queued_data() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=1, output_queue=5)
        gate = InputGate([ch.input])
        await ch.output.send(WatermarkFrame(1))
        await ch.output.send(data(0))
        await ch.output.send(data(1))  # no credit: queued
        await ch.output.send(WatermarkFrame(2))  # must wait behind data(1)
        assert [ident(f) for f in ch.output.queued] == [1, WatermarkFrame(2)]
        got = [ident((await gate.next() or (0, None))[1]) for _ in range(4)]
        assert got == [WatermarkFrame(1), 0, 1, WatermarkFrame(2)]

    run(main())


def test_priority_barrier_overtakes_queued_output_data_and_returns_exactly_it() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=2, output_queue=10)
        gate = InputGate([ch.input])
        for i in range(6):
            await ch.output.send(data(i))
        await ch.output.send(WatermarkFrame(3))
        # 0 and 1 were handed over (2 credits); 2..5 and the watermark are still queued
        assert ch.input.buffered == 2
        barrier = BarrierFrame(7, 1000, UNALIGNED)
        overtaken = ch.output.send_priority(barrier)
        assert [ident(f) for f in overtaken] == [2, 3, 4, 5]
        # overtaken frames stay queued: they are delivered after the barrier
        assert [ident(f) for f in ch.output.queued] == [2, 3, 4, 5, WatermarkFrame(3)]

        # consumer side: the barrier also overtakes the data in the input channel
        item = await gate.next()
        assert item == (0, barrier)
        assert [ident(f) for f in gate.persist_queued(0)] == [0, 1]
        assert ch.input.buffered == 2  # persisting neither consumes nor grants
        rest = [ident((await gate.next() or (0, None))[1]) for _ in range(7)]
        assert rest == [0, 1, 2, 3, 4, 5, WatermarkFrame(3)]

    run(main())


def test_priority_frames_keep_their_order_among_themselves() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=1, output_queue=10)
        await ch.output.send(data(0))
        await ch.output.send(data(1))
        await ch.output.send(data(2))
        first = ch.output.send_priority(BarrierFrame(1, 0, UNALIGNED))
        # the queue head is a deliverable event: delivered at once
        assert [ident(f) for f in first] == [1, 2]
        assert [ident(f) for f in ch.output.queued] == [1, 2]
        with pytest.raises(ValueError, match="overtake"):
            ch.output.send_priority(BarrierFrame(2, 0, BarrierOptions()))
        with pytest.raises(ValueError, match="overtake"):
            ch.output.send_priority(WatermarkFrame(1))
        second = ch.output.send_priority(CancelMarkerFrame(1))
        assert [ident(f) for f in second] == [1, 2]

    run(main())


def test_a_timed_out_aligned_barrier_is_converted_and_overtakes_the_data_ahead_of_it() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=1, output_queue=10)
        gate = InputGate([ch.input])
        aligned = BarrierFrame(5, 10, BarrierOptions(aligned_checkpoint_timeout_ms=100))
        stream: list[Frame] = [data(0), data(1), data(2), aligned, data(3)]
        for f in stream:
            await ch.output.send(f)
        assert ch.output.convert_to_unaligned(4) is None  # no such barrier queued
        overtaken = ch.output.convert_to_unaligned(5)
        assert overtaken is not None and [ident(f) for f in overtaken] == [1, 2]
        converted = BarrierFrame(5, 10, replace(aligned.options, mode=UNALIGNED.mode))
        assert await gate.next() == (0, converted)
        assert [ident(f) for f in gate.persist_queued(0)] == [0]
        rest = [ident((await gate.next() or (0, None))[1]) for _ in range(4)]
        assert rest == [0, 1, 2, 3]
        assert ch.output.convert_to_unaligned(5) is None  # already handed over

    run(main())


def test_persist_queued_excludes_frames_that_arrived_after_the_priority_frame() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=4)
        gate = InputGate([ch.input])
        await ch.output.send(data(0))
        await ch.output.send(data(1))
        barrier = BarrierFrame(3, 0, UNALIGNED)
        assert ch.output.send_priority(barrier) == []  # nothing queued on the output side
        await ch.output.send(data(2))  # after the barrier in the stream
        await ch.output.send(CancelMarkerFrame(3))
        await ch.output.send(data(3))
        assert await gate.next() == (0, barrier)
        assert [ident(f) for f in gate.persist_queued(0)] == [0, 1]
        # the cancel marker overtakes what is queued once the task moved on
        assert await gate.next() == (0, CancelMarkerFrame(3))
        assert [ident(f) for f in gate.persist_queued(0)] == [0, 1, 2]
        got = [ident((await gate.next() or (0, None))[1]) for _ in range(4)]
        assert got == [0, 1, 2, 3]

    run(main())


def test_persist_queued_stops_at_the_barrier_of_the_checkpoint() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=8)
        gate = InputGate([ch.input])
        stream: list[Frame] = [data(0), BarrierFrame(4, 0), data(1), BarrierFrame(5, 0), data(2)]
        for f in stream:
            await ch.output.send(f)
        assert [ident(f) for f in gate.persist_queued(0, until_checkpoint=5)] == [0, 1]
        assert [ident(f) for f in gate.persist_queued(0, until_checkpoint=4)] == [0]
        assert [ident(f) for f in gate.persist_queued(0)] == [0, 1, 2]

    run(main())


def test_blocked_channels_are_skipped_and_resume_in_order() -> None:
    async def main() -> None:
        a, b = LocalChannel(8), LocalChannel(8)
        gate = InputGate([a.input, b.input])
        barrier = BarrierFrame(1, 0)
        stream: list[Frame] = [data(0), barrier, data(1), data(2)]
        for f in stream:
            await a.output.send(f)
        for i in range(10, 14):
            await b.output.send(data(i))
        # channel 0 delivers its barrier and is blocked (aligned checkpoint)
        assert [await gate.next() for _ in range(2)] == [(0, data(0)), (1, data(10))]
        assert await gate.next() == (0, barrier)
        gate.block(0)
        assert gate.is_blocked(0) and gate.blocked == {0}
        got = [await gate.next() for _ in range(3)]
        assert [item[0] if item else None for item in got] == [1, 1, 1]
        # a blocked channel still returns priority frames
        cancel = CancelMarkerFrame(1)
        await a.output.send(cancel)
        assert await gate.next() == (0, cancel)
        # nothing returnable now: next() waits until the channel is unblocked
        waiting = asyncio.create_task(gate.next())
        await settle()
        assert not waiting.done()
        gate.unblock(0)
        assert await waiting == (0, data(1))
        assert await gate.next() == (0, data(2))
        gate.block(1)
        gate.unblock_all()
        assert not gate.blocked

    run(main())


def test_gate_is_fair_round_robin_across_channels() -> None:
    async def main() -> None:
        chans = [LocalChannel(8) for _ in range(3)]
        gate = InputGate([c.input for c in chans])
        # channel 0 is much busier than the others; it must not starve them
        for i in range(8):
            await chans[0].output.send(data(i))
        for i in range(2):
            await chans[1].output.send(data(100 + i))
            await chans[2].output.send(data(200 + i))
        order = [(await gate.next() or (-1, None))[0] for _ in range(12)]
        assert order == [0, 1, 2, 0, 1, 2, 0, 0, 0, 0, 0, 0]

    run(main())


def test_end_of_partition_closes_a_channel_and_the_gate_ends_with_the_last() -> None:
    async def main() -> None:
        a, b = LocalChannel(), LocalChannel()
        gate = InputGate([a.input, b.input])
        await a.output.send(data(1))
        await a.output.close()
        await b.output.send(data(2))
        got = [await gate.next() for _ in range(3)]
        assert (0, EndOfPartitionFrame()) in got
        assert gate.is_ended(0) and not gate.is_ended(1)
        assert gate.open_channels == [1]
        waiting = asyncio.create_task(gate.next())
        await settle()
        assert not waiting.done()
        await b.output.close()
        assert await waiting == (1, EndOfPartitionFrame())
        assert await gate.next() is None
        await a.output.close()  # idempotent

    run(main())


def test_close_waits_for_credit_to_deliver_the_queue() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=1, output_queue=5)
        gate = InputGate([ch.input])
        await ch.output.send(data(0))
        await ch.output.send(data(1))
        closing = asyncio.create_task(ch.output.close())
        await settle()
        assert not closing.done()
        assert await gate.next() == (0, data(0))
        await settle()
        assert closing.done()
        assert [ident((await gate.next() or (0, None))[1]) for _ in range(2)] == [
            1,
            EndOfPartitionFrame(),
        ]

    run(main())


def test_producer_abort_fails_the_consumer() -> None:
    async def main() -> None:
        a, b = LocalChannel(), LocalChannel()
        gate = InputGate([a.input, b.input])
        await b.output.send(data(1))
        a.output.abort(RuntimeError("boom"))
        with pytest.raises(ChannelFailedError, match="boom"):
            await gate.next()
        with pytest.raises(ChannelFailedError):
            await a.output.send(data(2))

    run(main())


def test_a_waiting_consumer_fails_as_soon_as_a_channel_fails() -> None:
    async def main() -> None:
        ch = LocalChannel()
        gate = InputGate([ch.input])
        waiting = asyncio.create_task(gate.next())
        await settle()
        ch.output.abort("cancelled")
        with pytest.raises(ChannelFailedError, match="cancelled"):
            await waiting

    run(main())


def test_consumer_release_fails_a_blocked_producer() -> None:
    async def main() -> None:
        ch = LocalChannel(buffers_per_channel=1, output_queue=0)
        gate = InputGate([ch.input])
        await ch.output.send(data(0))
        blocked = asyncio.create_task(ch.output.send(data(1)))
        await settle()
        assert not blocked.done()
        gate.close("task cancelled")
        with pytest.raises(ChannelFailedError, match="task cancelled"):
            await blocked
        with pytest.raises(ChannelClosedError, match="released: task cancelled"):
            await gate.next()

    run(main())


def test_input_channel_refuses_data_without_credit() -> None:
    ch = InputChannel(2)
    credits: list[int] = []
    assert ch.connect(credits.append) == 2
    ch.receive(data(0))
    ch.receive(data(1))
    ch.receive(WatermarkFrame(1))  # events need no credit
    with pytest.raises(CreditViolationError):
        ch.receive(data(2))
    with pytest.raises(ValueError):
        ch.grant(1)  # nothing was consumed: no buffer to give back
    gate = InputGate([ch])
    assert gate.poll() == (0, data(0))
    assert credits == [1]
    ch.receive(data(2))
    with pytest.raises(CreditViolationError):
        ch.receive(data(3))

"""Frames codec and data channels over real gRPC (127.0.0.1, one process, one loop)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import grpc.aio
import pyarrow as pa
import pytest
from kit.channels import UNALIGNED, data, ident, run
from kit.polling import holds_for_async, wait_until_async

from snapflow.checkpointing import BarrierOptions, CheckpointKind, CheckpointMode
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.channel_errors import ChannelFailedError
from snapflow.worker.runtime.exchange import (
    ChannelRefusedError,
    ChannelRegistry,
    DataExchangeServicer,
)
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfDataFrame,
    EndOfPartitionFrame,
    Frame,
    FrameTooLargeError,
    LatencyMarkerFrame,
    WatermarkFrame,
    WatermarkStatusFrame,
    decode_batch,
    encode_batch,
    encode_batch_chunks,
    frame_from_proto,
    frame_to_proto,
    is_event,
    is_priority,
)
from snapflow.worker.runtime.input_channel import InputChannel
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.remote_output_channel import RemoteOutputChannel


def rich_batch() -> pa.RecordBatch:
    """Types whose bytes must survive the wire: nulls, strings, floats, nested, metadata."""
    schema = pa.schema(
        [
            ("key", pa.int64()),
            ("name", pa.string()),
            ("score", pa.float64()),
            ("tags", pa.list_(pa.int32())),
            ("ts", pa.timestamp("ms")),
        ],
        metadata={"origin": "test"},
    )
    return pa.record_batch(
        [
            pa.array([1, None, -(2**63), 2**63 - 1], pa.int64()),
            pa.array(["a", "", None, "ünï€ode"]),
            pa.array([0.1, float("nan"), -0.0, None]),
            pa.array([[1, 2], [], None, [3]], pa.list_(pa.int32())),
            pa.array([0, 1, None, 1_700_000_000_000], pa.timestamp("ms")),
        ],
        schema=schema,
    )


def assert_bit_exact(got: pa.RecordBatch, want: pa.RecordBatch) -> None:
    """Same schema (with metadata), same values, same bits (NaN and -0.0 included)."""
    assert got.schema.equals(want.schema, check_metadata=True)
    assert encode_batch(got) == encode_batch(want)
    for g, w in zip(got.columns, want.columns, strict=True):
        if pa.types.is_floating(w.type):  # NaN != NaN: compare the bits as integers
            g = pa.Array.from_buffers(pa.int64(), len(g), g.buffers(), offset=g.offset)
            w = pa.Array.from_buffers(pa.int64(), len(w), w.buffers(), offset=w.offset)
        assert g.equals(w)


def channel_id(
    consumer_subtask: int = 0, attempt: int = 1, job_id: str = "job-1", producer_subtask: int = 0
) -> wpb.ChannelId:
    return wpb.ChannelId(
        job_id=job_id,
        producer_vertex_id="map",
        producer_subtask=producer_subtask,
        consumer_vertex_id="sink",
        consumer_subtask=consumer_subtask,
        attempt=attempt,
    )


@dataclass
class Consumer:
    registry: ChannelRegistry
    stub: wgrpc.DataExchangeServiceAsyncStub
    server: grpc.aio.Server

    def expect(self, cid: wpb.ChannelId, buffers: int = 4) -> InputChannel:
        ch = InputChannel(buffers, name=f"in{cid.producer_subtask}")
        self.registry.register(cid, ch)
        return ch


@asynccontextmanager
async def consumer_agent() -> AsyncIterator[Consumer]:
    """A grpc.aio server with a DataExchangeServicer on 127.0.0.1:0, and a client stub."""
    registry = ChannelRegistry()
    server = grpc.aio.server()
    wgrpc.add_DataExchangeServiceServicer_to_server(DataExchangeServicer(registry), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Consumer(registry, wgrpc.DataExchangeServiceStub(channel), server)
    finally:
        await server.stop(None)


async def next_frame(gate: InputGate) -> Frame:
    item = await gate.next()
    assert item is not None
    return item[1]


# ---------------------------------------------------------------------------------------------
# Codec
# ---------------------------------------------------------------------------------------------


def test_every_frame_type_round_trips_through_protobuf() -> None:
    frames: list[Frame] = [
        BarrierFrame(
            42,
            1_700_000_000_123,
            BarrierOptions(
                kind=CheckpointKind.SAVEPOINT,
                mode=CheckpointMode.UNALIGNED,
                aligned_checkpoint_timeout_ms=250,
                target_location="/tmp/sp-1",
            ),
        ),
        BarrierFrame(1, 2),
        CancelMarkerFrame(9),
        EndOfDataFrame(),
        EndOfPartitionFrame(),
        WatermarkFrame(-5),
        WatermarkStatusFrame(idle=True),
        WatermarkStatusFrame(idle=False),
        LatencyMarkerFrame(77, "src", 3),
    ]
    for frame in frames:
        wire = frame_to_proto(frame).SerializeToString()
        assert frame_from_proto(wpb.Frame.FromString(wire)) == frame
    batch = rich_batch()
    back = frame_from_proto(
        wpb.Frame.FromString(frame_to_proto(DataFrame(batch)).SerializeToString())
    )
    assert isinstance(back, DataFrame)
    assert_bit_exact(back.batch, batch)


def test_frame_classification() -> None:
    assert not is_event(data(0)) and not is_priority(data(0))
    assert is_event(BarrierFrame(1, 0)) and not is_priority(BarrierFrame(1, 0))
    assert is_priority(BarrierFrame(1, 0, UNALIGNED))
    assert is_priority(CancelMarkerFrame(1))
    for event in (
        EndOfDataFrame(),
        EndOfPartitionFrame(),
        WatermarkFrame(1),
        WatermarkStatusFrame(idle=True),
        LatencyMarkerFrame(1, "s", 0),
    ):
        assert is_event(event) and not is_priority(event)
    assert data(0, rows=3).num_records == 3 and data(0, rows=3).nbytes == 3 * 3 * 8


def test_large_batches_are_split_by_rows_within_the_limit() -> None:
    n = 50_000
    batch = pa.record_batch(
        {
            "key": pa.array(range(n), pa.int64()),
            "name": pa.array([f"name-{i}" * (1 + i % 7) for i in range(n)]),
        }
    )
    limit = 128 * 1024
    chunks = encode_batch_chunks(batch, limit)
    assert len(chunks) > 1
    assert all(len(payload) <= limit for _, payload in chunks)
    assert all(decode_batch(payload).equals(chunk) for chunk, payload in chunks)
    assert pa.Table.from_batches([c for c, _ in chunks]).equals(pa.Table.from_batches([batch]))
    assert len(encode_batch_chunks(batch, 64 * 1024 * 1024)) == 1
    huge_row = pa.record_batch({"blob": pa.array([b"x" * 10_000])})
    with pytest.raises(FrameTooLargeError):
        encode_batch_chunks(huge_row, 4096)


# ---------------------------------------------------------------------------------------------
# Over gRPC
# ---------------------------------------------------------------------------------------------


def test_frames_cross_grpc_in_order_and_batches_bit_exact() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            gate = InputGate([agent.expect(channel_id(), buffers=2)])
            out = await RemoteOutputChannel.connect(agent.stub, channel_id())
            assert out.initial_credit == 2
            batch = rich_batch()
            stream: list[Frame] = [
                DataFrame(batch),
                WatermarkFrame(5),
                data(1),
                BarrierFrame(1, 123, BarrierOptions(target_location="x")),
                data(2),
                LatencyMarkerFrame(7, "src", 0),
                data(3),
                data(4),
            ]

            async def produce() -> None:
                for f in stream:
                    await out.send(f)
                await out.close()

            producer = asyncio.create_task(produce())
            got = []
            while (item := await gate.next()) is not None:
                got.append(item[1])
            await producer
            assert [ident(f) for f in got[1:]] == [ident(f) for f in stream[1:]] + [
                EndOfPartitionFrame()
            ]
            first = got[0]
            assert isinstance(first, DataFrame)
            assert_bit_exact(first.batch, batch)
            assert gate.channels[0].max_buffered <= 2
            assert out.sent_batches == 5 and out.sent_records == 4 + 4 * 4

    run(main())


def test_remote_backpressure_bounds_in_flight_batches() -> None:
    async def main() -> None:
        buffers = 3
        async with consumer_agent() as agent:
            ch = agent.expect(channel_id(), buffers=buffers)
            gate = InputGate([ch])
            out = await RemoteOutputChannel.connect(agent.stub, channel_id(), output_queue=0)
            sent = 0

            async def produce() -> None:
                nonlocal sent
                for i in range(30):
                    await out.send(data(i))
                    sent += 1
                await out.close()

            producer = asyncio.create_task(produce())
            await wait_until_async(lambda: ch.buffered == buffers, "the credit used up")
            # the consumer took nothing: the producer is stuck on its 4th send
            await holds_for_async(
                lambda: sent == buffers and not producer.done(), "the producer blocked", 0.05
            )
            assert sent == buffers and not producer.done()
            assert out.credits == 0 and out.queued_data == 1
            assert ch.buffered == buffers

            order = []
            while (item := await gate.next()) is not None:
                if isinstance(item[1], DataFrame):
                    order.append(ident(item[1]))
                assert out.sent_batches - len(order) <= buffers
                assert ch.buffered <= buffers
                await asyncio.sleep(0.001)  # a slow consumer
            await producer
            assert order == list(range(30))
            assert ch.max_buffered == buffers

    run(main())


def test_remote_priority_barrier_overtakes_queued_data() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            ch = agent.expect(channel_id(), buffers=2)
            gate = InputGate([ch])
            out = await RemoteOutputChannel.connect(agent.stub, channel_id(), output_queue=10)
            for i in range(6):
                await out.send(data(i))
            await wait_until_async(lambda: ch.buffered == 2, "2 batches buffered")
            assert out.queued_data == 4
            barrier = BarrierFrame(3, 99, UNALIGNED)
            overtaken = out.send_priority(barrier)
            assert [ident(f) for f in overtaken] == [2, 3, 4, 5]
            await wait_until_async(lambda: ch.priority_pending, "the barrier received")

            assert await next_frame(gate) == barrier
            assert [ident(f) for f in gate.persist_queued(0)] == [0, 1]
            rest = [ident(await next_frame(gate)) for _ in range(6)]
            assert rest == [0, 1, 2, 3, 4, 5]
            await out.close()
            assert await next_frame(gate) == EndOfPartitionFrame()

    run(main())


def test_large_batches_are_split_and_each_chunk_spends_a_credit() -> None:
    async def main() -> None:
        n = 65_536
        batch = pa.record_batch(
            {
                "key": pa.array(range(n), pa.int64()),
                "value": pa.array(range(n, 2 * n), pa.int64()),
                "timestamp": pa.array(range(n), pa.int64()),
            }
        )
        async with consumer_agent() as agent:
            ch = agent.expect(channel_id(), buffers=2)
            gate = InputGate([ch])
            out = await RemoteOutputChannel.connect(
                agent.stub, channel_id(), max_message_bytes=256 * 1024
            )
            producer = asyncio.create_task(out.send(DataFrame(batch)))
            chunks: list[pa.RecordBatch] = []
            while sum(c.num_rows for c in chunks) < n:
                frame = await next_frame(gate)
                assert isinstance(frame, DataFrame)
                chunks.append(frame.batch)
            await producer
            assert len(chunks) >= 6
            assert ch.max_buffered <= 2
            assert pa.Table.from_batches(chunks).equals(pa.Table.from_batches([batch]))
            assert out.sent_batches == len(chunks)
            await out.close()

    run(main())


def test_unknown_stale_and_duplicate_channels_are_refused() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            agent.expect(channel_id(attempt=2))
            cases = {
                "unknown job 'other'": channel_id(job_id="other"),
                "unknown channel": channel_id(consumer_subtask=5),
                "stale attempt 1": channel_id(attempt=1),
                "unknown attempt 3": channel_id(attempt=3),
            }
            for message, cid in cases.items():
                with pytest.raises(ChannelRefusedError, match=message):
                    await RemoteOutputChannel.connect(agent.stub, cid)
            out = await RemoteOutputChannel.connect(agent.stub, channel_id(attempt=2))
            with pytest.raises(ChannelRefusedError, match="already has a stream"):
                await RemoteOutputChannel.connect(agent.stub, channel_id(attempt=2))
            out.abort("test over")

    run(main())


def test_a_new_attempt_replaces_the_old_one_whose_producer_is_then_refused() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            agent.expect(channel_id(attempt=1), buffers=1)
            old = await RemoteOutputChannel.connect(agent.stub, channel_id(attempt=1))
            await old.send(data(0))
            # failover: the consumer is redeployed as attempt 2 on this agent
            new_input = agent.expect(channel_id(attempt=2))
            with pytest.raises(ChannelFailedError, match="replaced by attempt 2"):
                for i in range(1, 50):
                    await old.send(data(i))
            with pytest.raises(ChannelRefusedError, match="stale attempt 1"):
                await RemoteOutputChannel.connect(agent.stub, channel_id(attempt=1))
            new = await RemoteOutputChannel.connect(agent.stub, channel_id(attempt=2))
            gate = InputGate([new_input])
            await new.send(data(7))
            await new.close()
            assert [ident(await next_frame(gate)) for _ in range(2)] == [7, EndOfPartitionFrame()]

    run(main())


def test_first_message_must_be_open() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            call = agent.stub.Exchange()
            msg = wpb.ExchangeMessage()
            frame_to_proto(WatermarkFrame(1), msg.frame)
            await call.write(msg)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    run(main())


def test_producer_fails_when_the_consumer_server_stops() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            ch = agent.expect(channel_id(), buffers=2)
            gate = InputGate([ch])
            out = await RemoteOutputChannel.connect(agent.stub, channel_id(), output_queue=0)
            await out.send(data(0))
            assert await next_frame(gate) == data(0)
            await agent.server.stop(None)
            # the consumer's channel failed: its task fails
            with pytest.raises(ChannelFailedError):
                await gate.next()
            # the producer's next send (or the one waiting for credit) raises
            with pytest.raises(ChannelFailedError, match="stream"):
                for i in range(1, 100):
                    await out.send(data(i))
            with pytest.raises(ChannelFailedError):
                await out.close()

    run(main())


def test_consumer_release_aborts_the_stream() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            ch = agent.expect(channel_id(), buffers=1)
            gate = InputGate([ch])
            out = await RemoteOutputChannel.connect(agent.stub, channel_id(), output_queue=0)
            await out.send(data(0))
            await wait_until_async(lambda: ch.buffered == 1, "1 batch buffered")
            blocked = asyncio.create_task(out.send(data(1)))
            await holds_for_async(lambda: not blocked.done(), "the send blocked (no credit)", 0.01)
            gate.close("consumer task failed")
            with pytest.raises(ChannelFailedError, match=r"ABORTED.*consumer task failed"):
                await blocked

    run(main())


def test_producer_abort_fails_the_consumer_channel() -> None:
    async def main() -> None:
        async with consumer_agent() as agent:
            a = agent.expect(channel_id(producer_subtask=0))
            b = agent.expect(channel_id(producer_subtask=1))
            gate = InputGate([a, b])
            out_a = await RemoteOutputChannel.connect(agent.stub, channel_id(producer_subtask=0))
            out_b = await RemoteOutputChannel.connect(agent.stub, channel_id(producer_subtask=1))
            await out_b.send(data(1))
            assert await gate.next() == (1, data(1))
            out_a.abort(RuntimeError("producer task failed"))
            with pytest.raises(ChannelFailedError, match=r"map\[0\]->sink\[0\]"):
                await gate.next()
            out_b.abort("test over")

    run(main())

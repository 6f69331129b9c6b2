"""The chaos suite's hostile ``Exchange`` streams against a real ``DataExchangeServicer``
served as an agent serves it (``add_servicer``, the agent's 16 MiB message limit).

Every kind must get a deliberate status (never ``UNKNOWN``/``INTERNAL``, never credit), and a
live channel named by them (unknown producer, attempts no deployment has) must stay free for
its real producer.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

import grpc
import grpc.aio
from kit.channels import run

from snapflow.request_parsing import add_servicer
from snapflow.v1 import worker_pb2 as wpb
from snapflow.worker.runtime.agent import MAX_MESSAGE_BYTES
from snapflow.worker.runtime.exchange import (
    ChannelRegistry,
    DataExchangeServicer,
    exchange_grpc_options,
)
from snapflow.worker.runtime.input_channel import InputChannel

# chaos/ is a top-level package of the repository (like bench/), not an installed one.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.hostile import (
    EXCHANGE_KINDS,
    HostileStats,
    hostile_exchange_stream,
    send_stream,
)

EXCHANGE = wpb.DESCRIPTOR.services_by_name["DataExchangeService"]
LIVE_JOB = "0123456789abcdef0123456789abcdef"
ALLOWED = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"}
# The agent refuses a 17 MiB message as soon as its length is read, while the client may still
# be sending it: that client then sees its own write fail instead of RESOURCE_EXHAUSTED.
OVERSIZED = {"oversized RESOURCE_EXHAUSTED", "oversized ENDED_DURING_WRITE"}


def live_channel(attempt: int = 3) -> wpb.ChannelId:
    return wpb.ChannelId(
        job_id=LIVE_JOB,
        producer_vertex_id="source",
        producer_subtask=0,
        consumer_vertex_id="count",
        consumer_subtask=0,
        attempt=attempt,
    )


def test_every_hostile_exchange_stream_is_refused_with_a_clear_status() -> None:
    async def main() -> None:
        registry = ChannelRegistry()
        live = InputChannel(4, name="live")
        registry.register(live_channel(), live)
        server = grpc.aio.server(options=exchange_grpc_options(MAX_MESSAGE_BYTES))
        add_servicer(server, EXCHANGE, DataExchangeServicer(registry))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stats = HostileStats()
        try:
            rng = random.Random(5)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for kind in EXCHANGE_KINDS:
                    for _ in range(2 if kind == "oversized" else 6):
                        payloads = hostile_exchange_stream(kind, rng, [LIVE_JOB])
                        await send_stream(channel, kind, payloads, stats)
                    outcomes = {o for o in stats.streams if not o.startswith("oversized")}
                    assert {o.split()[1] for o in outcomes} <= ALLOWED, (stats.streams, stats.bad)
                # The live channel is untouched: its real producer still connects.
                assert registry.connect(live_channel()) is live
        finally:
            await server.stop(None)
        assert stats.sent == stats.exchange_streams == 6 * (len(EXCHANGE_KINDS) - 1) + 2
        assert stats.unexpected == 0 and stats.bad == []
        assert sum(n for o, n in stats.streams.items() if o in OVERSIZED) == 2, stats.streams
        assert stats.statuses["FAILED_PRECONDITION"] >= 12  # unknown job, channel, attempt

    run(main())


def test_a_stream_the_agent_accepts_is_counted_as_unexpected() -> None:
    """The check can fail: a hostile stream naming the live channel's real attempt takes the
    channel and gets credit, and ``send_stream`` reports it."""

    async def main() -> None:
        registry = ChannelRegistry()
        registry.register(live_channel(), InputChannel(4, name="live"))
        server = grpc.aio.server()
        add_servicer(server, EXCHANGE, DataExchangeServicer(registry))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stats = HostileStats()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                open_live = wpb.ExchangeMessage(open=live_channel()).SerializeToString()
                await asyncio.wait_for(send_stream(channel, "real", [open_live], stats), 10)
        finally:
            await server.stop(None)
        assert stats.unexpected == 1 and "got credit" in stats.bad[0]

    run(main())

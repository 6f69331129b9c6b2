"""The control plane never waits for user code: operators run on the task thread
(``snapflow.worker.runtime.mailbox``), so triggers, barriers and acks go on while a sink is
stuck; aligned-with-timeout converts a barrier still queued in an output channel; the
input-side timeout fires under a steady stream of data.

A source subtask and a sink subtask share one loop (one agent), joined by an in-process
channel; the sink's operator blocks on a ``threading.Event`` until the test releases it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from kit.channels import run
from kit.polling import wait_until_async
from kit.subtasks import batch, harness

from snapflow.checkpointing import BarrierOptions, CheckpointMode, DeclineReason
from snapflow.worker.connectors.split_sources import SequenceSource
from snapflow.worker.runtime.debloat import DEBLOAT_OFF
from snapflow.worker.runtime.frames import BarrierFrame, DataFrame
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.partitioners import ForwardPartitioner
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport
from snapflow.worker.runtime.task import Subtask
from snapflow.worker.runtime.task_output import OutputEdge
from snapflow.worker.runtime.task_state import RestoreData

WAIT_S = 4.0


class BlockingSink(Operator):
    """Blocks in ``process_batch`` until ``release`` is set (a sink stuck in user code)."""

    def __init__(self, release: threading.Event, entered: threading.Event) -> None:
        self.release = release
        self.entered = entered
        self.rows = 0

    def process_batch(self, b: pa.RecordBatch) -> list[pa.RecordBatch]:
        self.entered.set()
        if not self.release.wait(30):
            raise TimeoutError("never released")
        self.rows += b.num_rows
        return []


class Pair:
    """source -> sink on one loop; acks recorded per task; every ack completes at once."""

    def __init__(self, tmp: Path, mode: CheckpointMode, total: int = 2_000_000) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.sink_op = BlockingSink(self.release, self.entered)
        # count bounds only: the stuck sink takes no frame, so a debloated channel would never
        # measure it and hold just one frame; these tests need data queued at the producer
        self.channel = LocalChannel(2, output_queue=1, name="src->sink", debloat=DEBLOAT_OFF)
        self.acks: dict[str, list[SnapshotReport]] = {"source": [], "sink": []}
        self.declines: list[tuple[int, DeclineReason, str]] = []
        self.tmp = tmp

        def task(name: str, operators: list[Any], **kw: Any) -> Subtask:
            async def ack(report: SnapshotReport) -> None:
                self.acks[name].append(report)
                tasks[name].notify_complete(report.checkpoint_id)

            async def decline(checkpoint_id: int, reason: DeclineReason, message: str) -> None:
                self.declines.append((checkpoint_id, reason, message))

            return Subtask(
                job_id="job",
                vertex_id=name,
                subtask_index=0,
                parallelism=1,
                max_parallelism=128,
                attempt=1,
                operators=operators,
                key_fields=(),
                mode=mode,
                restore=RestoreData(),
                ack=ack,
                decline=decline,
                source_batch_records=4096,
                task_thread=True,
                **kw,
            )

        tasks: dict[str, Subtask] = {}
        tasks["source"] = task(
            "source",
            [SequenceSource(0, total, batch_size=4096)],
            gate=None,
            outputs=[OutputEdge(ForwardPartitioner(), [self.channel.output])],
        )
        tasks["sink"] = task(
            "sink", [self.sink_op], gate=InputGate([self.channel.input]), outputs=[]
        )
        self.source, self.sink = tasks["source"], tasks["sink"]
        for t in tasks.values():
            t.open()

    def options(self, **kw: Any) -> BarrierOptions:
        return BarrierOptions(target_location=str(self.tmp), **kw)

    async def stuck(self) -> list[asyncio.Task[None]]:
        """Both tasks running, the sink stuck in its first batch, the channel full."""
        runners = [asyncio.create_task(t.run()) for t in (self.source, self.sink)]
        await wait_until_async(self.entered.is_set, timeout_s=WAIT_S, what="sink entered")
        await wait_until_async(
            lambda: self.channel.output.queued_data > 0, timeout_s=WAIT_S, what="backpressure"
        )
        return runners

    async def stop(self, runners: list[asyncio.Task[None]]) -> None:
        self.release.set()
        for r in runners:
            r.cancel()
        await asyncio.gather(*runners, return_exceptions=True)


def test_a_source_injects_and_acks_while_the_sink_in_its_agent_is_stuck(tmp_path: Path) -> None:
    async def main() -> None:
        pair = Pair(tmp_path, CheckpointMode.ALIGNED)
        runners = await pair.stuck()
        try:
            pair.source.trigger(1, int(time.time() * 1000), pair.options())
            await wait_until_async(
                lambda: pair.acks["source"], timeout_s=WAIT_S, what="the source's ack"
            )
            assert not pair.release.is_set() and pair.sink_op.rows == 0  # still stuck
            # aligned: the barrier waits behind the data in the channel
            assert any(isinstance(f, BarrierFrame) for f in pair.channel.output.queued) or any(
                isinstance(f, BarrierFrame) for f in pair.channel.input.queue
            )
            assert pair.acks["sink"] == []
            pair.release.set()
            await wait_until_async(
                lambda: pair.acks["sink"], timeout_s=WAIT_S, what="the sink's ack"
            )
            assert not pair.acks["sink"][0].unaligned
        finally:
            await pair.stop(runners)

    run(main())


def test_an_unaligned_barrier_overtakes_both_queues_while_the_consumer_is_stuck(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        pair = Pair(tmp_path, CheckpointMode.UNALIGNED)
        runners = await pair.stuck()
        try:
            queued_before = pair.channel.output.queued_data
            pair.source.trigger(
                1, int(time.time() * 1000), pair.options(mode=CheckpointMode.UNALIGNED)
            )
            await wait_until_async(
                lambda: pair.channel.input.priority_pending,
                timeout_s=WAIT_S,
                what="the barrier at the head of the sink's input",
            )
            [source_ack] = await wait_until_async(
                lambda: pair.acks["source"], timeout_s=WAIT_S, what="the source's ack"
            )
            assert source_ack.unaligned and source_ack.persisted_in_flight_bytes > 0
            assert queued_before > 0
            assert pair.sink_op.rows == 0  # overtaken while the consumer was stuck
            pair.release.set()
            [sink_ack] = await wait_until_async(
                lambda: pair.acks["sink"], timeout_s=WAIT_S, what="the sink's ack"
            )
            # the data buffered in the sink's input channel was overtaken: its channel state
            assert sink_ack.unaligned and sink_ack.persisted_in_flight_bytes > 0
        finally:
            await pair.stop(runners)

    run(main())


def test_aligned_with_timeout_converts_the_barrier_queued_in_an_output_channel(
    tmp_path: Path,
) -> None:
    """The sink is stuck, so the source's aligned barrier stays queued in its output channel;
    when the timeout passes it becomes unaligned, overtakes the queue (output channel state)
    and reaches the sink's input at once."""

    async def main() -> None:
        pair = Pair(tmp_path, CheckpointMode.ALIGNED)
        runners = await pair.stuck()
        try:
            options = pair.options(aligned_checkpoint_timeout_ms=50)
            pair.source.trigger(1, int(time.time() * 1000), options)
            [source_ack] = await wait_until_async(
                lambda: pair.acks["source"], timeout_s=WAIT_S, what="the source's ack"
            )
            assert source_ack.unaligned, "the queued barrier was not converted"
            assert source_ack.persisted_in_flight_bytes > 0
            assert pair.channel.input.priority_pending  # ahead of everything at the sink
            pair.release.set()
            [sink_ack] = await wait_until_async(
                lambda: pair.acks["sink"], timeout_s=WAIT_S, what="the sink's ack"
            )
            assert sink_ack.unaligned
        finally:
            await pair.stop(runners)

    run(main())


def test_the_input_side_timeout_fires_under_a_steady_stream_of_data(tmp_path: Path) -> None:
    """Channel 0 delivered its barrier, channel 1 never does but keeps sending data: the gate
    always has data to deliver, and the checkpoint still switches to unaligned at the timeout."""

    async def main() -> None:
        h = harness([Operator()], num_inputs=2, output_credits=1_000, output_queue=1_000)
        running = asyncio.create_task(h.task.run())
        options = BarrierOptions(target_location=str(tmp_path), aligned_checkpoint_timeout_ms=50)
        await h.inputs[0].output.send(BarrierFrame(1, int(time.time() * 1000), options))
        out = InputGate([h.output.input])
        forwarded: BarrierFrame | None = None
        sent = 0
        deadline = time.monotonic() + WAIT_S
        while forwarded is None and time.monotonic() < deadline:
            await h.inputs[1].output.send(DataFrame(batch(sent)))
            sent += 1
            while (item := out.poll()) is not None:
                if isinstance(item[1], BarrierFrame):
                    forwarded = item[1]
            await asyncio.sleep(0.001)
        assert forwarded is not None, "the barrier was never forwarded"
        assert forwarded.options.mode is CheckpointMode.UNALIGNED
        assert sent > 10  # data kept flowing on channel 1 all along
        await h.inputs[1].output.send(BarrierFrame(1, 0, options))
        for channel in h.inputs:
            await channel.output.close()
        await wait_until_async(lambda: h.acks, timeout_s=WAIT_S, what="the ack")
        assert h.acks[0].unaligned
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    run(main())

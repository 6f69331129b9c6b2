"""Aligned with a timeout on the input side: an aligned barrier that is still queued behind
data in an input channel when its timeout passes becomes unaligned and overtakes that data
(Flink's announced barriers, ``convertToPriorityEvent``). The data it overtook is the
checkpoint's input channel state and is still processed after the snapshot; what came behind
the barrier waits until the task took it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.checkpointing import BarrierOptions, CheckpointMode
from snapflow.worker.runtime.frames import BarrierFrame, DataFrame, Frame, WatermarkFrame
from snapflow.worker.runtime.input_channel import InputChannel
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport, now_ms
from snapflow.worker.runtime.task_state import RestoreData

TIMEOUT = BarrierOptions(mode=CheckpointMode.ALIGNED, aligned_checkpoint_timeout_ms=50)


def _data(*keys: int) -> DataFrame:
    return DataFrame(batch(*keys))


def _keys(frames: list[Any]) -> list[int]:
    return [k for f in frames if isinstance(f, DataFrame) for k in f.batch.column(0).to_pylist()]


def _drain(gate: InputGate) -> list[tuple[int, Frame]]:
    out = []
    while (item := gate.poll()) is not None:
        out.append(item)
    return out


def test_gate_converts_a_timed_out_barrier_queued_behind_data() -> None:
    ch0, ch1 = InputChannel(4, name="in0"), InputChannel(4, name="in1")
    gate = InputGate([ch0, ch1])
    for ch in (ch0, ch1):
        ch.connect(lambda n: None)
    ch0.receive(_data(1))
    ch0.receive(WatermarkFrame(5))
    ch0.receive(_data(2))
    ch0.receive(BarrierFrame(7, 1_000, TIMEOUT))
    ch0.receive(_data(3))
    ch1.receive(BarrierFrame(7, 1_000, TIMEOUT))  # at the head: it is next anyway
    ch1.receive(_data(4))
    assert gate.barrier_deadline_ms() == 1_050
    assert gate.convert_timed_out_barriers(1_049) == 0
    assert not ch0.priority_pending
    assert gate.convert_timed_out_barriers(1_050) == 1
    assert ch0.priority_pending and not ch1.priority_pending
    assert gate.barrier_deadline_ms() == 1_050  # channel 1's, which stays in place
    item = gate.poll()
    assert item is not None
    index, frame = item
    assert index == 0 and isinstance(frame, BarrierFrame)
    assert frame.options.mode is CheckpointMode.UNALIGNED
    assert frame.options.aligned_checkpoint_timeout_ms == 50
    assert (frame.checkpoint_id, frame.timestamp_ms) == (7, 1_000)
    # what it overtook, in order; data 3 came behind it and is not state
    assert _keys(gate.persist_queued(0)) == [1, 2]
    # a frame received while the converted barrier is pending is held behind it
    ch0.receive(_data(5))
    rest = _drain(gate)
    on0 = [f for i, f in rest if i == 0]
    assert _keys(on0) == [1, 2, 3, 5]
    assert [type(f).__name__ for f in on0] == [
        "DataFrame", "WatermarkFrame", "DataFrame", "DataFrame", "DataFrame"
    ]  # fmt: skip
    on1 = [f for i, f in rest if i == 1]
    assert isinstance(on1[0], BarrierFrame) and on1[0].options == TIMEOUT
    assert _keys(on1) == [4]
    assert gate.barrier_deadline_ms() is None


def test_gate_leaves_blocked_channels_and_plain_aligned_barriers() -> None:
    ch0, ch1 = InputChannel(4, name="in0"), InputChannel(4, name="in1")
    gate = InputGate([ch0, ch1])
    for ch in (ch0, ch1):
        ch.connect(lambda n: None)
    ch0.receive(_data(1))
    ch0.receive(BarrierFrame(8, 1_000, TIMEOUT))  # behind the barrier 7 the task took
    ch1.receive(_data(2))
    ch1.receive(BarrierFrame(7, 1_000, BarrierOptions()))  # aligned, no timeout
    gate.block(0)
    assert gate.barrier_deadline_ms() is None
    assert gate.convert_timed_out_barriers(10**12) == 0
    gate.unblock(0)
    assert gate.barrier_deadline_ms() == 1_050
    assert gate.convert_timed_out_barriers(10**12) == 1
    assert ch0.priority_pending and not ch1.priority_pending


class Recorder(Operator):
    """Passes batches through."""

    def process_batch(self, b: Any) -> list[Any]:
        return [b]


def test_subtask_snapshots_before_the_data_a_timed_out_barrier_overtook(tmp_path: Path) -> None:
    """Both inputs queue data ahead of an aligned barrier whose timeout has passed: the task
    takes an unaligned snapshot before processing any of it, with exactly that data as input
    channel state; everything is still processed once, and a restore replays exactly the
    overtaken data."""
    options = BarrierOptions(
        mode=CheckpointMode.ALIGNED, aligned_checkpoint_timeout_ms=50, target_location=str(tmp_path)
    )
    taken: dict[str, Any] = {}

    async def snapshot() -> None:
        h = harness([Recorder()])
        stamp = now_ms() - 1_000  # the timeout passed before the task saw any of it
        for keys, ch in (((1, 2, 3), h.inputs[0]), ((5,), h.inputs[1])):
            for k in keys:
                await ch.output.send(_data(k))
            await ch.output.send(BarrierFrame(1, stamp, options))
        await h.inputs[0].output.send(_data(4))
        await h.inputs[1].output.send(_data(6))
        for ch in h.inputs:
            await ch.output.close()
        frames, _ = await asyncio.gather(h.outputs(), h.task.run())
        taken["out"] = frames
        taken["acks"] = h.acks

    run(snapshot())
    [report] = taken["acks"]
    assert isinstance(report, SnapshotReport) and report.unaligned
    assert report.persisted_in_flight_bytes > 0
    out = taken["out"]
    barrier_at = next(i for i, f in enumerate(out) if isinstance(f, BarrierFrame))
    assert _keys(out[:barrier_at]) == []  # nothing processed before the snapshot
    assert sorted(_keys(out)) == [1, 2, 3, 4, 5, 6]

    async def restore() -> None:
        by_op = {op_id: {0: hs} for op_id, hs in report.operator_states}
        data = RestoreData(checkpoint_id=1, previous_parallelism=1, handles=by_op)
        h = harness([Recorder()], restore=data)
        for ch in h.inputs:
            await ch.output.close()
        frames, _ = await asyncio.gather(h.outputs(), h.task.run())
        taken["replayed"] = _keys(frames)

    run(restore())
    assert sorted(taken["replayed"]) == [1, 2, 3, 5]

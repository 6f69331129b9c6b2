"""A subtask's snapshot files on S3 (moto's server): state and channel state of one checkpoint
merged into one object written with one PUT, and replayed from its byte ranges on restore."""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
from kit.channels import run
from kit.subtasks import batch, harness

from snapflow.checkpointing import BarrierOptions, CheckpointMode
from snapflow.filestore_registry import store_for
from snapflow.worker.runtime.frames import BarrierFrame, DataFrame
from snapflow.worker.runtime.operator import Operator, OperatorContext
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport
from snapflow.worker.runtime.task_state import RestoreData


class Remember(Operator):
    """Keeps one operator list state (so the snapshot has a state file besides channel state)."""

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._seen = ctx.operator_state.get_list_state("seen")

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        self._seen.add(batch.num_rows)
        return [batch]


def keys(frames: list[Any]) -> list[int]:
    return [k for f in frames if isinstance(f, DataFrame) for k in f.batch.column(0).to_pylist()]


def test_unaligned_snapshot_on_s3_is_one_put_and_replays_its_channel_state(
    s3_bucket: str,
) -> None:
    location = f"s3://{s3_bucket}/checkpoints/job/chk-1"
    options = BarrierOptions(mode=CheckpointMode.UNALIGNED, target_location=location)
    requests = store_for(location).requests
    taken: dict[str, Any] = {}

    async def snapshot() -> None:
        h = harness([Remember()], output_credits=1)  # one credit: output queues up
        before = requests.snapshot()
        running = asyncio.create_task(h.task.run())
        for i in range(3):  # processed before the barrier, queued on the output: output state
            await h.inputs[1].output.send(DataFrame(batch(100 + i)))
        async with asyncio.timeout(5):
            while h.task.records_in < 3:
                await asyncio.sleep(0.005)
        for i in range(3):  # overtaken by the barrier on channel 0: input state
            await h.inputs[0].output.send(DataFrame(batch(i)))
        h.inputs[0].output.send_priority(BarrierFrame(1, 1_000, options))
        h.inputs[1].output.send_priority(BarrierFrame(1, 1_000, options))
        for channel in h.inputs:
            await channel.output.close()
        frames, _ = await asyncio.gather(h.outputs(), running)
        after = requests.snapshot()
        taken["delta"] = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        assert h.declines == []
        [report] = h.acks
        taken["report"] = report
        taken["out"] = keys(frames)

    run(snapshot())
    report: SnapshotReport = taken["report"]
    assert report.unaligned and report.persisted_in_flight_bytes > 0
    # operator state plus input and output channel state: one object, one PUT, no HEAD or LIST
    assert taken["delta"] == {"put": 1}
    handles = [h for _, hs in report.operator_states for h in hs]
    kinds = sorted(h.kind for h in handles)
    assert kinds == ["channel_input", "channel_output", "operator"]
    assert taken["out"] == [100, 101, 102, 0, 1, 2]
    (path,) = {h.path for h in handles}
    assert path.startswith(f"{location}/v-0-1/chk1-") and path.endswith(".merged")
    ranges = sorted((h.offset, h.size_bytes) for h in handles)
    assert sum(n for _, n in ranges) == store_for(path).size(path)

    # Restore: output state goes downstream first, then input state through the chain, then
    # new input.
    async def restore() -> None:
        by_op = {op_id: {0: hs} for op_id, hs in report.operator_states}
        restore = RestoreData(checkpoint_id=1, previous_parallelism=1, handles=by_op)
        h = harness([Remember()], output_credits=1, restore=restore)
        await h.inputs[0].output.send(DataFrame(batch(7)))
        for channel in h.inputs:
            await channel.output.close()
        frames, _ = await asyncio.gather(h.outputs(), h.task.run())
        out = keys(frames)
        # 100 was delivered (one credit); 101 and 102 were overtaken in the output, 0..2 on
        # the input: replayed in that order, before the new input 7
        assert out == [101, 102, 0, 1, 2, 7]

    run(restore())

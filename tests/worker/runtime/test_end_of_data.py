"""End of input in Flink's order (FLIP-147): what an operator emits in ``end_input`` goes
downstream before end of data, and the final checkpoint's barrier follows both on every
channel, so two-phase-commit sinks commit it. Subtask-level frame orders first (in-process
channels, every frame queued before the task runs), then a bounded job on two in-process
agents with a running coordinator."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow as pa
import pytest
from kit.channels import run
from kit.coordinator import running_coordinator
from kit.subtasks import batch, harness
from kit.workers import expected_counts, op_spec, run_agents

from snapflow.checkpointing import BarrierOptions, CheckpointKind, CheckpointMode, DeclineReason
from snapflow.event_time import MAX_WATERMARK
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.channel_errors import ChannelFailedError
from snapflow.worker.runtime.frames import (
    BarrierFrame,
    CancelMarkerFrame,
    DataFrame,
    EndOfDataFrame,
    EndOfPartitionFrame,
    Frame,
    WatermarkFrame,
)
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.operator import Operator, OperatorContext, SourceOperator
from snapflow.worker.runtime.partitioners import ForwardPartitioner
from snapflow.worker.runtime.subtask_checkpoints import SnapshotReport
from snapflow.worker.runtime.task import Subtask
from snapflow.worker.runtime.task_lifecycle import TaskFailedError
from snapflow.worker.runtime.task_output import OutputEdge
from snapflow.worker.runtime.task_state import RestoreData


class CountAtEnd(Operator):
    """Forwards its input; ``end_input`` emits the number of rows it saw (kept in operator
    state, so that a restore knows it)."""

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._seen = ctx.operator_state.get_list_state("seen")
        self.rows = sum(self._seen.get())

    def process_batch(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        self.rows += batch.num_rows
        return [batch]

    def snapshot_state(self, checkpoint_id: int) -> None:
        self._seen.update([self.rows])

    def end_input(self) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pydict({"rows": [self.rows]})]


class TwoInputCountAtEnd(CountAtEnd):
    """``CountAtEnd`` over two inputs; remembers which inputs ended, in order."""

    def __init__(self) -> None:
        self.ended: list[int] = []

    def process_input(self, input_index: int, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return self.process_batch(batch)

    def end_of_input(self, input_index: int) -> list[pa.RecordBatch]:
        self.ended.append(input_index)
        return []


def rows(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"rows": [n]})


def test_end_input_output_and_end_of_data_precede_the_final_barrier(tmp_path: Path) -> None:
    """A task ends its input when end of data arrived on every input channel: its end_input
    output, then end of data, then the final barrier, then (once it completed) end of
    partition."""

    async def main() -> None:
        h = harness([CountAtEnd()])
        options = BarrierOptions(target_location=str(tmp_path))
        await h.inputs[0].output.send(DataFrame(batch(1, 2, 3)))
        await h.inputs[1].output.send(DataFrame(batch(4)))
        for channel in h.inputs:  # what an ended source sends
            await channel.output.send(WatermarkFrame(MAX_WATERMARK))
            await channel.output.send(EndOfDataFrame())
            await channel.output.send(BarrierFrame(1, 1_000, options))
            await channel.output.close()
        await h.task.run()

        assert await h.outputs() == [
            DataFrame(batch(1, 2, 3)),
            DataFrame(batch(4)),
            WatermarkFrame(MAX_WATERMARK),
            DataFrame(rows(4)),
            EndOfDataFrame(),
            BarrierFrame(1, 1_000, options),
            EndOfPartitionFrame(),
        ]
        [report] = h.acks
        assert report.checkpoint_id == 1 and h.declines == []

    run(main())


def test_end_of_data_on_some_inputs_only_does_not_end_the_input(tmp_path: Path) -> None:
    """End of partition without end of data (a stop-with-savepoint without drain) does not
    run end_input: its output would follow the last checkpoint."""

    async def main() -> None:
        h = harness([CountAtEnd()])
        await h.inputs[0].output.send(DataFrame(batch(1)))
        await h.inputs[0].output.send(EndOfDataFrame())
        for channel in h.inputs:
            await channel.output.close()
        await h.task.run()

        assert await h.outputs() == [
            DataFrame(batch(1)),
            WatermarkFrame(MAX_WATERMARK),
            EndOfPartitionFrame(),
        ]

    run(main())


def test_two_inputs_align_on_one_handler_and_end_input_runs_once_both_ended(
    tmp_path: Path,
) -> None:
    """A task with two logical inputs (one channel each): the barrier of input 0 blocks only
    that channel while input 1 keeps flowing; the snapshot follows once input 1's barrier
    came; end_input runs once, after end of data on both inputs."""

    async def main() -> None:
        op = TwoInputCountAtEnd()
        h = harness([op], input_of=[0, 1])
        options = BarrierOptions(target_location=str(tmp_path))
        first, second = h.inputs
        await first.output.send(BarrierFrame(1, 1_000, options))
        await first.output.send(DataFrame(batch(1)))  # behind the barrier: after the snapshot
        await first.output.send(EndOfDataFrame())
        await second.output.send(DataFrame(batch(2, 3)))  # flows while input 0 is blocked
        await second.output.send(BarrierFrame(1, 1_000, options))
        await second.output.send(EndOfDataFrame())
        for channel in h.inputs:
            await channel.output.close()
        await h.task.run()

        assert await h.outputs() == [
            DataFrame(batch(2, 3)),
            BarrierFrame(1, 1_000, options),
            DataFrame(batch(1)),
            DataFrame(rows(3)),
            EndOfDataFrame(),
            WatermarkFrame(MAX_WATERMARK),  # both inputs' channels ended
            EndOfPartitionFrame(),
        ]
        [report] = h.acks
        assert report.checkpoint_id == 1 and report.records_in == 2
        assert op.ended == [1, 0]  # each input's end, in the order they came

    run(main())


def test_a_restore_from_a_snapshot_after_end_input_does_not_run_it_again(tmp_path: Path) -> None:
    """The snapshot records that end_input ran; restored from it, the task forwards end of
    data without emitting its end_input output a second time (it is downstream already, and
    committed with the checkpoint)."""

    async def main() -> None:
        options = BarrierOptions(target_location=str(tmp_path))
        first = harness([CountAtEnd()], num_inputs=1)
        await first.inputs[0].output.send(DataFrame(batch(1, 2)))
        await first.inputs[0].output.send(EndOfDataFrame())
        await first.inputs[0].output.send(BarrierFrame(1, 1_000, options))
        await first.inputs[0].output.close()
        await first.task.run()
        assert await first.outputs() == [
            DataFrame(batch(1, 2)),
            DataFrame(rows(2)),
            EndOfDataFrame(),
            BarrierFrame(1, 1_000, options),
            WatermarkFrame(MAX_WATERMARK),
            EndOfPartitionFrame(),
        ]
        [report] = first.acks

        restore = RestoreData(
            checkpoint_id=1,
            previous_parallelism=1,
            handles={op_id: {0: handles} for op_id, handles in report.operator_states},
        )
        again = harness([CountAtEnd()], num_inputs=1, restore=restore)
        await again.inputs[0].output.send(EndOfDataFrame())
        await again.inputs[0].output.send(BarrierFrame(2, 2_000, options))
        await again.inputs[0].output.close()
        await again.task.run()
        assert await again.outputs() == [
            EndOfDataFrame(),
            BarrierFrame(2, 2_000, options),
            WatermarkFrame(MAX_WATERMARK),
            EndOfPartitionFrame(),
        ]
        # ... and checkpoint 2 records the end again, for a restore from it
        [report2] = again.acks
        assert any(h.kind == "union" for _, hs in report2.operator_states for h in hs)

    run(main())


class Batches(SourceOperator):
    """A source of the given batches; ``endless``: then empty polls forever."""

    def __init__(self, *batches: pa.RecordBatch, endless: bool = False) -> None:
        self.batches = list(batches)
        self.endless = endless

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        if self.batches:
            return self.batches.pop(0)
        return (
            pa.RecordBatch.from_pydict({"key": pa.array([], pa.int64())}) if self.endless else None
        )


class SourceRun:
    """A source subtask (the source, then ``CountAtEnd`` chained) with one output channel whose
    frames ``read`` records; ``on_frame(run)`` reacts to each one (to trigger checkpoints).
    Each ack completes its checkpoint (final once the source had ended, as the coordinator
    marks it), or aborts it with ``abort``."""

    def __init__(
        self,
        source: SourceOperator,
        tmp_path: Path,
        on_frame: Callable[[SourceRun], None],
        *,
        abort: bool = False,
        report_data_ended: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.on_frame = on_frame
        self.abort = abort
        self.output = LocalChannel(16, output_queue=64, name="out")
        self.frames: list[Frame] = []
        self.acks: list[SnapshotReport] = []
        self.declines: list[tuple[int, DeclineReason, str]] = []
        self.options = BarrierOptions(target_location=str(tmp_path))
        self.task = Subtask(
            job_id="job",
            vertex_id="s",
            subtask_index=0,
            parallelism=1,
            max_parallelism=128,
            attempt=1,
            operators=[source, CountAtEnd()],
            key_fields=(),
            gate=None,
            outputs=[OutputEdge(ForwardPartitioner(), [self.output.output])],
            mode=CheckpointMode.ALIGNED,
            restore=RestoreData(),
            ack=self._ack,
            decline=self._decline,
            report_data_ended=report_data_ended,
        )
        self.task.open()

    async def _ack(self, report: SnapshotReport) -> None:
        self.acks.append(report)
        if self.abort:
            self.task.notify_aborted(report.checkpoint_id)
        else:
            self.task.notify_complete(report.checkpoint_id, final=report.input_ended)

    async def _decline(self, checkpoint_id: int, reason: DeclineReason, message: str) -> None:
        self.declines.append((checkpoint_id, reason, message))

    async def read(self) -> None:
        gate = InputGate([self.output.input])
        while (item := await gate.next()) is not None:
            self.frames.append(item[1])
            self.on_frame(self)


def test_a_source_sends_end_input_output_end_of_data_then_the_final_barrier(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        def on_frame(r: SourceRun) -> None:
            if r.frames[-1] == EndOfDataFrame():
                r.task.trigger(1, 1_000, r.options)  # the checkpoint after every source ended

        r = SourceRun(Batches(batch(1, 2), batch(3)), tmp_path, on_frame)
        await asyncio.gather(r.task.run(), r.read())

        assert r.frames == [
            DataFrame(batch(1, 2)),
            DataFrame(batch(3)),
            DataFrame(rows(3)),
            WatermarkFrame(MAX_WATERMARK),
            EndOfDataFrame(),
            BarrierFrame(1, 1_000, r.options),
            EndOfPartitionFrame(),
        ]
        [report] = r.acks
        assert report.input_ended is True

    run(main())


def test_a_trigger_that_arrives_while_the_end_of_data_goes_out_is_declined_and_cancelled_downstream(
    tmp_path: Path,
) -> None:
    """The coordinator sent checkpoint 7 before it knew that this source ended: the source
    declines it (``TASK_NOT_READY``) and sends a cancel marker downstream, where a task that
    got barrier 7 from the other sources would otherwise stay blocked aligning it (and never
    end its input, so the coordinator's hold for the end of data would never release). The
    final checkpoint 8 that follows is taken."""

    async def main() -> None:
        r: SourceRun

        async def report() -> None:
            r.task.trigger(7, 7_000, r.options)  # arrives while the end of data goes out

        def on_frame(run: SourceRun) -> None:
            if run.frames[-1] == EndOfDataFrame():
                run.task.trigger(8, 8_000, run.options)  # the final checkpoint

        r = SourceRun(Batches(batch(1, 2)), tmp_path, on_frame, report_data_ended=report)
        await asyncio.gather(r.task.run(), r.read())

        assert [(cid, reason) for cid, reason, _ in r.declines] == [
            (7, DeclineReason.TASK_NOT_READY)
        ]
        # the marker is a priority frame: it may overtake what is still queued
        assert r.frames.index(CancelMarkerFrame(7)) < r.frames.index(EndOfDataFrame())
        assert [f for f in r.frames if f != CancelMarkerFrame(7)] == [
            DataFrame(batch(1, 2)),
            DataFrame(rows(2)),
            WatermarkFrame(MAX_WATERMARK),
            EndOfDataFrame(),
            BarrierFrame(8, 8_000, r.options),
            EndOfPartitionFrame(),
        ]
        assert [a.checkpoint_id for a in r.acks] == [8]

    run(main())


def test_drain_sends_end_of_data_before_the_savepoint_barrier_and_fails_if_it_aborts(
    tmp_path: Path,
) -> None:
    """Stop-with-savepoint with drain: maximum watermark, end_input and end of data go ahead
    of the savepoint's barrier (it covers their output). If the savepoint is then aborted the
    job cannot go on (the tasks downstream ended their input): the source task fails, and the
    job restarts from its latest checkpoint."""

    async def main() -> None:
        drain = BarrierOptions(
            kind=CheckpointKind.SAVEPOINT_TERMINATE, target_location=str(tmp_path)
        )

        def on_frame(r: SourceRun) -> None:
            if r.frames == [DataFrame(batch(1, 2))]:
                r.task.trigger(5, 5_000, drain)  # once the first batch went downstream

        r = SourceRun(Batches(batch(1, 2), endless=True), tmp_path, on_frame, abort=True)
        reader = asyncio.ensure_future(r.read())
        with pytest.raises(TaskFailedError, match="drain failed after end of data"):
            await r.task.run()
        r.output.output.abort("task failed")
        with pytest.raises(ChannelFailedError):
            await reader
        assert r.frames == [
            DataFrame(batch(1, 2)),
            DataFrame(rows(2)),
            WatermarkFrame(MAX_WATERMARK),
            EndOfDataFrame(),
            BarrierFrame(5, 5_000, drain),
        ]

    run(main())


RECORDS = 50_000
KEYS = 200


def final_count_graph(
    out: str, sink_vertex: bool, source: GeneratorSource | None = None
) -> pb.JobGraph:
    """source -> hash(key) -> [count(final) -> sink], or with the sink a vertex of its own
    behind a second hash edge (end of data then crosses both agents twice)."""
    source = source or GeneratorSource(
        total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=5
    )
    count = op_spec("count", KeyedCount("key", output="final"))
    sink = op_spec("sink", TransactionalFileSink(out))

    def vertex(vertex_id: str, *ops: pb.OperatorSpec, is_source: bool = False) -> pb.JobVertex:
        return pb.JobVertex(
            vertex_id=vertex_id,
            name=vertex_id,
            parallelism=2,
            max_parallelism=128,
            is_source=is_source,
            operators=list(ops),
        )

    def hash_edge(source_id: str, target_id: str) -> pb.JobEdge:
        return pb.JobEdge(
            source_vertex_id=source_id,
            target_vertex_id=target_id,
            partitioner=pb.PARTITIONER_KIND_HASH,
            key_field="key",
        )

    vertices = [vertex("source", op_spec("source", source), is_source=True)]
    if sink_vertex:
        vertices += [vertex("count", count), vertex("sink", sink)]
        edges = [hash_edge("source", "count"), hash_edge("count", "sink")]
    else:
        vertices.append(vertex("count", count, sink))
        edges = [hash_edge("source", "count")]
    return pb.JobGraph(name="final-count", vertices=vertices, edges=edges)


@pytest.mark.parametrize("sink_vertex", [False, True], ids=["chained-sink", "sink-vertex"])
@pytest.mark.parametrize(
    "mode", [pb.CHECKPOINT_MODE_ALIGNED, pb.CHECKPOINT_MODE_UNALIGNED], ids=["aligned", "unaligned"]
)
def test_bounded_job_commits_exactly_the_final_counts(
    redis_url: str, tmp_path: Path, sink_vertex: bool, mode: pb.CheckpointMode
) -> None:
    """count(output="final") emits only in end_input: every key's total reaches the
    transactional sink before the final checkpoint's barrier, and is committed once."""
    out = tmp_path / "out"
    graph = final_count_graph(str(out), sink_vertex)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            config = pb.CheckpointConfig(interval_ms=50, mode=mode)
            request = cpb.SubmitJobRequest(graph=graph, checkpoint_config=config)
            job = (await c.stub.SubmitJob(request, timeout=10)).job
            await run_agents(c.address, job.job_id, source_batch_records=4096)
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job.job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            # Every task told the coordinator when its data ended (it holds the final
            # checkpoint until then: tests/coordinator/test_final_checkpoint_after_end_of_data.py).
            tasks = await c.stub.ListTasks(cpb.ListTasksRequest(job_id=job.job_id), timeout=5)
            assert len(tasks.tasks) == (6 if sink_vertex else 4)
            assert all(t.data_ended for t in tasks.tasks), tasks

    asyncio.run(main())
    table = read_committed(out)
    committed = Counter(
        dict(zip(table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True))
    )
    assert table.num_rows == len(committed), "a key was committed twice"
    source = GeneratorSource(total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=5)
    assert committed == expected_counts(source, 2)


def test_a_job_restored_from_its_final_checkpoint_commits_nothing_again(
    redis_url: str, tmp_path: Path
) -> None:
    """A failure after end of data, played by restoring the finished job from its final
    checkpoint: every task restores as ended, so no end_input runs a second time and the sink
    commits no second copy of the final counts (the restored pending transaction is
    re-committed idempotently)."""
    out = tmp_path / "out"
    graph = final_count_graph(str(out), sink_vertex=True)
    config = pb.CheckpointConfig(interval_ms=50)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            job = (
                await c.stub.SubmitJob(
                    cpb.SubmitJobRequest(graph=graph, checkpoint_config=config), timeout=10
                )
            ).job
            await run_agents(c.address, job.job_id, source_batch_records=4096)
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.job_id), timeout=5
            )
            final = stats.latest_completed.external_path
            request = cpb.SubmitJobRequest(
                graph=graph,
                checkpoint_config=config,
                restore=cpb.RestoreSettings(savepoint_path=final),
            )
            again = (await c.stub.SubmitJob(request, timeout=10)).job
            await run_agents(c.address, again.job_id, source_batch_records=4096)
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=again.job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED

    asyncio.run(main())
    table = read_committed(out)
    source = GeneratorSource(total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=5)
    assert table.num_rows == KEYS
    assert dict(
        zip(table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True)
    ) == expected_counts(source, 2)


class SecondSubtaskStartsLate(GeneratorSource):
    """Subtask 1 emits its first batch half a second late, so the other source has long ended
    (and asked for the final checkpoint) while it still has all its input ahead."""

    def open(self, ctx: OperatorContext) -> None:
        super().open(ctx)
        self._late = ctx.subtask_index == 1

    def poll_batch(self, max_records: int) -> pa.RecordBatch | None:
        if self._late:
            self._late = False
            time.sleep(0.5)  # on the subtask's task thread: the agents go on meanwhile
        return super().poll_batch(max_records)


def test_a_job_without_periodic_checkpoints_ends_with_one_final_checkpoint(
    redis_url: str, tmp_path: Path
) -> None:
    """Without periodic checkpoints each source asks for a checkpoint when its input ends (as
    the Spark bridge's agents do); the coordinator holds the requests until every source asked,
    so the job ends with exactly one checkpoint, the final one, and its sink commits once. (A
    source that ended first used to get a checkpoint of its own: two at the end of this job.)"""
    out = tmp_path / "out"
    source = SecondSubtaskStartsLate(total_records=RECORDS, num_keys=KEYS, batch_size=4096, seed=5)
    graph = final_count_graph(str(out), sink_vertex=False, source=source)

    async def main() -> None:
        async with running_coordinator(redis_url, str(tmp_path / "cp")) as c:
            config = pb.CheckpointConfig(interval_ms=0)
            request = cpb.SubmitJobRequest(graph=graph, checkpoint_config=config)
            job = (await c.stub.SubmitJob(request, timeout=10)).job
            await run_agents(
                c.address,
                job.job_id,
                source_batch_records=4096,
            )
            info = await c.stub.GetJob(cpb.GetJobRequest(job_id=job.job_id), timeout=5)
            assert info.state == pb.JOB_STATE_FINISHED
            stats = await c.stub.GetCheckpointStats(
                cpb.GetCheckpointStatsRequest(job_id=job.job_id), timeout=5
            )
            assert (stats.counts.completed, stats.counts.failed) == (1, 0)

    asyncio.run(main())
    table = read_committed(out)
    assert table.num_rows == KEYS
    assert dict(
        zip(table.column("key").to_pylist(), table.column("count").to_pylist(), strict=True)
    ) == expected_counts(source, 2)

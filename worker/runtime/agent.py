"""The worker agent: hosts subtasks of one job deployment (Flink's TaskManager, slimmed).

An agent is a process (``snapflow worker``) or an object embedded in another process (the Spark
bridge embeds one per Spark task). It serves ``WorkerControlService`` (triggers for its
sources, completion and abort notices, cancel; ``agent_service.py``) and ``DataExchangeService``
(its subtasks' input channels), and talks to the coordinator: it registers its subtasks,
reports their states and acknowledges checkpoints (acks coalesced by ``AckBatcher``, one call
per checkpoint in the common case).

Placement is round-robin by subtask index: with ``num_slots`` agents, agent ``slot`` hosts
subtask ``i`` of every vertex where ``i % num_slots == slot``. With as many agents as the largest
parallelism (what the Spark bridge starts) an agent hosts at most one subtask of each vertex,
like one of Flink's shared slots; with fewer agents (``snapflow worker --slots N``) it hosts
several subtasks of one vertex, which a Flink slot never does. Deployment:

1. read the job graph (with the operators' pickled payloads) from the coordinator;
2. register every hosted subtask: the coordinator answers with the deployment's attempt
   number and what to restore from;
3. create the input channels (in-process ones for producers hosted here, registered gRPC
   channels for the others) and open the operators with their restored state;
4. wait until every subtask of the job registered in this deployment (the coordinator knows
   their agents' addresses), then connect the remote output channels;
5. report RUNNING and run all subtasks; a failure of any subtask is reported as FAILED and
   ends the agent (the driver redeploys the whole graph: Flink's full restart).

Meanwhile the agent sends heartbeats to the coordinator. If the coordinator is lost (the
heartbeats fail for the heartbeat timeout) or replaced (a newer epoch in an answer), the agent
cancels its subtasks and goes back to step 1 (docs/worker.md, "Heartbeats and
re-registration").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

import grpc
import structlog
from pyspark import cloudpickle

from snapflow import wire
from snapflow.access_control import server_interceptors
from snapflow.checkpointing import CheckpointMode, DeclineReason
from snapflow.errors import FailedPreconditionError, SnapflowError
from snapflow.jobgraph import PartitionerKind, TaskState
from snapflow.leader_channel import aio_leader_channel
from snapflow.request_parsing import add_servicer
from snapflow.security import PLAINTEXT, SecuritySettings
from snapflow.tls import add_port, aio_channel
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import coordinator_pb2_grpc as cgrpc
from snapflow.v1 import worker_pb2 as wpb
from snapflow.v1 import worker_pb2_grpc as wgrpc
from snapflow.worker.runtime.ack_batcher import AckBatcher
from snapflow.worker.runtime.agent_service import WorkerControlServicer
from snapflow.worker.runtime.dataplane_settings import DataplaneSettings
from snapflow.worker.runtime.exchange import (
    ChannelRefusedError,
    ChannelRegistry,
    DataExchangeServicer,
    exchange_grpc_options,
)
from snapflow.worker.runtime.input_channel import DEFAULT_BUFFERS_PER_CHANNEL, InputChannel
from snapflow.worker.runtime.input_gate import InputGate
from snapflow.worker.runtime.local_channel import LocalChannel
from snapflow.worker.runtime.operator import Operator
from snapflow.worker.runtime.output_channel import OutputChannel
from snapflow.worker.runtime.partitioners import (
    BroadcastPartitioner,
    ForwardPartitioner,
    KeyGroupPartitioner,
    Partitioner,
    RebalancePartitioner,
)
from snapflow.worker.runtime.placement import PlacementSettings
from snapflow.worker.runtime.remote_output_channel import RemoteOutputChannel
from snapflow.worker.runtime.source_loop import SOURCE_BATCH_RECORDS
from snapflow.worker.runtime.subtask_checkpoints import AckFn, DeclineFn, SnapshotReport
from snapflow.worker.runtime.task import Subtask
from snapflow.worker.runtime.task_output import OutputEdge
from snapflow.worker.runtime.task_state import RestoreData
from snapflow.worker.state.factory import StateBackendConfig

log = structlog.get_logger("snapflow.worker")

DEPLOY_TIMEOUT_S = 60.0
RECONNECT_TIMEOUT_S = 60.0
"""How long an agent that lost its coordinator tries to register its tasks again."""
HEARTBEAT_INTERVAL_S = 2.0
HEARTBEAT_TIMEOUT_S = 10.0
"""Until the first heartbeat answer brings the coordinator's settings (the same defaults)."""
_CONTROL_SERVICE = wpb.DESCRIPTOR.services_by_name["WorkerControlService"]
_EXCHANGE_SERVICE = wpb.DESCRIPTOR.services_by_name["DataExchangeService"]
RPC_TIMEOUT_S = 10.0
# The call waits while other sources still run (the coordinator holds it until all ended); a
# deadline only bounds how long one call waits before it is made again.
FINAL_CHECKPOINT_REQUEST_S = 600.0
DATA_ENDED_REPORT_TRIES = 3
"""How often a subtask's end of data is reported before giving up (the coordinator then
triggers its final checkpoint after its checkpoint timeout)."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_DEFAULT_DATAPLANE = DataplaneSettings()


@dataclass
class _Hosted:
    vertex: pb.JobVertex
    index: int
    attempt: pb.TaskAttempt
    restore: cpb.TaskRestore
    inputs: list[InputChannel] = field(default_factory=list)
    input_of: list[int] = field(default_factory=list)
    """The logical input (``JobEdge.target_input``) of each of ``inputs``."""
    task: Subtask | None = None
    runner: asyncio.Task[None] | None = None


def _kind(edge: pb.JobEdge) -> PartitionerKind:
    # The coordinator validated the graph; an unknown number here is a version mismatch.
    return wire.PARTITIONER_KIND.from_pb(edge.partitioner, field="edge.partitioner")


def _partitioner(edge: pb.JobEdge, target: pb.JobVertex, producer_index: int) -> Partitioner:
    n = target.parallelism
    match _kind(edge):
        case PartitionerKind.FORWARD:
            return ForwardPartitioner()
        case PartitionerKind.HASH:
            return KeyGroupPartitioner(edge.key_field, target.max_parallelism or 128, n)
        case PartitionerKind.BROADCAST:
            return BroadcastPartitioner(n)
        case PartitionerKind.REBALANCE:
            return RebalancePartitioner(n, start_channel=producer_index)
        case unknown:
            assert_never(unknown)


def _input_key_fields(graph: pb.JobGraph, vertex_id: str) -> tuple[str | None, ...]:
    """The key field of each logical input of ``vertex_id`` (None: the input is not keyed)."""
    fields: dict[int, str | None] = {}
    for e in graph.edges:
        if e.target_vertex_id == vertex_id:
            fields[e.target_input] = fields.get(e.target_input) or e.key_field or None
    return tuple(fields.get(i) for i in range(len(fields)))


def _producers(edge: pb.JobEdge, source: pb.JobVertex, consumer_index: int) -> list[int]:
    if _kind(edge) is PartitionerKind.FORWARD:
        return [consumer_index]
    return list(range(source.parallelism))


def _consumers(edge: pb.JobEdge, target: pb.JobVertex, producer_index: int) -> list[int]:
    if _kind(edge) is PartitionerKind.FORWARD:
        return [producer_index]
    return list(range(target.parallelism))


class Agent:
    """Hosts the subtasks of one slot of a job; ``await run()`` deploys and runs them."""

    def __init__(
        self,
        coordinator_address: str,
        job_id: str,
        *,
        slot: int = 0,
        num_slots: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        buffers_per_channel: int = DEFAULT_BUFFERS_PER_CHANNEL,
        source_batch_records: int = SOURCE_BATCH_RECORDS,
        security: SecuritySettings = PLAINTEXT,
        dataplane: DataplaneSettings = _DEFAULT_DATAPLANE,
        launch: int = 0,
    ) -> None:
        """A bounded job always ends with a final checkpoint that commits its sinks: in a job
        without periodic checkpoints a source whose input ended asks the coordinator for it
        (``TriggerCheckpoint``). ``security``: TLS, tokens and the access check of the agent's
        servers and its calls (``snapflow.security`` settings, ``snapflow.tls``,
        ``snapflow.access_control``); default plaintext.
        ``dataplane``: buffer debloating and the task thread (:class:`DataplaneSettings`).
        ``launch``: the Spark driver's stage submission this agent runs in (0: not launched by
        a driver); sent with every registration, so the coordinator refuses the agents of a
        stage it has replaced."""
        if not 0 <= slot < num_slots:
            raise ValueError(f"slot must be in 0..{num_slots - 1}, got {slot}")
        self.coordinator_address = coordinator_address
        self.launch = launch
        self.job_id = job_id
        self.slot = slot
        self.num_slots = num_slots
        self.host = host
        self.port = port
        self.buffers_per_channel = buffers_per_channel
        self.source_batch_records = source_batch_records
        self.security = security
        self.dataplane = dataplane
        self.address = ""
        self.epoch = 0
        self.heartbeat_interval_s = HEARTBEAT_INTERVAL_S
        self.heartbeat_timeout_s = HEARTBEAT_TIMEOUT_S
        self.deployments = 0
        """Deployments this agent took part in (more than 1 after a re-registration)."""
        self._redeploy = asyncio.Event()
        self._beat = asyncio.Event()
        self._redeploy_reason = ""
        self._last_contact = time.monotonic()
        self.registry = ChannelRegistry()
        self.hosted: dict[tuple[str, int], _Hosted] = {}
        self._server: grpc.aio.Server | None = None
        self._control: WorkerControlServicer | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: cgrpc.CoordinatorServiceAsyncStub | None = None
        self._batcher: AckBatcher | None = None
        self._peer_channels: dict[str, grpc.aio.Channel] = {}
        self._log = log.bind(job_id=job_id, slot=slot)
        self._state_backend: StateBackendConfig | None = None  # the deployed job's

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        options = exchange_grpc_options(MAX_MESSAGE_BYTES)
        self._server = grpc.aio.server(
            options=options, interceptors=server_interceptors(self.security)
        )
        # Undecodable requests are INVALID_ARGUMENT, as on the coordinator.
        self._control = WorkerControlServicer(self)
        add_servicer(self._server, _CONTROL_SERVICE, self._control)
        add_servicer(self._server, _EXCHANGE_SERVICE, DataExchangeServicer(self.registry))
        port = add_port(self._server, f"{self.host}:{self.port}", self.security)
        await self._server.start()
        self.address = f"{self.host}:{port}"
        # One address or several (highly available coordinators): calls find the leader.
        self._channel = aio_leader_channel(self.coordinator_address, self.security, options)
        self._stub = cgrpc.CoordinatorServiceStub(self._channel)
        self._batcher = AckBatcher(self._stub)

    async def stop(self) -> None:
        for hosted in self.hosted.values():
            if hosted.runner is not None and not hosted.runner.done():
                hosted.runner.cancel()
        await asyncio.sleep(0)  # a cancelled runner that had not started never will
        await self._discard_unstarted(self.hosted.values())
        if self._batcher is not None:
            await self._batcher.close()
        for channel in self._peer_channels.values():
            await channel.close(grace=None)
        if self._server is not None:
            if self._control is not None:
                self._control.calls.close()  # the coordinator's control stream ends at once
            await self._server.stop(0.5)
        if self._channel is not None:
            await self._channel.close(grace=None)

    @property
    def stub(self) -> cgrpc.CoordinatorServiceAsyncStub:
        assert self._stub is not None, "start() first"
        return self._stub

    async def run(self) -> None:
        """Deploy, run until every hosted subtask finished; raise if one failed.

        Heartbeats go to the coordinator meanwhile. When the coordinator is lost (heartbeats
        fail for the heartbeat timeout) or a new one answers (a newer epoch), the tasks are
        cancelled and registered again: the job restarts from its latest completed checkpoint.
        """
        heartbeats = asyncio.create_task(self._heartbeat_loop(), name="agent-heartbeats")
        finished = False
        try:
            while True:
                self._redeploy.clear()
                work = asyncio.create_task(
                    self._deploy_and_run(reconnect=self.deployments > 0), name="agent-work"
                )
                signal = asyncio.create_task(self._redeploy.wait())
                try:
                    await asyncio.wait({work, signal}, return_when=asyncio.FIRST_COMPLETED)
                except BaseException:  # run() itself cancelled: take the tasks down with it
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                    raise
                finally:
                    signal.cancel()
                if work.done():
                    error = work.exception()  # raises CancelledError if the tasks were canceled
                    if error is None:
                        finished = True
                        return
                    if not await self._coordinator_changed():
                        raise error
                else:
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                await self._reset()
        finally:
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
            await self._discard_local_state(finished)

    async def _discard_local_state(self, finished: bool) -> None:
        """Delete the job's local state copies (local recovery) once its hosted tasks all
        finished or the coordinator reports the job FINISHED, CANCELED or FAILED; a failover
        (RESTARTING) keeps them for the next deployment."""
        config = self._state_backend
        if config is None or not config.local_recovery:
            return
        if not finished:
            try:
                info = await self.stub.GetJob(cpb.GetJobRequest(job_id=self.job_id), timeout=5)
            except Exception:  # unknown: keep them (the restore checks a copy before use)
                return
            state = wire.JOB_STATE.from_pb_or(info.state, None)
            if state is None or not state.is_terminal:  # unknown: keep them
                return
        await asyncio.to_thread(config.discard_local_copies, self.job_id)
        self._log.info("agent.local_state_discarded", finished=finished)

    async def _deploy_and_run(self, reconnect: bool) -> None:
        self.deployments += 1
        try:
            await self._deploy(reconnect)
        except BaseException:
            # Subtasks opened before a later one failed, or before the deployment was given
            # up, never run: close their operators and state and end their threads.
            await self._discard_unstarted(self.hosted.values())
            raise
        runners = [h.runner for h in self.hosted.values() if h.runner is not None]
        try:
            await asyncio.gather(*runners)
        except asyncio.CancelledError:
            raise
        except Exception:
            for runner in runners:
                runner.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
            raise

    # --- deployment --------------------------------------------------------------------------

    async def _deploy(self, reconnect: bool = False) -> None:
        info = await self._get_job(reconnect)
        graph = info.graph
        # As before the shared vocabulary: a mode this worker does not know runs aligned.
        mode = wire.CHECKPOINT_MODE.from_pb_or(info.checkpoint_config.mode, CheckpointMode.ALIGNED)
        self._state_backend = StateBackendConfig(
            kind=info.checkpoint_config.state_backend,
            options=wire.state_backend_options_from_pb(
                info.checkpoint_config.state_backend_options
            ),
        )
        vertices = {v.vertex_id: v for v in graph.vertices}
        for v in graph.vertices:
            for i in range(v.parallelism):
                if i % self.num_slots != self.slot:
                    continue
                response = await self.stub.RegisterTask(
                    cpb.RegisterTaskRequest(
                        job_id=self.job_id,
                        vertex_id=v.vertex_id,
                        subtask_index=i,
                        address=self.address,
                        launch=self.launch,
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
                self.epoch = max(self.epoch, response.coordinator_epoch)
                self._follow_settings(response.heartbeat_interval_ms, response.heartbeat_timeout_ms)
                self.hosted[(v.vertex_id, i)] = _Hosted(v, i, response.attempt, response.restore)
        if not self.hosted:
            return
        attempt = next(iter(self.hosted.values())).attempt.attempt
        # Input channels first, so that producers can connect as soon as they know our address.
        local: dict[tuple[str, int, str, int], LocalChannel] = {}
        for (vertex_id, index), hosted in self.hosted.items():
            for edge in graph.edges:
                if edge.target_vertex_id != vertex_id:
                    continue
                source = vertices[edge.source_vertex_id]
                for producer in _producers(edge, source, index):
                    name = f"{edge.source_vertex_id}[{producer}]->{vertex_id}[{index}]"
                    if (edge.source_vertex_id, producer) in self.hosted:
                        pair = LocalChannel(
                            self.buffers_per_channel, name=name, debloat=self.dataplane.debloat
                        )
                        local[(edge.source_vertex_id, producer, vertex_id, index)] = pair
                        hosted.inputs.append(pair.input)
                        hosted.input_of.append(edge.target_input)
                    else:
                        channel = InputChannel(self.buffers_per_channel, name=name)
                        self.registry.register(
                            self._channel_id(
                                edge.source_vertex_id, producer, vertex_id, index, attempt
                            ),
                            channel,
                        )
                        hosted.inputs.append(channel)
                        hosted.input_of.append(edge.target_input)
        addresses = await self._wait_for_deployment(graph, attempt)
        for (vertex_id, index), hosted in self.hosted.items():
            outputs = []
            for edge in graph.edges:
                if edge.source_vertex_id != vertex_id:
                    continue
                target = vertices[edge.target_vertex_id]
                channels: list[OutputChannel] = []
                consumers = _consumers(edge, target, index)
                for consumer in consumers:
                    key = (vertex_id, index, edge.target_vertex_id, consumer)
                    if key in local:
                        channels.append(local[key].output)
                    else:
                        cid = self._channel_id(
                            vertex_id, index, edge.target_vertex_id, consumer, attempt
                        )
                        channels.append(
                            await self._connect(addresses[(edge.target_vertex_id, consumer)], cid)
                        )
                partitioner: Partitioner = (
                    ForwardPartitioner()
                    if len(channels) == 1
                    else _partitioner(edge, target, index)
                )
                outputs.append(OutputEdge(partitioner, channels, tag=edge.output_tag))
            key_fields = _input_key_fields(graph, vertex_id)
            operators: list[Operator] = [
                cloudpickle.loads(o.payload) for o in hosted.vertex.operators
            ]
            for spec, op in zip(hosted.vertex.operators, operators, strict=True):
                if not getattr(op, "operator_id", ""):
                    op.operator_id = spec.operator_id  # type: ignore[attr-defined]
            task = Subtask(
                job_id=self.job_id,
                vertex_id=vertex_id,
                subtask_index=index,
                parallelism=hosted.vertex.parallelism,
                max_parallelism=hosted.vertex.max_parallelism or 128,
                attempt=attempt,
                operators=operators,
                key_fields=key_fields,
                gate=InputGate(hosted.inputs, hosted.input_of) if hosted.inputs else None,
                outputs=outputs,
                mode=mode,
                restore=_restore_data(hosted.restore),
                ack=self._ack_fn(hosted.attempt),
                decline=self._decline_fn(hosted.attempt),
                source_batch_records=self.source_batch_records,
                periodic_checkpoints=info.checkpoint_config.interval_ms > 0,
                state_backend=self._state_backend,
                task_thread=self.dataplane.task_thread,
                builtins_on_loop=self.dataplane.builtins_on_loop,
                placement=PlacementSettings() if self.dataplane.adaptive_task_thread else None,
                # Also without periodic checkpoints: an ended source asks for the final
                # checkpoint, so the job never finishes with uncommitted sink output (Flink
                # commits at the end of input with checkpointing off as well).
                request_final_checkpoint=functools.partial(
                    self._request_final_checkpoint, hosted.attempt
                ),
                report_data_ended=functools.partial(self._report_data_ended, hosted.attempt),
            )
            await task.open_where_it_runs()
            hosted.task = task
        for hosted in self.hosted.values():
            await self._report(hosted.attempt, wire.TASK_STATE.to_pb(TaskState.RUNNING))
        assert self._batcher is not None
        for hosted in self.hosted.values():
            hosted.runner = asyncio.create_task(
                self._run_task(hosted), name=f"task-{hosted.task.name if hosted.task else ''}"
            )
            # Its peers' acks wait for its own while it runs (one ack call per checkpoint).
            self._batcher.track(self.job_id, hosted.attempt, hosted.runner)
        self._log.info(
            "agent.deployed", attempt=attempt, tasks=len(self.hosted), address=self.address
        )

    async def _get_job(self, reconnect: bool) -> cpb.JobInfo:
        """The job with its operators; when reconnecting, retried while the coordinator is
        unreachable (it may be restarting), up to ``RECONNECT_TIMEOUT_S``."""
        request = cpb.GetJobRequest(job_id=self.job_id, include_operator_payloads=True)
        deadline = time.monotonic() + RECONNECT_TIMEOUT_S
        while True:
            try:
                return await self.stub.GetJob(request, timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                retry = e.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
                if not (reconnect and retry) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(min(1.0, self.heartbeat_interval_s))

    # --- heartbeats and re-registration --------------------------------------------------------

    def _live_attempts(self) -> list[pb.TaskAttempt]:
        return [h.attempt for h in self.hosted.values() if h.runner is None or not h.runner.done()]

    def _task_metrics(self) -> list[cpb.TaskMetricsReport]:
        """What each running task measured since the previous heartbeat (docs/worker.md, "Task
        metrics")."""
        return [
            cpb.TaskMetricsReport(
                attempt=h.attempt, metrics=wire.task_metrics_to_pb(h.task.metrics())
            )
            for h in self.hosted.values()
            if h.task is not None and h.runner is not None and not h.runner.done()
        ]

    async def _heartbeat(self) -> cpb.HeartbeatResponse:
        response = await self.stub.Heartbeat(
            cpb.HeartbeatRequest(
                job_id=self.job_id,
                address=self.address,
                tasks=self._live_attempts(),
                task_metrics=self._task_metrics(),
            ),
            timeout=min(RPC_TIMEOUT_S, self.heartbeat_timeout_s),
        )
        self._follow_settings(response.heartbeat_interval_ms, response.heartbeat_timeout_ms)
        return response

    def _follow_settings(self, interval_ms: int, timeout_ms: int) -> None:
        """The coordinator answered: note the contact and follow its heartbeat settings."""
        self._last_contact = time.monotonic()
        if interval_ms > 0 and interval_ms / 1000 != self.heartbeat_interval_s:
            self.heartbeat_interval_s = interval_ms / 1000
            self._beat.set()  # the loop's current sleep may be longer than the new interval
        if timeout_ms > 0:
            self.heartbeat_timeout_s = timeout_ms / 1000

    def _request_redeploy(self, reason: str) -> None:
        if not self._redeploy.is_set():
            self._redeploy_reason = reason
            self._log.warning("agent.reregistering", reason=reason, epoch=self.epoch)
            self._redeploy.set()

    async def _heartbeat_loop(self) -> None:
        """Every heartbeat interval while tasks are hosted (Flink's TaskManager heartbeat)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_interval_s):
                    await self._beat.wait()
            self._beat.clear()
            if not self.hosted or self._redeploy.is_set():
                continue
            try:
                response = await self._heartbeat()
            except grpc.aio.AioRpcError as e:
                silent_s = time.monotonic() - self._last_contact
                if silent_s > self.heartbeat_timeout_s:
                    self._request_redeploy(
                        f"coordinator lost: heartbeats failed for {silent_s:.1f} s "
                        f"({e.code().name}: {(e.details() or '')[:200]})"
                    )
                continue
            if response.coordinator_epoch > self.epoch:
                self._request_redeploy(
                    f"new coordinator epoch {response.coordinator_epoch} (was {self.epoch})"
                )
            elif response.coordinator_epoch == self.epoch and not response.tasks_current:
                # The coordinator moved on without us (a missed CancelTask): stop as told.
                self._log.warning("agent.tasks_not_current", epoch=self.epoch)
                for hosted in self.hosted.values():
                    if hosted.runner is not None:
                        hosted.runner.cancel()

    async def _coordinator_changed(self) -> bool:
        """After a task failed: whether it was because the coordinator is gone or was
        replaced (then the tasks register again instead of the agent failing)."""
        if self._redeploy.is_set():
            return True
        if self.epoch == 0:
            return False  # never registered: nothing to register again
        try:
            response = await self._heartbeat()
        except grpc.aio.AioRpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            self._request_redeploy(
                f"a task failed while the coordinator is unreachable ({e.code().name})"
            )
            return True
        if response.coordinator_epoch > self.epoch:
            self._request_redeploy(
                f"a task failed and a new coordinator answers (epoch {response.coordinator_epoch})"
            )
            return True
        return False

    async def _reset(self) -> None:
        """Cancel every hosted task and forget the deployment, to register again."""
        hosted, self.hosted = self.hosted, {}
        runners = [h.runner for h in hosted.values() if h.runner is not None]
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        await self._discard_unstarted(hosted.values())
        self.registry.unregister_job(self.job_id)

    async def _discard_unstarted(self, hosted: Iterable[_Hosted]) -> None:
        """Clean up the opened subtasks whose run never started (``Subtask.discard``; a runner
        cancelled before its first step never runs its coroutine)."""
        for h in list(hosted):
            if h.task is not None:
                with contextlib.suppress(Exception):
                    await h.task.discard()

    def _channel_id(self, pv: str, ps: int, cv: str, cs: int, attempt: int) -> wpb.ChannelId:
        return wpb.ChannelId(
            job_id=self.job_id,
            producer_vertex_id=pv,
            producer_subtask=ps,
            consumer_vertex_id=cv,
            consumer_subtask=cs,
            attempt=attempt,
        )

    async def _wait_for_deployment(
        self, graph: pb.JobGraph, attempt: int
    ) -> dict[tuple[str, int], str]:
        expected = sum(v.parallelism for v in graph.vertices)
        deadline = time.monotonic() + DEPLOY_TIMEOUT_S
        while True:
            tasks = (
                await self.stub.ListTasks(
                    cpb.ListTasksRequest(job_id=self.job_id), timeout=RPC_TIMEOUT_S
                )
            ).tasks
            current = [t for t in tasks if t.attempt.attempt == attempt]
            if len(current) == expected:
                return {(t.attempt.vertex_id, t.attempt.subtask_index): t.address for t in current}
            if any(t.attempt.attempt > attempt for t in tasks):
                raise FailedPreconditionError(f"a newer deployment than attempt {attempt} started")
            if time.monotonic() > deadline:
                raise FailedPreconditionError(
                    f"only {len(current)} of {expected} subtasks registered within {DEPLOY_TIMEOUT_S:.0f} s"
                )
            await asyncio.sleep(0.05)

    async def _connect(self, address: str, cid: wpb.ChannelId) -> RemoteOutputChannel:
        channel = self._peer_channels.get(address)
        if channel is None:
            channel = aio_channel(address, self.security, exchange_grpc_options(MAX_MESSAGE_BYTES))
            self._peer_channels[address] = channel
        stub = wgrpc.DataExchangeServiceStub(channel)
        deadline = time.monotonic() + DEPLOY_TIMEOUT_S
        while True:
            try:
                return await RemoteOutputChannel.connect(
                    stub,
                    cid,
                    max_message_bytes=4 * 1024 * 1024,
                    debloat=self.dataplane.debloat,
                )
            except ChannelRefusedError:
                # The consumer's agent has not registered this channel yet.
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def _run_task(self, hosted: _Hosted) -> None:
        assert hosted.task is not None
        try:
            await hosted.task.run()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._report(
                    hosted.attempt, wire.TASK_STATE.to_pb(TaskState.CANCELED), "canceled"
                )
            raise
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
            self._log.error("task.failed", task=hosted.task.name, failure=message)
            with contextlib.suppress(Exception):
                await self._report(hosted.attempt, wire.TASK_STATE.to_pb(TaskState.FAILED), message)
            raise
        await self._report(hosted.attempt, wire.TASK_STATE.to_pb(TaskState.FINISHED))

    async def _report(
        self, attempt: pb.TaskAttempt, state: int, failure: str = "", data_ended: bool = False
    ) -> None:
        await self.stub.UpdateTaskState(
            cpb.UpdateTaskStateRequest(
                job_id=self.job_id,
                attempt=attempt,
                state=state,  # type: ignore[arg-type]
                failure=failure,
                data_ended=data_ended,
            ),
            timeout=RPC_TIMEOUT_S,
        )

    async def _report_data_ended(self, attempt: pb.TaskAttempt) -> None:
        """The subtask ``attempt`` sent its end of data downstream: tell the coordinator, which
        holds the final checkpoint until every task did. Tried a few times; if it never
        arrives, the coordinator triggers after its checkpoint timeout."""
        for attempt_no in range(DATA_ENDED_REPORT_TRIES):
            try:
                await self._report(
                    attempt, wire.TASK_STATE.to_pb(TaskState.RUNNING), data_ended=True
                )
                return
            except grpc.RpcError as e:
                self._log.info(
                    "agent.data_ended_report_failed", try_no=attempt_no + 1, error=str(e)[:300]
                )
            if attempt_no + 1 < DATA_ENDED_REPORT_TRIES:
                await asyncio.sleep(0.5)

    # --- checkpoint messages to the coordinator ------------------------------------------------

    def _ack_fn(self, attempt: pb.TaskAttempt) -> AckFn:
        async def ack(report: SnapshotReport) -> None:
            request = cpb.AcknowledgeCheckpointRequest(
                job_id=self.job_id,
                attempt=attempt,
                checkpoint_id=report.checkpoint_id,
                operator_states=[
                    pb.OperatorSubtaskState(
                        operator_id=op_id, handles=[wire.state_handle_to_pb(h) for h in handles]
                    )
                    for op_id, handles in report.operator_states
                ],
                metrics=pb.SubtaskCheckpointMetrics(
                    sync_duration_ms=report.sync_duration_ms,
                    async_duration_ms=report.async_duration_ms,
                    alignment_duration_ms=report.alignment_duration_ms,
                    start_delay_ms=report.start_delay_ms,
                    state_size_bytes=report.state_size_bytes,
                    processed_during_alignment_bytes=report.processed_during_alignment_bytes,
                    persisted_in_flight_bytes=report.persisted_in_flight_bytes,
                    unaligned=report.unaligned,
                    records_in=report.records_in,
                ),
                input_ended=report.input_ended,
            )
            assert self._batcher is not None
            try:
                await self._batcher.acknowledge(request)
            except (grpc.aio.AioRpcError, SnapflowError, Exception) as e:
                # A lost ack only lets the checkpoint expire; the task goes on.
                self._log.warning(
                    "checkpoint.ack_failed", checkpoint_id=report.checkpoint_id, error=str(e)
                )

        return ack

    async def _request_final_checkpoint(self, attempt: pb.TaskAttempt) -> None:
        """The source subtask ``attempt`` ended its input: ask the coordinator for the job's
        final checkpoint until one completes (a failed or refused one is asked for again). The
        coordinator holds the request until every source asked, so the job ends with one
        checkpoint; the task cancels this once its final checkpoint completed."""
        request = cpb.TriggerCheckpointRequest(job_id=self.job_id, input_ended=attempt)
        while True:
            try:
                await self.stub.TriggerCheckpoint(request, timeout=FINAL_CHECKPOINT_REQUEST_S)
                return
            except grpc.RpcError as e:
                self._log.info("agent.final_checkpoint_request_failed", error=str(e)[:300])
            await asyncio.sleep(0.5)

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The coordinator aborted ``checkpoint_id``: acks held for it go now."""
        if self._batcher is not None:
            self._batcher.aborted(self.job_id, checkpoint_id)

    def _decline_fn(self, attempt: pb.TaskAttempt) -> DeclineFn:
        async def decline(checkpoint_id: int, reason: DeclineReason, message: str) -> None:
            if self._batcher is not None:  # its peers' held acks of the checkpoint go now
                self._batcher.declined(self.job_id, attempt, checkpoint_id)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.stub.DeclineCheckpoint(
                    cpb.DeclineCheckpointRequest(
                        job_id=self.job_id,
                        attempt=attempt,
                        checkpoint_id=checkpoint_id,
                        reason=wire.DECLINE_REASON.to_pb(reason),
                        message=message,
                    ),
                    timeout=RPC_TIMEOUT_S,
                )

        return decline

    # --- control from the coordinator ----------------------------------------------------------

    def hosts(self, attempt: pb.TaskAttempt) -> bool:
        """Whether ``attempt`` is the current attempt of a subtask hosted here."""
        hosted = self.hosted.get((attempt.vertex_id, attempt.subtask_index))
        return hosted is not None and hosted.attempt.attempt == attempt.attempt

    def tasks_for(self, attempts: Sequence[pb.TaskAttempt]) -> list[Subtask]:
        """The subtasks of ``attempts`` that run here as those attempts."""
        out = []
        for a in attempts:
            hosted = self.hosted.get((a.vertex_id, a.subtask_index))
            if (
                hosted is not None
                and hosted.attempt.attempt == a.attempt
                and hosted.task is not None
            ):
                out.append(hosted.task)
        return out

    def cancel_tasks(self, attempts: Sequence[pb.TaskAttempt]) -> None:
        """Cancel the runners of ``attempts`` that run here as those attempts."""
        for a in attempts:
            hosted = self.hosted.get((a.vertex_id, a.subtask_index))
            if (
                hosted is not None
                and hosted.runner is not None
                and hosted.attempt.attempt == a.attempt
            ):
                hosted.runner.cancel()

    def adopt_epoch(self, epoch: int) -> None:
        """Follow a newer coordinator epoch (checked by the control service)."""
        self._log.info("agent.epoch_adopted", epoch=epoch, previous=self.epoch)
        self.epoch = epoch


def _restore_data(restore: cpb.TaskRestore) -> RestoreData:
    data = RestoreData(restore.checkpoint_id, restore.previous_parallelism)
    for vs in restore.vertex_state:
        for op in vs.operators:
            data.handles.setdefault(op.operator_id, {})[vs.subtask_index] = [
                wire.state_handle_from_pb(h) for h in op.handles
            ]
    return data

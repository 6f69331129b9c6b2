"""Hostile and garbage messages to every RPC of the coordinators and the agents: every unary
RPC, the agents' control stream (``WorkerControlService.Control``: one command a stream) and
their data stream (``DataExchangeService.Exchange``, bidirectional).

Two kinds, chosen by the run's seeded generator:

* **garbage**: random bytes sent as the request of a method (they rarely parse as its message);
* **hostile**: well-formed requests with values no honest client sends: unknown job ids, an
  epoch of 2**62, attempt numbers that never existed, negative or huge ids, paths outside the
  storage, oversized strings. Hostile messages never name a live job in a mutating call that an
  honest operator could send (cancel, stop-with-savepoint), and agents only get them for jobs
  they do not host: "a hostile epoch in a message for an unknown job changes nothing".

Exchange streams (``hostile_exchange_stream``): undecodable bytes, a frame before ``open``, an
empty stream, ``open`` for an unknown job or an unknown channel of a live job followed by
frames (a barrier of id 2**62, garbage Arrow bytes, end of partition), ``open`` for a live
channel with an attempt no deployment has (-1, 2**31-1: a real attempt would take over a
live channel, which an honest producer of that attempt may do) and a message above the agent's
16 MiB receive limit. Each must be refused at once (INVALID_ARGUMENT, FAILED_PRECONDITION or
RESOURCE_EXHAUSTED) without touching the live channels.

A control stream (``send_control``) gets one command: garbage bytes must end the stream with
INVALID_ARGUMENT, a hostile command must be answered with a refusal (a ``ControlReply`` whose
code is not OK); an OK answer counts as ``ACCEPTED``.

Every answer must be a deliberate status: anything but ``UNKNOWN``/``INTERNAL`` (and a server
that stays up). The live jobs' exact output at the end of the run proves they changed nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Callable

import grpc
from google.protobuf.message import Message

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import worker_pb2 as wpb

BAD_STATUSES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
ENDED_DURING_WRITE = "ENDED_DURING_WRITE"
"""A hostile Exchange stream the agent ended while this client was writing to it."""
STREAM_VERDICT_S = 2.0
"""How long a hostile stream waits for the agent's verdict before its next message."""
ACCEPTED = "ACCEPTED"
"""A hostile Exchange stream that got credit or ended OK: the agent took it for a channel."""
HUGE_EPOCH = 2**62
EXCHANGE_KINDS = (
    "garbage", "frame-first", "empty", "unknown-job", "unknown-channel", "wrong-attempt",
    "oversized",
)  # fmt: skip
OVERSIZED_BYTES = 17 * 1024 * 1024
"""Above the agents' receive limit (worker/runtime/agent.py ``MAX_MESSAGE_BYTES``, 16 MiB)."""

COORDINATOR_METHODS: dict[str, type[Message]] = {
    "SubmitJob": cpb.SubmitJobRequest,
    "GetJob": cpb.GetJobRequest,
    "ListJobs": cpb.ListJobsRequest,
    "CancelJob": cpb.CancelJobRequest,
    "RegisterTask": cpb.RegisterTaskRequest,
    "UpdateTaskState": cpb.UpdateTaskStateRequest,
    "ListTasks": cpb.ListTasksRequest,
    "Heartbeat": cpb.HeartbeatRequest,
    "AcknowledgeCheckpoint": cpb.AcknowledgeCheckpointRequest,
    "AcknowledgeCheckpoints": cpb.AcknowledgeCheckpointsRequest,
    "DeclineCheckpoint": cpb.DeclineCheckpointRequest,
    "TriggerCheckpoint": cpb.TriggerCheckpointRequest,
    "TriggerSavepoint": cpb.TriggerSavepointRequest,
    "StopWithSavepoint": cpb.StopWithSavepointRequest,
    "DisposeSavepoint": cpb.DisposeSavepointRequest,
    "GetCheckpointStats": cpb.GetCheckpointStatsRequest,
    "GetCheckpointDetails": cpb.GetCheckpointDetailsRequest,
}
CONTROL_COMMANDS = ("trigger", "complete", "abort", "cancel")
"""The commands of an agent's control stream (``wpb.ControlCommand``)."""


def _job_id(rng: random.Random) -> str:
    return rng.choice(["", "x" * 300, "../../etc", "deadbeef" * 4, f"{rng.getrandbits(128):032x}"])


def _attempt(rng: random.Random) -> pb.TaskAttempt:
    return pb.TaskAttempt(
        vertex_id=rng.choice(["source", "count", "", "v" * 500]),
        subtask_index=rng.choice([0, -1, 2**31 - 1]),
        attempt=rng.choice([0, -5, 999_999]),
    )


def hostile_coordinator_request(
    method: str, rng: random.Random, live_jobs: list[str], storage: str
) -> Message:
    """A well-formed but hostile request; ``live_jobs`` only where no honest harm is possible
    (reads, task RPCs of attempts that never existed, acks of ids never allocated)."""
    read_job = rng.choice([*live_jobs, _job_id(rng)]) if live_jobs else _job_id(rng)
    unknown = _job_id(rng)
    outside = rng.choice(["/etc/passwd", f"{storage}/../escape", "relative/path", "s3://x/y"])
    ack = cpb.AcknowledgeCheckpointRequest(
        job_id=read_job,
        attempt=_attempt(rng),
        checkpoint_id=rng.choice([-1, 0, 2**62, 10**12]),
        operator_states=[
            pb.OperatorSubtaskState(
                operator_id="count", handles=[pb.StateHandle(path=outside, size_bytes=-1)]
            )
        ],
    )
    builders: dict[str, Callable[[], Message]] = {
        "SubmitJob": lambda: cpb.SubmitJobRequest(
            job_id=rng.choice(["bad id!", "A" * 32]),
            graph=pb.JobGraph(
                name="hostile", vertices=[pb.JobVertex(vertex_id="", parallelism=-3)]
            ),
        ),
        "GetJob": lambda: cpb.GetJobRequest(job_id=read_job),
        "ListJobs": lambda: cpb.ListJobsRequest(),
        "CancelJob": lambda: cpb.CancelJobRequest(job_id=unknown),
        "RegisterTask": lambda: cpb.RegisterTaskRequest(
            job_id=unknown, vertex_id="source", subtask_index=-1, address="nowhere:0"
        ),
        "UpdateTaskState": lambda: cpb.UpdateTaskStateRequest(
            job_id=read_job, attempt=_attempt(rng), state=pb.TASK_STATE_FAILED, failure="hostile"
        ),
        "ListTasks": lambda: cpb.ListTasksRequest(job_id=read_job),
        "Heartbeat": lambda: cpb.HeartbeatRequest(
            job_id=read_job, address="127.0.0.1:1", tasks=[_attempt(rng)]
        ),
        "AcknowledgeCheckpoint": lambda: ack,
        "AcknowledgeCheckpoints": lambda: cpb.AcknowledgeCheckpointsRequest(
            acks=[ack] * rng.choice([1, 2, 4097])
        ),
        "DeclineCheckpoint": lambda: cpb.DeclineCheckpointRequest(
            job_id=read_job, attempt=_attempt(rng), checkpoint_id=rng.choice([-1, 2**62])
        ),
        "TriggerCheckpoint": lambda: cpb.TriggerCheckpointRequest(job_id=unknown),
        "TriggerSavepoint": lambda: cpb.TriggerSavepointRequest(
            job_id=unknown, target_directory="relative"
        ),
        "StopWithSavepoint": lambda: cpb.StopWithSavepointRequest(job_id=unknown),
        "DisposeSavepoint": lambda: cpb.DisposeSavepointRequest(savepoint_path=outside),
        "GetCheckpointStats": lambda: cpb.GetCheckpointStatsRequest(
            job_id=read_job, history_size=rng.choice([-1, 10**6])
        ),
        "GetCheckpointDetails": lambda: cpb.GetCheckpointDetailsRequest(
            job_id=read_job, checkpoint_id=rng.choice([-1, 2**62])
        ),
    }
    return builders[method]()


def hostile_control_command(kind: str, rng: random.Random) -> wpb.ControlCommand:
    """A command of ``kind`` (CONTROL_COMMANDS) for a job the agent does not host, with a
    hostile epoch."""
    job = f"{rng.getrandbits(128):032x}"
    tasks = [_attempt(rng)]
    sequence = rng.choice([0, -1, 2**62])
    if kind == "trigger":
        trigger = wpb.TriggerTaskCheckpointRequest(
            job_id=job, tasks=tasks, checkpoint_id=rng.choice([1, 2**62]),
            coordinator_epoch=HUGE_EPOCH,
        )  # fmt: skip
        return wpb.ControlCommand(sequence=sequence, trigger=trigger)
    if kind == "cancel":
        cancel = wpb.CancelTaskRequest(job_id=job, tasks=tasks, coordinator_epoch=HUGE_EPOCH)
        return wpb.ControlCommand(sequence=sequence, cancel=cancel)
    notice = wpb.NotifyCheckpointRequest(
        job_id=job, tasks=tasks, checkpoint_id=2**62, coordinator_epoch=HUGE_EPOCH
    )
    if kind == "complete":
        return wpb.ControlCommand(sequence=sequence, complete=notice)
    return wpb.ControlCommand(sequence=sequence, abort=notice)


def _hostile_frames(rng: random.Random) -> list[bytes]:
    frames = [
        wpb.Frame(barrier=wpb.CheckpointBarrier(checkpoint_id=HUGE_EPOCH)),
        wpb.Frame(batch=wpb.DataBatch(arrow_ipc=rng.randbytes(64), num_records=-1)),
        wpb.Frame(cancel_marker=wpb.CancelCheckpointMarker(checkpoint_id=-1)),
        wpb.Frame(end_of_partition=wpb.EndOfPartition()),
    ]
    return [wpb.ExchangeMessage(frame=f).SerializeToString() for f in frames]


def hostile_exchange_stream(kind: str, rng: random.Random, live_jobs: list[str]) -> list[bytes]:
    """The request messages of one hostile ``Exchange`` stream of ``kind`` (EXCHANGE_KINDS).
    ``live_jobs``: jobs the agent hosts (their channels are named only with attempts that no
    deployment has, so the agent refuses them)."""
    live = rng.choice(live_jobs) if live_jobs else f"{rng.getrandbits(128):032x}"
    if kind == "garbage":
        return [rng.randbytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 4))]
    if kind == "frame-first":
        return _hostile_frames(rng)
    if kind == "empty":
        return []
    if kind == "oversized":
        cid = wpb.ChannelId(job_id="x" * OVERSIZED_BYTES)
        return [wpb.ExchangeMessage(open=cid).SerializeToString()]
    if kind == "unknown-job":
        cid = wpb.ChannelId(
            job_id=_job_id(rng), producer_vertex_id="source", consumer_vertex_id="count"
        )
    elif kind == "unknown-channel":
        cid = wpb.ChannelId(
            job_id=live,
            producer_vertex_id=rng.choice(["nope", "", "v" * 500]),
            producer_subtask=rng.choice([0, -1, 2**31 - 1]),
            consumer_vertex_id="count",
        )
    elif kind == "wrong-attempt":
        cid = wpb.ChannelId(
            job_id=live,
            producer_vertex_id="source",
            producer_subtask=0,
            consumer_vertex_id="count",
            consumer_subtask=0,
            attempt=rng.choice([-1, 2**31 - 1]),
        )
    else:
        raise ValueError(f"unknown hostile Exchange kind {kind!r}")
    return [wpb.ExchangeMessage(open=cid).SerializeToString(), *_hostile_frames(rng)]


class HostileStats:
    """Counts of what the hostile messages got back."""

    def __init__(self) -> None:
        self.sent = 0
        self.statuses: Counter[str] = Counter()
        self.exchange_streams = 0
        """Of ``sent``: hostile Exchange streams."""
        self.streams: Counter[str] = Counter()
        """Hostile Exchange streams by ``<kind> <status>``."""
        self.stream_details: dict[str, str] = {}
        """The first status detail of every ``<kind> <status>``."""
        self.bad: list[str] = []

    def record(self, target: str, method: str, code: grpc.StatusCode | None, detail: str) -> None:
        name = code.name if code is not None else "OK"
        self._count(method, name, detail)
        self.statuses[name] += 1
        if code in BAD_STATUSES and len(self.bad) < 20:
            self.bad.append(f"{target} {method}: {name} {detail[:200]}")

    def _count(self, method: str, name: str, detail: str = "") -> None:
        self.sent += 1
        if method.startswith("Exchange:"):
            self.exchange_streams += 1
            outcome = f"{method.removeprefix('Exchange:')} {name}"
            self.streams[outcome] += 1
            self.stream_details.setdefault(outcome, detail[:200])

    def record_raw(self, target: str, method: str, name: str) -> None:
        self._count(method, name)
        self.statuses[name] += 1

    def accepted(self, target: str, method: str, detail: str) -> None:
        """A hostile stream the agent accepted (an unexpected outcome, like UNKNOWN)."""
        self._count(method, ACCEPTED, detail)
        self.statuses[ACCEPTED] += 1
        if len(self.bad) < 20:
            self.bad.append(f"{target} {method}: {ACCEPTED} {detail[:200]}")

    @property
    def unexpected(self) -> int:
        return sum(self.statuses[c.name] for c in BAD_STATUSES) + self.statuses[ACCEPTED]


async def send(
    channel: grpc.aio.Channel,
    service: str,
    method: str,
    payload: bytes,
    stats: HostileStats,
    target: str,
) -> None:
    call = channel.unary_unary(
        f"/snapflow.v1.{service}/{method}",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    try:
        await call(payload, timeout=3)
    except grpc.aio.AioRpcError as e:
        # DEADLINE_EXCEEDED and UNAVAILABLE: a server that is down or busy, not a bad answer.
        stats.record(target, method, e.code(), e.details() or "")
        return
    stats.record(target, method, None, "")


async def send_control(
    channel: grpc.aio.Channel, kind: str, payload: bytes, stats: HostileStats
) -> None:
    """One hostile ``Control`` stream of one command; recorded as ``Control:<kind>``: the
    code of the agent's reply, or the status it ended the call with. The client cancels the
    call after the answer (no half-close that could race the agent's status)."""
    call = channel.stream_stream(
        "/snapflow.v1.WorkerControlService/Control",
        request_serializer=lambda b: b,
        response_deserializer=wpb.ControlReply.FromString,
    )
    method = f"Control:{kind}"
    stream = call(timeout=5)
    try:
        try:
            await stream.write(payload)
            reply = await stream.read()
        except grpc.aio.AioRpcError as e:
            if "execute_batch" in (e.debug_error_string() or ""):
                stats.record_raw("agent", method, ENDED_DURING_WRITE)
                return
            reply = grpc.aio.EOF
        if reply is grpc.aio.EOF:
            code = await stream.code()
            if code is grpc.StatusCode.OK:
                stats.accepted("agent", method, "a hostile command ended OK without an answer")
            else:
                stats.record("agent", method, code, await stream.details() or "")
            return
        assert isinstance(reply, wpb.ControlReply)
        if reply.code == grpc.StatusCode.OK.value[0]:
            stats.accepted("agent", method, "a hostile command was carried out")
            return
        status = next((c for c in grpc.StatusCode if c.value[0] == reply.code), None)
        stats.record("agent", method, status or grpc.StatusCode.UNKNOWN, reply.message)
    finally:
        stream.cancel()


async def send_stream(
    channel: grpc.aio.Channel, kind: str, payloads: list[bytes], stats: HostileStats
) -> None:
    """One hostile ``Exchange`` stream; its final status is recorded as ``Exchange:<kind>``.

    Messages are written one at a time, each after the agent had ``STREAM_VERDICT_S`` to end
    the call: a write that races the agent's status ends the call on the client with
    ``INTERNAL`` ("Internal error from Core", grpc.aio's failed SendMessage), which would hide
    the agent's own answer. Should a write still lose that race (a very slow agent), the
    outcome is recorded as ``ENDED_DURING_WRITE``: the agent ended the call, with a status
    this client cannot see. An agent answers a refused stream at once and never grants it
    credit.
    """
    call = channel.stream_stream(
        "/snapflow.v1.DataExchangeService/Exchange",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    method = f"Exchange:{kind}"
    stream = call(timeout=5)
    status = asyncio.ensure_future(stream.code())
    try:
        for payload in payloads:
            if status.done():
                break
            try:
                await stream.write(payload)
            except asyncio.InvalidStateError:
                break
            except grpc.aio.AioRpcError as e:
                if "execute_batch" in (e.debug_error_string() or ""):
                    stats.record_raw("agent", method, ENDED_DURING_WRITE)
                    return
                break
            await asyncio.wait({status}, timeout=STREAM_VERDICT_S)
        if not status.done():
            # Half-closing can race the agent's status too; that status is read below.
            with contextlib.suppress(Exception):
                await stream.done_writing()
            try:
                response = await stream.read()
            except grpc.aio.AioRpcError:
                response = grpc.aio.EOF
            if response is not grpc.aio.EOF:
                # Credit goes only to an accepted stream: a hostile one must never get it.
                stats.accepted("agent", method, "a hostile stream got credit")
                stream.cancel()
                return
        code = await status
    finally:
        status.cancel()
    if code is grpc.StatusCode.OK:
        stats.accepted("agent", method, "a hostile stream ended OK")
        return
    stats.record("agent", method, code, await stream.details() or "")

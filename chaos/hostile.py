"""Hostile and garbage messages to every unary RPC of the coordinators and the agents.

Two kinds, chosen by the run's seeded generator:

* **garbage**: random bytes sent as the request of a method (they rarely parse as its message);
* **hostile**: well-formed requests with values no honest client sends: unknown job ids, an
  epoch of 2**62, attempt numbers that never existed, negative or huge ids, paths outside the
  storage, oversized strings. Hostile messages never name a live job in a mutating call that an
  honest operator could send (cancel, stop-with-savepoint), and agents only get them for jobs
  they do not host: "a hostile epoch in a message for an unknown job changes nothing".

Every answer must be a deliberate status: anything but ``UNKNOWN``/``INTERNAL`` (and a server
that stays up). The live jobs' exact output at the end of the run proves they changed nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import grpc
from google.protobuf.message import Message

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.v1 import worker_pb2 as wpb

BAD_STATUSES = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
HUGE_EPOCH = 2**62

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
WORKER_METHODS: dict[str, type[Message]] = {
    "TriggerCheckpoint": wpb.TriggerTaskCheckpointRequest,
    "NotifyCheckpointComplete": wpb.NotifyCheckpointRequest,
    "NotifyCheckpointAborted": wpb.NotifyCheckpointRequest,
    "CancelTask": wpb.CancelTaskRequest,
}


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


def hostile_worker_request(method: str, rng: random.Random) -> Message:
    """Messages for a job the agent does not host, with a hostile epoch."""
    job = f"{rng.getrandbits(128):032x}"
    tasks = [_attempt(rng)]
    if method == "TriggerCheckpoint":
        return wpb.TriggerTaskCheckpointRequest(
            job_id=job, tasks=tasks, checkpoint_id=rng.choice([1, 2**62]),
            coordinator_epoch=HUGE_EPOCH,
        )  # fmt: skip
    if method == "CancelTask":
        return wpb.CancelTaskRequest(job_id=job, tasks=tasks, coordinator_epoch=HUGE_EPOCH)
    return wpb.NotifyCheckpointRequest(
        job_id=job, tasks=tasks, checkpoint_id=2**62, coordinator_epoch=HUGE_EPOCH
    )


class HostileStats:
    """Counts of what the hostile messages got back."""

    def __init__(self) -> None:
        self.sent = 0
        self.statuses: Counter[str] = Counter()
        self.bad: list[str] = []

    def record(self, target: str, method: str, code: grpc.StatusCode | None, detail: str) -> None:
        self.sent += 1
        name = code.name if code is not None else "OK"
        self.statuses[name] += 1
        if code in BAD_STATUSES and len(self.bad) < 20:
            self.bad.append(f"{target} {method}: {name} {detail[:200]}")

    @property
    def unexpected(self) -> int:
        return sum(self.statuses[c.name] for c in BAD_STATUSES)


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

"""A worker whose tasks finished waits for its job to end before it exits: 0 when the job
finished or was canceled, 1 when it failed over meanwhile (its driver starts the workers
again; a worker gone with exit 0 would never come back, and the restarted job would wait
for it), when it failed, or when the coordinator stays unreachable.

The decision over the job states a coordinator answers is pure logic: a scripted stub
answers ``GetJob``; ``tests/cli/test_processes.py`` runs real workers against a real
coordinator."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from snapflow.cli.worker_command import after_tasks_finished
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb


class _Unavailable(grpc.aio.AioRpcError):
    def __init__(self) -> None:
        super().__init__(
            grpc.StatusCode.UNAVAILABLE,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="connection refused",
        )


class _Script:
    """Answers ``GetJob`` with the next state (or raises the next error); the last repeats."""

    def __init__(self, *answers: int | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def GetJob(self, request: cpb.GetJobRequest, timeout: float) -> cpb.JobInfo:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, Exception):
            raise answer
        return cpb.JobInfo(job_id=request.job_id, state=answer)  # type: ignore[arg-type]


def _exit_code(script: _Script, unreachable_s: float = 60.0) -> int:
    return asyncio.run(after_tasks_finished(script, "j", poll_s=0.001, unreachable_s=unreachable_s))


@pytest.mark.parametrize("end", [pb.JOB_STATE_FINISHED, pb.JOB_STATE_CANCELED])
def test_waits_while_the_job_runs_and_exits_0_when_it_ends(end: int) -> None:
    script = _Script(pb.JOB_STATE_RUNNING, pb.JOB_STATE_RUNNING, pb.JOB_STATE_RUNNING, end)
    assert _exit_code(script) == 0
    assert script.calls == 4


@pytest.mark.parametrize(
    "after", [pb.JOB_STATE_RESTARTING, pb.JOB_STATE_CREATED, pb.JOB_STATE_FAILED]
)
def test_a_job_that_failed_over_or_failed_meanwhile_is_exit_1(
    after: int, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _Script(pb.JOB_STATE_RUNNING, after, pb.JOB_STATE_FINISHED)
    assert _exit_code(script) == 1
    assert script.calls == 2  # decided at the first such answer
    err = capsys.readouterr().err
    assert "this worker's tasks finished, then job j became" in err
    assert ("start the workers again" in err) is (after != pb.JOB_STATE_FAILED)


def test_an_unreachable_coordinator_is_retried_then_given_up() -> None:
    flaky = _Script(_Unavailable(), _Unavailable(), pb.JOB_STATE_FINISHED)
    assert _exit_code(flaky) == 0  # a leader failover in between: retried
    gone = _Script(_Unavailable())
    assert _exit_code(gone, unreachable_s=0.05) == 1
    assert gone.calls >= 2


def test_other_errors_are_not_retried(capsys: pytest.CaptureFixture[str]) -> None:
    denied = grpc.aio.AioRpcError(
        grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no"
    )
    script = _Script(denied, pb.JOB_STATE_FINISHED)
    assert _exit_code(script) == 1
    assert script.calls == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err

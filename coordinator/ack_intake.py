"""A batch of checkpoint acknowledgements from an agent, handed to the jobs' runners: one
outcome per ack. Shared by the unary ``AcknowledgeCheckpoints`` (``service.py``) and the acks an
agent sends up its control stream (``control_stream.py``), so both paths check and answer alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from snapflow.coordinator import convert
from snapflow.coordinator.grpc_errors import status_for
from snapflow.errors import InvalidArgumentError, SnapflowError
from snapflow.v1 import coordinator_pb2 as cpb

if TYPE_CHECKING:
    from snapflow.coordinator.job_runner import JobRunner

MAX_ACKS_PER_BATCH = 4096
"""Acks in one batch (one call or one stream message): an agent's batcher sends at most 256."""

#: The runner of a job id as the client sent it (raises ``SnapflowError``: unknown, malformed).
RunnerOf = Callable[[str], "JobRunner"]


def acknowledge_batch(
    runner_of: RunnerOf, request: cpb.AcknowledgeCheckpointsRequest
) -> cpb.AcknowledgeCheckpointsResponse:
    """Hand every ack of ``request`` to its job's runner; an ack that is refused gets its own
    status in its outcome. Raises ``InvalidArgumentError`` for a batch above the limit."""
    if len(request.acks) > MAX_ACKS_PER_BATCH:
        raise InvalidArgumentError(
            f"{len(request.acks)} acks in one batch; at most {MAX_ACKS_PER_BATCH}: split the batch"
        )
    outcomes = []
    for ack in request.acks:
        try:
            result = runner_of(ack.job_id).acknowledge(
                convert.attempt_from_pb(ack.attempt),
                convert.checkpoint_id_from_pb(ack.checkpoint_id),
                convert.operator_states_from_pb(ack.operator_states),
                convert.metrics_from_pb(ack.metrics),
                ack.input_ended,
                convert.held_ms_from_pb(ack.held_ms),
            )
        except SnapflowError as error:
            code, message = status_for(error)
            outcomes.append(cpb.AckOutcome(error_code=code.value[0], error_message=message))
        else:
            outcomes.append(cpb.AckOutcome(result=convert.ACK_RESULT.to_pb(result)))
    return cpb.AcknowledgeCheckpointsResponse(outcomes=outcomes)


def refuse_batch(
    request: cpb.AcknowledgeCheckpointsRequest, error: SnapflowError
) -> cpb.AcknowledgeCheckpointsResponse:
    """Every ack of ``request`` refused with ``error`` (a stream message has no call status)."""
    code, message = status_for(error)
    outcome = cpb.AckOutcome(error_code=code.value[0], error_message=message)
    return cpb.AcknowledgeCheckpointsResponse(outcomes=[outcome] * len(request.acks))

"""Completed checkpoints to store and read back: the job ids and the builder the checkpoint
storage suites (local and S3) share."""

from __future__ import annotations

from snapflow.coordinator.model import (
    CheckpointKind,
    CompletedCheckpoint,
    ExecutionAttempt,
    OperatorSubtaskState,
    StateHandle,
    SubtaskAck,
    SubtaskMetrics,
)

JOB = "0123456789abcdef0123456789abcdef"
OTHER_JOB = "fedcba9876543210fedcba9876543210"


def make_checkpoint(
    directory: str,
    state_paths: list[str],
    *,
    kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    checkpoint_id: int = 7,
) -> CompletedCheckpoint:
    """A checkpoint of ``JOB`` at ``directory``: one ``map`` subtask per state path, each
    acknowledging one keyed handle to that path."""
    acks = tuple(
        SubtaskAck(
            attempt=ExecutionAttempt("map", i, 0),
            ack_timestamp_ms=1_000 + i,
            operator_states=(
                OperatorSubtaskState("op-1", (StateHandle(path, 3, "keyed", 0, 63),)),
            ),
            metrics=SubtaskMetrics(sync_duration_ms=1, state_size_bytes=3),
        )
        for i, path in enumerate(state_paths)
    )
    return CompletedCheckpoint(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        kind=kind,
        trigger_timestamp_ms=1_000,
        completion_timestamp_ms=1_100,
        external_path=directory,
        subtask_states=acks,
        vertex_parallelism={"map": len(state_paths)},
        vertex_max_parallelism={"map": 128},
    )

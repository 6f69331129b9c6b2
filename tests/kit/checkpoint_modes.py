"""The checkpoint modes the exactly-once suites run in, and how many of a job's checkpoints
went unaligned (the coordinator's history), so a suite can check each mode really applied."""

from __future__ import annotations

from snapflow.spark_bridge.coordinator_client import CoordinatorClient
from snapflow.v1 import coordinator_pb2 as cpb

MODES = {
    "aligned": ("aligned", 0),
    "unaligned": ("unaligned", 0),
    # 1 ms: nearly every alignment with data queued behind it times out and goes unaligned.
    "aligned-timeout": ("aligned", 1),
    "at-least-once": ("at_least_once", 0),
}
"""name -> (``checkpointing(mode=...)``, ``aligned_checkpoint_timeout_ms``)."""


def unaligned_checkpoints(address: str, job_id: str) -> int:
    """The job's checkpoints of which some subtask took its snapshot unaligned."""
    client = CoordinatorClient(address)
    try:
        stats = client.call(
            "GetCheckpointStats", cpb.GetCheckpointStatsRequest(job_id=job_id, history_size=100)
        )
    finally:
        client.close()
    return sum(1 for c in stats.history if c.unaligned)

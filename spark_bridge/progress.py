"""The live progress line a user watching ``run()`` sees on stderr."""

from __future__ import annotations

import time

from snapflow.spark_bridge.restart import JobStatus
from snapflow.v1 import coordinator_pb2 as cpb


class Progress:
    """A live one-line status on stderr (rich): what a user watching ``run()`` wants to see."""

    def __init__(self, name: str) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        self._text = Text
        self._name = name
        self._started = time.monotonic()
        self._live = Live(Text(f"{name}: starting"), console=Console(stderr=True), transient=False)
        self._live.start()

    def update(self, info: cpb.JobInfo, stats: cpb.CheckpointStats) -> None:
        latest = stats.latest_completed
        records = f"{latest.source_records:,}" if latest.checkpoint_id else "0"
        line = (
            f"{self._name}: {JobStatus.from_pb(info.state).value.lower()} "
            f"{time.monotonic() - self._started:5.1f}s | records {records} "
            f"(checkpoint {latest.checkpoint_id or '-'}) | checkpoints {stats.counts.completed} completed, "
            f"{stats.counts.failed} failed | restarts {info.restarts}"
        )
        self._live.update(self._text(line))

    def stop(self) -> None:
        self._live.stop()

"""Shared by the channel and exchange tests: bounded runs and numbered batches."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pyarrow as pa

from snapflow.checkpointing import BarrierOptions, CheckpointMode
from snapflow.worker.runtime.frames import DataFrame, Frame

TIMEOUT_S = 5.0
UNALIGNED = BarrierOptions(mode=CheckpointMode.UNALIGNED)


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a test coroutine, failing it after TIMEOUT_S."""

    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            await coro

    asyncio.run(bounded())


def data(i: int, rows: int = 4) -> DataFrame:
    """A batch whose keys identify it: i*1000 .. i*1000+rows-1."""
    start = i * 1000
    keys = pa.array(range(start, start + rows), pa.int64())
    return DataFrame(pa.record_batch({"key": keys, "value": keys, "timestamp": keys}))


def ident(frame: Frame | None) -> object:
    """A comparable identity: the batch number for data, the frame itself for events."""
    if isinstance(frame, DataFrame):
        return frame.batch.column(0)[0].as_py() // 1000
    return frame

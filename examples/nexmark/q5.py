"""Nexmark q5, hot items: in every sliding window of 10 s (every 2 s), the auctions with the
most bids.

    SELECT AuctionBids.auction, AuctionBids.num
    FROM (SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
          FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
          GROUP BY auction, window_start, window_end) AS AuctionBids
    JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
          FROM (... the same counts ...) AS CountBids
          GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
    ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
       AND AuctionBids.num >= MaxBids.maxn

Two steps: the bid counts per auction and window (an event-time window, keyed by auction), then,
keyed by window, the auctions of the highest count, emitted once the watermark has passed the
window's end (every count of the window has arrived by then: the first step emits a window's
counts before it forwards that watermark).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pyarrow as pa

from snapflow import (
    KeyedBatchContext,
    KeyedBatchFunction,
    SlidingEventTimeWindows,
    Stream,
    nexmark_main,
    nexmark_pipeline,
)

NAME = "q5"
INPUTS = ("bid",)
SIZE_MS, SLIDE_MS = 10_000, 2_000
SPARK_SQL = """
WITH AuctionBids AS (
  SELECT auction, count(*) AS num, window.start AS starttime, window.end AS endtime
  FROM bid GROUP BY auction, window(dateTime, '10 seconds', '2 seconds')
)
SELECT AuctionBids.auction, AuctionBids.num
FROM AuctionBids
JOIN (SELECT max(num) AS maxn, starttime, endtime FROM AuctionBids GROUP BY starttime, endtime)
  AS MaxBids
ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
   AND AuctionBids.num >= MaxBids.maxn
"""
OUTPUT = pa.schema([("auction", pa.int64()), ("num", pa.int64())])


class HotItems(KeyedBatchFunction):
    """Per window (its start): ``(highest count, auctions with it)`` in value state; a timer at
    the window's end emits them."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        best: dict[int, tuple[int, list[int]]] = {}
        for start, auction, num in zip(
            batch["window_start"].to_pylist(),
            batch["auction"].to_pylist(),
            batch["num"].to_pylist(),
            strict=True,
        ):
            top, auctions = best.get(start, (-1, []))
            if num > top:
                best[start] = (num, [auction])
            elif num == top:
                auctions.append(auction)
        state = ctx.get_value_state("best")
        starts = list(best)
        merged = []
        for start, old in zip(starts, state.get_many(starts), strict=True):
            num, auctions = best[start]
            if old is not None and old[0] > num:
                merged.append(old)
            elif old is not None and old[0] == num:
                merged.append((num, (*old[1], *auctions)))
            else:
                merged.append((num, tuple(auctions)))
        state.update_many(starts, merged)
        ctx.register_event_time_timers(starts, [s + SIZE_MS for s in starts])
        return None

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        state = ctx.get_value_state("best")
        starts = timers["key"].to_pylist()
        rows = [
            (auction, entry[0])
            for entry in state.get_many(starts)
            if entry is not None
            for auction in entry[1]
        ]
        state.update_many(starts, [None] * len(starts))
        if not rows:
            return None
        auction, num = zip(*rows, strict=True)
        return pa.RecordBatch.from_arrays(
            [pa.array(auction, pa.int64()), pa.array(num, pa.int64())], schema=OUTPUT
        )


def query(bid: Stream) -> Stream:
    counts = bid.key_by("auction").window(
        SlidingEventTimeWindows(SIZE_MS, SLIDE_MS), "dateTime", agg="count", output_field="num"
    )
    return counts.key_by("window_start").process_batches(HotItems(), name="q5")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

"""Nexmark q7, highest bid: the bids of the highest price in each 10-second tumbling window
(the window's bids and a bid made exactly at its end, as the BETWEEN says).

    SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra
    FROM bid B
    JOIN (SELECT MAX(price) AS maxprice, window_end AS dateTime
          FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
          GROUP BY window_start, window_end) B1
    ON B.price = B1.maxprice
    WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime

(Nexmark's sink takes the columns by position, so its ``bidder`` column gets the price; here
the columns keep their names.) Keyed by window: the highest price so far and the bids that may
still be the highest; a timer at the window's end emits those of the highest price.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import KeyedBatchContext, KeyedBatchFunction, Stream, nexmark_main, nexmark_pipeline

NAME = "q7"
INPUTS = ("bid",)
SIZE_MS = 10_000
SPARK_SQL = """
SELECT B.auction, B.bidder, B.price, unix_millis(B.dateTime) AS dateTime, B.extra
FROM bid B
JOIN (SELECT MAX(price) AS maxprice, window.end AS dateTime
      FROM bid GROUP BY window(dateTime, '10 seconds')) B1
ON B.price = B1.maxprice
WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL 10 SECONDS AND B1.dateTime
"""
COLUMNS = ["auction", "bidder", "price", "dateTime", "extra"]
OUTPUT = pa.schema(
    [("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
     ("dateTime", pa.int64()), ("extra", pa.string())]
)  # fmt: skip


def assign(b: pa.RecordBatch) -> pa.Table:
    """Each bid with the end of its window (``member``), and a bid made exactly at a window's
    start once more with the previous window's end (not a member: it does not count for that
    window's maximum, but it may be one of its highest bids)."""
    bids = pa.table(b).select(COLUMNS)
    start = pc.subtract(bids["dateTime"], pc.modulo(bids["dateTime"], SIZE_MS))
    members = bids.append_column("window_end", pc.add(start, SIZE_MS)).append_column(
        "member", pa.array([True] * len(bids), pa.bool_())
    )
    edge = bids.filter(pc.equal(pc.modulo(bids["dateTime"], SIZE_MS), 0))
    edges = edge.append_column("window_end", edge["dateTime"]).append_column(
        "member", pa.array([False] * len(edge), pa.bool_())
    )
    return pa.concat_tables([members, edges])


class HighestBids(KeyedBatchFunction):
    """Per window end: ``(highest member price, bids priced at least that)`` in value state."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        state = ctx.get_value_state("highest")
        table = pa.table(batch)
        ends = pc.unique(table["window_end"]).to_pylist()
        updated = []
        for end, old in zip(ends, state.get_many(ends), strict=True):
            rows = table.filter(pc.equal(table["window_end"], end))
            members = rows.filter(rows["member"])
            top = max(old[0] if old else -1, pc.max(members["price"]).as_py() or -1)
            best = rows.filter(pc.greater_equal(rows["price"], top)).select(COLUMNS).to_pylist()
            kept = [r for r in (old[1] if old else ()) if r["price"] >= top]
            updated.append((top, tuple(kept + best)))
        state.update_many(ends, updated)
        ctx.register_event_time_timers(ends, ends)
        return None

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        state = ctx.get_value_state("highest")
        ends = timers["key"].to_pylist()
        rows = [
            row
            for entry in state.get_many(ends)
            if entry is not None
            for row in entry[1]
            if row["price"] == entry[0]
        ]
        state.update_many(ends, [None] * len(ends))
        return pa.RecordBatch.from_pylist(rows, schema=OUTPUT) if rows else None


def query(bid: Stream) -> Stream:
    windows = bid.map_batches(assign, name="window")
    return windows.key_by("window_end").process_batches(HighestBids(), name="q7")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

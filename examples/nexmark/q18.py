"""Nexmark q18, deduplication: the last bid of each bidder on each auction.

    SELECT auction, bidder, price, channel, url, dateTime, extra
    FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC)
          AS rank_number FROM bid)
    WHERE rank_number <= 1

An updating result, as Flink's (which retracts the previous last bid): each batch emits, per
(bidder, auction) it touched, its newest bid if no newer one was emitted before, with the
pair's bids so far (``bids_seen``, the ``VERSION``: a pair's final row is its last one). Of two
bids in the same millisecond the later one wins, where ROW_NUMBER would pick either, so the
comparison with batch SQL is on ``auction``, ``bidder`` and ``dateTime`` (``COMPARE``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapflow import KeyedBatchContext, KeyedBatchFunction, Stream, nexmark_main, nexmark_pipeline

NAME = "q18"
INPUTS = ("bid",)
RESULT_KEY = ("bidder", "auction")
VERSION = "bids_seen"
COMPARE = ["auction", "bidder", "dateTime"]
COLUMNS = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"]
SPARK_SQL = """
SELECT auction, bidder, price, channel, url, unix_millis(dateTime) AS dateTime, extra
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC)
      AS rank_number FROM bid)
WHERE rank_number <= 1
"""


def with_pair(b: pa.RecordBatch) -> pa.RecordBatch:
    """The pair as one int64 key: ids stay far below 2**31."""
    return b.append_column("pair", pc.add(pc.multiply(b["bidder"], 1 << 32), b["auction"]))


class LastBid(KeyedBatchFunction):
    """Per pair, ``(time of the newest bid emitted, bids seen)`` (value state)."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        # The newest bid of each pair in the batch: sort by pair and time, keep each run's last.
        t = pa.table(batch).append_column("row", pa.array(range(batch.num_rows), pa.int64()))
        t = t.sort_by([("pair", "ascending"), ("dateTime", "ascending"), ("row", "ascending")])
        pair = t["pair"].combine_chunks()
        last = pc.not_equal(pair.slice(0, len(pair) - 1), pair.slice(1))
        ends = pa.concat_arrays([last, pa.array([True])])
        # A pair's bids in the batch: the distance between the ends of consecutive runs.
        at = np.flatnonzero(ends.to_numpy(zero_copy_only=False))
        counts = np.diff(at, prepend=-1).tolist()
        newest = t.filter(ends)
        state = ctx.get_value_state("newest")
        keys = newest["pair"].combine_chunks()
        times = newest["dateTime"].to_pylist()
        olds = [o if o is not None else (None, 0) for o in state.get_many(keys)]
        keep = [o is None or time >= o for (o, _), time in zip(olds, times, strict=True)]
        seen = [n + c for (_, n), c in zip(olds, counts, strict=True)]
        state.update_many(
            keys,
            [
                (time if o is None else max(time, o), n)
                for (o, _), time, n in zip(olds, times, seen, strict=True)
            ],
        )
        rows = newest.select(COLUMNS).append_column("bids_seen", pa.array(seen, pa.int64()))
        return rows.filter(pa.array(keep, pa.bool_()))


def query(bid: Stream) -> Stream:
    return (
        bid.map_batches(with_pair, name="pair")
        .key_by("pair")
        .process_batches(LastBid(), name="q18")
    )


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

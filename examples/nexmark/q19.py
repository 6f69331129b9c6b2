"""Nexmark q19, top-N: the 10 highest bids of each auction.

    SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC)
                   AS rank_number FROM bid)
    WHERE rank_number <= 10

An updating result: each batch emits the new top 10 of every auction it touched, numbered 1..10,
with ``bids_seen`` (the auction's bids so far) as the version; an auction's final rows are those
of its highest version. Bids of equal price may rank either way (as with ROW_NUMBER), so the
comparison with batch SQL is on ``auction``, ``rank_number`` and ``price`` (``COMPARE``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapflow import KeyedBatchContext, KeyedBatchFunction, Stream, nexmark_main, nexmark_pipeline

NAME = "q19"
INPUTS = ("bid",)
RESULT_KEY = ("auction",)
VERSION = "bids_seen"
COMPARE = ["auction", "rank_number", "price"]
TOP = 10
COLUMNS = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"]
SPARK_SQL = """
SELECT auction, bidder, price, channel, url, unix_millis(dateTime) AS dateTime, extra, rank_number
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
      FROM bid)
WHERE rank_number <= 10
"""
OUTPUT = pa.schema(
    [
        ("auction", pa.int64()),
        ("bidder", pa.int64()),
        ("price", pa.int64()),
        ("channel", pa.string()),
        ("url", pa.string()),
        ("dateTime", pa.int64()),
        ("extra", pa.string()),
        ("rank_number", pa.int64()),
        ("bids_seen", pa.int64()),
    ]
)


class TopBids(KeyedBatchFunction):
    """Per auction ``(bids_seen, top)`` in value state, ``top`` its 10 best bids as tuples
    ``(price, *COLUMNS)`` in descending price (a new bid ranks after an equal older one)."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        t = pa.table(batch).select(COLUMNS)
        counts = t.group_by("auction", use_threads=False).aggregate([("price", "count")])
        # Only a batch's 10 best bids per auction can enter its top 10.
        t = t.sort_by([("auction", "ascending"), ("price", "descending")])
        auction = t["auction"].combine_chunks()
        starts = pc.not_equal(auction.slice(1), auction.slice(0, len(auction) - 1))
        run_start = pa.concat_arrays([pa.array([True]), starts]).to_numpy(zero_copy_only=False)
        index = np.arange(len(auction))
        rank_in_batch = index - np.maximum.accumulate(np.where(run_start, index, 0))
        best = t.filter(pa.array(rank_in_batch < TOP))
        candidates: dict[int, list[tuple[Any, ...]]] = {}
        for row in zip(*(best[c].to_pylist() for c in COLUMNS), strict=True):
            candidates.setdefault(row[0], []).append(row)
        state = ctx.get_value_state("top")
        keys = counts["auction"].to_pylist()
        old = state.get_many(keys)
        new = []
        out: list[tuple[Any, ...]] = []
        for key, n, previous in zip(keys, counts["price_count"].to_pylist(), old, strict=True):
            seen, top = previous if previous is not None else (0, ())
            merged = sorted([*top, *candidates[key]], key=lambda r: -r[2])[:TOP]  # stable
            new.append((seen + n, tuple(merged)))
            out.extend((*r, rank, seen + n) for rank, r in enumerate(merged, start=1))
        state.update_many(keys, new)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(list(c), f.type)
                for c, f in zip(zip(*out, strict=True), OUTPUT, strict=True)
            ],
            schema=OUTPUT,
        )


def query(bid: Stream) -> Stream:
    return bid.key_by("auction").process_batches(TopBids(), name="q19")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

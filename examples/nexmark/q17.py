"""Nexmark q17, an unbounded aggregate: per auction and day, how many bids in each price rank
and the minimum, maximum, average and sum of the prices.

    SELECT auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS day, count(*) AS total_bids,
           count(*) FILTER (WHERE price < 10000) AS rank1_bids,
           count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
           count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
           min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price,
           sum(price) AS sum_price
    FROM bid GROUP BY auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd')

An updating result, as in Flink: each input batch emits the new totals of the groups it
touched; a group's final row is its last, the one with the most bids (``VERSION``). Each batch
is pre-aggregated per group with Arrow, then merged into the keyed state per group.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import KeyedBatchContext, KeyedBatchFunction, Stream, nexmark_main, nexmark_pipeline

# bid_statistics.py lies beside this file: importable also when the file is loaded by path
sys.path.append(str(Path(__file__).resolve().parent))
from bid_statistics import day_of, ranks

NAME = "q17"
INPUTS = ("bid",)
RESULT_KEY = ("auction", "day")
VERSION = "total_bids"
SPARK_SQL = """
SELECT auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS day, count(*) AS total_bids,
       count(*) FILTER (WHERE price < 10000) AS rank1_bids,
       count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       min(price) AS min_price, max(price) AS max_price,
       CAST(avg(price) AS BIGINT) AS avg_price, sum(price) AS sum_price
FROM bid GROUP BY auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd')
"""
OUTPUT = pa.schema(
    [("auction", pa.int64()), ("day", pa.string())]
    + [
        (c, pa.int64())
        for c in (
            "total_bids",
            "rank1_bids",
            "rank2_bids",
            "rank3_bids",
            "min_price",
            "max_price",
            "avg_price",
            "sum_price",
        )
    ]
)


def with_group(b: pa.RecordBatch) -> pa.RecordBatch:
    """The group key as one column: ``auction | day``."""
    day = day_of(b["dateTime"])
    group = pc.binary_join_element_wise(b["auction"].cast(pa.string()), day, "|")
    r1, r2, r3 = ranks(b["price"])
    return pa.RecordBatch.from_arrays(
        [
            group,
            b["auction"],
            day,
            b["price"],
            r1.cast(pa.int64()),
            r2.cast(pa.int64()),
            r3.cast(pa.int64()),
        ],
        names=["group", "auction", "day", "price", "r1", "r2", "r3"],
    )


class AuctionDayStats(KeyedBatchFunction):
    """Per group the tuple ``(count, r1, r2, r3, min, max, sum)`` in value state."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        partial = (
            pa.table(batch)
            .group_by(["group", "auction", "day"], use_threads=False)
            .aggregate(
                [
                    ("price", "count"),
                    ("r1", "sum"),
                    ("r2", "sum"),
                    ("r3", "sum"),
                    ("price", "min"),
                    ("price", "max"),
                    ("price", "sum"),
                ]
            )
        )
        state = ctx.get_value_state("stats")
        keys = partial["group"].combine_chunks()
        old = state.get_many(keys)
        rows = zip(*(partial[c].to_pylist() for c in partial.column_names[3:]), strict=True)
        new = [
            (n, a, b, c, lo, hi, s)
            if o is None
            else (o[0] + n, o[1] + a, o[2] + b, o[3] + c, min(o[4], lo), max(o[5], hi), o[6] + s)
            for o, (n, a, b, c, lo, hi, s) in zip(old, rows, strict=True)
        ]
        state.update_many(keys, new)
        columns = list(zip(*new, strict=True))
        return pa.RecordBatch.from_arrays(
            [
                partial["auction"].combine_chunks(),
                partial["day"].combine_chunks(),
                *(pa.array(c, pa.int64()) for c in columns[:6]),
                pa.array([s // n for n, s in zip(columns[0], columns[6], strict=True)], pa.int64()),
                pa.array(columns[6], pa.int64()),
            ],
            schema=OUTPUT,
        )


def query(bid: Stream) -> Stream:
    return (
        bid.map_batches(with_group, name="group")
        .key_by("group")
        .process_batches(AuctionDayStats(), name="q17")
    )


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

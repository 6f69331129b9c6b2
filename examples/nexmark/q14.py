"""Nexmark q14, a user-defined function with a filter and conversions: bids between 1 M and 50 M
euros, with the part of the day they were made in and how many 'c' their ``extra`` holds.

    SELECT auction, bidder, 0.908 * price AS price,
           CASE WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime'
                WHEN HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime'
                ELSE 'otherTime' END AS bidTimeType,
           dateTime, extra, count_char(extra, 'c') AS c_counts
    FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000

Hours are UTC. ``count_char`` is Nexmark's Java UDF; here it is a Python function over a batch.
"""

from __future__ import annotations

from decimal import Decimal
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q14"
INPUTS = ("bid",)
SPARK_SQL = """
SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price,
       CASE WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime'
            WHEN HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime'
            ELSE 'otherTime' END AS bidTimeType,
       unix_millis(dateTime) AS dateTime, extra,
       CAST(length(extra) - length(replace(extra, 'c', '')) AS BIGINT) AS c_counts
FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
"""
DAY_MS = 86_400_000
HOUR_MS = 3_600_000


def count_char(strings: pa.Array, char: str) -> pa.Array:
    """The UDF: occurrences of ``char`` in each string."""
    return pc.count_substring(strings, char).cast(pa.int64())


def q14(b: pa.RecordBatch) -> pa.RecordBatch:
    milli_euros = pc.multiply(b["price"], 908)  # 0.908 * price, times 1000: exact integers
    b = b.filter(
        pc.and_(pc.greater(milli_euros, 1_000_000_000), pc.less(milli_euros, 50_000_000_000))
    )
    hour = pc.divide(pc.modulo(b["dateTime"], DAY_MS), HOUR_MS)
    kind = pc.if_else(
        pc.and_(pc.greater_equal(hour, 8), pc.less_equal(hour, 18)),
        "dayTime",
        pc.if_else(
            pc.or_(pc.less_equal(hour, 6), pc.greater_equal(hour, 20)), "nightTime", "otherTime"
        ),
    )
    price = pc.multiply(
        b["price"].cast(pa.decimal128(19, 0)), pa.scalar(Decimal("0.908"), pa.decimal128(4, 3))
    )
    return pa.RecordBatch.from_arrays(
        [
            b["auction"],
            b["bidder"],
            price.cast(pa.decimal128(23, 3)),
            kind,
            b["dateTime"],
            b["extra"],
            count_char(b["extra"], "c"),
        ],
        names=["auction", "bidder", "price", "bidTimeType", "dateTime", "extra", "c_counts"],
    )


def query(bid: Stream) -> Stream:
    return bid.map_batches(q14, name="q14")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

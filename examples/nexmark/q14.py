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

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink

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


def build(
    num_events: int, output: str, parallelism: int = 2, config: NexmarkConfig | None = None
) -> Pipeline:
    """The query over the first ``num_events`` Nexmark events, into exactly-once files."""
    p = Pipeline(f"nexmark-{NAME}", parallelism=parallelism)
    inputs = {k: p.source(NexmarkSource(k, num_events, config=config), name=k) for k in INPUTS}
    query(**inputs).sink(TransactionalFileSink(output))
    p.checkpointing(interval_ms=1000)
    return p


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="Nexmark events (all kinds)")
    parser.add_argument("--output", required=True, help="output directory (Arrow IPC part files)")
    args = parser.parse_args()
    build(args.events, args.output).execute()


if __name__ == "__main__":
    main()

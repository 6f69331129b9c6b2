"""Nexmark q1, currency conversion: every bid's price in euros (0.908 per dollar).

    SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid

``price`` is a DECIMAL(23, 3), as in the Nexmark table: the product is exact.
"""

from __future__ import annotations

from decimal import Decimal
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q1"
INPUTS = ("bid",)
SPARK_SQL = """
SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price,
       unix_millis(dateTime) AS dateTime, extra
FROM bid
"""
EURO = pa.scalar(Decimal("0.908"), pa.decimal128(4, 3))
PRICE = pa.decimal128(23, 3)


def to_euro(b: pa.RecordBatch) -> pa.RecordBatch:
    price = pc.multiply(b["price"].cast(pa.decimal128(19, 0)), EURO)
    return pa.RecordBatch.from_arrays(
        [b["auction"], b["bidder"], price.cast(PRICE), b["dateTime"], b["extra"]],
        names=["auction", "bidder", "price", "dateTime", "extra"],
    )


def query(bid: Stream) -> Stream:
    return bid.map_batches(to_euro, name="q1")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

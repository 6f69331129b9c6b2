"""Nexmark q2, selection: the bids on every 123rd auction.

SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q2"
INPUTS = ("bid",)
SPARK_SQL = "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"


def select(b: pa.RecordBatch) -> pa.RecordBatch:
    keep = pc.equal(pc.modulo(b["auction"], 123), 0)
    return b.select(["auction", "price"]).filter(keep)


def query(bid: Stream) -> Stream:
    return bid.map_batches(select, name="q2")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

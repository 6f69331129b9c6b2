"""Nexmark q20, expand bid with auction: every bid with the auction it is for, for the
auctions of category 10.

    SELECT auction, bidder, price, channel, url, B.dateTime, B.extra,
           itemName, description, initialBid, reserve, A.dateTime, expires, seller, category, A.extra
    FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
    WHERE A.category = 10

The regular (unbounded) inner join of bids keyed by auction with the auctions of the category
keyed by id: every pair once, when its second row arrives (a bid may come before its auction),
so the output is append-only and equals the batch join. Every bid is kept in state for ever, as
any may meet its auction later (Flink's regular join without a state TTL does the same). The two
``dateTime`` and ``extra`` columns are named ``dateTime``/``extra`` (the bid's) and
``auction_dateTime``/``auction_extra``: one result may not hold a name twice.
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q20"
INPUTS = ("bid", "auction")
CATEGORY = 10
SPARK_SQL = """
SELECT auction, bidder, price, channel, url, unix_millis(B.dateTime) AS dateTime, B.extra AS extra,
       itemName, description, initialBid, reserve, unix_millis(A.dateTime) AS auction_dateTime,
       unix_millis(expires) AS expires, seller, category, A.extra AS auction_extra
FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
WHERE A.category = 10
"""
BID_COLUMNS = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"]
AUCTION_COLUMNS = ["itemName", "description", "initialBid", "reserve", "auction_dateTime",
                   "expires", "seller", "category", "auction_extra"]  # fmt: skip


def of_category(b: pa.RecordBatch) -> pa.RecordBatch:
    """An auction of the category, its id named as the bids' key (held once in a joined row),
    its ``dateTime`` and ``extra`` named apart from the bid's."""
    kept = b.filter(pc.equal(b["category"], CATEGORY))
    names = {"id": "auction", "dateTime": "auction_dateTime", "extra": "auction_extra"}
    return kept.rename_columns([names.get(n, n) for n in kept.schema.names])


def query(bid: Stream, auction: Stream) -> Stream:
    bids = bid.map_batches(lambda b: b.select(BID_COLUMNS), name="columns").key_by("auction")
    auctions = auction.map_batches(of_category, name="category").key_by("auction")
    return bids.join(auctions, name="q20")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

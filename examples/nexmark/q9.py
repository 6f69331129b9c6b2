"""Nexmark q9, winning bids: each auction with its highest bid made during its lifetime
(the earliest of equal highest bids).

    SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller, category,
           extra, auction, bidder, price, bid_dateTime, bid_extra
    FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime,
                 B.extra AS bid_extra,
                 ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC)
                 AS rownum
          FROM auction A, bid B
          WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
    WHERE rownum <= 1

Auctions keyed by id and bids keyed by auction, connected, with a keyed co-process function
(vectorised): per auction its row and its best bid so far in value state, and a timer at its
``expires`` that emits the winner once the watermark has passed it, when no bid of its lifetime
can still come. A bid that comes before its auction waits (``pending``) until the auction does,
or until the watermark passes the bid's time: an auction arriving later starts after it.

Why not the interval join: its bounds are two constants for every row (``between(lo, hi)``),
and an auction's lifetime is its own (``[dateTime, expires]``); the join would be exact only
with ``hi`` the longest lifetime the generator can draw (a fact of the generator, not of the
query), would keep every bid that long, and would still need this step after it to pick the
winner. Here the state is one auction and one bid per open auction.

Equal highest bids at the same millisecond: ROW_NUMBER picks one of them arbitrarily; this
picks the lowest bidder id. The tests' events have one event per millisecond (no such ties).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from snapflow import (
    KeyedCoBatchContext,
    KeyedCoBatchFunction,
    Stream,
    nexmark_main,
    nexmark_pipeline,
)

NAME = "q9"
INPUTS = ("auction", "bid")
SPARK_SQL = """
SELECT id, itemName, description, initialBid, reserve, unix_millis(dateTime) AS dateTime,
       unix_millis(expires) AS expires, seller, category, extra,
       auction, bidder, price, unix_millis(bid_dateTime) AS bid_dateTime, bid_extra
FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, B.extra AS bid_extra,
             ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) AS rownum
      FROM auction A, bid B
      WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
WHERE rownum <= 1
"""
AUCTION_COLUMNS = ["id", "itemName", "description", "initialBid", "reserve", "dateTime",
                   "expires", "seller", "category", "extra"]  # fmt: skip
BID_COLUMNS = ["auction", "bidder", "price", "bid_dateTime", "bid_extra"]
START, EXPIRES = AUCTION_COLUMNS.index("dateTime"), AUCTION_COLUMNS.index("expires")
BIDDER, PRICE, TIME = 1, 2, 3  # in a bid row (BID_COLUMNS)
_I64, _STR = pa.int64(), pa.string()
OUTPUT = pa.schema(
    [(c, _STR if c in ("itemName", "description", "extra", "bid_extra") else _I64)
     for c in AUCTION_COLUMNS + BID_COLUMNS]
)  # fmt: skip


def rank(bid: tuple[Any, ...]) -> tuple[int, int, int]:
    """Higher is better: the price, then the earlier time, then the lower bidder id."""
    return bid[PRICE], -bid[TIME], -bid[BIDDER]


def rows(table: pa.Table | pa.RecordBatch, columns: list[str]) -> list[tuple[Any, ...]]:
    return list(zip(*(table[c].to_pylist() for c in columns), strict=True))


def best_per_auction(bids: pa.Table) -> list[tuple[Any, ...]]:
    """The best bid (:func:`rank`) of each auction among ``bids``."""
    order = pc.sort_indices(
        bids,
        [("auction", "ascending"), ("price", "descending"), ("bid_dateTime", "ascending"),
         ("bidder", "ascending")],
    )  # fmt: skip
    ordered = bids.take(order)
    a = ordered["auction"].to_numpy()
    first = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    return rows(ordered.take(first), BID_COLUMNS)


class WinningBids(KeyedCoBatchFunction):
    """Input 0 auctions (keyed by id), input 1 bids (keyed by auction). Value states per
    auction: ``auction`` (its row), ``best`` (its best bid of its lifetime so far) and
    ``pending`` (bids that came before it)."""

    def process_batch1(self, batch: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        auctions = rows(batch, AUCTION_COLUMNS)
        ids = [a[0] for a in auctions]
        ctx.get_value_state("auction").update_many(ids, auctions)
        ctx.register_event_time_timers(ids, [a[EXPIRES] for a in auctions])
        pending = ctx.get_value_state("pending")
        waited = [
            (k, a, p) for k, a, p in zip(ids, auctions, pending.get_many(ids), strict=True) if p
        ]
        if waited:
            pending.update_many([k for k, _, _ in waited], [None] * len(waited))
            best = [
                (k, max(valid, key=rank))
                for k, a, p in waited
                if (valid := [b for b in p if a[START] <= b[TIME] <= a[EXPIRES]])
            ]
            ctx.get_value_state("best").update_many([k for k, _ in best], [b for _, b in best])
        return None

    def process_batch2(self, batch: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        bids = pa.table(batch.select(["auction", "bidder", "price", "dateTime", "extra"]))
        bids = bids.rename_columns(BID_COLUMNS)
        keys, inverse = np.unique(bids["auction"].to_numpy(), return_inverse=True)
        auctions = ctx.get_value_state("auction").get_many(keys.tolist())
        known = np.array([a is not None for a in auctions])
        start = np.array([a[START] if a else 0 for a in auctions], np.int64)[inverse]
        end = np.array([a[EXPIRES] if a else -1 for a in auctions], np.int64)[inverse]
        t = bids["bid_dateTime"].to_numpy()
        valid = bids.filter(pa.array((start <= t) & (t <= end)))
        if valid.num_rows:
            best = ctx.get_value_state("best")
            candidates = best_per_auction(valid)
            ids = [b[0] for b in candidates]
            updated = [
                (k, new)
                for k, new, old in zip(ids, candidates, best.get_many(ids), strict=True)
                if old is None or rank(new) > rank(old)
            ]
            best.update_many([k for k, _ in updated], [b for _, b in updated])
        early = bids.filter(pa.array(~known[inverse]))
        if early.num_rows:
            waiting: dict[int, list[tuple[Any, ...]]] = {}
            for b in rows(early, BID_COLUMNS):
                waiting.setdefault(b[0], []).append(b)
            pending = ctx.get_value_state("pending")
            ids = list(waiting)
            before = pending.get_many(ids)
            pending.update_many(
                ids, [(*(p or ()), *waiting[k]) for k, p in zip(ids, before, strict=True)]
            )
            ctx.register_event_time_timers(ids, [max(b[TIME] for b in waiting[k]) for k in ids])
        return None

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        due: dict[int, int] = {}
        for k, t in zip(timers["key"].to_pylist(), timers["timestamp"].to_pylist(), strict=True):
            due[k] = max(t, due.get(k, t))
        ids = list(due)
        auction, best, pending = (ctx.get_value_state(n) for n in ("auction", "best", "pending"))
        out, closed, pruned = [], [], []
        for k, a, b, p in zip(
            ids, auction.get_many(ids), best.get_many(ids), pending.get_many(ids), strict=True
        ):
            if a is not None and a[EXPIRES] <= due[k]:
                closed.append(k)
                if b is not None:
                    out.append((*a, *b))
            if p:  # the auction did not come: drop what it can no longer win
                pruned.append((k, tuple(x for x in p if x[TIME] > due[k]) or None))
        auction.update_many(closed, [None] * len(closed))
        best.update_many(closed, [None] * len(closed))
        pending.update_many([k for k, _ in pruned], [p for _, p in pruned])
        if not out:
            return None
        return pa.RecordBatch.from_arrays(
            [pa.array(c, f.type) for c, f in zip(zip(*out, strict=True), OUTPUT, strict=True)],
            schema=OUTPUT,
        )


def query(auction: Stream, bid: Stream) -> Stream:
    auctions = auction.key_by("id")
    bids = bid.key_by("auction")
    return auctions.connect(bids).process_batches(WinningBids(), name="q9")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

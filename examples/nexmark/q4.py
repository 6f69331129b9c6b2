"""Nexmark q4, average price per category: the average winning price of the closed auctions of
each category.

    SELECT Q.category, AVG(Q.final)
    FROM (SELECT MAX(B.price) AS final, A.category
          FROM auction A, bid B
          WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
          GROUP BY A.id, A.category) Q
    GROUP BY Q.category

Two steps. The winning price of each auction (as q9 finds its winning bid): auctions keyed by
id connected with bids keyed by auction, a keyed co-process function keeping per auction its
category and lifetime and its highest price so far, and a timer at its ``expires`` that emits
``(id, category, final)`` once no bid of its lifetime can still come (an auction without a bid
in it emits nothing, as the inner join drops it). Then, keyed by category, the running sum and
count of those prices: an updating result, each batch emitting the new average of the
categories it touched, with ``auctions`` (the count) as the version; a category's final row is
the one of the most auctions. The average is the sum over the count, as Spark's: its sum of
prices is exact in a double at these magnitudes, so the two divisions give the same double.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from snapflow import (
    KeyedBatchContext,
    KeyedBatchFunction,
    KeyedCoBatchContext,
    KeyedCoBatchFunction,
    Stream,
    nexmark_main,
    nexmark_pipeline,
)

NAME = "q4"
INPUTS = ("auction", "bid")
RESULT_KEY = ("category",)
VERSION = "auctions"
SPARK_SQL = """
SELECT Q.category, AVG(Q.final) AS average
FROM (SELECT MAX(B.price) AS final, A.category
      FROM auction A, bid B
      WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
      GROUP BY A.id, A.category) Q
GROUP BY Q.category
"""
FINALS = pa.schema([("id", pa.int64()), ("category", pa.int64()), ("final", pa.int64())])
OUTPUT = pa.schema([("category", pa.int64()), ("average", pa.float64()), ("auctions", pa.int64())])


class WinningPrices(KeyedCoBatchFunction):
    """Input 0 auctions (keyed by id), input 1 bids (keyed by auction). Value states per
    auction: ``auction`` ``(category, dateTime, expires)``, ``best`` (its highest price in its
    lifetime so far) and ``pending`` (``(price, dateTime)`` of bids that came before it)."""

    def process_batch1(self, batch: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        ids = batch["id"].to_pylist()
        auctions = list(
            zip(*(batch[c].to_pylist() for c in ("category", "dateTime", "expires")), strict=True)
        )
        ctx.get_value_state("auction").update_many(ids, auctions)
        ctx.register_event_time_timers(ids, [a[2] for a in auctions])
        pending = ctx.get_value_state("pending")
        waited = [
            (k, a, p) for k, a, p in zip(ids, auctions, pending.get_many(ids), strict=True) if p
        ]
        if waited:
            pending.update_many([k for k, _, _ in waited], [None] * len(waited))
            best = [
                (k, max(valid))
                for k, a, p in waited
                if (valid := [price for price, t in p if a[1] <= t <= a[2]])
            ]
            ctx.get_value_state("best").update_many([k for k, _ in best], [b for _, b in best])
        return None

    def process_batch2(self, batch: pa.RecordBatch, ctx: KeyedCoBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        keys, inverse = np.unique(batch["auction"].to_numpy(), return_inverse=True)
        auctions = ctx.get_value_state("auction").get_many(keys.tolist())
        known = np.array([a is not None for a in auctions])[inverse]
        start = np.array([a[1] if a else 0 for a in auctions], np.int64)[inverse]
        end = np.array([a[2] if a else -1 for a in auctions], np.int64)[inverse]
        t = batch["dateTime"].to_numpy()
        price = batch["price"].to_numpy()
        valid = (start <= t) & (t <= end)
        if valid.any():
            highest = np.full(len(keys), -1, np.int64)
            np.maximum.at(highest, inverse[valid], price[valid])
            touched = np.flatnonzero(highest >= 0)
            ids = keys[touched].tolist()
            best = ctx.get_value_state("best")
            new = highest[touched].tolist()
            best.update_many(
                ids, [max(n, o or -1) for n, o in zip(new, best.get_many(ids), strict=True)]
            )
        if not known.all():
            early = ~known
            waiting: dict[int, list[tuple[int, int]]] = {}
            for k, p, ts in zip(
                batch["auction"].to_numpy()[early].tolist(),
                price[early].tolist(),
                t[early].tolist(),
                strict=True,
            ):
                waiting.setdefault(k, []).append((p, ts))
            pending = ctx.get_value_state("pending")
            ids = list(waiting)
            before = pending.get_many(ids)
            pending.update_many(
                ids, [(*(p or ()), *waiting[k]) for k, p in zip(ids, before, strict=True)]
            )
            ctx.register_event_time_timers(ids, [max(ts for _, ts in waiting[k]) for k in ids])
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
            if a is not None and a[2] <= due[k]:
                closed.append(k)
                if b is not None:
                    out.append((k, a[0], b))
            if p:  # the auction did not come: drop what it can no longer win
                pruned.append((k, tuple(x for x in p if x[1] > due[k]) or None))
        auction.update_many(closed, [None] * len(closed))
        best.update_many(closed, [None] * len(closed))
        pending.update_many([k for k, _ in pruned], [p for _, p in pruned])
        if not out:
            return None
        return pa.RecordBatch.from_arrays(
            [pa.array(c, pa.int64()) for c in zip(*out, strict=True)], schema=FINALS
        )


class CategoryAverage(KeyedBatchFunction):
    """Per category ``(sum, count)`` of the winning prices; emits the touched categories'
    averages."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        keys, inverse = np.unique(batch["category"].to_numpy(), return_inverse=True)
        sums = np.zeros(len(keys), np.int64)
        np.add.at(sums, inverse, batch["final"].to_numpy())
        counts = np.bincount(inverse, minlength=len(keys))
        state = ctx.get_value_state("sum_count")
        categories = keys.tolist()
        totals = [
            (s + (old[0] if old else 0), n + (old[1] if old else 0))
            for s, n, old in zip(
                sums.tolist(), counts.tolist(), state.get_many(categories), strict=True
            )
        ]
        state.update_many(categories, totals)
        return pa.RecordBatch.from_arrays(
            [
                pa.array(categories, pa.int64()),
                pa.array([s / n for s, n in totals], pa.float64()),
                pa.array([n for _, n in totals], pa.int64()),
            ],
            schema=OUTPUT,
        )


def query(auction: Stream, bid: Stream) -> Stream:
    finals = auction.key_by("id").connect(bid.key_by("auction"))
    winning = finals.process_batches(WinningPrices(), name="winning")
    return winning.key_by("category").process_batches(CategoryAverage(), name="q4")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

"""Bid statistics per group, shared by q15, q16 and q17: Nexmark's three price ranks, the day
of a bid, and the distinct-count aggregation of q15 and q16 (per group: bids, distinct bidders
and distinct auctions, overall and per rank, and the latest time of day seen).

The query files import this module from their own folder (they put it on ``sys.path`` when
they are loaded by path, as tests/nexmark does). The executors cannot import it, so it ships
its functions by value, as the query files' own are.
"""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle

from snapflow import AggregateFunction, KeyedBatchContext, KeyedBatchFunction

cloudpickle.register_pickle_by_value(sys.modules[__name__])

COUNTS = [
    f"{c}_{what}"
    for what in ("bids", "bidders", "auctions")
    for c in ("total", "rank1", "rank2", "rank3")
]
"""The result columns of the distinct-count aggregation, in the order of :func:`count_columns`."""


def ranks(price: pa.Array) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Nexmark's three price ranks: below 10,000, below 1,000,000, the rest."""
    r1 = pc.less(price, 10_000)
    r3 = pc.greater_equal(price, 1_000_000)
    return r1, pc.invert(pc.or_(r1, r3)), r3


def day_of(date_time: pa.Array) -> pa.Array:
    """``DATE_FORMAT(dateTime, 'yyyy-MM-dd')`` in UTC."""
    return pc.strftime(date_time.cast(pa.timestamp("ms")), format="%Y-%m-%d")


def new_stats() -> dict[str, Any]:
    """A group's accumulator: bid counts (all, per rank), the latest time of day seen, and the
    distinct bidders and auctions (all, per rank) as sets, mutated in place, which aggregating
    state allows (it copies an accumulator before its first change after a checkpoint)."""
    return {
        "bids": [0, 0, 0, 0],
        "ms_of_day": -1,
        "bidders": [set(), set(), set(), set()],
        "auctions": [set(), set(), set(), set()],
    }


def merge(part: dict[str, Any], acc: dict[str, Any]) -> dict[str, Any]:
    for i in range(4):
        acc["bids"][i] += part["bids"][i]
        acc["bidders"][i].update(part["bidders"][i])
        acc["auctions"][i].update(part["auctions"][i])
    acc["ms_of_day"] = max(acc["ms_of_day"], part["ms_of_day"])
    return acc


STATS = AggregateFunction.of(new_stats, merge, lambda acc: acc)


def partials(batch: pa.RecordBatch) -> tuple[list[Any], list[dict[str, Any]]]:
    """Per group of the batch: bid counts, distinct bidders and auctions per rank (0: all)."""
    r1, r2, _ = ranks(batch["price"])
    rank = pc.if_else(r1, 1, pc.if_else(r2, 2, 3))
    t = pa.table(
        {
            "group": batch["group"],
            "rank": rank,
            "bidder": batch["bidder"],
            "auction": batch["auction"],
            "ms": pc.modulo(batch["dateTime"], 86_400_000),
        }
    )
    parts: dict[Any, dict[str, Any]] = {}
    counts = t.group_by(["group", "rank"], use_threads=False).aggregate(
        [("bidder", "count"), ("ms", "max")]
    )
    for g, r, n, ms in zip(*(counts[c].to_pylist() for c in counts.column_names), strict=True):
        part = parts.setdefault(
            g,
            {
                "bids": [0, 0, 0, 0],
                "ms_of_day": -1,
                "bidders": [[], [], [], []],
                "auctions": [[], [], [], []],
            },
        )
        part["bids"][0] += n
        part["bids"][r] += n
        part["ms_of_day"] = max(part["ms_of_day"], ms)
    for field in ("bidder", "auction"):
        pairs = t.group_by(["group", "rank", field], use_threads=False).aggregate([])
        for g, r, v in zip(*(pairs[c].to_pylist() for c in pairs.column_names), strict=True):
            lists = parts[g][field + "s"]
            lists[0].append(v)
            lists[r].append(v)
    return list(parts), list(parts.values())


class DistinctCounts(KeyedBatchFunction):
    """The distinct-count aggregation, keyed by the batches' ``group`` column: each batch
    updates its groups' accumulators (aggregating state ``stats``) and emits the rows that
    :meth:`rows` makes of their new figures."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        groups, parts = partials(batch)
        state = ctx.get_aggregating_state("stats", STATS)
        state.add_many(groups, parts)
        return self.rows(groups, [acc for acc in state.get_many(groups) if acc is not None])

    def rows(self, groups: list[Any], accs: list[dict[str, Any]]) -> pa.RecordBatch:
        """The result rows of ``groups`` from their accumulators (see :func:`count_columns`)."""
        raise NotImplementedError


def count_columns(accs: list[dict[str, Any]]) -> list[pa.Array]:
    """The accumulators' figures as the int64 columns of :data:`COUNTS`."""
    rows = [[*acc["bids"], *map(len, acc["bidders"]), *map(len, acc["auctions"])] for acc in accs]
    return [pa.array(c, pa.int64()) for c in zip(*rows, strict=True)]

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

from snapflow import KeyedBatchContext, KeyedBatchFunction

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
    """A group's figures: bid counts (all, per rank), the latest time of day seen, and the
    numbers of distinct bidders and auctions (all, per rank)."""
    return {
        "bids": [0, 0, 0, 0],
        "ms_of_day": -1,
        "bidders": [0, 0, 0, 0],
        "auctions": [0, 0, 0, 0],
    }


def ranks_seen(t: pa.Table, field: str) -> dict[tuple[Any, Any], int]:
    """Per ``(group, value of field)`` of ``t``, the ranks the value was seen in as a bit mask
    (bit ``r`` for rank ``r``)."""
    triples = t.group_by(["group", field, "rank"], use_threads=False).aggregate([])
    out: dict[tuple[Any, Any], int] = {}
    for g, v, r in zip(*(triples[c].to_pylist() for c in triples.column_names), strict=True):
        out[g, v] = out.get((g, v), 0) | (1 << r)
    return out


class DistinctCounts(KeyedBatchFunction):
    """The distinct-count aggregation, keyed by the batches' ``group`` column: each batch
    updates its groups' figures and emits the rows that :meth:`rows` makes of them.

    The distinct values are keyed state of their own, one entry per ``(group, value)`` (the
    ranks the value was seen in) in the group's key group, so it moves with the group when
    rescaling: the bulk form of Flink's planner keeping a ``COUNT(DISTINCT)`` in a ``MapState``
    under the group key. A checkpoint then writes only the values new since the last one (with
    RocksDB), where a set in an accumulator was copied and written whole every time; a batch
    looks all its values up in one ``get_many`` per field, and the counts move by the values
    and ranks it saw first."""

    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        r1, r2, _ = ranks(batch["price"])
        t = pa.table(
            {
                "group": batch["group"],
                "rank": pc.if_else(r1, 1, pc.if_else(r2, 2, 3)),
                "bidder": batch["bidder"],
                "auction": batch["auction"],
                "ms": pc.modulo(batch["dateTime"], 86_400_000),
            }
        )
        counts = t.group_by(["group", "rank"], use_threads=False).aggregate(
            [("bidder", "count"), ("ms", "max")]
        )
        groups = list(dict.fromkeys(counts["group"].to_pylist()))
        group_kg = dict(zip(groups, ctx.key_groups_of(groups).to_pylist(), strict=True))
        state = ctx.get_value_state("stats")
        # fresh dicts and lists: the state may still hold the old ones for a snapshot in flight
        stats = {
            g: {k: list(v) if isinstance(v, list) else v for k, v in (s or new_stats()).items()}
            for g, s in zip(groups, state.get_many(groups), strict=True)
        }
        for g, r, n, ms in zip(*(counts[c].to_pylist() for c in counts.column_names), strict=True):
            s = stats[g]
            s["bids"][0] += n
            s["bids"][r] += n
            s["ms_of_day"] = max(s["ms_of_day"], ms)
        for field in ("bidder", "auction"):
            masks = ranks_seen(t, field)
            keys = list(masks)
            key_groups = [group_kg[g] for g, _ in keys]
            seen = ctx.get_value_state(f"{field}_ranks")
            changed: list[int] = []
            merged: list[int] = []
            for i, ((g, _), new, old) in enumerate(
                zip(keys, masks.values(), seen.get_many(keys, key_groups), strict=True)
            ):
                old = old or 0
                added = new & ~old
                if not added:
                    continue
                changed.append(i)
                merged.append(old | new)
                figures = stats[g][field + "s"]
                if not old:
                    figures[0] += 1
                for r in (1, 2, 3):
                    if added >> r & 1:
                        figures[r] += 1
            if changed:
                seen.update_many(
                    [keys[i] for i in changed], merged, [key_groups[i] for i in changed]
                )
        state.update_many(groups, [stats[g] for g in groups])
        return self.rows(groups, [stats[g] for g in groups])

    def rows(self, groups: list[Any], accs: list[dict[str, Any]]) -> pa.RecordBatch:
        """The result rows of ``groups`` from their figures (see :func:`count_columns`)."""
        raise NotImplementedError


def count_columns(accs: list[dict[str, Any]]) -> list[pa.Array]:
    """The accumulators' figures as the int64 columns of :data:`COUNTS`."""
    rows = [[*acc["bids"], *acc["bidders"], *acc["auctions"]] for acc in accs]
    return [pa.array(c, pa.int64()) for c in zip(*rows, strict=True)]

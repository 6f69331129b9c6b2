"""Nexmark q16, distinct counts per channel and day: as q15, per channel, with the latest
minute of the day seen.

    SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS day,
           max(DATE_FORMAT(dateTime, 'HH:mm')) AS minute,
           count(*) AS total_bids, ..., count(DISTINCT bidder) AS total_bidders, ...,
           count(DISTINCT auction) AS total_auctions, ...
    FROM bid GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd')

An updating result: a group's final row is the one with the most bids (``VERSION``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import (
    AggregateFunction,
    KeyedBatchContext,
    KeyedBatchFunction,
    NexmarkConfig,
    NexmarkSource,
    Pipeline,
    Stream,
    TransactionalFileSink,
)


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


def figures(acc: dict[str, Any]) -> list[int]:
    return [*acc["bids"], *map(len, acc["bidders"]), *map(len, acc["auctions"])]


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


NAME = "q16"
INPUTS = ("bid",)
RESULT_KEY = ("channel", "day")
VERSION = "total_bids"
SPARK_SQL = """
SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS day,
       max(DATE_FORMAT(dateTime, 'HH:mm')) AS minute,
       count(*) AS total_bids,
       count(*) FILTER (WHERE price < 10000) AS rank1_bids,
       count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
       count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
       count(DISTINCT bidder) AS total_bidders,
       count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
       count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
       count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
       count(DISTINCT auction) AS total_auctions,
       count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
       count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
       count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions
FROM bid GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd')
"""
COUNTS = [
    f"{c}_{what}"
    for what in ("bids", "bidders", "auctions")
    for c in ("total", "rank1", "rank2", "rank3")
]
OUTPUT = pa.schema(
    [("channel", pa.string()), ("day", pa.string()), ("minute", pa.string())]
    + [(c, pa.int64()) for c in COUNTS]
)
SEPARATOR = "|"  # channel names hold no '|'


def with_group(b: pa.RecordBatch) -> pa.RecordBatch:
    group = pc.binary_join_element_wise(b["channel"], day_of(b["dateTime"]), SEPARATOR)
    return b.append_column("group", group)


class ChannelDayStats(KeyedBatchFunction):
    def process_batch(self, batch: pa.RecordBatch, ctx: KeyedBatchContext) -> Any:
        if batch.num_rows == 0:
            return None
        groups, parts = partials(batch)
        state = ctx.get_aggregating_state("stats", STATS)
        state.add_many(groups, parts)
        accs = [acc for acc in state.get_many(groups) if acc is not None]  # all just added
        channel, day = zip(*(g.rsplit(SEPARATOR, 1) for g in groups), strict=True)
        minute = [
            f"{acc['ms_of_day'] // 3_600_000:02d}:{acc['ms_of_day'] // 60_000 % 60:02d}"
            for acc in accs
        ]
        rows = [figures(acc) for acc in accs]
        return pa.RecordBatch.from_arrays(
            [
                pa.array(channel, pa.string()),
                pa.array(day, pa.string()),
                pa.array(minute, pa.string()),
                *(pa.array(c, pa.int64()) for c in zip(*rows, strict=True)),
            ],
            schema=OUTPUT,
        )


def query(bid: Stream) -> Stream:
    return (
        bid.map_batches(with_group, name="group")
        .key_by("group")
        .process_batches(ChannelDayStats(), name="q16")
    )


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

"""Nexmark q15, distinct counts per day: bids, distinct bidders and distinct auctions per day,
overall and in each of the three price ranks.

    SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS day,
           count(*) AS total_bids, count(*) FILTER (WHERE price < 10000) AS rank1_bids, ...,
           count(DISTINCT bidder) AS total_bidders, ..., count(DISTINCT auction) AS total_auctions, ...
    FROM bid GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd')

An updating result: each batch emits the new figures of the days it touched; a day's final row
is the one with the most bids (``VERSION``).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from snapflow import Stream, nexmark_main, nexmark_pipeline

# bid_statistics.py lies beside this file: importable also when the file is loaded by path
sys.path.append(str(Path(__file__).resolve().parent))
from bid_statistics import COUNTS, DistinctCounts, count_columns, day_of

NAME = "q15"
INPUTS = ("bid",)
RESULT_KEY = ("day",)
VERSION = "total_bids"
SPARK_SQL = """
SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS day,
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
FROM bid GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd')
"""
OUTPUT = pa.schema([("day", pa.string())] + [(c, pa.int64()) for c in COUNTS])


class DayStats(DistinctCounts):
    def rows(self, groups: list[Any], accs: list[dict[str, Any]]) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pa.array(groups, pa.string()), *count_columns(accs)], schema=OUTPUT
        )


def query(bid: Stream) -> Stream:
    with_day = bid.map_batches(
        lambda b: b.append_column("group", day_of(b["dateTime"])), name="day"
    )
    return with_day.key_by("group").process_batches(DayStats(), name="q15")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

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

import sys
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

# bid_statistics.py lies beside this file: importable also when the file is loaded by path
sys.path.append(str(Path(__file__).resolve().parent))
from bid_statistics import COUNTS, DistinctCounts, count_columns, day_of

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
OUTPUT = pa.schema(
    [("channel", pa.string()), ("day", pa.string()), ("minute", pa.string())]
    + [(c, pa.int64()) for c in COUNTS]
)
SEPARATOR = "|"  # channel names hold no '|'


def with_group(b: pa.RecordBatch) -> pa.RecordBatch:
    group = pc.binary_join_element_wise(b["channel"], day_of(b["dateTime"]), SEPARATOR)
    return b.append_column("group", group)


class ChannelDayStats(DistinctCounts):
    def rows(self, groups: list[Any], accs: list[dict[str, Any]]) -> pa.RecordBatch:
        channel, day = zip(*(g.rsplit(SEPARATOR, 1) for g in groups), strict=True)
        minute = [
            f"{acc['ms_of_day'] // 3_600_000:02d}:{acc['ms_of_day'] // 60_000 % 60:02d}"
            for acc in accs
        ]
        return pa.RecordBatch.from_arrays(
            [
                pa.array(channel, pa.string()),
                pa.array(day, pa.string()),
                pa.array(minute, pa.string()),
                *count_columns(accs),
            ],
            schema=OUTPUT,
        )


def query(bid: Stream) -> Stream:
    return (
        bid.map_batches(with_group, name="group")
        .key_by("group")
        .process_batches(ChannelDayStats(), name="q16")
    )


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

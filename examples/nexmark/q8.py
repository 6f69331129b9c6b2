"""Nexmark q8, monitor new users: the people who opened an auction in the same 10-second
tumbling window in which they registered.

    SELECT P.id, P.name, P.starttime
    FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
          FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
          GROUP BY id, name, window_start, window_end) P
    JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
          FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
          GROUP BY seller, window_start, window_end) A
    ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime

A window co-group of people (keyed by id) and auctions (keyed by seller) on tumbling windows of
10 s: once per window of a person with either, with the window's rows of both; the person is
emitted when the seller side has any row. The co-group rather than the window join
(``join().apply()``): the SQL groups each side by key and window first, so a person who opened
several auctions in the window is one row, while a window join gives one row per pair.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pyarrow as pa

from snapflow import (
    CoGroupFunction,
    Stream,
    TumblingEventTimeWindows,
    WindowContext,
    nexmark_main,
    nexmark_pipeline,
)

NAME = "q8"
INPUTS = ("person", "auction")
SIZE_MS = 10_000
SPARK_SQL = """
SELECT P.id, P.name, unix_millis(P.starttime) AS starttime
FROM (SELECT id, name, window.start AS starttime, window.end AS endtime
      FROM person GROUP BY id, name, window(dateTime, '10 seconds')) P
JOIN (SELECT seller, window.start AS starttime, window.end AS endtime
      FROM auction GROUP BY seller, window(dateTime, '10 seconds')) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime
"""
OUTPUT = pa.schema([("id", pa.int64()), ("name", pa.string()), ("starttime", pa.int64())])


class NewSellers(CoGroupFunction):
    """A window's distinct people of the key, when the key also sold in it."""

    def co_group(self, first: pa.RecordBatch, second: pa.RecordBatch, ctx: WindowContext) -> Any:
        if first.num_rows == 0 or second.num_rows == 0:
            return None
        if first.num_rows == 1:  # the usual case (a person registers once): nothing to dedupe,
            # and no hash aggregation, which costs ~20 times the rest of a call
            ids, names = first.column("id"), first.column("name")
        else:
            people = pa.table(first).group_by(["id", "name"], use_threads=False).aggregate([])
            ids, names = people["id"].combine_chunks(), people["name"].combine_chunks()
        start = pa.array([ctx.window.start] * len(ids), pa.int64())
        return pa.RecordBatch.from_arrays([ids, names, start], schema=OUTPUT)


def query(person: Stream, auction: Stream) -> Stream:
    people = person.map_batches(lambda b: b.select(["id", "name", "dateTime"]), name="people")
    sellers = auction.map_batches(lambda b: b.select(["seller", "dateTime"]), name="sellers")
    return (
        people.co_group(sellers)
        .where("id")
        .equal_to("seller")
        .window(TumblingEventTimeWindows(SIZE_MS), "dateTime")
        .apply(NewSellers(), output_schema=OUTPUT, name="q8")
    )


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

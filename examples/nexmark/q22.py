"""Nexmark q22, string functions: the first three directories of every bid's url.

SELECT auction, bidder, price, channel,
       SPLIT_INDEX(url, '/', 3) AS dir1, SPLIT_INDEX(url, '/', 4) AS dir2,
       SPLIT_INDEX(url, '/', 5) AS dir3
FROM bid
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q22"
INPUTS = ("bid",)
SPARK_SQL = """
SELECT auction, bidder, price, channel,
       try_element_at(split(url, '/'), 4) AS dir1,
       try_element_at(split(url, '/'), 5) AS dir2,
       try_element_at(split(url, '/'), 6) AS dir3
FROM bid
"""


def directories(b: pa.RecordBatch) -> pa.RecordBatch:
    parts = pc.split_pattern(b["url"], "/")
    dirs = [pc.list_element(parts, i) for i in (3, 4, 5)]  # every url has 6 parts or more
    return pa.RecordBatch.from_arrays(
        [b["auction"], b["bidder"], b["price"], b["channel"], *dirs],
        names=["auction", "bidder", "price", "channel", "dir1", "dir2", "dir3"],
    )


def query(bid: Stream) -> Stream:
    return bid.map_batches(directories, name="q22")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

"""Nexmark q21, string functions: a channel id for the bids of known channels, from a lookup for
the 4 big ones and from the url's ``channel_id`` parameter for the others.

    SELECT auction, bidder, price, channel,
           CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
                WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
                ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
    FROM bid
    WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL
       OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')

(Spark's REGEXP_EXTRACT gives '' where Flink's gives NULL: the Spark SQL below says ``<> ''``.)
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q21"
INPUTS = ("bid",)
SPARK_SQL = """
SELECT auction, bidder, price, channel,
       CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
            WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
            ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
FROM bid
WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) <> ''
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')
"""
KNOWN = pa.array(["apple", "google", "facebook", "baidu"])
KNOWN_IDS = pa.array(["0", "1", "2", "3"])


def channel_ids(b: pa.RecordBatch) -> pa.RecordBatch:
    lower = pc.utf8_lower(b["channel"])
    known = pc.index_in(lower, value_set=KNOWN)
    matches = pc.extract_regex(b["url"], r"(?:&|^)channel_id=(?P<id>[^&]*)")
    from_url = pc.struct_field(matches, "id")  # null where the url has no channel_id
    channel_id = pc.coalesce(pc.take(KNOWN_IDS, known), from_url)
    keep = pc.is_valid(channel_id)
    return pa.RecordBatch.from_arrays(
        [b["auction"], b["bidder"], b["price"], b["channel"], channel_id],
        names=["auction", "bidder", "price", "channel", "channel_id"],
    ).filter(keep)


def query(bid: Stream) -> Stream:
    return bid.map_batches(channel_ids, name="q21")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

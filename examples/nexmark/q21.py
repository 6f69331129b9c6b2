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

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink

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

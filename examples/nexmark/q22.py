"""Nexmark q22, string functions: the first three directories of every bid's url.

SELECT auction, bidder, price, channel,
       SPLIT_INDEX(url, '/', 3) AS dir1, SPLIT_INDEX(url, '/', 4) AS dir2,
       SPLIT_INDEX(url, '/', 5) AS dir3
FROM bid
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink

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

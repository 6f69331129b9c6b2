"""Nexmark q2, selection: the bids on every 123rd auction.

SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink

NAME = "q2"
INPUTS = ("bid",)
SPARK_SQL = "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"


def select(b: pa.RecordBatch) -> pa.RecordBatch:
    keep = pc.equal(pc.modulo(b["auction"], 123), 0)
    return b.select(["auction", "price"]).filter(keep)


def query(bid: Stream) -> Stream:
    return bid.map_batches(select, name="q2")


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

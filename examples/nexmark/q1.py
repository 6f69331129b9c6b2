"""Nexmark q1, currency conversion: every bid's price in euros (0.908 per dollar).

    SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid

``price`` is a DECIMAL(23, 3), as in the Nexmark table: the product is exact.
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink

NAME = "q1"
INPUTS = ("bid",)
SPARK_SQL = """
SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price,
       unix_millis(dateTime) AS dateTime, extra
FROM bid
"""
EURO = pa.scalar(Decimal("0.908"), pa.decimal128(4, 3))
PRICE = pa.decimal128(23, 3)


def to_euro(b: pa.RecordBatch) -> pa.RecordBatch:
    price = pc.multiply(b["price"].cast(pa.decimal128(19, 0)), EURO)
    return pa.RecordBatch.from_arrays(
        [b["auction"], b["bidder"], price.cast(PRICE), b["dateTime"], b["extra"]],
        names=["auction", "bidder", "price", "dateTime", "extra"],
    )


def query(bid: Stream) -> Stream:
    return bid.map_batches(to_euro, name="q1")


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

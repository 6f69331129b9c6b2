"""Nexmark q0, pass-through: every bid, unchanged (the cost of reading and writing events).

    SELECT auction, bidder, price, dateTime, extra FROM bid

Run it: ``python examples/nexmark/q0.py --events 1000000 --output /tmp/q0``. Every query of this
folder has the same parts: ``INPUTS`` (the event kinds it reads: one source each), ``query``
(the pipeline from those streams, by kind, to the result), ``SPARK_SQL`` (the same query in
batch Spark SQL over the views ``person``, ``auction`` and ``bid``, with ``dateTime`` a
TIMESTAMP; tests/nexmark compares the two), and ``build``/``main`` to run it on its own. A query
whose stream holds updates (an unbounded aggregate) also says how its final result is read:
``RESULT_KEY`` and ``VERSION`` (per key, the row with the highest version is the final one).
"""

from __future__ import annotations

from snapflow import NexmarkConfig, NexmarkSource, Pipeline, Stream, TransactionalFileSink

NAME = "q0"
INPUTS = ("bid",)
COLUMNS = ["auction", "bidder", "price", "dateTime", "extra"]
SPARK_SQL = "SELECT auction, bidder, price, unix_millis(dateTime) AS dateTime, extra FROM bid"


def query(bid: Stream) -> Stream:
    return bid.map_batches(lambda b: b.select(COLUMNS), name="q0")


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

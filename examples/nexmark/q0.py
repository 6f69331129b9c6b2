"""Nexmark q0, pass-through: every bid, unchanged (the cost of reading and writing events).

    SELECT auction, bidder, price, dateTime, extra FROM bid

Run it: ``python examples/nexmark/q0.py --events 1000000 --output /tmp/q0``. Every query of this
folder has the same parts: ``INPUTS`` (the event kinds it reads: one source each), ``query``
(the pipeline from those streams, by kind, to the result), ``SPARK_SQL`` (the same query in
batch Spark SQL over the views ``person``, ``auction`` and ``bid``, with ``dateTime`` a
TIMESTAMP; tests/nexmark compares the two), and ``build``, ``nexmark_pipeline`` for this query
(a source per input kind, the query, exactly-once files, checkpoints every second), with
``nexmark_main`` to run it on its own. A query whose stream holds updates (an unbounded aggregate) also says how its final result is read:
``RESULT_KEY`` and ``VERSION`` (per key, the row with the highest version is the final one).
"""

from __future__ import annotations

from functools import partial

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q0"
INPUTS = ("bid",)
COLUMNS = ["auction", "bidder", "price", "dateTime", "extra"]
SPARK_SQL = "SELECT auction, bidder, price, unix_millis(dateTime) AS dateTime, extra FROM bid"


def query(bid: Stream) -> Stream:
    return bid.map_batches(lambda b: b.select(COLUMNS), name="q0")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

"""Nexmark q3, local item suggestion: who sells in category 10 from Oregon, Idaho or
California, with each such auction.

    SELECT P.name, P.city, P.state, A.id
    FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
    WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')

Both inputs filtered first, then the regular (unbounded) inner join of auctions keyed by seller
with people keyed by id: every pair once, when its second row arrives, whichever input it
comes from, so the output is append-only and equals the batch join. Both sides' rows are
kept in state for ever (as a regular join in Flink without a state TTL).
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Stream, nexmark_main, nexmark_pipeline

NAME = "q3"
INPUTS = ("auction", "person")
CATEGORY = 10
STATES = ("OR", "ID", "CA")
SPARK_SQL = """
SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')
"""
COLUMNS = ["name", "city", "state", "id"]


def sellers(b: pa.RecordBatch) -> pa.RecordBatch:
    """An auction of the category as ``(seller, id)``."""
    return b.filter(pc.equal(b["category"], CATEGORY)).select(["seller", "id"])


def local_people(b: pa.RecordBatch) -> pa.RecordBatch:
    """A person of the states as ``(seller, name, city, state)``: the id named as the
    auctions' key, so that the joined rows hold it once and the auction's ``id`` keeps its
    name."""
    kept = b.filter(pc.is_in(b["state"], pa.array(STATES))).select(["id", "name", "city", "state"])
    return kept.rename_columns(["seller", "name", "city", "state"])


def query(auction: Stream, person: Stream) -> Stream:
    a = auction.map_batches(sellers, name="category").key_by("seller")
    p = person.map_batches(local_people, name="states").key_by("seller")
    joined = a.join(p, name="q3")
    return joined.map_batches(lambda b: b.select(COLUMNS), name="select")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

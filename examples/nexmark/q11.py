"""Nexmark q11, user sessions: how many bids each bidder made in each of their sessions (bids
at most 10 s apart).

    SELECT B.bidder, count(*) AS bid_count,
           SESSION_START(B.dateTime, INTERVAL '10' SECOND) AS starttime,
           SESSION_END(B.dateTime, INTERVAL '10' SECOND) AS endtime
    FROM bid B
    GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND)

Event-time session windows with a gap of 10 s per bidder and a count per window: a session
starts at its first bid and ends 10 s after its last (``window_start``/``window_end``), and
fires once the watermark passes its end, when no later bid can extend it.
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa

from snapflow import EventTimeSessionWindows, Stream, nexmark_main, nexmark_pipeline

NAME = "q11"
INPUTS = ("bid",)
GAP_MS = 10_000
SPARK_SQL = """
SELECT bidder, count(*) AS bid_count,
       unix_millis(session_window.start) AS starttime, unix_millis(session_window.end) AS endtime
FROM bid GROUP BY bidder, session_window(dateTime, '10 seconds')
"""


def named(b: pa.RecordBatch) -> pa.RecordBatch:
    return b.rename_columns(["bidder", "starttime", "endtime", "bid_count"])


def query(bid: Stream) -> Stream:
    sessions = bid.key_by("bidder").window(
        EventTimeSessionWindows(GAP_MS), "dateTime", agg="count", output_field="bid_count"
    )
    return sessions.map_batches(named, name="q11")


# build(num_events, output, parallelism=2, config=None): this query as a job of its own
build = partial(nexmark_pipeline, NAME, INPUTS, query)

if __name__ == "__main__":
    nexmark_main(build, __doc__)

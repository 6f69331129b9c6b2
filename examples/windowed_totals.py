"""Keyed event-time windows: the total amount per user in 10-second tumbling windows.

    snapflow run examples/windowed_totals.py --input examples/data/events --output /tmp/totals
    python examples/windowed_totals.py --input examples/data/events --output /tmp/totals

The input files are csv with the columns ``user``, ``amount`` and ``ts`` (event time, epoch
milliseconds, up to ``--out-of-orderness-ms`` late). The watermark follows the files' event
time; a window fires once the watermark passes its end (at the end of the input, the maximum
watermark fires the rest). Each window result, ``(user, window_start, window_end, total)``, is
written exactly once as Arrow IPC part files (``TransactionalFileSink``).
"""

from __future__ import annotations

import argparse

import pyarrow as pa

from snapflow import FileSource, Pipeline, TransactionalFileSink, TumblingEventTimeWindows

EVENTS = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])


def build(input_dir: str, output_dir: str, window_ms: int, out_of_orderness_ms: int) -> Pipeline:
    p = Pipeline("windowed-totals")
    source = FileSource(
        input_dir,
        "csv",
        schema=EVENTS,
        timestamp_field="ts",
        max_out_of_orderness_ms=out_of_orderness_ms,
    )
    (
        p.source(source, name="events")
        .key_by("user")
        .window(TumblingEventTimeWindows(window_ms), "ts", "amount", "sum", output_field="total")
        .sink(TransactionalFileSink(output_dir))
    )
    p.checkpointing(interval_ms=500)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="directory of csv files: user,amount,ts")
    parser.add_argument("--output", required=True, help="output directory (Arrow IPC part files)")
    parser.add_argument("--window-ms", type=int, default=10_000, help="window size (default 10000)")
    parser.add_argument(
        "--out-of-orderness-ms", type=int, default=2_000, help="lateness bound (default 2000)"
    )
    args = parser.parse_args(argv)
    build(args.input, args.output, args.window_ms, args.out_of_orderness_ms).execute()


if __name__ == "__main__":
    main()

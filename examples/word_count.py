"""Word count over the text files of a directory: a bounded, exactly-once batch job.

    snapflow run examples/word_count.py --input examples/data/lines --output /tmp/word-count
    python examples/word_count.py --input examples/data/lines --output /tmp/word-count

The input files are csv with one column, ``line``. Words are split and lower-cased with Arrow
kernels (a vectorised ``flat_map_batches``), counted per word (``key_by("word").count``, the
totals once at the end of the input), and written exactly once as Arrow IPC part files
(``TransactionalFileSink``; read them back with ``snapflow.read_committed``).
"""

from __future__ import annotations

import argparse

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import FileSource, Pipeline, TransactionalFileSink

LINES = pa.schema([("line", pa.string())])


def words(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """One row per word of every line: lower case, punctuation stripped, empty words dropped."""
    lowered = pc.utf8_lower(batch.column("line"))
    cleaned = pc.replace_substring_regex(lowered, r"[^\w\s']+", " ")
    flat = pc.list_flatten(pc.utf8_split_whitespace(cleaned))
    kept = pc.filter(flat, pc.not_equal(pc.utf8_length(flat), 0))
    return [pa.RecordBatch.from_arrays([kept], names=["word"])]


def build(input_dir: str, output_dir: str) -> Pipeline:
    p = Pipeline("word-count")  # parallelism: snapflow run -p, else 1
    (
        p.source(FileSource(input_dir, "csv", schema=LINES), name="lines")
        .flat_map_batches(words, name="split")
        .key_by("word")
        .count(output="final")  # in the final checkpoint: committed like everything else
        .sink(TransactionalFileSink(output_dir))
    )
    p.checkpointing(interval_ms=500)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--input", required=True, help="directory of csv files with a `line` column"
    )
    parser.add_argument("--output", required=True, help="output directory (Arrow IPC part files)")
    args = parser.parse_args(argv)
    build(args.input, args.output).execute()


if __name__ == "__main__":
    main()

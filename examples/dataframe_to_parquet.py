"""A Spark DataFrame in, Parquet out: enrich orders with a vectorised function, exactly once.

    snapflow run examples/dataframe_to_parquet.py --output /tmp/orders --rows 10000
    python examples/dataframe_to_parquet.py --output /tmp/orders

The DataFrame (built here with ``spark.range``; any DataFrame or table works) is written once
to Parquet in a staging directory while the pipeline is built (``source_from_dataframe``: each
Spark partition is one replayable split). ``map_batches`` adds columns with Arrow kernels, and
``TransactionalParquetSink`` writes Parquet part files that appear only when the checkpoint
covering them completes, so ``spark.read.parquet(output)`` never sees partial results.
"""

from __future__ import annotations

import argparse
import os
import uuid

import pyarrow as pa
import pyarrow.compute as pc

from snapflow import Pipeline, TransactionalParquetSink, source_from_dataframe, spark_session


def enrich(batch: pa.RecordBatch) -> pa.RecordBatch:
    """price in cents -> with a 20 % tax, and a size class."""
    price = batch.column("price_cents")
    gross = pc.divide(pc.multiply(price, 6), 5)
    size = pc.if_else(pc.greater_equal(price, 5_000), "large", "small")
    return pa.RecordBatch.from_arrays(
        [batch.column("order_id"), price, gross, size],
        names=["order_id", "price_cents", "gross_cents", "size"],
    )


def build(output_dir: str, rows: int, staging_dir: str) -> Pipeline:
    spark = spark_session("dataframe-to-parquet")
    orders = spark.range(rows, numPartitions=4).selectExpr(
        "id AS order_id", "(id * 37) % 10000 AS price_cents"
    )
    p = Pipeline("dataframe-to-parquet")
    (
        source_from_dataframe(p, orders, staging_dir, name="orders")
        .map_batches(enrich, name="enrich")
        .sink(TransactionalParquetSink(output_dir))
    )
    p.checkpointing(interval_ms=500)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="output directory (Parquet part files)")
    parser.add_argument("--rows", type=int, default=10_000, help="orders (default 10000)")
    parser.add_argument(
        "--staging",
        default=None,
        help="where the DataFrame is staged (must not exist; default: beside --output)",
    )
    args = parser.parse_args(argv)
    output = os.path.abspath(args.output)
    staging = args.staging or f"{output.rstrip(os.sep)}-input-{uuid.uuid4().hex[:8]}"
    build(output, args.rows, staging).execute()


if __name__ == "__main__":
    main()
